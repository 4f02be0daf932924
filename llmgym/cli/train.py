"""``llmgym train``: train any registered agent on any registered env into one run directory.

Metrics JSONL, curves PNG, config JSON and checkpoints; ``--resume`` continues an interrupted run
exactly; Ctrl-C saves a checkpoint (never a half-updated mid-step state); ``--env-arg key=value``
passes keywords to ``gymnasium.make`` (e.g. ``path=`` for GSM8K/MATH); ``--engine vllm`` samples the rollouts
with vLLM in process (``--engine-arg key=value`` for its options), recorded for ``--resume``; ``--async
[--max-staleness K]`` trains with the pipelined learner (generation, verification and learning overlap).

Example:
    >>> from llmgym.cli import main
    >>> main(["train", "--env", "llmgym/Copy-v0", "--agent", "grpo"])  # no --out
    2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from llmgym.cli.common import (
    apply_scale_options,
    check_device,
    parse_overrides,
    read_config_file,
    scale_options,
)
from llmgym.cli.console import files_table, format_value, summary_window
from llmgym.cli.engine_options import bf16_on_slow_cpu, check_engine, engine_arguments, engine_options
from llmgym.cli.resolve import build_agent_config, check_model, require_agent, require_env
from llmgym.cli.run_files import RUN_FILES, check_out_dir, existing_files
from llmgym.cli.usage import EXIT_INTERRUPTED, UsageError, invoked_as
from llmgym.runtime.display import make_console
from llmgym.runtime.install import install_hint
from llmgym.cli.training import RunSpec, train_run
from llmgym.runtime.logging import TRACKERS

__all__ = ["add_parser", "check_async", "correction_fields", "check_resume_imports", "cmd_train", "read_run_spec"]


def add_parser(subparsers, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``train`` sub-command to ``subparsers`` (``common`` holds the options every command shares)."""
    p = subparsers.add_parser(
        "train", parents=[common, scale_options(), engine_options()], help="train an agent on an env; metrics, curves, checkpoints",
        description="Train an agent on a registered env. Writes OUT/metrics.jsonl, OUT/curves.png, "
                    "OUT/config.json and OUT/checkpoints/ (step-N every --checkpoint-every steps, and "
                    "last). Ctrl-C finishes the step and saves a checkpoint; --resume OUT continues.")
    p.add_argument("--env", help="env id, e.g. llmgym/Copy-v0 (see `llmgym list`)")
    p.add_argument("--agent", help="agent name, e.g. grpo (see `llmgym list`)")
    p.add_argument("--model", help="'tiny' (default), a directory saved with save_pretrained, or a hub id")
    p.add_argument("--steps", type=int, help="total training steps (default 100; with --resume: the new total)")
    p.add_argument("--out", help="run directory")
    p.add_argument("--config", metavar="FILE.json",
                   help="agent config fields as a JSON object (or a run's config.json)")
    p.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override one agent config field (repeatable)")
    p.add_argument("--seed", type=int, help="seed of task draws and sampling (the agent config's seed)")
    p.add_argument("--teacher", metavar="MODEL",
                   help="with --agent distill: the teacher that grades the student's tokens (a saved model directory, "
                        "a hub id or 'tiny'; the student's tokenizer)")
    p.add_argument("--distill-coef", type=float, metavar="C",
                   help="with --agent distill: weight of the teacher's reverse-KL reward in [0, 1] (default 1; "
                        "1 - C weights the env's reward)")
    p.add_argument("--env-arg", action="append", metavar="KEY=VALUE",
                   help="keyword for gymnasium.make (repeatable; values parsed like --set), e.g. --env-arg path=data.jsonl")
    p.add_argument("--level", choices=("sequence", "token"), help="env level (default sequence)")
    p.add_argument("--checkpoint-every", type=int, metavar="K",
                   help="save checkpoints/step-N every K steps (default 50; 0 = only at the end)")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from checkpoints/last")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    p.add_argument("--eval-every", type=int, metavar="N",
                   help="every N steps, the greedy reward on --eval-tasks fixed tasks (logged as eval_reward, "
                        "plotted; default 0 = never)")
    p.add_argument("--eval-tasks", type=int, metavar="M", help="tasks of the --eval-every evaluation (default 32)")
    p.add_argument("--async", dest="pipelined", action="store_true", default=None,
                   help="the pipelined learner: the next steps' rollouts are generated and verified while this step "
                        "updates (docs/scale.md, 'Asynchronous training'); recorded for --resume")
    p.add_argument("--max-staleness", type=int, metavar="K",
                   help="with --async: each batch is sampled by the weights of K updates ago (default 1; 0 = the "
                        "synchronous schedule); stale tokens are importance-weighted")
    p.add_argument("--correction", metavar="NAME",
                   help="off-policy correction of the sampler/learner gap, applied to every token: tis-token, "
                        "tis-seq, mis, geo or icepop (docs/scale.md, 'Off-policy corrections'); the shares "
                        "truncated and masked are logged each step")
    p.add_argument("--correction-bounds", metavar="HIGH|LOW,HIGH",
                   help="with --correction: the preset's band (default tis-*/mis: C = 2; geo: 0.99,1.01; "
                        "icepop: 0.5,2); one number sets HIGH only")
    p.add_argument("--verify-workers", type=int, metavar="N",
                   help="with --async: threads that verify a batch's completions concurrently (default 8)")
    p.add_argument("--log-to", action="append", choices=TRACKERS, metavar="TRACKER",
                   help=f"also log every step to an experiment tracker ({', '.join(TRACKERS)}; repeatable; "
                        f"the package must be installed; project name from $LLMGYM_PROJECT)")
    p.add_argument("--rollouts-every", type=int, metavar="N",
                   help="write a sample of the episodes of every N steps (and of the first, the last and each "
                        "evaluation) to rollouts.jsonl (default 10; 0 = none)")
    p.add_argument("--rollouts-per-step", type=int, metavar="M",
                   help="episodes of each such step in rollouts.jsonl, whole groups first (default 8)")
    p.set_defaults(handler=cmd_train)
    return p


