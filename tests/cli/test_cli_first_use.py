"""The command line on first use: what a fresh user meets before reading any code.

Thread count and OpenMP wait policy chosen before torch loads; ``bench``'s progress, per-sample
records, range-respecting intervals and sampling speed; no command replacing an earlier run's
results; every input check before the first line of output; quiet tiny-model loads; output that
stays whole in a pipe; plug-in docs that cover ``register_env``.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import gymnasium
import numpy as np
import pytest

from llmgym.cli import main
from llmgym.runtime.logging import read_metrics

ROOT = Path(__file__).resolve().parents[2]
ENV = "llmgym/Copy-v0"
SMALL = ["--set", "tasks_per_step=2", "--set", "group_size=2", "--set", "max_new_tokens=4"]


@pytest.fixture(scope="module", autouse=True)
def isolated_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMGYM_CACHE", str(tmp_path_factory.mktemp("llmgym-cache")))
        mp.setenv("COLUMNS", "160")
        yield


def subprocess_env(**extra: str) -> dict[str, str]:
    """The suite's environment for a child process, without what these tests set themselves."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "OMP_WAIT_POLICY")}
    return {**env, **extra}


# -- 1. threads ---------------------------------------------------------------------------------

WATCH_TORCH_IMPORT = """
import importlib.abc, os, sys
seen = {}
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "policy" not in seen:
            seen["policy"] = os.environ.get("OMP_WAIT_POLICY", "unset")
sys.meta_path.insert(0, Watch())
import llmgym.__main__, llmgym.cli
assert "torch" not in sys.modules, "importing the command line imported torch"
code = llmgym.cli.main(["bench", "--env", "llmgym/Copy-v0", "--samples", "0"])
print("policy when torch loaded:", seen.get("policy"), "exit", code)
"""


