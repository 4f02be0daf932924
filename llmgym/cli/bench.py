"""``llmgym bench``: pass@1, pass@k, mean reward with a 95% confidence interval, tokens/s.

``--engine hf`` (default) samples with ``transformers`` in process, ``--engine vllm`` with vLLM in
process, ``--engine openai --base-url URL`` from an OpenAI-compatible server (``--model`` then names the
served model's tokenizer).

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
    build_engine,
    check_device,
    check_engine,
    check_out_file,
    engine_options,
    parse_overrides,
    resolve_model,
)

__all__ = ["PROCEDURAL_DEFAULT_TASKS", "add_parser", "cmd_bench", "parse_task_count"]

PROCEDURAL_DEFAULT_TASKS = 64
"""``--tasks`` when the env generates its tasks (it has no "all")."""


def add_parser(subparsers, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``bench`` sub-command to ``subparsers``."""
    p = subparsers.add_parser(
        "bench", parents=[common, engine_options(served=True)], help="pass@1, pass@k, mean reward with a 95%% CI, tokens/s",
        description="Sample K completions per task and report pass@1 and pass@k (unbiased estimator of "
                    "Chen et al. 2021; a reward >= --threshold passes), mean reward with a 95%% "
                    "confidence interval over tasks, and tokens/s.")
    p.add_argument("--env", required=True, help="env id")
    p.add_argument("--model", default="tiny", help="'tiny', a saved directory (e.g. RUN/checkpoints/last), or a hub id "
                                                   "(with --engine openai: the served model's tokenizer)")
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
    from llmgym.engines import HFEngine, SamplingParams

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
    engine_args = parse_overrides(args.engine_arg or [], "--engine-arg")
    kind = check_engine(args.engine, engine_args, args.model, level=args.level, allowed=("hf", "vllm", "openai"))
    served = {}
    if kind == "openai":
        engine, tokenizer, served = _served_engine(args, engine_args)
    else:
        if args.base_url or args.served_model:
            raise UsageError("--base-url and --served-model are for --engine openai")
        model, tokenizer = _load_model(args.model, device=device)
        _apply_threads(args.threads, model)
        engine = HFEngine(model, tokenizer) if kind == "hf" else build_engine(kind, engine_args, model, tokenizer)
    try:
        return _bench(args, console, engine, tokenizer, sampling, requested, env_args, out, device,
                      {"engine": kind, "engine_args": engine_args, **served})
    finally:
        if hasattr(engine, "close"):
            engine.close()


def _served_engine(args, engine_args):
    """``(OpenAIEngine, tokenizer, what to report)`` for ``--engine openai``; a dead server or a model it does
    not serve is a :class:`UsageError` (the engine asks the server at once)."""
    from llmgym.engines.openai_api import ModelNotServedError, OpenAIEngine, ServerError
    from llmgym.models import load_tokenizer, tiny_model_path

    if not args.base_url:
        raise UsageError("--engine openai needs --base-url (the server's API root, e.g. http://127.0.0.1:8000/v1)")
    if args.device not in (None, "auto", "cpu"):
        raise UsageError("--device is where a local model runs; --engine openai samples on the server")
    path = str(tiny_model_path()) if args.model == "tiny" else resolve_model(args.model)
    try:
        tokenizer = load_tokenizer(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"could not load the tokenizer of --model {args.model!r} ({str(exc).splitlines()[0][:200]})"
                         ) from None
    try:
        engine = OpenAIEngine(args.base_url, args.served_model, tokenizer, **engine_args)
    except (ServerError, ModelNotServedError, ValueError, TypeError) as exc:
        raise UsageError(f"--engine openai: {exc}") from None
    return engine, tokenizer, {"base_url": engine.base_url, "served_model": engine.model}


def _bench(args, console, engine, tokenizer, sampling, requested, env_args, out, device, engine_report) -> int:
    from rich.table import Table

    from llmgym.metrics import mean_confidence_interval, pass_at_k
    from llmgym.rollout import collect_episodes, distinct_tasks

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
        episodes, stats = collect_episodes(env, engine, num_tasks=len(tasks), tasks=tasks,
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
        "env": args.env, "env_args": env_args, "model": args.model, "device": device, **engine_report,
        "tasks": len(tasks), "task_selection": how,
        "task_ids": [t.id for t in tasks], "samples": n, "threshold": args.threshold,
        "temperature": args.temperature, "top_p": args.top_p, "max_new_tokens": args.max_new_tokens, "seed": args.seed,
        "pass@1": pass_k["1"], f"pass@{n}": pass_k[str(n)], "pass_at_k": pass_k,
        "reward_mean": mean, "reward_ci95": [low, high], "ci_over": "distinct tasks (each task's mean over its samples)",
        "tokens_sampled": stats["tokens_sampled"], "tokens_per_s": stats["tokens_per_s"], "wall_s": wall,
        "per_task": per_task,
    }
    if engine_report["engine"] == "openai":
        report["prompts_sent_as"] = engine.prompts_sent_as  # token ids, or text where the server refused ids
        report["token_ids_from"] = engine.token_ids_from
    where = (f"served model {engine.model} at {engine.base_url}" if engine_report["engine"] == "openai"
             else f"model {args.model}" + (f" on {engine_report['engine']}" if engine_report["engine"] != "hf" else ""))
    console.print(f"[bold]bench[/] {args.env} · {where} · {how} × {n} samples "
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
