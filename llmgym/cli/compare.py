"""``llmgym compare``: several agents x seeds on one env; final reward, steps to a threshold, one plot.

Example:
    >>> from llmgym.cli import main
    >>> main(["compare", "--agents", "grpo,nope", "--env", "llmgym/Copy-v0", "--out", "/tmp/x"])
    2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
from typing import Any

from llmgym.cli.common import apply_scale_options, check_device, parse_overrides, scale_options
from llmgym.cli.console import files_table, format_value
from llmgym.cli.engine_options import check_engine, engine_arguments, engine_options
from llmgym.cli.resolve import build_agent_config, check_env_makes, check_model, require_agent, require_env
from llmgym.cli.run_files import atomic_write_text, check_out_dir
from llmgym.cli.usage import UsageError
from llmgym.runtime.display import make_console
from llmgym.cli.training import RunSpec, train_run
from llmgym.train import reward_progress, samples_per_step

__all__ = ["add_parser", "cmd_compare", "compute_fair_settings"]


def add_parser(subparsers, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``compare`` sub-command to ``subparsers``."""
    p = subparsers.add_parser(
        "compare", parents=[common, scale_options(), engine_options()], help="several agents x seeds on one env; one plot and a summary",
        description="Train each agent on each seed (0..S-1) from the same model; report final reward "
                    "(mean ± std over seeds) and steps to reach --threshold; save DIR/compare.png "
                    "and DIR/compare.json. Compute-fair by default: every agent samples the same number of "
                    "completions per step, and the plot's x-axis is sampled completions.")
    p.add_argument("--agents", required=True, help="comma-separated agent names, e.g. grpo,dapo,rloo")
    p.add_argument("--env", required=True, help="env id")
    p.add_argument("--steps", type=int, default=50, help="training steps per run (default 50)")
    p.add_argument("--seeds", type=int, default=3, metavar="S", help="seeds per agent (default 3)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--threshold", type=float, help="reward level for 'steps to threshold'")
    p.add_argument("--model", default="tiny", help="starting model for every run (default tiny)")
    p.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field of every agent")
    p.add_argument("--env-arg", action="append", metavar="KEY=VALUE",
                   help="keyword for gymnasium.make (repeatable; values parsed like --set), e.g. --env-arg path=data.jsonl")
    p.add_argument("--window", type=int, default=10, help="moving-average window in steps (default 10)")
    p.add_argument("--samples-per-step", type=int, metavar="N",
                   help="completions every agent samples per step (tasks_per_step = N / group_size); default: the "
                        "largest of the agents' own; 0 = each agent's own defaults (not compute-fair)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier comparison in --out")
    p.set_defaults(handler=cmd_compare)
    return p


