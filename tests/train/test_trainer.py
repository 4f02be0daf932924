"""The run as a library object: a Python user's ``Trainer`` gets what ``llmgym train`` gets.

Interrupted (a real SIGINT or SIGTERM delivered to the process mid-run, or the user's callback), the run
stops at a step boundary and saves there; ``Trainer.resume`` on freshly built objects then logs exactly
the metrics of an uninterrupted run — for the synchronous loop and for the pipelined learner, whose
batches sampled ahead by older weights are saved with the checkpoint.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from llmgym import SequenceEnv, Task
from llmgym.runtime.logging import TIMING_FIELDS
from llmgym.train import CheckpointError, RunExistsError, Trainer

STEPS = 5


def _without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING_FIELDS} for row in rows]


def _odd_task(rng):
    return Task(f"odd {int(rng.integers(1000))}:", answer="")


def _share_of_odd_bytes(task, completion):
    data = completion.encode("utf-8", errors="replace")
    return sum(b % 2 for b in data) / max(1, len(data))


def _objects(model_dir: str):
    """A GRPO agent on a freshly loaded model and an env object (not a registered id) whose reward a
    random model's samples vary on, so its weights move: what a user's script builds each time."""
    from llmgym.agents import GRPO
    from llmgym.runtime.models import load_model

    model, tok = load_model(model_dir)
    agent = GRPO(model, tok, tasks_per_step=2, group_size=2, max_new_tokens=4, lr=0.01, kl_coef=0.0, seed=3)
    return agent, SequenceEnv(_odd_task, _share_of_odd_bytes, tok)


@pytest.fixture(scope="module")
def straight(saved_tiny_model_dir, tmp_path_factory) -> dict[str | None, list[dict]]:
    """Uninterrupted runs, synchronous and pipelined (K = 2), by ``max_staleness``."""
    runs = {}
    for staleness in (None, 2):
        agent, env = _objects(saved_tiny_model_dir)
        out = tmp_path_factory.mktemp("straight")
        result = Trainer(agent, env, out, checkpoint_every=100, max_staleness=staleness, rollouts_every=2,
                         progress=False).run(STEPS)
        assert not result.interrupted and [r["step"] for r in result.rows] == list(range(1, STEPS + 1))
        runs[staleness] = result.rows
        runs["rollouts", staleness] = (out / "rollouts.jsonl").read_text()
    assert len({r["reward_mean"] for r in runs[None]}) > 2  # rewards vary: the weights move
    return runs


def _stop_at_step_2(how: str):
    def callback(row):
        if row["step"] != 2:
            return None
        if how == "callback":
            return False
        signal.raise_signal(getattr(signal, how))  # delivered to this process; the handler runs now, mid-callback
        return None

    return callback


@pytest.mark.parametrize("how, staleness", [("SIGINT", None), ("SIGTERM", None), ("SIGINT", 2), ("callback", 2)],
                         ids=["sigint-sync", "sigterm-sync", "sigint-async-k2", "callback-async-k2"])
def test_an_interrupted_python_run_resumes_exactly(how, staleness, straight, saved_tiny_model_dir, tmp_path):
    previous = signal.getsignal(signal.SIGINT)
    agent, env = _objects(saved_tiny_model_dir)
    trainer = Trainer(agent, env, tmp_path, checkpoint_every=100, max_staleness=staleness, progress=False,
                      rollouts_every=2, callback=_stop_at_step_2(how))
    result = trainer.run(STEPS)
    assert signal.getsignal(signal.SIGINT) is previous  # the run's handler is gone with the run
    assert result.interrupted and result.checkpoint_step == 2 and agent.step_count == 2
    assert (tmp_path / "checkpoints" / "last" / "step.txt").read_text().strip() == "2"
    if staleness is not None:  # stopped between drain points: the batches sampled ahead went with it
        assert (tmp_path / "checkpoints" / "last" / "pipeline.pt").is_file()

    if how == "callback":  # the same trainer, in the same process, carries on
        resumed = trainer.run(STEPS)
    else:  # from disk: a new process would rebuild the objects just so
        agent, env = _objects(saved_tiny_model_dir)
        resumed = Trainer.resume(tmp_path, agent, env, checkpoint_every=100, max_staleness=staleness,
                                 rollouts_every=2, progress=False).run(STEPS)
    assert not resumed.interrupted and resumed.checkpoint_step == STEPS
    assert _without_timing(resumed.rows) == _without_timing(straight[staleness])
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == STEPS and (tmp_path / "curves.png").is_file() and (tmp_path / "config.json").is_file()
    # the sampled episodes too: steps 1, 2, 4 and 5, each once, as the uninterrupted run wrote them
    assert (tmp_path / "rollouts.jsonl").read_text() == straight["rollouts", staleness]


def test_a_new_run_refuses_a_directory_that_holds_one_and_resume_needs_a_checkpoint(saved_tiny_model_dir, tmp_path):
    agent, env = _objects(saved_tiny_model_dir)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunExistsError, match=r"already holds a run \(metrics.jsonl\): continue it with Trainer.resume"):
        Trainer(agent, env, tmp_path, progress=False).run(1)
    with pytest.raises(CheckpointError, match="no checkpoint to resume"):
        Trainer.resume(tmp_path, agent, env)
    with pytest.raises(ValueError, match="eval_every needs eval_env"):
        Trainer(agent, env, Path(tmp_path) / "other", eval_every=2)


def test_the_stop_signals_ask_once_then_stop_at_once_and_a_dead_terminal_does_not_break_the_stop():
    """A hang-up as a closed terminal sends it: the message cannot be printed (EIO), the stop is still
    requested; the second signal is a ``KeyboardInterrupt``; the previous handlers come back."""
    from llmgym.train import StopOnSignals

    class GoneTerminal:
        def print(self, *args, **kwargs):
            raise OSError(5, "Input/output error")

    before = {name: signal.getsignal(getattr(signal, name)) for name in ("SIGINT", "SIGTERM", "SIGHUP")}
    with StopOnSignals(GoneTerminal()) as stop:
        signal.raise_signal(signal.SIGHUP)
        assert stop.requested and stop.reason == "SIGHUP"
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)
    assert {name: signal.getsignal(getattr(signal, name)) for name in before} == before


def test_resuming_a_stopped_pipelined_run_without_its_staleness_is_refused(saved_tiny_model_dir, tmp_path):
    (tmp_path / "checkpoints" / "last").mkdir(parents=True)
    for name in ("agent.pt", "pipeline.pt"):
        (tmp_path / "checkpoints" / "last" / name).write_bytes(b"")
    agent, env = _objects(saved_tiny_model_dir)
    with pytest.raises(CheckpointError, match="resume it with the max_staleness it ran with"):
        Trainer.resume(tmp_path, agent, env)
