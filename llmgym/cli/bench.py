"""``llmgym bench``: pass@1, pass@k, mean reward with a 95% interval, sampling speed; per-sample records.

The interval respects the reward's range: the Wilson score interval when every reward is 0 or 1,
a percentile bootstrap over tasks otherwise (:func:`llmgym.runtime.metrics.reward_interval`).

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

from llmgym.cli.common import check_device, parse_overrides
from llmgym.cli.console import format_value
from llmgym.cli.engine_options import bf16_on_slow_cpu, check_engine, engine_arguments, engine_options
from llmgym.cli.resolve import build_engine, load_run_model, make_run_env, require_env, resolve_model
from llmgym.cli.run_files import atomic_write_text, check_out_file
from llmgym.cli.usage import UsageError
from llmgym.runtime.display import make_console

__all__ = ["CHUNK_ROWS", "PROCEDURAL_DEFAULT_TASKS", "add_parser", "check_earlier_results", "cmd_bench",
           "parse_task_count", "partial_path", "sample_records", "samples_path"]

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
    p.add_argument("--resume", action="store_true",
                   help="continue the unfinished benchmark at --out (one stopped by a dead server or Ctrl-C): its "
                        "kept samples count, the rest are sampled as the first run would have")
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


def sample_records(episodes, tasks, n: int, threshold: float, tokenizer, multi_turn: bool,
                   first_task: int = 0) -> list[dict[str, Any]]:
    """One JSON-safe record per sampled episode: task id and index (``first_task`` + its place in ``tasks``),
    sample index, completion text, reward, pass/fail, turns, finish reasons, completion tokens, and what the
    verifier said (``info``); every secret this process holds is written as ``[redacted]``."""
    from llmgym.runtime.logging import json_safe
    from llmgym.runtime.secrets import known_secrets, redact_tree

    secrets = known_secrets()  # a secret the model echoed is written as [redacted], as in rollouts.jsonl
    records = []
    for index, episode in enumerate(episodes):
        info = {k: v for k, v in episode.info.items() if k not in ("task", "completion")}
        completion = episode.info.get("completion")
        if not isinstance(completion, str):
            completion = tokenizer.decode(episode.completion_ids, skip_special_tokens=True)
        record = {"task_id": tasks[index // n].id, "task_index": first_task + index // n, "sample": index % n, "reward": episode.total_reward,
                  "passed": episode.total_reward >= threshold - 1e-9, "completion": completion,
                  "turns": episode.num_turns, "finish_reasons": list(episode.finish_reasons),
                  "completion_tokens": int(sum(episode.action_mask)), "info": json_safe(info)}
        if multi_turn:  # every turn and the env's replies, as the policy saw them
            record["transcript"] = tokenizer.decode(episode.completion_ids, skip_special_tokens=True)
        records.append(redact_tree(json_safe(record), secrets))
    return records


def cmd_bench(args: argparse.Namespace) -> int:
    """``llmgym bench``: each task at most once per sample index; pass@1, pass@k, mean reward with a 95%
    interval over distinct tasks, sampling speed; a summary JSON and per-sample JSONL."""
    from llmgym.engines import HFEngine, SamplingParams

    console = make_console()
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
        check_earlier_results(out, args.overwrite, args.resume)
    elif args.resume:
        raise UsageError("--resume continues the unfinished benchmark at --out FILE.json: give --out")
    info = require_env(args.env)
    device = check_device(args.device)
    engine_args = engine_arguments(args)
    kind = check_engine(args.engine, engine_args, args.model, level=args.level, allowed=("hf", "vllm", "openai"))
    served: dict[str, Any] = {}
    if kind == "openai":
        engine, tokenizer, served = _served_engine(args, engine_args)
    else:
        if args.base_url or args.served_model:
            raise UsageError("--base-url and --served-model are for --engine openai")
        model, tokenizer, _ = load_run_model(args.model, device=device, threads=args.threads)
        engine = HFEngine(model, tokenizer) if kind == "hf" else None
    try:
        env = make_run_env(args.env, tokenizer, args.level, args.max_new_tokens, env_args)
        if engine is None:  # vLLM starts after the cheap checks
            engine = build_engine(kind, engine_args, model, tokenizer)
            note = bf16_on_slow_cpu(device, None, engine_args)
            if note:
                console.print(f"[yellow]{note}[/]")
        return _bench(args, console, info, env, engine, tokenizer, sampling, requested, env_args, out, device,
                      {"engine": kind, "engine_args": engine_args, **served})
    finally:
        if hasattr(engine, "close"):
            engine.close()


def _served_engine(args, engine_args):
    """``(OpenAIEngine, tokenizer, what to report)`` for ``--engine openai``; a dead server or a model it does
    not serve is a :class:`UsageError` (the engine asks the server at once)."""
    from llmgym.engines.openai_api import ModelNotServedError, OpenAIEngine, ServerError
    from llmgym.runtime.models import load_tokenizer, tiny_model_path

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


PARTIAL_SUFFIX = ".partial.json"
CHUNK_ROWS = 128
"""Completions sampled per part of a benchmark: what a dead server or a Ctrl-C can cost (done parts are kept)."""


def partial_path(out: Path) -> Path:
    """The marker of an unfinished ``bench --out FILE.json``: ``FILE.partial.json`` (the settings its samples were
    drawn with; ``--resume`` checks them). Removed when the benchmark completes.

    Example:
        >>> from pathlib import Path
        >>> from llmgym.cli.bench import partial_path
        >>> partial_path(Path("runs/humaneval.json"))
        PosixPath('runs/humaneval.partial.json')
    """
    return out.with_name(out.stem + PARTIAL_SUFFIX)


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def check_earlier_results(out: Path, overwrite: bool, resume: bool) -> None:
    """``--out``, ``--overwrite`` and ``--resume`` checked against what ``out`` holds, before any work."""
    partial = partial_path(out)
    if resume:
        if overwrite:
            raise UsageError("--resume continues an unfinished benchmark and --overwrite discards it: give one")
        if out.exists() and not partial.exists():
            raise UsageError(f"{str(out)!r} holds a finished benchmark: nothing to resume (choose another --out, or "
                             f"--overwrite to run it again)")
        if not partial.exists():
            raise UsageError(f"nothing to resume at --out {str(out)!r}: no {partial.name} there (it is written when a "
                             f"benchmark stops before the end)")
        return
    earlier = [p for p in (out, samples_path(out), partial) if p.exists()]
    if earlier and not overwrite:
        if partial.exists():
            raise UsageError(f"{str(out)!r} is an unfinished benchmark ({_count_lines(samples_path(out))} samples "
                             f"kept in {samples_path(out).name}): continue it with --resume, or add --overwrite")
        raise UsageError(f"{str(earlier[0])!r} holds an earlier benchmark's results: choose another --out or "
                         f"add --overwrite")


def _settings(args, env_args, tasks, engine_report) -> dict[str, Any]:
    """What decides a benchmark's samples: a continuation (``--resume``) must match it."""
    keep = ("engine", "served_model")
    return {"env": args.env, "env_args": env_args, "model": args.model, "level": args.level, "samples": args.samples,
            "seed": args.seed, "temperature": args.temperature, "top_p": args.top_p,
            "max_new_tokens": args.max_new_tokens, "task_ids": [t.id for t in tasks],
            "task_prompts_sha1": _digest([t.prompt for t in tasks]),
            **{k: engine_report.get(k) for k in keep}}


