"""The run: :class:`Trainer` trains an agent on an env into one directory, and resumes it exactly.

What ``llmgym train`` does, for any agent and env object: ``metrics.jsonl`` (one row per step,
flushed as it goes), TensorBoard events where available and the trackers asked for, ``curves.png``,
``config.json``, checkpoints every ``checkpoint_every`` steps plus ``checkpoints/last`` at the end or on
an interrupt, and a held-out greedy evaluation every ``eval_every`` steps. Ctrl-C (or SIGTERM, or a
hang-up) finishes the current step and saves a checkpoint; a second one stops at once, never saving a
half-updated state. :meth:`Trainer.resume` continues from ``checkpoints/last`` with the metrics an
uninterrupted run would have logged (the pipelined learner's batches sampled ahead included).

The trainer takes objects, not names: it never imports an agent or an env. It drives the agent through
its public interface — ``learn(env, steps, callback=...)``, ``step_count``, ``model``, ``tokenizer``,
``config``, ``state_dict``/``load_state_dict``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from llmgym.errors import LLMGymError
from llmgym.runtime.display import format_value, make_console, make_progress
from llmgym.runtime.files import check_run_folder, lost_steps_note, write_text_atomic
from llmgym.train.rollouts import (
    ROLLOUTS_EVERY,
    ROLLOUTS_FILE,
    ROLLOUTS_PER_STEP,
    RolloutLog,
    episode_advantages,
    episode_records,
    rewind_rollouts,
    step_records,
)

__all__ = ["EVAL_SEED", "RolloutsLost", "RunExistsError", "StopOnSignals", "TrainResult", "Trainer",
           "batch_metrics", "reward_progress", "samples_per_step"]

EVAL_SEED = 1_000_003
"""Seed of the evaluation tasks of ``eval_every`` (a stream apart from the training draws' seeds)."""


class RunExistsError(LLMGymError, FileExistsError):
    """A new run's directory already holds a run (resume it, or choose another directory)."""


class RolloutsLost(LLMGymError, ConnectionError):
    """The rollouts stopped coming (e.g. every rollout server of a fleet is gone); the run saved what it could.

    Attributes: ``completed_step`` (the last step done), ``checkpoint`` and ``checkpoint_step`` (what
    ``checkpoints/last`` holds, or ``None``)."""

    def __init__(self, message: str, completed_step: int, checkpoint: Path | None, checkpoint_step: int | None):
        super().__init__(message)
        self.completed_step = completed_step
        self.checkpoint = checkpoint
        self.checkpoint_step = checkpoint_step


@dataclasses.dataclass
class TrainResult:
    """A finished (or interrupted) run: its metrics, agent and files."""

    out_dir: Path
    rows: list[dict[str, Any]]
    """Every step's metrics of the run so far (a resumed run's earlier steps included)."""
    agent: Any
    interrupted: bool
    """Stopped before the target (a signal, :meth:`Trainer.request_stop`, or a callback returning ``False``)."""
    wall_s: float
    checkpoint: Path | None
    curves: Path | None
    tensorboard_dir: Path | None
    checkpoint_step: int | None = None
    """The step ``checkpoint`` holds (after a mid-step interrupt: the last checkpointed step, not the current)."""


STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
"""The signals a run treats as "stop after this step": Ctrl-C, a polite kill, a closed terminal."""


def _reader_gone(exc: BaseException) -> bool:
    """A write failed because its reader went away: a closed pipe (``| head``, an ended ``| tee``) or a
    terminal that hung up (a dropped ssh session answers EIO)."""
    return isinstance(exc, BrokenPipeError) or (isinstance(exc, OSError) and exc.errno in (errno.EPIPE, errno.EIO))


class GuardedOutput:
    """A console's stream that survives its reader going away.

    When a write or flush fails because the reader is gone, ``gone`` turns true, ``on_gone`` is called (a
    run then stops at the next step boundary, as after Ctrl-C), what is printed from then on goes to stderr
    (nowhere where stderr is gone too), and the closed stream is pointed at ``/dev/null`` so that no later
    flush (the interpreter's own at exit) raises ``BrokenPipeError`` again.

    Example:
        >>> import io
        >>> from llmgym.train.trainer import GuardedOutput
        >>> class Closed(io.StringIO):
        ...     def write(self, text):
        ...         raise BrokenPipeError(32, "Broken pipe")
        >>> out = GuardedOutput(Closed())
        >>> out.on_gone = lambda: print("stop requested")
        >>> _ = out.write("step 3")
        stop requested
        >>> out.gone
        True
    """

    def __init__(self, stream: Any):
        self._stream = stream
        self.gone = False
        self.on_gone: Any = None

    def write(self, text: str) -> int:
        while self._stream is not None:
            try:
                return self._stream.write(text)
            except OSError as exc:
                if not _reader_gone(exc):
                    raise
                self._lost()
        return len(text)

    def flush(self) -> None:
        while self._stream is not None:
            try:
                return self._stream.flush()
            except OSError as exc:
                if not _reader_gone(exc):
                    raise
                self._lost()

    def _lost(self) -> None:
        lost, self._stream = self._stream, None
        with contextlib.suppress(Exception):  # no later write to it can fail
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, lost.fileno())
            os.close(devnull)
        if lost is not sys.stderr and sys.stderr is not None:
            self._stream = sys.stderr
        self.gone = True
        if self.on_gone is not None:
            self.on_gone()

    def isatty(self) -> bool:
        return bool(self._stream is not None and self._stream.isatty())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream if self._stream is not None else sys.stderr, name)


