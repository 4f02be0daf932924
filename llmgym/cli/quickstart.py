"""``llmgym quickstart``: the main job on an embedded default.

A tiny model, warmed up on the Copy toy task (cached), trained with GRPO on ``llmgym/Copy-v0`` on
CPU; a before/after table of held-out reward and exact-match accuracy.

Example:
    >>> from llmgym.cli.quickstart import QUICKSTART_SETTINGS
    >>> QUICKSTART_SETTINGS["quick"]["steps"]
    50
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from llmgym.cli.common import check_device
from llmgym.cli.console import files_table, format_value
from llmgym.cli.resolve import load_run_model, make_run_env
from llmgym.cli.run_files import RUN_FILES, atomic_write_text, check_out_dir, existing_files, keep_previous_run
from llmgym.cli.usage import EXIT_INTERRUPTED, UsageError, invoked_as
from llmgym.runtime.display import make_console
from llmgym.runtime.display import quiet_hf_progress
from llmgym.cli.training import RunSpec, train_run
from llmgym.runtime.threads import set_torch_threads

__all__ = ["QUICKSTART_SETTINGS", "add_parser", "cmd_quickstart", "quickstart_base_model"]


QUICKSTART_SETTINGS: dict[str, dict[str, Any]] = {
    # the default: a clear improvement in about two minutes on 2 quiet CPU cores (measured with the head-32
    # base model on the 2-core AMD EPYC, 2026-11-27: sampled mean reward 0.59 -> 0.84, greedy 0.74 -> 0.83; docs/benchmarks.md)
    "default": {"steps": 600, "lr": 1e-3, "tasks_per_step": 16, "group_size": 8, "seed": 0},
    # --quick: seconds, for tests and a first look
    "quick": {"steps": 50, "lr": 1e-3, "tasks_per_step": 16, "group_size": 8, "seed": 0},
}
"""GRPO settings of ``llmgym quickstart`` (``--quick`` for the short one)."""

QUICKSTART_WARMUP = {"task": "copy", "pairs": 2000, "pairs_seed": 1, "steps": 80, "lr": 3e-3, "batch_size": 32,
                     "seed": 0}
QUICKSTART_HELD_OUT = {"task": "copy", "n": 64, "seed": 12345}


def quickstart_base_model(console=None, threads: int | None = None) -> Path:
    """The quickstart's base model: a tiny model after a short supervised warm-up on Copy, cached.

    Built once under :func:`llmgym.runtime.models.cache_dir` (keyed by the recipe) and reused afterwards;
    the warm-up runs on the threads :func:`llmgym.runtime.threads.set_torch_threads` picks (``threads``
    wins), one for this model unless the user says otherwise.
    """
    from llmgym.runtime.models import (
        TinyModelConfig,
        build_tiny_model,
        build_tokenizer,
        cache_dir,
        save_pretrained,
        supervised_warmup,
    )

    # 2 heads of 32: vLLM's CPU attention has no head size 16, so `--engine vllm` runs this model too
    shape = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=256)
    recipe = {"model": dataclasses.asdict(shape), "warmup": QUICKSTART_WARMUP, "version": 1}
    digest = hashlib.sha1(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:10]
    path = cache_dir() / f"quickstart-copy-{digest}"
    if (path / "config.json").is_file():
        return path
    from llmgym.envs.toy import sample_tasks

    console = console or make_console()
    quiet_hf_progress()
    with console.status(f"building the base model: a tiny Llama, {QUICKSTART_WARMUP['steps']} steps of supervised "
                        f"warm-up on Copy (cached for next time)"):
        tokenizer = build_tokenizer()
        model = build_tiny_model(tokenizer, shape)
        set_torch_threads(model, requested=threads)
        w = QUICKSTART_WARMUP
        pairs = [(t.prompt, t.answer) for t in sample_tasks(w["task"], w["pairs"], seed=w["pairs_seed"])]
        losses = supervised_warmup(model, tokenizer, pairs, steps=w["steps"], lr=w["lr"],
                                   batch_size=w["batch_size"], seed=w["seed"])
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")  # two processes may build it at once
        shutil.rmtree(tmp, ignore_errors=True)
        save_pretrained(model, tokenizer, tmp)
        (tmp / "recipe.json").write_text(json.dumps({**recipe, "final_loss": losses[-1]}, indent=2) + "\n")
        try:
            tmp.rename(path)
        except OSError:  # built by another process meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    console.print(f"base model warmed up: final loss {losses[-1]:.3f}")
    return path


def cmd_quickstart(args: argparse.Namespace) -> int:
    """``llmgym quickstart``: warm-up (cached) → GRPO on Copy → before/after table."""
    import torch
    from rich.rule import Rule
    from rich.table import Table

    from llmgym.envs.toy import sample_tasks
    from llmgym.engines import HFEngine, SamplingParams
    from llmgym.rollout import evaluate as evaluate_tasks

    console = make_console()
    mode = "quick" if args.quick else "default"
    settings = dict(QUICKSTART_SETTINGS[mode])
    if args.steps is not None:
        if args.steps < 1:
            raise UsageError(f"--steps must be >= 1, got {args.steps}")
        settings["steps"] = args.steps
    device = check_device(args.device)
    out = check_out_dir(args.out)  # before the warm-up and the training: a bad --out fails now
    console.print(Rule("[bold]llmgym quickstart"), width=min(console.width, 100))
    console.print(f"GRPO on llmgym/Copy-v0 with a tiny model on CPU: "
                  f"{settings['steps']} steps × {settings['tasks_per_step']} prompts × "
                  f"{settings['group_size']} samples"
                  f"{' (--quick)' if args.quick else ''}")
    torch.manual_seed(0)
    started = time.perf_counter()
    base_path = quickstart_base_model(console, threads=args.threads)
    console.print(f"base model (after warm-up): {base_path}")
    model, tokenizer, threads = load_run_model(str(base_path), device=device, threads=args.threads)
    held_out = sample_tasks(QUICKSTART_HELD_OUT["task"], QUICKSTART_HELD_OUT["n"], seed=QUICKSTART_HELD_OUT["seed"])
    eval_env = make_run_env("llmgym/Copy-v0", tokenizer)
    samples = 4

    def evaluate(m) -> dict[str, dict[str, float]]:
        engine = HFEngine(m, tokenizer)
        return {"greedy": evaluate_tasks(eval_env, engine, held_out, SamplingParams(temperature=0.0, max_new_tokens=6)),
                "sampled": evaluate_tasks(eval_env, engine, held_out,
                                          SamplingParams(temperature=1.0, n=samples, max_new_tokens=6))}

    before = evaluate(model)
    kept = None
    if args.overwrite:
        for path in existing_files(out, RUN_FILES):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    elif (kept := keep_previous_run(out)) is not None:  # a second quickstart never replaces the first
        console.print(f"{out} held an earlier run: moved it to {kept} (--overwrite replaces it instead)")
    spec = RunSpec(env="llmgym/Copy-v0", agent="grpo", model=str(base_path), steps=settings["steps"],
                   checkpoint_every=max(1, settings["steps"] // 3), threads=threads, device=device,
                   agent_config={"lr": settings["lr"], "kl_coef": 0.0, "max_new_tokens": 6, "seed": settings["seed"],
                                 "tasks_per_step": settings["tasks_per_step"], "group_size": settings["group_size"]})
    result = train_run(spec, out, console=console, base_model=(model, tokenizer), description="GRPO")
    after = evaluate(result.agent.model)
    wall = time.perf_counter() - started

    table = Table(title=f"held-out Copy tasks ({len(held_out)} prompts, seed {QUICKSTART_HELD_OUT['seed']})",
                  title_justify="left")
    table.add_column("metric")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    table.add_column("change", justify="right")
    labels = {("greedy", "reward_mean"): "mean reward, greedy", ("greedy", "exact_match"): "exact match, greedy",
              ("sampled", "reward_mean"): f"mean reward, sampled (T=1, {samples}/prompt)",
              ("sampled", "exact_match"): f"exact match, sampled (T=1, {samples}/prompt)"}
    for (decode, metric), label in labels.items():
        b, a = before[decode][metric], after[decode][metric]
        colour = "green" if a > b else ("red" if a < b else "")
        table.add_row(label, format_value(b), format_value(a), f"[{colour}]{a - b:+.3f}[/]" if colour else f"{a - b:+.3f}")
    console.print(table)
    report = {"before": before, "after": after, "held_out": QUICKSTART_HELD_OUT, "settings": settings,
              "base_model": str(base_path), "train_wall_s": result.wall_s, "wall_s": wall,
              "interrupted": result.interrupted, "steps_done": result.agent.step_count}
    atomic_write_text(out / "eval.json", json.dumps(report, indent=2) + "\n")
    console.print(files_table(f"run files ({wall:.0f} s in all)", {
        "metrics": out / "metrics.jsonl", "curves": result.curves, "before/after": out / "eval.json",
        "config": out / "config.json", "rollouts": (out / "rollouts.jsonl") if (out / "rollouts.jsonl").is_file() else None,
        "checkpoint": result.checkpoint, "tensorboard": result.tensorboard_dir, "earlier run": kept,
    }))
    console.print(f"one page of it all: {invoked_as()} report {out}")
    console.print(f"next: {invoked_as()} bench --env llmgym/Copy-v0 --model {result.checkpoint} --samples 8 --max-new-tokens 6")
    if result.interrupted:
        console.print(f"[yellow]interrupted at step {result.agent.step_count}; the table shows the model so far[/]")
        return EXIT_INTERRUPTED
    return 0



def add_parser(subparsers, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``quickstart`` sub-command to ``subparsers``."""
    p = subparsers.add_parser(
        "quickstart", parents=[common], help="tiny model + GRPO on the Copy toy task, with a before/after table",
        description="Warm up a tiny model on Copy (cached), train it with GRPO on llmgym/Copy-v0, "
                    "and compare held-out reward before and after.")
    p.add_argument("--out", default="runs/quickstart", help="run directory (default: runs/quickstart)")
    p.add_argument("--steps", type=int, help=f"GRPO steps (default {QUICKSTART_SETTINGS['default']['steps']}, "
                                             f"--quick {QUICKSTART_SETTINGS['quick']['steps']})")
    p.add_argument("--device", metavar="{auto,cpu,cuda,cuda:N}",
                   help="where the GRPO run happens (default auto: cuda when a GPU is visible; the warm-up is on CPU)")
    p.add_argument("--quick", action="store_true", help="a seconds-long run (for tests and a first look)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier run in --out (by default it is kept, moved to OUT.1, OUT.2, ...)")
    p.set_defaults(handler=cmd_quickstart)
    return p