def _digest(value: Any) -> str:
    import hashlib

    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _load_partial(out: Path, settings: dict[str, Any], n: int) -> dict[int, list[dict[str, Any]]]:
    """The samples an unfinished benchmark kept, by task index; a :class:`UsageError` if its settings differ."""
    from llmgym.runtime.files import read_bytes_bounded, scan_jsonl

    partial = partial_path(out)
    try:
        recorded = json.loads(read_bytes_bounded(partial, 2**26))
        if not isinstance(recorded, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError, RecursionError) as exc:  # a link or an oversized file included (RunFileError)
        raise UsageError(f"cannot read {partial} ({exc}): start again with --overwrite") from None
    changed = [k for k in settings if recorded.get(k) != settings[k]]
    if changed:
        k = changed[0]
        shown = "the task list" if k in ("task_ids", "task_prompts_sha1") else f"{k} {recorded.get(k)!r}"
        raise UsageError(f"--resume: the unfinished benchmark in {str(out)!r} was sampled with {shown}, not "
                         f"{'this one' if k.startswith('task') else repr(settings[k])}: give the same options, or "
                         f"--overwrite to start again")
    by_task: dict[int, list[dict[str, Any]]] = {}
    path = samples_path(out)
    try:  # lines split at "\n" only (a completion may hold U+2028), each bounded, never through a link
        read = scan_jsonl(path)
    except OSError as exc:
        raise UsageError(f"cannot read {path} ({exc}): start again with --overwrite") from None
    for number, record in enumerate(read.records, 1):
        try:
            by_task.setdefault(int(record["task_index"]), []).append(record)
        except (ValueError, KeyError, TypeError, OverflowError):
            raise UsageError(f"record {number} of {path} is not a sample record of llmgym bench: start again with "
                             f"--overwrite") from None
    if read.unreadable:
        raise UsageError(f"{path} has {read.unreadable} unreadable line{'s' * (read.unreadable != 1)} (not sample "
                         f"records of llmgym bench): start again with --overwrite")
    return {g: records for g, records in by_task.items() if len(records) == n}  # whole tasks only