def guard_output(console) -> GuardedOutput:
    """``console``'s stream, guarded (once: it stays guarded, so a run's last lines go through it too)."""
    if not isinstance(console.file, GuardedOutput):
        console.file = GuardedOutput(console.file)
    return console.file


class StopOnSignals:
    """First signal: ask the run to stop after the current step (it then saves a checkpoint). A second
    one: ``KeyboardInterrupt`` at once (mid-step: nothing saved).

    ``signals``: names of the signals to catch (those this platform lacks are skipped). Handlers are
    installed only in the main thread (elsewhere Python cannot) and restored on exit.

    Example:
        >>> import signal
        >>> from llmgym.train import StopOnSignals
        >>> with StopOnSignals(signals=("SIGINT",)) as stop:
        ...     signal.raise_signal(signal.SIGINT)
        ...     stop.requested, stop.reason
        (True, 'SIGINT')
    """

    def __init__(self, console=None, signals: Iterable[str] = STOP_SIGNALS):
        self.console = console
        self.signals = [getattr(signal, name) for name in signals if hasattr(signal, name)]
        self.requested = False
        self.reason: str | None = None
        self._previous: dict[int, Any] = {}
        self._output: GuardedOutput | None = None

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        self._output = guard_output(self.console) if getattr(self.console, "file", None) is not None else None
        if self._output is not None:  # a closed pipe or a hung-up terminal stops the run like Ctrl-C
            self._output.on_gone = self._output_gone
            if self._output.gone:  # already before the run (the banner met a closed pipe)
                self._output_gone()
        return self

    def _output_gone(self) -> None:
        if not self.requested:
            self.request("output closed")
            with contextlib.suppress(Exception):  # stderr itself may be gone
                print("llmgym: the output closed (its reader went away): finishing this step, then saving a "
                      "checkpoint; what follows goes to stderr", file=sys.stderr, flush=True)

    def request(self, reason: str) -> None:
        """Stop after the current step (what the first signal does; a program may call it too)."""
        self.requested, self.reason = True, self.reason or reason

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        name = signal.Signals(signum).name
        self.request(name)
        what, again = ("Ctrl-C", "press Ctrl-C again") if name == "SIGINT" else (name, "send it again or press Ctrl-C")
        try:
            if self.console is not None:
                self.console.print(f"[yellow]{what}: finishing this step, then saving a checkpoint "
                                   f"({again} to stop at once)[/]")
        except (OSError, ValueError):  # the terminal is gone (a hang-up): keep stopping cleanly
            pass

    def __exit__(self, *exc: object) -> None:
        if self._output is not None:
            self._output.on_gone = None
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


def reward_progress(console):
    """The run's progress display: reward, its 10-step average and KL beside the bar."""
    return make_progress(console, "reward {task.fields[reward]}", "avg {task.fields[avg]}", "kl {task.fields[kl]}")


def samples_per_step(config) -> int:
    """Completions an agent samples per step by its config: ``tasks_per_step × group_size``
    (DAPO's extra draws come on top; they are counted from the step's row)."""
    return int(config.tasks_per_step) * int(config.group_size)


