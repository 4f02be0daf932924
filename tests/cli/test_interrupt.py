"""Ctrl-C as a user presses it: SIGINT to a real ``llmgym train`` process group, mid-run, then ``--resume``.

The run stops at a step boundary, saves there and exits 130; the resumed run's metrics equal an
uninterrupted run's on every field but the timings — for the synchronous loop and for the pipelined
learner (``--async``), whose batches sampled ahead by older weights are saved with the checkpoint.
The env (``--import slow_odd``) pays the share of odd bytes in a completion, so a random model's rewards
vary and its weights move, and takes 50 ms per completion, so the signal lands mid-run on any machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from llmgym.cli import main
from llmgym.runtime.logging import TIMING_FIELDS

SLOW_ODD = '''
import time

from llmgym import SequenceEnv, Task, register_env


def odd_task(rng):
    return Task(f"odd {int(rng.integers(1000))}:", answer="")


def slow_share_of_odd_bytes(task, completion):
    time.sleep(0.05)
    data = completion.encode("utf-8", errors="replace")
    return sum(b % 2 for b in data) / max(1, len(data))


def slow_odd_env(tokenizer=None, **kwargs):
    return SequenceEnv(odd_task, slow_share_of_odd_bytes, tokenizer, **kwargs)


register_env("SlowOdd", slow_odd_env)
'''


def _rows(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").exists() else []
    return [json.loads(line) for line in lines]


def _without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING_FIELDS} for row in rows]


@pytest.fixture
def slow_odd(tmp_path, monkeypatch):
    """The env module saved in the run's folder (``--import slow_odd``), unregistered afterwards."""
    import gymnasium

    from llmgym.env import registry

    (tmp_path / "slow_odd.py").write_text(SLOW_ODD)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    registry._INFO.pop("llmgym/SlowOdd-v0", None)
    gymnasium.registry.pop("llmgym/SlowOdd-v0", None)
    sys.modules.pop("slow_odd", None)


@pytest.mark.parametrize("extra", [[], ["--async", "--max-staleness", "2"]], ids=["sync", "async-k2"])
def test_ctrl_c_mid_run_stops_at_a_step_boundary_and_resume_is_exact(extra, saved_tiny_model_dir, slow_odd):
    def args(out: str) -> list[str]:
        return ["train", "--import", "slow_odd", "--env", "llmgym/SlowOdd-v0", "--agent", "grpo", "--model",
                saved_tiny_model_dir, "--steps", "12", "--out", out, "--seed", "3", "--set", "tasks_per_step=2",
                "--set", "group_size=2", "--set", "max_new_tokens=4", "--set", "lr=0.01", "--checkpoint-every", "100",
                *extra]

    assert main(args("straight")) == 0  # in process: the CLI runs this tiny model on 1 thread, as the child does
    straight = _rows(slow_odd / "straight")
    assert len({r["reward_mean"] for r in straight}) > 3  # rewards vary: the weights move

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "llmgym", *args("split")], cwd=slow_odd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own group: a terminal's Ctrl-C reaches the whole group
    deadline = time.monotonic() + 600
    while len(_rows(slow_odd / "split")) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 130, stdout[-2000:] + stderr[-3000:]
    saved = int((slow_odd / "split" / "checkpoints" / "last" / "step.txt").read_text())
    assert 3 <= saved < 12 and len(_rows(slow_odd / "split")) == saved  # at a step boundary: the last step done
    assert f"checkpoint saved at step {saved}" in stdout
    assert "train --resume split --import slow_odd" in " ".join(stdout.split())  # the command to continue, whole
    if extra:  # the batches sampled ahead by older weights went with the checkpoint
        assert (slow_odd / "split" / "checkpoints" / "last" / "pipeline.pt").is_file()

    # as printed: a run folder loads no code by itself, --import names the env's module again
    assert main(["train", "--resume", "split", "--import", "slow_odd"]) == 0
    assert _without_timing(_rows(slow_odd / "split")) == _without_timing(straight)