def check_async(args: argparse.Namespace, agent_cls) -> tuple[int | None, int | None]:
    """``(max_staleness, verify_workers)`` of ``--async``/``--max-staleness``/``--verify-workers``,
    checked before any work (``(None, None)``: the synchronous loop)."""
    if not args.pipelined:
        given = [flag for flag, value in (("--max-staleness", args.max_staleness),
                                          ("--verify-workers", args.verify_workers)) if value is not None]
        if given:
            raise UsageError(f"{' and '.join(given)} {'need' if len(given) > 1 else 'needs'} --async (options of the "
                             f"pipelined learner)")
        return None, None
    staleness = 1 if args.max_staleness is None else args.max_staleness
    if staleness < 0:
        raise UsageError(f"--max-staleness must be >= 0 (0 = the synchronous schedule), got {staleness}")
    if args.verify_workers is not None and args.verify_workers < 1:
        raise UsageError(f"--verify-workers must be >= 1, got {args.verify_workers}")
    if not agent_cls.pipelined:
        raise UsageError(f"--async: {agent_cls.name} cannot learn from stale samples (no policy-gradient correction); "
                         f"drop --async")
    from llmgym.runtime import distributed

    if distributed.is_distributed():
        raise UsageError("--async runs in one process; under torchrun drop --async (data parallel is synchronous)")
    return staleness, args.verify_workers