def batch_metrics(batch, row: dict[str, Any]) -> dict[str, float]:
    """What a step's row gains from its batch: ``completion_len_max`` (sampled tokens of the longest episode),
    ``zero_var_groups`` (the share of the batch's groups whose rewards are all equal: no learning signal for a
    group-relative advantage) and ``update_s`` (the update's time: the pipelined learner's busy time, else the
    step's time less the rollout's).

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> from llmgym.train.trainer import batch_metrics
        >>> batch = SimpleNamespace(rewards=torch.tensor([1.0, 1.0, 0.0, 1.0]), groups=torch.tensor([0, 0, 1, 1]),
        ...                         lengths=torch.tensor([3, 5, 2, 4]))
        >>> batch_metrics(batch, {"wall_s": 1.0, "rollout_s": 0.25})
        {'completion_len_max': 5.0, 'zero_var_groups': 0.5, 'update_s': 0.75}
    """
    out: dict[str, float] = {}
    lengths = getattr(batch, "lengths", None)
    if lengths is not None and len(lengths):
        out["completion_len_max"] = float(lengths.max())
    rewards, groups = getattr(batch, "rewards", None), getattr(batch, "groups", None)
    if rewards is not None and groups is not None and len(groups):
        per_group: dict[int, set[float]] = {}
        for g, r in zip(groups.tolist(), rewards.tolist()):
            per_group.setdefault(int(g), set()).add(round(float(r), 12))
        out["zero_var_groups"] = sum(len(v) == 1 for v in per_group.values()) / len(per_group)
    if "learn_busy_s" in row:
        out["update_s"] = float(row["learn_busy_s"])
    elif "wall_s" in row and "rollout_s" in row:
        out["update_s"] = max(0.0, float(row["wall_s"]) - float(row["rollout_s"]))
    return out


def _env_id(env) -> str:
    spec = getattr(env, "spec", None) or getattr(getattr(env, "unwrapped", env), "spec", None)
    return getattr(spec, "id", None) or type(getattr(env, "unwrapped", env)).__name__


def _reward_range(env) -> tuple[float, float] | None:
    """The env's declared reward range (``env.unwrapped.reward_range``) when it is finite, else ``None``."""
    low, high = getattr(env.unwrapped, "reward_range", (float("-inf"), float("inf")))
    return (float(low), float(high)) if all(map(math.isfinite, (low, high))) else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """``path`` written through a temporary file and a rename: a reader never sees half of it."""
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