@pytest.mark.parametrize("user_policy", [None, "ACTIVE"])
def test_the_command_sets_a_passive_openmp_policy_before_torch_loads_unless_the_user_chose(user_policy):
    env = subprocess_env(**({"OMP_WAIT_POLICY": user_policy} if user_policy else {}))
    proc = subprocess.run([sys.executable, "-c", WATCH_TORCH_IMPORT], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"policy when torch loaded: {user_policy or 'PASSIVE'} exit 2" in proc.stdout


def test_torch_threads_follow_the_request_then_omp_num_threads_then_model_size(tiny_model, monkeypatch):
    import torch

    from llmgym.runtime.threads import set_torch_threads

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert set_torch_threads(tiny_model) == 1  # a tiny model on CPU
        assert set_torch_threads(tiny_model, requested=2) == 2  # --threads
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert set_torch_threads(tiny_model) == 2  # the user's environment over the size rule
        assert set_torch_threads(tiny_model, requested=1) == 1  # --threads over the environment
    finally:
        torch.set_num_threads(before)


def test_flushing_denormals_leaves_numpy_without_subnormal_warnings():
    # the quickstart's output showed four of numpy's "smallest subnormal ... is zero" UserWarnings
    code = ("from llmgym.runtime.models import flush_denormals; flush_denormals(); import numpy as np; "
            "[np.finfo(t).smallest_subnormal for t in (np.float16, np.float32, np.float64)]")
    out = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert out.returncode == 0 and not out.stderr, out.stderr[-2000:]


def test_every_example_that_runs_a_model_sets_its_threads():
    for path in sorted((ROOT / "examples").glob("*.py")):
        code = path.read_text()
        if path.name == "train_ddp.py":  # one thread share per process, set from the world size
            assert "torch.set_num_threads" in code
        elif "build_tiny_model(" in code or "load_model(" in code:
            assert "set_torch_threads(" in code, f"{path.name} runs a model on torch's default threads"


# -- 2. bench -----------------------------------------------------------------------------------


def test_bench_writes_one_json_safe_record_per_sample_beside_the_summary(saved_tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--env", ENV, "--model", saved_tiny_model_dir, "--samples", "3", "--tasks", "4",
                 "--max-new-tokens", "4", "--threshold", "0.25", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    samples = tmp_path / "bench.samples.jsonl"
    assert report["samples_file"] == str(samples)
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(records) == 12
    assert [(r["task_id"], r["sample"]) for r in records] == [(t, s) for t in report["task_ids"] for s in range(3)]
    by_task = {t["id"]: t["rewards"] for t in report["per_task"]}
    for r in records:
        assert {"completion", "reward", "passed", "info", "turns", "finish_reasons", "completion_tokens"} <= set(r)
        assert isinstance(r["completion"], str) and r["turns"] == 1 and r["completion_tokens"] >= 1
        assert r["reward"] == by_task[r["task_id"]][r["sample"]]
        assert r["passed"] == (r["reward"] >= 0.25)
        assert isinstance(r["info"], dict) and "score" in r["info"]
    printed = capsys.readouterr().out
    assert "bench.samples.jsonl" in printed and "12/12 completions" in printed  # the progress's last line


def test_bench_tokens_per_s_is_sampling_speed_and_verification_time_is_its_own(saved_tiny_model_dir, tmp_path, slow_env):
    out = tmp_path / "slow.json"
    assert main(["bench", "--env", slow_env, "--model", saved_tiny_model_dir, "--samples", "2", "--tasks", "3",
                 "--max-new-tokens", "4", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["verify_s"] >= 6 * SLOW_VERIFY_S  # six verifications, each sleeping
    assert r["generate_s"] + r["verify_s"] <= r["rollout_s"] + 1e-6 <= r["wall_s"] + 1e-6
    assert r["tokens_per_s"] == pytest.approx(r["tokens_sampled"] / r["generate_s"])
    assert r["tokens_per_s"] > r["tokens_sampled"] / r["rollout_s"]  # the sleeping verifier is not in it


def test_bench_interval_stays_inside_the_reward_range_and_says_how_it_was_made(saved_tiny_model_dir, tmp_path, coin_env):
    out = tmp_path / "coin.json"
    assert main(["bench", "--env", coin_env, "--model", saved_tiny_model_dir, "--samples", "1", "--max-new-tokens", "2",
                 "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    low, high = r["reward_ci95"]
    assert r["ci_method"] == "wilson" and "Wilson" in r["ci_description"]
    assert 0.0 <= low <= r["reward_mean"] <= high <= 1.0 and high > low
    out = tmp_path / "copy.json"
    assert main(["bench", "--env", ENV, "--model", saved_tiny_model_dir, "--samples", "2", "--tasks", "6",
                 "--max-new-tokens", "4", "--temperature", "0", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    rewards = [x for t in r["per_task"] for x in t["rewards"]]
    expected = "wilson" if set(rewards) <= {0.0, 1.0} else "bootstrap"
    means = [t["reward_mean"] for t in r["per_task"]]
    assert r["ci_method"] == expected
    assert (min(means) if expected == "bootstrap" else 0.0) <= r["reward_ci95"][0] <= r["reward_ci95"][1]
    assert r["reward_ci95"][1] <= (max(means) if expected == "bootstrap" else 1.0)


def test_the_issue_case_a_rare_pass_gets_an_interval_that_does_not_go_below_zero():
    from llmgym.runtime.metrics import mean_confidence_interval, reward_interval

    values = [1.0, 1.0] + [0.0] * 126  # 2 of 128 pass: the normal interval dips below 0
    mean, half = mean_confidence_interval(values)
    assert mean - half < 0
    low, high, method = reward_interval(values, pass_fail=True)
    assert method == "wilson" and 0.0 < low < mean < high < 0.1
    low, high, _ = reward_interval([0.0] * 164, pass_fail=True)  # none pass: still an interval, not a point
    assert low == 0.0 and 0.0 < high < 0.03


@pytest.mark.parametrize("p", [0.03, 0.5, 0.97])
def test_wilson_and_bootstrap_intervals_cover_the_true_mean_about_95_percent(p):
    from llmgym.runtime.metrics import bootstrap_interval, wilson_interval

    rng = np.random.default_rng(0)
    n, trials = 60, 400
    wilson = bootstrap = 0
    for _ in range(trials):
        x = (rng.random(n) < p).astype(float)
        low, high = wilson_interval(float(x.mean()), n)
        wilson += low <= p <= high
        low, high = bootstrap_interval(x, resamples=1000, seed=int(rng.integers(1 << 30)))
        bootstrap += low <= p <= high
        assert 0.0 <= low <= high <= 1.0
    assert wilson / trials > 0.91  # Wilson holds its level even at p near 0 or 1
    if p == 0.5:
        assert bootstrap / trials > 0.9  # the percentile bootstrap away from the bounds


def test_bench_refuses_to_replace_an_earlier_benchmark(saved_tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "b.json"
    argv = ["bench", "--env", ENV, "--model", saved_tiny_model_dir, "--samples", "1", "--tasks", "2", "--max-new-tokens", "2",
            "--out", str(out)]
    assert main(argv) == 0
    first = out.read_text(), (tmp_path / "b.samples.jsonl").read_text()
    capsys.readouterr()
    assert main(argv) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out.read_text(), (tmp_path / "b.samples.jsonl").read_text()) == first
    (tmp_path / "b.json").unlink()  # the samples file alone is an earlier result too
    assert main(argv) == 2
    assert main([*argv, "--overwrite"]) == 0


@pytest.mark.parametrize("level", ["sequence", "token"])
def test_collect_episodes_reports_every_episode_once_and_the_hook_changes_nothing(tiny_model, tokenizer, level):
    from llmgym.engines import HFEngine, SamplingParams
    from llmgym.rollout.episodes import collect_episodes

    env = gymnasium.make(ENV, tokenizer=tokenizer, level=level, max_new_tokens=4)
    engine = HFEngine(tiny_model, tokenizer, max_batch_size=4)  # 12 rows: three engine batches
    kwargs = dict(num_tasks=4, group_size=3, sampling=SamplingParams(max_new_tokens=4), seed=5)
    done: list[int] = []
    with_hook, stats = collect_episodes(env, engine, **kwargs, on_episodes_done=done.append)
    without, _ = collect_episodes(env, engine, **kwargs)
    assert sum(done) == 12 and len(done) > 1  # progress arrives as episodes end, not once at the end
    assert [e.token_ids for e in with_hook] == [e.token_ids for e in without]
    assert [e.total_reward for e in with_hook] == [e.total_reward for e in without]
    assert stats["generate_s"] > 0 and stats["verify_s"] >= 0
    assert stats["tokens_per_s"] == pytest.approx(stats["tokens_sampled"] / stats["generate_s"])


# -- 3. nothing replaced silently ---------------------------------------------------------------


def test_quickstart_again_keeps_the_earlier_run_and_says_where(tmp_path, capsys):
    out = tmp_path / "quickstart"
    assert main(["quickstart", "--quick", "--steps", "2", "--out", str(out)]) == 0
    assert len(read_metrics(out / "metrics.jsonl")) == 2
    capsys.readouterr()
    assert main(["quickstart", "--quick", "--steps", "3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    kept = tmp_path / "quickstart.1"
    assert f"moved it to {kept}" in printed
    assert len(read_metrics(out / "metrics.jsonl")) == 3
    assert len(read_metrics(kept / "metrics.jsonl")) == 2  # the first run, whole
    assert (kept / "eval.json").is_file() and (kept / "checkpoints" / "last" / "agent.pt").is_file()
    assert main(["quickstart", "--quick", "--steps", "2", "--out", str(out), "--overwrite"]) == 0
    assert not (tmp_path / "quickstart.2").exists() and len(read_metrics(out / "metrics.jsonl")) == 2


def test_train_overwrite_deletes_nothing_when_a_check_fails(saved_tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    base = ["train", "--env", ENV, "--agent", "grpo", "--model", saved_tiny_model_dir, "--steps", "1", "--out", str(out), *SMALL]
    assert main(base) == 0
    before = (out / "metrics.jsonl").read_text()
    assert main([*base, "--overwrite", "--env-arg", "bogus=1"]) == 2
    assert (out / "metrics.jsonl").read_text() == before and (out / "checkpoints" / "last").is_dir()
    assert main([*base, "--overwrite", "--steps", "2"]) == 0
    assert len(read_metrics(out / "metrics.jsonl")) == 2


def test_train_refuses_a_directory_with_any_earlier_run_file(saved_tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    (out / "checkpoints" / "last").mkdir(parents=True)  # its metrics.jsonl deleted, say
    argv = ["train", "--env", ENV, "--agent", "grpo", "--model", saved_tiny_model_dir, "--steps", "1", "--out", str(out), *SMALL]
    assert main(argv) == 2
    assert "already holds a run (checkpoints)" in capsys.readouterr().err


def test_rm_refuses_to_write_over_a_saved_model(saved_tiny_model_dir, tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": "p", "chosen": "12", "rejected": "ab"}) + "\n" for _ in range(4)))
    target = Path(saved_tiny_model_dir)
    before = sorted(p.name for p in target.iterdir())
    assert main(["rm", "--pairs", str(pairs), "--out", saved_tiny_model_dir, "--steps", "1"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert sorted(p.name for p in target.iterdir()) == before


# -- 5. every check before the first line of output ---------------------------------------------


@pytest.mark.parametrize("argv, expected", [
    (["train", "--env", "llmgym/GSM8K-v0", "--agent", "grpo", "--out", "OUT"], "needs its problems"),
    (["train", "--env", ENV, "--agent", "grpo", "--out", "OUT", "--env-arg", "bogus=1"], "unexpected keyword"),
    (["train", "--env", ENV, "--agent", "dpo", "--out", "OUT", "--set", "pairs=/no/such.jsonl"], "no preference file"),
    (["train", "--env", "llmgym/HumanEval-v0", "--agent", "grpo", "--out", "OUT", "--eval-every", "1",
      "--eval-tasks", "500"], "--eval-tasks"),
    (["compare", "--agents", "grpo", "--env", "llmgym/GSM8K-v0", "--out", "OUT"], "needs its problems"),
    (["train", "--env", ENV, "--agent", "grpo", "--out", "OUT", "--set", "lr", "=", "1e-4"],
     "without spaces around '=': write --set lr=1e-4"),
    (["train", "--env", ENV, "--agent", "grpo", "--out", "OUT", "--set", "lr=", "1e-4"], "write --set lr=1e-4"),
    (["bench", "--env", "llmgym/GSM8K-v0", "--env-arg", "path", "=", "x.jsonl"], "write --env-arg path=x.jsonl"),
])
def test_input_mistakes_are_the_only_output(argv, expected, saved_tiny_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if argv[0] in ("train", "compare"):
        argv = [*argv, "--model", saved_tiny_model_dir]
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "", captured.out  # no "training grpo on ..." banner first
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmgym: error: ") and expected in lines[0], captured.err
    assert not (tmp_path / "out").exists()


# -- 4. quiet tiny model ------------------------------------------------------------------------


def test_loading_the_tiny_model_prints_no_progress_bar_and_a_real_model_keeps_its_own(saved_tiny_model_dir, capfd):
    from transformers.utils import logging as hf_logging

    from llmgym.runtime.models import _transformers_version, load_model

    load_model("tiny")  # built (and cached) on first use
    capfd.readouterr()
    enabled = hf_logging.is_progress_bar_enabled()
    load_model("tiny")
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled() == enabled  # the user's setting is back
    if enabled and _transformers_version()[0] >= 5:
        load_model(saved_tiny_model_dir)  # a checkpoint directory: transformers' own bar, untouched
        assert "Loading weights" in capfd.readouterr().err


# -- 6. piped output ----------------------------------------------------------------------------


def test_piped_output_keeps_every_line_whole(saved_tiny_model_dir, tmp_path):
    out = tmp_path / ("a-rather-long-directory-name-for-runs-" * 2) / "grpo-copy"
    argv = [sys.executable, "-m", "llmgym", "train", "--env", ENV, "--agent", "grpo", "--model", saved_tiny_model_dir,
            "--steps", "2", "--out", str(out), *SMALL]
    proc = subprocess.run(argv, capture_output=True, text=True, env=subprocess_env(), cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    banner = [line for line in lines if line.startswith("training grpo on llmgym/Copy-v0")]
    assert len(banner) == 1 and banner[0].endswith(f"→ {out}"), proc.stdout  # one line, not wrapped at 80
    assert any(re.match(r"grpo on llmgym/Copy-v0 2/2 reward \S+ avg \S+ kl \S+ elapsed", line) for line in lines)
    assert not any("━" in line for line in lines if line.startswith("grpo on"))  # no bar drawn into a file
    for name in ("metrics.jsonl", "config.json"):
        assert any(line.strip().endswith(str(out / name)) for line in lines), name
    assert max(map(len, lines)) > 80


# -- 5. plug-in docs ----------------------------------------------------------------------------


def test_plug_in_docs_cover_every_register_env_argument():
    from llmgym import register_env

    doc = (ROOT / "docs" / "plug_in_env.md").read_text()
    for name in inspect.signature(register_env).parameters:
        assert f"`{name}" in doc, f"docs/plug_in_env.md never mentions register_env's {name}"


# -- helper envs ------------------------------------------------------------------------------------

SLOW_VERIFY_S = 0.05


def _slow_verify(task, completion):
    time.sleep(SLOW_VERIFY_S)
    return 0.0


def _coin_verify(task, completion):
    return float(len(completion.encode("utf-8", "replace")) % 2 == 0)


def _make_slow_env(tokenizer=None, **kwargs):
    from llmgym import SequenceEnv, Task

    return SequenceEnv([Task(f"slow {i}:", id=f"slow-{i}") for i in range(3)], _slow_verify, tokenizer, **kwargs)


def _make_coin_env(tokenizer=None, **kwargs):
    from llmgym import SequenceEnv, Task

    return SequenceEnv([Task(f"coin {i}:", id=f"coin-{i}") for i in range(30)], _coin_verify, tokenizer, **kwargs)


def _registered(name: str, factory):
    from llmgym import register_env
    from llmgym.env import registry

    env_id = register_env(name, factory, family="test")
    yield env_id
    registry._INFO.pop(env_id, None)
    gymnasium.registry.pop(env_id, None)


@pytest.fixture()
def slow_env():
    yield from _registered("FirstHourSlow", _make_slow_env)


@pytest.fixture()
def coin_env():
    yield from _registered("FirstHourCoin", _make_coin_env)


def test_printed_follow_on_commands_run_the_script_that_was_started(tmp_path, monkeypatch):
    """After `bash scripts/setup.sh`, `.venv/bin/llmgym` is not on $PATH: the commands a command prints
    (`next: ... bench`, `... train --resume`) name the script as it was started, so they run as printed."""
    from llmgym.cli.usage import invoked_as

    script = tmp_path / "venv" / "bin" / "llmgym"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setattr("sys.argv", [str(script), "quickstart"])
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    assert invoked_as() == str(script)
    monkeypatch.setenv("PATH", str(script.parent))  # activated: the bare name finds this very script
    assert invoked_as() == "llmgym"
    monkeypatch.setattr("sys.argv", ["/some where/llmgym"])  # quoted for the shell
    assert invoked_as() == "'/some where/llmgym'"
    monkeypatch.setattr("sys.argv", ["/x/pytest"])
    assert invoked_as() == "llmgym"