def correction_fields(args: argparse.Namespace, fields: dict) -> dict:
    """The agent config fields of ``--correction NAME`` and ``--correction-bounds HIGH|LOW,HIGH`` (the flags
    win over ``--config`` and ``--set``), checked before any work.

    Example:
        >>> import argparse
        >>> from llmgym.cli.train import correction_fields
        >>> correction_fields(argparse.Namespace(correction="icepop", correction_bounds="0.8,1.25"), {})
        {'correction': 'icepop', 'correction_low': 0.8, 'correction_high': 1.25}
        >>> correction_fields(argparse.Namespace(correction="seq-tis", correction_bounds=None), {})
        Traceback (most recent call last):
        ...
        llmgym.cli.usage.UsageError: --correction 'seq-tis': give one of tis-token, tis-seq, mis, geo, icepop
    """
    import math

    from llmgym.agents.functional import CORRECTIONS

    out: dict = {}
    name, bounds = getattr(args, "correction", None), getattr(args, "correction_bounds", None)
    if name is not None:
        if name not in CORRECTIONS:
            raise UsageError(f"--correction {name!r}: give one of {', '.join(CORRECTIONS)}")
        out["correction"] = name
    if bounds is not None:
        if name is None and fields.get("correction") is None and fields.get("tis") is None:
            raise UsageError(f"--correction-bounds is the band of a correction: add --correction NAME "
                             f"({', '.join(CORRECTIONS)})")
        try:
            numbers = [float(part) for part in bounds.split(",")]
        except ValueError:
            numbers = []
        if len(numbers) not in (1, 2) or not all(math.isfinite(x) and x >= 0 for x in numbers):
            raise UsageError(f"--correction-bounds {bounds!r}: give HIGH or LOW,HIGH, finite numbers >= 0 "
                             f"(e.g. 2 or 0.5,2)")
        if len(numbers) == 2:
            out["correction_low"] = numbers[0]
        out["correction_high"] = numbers[-1]
    return out


def teacher_fields(args: argparse.Namespace, agent_cls, fields: dict) -> dict:
    """The agent config fields of ``--teacher`` / ``--distill-coef`` (the teacher checked as a model is, and
    recorded as an absolute path so that ``--resume`` finds it from anywhere), checked before any work."""
    from llmgym.cli.resolve import resolve_model

    known = {f.name for f in dataclasses.fields(agent_cls.config_class)}
    given = [flag for flag, value in (("--teacher", args.teacher), ("--distill-coef", args.distill_coef))
             if value is not None]
    if given and "teacher" not in known:
        raise UsageError(f"{' and '.join(given)} {'are options' if len(given) > 1 else 'is an option'} of --agent distill "
                         f"(on-policy distillation), not of {agent_cls.name}")
    out: dict = {}
    if args.distill_coef is not None:
        out["distill_coef"] = args.distill_coef
    teacher = args.teacher if args.teacher is not None else fields.get("teacher")
    if "teacher" in known:
        if not teacher:
            raise UsageError(f"--agent {agent_cls.name} needs --teacher MODEL (the model that grades the student's "
                             f"tokens: a saved model directory, a hub id or 'tiny')")
        try:
            target = resolve_model(teacher)
        except UsageError as exc:
            raise UsageError(f"--teacher: {exc}") from None
        out["teacher"] = str(Path(target).resolve()) if Path(target).is_dir() else target
    return out


MAX_CONFIG_BYTES = 2**20
"""A run's ``config.json`` larger than this (1 MiB) is not one ``llmgym train`` wrote."""