def _warm_up(env, engine, task, sampling) -> float:
    """Seconds of one engine call on the first task's prompt, before the timed run: an engine's first call
    carries its own start-up (vLLM's is many seconds on a CPU), which is not sampling speed."""
    import dataclasses as dc

    from llmgym.env.vector import clone_env

    probe = clone_env(env)
    obs, _ = probe.reset(options={"task": task})
    started = time.perf_counter()
    engine.generate([[int(t) for t in obs["prompt_ids"]]], dc.replace(sampling, n=1), keys=[0])
    return time.perf_counter() - started


class _Stopped(Exception):
    """The benchmark stopped before the end (a dead server, Ctrl-C); what was done is kept."""

    def __init__(self, why: str, interrupted: bool):
        super().__init__(why)
        self.why, self.interrupted = why, interrupted


def _sample_all(args, console, env, engine, tasks, todo, sampling, tokenizer, multi_turn, sink, stop_errors):
    """Sample every task index in ``todo`` in parts of about :data:`CHUNK_ROWS` completions; each part's records go
    to ``sink`` as soon as it is done. Returns the summed timing stats."""
    from llmgym.runtime.display import make_progress
    from llmgym.rollout.episodes import collect_episodes

    n = args.samples
    per_part = max(1, CHUNK_ROWS // n)
    parts, run = [], []
    for g in todo:  # consecutive task indices, at most per_part of them
        if run and (g != run[-1] + 1 or len(run) == per_part):
            parts.append(run)
            run = []
        run.append(g)
    if run:
        parts.append(run)
    stats = {"rollout_s": 0.0, "generate_s": 0.0, "verify_s": 0.0, "tokens_sampled": 0.0}
    progress = make_progress(console, "episodes" if multi_turn else "completions")
    with progress:
        job = progress.add_task(f"bench {args.env}", total=len(tasks) * n, completed=(len(tasks) - len(todo)) * n)
        for part in parts:
            try:
                episodes, part_stats = collect_episodes(
                    env, engine, num_tasks=len(part), tasks=[tasks[g] for g in part], group_size=n, sampling=sampling,
                    seed=args.seed, first_row=part[0] * n, on_episodes_done=lambda k: progress.update(job, advance=k))
            except stop_errors as exc:
                raise _Stopped(" ".join(str(exc).split())[:300] or type(exc).__name__, False) from None
            except KeyboardInterrupt:
                raise _Stopped("interrupted (Ctrl-C)", True) from None
            for key in stats:
                stats[key] += part_stats[key]
            sink(sample_records(episodes, [tasks[g] for g in part], n, args.threshold, tokenizer, multi_turn,
                                first_task=part[0]))
    stats["tokens_per_s"] = stats["tokens_sampled"] / max(stats["generate_s"], 1e-9)
    return stats


def _bench(args, console, info, env, engine, tokenizer, sampling, requested, env_args, out, device,
           engine_report) -> int:
    import os
    import tempfile

    from rich.table import Table

    from llmgym.env.core import MultiTurnEnv
    from llmgym.env.registry import EnvInfo
    from llmgym.runtime.metrics import pass_at_k, reward_interval
    from llmgym.rollout import distinct_tasks

    try:
        tasks, how = distinct_tasks(env, requested, seed=args.seed)
    except ValueError as exc:
        if requested is not None or args.tasks is not None:  # an explicit count, or an explicit 'all'
            raise UsageError(f"{args.env}: {exc} (--tasks)") from None
        try:  # a procedural env and no --tasks: its default count, or every distinct task when there are fewer
            tasks, how = distinct_tasks(env, PROCEDURAL_DEFAULT_TASKS, seed=args.seed, allow_fewer=True)
        except ValueError as again:
            raise UsageError(f"{args.env}: {again} (--tasks N)") from None
        if len(tasks) < PROCEDURAL_DEFAULT_TASKS:
            console.print(f"{args.env} has {len(tasks)} distinct tasks, fewer than the default "
                          f"{PROCEDURAL_DEFAULT_TASKS}: benchmarking all of them")
    started = time.perf_counter()
    n = args.samples
    # an adapter spec (verifiers:/textarena:) has no registry entry: ask the env it made
    multi_turn = info.multi_turn if isinstance(info, EnvInfo) else isinstance(env.unwrapped, MultiTurnEnv)
    settings = _settings(args, env_args, tasks, engine_report)
    kept = _load_partial(out, settings, n) if args.resume else {}
    todo = [g for g in range(len(tasks)) if g not in kept]
    if args.resume:
        console.print(f"resuming: {len(kept)} of {len(tasks)} tasks sampled before ({len(kept) * n} samples kept); "
                      f"sampling the other {len(todo)}")
    records_by_task = dict(kept)
    file = None
    if out is not None:  # the samples go to disk part by part; FILE.partial.json says the benchmark is unfinished
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(partial_path(out), json.dumps(settings, indent=2) + "\n")
        if args.resume:  # the kept records, whole tasks only, in task order; then the new ones are appended
            atomic_write_text(samples_path(out), "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                                         for g in sorted(kept) for r in kept[g]))
        from llmgym.runtime.files import open_append

        file = open_append(samples_path(out), truncate=not args.resume)  # never through a link; mode 0600

    def sink(records: list[dict[str, Any]]) -> None:
        for r in records:
            records_by_task.setdefault(r["task_index"], []).append(r)
        if file is not None:
            file.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
            file.flush()

    stop_errors: tuple[type[BaseException], ...] = ()
    if engine_report["engine"] == "openai":  # a server that died or went wrong mid-benchmark
        import openai

        from llmgym.engines.openai_api import ModelNotServedError, ServerError

        stop_errors = (ServerError, ModelNotServedError, openai.APIError)
    warmup_s = 0.0
    try:
        try:
            warmup_s = _warm_up(env, engine, tasks[todo[0]], sampling) if todo else 0.0
        except stop_errors as exc:
            raise _Stopped(" ".join(str(exc).split())[:300] or type(exc).__name__, False) from None
        except KeyboardInterrupt:
            raise _Stopped("interrupted (Ctrl-C)", True) from None
        stats = _sample_all(args, console, env, engine, tasks, todo, sampling, tokenizer, multi_turn, sink,
                            stop_errors)
    except _Stopped as stopped:
        done = sum(len(v) for v in records_by_task.values())
        if file is not None:
            file.close()
            where = f"kept in {samples_path(out)}: continue with the same command and --resume"
        else:  # no --out: the done samples go to a file of their own, and the message says how to continue
            fd, name = tempfile.mkstemp(prefix="llmgym-bench-", suffix=".json")
            os.close(fd)
            os.unlink(name)
            rescue = Path(name)
            atomic_write_text(partial_path(rescue), json.dumps(settings, indent=2) + "\n")
            atomic_write_text(samples_path(rescue), "".join(json.dumps(r, ensure_ascii=False) + "\n" for g in
                                                            sorted(records_by_task) for r in records_by_task[g]))
            where = f"kept in {samples_path(rescue)}: continue with the same command and --out {rescue} --resume"
        message = (f"bench stopped after {done} of {len(tasks) * n} samples ({stopped.why}); the {done} done are "
                   f"{where}")
        if stopped.interrupted:
            console.print(f"[yellow]{message}[/]")
            from llmgym.cli.usage import EXIT_INTERRUPTED

            return EXIT_INTERRUPTED
        raise UsageError(message) from None
    if file is not None:
        file.close()
    wall = time.perf_counter() - started
    ks = sorted({1, n} | {2 ** i for i in range(1, 10) if 2 ** i < n})
    per_task = []
    for g, task in enumerate(tasks):
        rewards = [float(r["reward"]) for r in sorted(records_by_task[g], key=lambda r: r["sample"])]
        passed = sum(r >= args.threshold - 1e-9 for r in rewards)
        per_task.append({"id": task.id, "prompt": task.prompt if isinstance(task.prompt, str) else str(task.prompt),
                         "samples": n, "passed": passed, "reward_mean": sum(rewards) / n, "rewards": rewards})
    # every statistic is over distinct tasks: pass@k averages the per-task unbiased estimates, and the
    # interval treats each task's mean reward (over its n samples) as one observation
    pass_k = {str(k): sum(pass_at_k(n, t["passed"], k) for t in per_task) / len(per_task) for k in ks}
    means = [t["reward_mean"] for t in per_task]
    mean = sum(means) / len(means)
    pass_fail = all(r in (0.0, 1.0) for t in per_task for r in t["rewards"])
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
        "warmup_s": warmup_s, "timed_samples": len(todo) * n, "resumed_samples": len(kept) * n,
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
        table.add_row(f"pass@{k} (reward ≥ {args.threshold:g})", format_value(pass_k[str(k)]))
    table.add_row(f"mean reward [95% CI over {len(tasks)} tasks, {method}]", f"{mean:.3f} [{low:.3f}, {high:.3f}]")
    timed = "" if not kept else f", the {len(todo) * n} sampled now"
    table.add_row(f"tokens/s (sampling{timed})", format_value(stats["tokens_per_s"], 0))
    table.add_row("sampling s", format_value(stats["generate_s"], 1))
    table.add_row("engine warm-up s (first call, not in tokens/s)", format_value(warmup_s, 1))
    table.add_row("verification s", format_value(stats["verify_s"], 1))
    table.add_row("wall s", format_value(wall, 1))
    console.print(table)
    if out is not None:
        atomic_write_text(out, json.dumps(report, indent=2) + "\n")
        partial_path(out).unlink(missing_ok=True)
        console.print(f"results: {out} (summary), {samples_path(out)} (one record per sample)")
    return 0
