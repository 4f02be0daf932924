"""``llmgym rm``: train a Bradley–Terry reward model on preference pairs.

Reads ``{"prompt", "chosen", "rejected"}`` JSONL, puts a scalar head on a causal LM's backbone (or
continues a reward model saved earlier), trains it with
:func:`llmgym.rlhf.reward_models.fit_reward_model`, evaluates pairwise accuracy on held-out pairs, and
saves a directory that :class:`llmgym.rlhf.reward_models.RewardModelVerifier` loads
(``RewardModelVerifier("DIR")``) — a reward for ``train`` through any env built on it.

Example:
    >>> from llmgym.cli import main
    >>> main(["rm", "--pairs", "/no/such/pairs.jsonl", "--out", "/tmp/rm"])
    2
"""

from __future__ import annotations

import argparse
import json

from llmgym.cli.console import files_table, format_value
from llmgym.cli.resolve import resolve_model
from llmgym.cli.run_files import atomic_write_text, check_out_dir, existing_files
from llmgym.cli.usage import UsageError
from llmgym.runtime.display import make_console
from llmgym.runtime.display import quiet_hf_progress
from llmgym.runtime.threads import set_torch_threads

__all__ = ["add_parser", "cmd_rm"]


def add_parser(subparsers, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``rm`` sub-command to ``subparsers`` (``common`` holds the options every command shares)."""
    p = subparsers.add_parser(
        "rm", parents=[common], help="train a Bradley-Terry reward model on preference pairs",
        description="Train a reward model on preference pairs (JSONL rows {\"prompt\", \"chosen\", \"rejected\"}): "
                    "a scalar head on the model's backbone, the Bradley-Terry loss, pairwise accuracy on held-out "
                    "pairs. Writes OUT (load it with RewardModelVerifier(OUT)) and OUT/metrics.jsonl.")
    p.add_argument("--pairs", required=True, metavar="FILE.jsonl", help="training preference pairs")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the reward model and metrics.jsonl")
    p.add_argument("--model", default="tiny",
                   help="a causal LM ('tiny', a saved directory or a hub id) or a reward model saved earlier "
                        "(training continues) (default tiny)")
    p.add_argument("--eval-pairs", metavar="FILE.jsonl",
                   help="held-out pairs (default: hold out --held-out of --pairs)")
    p.add_argument("--held-out", type=float, default=0.1, metavar="FRACTION",
                   help="share of --pairs held out for evaluation when --eval-pairs is not given (default 0.1)")
    p.add_argument("--steps", type=int, default=200, help="optimiser steps (default 200)")
    p.add_argument("--batch-size", type=int, default=32, help="pairs per step (default 32)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out split, batches and head (default 0)")
    p.add_argument("--center-rewards-coefficient", type=float, default=0.0, metavar="C",
                   help="add C·mean((r⁺ + r⁻)²) to pull rewards to mean 0 (TRL's option; 0.01 is usual; default 0)")
    p.add_argument("--eval-every", type=int, default=50, metavar="N",
                   help="evaluate on the held-out pairs every N steps (and at the end; default 50)")
    p.add_argument("--overwrite", action="store_true", help="replace a reward model already in --out")
    p.set_defaults(handler=cmd_rm)
    return p


def _load_pairs(path: str, flag: str):
    """The pairs in ``path``; a missing, empty or malformed file is a one-line :class:`UsageError`."""
    from llmgym.rlhf.preferences import load_preferences

    try:
        return load_preferences(path)
    except FileNotFoundError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    except (ValueError, TypeError, UnicodeDecodeError, IsADirectoryError) as exc:
        message = " ".join(str(exc).split())[:400]
        raise UsageError(f"{flag} {path}: {message}") from None


def _set_threads(requested: int | None, model: str) -> int:
    """Torch's CPU threads for the run, by the rule of the other commands
    (:func:`llmgym.runtime.threads.set_torch_threads`), the size counted on a weightless ``meta``-device copy."""
    import torch

    if requested is not None:
        return set_torch_threads(requested=requested)
    try:
        from transformers import AutoConfig, AutoModelForCausalLM

        from llmgym.runtime.models import tiny_model_path

        config = AutoConfig.from_pretrained(str(tiny_model_path() if model == "tiny" else model))
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
        return set_torch_threads(num_parameters=sum(p.numel() for p in skeleton.parameters()))
    except (OSError, ValueError):  # an unusual architecture: torch's choice; loading it reports any real problem
        return set_torch_threads()


def reward_progress(console):
    from llmgym.runtime.display import make_progress

    return make_progress(console, "loss {task.fields[loss]}", "batch acc {task.fields[acc]}",
                         "held-out acc {task.fields[eval]}")


def cmd_rm(args: argparse.Namespace) -> int:
    """``llmgym rm``."""
    from rich.table import Table

    from llmgym.rlhf.reward_models import fit_reward_model

    console = make_console()
    for flag, value, low in (("--steps", args.steps, 1), ("--batch-size", args.batch_size, 1),
                             ("--eval-every", args.eval_every, 0), ("--seed", args.seed, 0)):
        if value < low:
            raise UsageError(f"{flag} must be >= {low}, got {value}")
    if not 0 < args.held_out < 1:
        raise UsageError(f"--held-out must be in (0, 1), got {args.held_out:g}")
    if not args.lr >= 0 or not args.weight_decay >= 0:
        raise UsageError(f"--lr and --weight-decay must be >= 0, got {args.lr:g} and {args.weight_decay:g}")
    if not args.center_rewards_coefficient >= 0:
        raise UsageError(f"--center-rewards-coefficient must be >= 0 (0.01 is usual), "
                         f"got {args.center_rewards_coefficient:g}")
    out = check_out_dir(args.out)  # before any work: a file or an unwritable place fails now
    earlier = existing_files(out, ("metrics.jsonl", "eval.json", "config.json", "model.safetensors"))
    if earlier and not args.overwrite:  # a reward model run, or any saved model (a checkpoint, say)
        raise UsageError(f"{str(out)!r} already holds a model or a reward model run ({earlier[0].name}): choose "
                         f"another --out or add --overwrite")
    pairs = _load_pairs(args.pairs, "--pairs")
    eval_pairs = _load_pairs(args.eval_pairs, "--eval-pairs") if args.eval_pairs else None
    if eval_pairs is None and len(pairs) < 2:
        raise UsageError(f"--pairs {args.pairs} holds {len(pairs)} pair: need at least 2 to hold some out, "
                         f"or give --eval-pairs")
    model = resolve_model(args.model)  # before any work: a missing model fails now
    quiet_hf_progress()
    threads = _set_threads(args.threads, model)

    console.print(f"[bold]training a reward model[/] on {len(pairs)} pairs (model {args.model}, {args.steps} steps, "
                  f"batch {args.batch_size}, seed {args.seed}, {threads} thread(s)) → {out}")
    progress = reward_progress(console)
    job = progress.add_task("reward model", total=args.steps, loss="—", acc="—", eval="—")
    last_eval = "—"

    def on_step(row: dict[str, float]) -> None:
        nonlocal last_eval
        if row.get("eval_accuracy") is not None:
            last_eval = format_value(row["eval_accuracy"])
        progress.update(job, completed=int(row["step"]), loss=format_value(row.get("loss")), acc=format_value(row.get("accuracy")),
                        eval=last_eval)

    try:
        with progress:
            report = fit_reward_model(model, pairs, out, eval_pairs=eval_pairs, held_out=args.held_out,
                                      steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                                      weight_decay=args.weight_decay, seed=args.seed, eval_every=args.eval_every,
                                      center_rewards_coefficient=args.center_rewards_coefficient, callback=on_step)
    except ValueError as exc:  # e.g. too few pairs for the split
        raise UsageError(" ".join(str(exc).split())[:400]) from None
    final = report["eval"]
    table = Table(title=f"held-out pairs ({report['eval_pairs']}; trained on {report['train_pairs']})",
                  title_justify="left")
    for column in ("accuracy", "margin", "loss", "pairs"):
        table.add_column(column, justify="right")
    table.add_row(format_value(final["accuracy"]), format_value(final["margin"]), format_value(final["loss"]), str(int(final["pairs"])))
    console.print(table)
    atomic_write_text(out / "eval.json", json.dumps({**final, "train_pairs": report["train_pairs"]}, indent=2) + "\n")
    console.print(files_table("files", {"reward model": out, "metrics": out / "metrics.jsonl",
                                         "eval": out / "eval.json"}))
    console.print(f"use it as a reward: llmgym.rlhf.reward_models.RewardModelVerifier({str(out)!r})")
    return 0
