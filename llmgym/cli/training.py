"""The training loop shared by ``train``, ``quickstart`` and ``compare``: :func:`train_run`.

Example:
    >>> from llmgym.cli.training import RunSpec
    >>> RunSpec(env="llmgym/Copy-v0", agent="grpo", model="tiny", steps=10).level
    'sequence'
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from llmgym.cli.console import format_value, reward_progress
from llmgym.cli.engine_options import build_engine
from llmgym.cli.resolve import (
    apply_threads,
    build_agent_config,
    construct_agent,
    load_run_model,
    make_run_env,
    require_agent,
    require_env,
)
from llmgym.cli.run_files import RUN_FILES, atomic_write_text, existing_files
from llmgym.cli.usage import UsageError
from llmgym.runtime.display import make_console

__all__ = ["EVAL_SEED", "RunSpec", "TrainResult", "samples_per_step", "train_run"]


@dataclasses.dataclass
class RunSpec:
    """What a training run is: written as ``config.json``, read back by ``--resume``."""

    env: str
    agent: str
    model: str
    steps: int
    level: str = "sequence"
    checkpoint_every: int = 50
    threads: int | None = None
    agent_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    env_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    eval_every: int = 0
    """Greedy reward on ``eval_tasks`` fixed tasks every this many steps (0 = never)."""
    eval_tasks: int = 32
    log_to: list[str] = dataclasses.field(default_factory=list)
    """Extra trackers (``"wandb"``, ``"trackio"``) mirroring ``metrics.jsonl``."""
    device: str | None = None
    """Where the model is loaded and trained (``"cpu"``, ``"cuda"``, ``"cuda:N"``; ``None``: CPU)."""
    engine: str = "hf"
    """The rollout engine (``--engine``): ``"hf"`` or ``"vllm"`` (weights synced after every update)."""
    engine_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Options of the engine (``--engine-arg``), e.g. vLLM's ``dtype`` or ``kv_cache_memory_bytes``."""
    max_staleness: int | None = None
    """``None``: the synchronous loop; ``K``: the pipelined learner (``--async --max-staleness K``)."""
    verify_workers: int | None = None
    """Threads that verify a batch concurrently under the pipelined learner (``--verify-workers``)."""
    imports: list[str] = dataclasses.field(default_factory=list)
    """The ``--import`` modules the run's env comes from: ``--resume`` imports them again."""
    import_dir: str | None = None
    """The folder the run was started in (where ``--import`` found the modules), searched again by ``--resume``."""

    def to_json(self) -> dict[str, Any]:
        from llmgym import __version__

        return {"llmgym_version": __version__, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclasses.dataclass
class TrainResult:
    """A finished (or interrupted) run: its metrics, agent and files."""

    out_dir: Path
    rows: list[dict[str, Any]]
    agent: Any
    interrupted: bool
    wall_s: float
    checkpoint: Path | None
    curves: Path | None
    tensorboard_dir: Path | None
    checkpoint_step: int | None = None
    """The step ``checkpoint`` holds (after a mid-step interrupt: the last checkpointed step, not the current)."""


_STOPPING_SIGNALS = {getattr(signal, name): what for name, what in
                     (("SIGINT", "Ctrl-C"), ("SIGTERM", "SIGTERM"), ("SIGHUP", "hang-up (SIGHUP)")) if hasattr(signal, name)}


def _output_gone(exc: BaseException) -> bool:
    """A write failed because its reader went away: a closed pipe (``| head``, ``| tee`` ended) or a
    terminal that hung up (a dropped ssh session answers EIO)."""
    return isinstance(exc, BrokenPipeError) or (isinstance(exc, OSError) and exc.errno in (errno.EPIPE, errno.EIO))


class _GuardedOutput:
    """The run console's stream: when its reader goes away, ``gone`` turns true (and ``on_gone`` is called: the
    run stops at the next step boundary, as after Ctrl-C) and what is printed from then on goes to stderr
    (nowhere where stderr is gone too). The closed stream is pointed at ``/dev/null``, so that no later
    flush (the interpreter's own at exit) raises ``BrokenPipeError`` again."""

    def __init__(self, stream: Any):
        self._stream = stream
        self.gone = False
        self.on_gone: Any = None

    def write(self, text: str) -> int:
        while self._stream is not None:
            try:
                return self._stream.write(text)
            except OSError as exc:
                if not _output_gone(exc):
                    raise
                self._lost()
        return len(text)

    def flush(self) -> None:
        while self._stream is not None:
            try:
                return self._stream.flush()
            except OSError as exc:
                if not _output_gone(exc):
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


def _guarded(console) -> _GuardedOutput:
    """``console``'s stream, guarded (once; it stays guarded: the run's last lines go through it too)."""
    if not isinstance(console.file, _GuardedOutput):
        console.file = _GuardedOutput(console.file)
    return console.file


class _StopOnCtrlC:
    """First Ctrl-C, SIGTERM or hang-up, or the console's reader gone (a closed pipe): finish the current step,
    then stop (and checkpoint). A second signal: stop at once (mid-step: no checkpoint)."""

    def __init__(self, console):
        self.console = console
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopOnCtrlC:
        if threading.current_thread() is threading.main_thread():
            for signum in _STOPPING_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        self._output = _guarded(self.console)
        self._output.on_gone = self._output_gone
        if self._output.gone:  # already before the run (the banner met a closed pipe)
            self._output_gone()
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        what = _STOPPING_SIGNALS.get(signum, f"signal {signum}")
        again = "press Ctrl-C" if signum == signal.SIGINT else "send it"
        self._say(f"[yellow]{what}: finishing this step, then saving a checkpoint ({again} again to stop at once)[/]")

    def _output_gone(self) -> None:
        if not self.requested:
            self.requested = True
            with contextlib.suppress(Exception):  # stderr itself may be gone
                print("llmgym: the output closed (its reader went away): finishing this step, then saving a "
                      "checkpoint; what follows goes to stderr", file=sys.stderr, flush=True)

    def _say(self, text: str) -> None:
        with contextlib.suppress(OSError):  # a hung-up terminal: the notice is lost, the stop is not
            self.console.print(text)

    def __exit__(self, *exc: object) -> None:
        self._output.on_gone = None
        for signum, previous in self._previous.items():
            if previous is not None:
                signal.signal(signum, previous)


EVAL_SEED = 1_000_003
"""Seed of the evaluation tasks of ``--eval-every`` (a stream apart from the training draws' seeds)."""


def samples_per_step(config) -> int:
    """Completions an agent samples per step by its config: ``tasks_per_step × group_size``
    (DAPO's extra draws come on top; they are counted from the step's row)."""
    return int(config.tasks_per_step) * int(config.group_size)


def train_run(
    spec: RunSpec,
    out_dir: str | Path,
    *,
    resume: bool = False,
    console=None,
    progress=None,
    description: str | None = None,
    checkpoints: bool = True,
    base_model: tuple[Any, Any] | None = None,
    banner: str | None = None,
    replace: bool = False,
) -> TrainResult:
    """Train ``spec.agent`` on ``spec.env`` into ``out_dir``; the engine behind ``train``, ``quickstart``, ``compare``.

    Writes ``config.json``, ``metrics.jsonl`` (one row per step, flushed as it goes), TensorBoard
    events where available (and wandb / trackio with ``spec.log_to``), ``curves.png``, and
    (``checkpoints=True``) ``checkpoints/step-NNNNNN`` every ``spec.checkpoint_every`` steps plus
    ``checkpoints/last`` at the end or on Ctrl-C. Each row also carries ``samples_total`` and
    ``tokens_total`` (completions and completion tokens sampled so far: the compute axis of
    ``compare``) and, every ``spec.eval_every`` steps, ``eval_reward`` / ``eval_exact_match``: the
    greedy reward on ``spec.eval_tasks`` fixed tasks drawn with :data:`EVAL_SEED`.

    ``resume=True`` rebuilds the agent on the base model (so a KL reference stays the original
    model), loads ``checkpoints/last`` (weights, optimiser, counters, RNG) and continues
    to ``spec.steps``; since agents seed their batches from the step count, the metrics equal an
    uninterrupted run's.

    ``banner`` is printed once everything is made and checked (model, agent, env, evaluation tasks,
    the checkpoint to resume), so a mistake found on the way is the only output; ``replace=True``
    deletes an earlier run's files in ``out_dir`` at that point (``--overwrite``), not before.

    ``spec.engine`` picks the rollout engine (``"vllm"``: a ``VLLMEngine`` over the model, synced after
    every update and closed when the run ends, however it ends).
    """
    engines: list[Any] = []
    try:
        return _train_run(spec, out_dir, engines, resume=resume, console=console, progress=progress,
                          description=description, checkpoints=checkpoints, base_model=base_model, banner=banner,
                          replace=replace)
    finally:
        for engine in engines:  # a vLLM engine holds memory (and, on CPU, a process group) until closed
            engine.close()


def _train_run(spec: RunSpec, out_dir: str | Path, engines: list[Any], *, resume: bool, console, progress,
               description: str | None, checkpoints: bool, base_model: tuple[Any, Any] | None, banner: str | None,
               replace: bool) -> TrainResult:
    from llmgym.agents.checkpoint import CheckpointError, load_checkpoint, load_pipeline_state, save_checkpoint
    from llmgym.runtime.logging import MetricsLogger, moving_average, plot_curves, truncate_metrics
    from llmgym.engines.rollout import distinct_tasks, evaluate_held_out

    console = console or make_console()
    _guarded(console)  # a closed pipe or a hung-up terminal never ends the run with an error (see _StopOnCtrlC)
    out = Path(out_dir)
    agent_cls = require_agent(spec.agent)
    config = build_agent_config(agent_cls, spec.agent_config)
    require_env(spec.env)
    ckpt_root = out / "checkpoints"
    if base_model is not None:
        model, tokenizer = base_model
    else:
        try:
            model, tokenizer = load_run_model(spec.model, device=spec.device)
        except UsageError:
            if not (resume and (ckpt_root / "last" / "config.json").is_file()) or config.lora_r > 0:
                raise  # a LoRA run resumes on its base model: the checkpoint's model has the adapters merged in
            console.print(f"[yellow]the run's model {spec.model!r} is gone; resuming on {ckpt_root / 'last'} "
                          f"(a KL reference model, if the agent uses one, becomes that checkpoint)[/]")
            model, tokenizer = load_run_model(str(ckpt_root / "last"), device=spec.device)
    # CPU threads change float rounding: a resumed run uses the count the run started with
    spec.threads = apply_threads(spec.threads, model)
    env = make_run_env(spec.env, tokenizer, spec.level, config.max_new_tokens, spec.env_args)
    eval_env = eval_tasks = None
    if spec.eval_every > 0:  # its own env: the training env's task stream is not touched
        eval_env = make_run_env(spec.env, tokenizer, spec.level, config.max_new_tokens, spec.env_args)
        try:
            eval_tasks, _ = distinct_tasks(eval_env, spec.eval_tasks, seed=EVAL_SEED)
        except ValueError as exc:
            raise UsageError(f"--eval-tasks: {spec.env}: {exc}") from None
    engine = build_engine(spec.engine, spec.engine_args, model, tokenizer)  # after the cheap checks: vLLM starts
    if engine is not None:
        engines.append(engine)
    agent = construct_agent(agent_cls, model, tokenizer, config, engine=engine)
    rows: list[dict[str, Any]] = []
    pipeline_state = None
    if resume:
        if not (ckpt_root / "last" / "agent.pt").is_file():
            raise UsageError(f"no checkpoint to resume at {ckpt_root / 'last'}: was the run started with checkpoints?")
        try:
            load_checkpoint(agent, ckpt_root / "last")
            if spec.max_staleness is not None:  # batches a stopped pipelined run had sampled ahead
                pipeline_state = load_pipeline_state(ckpt_root / "last")
        except CheckpointError as exc:
            raise UsageError(f"{exc}: resume from another run or start afresh with --overwrite") from None
        rows = truncate_metrics(out / "metrics.jsonl", agent.step_count)
    elif replace:
        for path in existing_files(out, RUN_FILES):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    if banner:
        console.print(banner)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.json", json.dumps(spec.to_json(), indent=2) + "\n")

    logger = MetricsLogger(out, append=resume, trackers=spec.log_to, run_name=f"{spec.agent}-{spec.env}",
                           run_config=spec.to_json())
    tensorboard_dir = logger.tensorboard_dir
    remaining = max(0, spec.steps - agent.step_count)
    own_progress = progress is None
    progress = progress if progress is not None else reward_progress(console)
    job = progress.add_task(description or f"{spec.agent} on {spec.env}", total=spec.steps,
                            completed=agent.step_count, reward="—", avg="—", kl="—")
    started = time.perf_counter()
    interrupted = False
    last_checkpoint: Path | None = None
    checkpoint_step: int | None = agent.step_count if resume else None
    # True while the agent's state is that of a completed step (inside the step callback, or after
    # it asked the agent to stop): a KeyboardInterrupt (a second Ctrl-C) anywhere else in learn()
    # lands mid-step, with the model, optimiser or RNG partly advanced, and that state must not
    # become a checkpoint.
    at_step_boundary = False
    completed_step = agent.step_count
    per_step = samples_per_step(config)
    samples_total = float(rows[-1].get("samples_total", 0.0)) if rows else 0.0
    tokens_total = float(rows[-1].get("tokens_total", 0.0)) if rows else 0.0

    # the handler stays installed until the final checkpoint is written: a first Ctrl-C there is
    # absorbed (the save finishes), a second one stops at once with "checkpoints/last" intact (saves
    # are atomic), and the command prints how to resume
    with _StopOnCtrlC(console) as stop:

        def on_step(row: dict[str, Any]) -> bool:
            nonlocal last_checkpoint, checkpoint_step, at_step_boundary, completed_step, samples_total, tokens_total
            sampled = per_step * (1 + int(row.get("extra_draws", 0) or 0))
            samples_total += sampled
            tokens_total += sampled * float(row.get("completion_len", 0.0) or 0.0)
            row = {**row, "samples_total": samples_total, "tokens_total": tokens_total}
            step = int(row["step"])
            if eval_tasks is not None and (step % spec.eval_every == 0 or step == spec.steps):
                result = evaluate_held_out(agent.model, tokenizer, eval_env, eval_tasks, temperature=0.0,
                                           max_new_tokens=config.max_new_tokens, seed=EVAL_SEED)
                row["eval_reward"], row["eval_exact_match"] = result["reward_mean"], result["exact_match"]
            rows.append(row)
            logger.log(row)
            completed_step = step
            at_step_boundary = True
            recent = moving_average([r["reward_mean"] for r in rows[-10:]], 10)[-1]
            progress.update(job, advance=1, reward=format_value(row["reward_mean"]), avg=format_value(recent),
                            kl=format_value(row.get("kl"), 4))
            if checkpoints and spec.checkpoint_every > 0 and step % spec.checkpoint_every == 0 and step < spec.steps:
                save_checkpoint(agent, tokenizer, ckpt_root / f"step-{step:06d}")
                last_checkpoint = save_checkpoint(agent, tokenizer, ckpt_root / "last")
                checkpoint_step = step
            if stop.requested:
                return False  # the agent stops here: its state stays the completed step's
            at_step_boundary = False  # the next step starts
            return True

        if own_progress:
            progress.start()
        consistent = True
        lost: ConnectionError | None = None
        try:
            if remaining:
                pipelined = {} if spec.max_staleness is None else dict(
                    max_staleness=spec.max_staleness, verify_workers=spec.verify_workers,
                    drain_every=spec.checkpoint_every if checkpoints and spec.checkpoint_every > 0 else None,
                    pipeline_state=pipeline_state)
                agent.learn(env, remaining, callback=on_step, **pipelined)
            interrupted = stop.requested
        except KeyboardInterrupt:
            interrupted = True
            consistent = at_step_boundary and agent.step_count == completed_step
        except ConnectionError as exc:  # the rollout servers are gone (a fleet with none left): save, then stop
            lost = exc
            consistent = agent.step_count == completed_step  # raised between updates, or inside one (not saved)
        finally:
            if own_progress:
                progress.stop()
            logger.close()
        if checkpoints and consistent:  # a pipelined run stopped between drain points keeps its batches ahead
            last_checkpoint = save_checkpoint(agent, tokenizer, ckpt_root / "last",
                                               getattr(agent, "pipeline_state", None) if stop.requested else None)
            checkpoint_step = agent.step_count
        elif checkpoints:
            kept = ckpt_root / "last"
            if kept.is_dir() and checkpoint_step is not None:
                last_checkpoint = kept
                console.print(f"[yellow]stopped mid-step {completed_step + 1}, with the model partly updated: "
                              f"not saved; {kept} stays at step {checkpoint_step}, and --resume continues from there[/]")
            else:
                last_checkpoint, checkpoint_step = None, None
                console.print(f"[yellow]stopped mid-step {completed_step + 1}, with the model partly updated: not "
                              f"saved, and no earlier checkpoint exists (checkpoints every {spec.checkpoint_every} "
                              f"steps); start again with --overwrite[/]")
        curves = plot_curves(rows, out / "curves.png", title=f"{spec.agent} on {spec.env}",
                             reward_range=_reward_range(env)) if rows else None
        if lost is not None:
            saved = (f"checkpoints/last is step {checkpoint_step}: restart the servers and continue with llmgym train "
                     f"--resume {out}" if checkpoints and checkpoint_step is not None else "no checkpoint was saved")
            raise UsageError(f"the run stopped after step {completed_step}: {' '.join(str(lost).split())}; {saved}")
        interrupted = (interrupted or stop.requested) and agent.step_count < spec.steps  # a late Ctrl-C: done anyway
    return TrainResult(out, rows, agent, interrupted, time.perf_counter() - started, last_checkpoint, curves,
                       tensorboard_dir, checkpoint_step if checkpoints else None)


def _reward_range(env) -> tuple[float, float] | None:
    """The env's declared reward range (``env.unwrapped.reward_range``) when it is finite, else ``None``."""
    low, high = getattr(env.unwrapped, "reward_range", (float("-inf"), float("inf")))
    return (float(low), float(high)) if all(map(math.isfinite, (low, high))) else None
