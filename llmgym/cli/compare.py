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
from pathlib import Path
from typing import Any

from llmgym.cli.common import (
    UsageError,
    _check_model,
    _console,
    _files_table,
    _fmt,
    _progress,
    _require_agent,
    _require_env,
    build_agent_config,
    parse_overrides,
)
from llmgym.cli.training import RunSpec, train_run

__all__ = ["add_parser", "cmd_compare"]


def add_parser(subparsers, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``compare`` sub-command to ``subparsers``."""
    p = subparsers.add_parser(
        "compare", parents=[common], help="several agents x seeds on one env; one plot and a summary",
        description="Train each agent on each seed (0..S-1) from the same model; report final reward "
                    "(mean ± std over seeds) and steps to reach --threshold; save DIR/compare.png "
                    "and DIR/compare.json.")
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
    p.set_defaults(handler=cmd_compare)
    return p


def cmd_compare(args: argparse.Namespace) -> int:
    """``llmgym compare``: each agent on each seed; final reward, steps to threshold, one plot."""
    from rich.table import Table

    from llmgym.logging import plot_comparison, steps_to_threshold

    console = _console()
    names = [a.strip() for a in args.agents.split(",") if a.strip()]
    if not names:
        raise UsageError("--agents needs a comma-separated list, e.g. --agents grpo,rloo")
    if args.seeds < 1 or args.steps < 1:
        raise UsageError(f"--seeds and --steps must be >= 1, got {args.seeds} and {args.steps}")
    _require_env(args.env)
    overrides = parse_overrides(args.set or [])
    env_args = parse_overrides(args.env_arg or [], "--env-arg")
    plans = []
    for name in names:  # validate everything before training anything
        cls = _require_agent(name)
        build_agent_config(cls, {**overrides, "seed": 0})
        plans.append(cls)
    _check_model(args.model)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    window = max(1, min(args.window, args.steps))
    curves: dict[str, list[list[dict[str, Any]]]] = {}
    summary: dict[str, Any] = {}
    console.print(f"[bold]comparing[/] {', '.join(c.name for c in plans)} on {args.env}: {args.steps} steps × "
                  f"{args.seeds} seed(s) each → {out}")
    progress = _progress(console)
    with progress:
        for cls in plans:
            runs, finals, reached, walls = [], [], [], []
            for seed in range(args.seeds):
                config = build_agent_config(cls, {**overrides, "seed": seed})
                spec = RunSpec(env=args.env, agent=cls.name, model=args.model, steps=args.steps, checkpoint_every=0,
                               threads=args.threads, agent_config=dataclasses.asdict(config), env_args=env_args)
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
            summary[cls.name] = {"final_reward_mean": mean, "final_reward_std": std, "final_rewards": finals,
                                 "steps_to_threshold": reached if args.threshold is not None else None,
                                 "steps_to_threshold_mean": sum(hit) / len(hit) if hit else None,
                                 "wall_s": sum(walls)}
            if result.interrupted:
                break
    plot = plot_comparison(curves, out / "compare.png", title=f"{args.env}: {args.steps} steps, {args.seeds} seed(s)",
                           threshold=args.threshold, window=window)
    report = {"env": args.env, "env_args": env_args, "model": args.model, "steps": args.steps, "seeds": args.seeds,
              "threshold": args.threshold, "window": window, "set": overrides, "agents": summary}
    (out / "compare.json").write_text(json.dumps(report, indent=2) + "\n")

    console.print(f"final reward = mean reward of the last {window} steps; mean ± std over {args.seeds} seed(s)")
    table = Table()
    table.add_column("agent")
    table.add_column("final reward", justify="right")
    if args.threshold is not None:
        table.add_column(f"steps to {args.threshold:g}", justify="right")
    table.add_column("wall s", justify="right")
    for name, s in summary.items():
        cells = [name, f"{s['final_reward_mean']:.3f} ± {s['final_reward_std']:.3f}"]
        if args.threshold is not None:
            hit = [x for x in s["steps_to_threshold"] if x is not None]
            cells.append(f"{s['steps_to_threshold_mean']:.0f} ({len(hit)}/{len(s['steps_to_threshold'])} seeds)"
                         if hit else f"not reached (0/{len(s['steps_to_threshold'])})")
        cells.append(_fmt(s["wall_s"], 1))
        table.add_row(*cells)
    console.print(table)
    console.print(_files_table("files", {"plot": plot, "summary": out / "compare.json",
                                         "runs": out / "<agent>/seed-<s>/metrics.jsonl"}))
    return 0

