"""``llmgym bench``: pass@1, pass@k, mean reward with a 95% interval, sampling speed; per-sample records.

The interval respects the reward's range: the Wilson score interval when every reward is 0 or 1,
a percentile bootstrap over tasks otherwise (:func:`llmgym.metrics.reward_interval`).

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
from pathlib import Path
from typing import Any

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
    engine_arguments,
    engine_options,
    parse_overrides,
    resolve_model,
)

__all__ = ["PROCEDURAL_DEFAULT_TASKS", "add_parser", "cmd_bench", "parse_task_count", "sample_records", "samples_path"]

PROCEDURAL_DEFAULT_TASKS = 64
"""``--tasks`` when the env generates its tasks (it has no "all")."""


def add_parser(subparsers, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``bench`` sub-command to ``subparsers``."""
    p = subparsers.add_parser(
        "bench", parents=[common, engine_options(served=True)], help="pass@1, pass@k, mean reward with a 95%% CI, tokens/s",
        description="Sample K completions per task and report pass@1 and pass@k (unbiased estimator of "
                    "Chen et al. 2021; a reward >= --threshold passes), mean reward with a 95%% "
                    "confidence interval over tasks (Wilson for 0/1 rewards, else a bootstrap), sampling "
                    "tokens/s and verification time; --out also writes one JSONL record per sample.")
    p.add_argument("--env", required=True, help="env id")
    p.add_argument("--model", default="tiny", help="'tiny', a saved directory (e.g. RUN/checkpoints/last), or a hub id "
                                                   "(with --engine openai: the served model's tokenizer)")
    p.add_argument("--samples", type=int, default=8, metavar="K", help="completions per task (default 8)")
    p.add_argument("--tasks", metavar="N|all",
                   help="distinct tasks to evaluate: 'all' (the default for a finite task list, e.g. HumanEval's "
                        "164) or N (N of the list without replacement; for a procedural env N distinct seeds, "
                        f"default {PROCEDURAL_DEFAULT_TASKS})")
    p.add_argument("--out", metavar="FILE.json",
                   help="write the summary as JSON and one record per sample to FILE.samples.jsonl (checked before "
                        "any work; an earlier benchmark's files are kept unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier benchmark's files at --out")
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


def samples_path(out: Path) -> Path:
    """Where ``bench --out FILE.json`` writes its per-sample records: ``FILE.samples.jsonl`` beside it.

    Example:
        >>> from pathlib import Path
        >>> from llmgym.cli.bench import samples_path
        >>> samples_path(Path("runs/humaneval.json"))
        PosixPath('runs/humaneval.samples.jsonl')
    """
    return out.with_name(out.stem + ".samples.jsonl")