class Trainer:
    """Train ``agent`` on ``env`` into ``out_dir``: metrics, curves, checkpoints, exact resume, interrupts.

    Args:
        agent: an agent (``llmgym.agents``), trained in place.
        env: the training env (its task stream is the agent's).
        out_dir: the run directory; a new run refuses one that holds a run (:class:`RunExistsError`).
        eval_env, eval_every, eval_tasks: every ``eval_every`` steps (and at the last), the greedy reward
            on ``eval_tasks`` fixed tasks of ``eval_env`` (a count, drawn with :data:`EVAL_SEED`, or the
            tasks themselves), logged as ``eval_reward`` / ``eval_exact_match``. ``eval_env`` is an env
            of its own, so the training env's task stream is not touched.
        checkpoint_every: ``checkpoints/step-N`` every this many steps, and ``checkpoints/last`` then,
            at the end and on an interrupt; ``0``: only ``last``; ``None``: no checkpoints at all.
        trackers: experiment trackers mirroring ``metrics.jsonl`` (``"wandb"``, ``"trackio"``); a resumed run
            continues their runs, and the sampled episodes go to them as tables.
        rollouts_every, rollouts_per_step: ``rollouts.jsonl`` gets up to ``rollouts_per_step`` episodes of
            every ``rollouts_every``-th step, of the first and the last, and of every evaluation
            (:mod:`llmgym.train.rollouts`); ``rollouts_every=0``: no such file.
        max_staleness, verify_workers: the pipelined learner (``agent.learn``'s options); ``None``: the
            synchronous loop.
        config: what ``config.json`` records (and the trackers get); default: agent, env, the agent's
            config and these settings.
        env_id: the env's name in labels (progress bar, curves' title, tracker run); default its
            Gymnasium id (``env.spec.id``), else its class name.
        callback: called with each step's row once it is logged; returning ``False`` stops the run
            there, as Ctrl-C does (checkpoint saved, ``interrupted=True``).
        console, progress, description: where messages and the progress bar go (a ``rich`` console; a
            ``Progress`` shared with other runs, ``None`` for the run's own, ``False`` for none; the bar's label).
        signals: the signals that stop the run after the current step (:class:`StopOnSignals`).

    Example:
        >>> import tempfile, gymnasium
        >>> from llmgym.agents import GRPO
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.train import Trainer
        >>> model, tok = load_model("tiny")
        >>> agent = GRPO(model, tok, tasks_per_step=2, group_size=2, max_new_tokens=3, kl_coef=0.0)
        >>> env = gymnasium.make("llmgym/Copy-v0", tokenizer=tok, max_new_tokens=3)
        >>> out = tempfile.mkdtemp()
        >>> result = Trainer(agent, env, out, checkpoint_every=1, progress=False).run(2)
        >>> [row["step"] for row in result.rows], result.checkpoint_step
        ([1, 2], 2)

        Later, in a new process, rebuild the same objects and continue to a new total:

        >>> agent = GRPO(load_model("tiny")[0], tok, tasks_per_step=2, group_size=2, max_new_tokens=3, kl_coef=0.0)
        >>> result = Trainer.resume(out, agent, env, progress=False).run(3)
        >>> [row["step"] for row in result.rows]
        [1, 2, 3]
    """

    def __init__(self, agent, env, out_dir: str | os.PathLike, *, eval_env=None, eval_every: int = 0,
                 eval_tasks: int | Sequence[Any] = 32, checkpoint_every: int | None = 50,
                 trackers: Sequence[str] = (), rollouts_every: int = ROLLOUTS_EVERY,
                 rollouts_per_step: int = ROLLOUTS_PER_STEP, max_staleness: int | None = None, verify_workers: int | None = None,
                 config: dict[str, Any] | None = None, env_id: str | None = None,
                 callback: Callable[[dict[str, Any]], Any] | None = None,
                 console=None, progress=None, description: str | None = None,
                 signals: Iterable[str] = STOP_SIGNALS):
        if eval_every < 0:
            raise ValueError(f"eval_every must be >= 0 (0 = never), got {eval_every}")
        if checkpoint_every is not None and checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0 (0 = only at the end; None = never), got {checkpoint_every}")
        if max_staleness is None and verify_workers is not None:
            raise ValueError("verify_workers is an option of the pipelined learner: pass max_staleness=K too")
        self.agent, self.env, self.out_dir = agent, env, Path(out_dir)
        self.eval_env, self.eval_every = eval_env, eval_every
        self.eval_tasks: list[Any] | None = None
        if eval_every > 0:
            if eval_env is None:
                raise ValueError("eval_every needs eval_env=: an env of its own (the training env's task stream "
                                 "stays untouched)")
            if isinstance(eval_tasks, int):
                from llmgym.rollout import distinct_tasks

                if eval_tasks < 1:
                    raise ValueError(f"eval_tasks must be >= 1, got {eval_tasks}")
                eval_tasks, _ = distinct_tasks(eval_env, eval_tasks, seed=EVAL_SEED)
            self.eval_tasks = list(eval_tasks)
        if rollouts_every < 0 or rollouts_per_step < 1:
            raise ValueError(f"rollouts_every must be >= 0 (0 = none) and rollouts_per_step >= 1, got "
                             f"{rollouts_every} and {rollouts_per_step}")
        self.checkpoint_every = checkpoint_every
        self.trackers = list(trackers)
        self.rollouts_every, self.rollouts_per_step = rollouts_every, rollouts_per_step
        self.max_staleness, self.verify_workers = max_staleness, verify_workers
        self.env_id = env_id or _env_id(env)
        self.config = config if config is not None else self._default_config()
        self.callback = callback
        self.console = console
        self.progress = progress
        self.description = description
        self.signals = tuple(signals)
        self.rows: list[dict[str, Any]] = []
        self.checkpoint: Path | None = None
        self.checkpoint_step: int | None = None
        self._continuing = False  # resumed, or run before: metrics.jsonl is appended to
        self._pipeline_state: Any = None
        self._stop: StopOnSignals | None = None
        self._stop_early = False
        self.resume_notes: list[str] = []
        """What :meth:`resume` found damaged in the run's logs (one line each; empty when nothing was)."""

    def _default_config(self) -> dict[str, Any]:
        from llmgym import __version__

        agent_config = getattr(self.agent, "config", None)
        return {"llmgym_version": __version__, "agent": getattr(self.agent, "name", type(self.agent).__name__),
                "env": self.env_id,
                "agent_config": dataclasses.asdict(agent_config) if dataclasses.is_dataclass(agent_config) else {},
                "checkpoint_every": self.checkpoint_every, "eval_every": self.eval_every,
                "eval_tasks": len(self.eval_tasks or []), "trackers": self.trackers,
                "rollouts_every": self.rollouts_every, "rollouts_per_step": self.rollouts_per_step,
                "max_staleness": self.max_staleness, "verify_workers": self.verify_workers}

    @property
    def checkpoint_dir(self) -> Path:
        """``out_dir/checkpoints``."""
        return self.out_dir / "checkpoints"

    @classmethod
    def resume(cls, out_dir: str | os.PathLike, agent, env, **options: Any) -> Trainer:
        """A trainer that continues the run in ``out_dir`` from its ``checkpoints/last``.

        ``agent`` and ``env`` are built as the run's were (same class, config and model: a KL reference
        stays the base model); the checkpoint's weights, optimiser, counters and RNG are loaded into
        ``agent``, and ``metrics.jsonl`` and ``rollouts.jsonl`` lose any row after the checkpoint's step. ``options`` are the
        constructor's (give the same ``max_staleness``; the rest may change). Then :meth:`run` with the
        total number of steps logs what an uninterrupted run would have.

        The run folder is data: a file of it that is a link is refused
        (:class:`~llmgym.runtime.files.RunFileError`), and a damaged ``metrics.jsonl`` (a cut or corrupt line,
        lines removed) is said in one line on the console, kept in :attr:`resume_notes`, and recorded in the
        file as a note naming the lost steps (:func:`llmgym.runtime.files.rewind`): no gap without a word.

        Raises :class:`~llmgym.train.checkpoint.CheckpointError` when there is no readable checkpoint.
        """
        from llmgym.runtime.logging import rewind_metrics
        from llmgym.train.checkpoint import PIPELINE_STATE, CheckpointError, load_checkpoint, load_pipeline_state

        trainer = cls(agent, env, out_dir, **options)
        check_run_folder(trainer.out_dir)
        last = trainer.checkpoint_dir / "last"
        check_run_folder(trainer.checkpoint_dir, ("last",))
        if last.is_dir():
            check_run_folder(last, [p.name for p in last.iterdir()])
        if not (last / "agent.pt").is_file():
            raise CheckpointError(f"no checkpoint to resume at {last}: was the run started with checkpoints?")
        if trainer.max_staleness is None and (last / PIPELINE_STATE).is_file():
            raise CheckpointError(f"{last} holds a pipelined run's batches sampled ahead: resume it with the "
                                  f"max_staleness it ran with")
        load_checkpoint(agent, last)
        if trainer.max_staleness is not None:  # batches a stopped pipelined run had sampled ahead
            trainer._pipeline_state = load_pipeline_state(last)
        done = agent.step_count
        trainer.rows, metrics = rewind_metrics(trainer.out_dir / "metrics.jsonl", done)
        rollouts = rewind_rollouts(trainer.out_dir / ROLLOUTS_FILE, done)
        trainer.resume_notes = [note for note in (lost_steps_note("metrics.jsonl", metrics, done),
                                                  rollouts.note(ROLLOUTS_FILE)) if note]
        if trainer.resume_notes:
            console = trainer.console or make_console()
            for note in trainer.resume_notes:
                console.print(f"[yellow]{note}[/]", markup=True, highlight=False)
        trainer.checkpoint, trainer.checkpoint_step = last, done
        trainer._continuing = True
        return trainer

    def request_stop(self) -> None:
        """Stop after the current step and save a checkpoint, as the first Ctrl-C does (safe from any thread)."""
        self._stop_early = True
        if self._stop is not None:
            self._stop.request("request_stop")

    def run(self, steps: int) -> TrainResult:
        """Train until the agent has done ``steps`` steps in all (a resumed run counts its earlier ones).

        Returns the :class:`TrainResult`; ``interrupted`` when a signal, :meth:`request_stop` or the
        callback stopped it first (the checkpoint then holds the last completed step). Raises
        :class:`RolloutsLost` when the rollouts stop coming (after saving the completed steps).
        """
        from llmgym.runtime import logging as run_logging
        from llmgym.runtime.logging import MetricsLogger, moving_average
        from llmgym.train.checkpoint import save_checkpoint

        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        agent, out = self.agent, self.out_dir
        if not self._continuing:
            earlier = [p for p in (out / "metrics.jsonl", self.checkpoint_dir) if p.exists()]
            if earlier:
                raise RunExistsError(f"{str(out)!r} already holds a run ({earlier[0].name}): continue it with "
                                     f"Trainer.resume({str(out)!r}, agent, env), or choose another out_dir")
        check_run_folder(out)  # never written through a link
        console = self.console or make_console()
        checkpoints = self.checkpoint_every is not None
        every = self.checkpoint_every or 0
        _write_json(out / "config.json", self.config)
        logger = MetricsLogger(out, append=self._continuing, trackers=self.trackers,
                               run_name=f"{getattr(agent, 'name', 'agent')}-{self.env_id}", run_config=self.config)
        try:
            samples = RolloutLog(out, every=self.rollouts_every, per_step=self.rollouts_per_step,
                                 append=self._continuing)
        except BaseException:
            logger.close()
            raise
        self._continuing = True
        batches: list[Any] = []  # the step's batch, from the agent's batch_observer to on_step
        observer_before = getattr(agent, "batch_observer", None)
        agent.batch_observer = batches.append
        rows = self.rows
        remaining = max(0, steps - agent.step_count)
        progress = self.progress
        own_progress = progress is None
        if own_progress:
            progress = reward_progress(console)
        job = None
        if progress is not False:
            job = progress.add_task(self.description or f"{getattr(agent, 'name', 'agent')} on {self.env_id}",
                                    total=steps, completed=agent.step_count, reward="—", avg="—", kl="—")
        started = time.perf_counter()
        interrupted = False
        # True while the agent's state is that of a completed step (inside the step callback, or after
        # it asked the agent to stop): a KeyboardInterrupt (a second Ctrl-C) anywhere else in learn()
        # lands mid-step, with the model, optimiser or RNG partly advanced, and that state must not
        # become a checkpoint.
        at_step_boundary = False
        completed_step = agent.step_count
        per_step = samples_per_step(agent.config)
        samples_total = float(rows[-1].get("samples_total", 0.0)) if rows else 0.0
        tokens_total = float(rows[-1].get("tokens_total", 0.0)) if rows else 0.0

        # the handler stays installed until the final checkpoint is written: a first signal there is
        # absorbed (the save finishes), a second one stops at once with "checkpoints/last" intact (saves
        # are atomic)
        with StopOnSignals(console, self.signals) as stop:
            self._stop = stop
            if self._stop_early:
                stop.request("request_stop")

            def on_step(row: dict[str, Any]) -> bool:
                nonlocal at_step_boundary, completed_step, samples_total, tokens_total
                sampled = per_step * (1 + int(row.get("extra_draws", 0) or 0))
                samples_total += sampled
                tokens_total += sampled * float(row.get("completion_len", 0.0) or 0.0)
                row = {**row, "samples_total": samples_total, "tokens_total": tokens_total}
                step = int(row["step"])
                batch = batches.pop() if batches else None
                batches.clear()
                to_record = None  # the step's episodes to record, taken before the batch is freed
                if batch is not None:
                    row.update(batch_metrics(batch, row))
                    if samples.wants(step, steps):
                        to_record = (list(getattr(batch, "episodes", None) or []), episode_advantages(batch))
                del batch
                evaluated: list[Any] = []
                if self.eval_tasks is not None and (step % self.eval_every == 0 or step == steps):
                    from llmgym.engines import HFEngine, SamplingParams
                    from llmgym.rollout import evaluate

                    greedy = SamplingParams(temperature=0.0, max_new_tokens=agent.config.max_new_tokens)
                    result = evaluate(self.eval_env, HFEngine(agent.model, agent.tokenizer), self.eval_tasks, greedy,
                                      seed=EVAL_SEED, episodes_out=evaluated)
                    row["eval_reward"], row["eval_exact_match"] = result["reward_mean"], result["exact_match"]
                records: list[dict[str, Any]] = []
                if to_record is not None:
                    records += step_records(*to_record, agent.tokenizer, step, samples.per_step,
                                            on_policy=self.max_staleness is None)
                if evaluated and samples.every > 0:
                    records += episode_records(evaluated, agent.tokenizer, step=step, split="eval", current_version=step,
                                               sampled_by=step, indices=range(min(samples.per_step, len(evaluated))))
                rows.append(row)
                if records:
                    samples.write(records)
                    logger.log_table("rollouts", records, step)
                logger.log(row)
                completed_step = step
                at_step_boundary = True
                if job is not None:
                    recent = moving_average([r["reward_mean"] for r in rows[-10:]], 10)[-1]
                    progress.update(job, advance=1, reward=format_value(row["reward_mean"]),
                                    avg=format_value(recent), kl=format_value(row.get("kl"), 4))
                if checkpoints and every > 0 and step % every == 0 and step < steps:
                    save_checkpoint(agent, agent.tokenizer, self.checkpoint_dir / f"step-{step:06d}")
                    self.checkpoint = save_checkpoint(agent, agent.tokenizer, self.checkpoint_dir / "last")
                    self.checkpoint_step = step
                if self.callback is not None and self.callback(row) is False:
                    stop.request("callback")
                if stop.requested:
                    return False  # the agent stops here: its state stays the completed step's
                at_step_boundary = False  # the next step starts
                return True

            if own_progress:
                progress.start()  # the run's own bar (progress=False: none; a given one is its owner's)
            consistent = True
            lost: ConnectionError | None = None
            try:
                if remaining and not stop.requested:
                    pipelined = {} if self.max_staleness is None else dict(
                        max_staleness=self.max_staleness, verify_workers=self.verify_workers,
                        drain_every=every if checkpoints and every > 0 else None,
                        pipeline_state=self._pipeline_state)
                    self._pipeline_state = None
                    agent.learn(self.env, remaining, callback=on_step, **pipelined)
                    if stop.requested and self.max_staleness is not None:  # a second run() continues exactly
                        self._pipeline_state = getattr(agent, "pipeline_state", None)
                interrupted = stop.requested
            except KeyboardInterrupt:
                interrupted = True
                consistent = at_step_boundary and agent.step_count == completed_step
            except ConnectionError as exc:  # e.g. a fleet with no rollout server left: save, then stop
                lost = exc
                consistent = agent.step_count == completed_step  # raised between updates, or inside one (not saved)
            finally:
                if own_progress:
                    progress.stop()
                agent.batch_observer = observer_before
                samples.close()
                logger.close()
            if checkpoints and consistent:  # a pipelined run stopped between drain points keeps its batches ahead
                self.checkpoint = save_checkpoint(agent, agent.tokenizer, self.checkpoint_dir / "last",
                                                  getattr(agent, "pipeline_state", None) if stop.requested else None)
                self.checkpoint_step = agent.step_count
            elif checkpoints:
                kept = self.checkpoint_dir / "last"
                if kept.is_dir() and self.checkpoint_step is not None:
                    self.checkpoint = kept
                    console.print(f"[yellow]stopped mid-step {completed_step + 1}, with the model partly updated: "
                                  f"not saved; {kept} stays at step {self.checkpoint_step}, and resuming continues "
                                  f"from there[/]")
                else:
                    self.checkpoint, self.checkpoint_step = None, None
                    console.print(f"[yellow]stopped mid-step {completed_step + 1}, with the model partly updated: "
                                  f"not saved, and no earlier checkpoint exists (checkpoints every {every} "
                                  f"steps); start again in an empty directory[/]")
            label = f"{getattr(agent, 'name', 'agent')} on {self.env_id}"
            curves = run_logging.plot_curves(rows, out / "curves.png", title=label,
                                             reward_range=_reward_range(self.env)) if rows else None
            self._stop = None
            self._stop_early = False
            if lost is not None:
                saved = (f"checkpoints/last is step {self.checkpoint_step}" if checkpoints and
                         self.checkpoint_step is not None else "no checkpoint was saved")
                raise RolloutsLost(f"the run stopped after step {completed_step}: {' '.join(str(lost).split())}; "
                                   f"{saved}", completed_step, self.checkpoint if checkpoints else None,
                                   self.checkpoint_step if checkpoints else None) from lost
            interrupted = (interrupted or stop.requested) and agent.step_count < steps  # a late stop: done anyway
        return TrainResult(out, rows, agent, interrupted, time.perf_counter() - started,
                           self.checkpoint if checkpoints else None, curves, logger.tensorboard_dir,
                           self.checkpoint_step if checkpoints else None)