def read_run_spec(out: Path) -> RunSpec:
    """The :class:`RunSpec` of the run folder ``out`` (its ``config.json``), read as data: never through a link,
    bounded, its fields checked for type; a :class:`UsageError` naming what is wrong otherwise."""
    from llmgym.runtime.files import RunFileError, read_bytes_bounded

    config_path = out / "config.json"
    try:
        data = json.loads(read_bytes_bounded(config_path, MAX_CONFIG_BYTES))
        spec = RunSpec.from_json(data)
    except FileNotFoundError:
        raise UsageError(f"nothing to resume in {str(out)!r}: no config.json there (give the --out DIR of a run)") from None
    except RunFileError as exc:
        raise UsageError(str(exc)) from None
    except (ValueError, TypeError, AttributeError, RecursionError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UsageError(f"{config_path} is not a run's config.json ({first}): resume a directory written by "
                         f"llmgym train") from None
    if not (isinstance(spec.imports, list) and all(isinstance(m, str) for m in spec.imports)):
        raise UsageError(f"{config_path} is not a run's config.json (imports is not a list of module names): resume "
                         f"a directory written by llmgym train")
    return spec


def check_resume_imports(spec: RunSpec, given: list[str]) -> None:
    """Refuse to resume a run that imported modules the user did not name again with ``--import``: a run folder
    is data, and the code it names is loaded only on the user's word (and only from where ``--import`` looks,
    never from the folder the run recorded).

    Example:
        >>> from llmgym.cli.train import check_resume_imports
        >>> from llmgym.cli.training import RunSpec
        >>> spec = RunSpec(env="llmgym/Copy-v0", agent="grpo", model="tiny", steps=2, imports=["my_envs"])
        >>> check_resume_imports(spec, ["my_envs"])
        >>> check_resume_imports(spec, [])
        Traceback (most recent call last):
        ...
        llmgym.cli.usage.UsageError: --resume: this run imported my_envs; pass --import my_envs to load it again ...
    """
    missing = [name for name in spec.imports if name not in given]
    if missing:
        flags = " ".join(f"--import {name}" for name in missing)
        raise UsageError(f"--resume: this run imported {', '.join(missing)}; pass {flags} to load it again (a run "
                         f"folder never loads code by itself; run from the folder that holds "
                         f"{'it' if len(missing) == 1 else 'them'})")


def cmd_train(args: argparse.Namespace) -> int:
    """``llmgym train``."""
    from rich.table import Table

    console = make_console()
    if args.resume:
        clashing = [flag for flag, value in (("--env", args.env), ("--agent", args.agent), ("--model", args.model),
                                             ("--config", args.config), ("--set", args.set), ("--seed", args.seed),
                                             ("--out", args.out), ("--level", args.level),
                                             ("--teacher", args.teacher), ("--distill-coef", args.distill_coef),
                                             ("--env-arg", args.env_arg), ("--eval-tasks", args.eval_tasks),
                                             ("--dtype", args.dtype), ("--lora-r", args.lora_r),
                                             ("--lora-alpha", args.lora_alpha),
                                             ("--gradient-checkpointing", args.gradient_checkpointing),
                                             ("--micro-batch-size", args.micro_batch_size),
                                             ("--engine-decode", args.engine_decode),
                                             ("--lr-schedule", args.lr_schedule),
                                             ("--lr-warmup-steps", args.lr_warmup_steps),
                                             ("--engine", args.engine), ("--engine-arg", args.engine_arg),
                                             ("--server", args.server),
                                             ("--async", args.pipelined), ("--max-staleness", args.max_staleness),
                                             ("--verify-workers", args.verify_workers),
                                             ("--correction", args.correction),
                                             ("--correction-bounds", args.correction_bounds))
                    if value is not None]
        if clashing:
            raise UsageError(f"--resume continues the run as recorded in its config.json; drop {', '.join(clashing)} "
                             f"(only --steps, --checkpoint-every, --eval-every, --log-to, --rollouts-every, "
                             f"--rollouts-per-step, --device and --threads may change)")
        out = Path(args.resume)
        spec = read_run_spec(out)
        check_out_dir(out, "--resume")
        # the run folder is data: the modules it names are imported only where --import names them again
        # (main() imported those, from the current folder as for any command); none comes from the folder
        check_resume_imports(spec, args.imports or [])
        if args.steps is not None:
            spec.steps = args.steps
        if args.checkpoint_every is not None:
            spec.checkpoint_every = args.checkpoint_every
        if args.threads is not None:
            spec.threads = args.threads
        if args.device is not None:
            spec.device = check_device(args.device)
        elif spec.device is not None and spec.device != "cpu":
            spec.device = check_device(spec.device)  # the recorded GPU must still be there
        if args.eval_every is not None:
            spec.eval_every = args.eval_every
        if args.log_to:
            spec.log_to = list(args.log_to)
        if args.rollouts_every is not None:
            spec.rollouts_every = args.rollouts_every
        if args.rollouts_per_step is not None:
            spec.rollouts_per_step = args.rollouts_per_step
        check_engine(spec.engine, spec.engine_args, spec.model, level=spec.level,
                     lora=int(spec.agent_config.get("lora_r") or 0) > 0)  # the recorded engine must still work
        from llmgym.train import checkpoint_step

        done = checkpoint_step(out / "checkpoints" / "last")
        if done is None:
            raise UsageError(f"no checkpoint to resume in {str(out)!r} (no checkpoints/last/step.txt): was the run "
                             f"started with checkpoints? Start again with --out {out} --overwrite")
        if spec.steps <= done:
            raise UsageError(f"the run in {str(out)!r} is already at step {done} (its checkpoints/last); --steps is the "
                             f"new total, so give --steps N with N > {done} to train further"
                             + ("" if args.steps is not None else f" (it was a {spec.steps}-step run)"))
    else:
        required = (("--env", args.env), ("--agent", args.agent), ("--out", args.out))
        missing = [flag for flag, value in required if not value]
        if missing:
            raise UsageError(f"train needs {', '.join(missing)} (or --resume DIR to continue a run)")
        out = check_out_dir(args.out)  # before any work: a file or an unwritable place fails now
        require_env(args.env)
        agent_cls = require_agent(args.agent)
        fields = read_config_file(args.config) if args.config else {}
        fields.update(parse_overrides(args.set or []))
        if args.seed is not None:
            fields["seed"] = args.seed
        fields.update(teacher_fields(args, agent_cls, fields))
        fields.update(correction_fields(args, fields))
        device = check_device(args.device)
        fields = apply_scale_options(args, fields, args.steps if args.steps is not None else 100, device)
        config = build_agent_config(agent_cls, fields)  # validated before any model is loaded
        env_args = parse_overrides(args.env_arg or [], "--env-arg")
        earlier = existing_files(out, RUN_FILES)
        if earlier and not args.overwrite:
            raise UsageError(f"{str(out)!r} already holds a run ({earlier[0].name}): continue it with --resume {out}, "
                             f"choose another --out, or add --overwrite")
        check_model(args.model or "tiny")
        engine_args = engine_arguments(args)
        engine = check_engine(args.engine, engine_args, args.model or "tiny", level=args.level or "sequence",
                              lora=config.lora_r > 0)
        max_staleness, verify_workers = check_async(args, agent_cls)
        spec = RunSpec(env=args.env, agent=agent_cls.name, model=args.model or "tiny",
                       steps=args.steps if args.steps is not None else 100, level=args.level or "sequence",
                       checkpoint_every=args.checkpoint_every if args.checkpoint_every is not None else 50,
                       threads=args.threads, agent_config=dataclasses.asdict(config), env_args=env_args,
                       eval_every=args.eval_every or 0,
                       eval_tasks=args.eval_tasks if args.eval_tasks is not None else 32,
                       log_to=list(args.log_to or []), device=device, engine=engine, engine_args=engine_args,
                       max_staleness=max_staleness, verify_workers=verify_workers,
                       rollouts_every=10 if args.rollouts_every is None else args.rollouts_every,
                       rollouts_per_step=8 if args.rollouts_per_step is None else args.rollouts_per_step,
                       imports=list(args.imports or []), import_dir=os.getcwd() if args.imports else None)
    if spec.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {spec.steps}")
    for flag, value in (("--checkpoint-every", spec.checkpoint_every), ("--eval-every", spec.eval_every)):
        if value < 0:
            raise UsageError(f"{flag} must be >= 0 (0 = off), got {value}")
    if spec.eval_tasks < 1:
        raise UsageError(f"--eval-tasks must be >= 1, got {spec.eval_tasks}")
    if spec.rollouts_every < 0:
        raise UsageError(f"--rollouts-every must be >= 0 (0 = no rollouts.jsonl), got {spec.rollouts_every}")
    if spec.rollouts_per_step < 1:
        raise UsageError(f"--rollouts-per-step must be >= 1, got {spec.rollouts_per_step}")
    for tracker in spec.log_to:
        import importlib.util

        if importlib.util.find_spec(tracker) is None:
            raise UsageError(f"--log-to {tracker}: the {tracker} package is not installed ({install_hint(tracker)}, "
                             f"or pip install {tracker})")
    args.resume_dir = out  # a second Ctrl-C ends in main(), which then prints how to resume
    args.resume_imports = list(spec.imports)  # ... with the --import the run needs again

    verb = "resuming" if args.resume else "training"
    extras = [f"{key} {spec.agent_config[field]}" for key, field in (("lora r", "lora_r"), ("precision", "precision"))
              if spec.agent_config.get(field) not in (None, 0, "fp32")]
    if spec.engine != "hf":
        extras.append(f"engine {spec.engine}")
    if spec.max_staleness is not None:
        extras.append(f"async, max staleness {spec.max_staleness}")
    banner = (f"[bold]{verb}[/] {spec.agent} on {spec.env} (model {spec.model}, {spec.steps} steps, "
              f"seed {spec.agent_config.get('seed', 0)}, device {spec.device or 'cpu'}"
              f"{''.join(', ' + e for e in extras)}) → {out}")
    note = bf16_on_slow_cpu(spec.device, spec.agent_config.get("precision"), spec.engine_args)
    if note:  # printed with the banner, once every check has passed
        banner += f"\n[yellow]{note}[/]"
    # train_run prints the banner once the model, agent, env and evaluation tasks are made: a mistake
    # found there (a missing --env-arg path=, a file the agent cannot read) is the only output
    result = train_run(spec, out, resume=bool(args.resume), console=console, banner=banner,
                       replace=bool(args.overwrite) and not args.resume)
    rows = result.rows
    if rows:
        window = summary_window(rows)
        first = sum(r["reward_mean"] for r in rows[:window]) / window
        last = sum(r["reward_mean"] for r in rows[-window:]) / window
        table = Table(title="training summary", title_justify="left")
        table.add_column("steps", justify="right")
        table.add_column(f"reward, first {window}", justify="right")
        table.add_column(f"reward, last {window}", justify="right")
        evals = [r for r in rows if r.get("eval_reward") is not None]
        if evals:
            table.add_column(f"held-out reward, step {evals[0]['step']} → {evals[-1]['step']}", justify="right")
        table.add_column("last KL", justify="right")
        table.add_column("tokens/s", justify="right")
        table.add_column("wall s", justify="right")
        cells = [str(rows[-1]["step"]), format_value(first), format_value(last)]
        if evals:
            cells.append(f"{format_value(evals[0]['eval_reward'])} → {format_value(evals[-1]['eval_reward'])}")
        table.add_row(*cells, format_value(rows[-1].get("kl"), 4),
                      format_value(sum(r["tokens_per_s"] for r in rows) / len(rows), 0), format_value(result.wall_s, 1))
        console.print(table)
    rollouts = out / "rollouts.jsonl"
    console.print(files_table("files", {
        "metrics": out / "metrics.jsonl", "curves": result.curves, "config": out / "config.json",
        "rollouts": rollouts if rollouts.is_file() else None,
        "checkpoint": result.checkpoint, "tensorboard": result.tensorboard_dir,
    }))
    console.print(f"one page of it all: {invoked_as()} report {out}")
    if result.interrupted:
        if result.checkpoint is not None:
            again = "".join(f" --import {name}" for name in spec.imports)
            console.print(f"[yellow]interrupted; checkpoint saved at step {result.checkpoint_step}. Continue with: "
                          f"{invoked_as()} train --resume {out}{again}[/]")
        else:
            console.print("[yellow]interrupted; no checkpoint to continue from[/]")
        return EXIT_INTERRUPTED
    return 0

