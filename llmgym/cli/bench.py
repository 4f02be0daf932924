"""``llmgym bench``: pass@1, pass@k, mean reward with a 95% confidence interval, tokens/s.

Example:
    >>> from llmgym.cli import main
    >>> main(["bench", "--env", "llmgym/Copy-v0", "--samples", "0"])
    2
"""

from __future__ import annotations

import argparse
import json
import time

from llmgym.cli.common import (
    UsageError,
    _apply_threads,
    _console,
    _fmt,
    _load_model,
    _make_env,
    _require_env,
    atomic_write_text,
    check_device,
    check_out_file,
    parse_overrides,
)

__all__ = ["PROCEDURAL_DEFAULT_TASKS", "add_parser", "cmd_bench", "parse_task_count"]

PROCEDURAL_DEFAULT_TASKS = 64
"""``--tasks`` when the env generates its tasks (it has no "all")."""


def add_parser(subparsers, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``bench`` sub-command to ``subparsers``."""
    p = subparsers.add_parser(
        "bench", parents=[common], help="pass@1, pass@k, mean reward with a 95%% CI, tokens/s",
        description="Sample K completions per task and report pass@1 and pass@k (unbiased estimator of "
                    "Chen et al. 2021; a reward >= --threshold passes), mean reward with a 95%% "
                    "confidence interval over tasks, and tokens/s.")
    p.add_argument("--env", required=True, help="env id")
    p.add_argument("--model", default="tiny", help="'tiny', a saved directory (e.g. RUN/checkpoints/last), or a hub id")
    p.add_argument("--samples", type=int, default=8, metavar="K", help="completions per task (default 8)")
    p.add_argument("--tasks", metavar="N|all",
                   help="distinct tasks to evaluate: 'all' (the default for a finite task list, e.g. HumanEval's "
                        "164) or N (N of the list without replacement; for a procedural env N distinct seeds, "
                        f"default {PROCEDURAL_DEFAULT_TASKS})")
    p.add_argument("--out", metavar="FILE.json", help="write the results as JSON (checked before any work)")
    p.add_argument("--threshold", type=float, default=1.0, help="reward that counts as a pass (default 1.0)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="token budget per completion (default 64)")
    p.add_argument("--device", metavar="{auto,cpu,cuda,cuda:N}",
                   help="where the model runs (default auto: cuda when a GPU is visible)")
    p.add_argument("--seed", type=int, default=0, help="seed of the task draw and sampling (default 0)")
    p.add_argument("--level", choices=("sequence", "token"), default="sequence", help="env level (default sequence)")
    p.add_argument("--env-arg", action="append", metavar="KEY=VALUE",
                   help="keyword for gymnasium.make (repeatable; values parsed like --set), e.g. --env-arg path=data.jsonl")
    p.set_defaults(handler=cmd_bench)
    return p


def parse_task_count(text: str | None) -> int | None:
    """``--tasks``: ``None`` or ``"all"`` → ``None`` (every task of a finite list); else a count >= 1.

    Example:
        >>> from llmgym.cli.bench import parse_task_count
        >>> parse_task_count("all"), parse_task_count("12")
        (None, 12)
    """
    if text is None or text.strip().lower() == "all":
        return None
    try:
        count = int(text)
    except ValueError:
        raise UsageError(f"--tasks expects a number or 'all', got {text!r}") from None
    if count < 1:
        raise UsageError(f"--tasks must be >= 1 (or 'all'), got {count}")
    return count


def cmd_bench(args: argparse.Namespace) -> int:
    """``llmgym bench``: each task at most once per sample index; pass@1, pass@k, mean reward ± 95% CI over
    distinct tasks, tokens/s."""
    from rich.table import Table

    from llmgym.engines import HFEngine, SamplingParams
    from llmgym.metrics import mean_confidence_interval, pass_at_k
    from llmgym.rollout import collect_episodes, distinct_tasks

    console = _console()
    counts = (("--samples", args.samples), ("--max-new-tokens", args.max_new_tokens))
    for flag, value in counts:
        if value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    requested = parse_task_count(args.tasks)
    if args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    if not args.temperature >= 0:
        raise UsageError(f"--temperature must be >= 0 (0 = greedy), got {args.temperature:g}")
    if not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p must be in (0, 1], got {args.top_p:g}")
    try:
        sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None
    env_args = parse_overrides(args.env_arg or [], "--env-arg")
    out = check_out_file(args.out, example="bench.json") if args.out else None
    _require_env(args.env)
    device = check_device(args.device)
    model, tokenizer = _load_model(args.model, device=device)
    _apply_threads(args.threads, model)
    env = _make_env(args.env, tokenizer, args.level, args.max_new_tokens, env_args)
    try:
        tasks, how = distinct_tasks(env, requested, seed=args.seed)
    except ValueError as exc:
        if requested is not None or args.tasks is not None:  # an explicit count, or an explicit 'all'
            raise UsageError(f"{args.env}: {exc} (--tasks)") from None
        try:  # a procedural env and no --tasks: its default count
            tasks, how = distinct_tasks(env, PROCEDURAL_DEFAULT_TASKS, seed=args.seed)
        except ValueError as again:
            raise UsageError(f"{args.env}: {again} (--tasks N)") from None
    started = time.perf_counter()
    n = args.samples
    with console.status(f"sampling {n} completion(s) for each of {len(tasks)} distinct tasks"):
        episodes, stats = collect_episodes(env, HFEngine(model, tokenizer), num_tasks=len(tasks), tasks=tasks,
                                           group_size=n, sampling=sampling, seed=args.seed)
    wall = time.perf_counter() - started
    ks = sorted({1, n} | {2 ** i for i in range(1, 10) if 2 ** i < n})
    per_task = []
    for g, task in enumerate(tasks):
        rewards = [e.total_reward for e in episodes[g * n:(g + 1) * n]]
        passed = sum(r >= args.threshold - 1e-9 for r in rewards)
        per_task.append({"id": task.id, "prompt": task.prompt if isinstance(task.prompt, str) else str(task.prompt),
                         "samples": n, "passed": passed, "reward_mean": sum(rewards) / n, "rewards": rewards})
    # every statistic is over distinct tasks: pass@k averages the per-task unbiased estimates, and the
    # CI treats each task's mean reward (over its n samples) as one observation
    pass_k = {str(k): sum(pass_at_k(n, t["passed"], k) for t in per_task) / len(per_task) for k in ks}
    mean, half = mean_confidence_interval([t["reward_mean"] for t in per_task])
    low, high = mean - half, mean + half
    report = {
        "env": args.env, "env_args": env_args, "model": args.model, "device": device, "tasks": len(tasks), "task_selection": how,
        "task_ids": [t.id for t in tasks], "samples": n, "threshold": args.threshold,
        "temperature": args.temperature, "top_p": args.top_p, "max_new_tokens": args.max_new_tokens, "seed": args.seed,
        "pass@1": pass_k["1"], f"pass@{n}": pass_k[str(n)], "pass_at_k": pass_k,
        "reward_mean": mean, "reward_ci95": [low, high], "ci_over": "distinct tasks (each task's mean over its samples)",
        "tokens_sampled": stats["tokens_sampled"], "tokens_per_s": stats["tokens_per_s"], "wall_s": wall,
        "per_task": per_task,
    }
    console.print(f"[bold]bench[/] {args.env} · model {args.model} · {how} × {n} samples "
                  f"(temperature {args.temperature:g}, seed {args.seed})")
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k in ks:
        table.add_row(f"pass@{k} (reward ≥ {args.threshold:g})", _fmt(pass_k[str(k)]))
    table.add_row(f"mean reward [95% CI over {len(tasks)} tasks]", f"{mean:.3f} [{low:.3f}, {high:.3f}]")
    table.add_row("tokens/s", _fmt(stats["tokens_per_s"], 0))
    table.add_row("wall s", _fmt(wall, 1))
    console.print(table)
    if out is not None:
        atomic_write_text(out, json.dumps(report, indent=2) + "\n")
        console.print(f"results: {out}")
    return 0
