"""The training loop shared by ``train``, ``quickstart`` and ``compare``: :func:`train_run`.

Example:
    >>> from llmgym.cli.training import RunSpec
    >>> RunSpec(env="llmgym/Copy-v0", agent="grpo", model="tiny", steps=10).level
    'sequence'
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

from llmgym.cli.common import (
    UsageError,
    _apply_threads,
    _console,
    _construct_agent,
    _fmt,
    _load_model,
    _make_env,
    _progress,
    _quiet_hf,
    _require_agent,
    _require_env,
    build_agent_config,
)

__all__ = ["RunSpec", "TrainResult", "train_run"]


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


class _StopOnCtrlC:
    """First Ctrl-C: finish the current step, then stop (and checkpoint). Second: stop at once (mid-step: no checkpoint)."""

    def __init__(self, console):
        self.console = console
        self.requested = False
        self._previous = None

    def __enter__(self) -> _StopOnCtrlC:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.console.print("[yellow]Ctrl-C: finishing this step, then saving a checkpoint "
                           "(press Ctrl-C again to stop at once)[/]")

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _save_checkpoint(agent, tokenizer, directory: Path) -> Path:
    """Model + tokenizer via ``save_pretrained`` and ``agent.pt`` (the agent's full state), atomically."""
    import torch

    from llmgym.models import save_pretrained

    _quiet_hf()
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained(agent.model, tokenizer, tmp)
    torch.save(agent.state_dict(), tmp / "agent.pt")
    (tmp / "step.txt").write_text(f"{agent.step_count}\n")
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        directory.rename(old)
    tmp.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
    return directory


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
) -> TrainResult:
    """Train ``spec.agent`` on ``spec.env`` into ``out_dir``; the engine behind ``train``, ``quickstart``, ``compare``.

    Writes ``config.json``, ``metrics.jsonl`` (one row per step, flushed as it goes), TensorBoard
    events where available, ``curves.png``, and (``checkpoints=True``) ``checkpoints/step-NNNNNN``
    every ``spec.checkpoint_every`` steps plus ``checkpoints/last`` at the end or on Ctrl-C.

    ``resume=True`` rebuilds the agent on the base model (so a KL reference stays the original
    model), loads ``checkpoints/last/agent.pt`` (weights, optimiser, counters, RNG) and continues
    to ``spec.steps``; since agents seed their batches from the step count, the metrics equal an
    uninterrupted run's.
    """
    import torch

    from llmgym.logging import MetricsLogger, moving_average, plot_curves, truncate_metrics

    console = console or _console()
    out = Path(out_dir)
    agent_cls = _require_agent(spec.agent)
    config = build_agent_config(agent_cls, spec.agent_config)
    _require_env(spec.env)
    ckpt_root = out / "checkpoints"
    if base_model is not None:
        model, tokenizer = base_model
    else:
        try:
            model, tokenizer = _load_model(spec.model)
        except UsageError:
            if not (resume and (ckpt_root / "last" / "config.json").is_file()):
                raise
            console.print(f"[yellow]the run's model {spec.model!r} is gone; resuming on {ckpt_root / 'last'} "
                          f"(a KL reference model, if the agent uses one, becomes that checkpoint)[/]")
            model, tokenizer = _load_model(str(ckpt_root / "last"))
    # CPU threads change float rounding: a resumed run uses the count the run started with
    spec.threads = _apply_threads(spec.threads, model)
    agent = _construct_agent(agent_cls, model, tokenizer, config)
    env = _make_env(spec.env, tokenizer, spec.level, config.max_new_tokens, spec.env_args)
    rows: list[dict[str, Any]] = []
    if resume:
        state_path = ckpt_root / "last" / "agent.pt"
        if not state_path.is_file():
            raise UsageError(f"no checkpoint to resume at {state_path}: was the run started with checkpoints?")
        agent.load_state_dict(torch.load(state_path, map_location=agent.device, weights_only=False))
        rows = truncate_metrics(out / "metrics.jsonl", agent.step_count)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(spec.to_json(), indent=2) + "\n")

    logger = MetricsLogger(out, append=resume)
    tensorboard_dir = logger.tensorboard_dir
    remaining = max(0, spec.steps - agent.step_count)
    own_progress = progress is None
    progress = progress if progress is not None else _progress(console)
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

    with _StopOnCtrlC(console) as stop:

        def on_step(row: dict[str, Any]) -> bool:
            nonlocal last_checkpoint, checkpoint_step, at_step_boundary, completed_step
            rows.append(row)
            logger.log(row)
            completed_step = int(row["step"])
            at_step_boundary = True
            recent = moving_average([r["reward_mean"] for r in rows[-10:]], 10)[-1]
            progress.update(job, advance=1, reward=_fmt(row["reward_mean"]), avg=_fmt(recent),
                            kl=_fmt(row.get("kl"), 4))
            step = int(row["step"])
            if checkpoints and spec.checkpoint_every > 0 and step % spec.checkpoint_every == 0 and step < spec.steps:
                _save_checkpoint(agent, tokenizer, ckpt_root / f"step-{step:06d}")
                last_checkpoint = _save_checkpoint(agent, tokenizer, ckpt_root / "last")
                checkpoint_step = step
            if stop.requested:
                return False  # the agent stops here: its state stays the completed step's
            at_step_boundary = False  # the next step starts
            return True

        if own_progress:
            progress.start()
        consistent = True
        try:
            if remaining:
                agent.learn(env, remaining, callback=on_step)
            interrupted = stop.requested
        except KeyboardInterrupt:
            interrupted = True
            consistent = at_step_boundary and agent.step_count == completed_step
        finally:
            if own_progress:
                progress.stop()
            logger.close()
    if checkpoints and consistent:
        last_checkpoint = _save_checkpoint(agent, tokenizer, ckpt_root / "last")
        checkpoint_step = agent.step_count
    elif checkpoints:
        kept = ckpt_root / "last"
        if kept.is_dir() and checkpoint_step is not None:
            last_checkpoint = kept
            console.print(f"[yellow]stopped mid-step {completed_step + 1}, with the model partly updated: not saved; "
                          f"{kept} stays at step {checkpoint_step}, and --resume continues from there[/]")
        else:
            last_checkpoint, checkpoint_step = None, None
            console.print(f"[yellow]stopped mid-step {completed_step + 1}, with the model partly updated: not saved, "
                          f"and no earlier checkpoint exists (checkpoints every {spec.checkpoint_every} steps); "
                          f"start again with --overwrite[/]")
    curves = plot_curves(rows, out / "curves.png", title=f"{spec.agent} on {spec.env}") if rows else None
    return TrainResult(out, rows, agent, interrupted, time.perf_counter() - started, last_checkpoint, curves,
                       tensorboard_dir, checkpoint_step if checkpoints else None)