def sample_records(episodes, tasks, n: int, threshold: float, tokenizer, multi_turn: bool) -> list[dict[str, Any]]:
    """One JSON-safe record per sampled episode: task id, sample index, completion text, reward,
    pass/fail, turns, finish reasons, completion tokens, and what the verifier said (``info``)."""
    from llmgym.logging import json_safe

    records = []
    for index, episode in enumerate(episodes):
        info = {k: v for k, v in episode.info.items() if k not in ("task", "completion")}
        completion = episode.info.get("completion")
        if not isinstance(completion, str):
            completion = tokenizer.decode(episode.completion_ids, skip_special_tokens=True)
        record = {"task_id": tasks[index // n].id, "sample": index % n, "reward": episode.total_reward,
                  "passed": episode.total_reward >= threshold - 1e-9, "completion": completion,
                  "turns": episode.num_turns, "finish_reasons": list(episode.finish_reasons),
                  "completion_tokens": int(sum(episode.action_mask)), "info": json_safe(info)}
        if multi_turn:  # every turn and the env's replies, as the policy saw them
            record["transcript"] = tokenizer.decode(episode.completion_ids, skip_special_tokens=True)
        records.append(json_safe(record))
    return records


def cmd_bench(args: argparse.Namespace) -> int:
    """``llmgym bench``: each task at most once per sample index; pass@1, pass@k, mean reward with a 95%
    interval over distinct tasks, sampling speed; a summary JSON and per-sample JSONL."""
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
    if out is not None:
        earlier = [p for p in (out, samples_path(out)) if p.exists()]
        if earlier and not args.overwrite:
            raise UsageError(f"{str(earlier[0])!r} holds an earlier benchmark's results: choose another --out or "
                             f"add --overwrite")
    info = _require_env(args.env)
    device = check_device(args.device)
    engine_args = engine_arguments(args)
    kind = check_engine(args.engine, engine_args, args.model, level=args.level, allowed=("hf", "vllm", "openai"))
    served: dict[str, Any] = {}
    if kind == "openai":
        engine, tokenizer, served = _served_engine(args, engine_args)
    else:
        if args.base_url or args.served_model:
            raise UsageError("--base-url and --served-model are for --engine openai")
        model, tokenizer = _load_model(args.model, device=device)
        _apply_threads(args.threads, model)
        engine = HFEngine(model, tokenizer) if kind == "hf" else None
    try:
        env = _make_env(args.env, tokenizer, args.level, args.max_new_tokens, env_args)
        if engine is None:  # vLLM starts after the cheap checks
            engine = build_engine(kind, engine_args, model, tokenizer)
        return _bench(args, console, info, env, engine, tokenizer, sampling, requested, env_args, out, device,
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


def _bench(args, console, info, env, engine, tokenizer, sampling, requested, env_args, out, device,
           engine_report) -> int:
    from rich.table import Table

    from llmgym.core import MultiTurnEnv
    from llmgym.display import make_progress
    from llmgym.metrics import pass_at_k, reward_interval
    from llmgym.rollout import collect_episodes, distinct_tasks

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
    # an adapter spec (verifiers:/textarena:) has no registry entry: ask the env it made
    multi_turn = info.multi_turn if info is not None else isinstance(env.unwrapped, MultiTurnEnv)
    unit = "episodes" if multi_turn else "completions"
    progress = make_progress(console, unit)
    with progress:
        job = progress.add_task(f"bench {args.env}", total=len(tasks) * n)
        episodes, stats = collect_episodes(env, engine, num_tasks=len(tasks), tasks=tasks,
                                           group_size=n, sampling=sampling, seed=args.seed,
                                           on_episodes_done=lambda k: progress.update(job, advance=k))
    wall = time.perf_counter() - started
    ks = sorted({1, n} | {2 ** i for i in range(1, 10) if 2 ** i < n})
    per_task = []
    for g, task in enumerate(tasks):
        rewards = [e.total_reward for e in episodes[g * n:(g + 1) * n]]
        passed = sum(r >= args.threshold - 1e-9 for r in rewards)
        per_task.append({"id": task.id, "prompt": task.prompt if isinstance(task.prompt, str) else str(task.prompt),
                         "samples": n, "passed": passed, "reward_mean": sum(rewards) / n, "rewards": rewards})
    # every statistic is over distinct tasks: pass@k averages the per-task unbiased estimates, and the
    # interval treats each task's mean reward (over its n samples) as one observation
    pass_k = {str(k): sum(pass_at_k(n, t["passed"], k) for t in per_task) / len(per_task) for k in ks}
    means = [t["reward_mean"] for t in per_task]
    mean = sum(means) / len(means)
    pass_fail = all(e.total_reward in (0.0, 1.0) for e in episodes)
    low, high, method = reward_interval(means, pass_fail=pass_fail, seed=args.seed)
    ci_method = (f"Wilson score interval over {len(tasks)} tasks (every reward 0 or 1)" if method == "wilson" else
                 f"percentile bootstrap over {len(tasks)} tasks (10,000 resamples; inside the rewards' range)")
    report = {
        "env": args.env, "env_args": env_args, "model": args.model, "device": device, **engine_report,
        "tasks": len(tasks), "task_selection": how,
        "task_ids": [t.id for t in tasks], "samples": n, "threshold": args.threshold,
        "temperature": args.temperature, "top_p": args.top_p, "max_new_tokens": args.max_new_tokens, "seed": args.seed,
        "pass@1": pass_k["1"], f"pass@{n}": pass_k[str(n)], "pass_at_k": pass_k,
        "reward_mean": mean, "reward_ci95": [low, high], "ci_method": method, "ci_description": ci_method,
        "ci_over": "distinct tasks (each task's mean over its samples)",
        "tokens_sampled": stats["tokens_sampled"], "tokens_per_s": stats["tokens_per_s"],
        "generate_s": stats["generate_s"], "verify_s": stats["verify_s"], "rollout_s": stats["rollout_s"],
        "wall_s": wall, "samples_file": str(samples_path(out)) if out is not None else None,
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
    table.add_row(f"mean reward [95% CI over {len(tasks)} tasks, {method}]", f"{mean:.3f} [{low:.3f}, {high:.3f}]")
    table.add_row("tokens/s (sampling)", _fmt(stats["tokens_per_s"], 0))
    table.add_row("sampling s", _fmt(stats["generate_s"], 1))
    table.add_row("verification s", _fmt(stats["verify_s"], 1))
    table.add_row("wall s", _fmt(wall, 1))
    console.print(table)
    if out is not None:
        records = sample_records(episodes, tasks, n, args.threshold, tokenizer, multi_turn)
        atomic_write_text(samples_path(out), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        atomic_write_text(out, json.dumps(report, indent=2) + "\n")
        console.print(f"results: {out} (summary), {samples_path(out)} (one record per sample)")
    return 0
