"""The documented vLLM paths as a user walks them: the quickstart's model with ``--engine vllm``, engine
arguments checked before vLLM starts, and no known noise in the output (vLLM's CPU build here).

The served path (docs/scale.md's serve command) runs in ``tests/engines/test_openai_engine.py``: ``tests/served.py``
starts every served model with the documented command.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from conftest import vllm_missing_reason
from llmgym.cli import main

reason = vllm_missing_reason()
pytestmark = pytest.mark.skipif(reason is not None, reason=reason or "")

BAD_ENGINE_ARGS = [  # what a user mistypes, and the name the one-line error must give
    ("sleep_level=3", "sleep_level=3: must be 1"),
    ("dtype=garbage", "dtype='garbage': Input should be 'auto'"),
    ("max_model_len=abc", "max_model_len='abc': Input should be a valid integer"),
    ("gpu_memory_utilization=5", "gpu_memory_utilization=5: Input should be less than or equal to 1"),
    ("kv_cache_memory_bytes=-1", "kv_cache_memory_bytes=-1: must be a whole number of bytes >= 1"),
]


@pytest.fixture()
def no_engine_start(monkeypatch):
    """Fails the test if vLLM's engine is constructed."""
    import vllm

    def refuse(*args, **kwargs):
        raise AssertionError("vLLM was started although the engine arguments were bad")

    monkeypatch.setattr(vllm, "LLM", refuse)


@pytest.mark.parametrize("arg, message", BAD_ENGINE_ARGS, ids=[a for a, _ in BAD_ENGINE_ARGS])
def test_a_bad_engine_arg_is_one_line_before_vllm_starts(arg, message, no_engine_start, saved_tiny_model_dir, tmp_path,
                                                         capsys):
    for command in (["train", "--env", "llmgym/Copy-v0", "--agent", "grpo", "--out", str(tmp_path / "run")],
                    ["bench", "--env", "llmgym/Copy-v0", "--samples", "1"]):
        assert main([*command, "--model", saved_tiny_model_dir, "--engine", "vllm", "--engine-arg", arg]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"llmgym: error: --engine-arg {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_the_error_is_the_only_line_a_user_sees(saved_tiny_model_dir, tmp_path):
    """A real process: vLLM's import used to print a Triton line before the one-line error."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("VLLM_LOGGING_LEVEL", None)  # as a user runs it (llmgym sets WARNING unless the user chose)
    proc = subprocess.run([sys.executable, "-m", "llmgym", "train", "--env", "llmgym/Copy-v0", "--agent", "grpo",
                           "--model", saved_tiny_model_dir, "--out", str(tmp_path / "run"), "--engine", "vllm",
                           "--engine-arg", "dtype=garbage"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "llmgym: error: --engine-arg dtype='garbage': Input should be 'auto', 'half', 'float16', 'bfloat16', 'float' "
        "or 'float32' (vLLM's ModelConfig.dtype)"], proc.stderr


def test_the_quickstart_model_trains_with_engine_vllm_and_weight_syncs_log_no_noise(tmp_path, monkeypatch):
    """The first thing a user tries after the quickstart (the README's command): its checkpoint, ``--engine vllm``.
    Each weight sync makes vLLM warn ``RotaryEmbedding: Failed to load weights`` (a buffer, not a weight):
    dropped, and only it."""
    from llmgym.engines import vllm as vllm_engine

    monkeypatch.setenv("LLMGYM_CACHE", str(tmp_path / "cache"))
    assert main(["quickstart", "--quick", "--steps", "2", "--out", str(tmp_path / "quickstart")]) == 0
    base = tmp_path / "quickstart" / "checkpoints" / "last"
    dropped, shown = [], []
    keep = vllm_engine._DropKnownNoise.filter

    def counting(self, record):
        kept = keep(self, record)
        if not kept:
            dropped.append(record.getMessage())
        return kept

    monkeypatch.setattr(vllm_engine._DropKnownNoise, "filter", counting)
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: shown.append(record.getMessage())
    logging.getLogger("vllm").addHandler(handler)
    try:
        out = tmp_path / "run"
        assert main(["train", "--env", "llmgym/Copy-v0", "--agent", "grpo", "--model", str(base), "--engine", "vllm",
                     "--steps", "2", "--out", str(out), "--set", "tasks_per_step=2", "--set", "group_size=2",
                     "--set", "max_new_tokens=6", "--engine-arg", "kv_cache_memory_bytes=67108864"]) == 0
    finally:
        logging.getLogger("vllm").removeHandler(handler)
    assert json.loads((out / "config.json").read_text())["engine"] == "vllm"
    assert dropped.count("RotaryEmbedding: Failed to load weights") >= 3  # the first load and one sync per step
    assert not [m for m in shown if "RotaryEmbedding" in m], shown


def test_vllms_compiled_sampling_helpers_run_under_torchs_generic_kernels():
    """Under ``ATEN_CPU_CAPABILITY=default`` torch 2.13's inductor writes C++ that does not compile for
    vLLM's logprob rank count, so every vLLM test and rollout failed there; llmgym's vLLM plugin (loaded
    in every vLLM process) makes vLLM's small compiled helpers run eagerly on those kernels only."""
    code = (
        "import torch\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "from vllm.platforms import current_platform\n"
        "from vllm.v1.sample.ops.logprobs import batched_count_greater_than\n"
        "x = torch.tensor([[0.1, 0.5, 0.9], [0.3, 0.2, 0.1]]); v = torch.tensor([[0.5], [0.2]])\n"
        "print(torch.backends.cpu.get_cpu_capability(), current_platform.simple_compile_backend,"
        " batched_count_greater_than(x, v).tolist())\n")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "DEFAULT eager [2, 2]", proc.stdout