def test_a_stopped_pipeline_continues_exactly_from_its_saved_state(tmp_path):
    """The pipeline itself: stopped by its callback after step 3 with K = 2, its state through
    ``torch.save`` / ``torch.load(weights_only=True)``, then resumed: the uninterrupted history, bit for bit."""
    import copy

    import gymnasium

    from llmgym.agents import GRPO
    from llmgym.agents.pipeline import PipelineState
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer

    tok = build_tokenizer()
    base = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))

    def agent():
        return GRPO(copy.deepcopy(base), tok, tasks_per_step=2, group_size=4, max_new_tokens=4, lr=1e-2,
                    kl_coef=0.0, seed=1)

    def env():
        return gymnasium.make("llmgym/Copy-v0", tokenizer=tok)

    straight = agent().learn(env(), 7, max_staleness=2)
    first = agent()
    head = first.learn(env(), 7, max_staleness=2, callback=lambda row: row["step"] < 3)
    state = first.pipeline_state
    assert [r["step"] for r in head] == [1, 2, 3] and sorted(state.pending) == [3, 4]  # steps 4, 5 (0-based 3, 4)
    torch.save(state.state_dict(), tmp_path / "pipeline.pt")
    torch.save(first.state_dict(), tmp_path / "agent.pt")
    second = agent()
    second.load_state_dict(torch.load(tmp_path / "agent.pt", weights_only=True))
    loaded = PipelineState.from_state_dict(torch.load(tmp_path / "pipeline.pt", weights_only=True))
    tail = second.learn(env(), 4, max_staleness=2, pipeline_state=loaded)
    assert _without_timing(head + tail) == _without_timing(straight)
    # without the saved batches the schedule restarts at step 3: another run (what --resume did before)
    third = agent()
    third.load_state_dict(torch.load(tmp_path / "agent.pt", weights_only=True))
    assert _without_timing(head + third.learn(env(), 4, max_staleness=2)) != _without_timing(straight)


def _short_run(saved_tiny_model_dir: str) -> list[str]:
    return ["train", "--import", "slow_odd", "--env", "llmgym/SlowOdd-v0", "--agent", "grpo", "--model",
            saved_tiny_model_dir, "--steps", "10", "--out", "run", "--seed", "3", "--set", "tasks_per_step=2",
            "--set", "group_size=2", "--set", "max_new_tokens=4", "--checkpoint-every", "100"]


def _saved_at_a_step_boundary_and_resumed(folder: Path) -> None:
    saved = int((folder / "run" / "checkpoints" / "last" / "step.txt").read_text())
    assert 2 <= saved < 10 and len(_rows(folder / "run")) == saved  # at a step boundary: the last step done
    assert main(["train", "--resume", "run", "--import", "slow_odd"]) == 0  # the env's module, named again
    assert [r["step"] for r in _rows(folder / "run")] == list(range(1, 11))


def test_a_closed_output_pipe_saves_at_a_step_boundary_and_says_how_to_resume_on_stderr(saved_tiny_model_dir,
                                                                                        slow_odd):
    """``llmgym train ... | head`` (or ``| tee`` ended by Ctrl-C): the reader goes, and the next line the run
    prints meets a closed pipe. The run stops at a step boundary as after Ctrl-C, saves there, says how to
    resume on stderr and exits 130 (before: exit 1, no word, no checkpoint, and ``--resume`` refused)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "llmgym", *_short_run(saved_tiny_model_dir)], cwd=slow_odd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while len(_rows(slow_odd / "run")) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.stdout.close()
        stderr = proc.stderr.read().decode()
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr[-3000:]
    saved = int((slow_odd / "run" / "checkpoints" / "last" / "step.txt").read_text())
    assert f"checkpoint saved at step {saved}" in stderr and "llmgym train --resume run --import slow_odd" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr[-3000:]
    _saved_at_a_step_boundary_and_resumed(slow_odd)


@pytest.mark.parametrize("name", ["SIGHUP", "SIGTERM"])
def test_a_hang_up_or_sigterm_stops_at_a_step_boundary_like_ctrl_c(name, saved_tiny_model_dir, slow_odd):
    """A dropped ssh session (SIGHUP) or ``kill`` (SIGTERM) mid-run: a step boundary, a checkpoint, exit 130 and
    ``--resume`` (before, either ended the process at once with no checkpoint). In process: the handler is
    installed for the run's steps only, and the signal is sent while they run."""
    import threading

    def send_mid_run() -> None:
        deadline = time.monotonic() + 600
        while len(_rows(slow_odd / "run")) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), getattr(signal, name))

    reached_outside = []  # where the run installs no handler of its own, the signal lands here, not in pytest's end
    previous = signal.signal(getattr(signal, name), lambda signum, frame: reached_outside.append(signum))
    try:
        sender = threading.Thread(target=send_mid_run, daemon=True)
        sender.start()
        code = main(_short_run(saved_tiny_model_dir))
        sender.join()
    finally:
        signal.signal(getattr(signal, name), previous)
    assert (code, reached_outside) == (130, [])
    _saved_at_a_step_boundary_and_resumed(slow_odd)