def compute_fair_settings(plans, overrides: dict[str, Any], budget: int | None
                          ) -> tuple[int | None, dict[str, dict[str, int]], str]:
    """Per-agent ``tasks_per_step`` so every agent samples ``budget`` completions per step.

    ``budget=None``: the largest ``tasks_per_step × group_size`` among the agents' configs (nobody
    samples less than by default); ``0``: no change. A ``--set tasks_per_step=`` of the user's wins.
    Returns the budget, the extra fields per agent, and the sentence the command prints.

    Example:
        >>> from llmgym.agents import GRPO, PPO
        >>> from llmgym.cli.compare import compute_fair_settings
        >>> budget, fields, _ = compute_fair_settings([GRPO, PPO], {}, None)
        >>> budget, fields
        (64, {'grpo': {'tasks_per_step': 8}, 'ppo': {'tasks_per_step': 64}})
    """
    configs = {cls.name: build_agent_config(cls, {**overrides, "seed": 0}) for cls in plans}
    natural = {name: samples_per_step(c) for name, c in configs.items()}
    shape = ", ".join(f"{n} {c.tasks_per_step}×{c.group_size}" for n, c in configs.items())
    if budget is not None and budget < 0:
        raise UsageError(f"--samples-per-step must be >= 0 (0 = each agent's defaults), got {budget}")
    if budget == 0 or "tasks_per_step" in overrides:
        why = "--samples-per-step 0" if budget == 0 else "--set tasks_per_step"
        fair = len(set(natural.values())) == 1
        return None, {n: {} for n in configs}, (
            f"{'compute-fair' if fair else '[yellow]not compute-fair[/]'} ({why}): completions per step "
            f"(tasks × group): {shape}; the plot's x-axis is sampled completions")
    budget = budget or max(natural.values())
    fields = {}
    for name, config in configs.items():
        if budget % config.group_size:
            sizes = [c.group_size for c in configs.values()]
            step = math.lcm(*sizes)
            raise UsageError(f"--samples-per-step {budget} is not a multiple of {name}'s group_size "
                             f"{config.group_size}: use a multiple of {step} (or --samples-per-step 0)")
        fields[name] = {"tasks_per_step": budget // config.group_size}
    shape = ", ".join(f"{n} {budget // c.group_size}×{c.group_size}" for n, c in configs.items())
    return budget, fields, (f"compute-fair: every agent samples {budget} completions per step (tasks × group: "
                            f"{shape}; --samples-per-step N sets it, 0 keeps each agent's defaults); the plot's "
                            f"x-axis is sampled completions (DAPO's extra draws count)")


def cmd_compare(args: argparse.Namespace) -> int:
    """``llmgym compare``: each agent on each seed; final reward, steps to threshold, one plot."""
    from rich.table import Table

    from llmgym.runtime.logging import plot_comparison, steps_to_threshold

    console = make_console()
    names = [a.strip() for a in args.agents.split(",") if a.strip()]
    if not names:
        raise UsageError("--agents needs a comma-separated list, e.g. --agents grpo,rloo")
    if args.seeds < 1 or args.steps < 1:
        raise UsageError(f"--seeds and --steps must be >= 1, got {args.seeds} and {args.steps}")
    out = check_out_dir(args.out)
    require_env(args.env)
    device = check_device(args.device)
    overrides = apply_scale_options(args, parse_overrides(args.set or []), args.steps, device)
    env_args = parse_overrides(args.env_arg or [], "--env-arg")
    plans = []
    for name in names:  # validate everything before training anything
        cls = require_agent(name)
        build_agent_config(cls, {**overrides, "seed": 0})
        plans.append(cls)
    budget, per_agent, fairness = compute_fair_settings(plans, overrides, args.samples_per_step)
    for cls in plans:
        build_agent_config(cls, {**overrides, **per_agent[cls.name], "seed": 0})
    earlier = [p for p in (out / "compare.json", out / "compare.png") if p.exists()]
    earlier += [d for cls in plans for d in sorted((out / cls.name).glob("seed-*"))]
    if earlier and not args.overwrite:
        raise UsageError(f"{str(out)!r} already holds a comparison ({earlier[0]}): choose another --out or add "
                         f"--overwrite")
    check_model(args.model)
    check_env_makes(args.env, args.model, env_args, max_new_tokens=build_agent_config(plans[0], overrides).max_new_tokens)
    engine_args = engine_arguments(args)
    engine = check_engine(args.engine, engine_args, args.model, lora=int(overrides.get("lora_r") or 0) > 0)
    if args.overwrite:
        for path in earlier:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    window = max(1, min(args.window, args.steps))
    curves: dict[str, list[list[dict[str, Any]]]] = {}
    summary: dict[str, Any] = {}
    console.print(f"[bold]comparing[/] {', '.join(c.name for c in plans)} on {args.env}: {args.steps} steps × "
                  f"{args.seeds} seed(s) each → {out}")
    console.print(fairness)
    progress = reward_progress(console)
    with progress:
        for cls in plans:
            runs, finals, reached, walls = [], [], [], []
            for seed in range(args.seeds):
                config = build_agent_config(cls, {**overrides, **per_agent[cls.name], "seed": seed})
                spec = RunSpec(env=args.env, agent=cls.name, model=args.model, steps=args.steps, checkpoint_every=0,
                               threads=args.threads, agent_config=dataclasses.asdict(config), env_args=env_args,
                               device=device, engine=engine, engine_args=engine_args)
                result = train_run(spec, out / cls.name / f"seed-{seed}", console=console, progress=progress,
                                   description=f"{cls.name} seed {seed}", checkpoints=False)
                rows = result.rows
                if not rows:  # interrupted before its first step
                    break
                runs.append(rows)
                walls.append(result.wall_s)
                finals.append(sum(r["reward_mean"] for r in rows[-window:]) / len(rows[-window:]))
                if args.threshold is not None:
                    reached.append(steps_to_threshold([r["step"] for r in rows], [r["reward_mean"] for r in rows],
                                                      args.threshold, window))
                if result.interrupted:
                    console.print("[yellow]interrupted: summarising the runs so far[/]")
                    break
            if not finals:
                break
            curves[cls.name] = runs
            mean = sum(finals) / len(finals)
            std = math.sqrt(sum((f - mean) ** 2 for f in finals) / (len(finals) - 1)) if len(finals) > 1 else 0.0
            hit = [s for s in reached if s is not None]
            summary[cls.name] = {"samples_per_step": samples_per_step(config),
                                 "samples_total": runs[0][-1].get("samples_total"),
                                 "final_reward_mean": mean, "final_reward_std": std, "final_rewards": finals,
                                 "steps_to_threshold": reached if args.threshold is not None else None,
                                 "steps_to_threshold_mean": sum(hit) / len(hit) if hit else None,
                                 "wall_s": sum(walls)}
            if result.interrupted:
                break
    report = {"env": args.env, "env_args": env_args, "model": args.model, "engine": engine, "engine_args": engine_args,
              "steps": args.steps, "seeds": args.seeds,
              "threshold": args.threshold, "window": window, "set": overrides,
              "samples_per_step": budget, "fairness": fairness, "agents": summary}
    atomic_write_text(out / "compare.json", json.dumps(report, indent=2) + "\n")  # before the plot: kept if it fails
    plot = plot_comparison(curves, out / "compare.png", title=f"{args.env}: {args.steps} steps, {args.seeds} seed(s)",
                           threshold=args.threshold, window=window, x="samples_total")

    console.print(f"final reward = mean reward of the last {window} steps; mean ± std over {args.seeds} seed(s)")
    table = Table()
    table.add_column("agent")
    table.add_column("samples/step", justify="right")
    table.add_column("final reward", justify="right")
    if args.threshold is not None:
        table.add_column(f"steps to {args.threshold:g}", justify="right")
    table.add_column("wall s", justify="right")
    for name, s in summary.items():
        cells = [name, str(s["samples_per_step"]), f"{s['final_reward_mean']:.3f} ± {s['final_reward_std']:.3f}"]
        if args.threshold is not None:
            hit = [x for x in s["steps_to_threshold"] if x is not None]
            cells.append(f"{s['steps_to_threshold_mean']:.0f} ({len(hit)}/{len(s['steps_to_threshold'])} seeds)"
                         if hit else f"not reached (0/{len(s['steps_to_threshold'])})")
        cells.append(format_value(s["wall_s"], 1))
        table.add_row(*cells)
    console.print(table)
    console.print(files_table("files", {"plot": plot, "summary": out / "compare.json",
                                         "runs": out / "<agent>/seed-<s>/metrics.jsonl"}))
    return 0

