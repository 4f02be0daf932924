"""A run by names: :class:`RunSpec` (a run's ``config.json``) and :func:`train_run`, which turns it into objects
(model, env, engine, agent) and hands them to :class:`llmgym.train.Trainer` — the run loop of ``train``,
``quickstart`` and ``compare``, and of any Python user.

Example:
    >>> from llmgym.cli.training import RunSpec
    >>> RunSpec(env="llmgym/Copy-v0", agent="grpo", model="tiny", steps=10).level
    'sequence'
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

from llmgym.cli.resolve import build_agent_config, build_engine, load_run_model, make_run_env, require_agent, require_env
from llmgym.cli.run_files import RUN_FILES, existing_files
from llmgym.cli.usage import UsageError
from llmgym.runtime.display import make_console
from llmgym.runtime.threads import set_torch_threads
from llmgym.train import EVAL_SEED, CheckpointError, RolloutsLost, Trainer, TrainResult
from llmgym.train.trainer import guard_output

__all__ = ["RunSpec", "train_run"]


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
    rollouts_every: int = 10
    """``rollouts.jsonl`` gets the sampled episodes of every this many steps (and of the first, the last and
    each evaluation); 0 = no such file."""
    rollouts_per_step: int = 8
    """At most this many episodes of each such step (and of each evaluation)."""
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
    """The ``--import`` modules the run's env comes from. ``--resume`` imports none of them by itself (a run folder
    is data): it asks for ``--import`` naming them again."""
    import_dir: str | None = None
    """The folder the run was started in (where ``--import`` found the modules); a record for the reader only,
    never put on ``sys.path``."""

    def to_json(self) -> dict[str, Any]:
        from llmgym import __version__

        return {"llmgym_version": __version__, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


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
    """Build ``spec``'s objects and train them with :class:`llmgym.train.Trainer` into ``out_dir``.

    The model (``spec.model``, or ``base_model``), the env and an evaluation env of its own
    (``spec.eval_every``: greedy reward on ``spec.eval_tasks`` fixed tasks drawn with
    :data:`~llmgym.train.EVAL_SEED`), the rollout engine (``spec.engine``; closed when the run ends, however
    it ends) and the agent; then the :class:`~llmgym.train.Trainer` writes the run's files, with
    ``config.json`` = ``spec`` (``checkpoints=False``: none at all, as ``compare`` runs).

    ``resume=True`` rebuilds the agent on the base model (so a KL reference stays the original model)
    and :meth:`~llmgym.train.Trainer.resume` continues to ``spec.steps`` exactly.

    ``banner`` is printed once everything is made and checked (model, agent, env, evaluation tasks,
    the checkpoint to resume), so a mistake found on the way is the only output; ``replace=True``
    deletes an earlier run's files in ``out_dir`` at that point (``--overwrite``), not before.
    """
    from llmgym.rollout import distinct_tasks

    console = console or make_console()
    guard_output(console)  # a closed pipe or a hung-up terminal never ends the run with an error (StopOnSignals)
    out = Path(out_dir)
    agent_cls = require_agent(spec.agent)
    config = build_agent_config(agent_cls, spec.agent_config)
    require_env(spec.env)  # before the model loads
    last = out / "checkpoints" / "last"
    # CPU threads change float rounding: a resumed run uses the count the run started with
    if base_model is not None:
        model, tokenizer = base_model
        spec.threads = set_torch_threads(model, requested=spec.threads)
    else:
        try:
            model, tokenizer, spec.threads = load_run_model(spec.model, device=spec.device, threads=spec.threads)
        except UsageError:
            if not (resume and (last / "config.json").is_file()) or config.lora_r > 0:
                raise  # a LoRA run resumes on its base model: the checkpoint's model has the adapters merged in
            console.print(f"[yellow]the run's model {spec.model!r} is gone; resuming on {last} "
                          f"(a KL reference model, if the agent uses one, becomes that checkpoint)[/]")
            model, tokenizer, spec.threads = load_run_model(str(last), device=spec.device, threads=spec.threads)
    env = make_run_env(spec.env, tokenizer, spec.level, config.max_new_tokens, spec.env_args)
    eval_env = eval_tasks = None
    if spec.eval_every > 0:  # its own env: the training env's task stream is not touched
        eval_env = make_run_env(spec.env, tokenizer, spec.level, config.max_new_tokens, spec.env_args)
        try:
            eval_tasks, _ = distinct_tasks(eval_env, spec.eval_tasks, seed=EVAL_SEED)
        except ValueError as exc:
            raise UsageError(f"--eval-tasks: {spec.env}: {exc}") from None
    lora = dict(lora_r=config.lora_r, max_staleness=spec.max_staleness) if config.lora_r > 0 else {}
    engine = build_engine(spec.engine, spec.engine_args, model, tokenizer, **lora)  # after the cheap checks: vLLM starts
    try:
        try:
            agent = agent_cls(model, tokenizer, config=config, engine=engine)
        except (ValueError, TypeError, FileNotFoundError) as exc:  # a setting it rejects, a file it needs (DPO's pairs=)
            raise UsageError(f"bad setting for agent {agent_cls.name}: {exc}") from None
        options = dict(eval_env=eval_env, eval_every=spec.eval_every,
                       eval_tasks=eval_tasks if eval_tasks is not None else spec.eval_tasks,
                       checkpoint_every=spec.checkpoint_every if checkpoints else None, trackers=spec.log_to,
                       rollouts_every=spec.rollouts_every, rollouts_per_step=spec.rollouts_per_step,
                       max_staleness=spec.max_staleness, verify_workers=spec.verify_workers, config=spec.to_json(),
                       env_id=spec.env, console=console, progress=progress, description=description)
        if resume:
            try:
                trainer = Trainer.resume(out, agent, env, **options)
            except CheckpointError as exc:
                raise UsageError(f"{exc}: resume from another run or start afresh with --overwrite") from None
        else:
            if replace:
                for path in existing_files(out, RUN_FILES):
                    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            trainer = Trainer(agent, env, out, **options)
        if banner:
            console.print(banner)
        from llmgym.agents.teacher_checks import TeacherScoreError

        try:
            return trainer.run(spec.steps)
        except TeacherScoreError as exc:  # a distillation teacher whose scores cannot be log-probs: not trained on
            raise UsageError(f"{exc}; check the --teacher model") from None
        except RolloutsLost as exc:  # the rollout servers are gone: the completed steps are saved
            hint = (f": restart the servers and continue with llmgym train --resume {out}"
                    if exc.checkpoint_step is not None else "")
            raise UsageError(f"{exc}{hint}") from None
    finally:
        if engine is not None:  # a vLLM engine holds memory (and, on CPU, a process group) until closed
            engine.close()
