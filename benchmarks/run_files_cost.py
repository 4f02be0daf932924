"""What the run-folder rules cost: a trainer's per-step writes, the curves' write, a resume's rewind and the
report's read, before (the code as it was, copied here) and after (llmgym's), interleaved in one process.

Per step a run appends one ``metrics.jsonl`` row and, every N steps, a few ``rollouts.jsonl`` records. Before:
``open(path, "a")`` once, then ``write`` + ``flush`` per step. After: ``open_append`` once (``O_NOFOLLOW``,
mode 0600, ``O_APPEND``), then the same ``write`` + ``flush``: the per-step path differs only in how the file
was opened, and no file is rewritten per step. ``curves.png`` (once a run) went from ``savefig(path)`` to
``savefig`` into memory + a temporary file + a rename. Reading went from ``read_text().splitlines()`` + one
``json.loads`` a line to a bounded ``readline`` + ``json.loads`` + a walk that replaces lone surrogates.

    python benchmarks/run_files_cost.py [--steps 2000] [--rounds 5]

Prints one JSON object (medians over rounds, each round both sides back to back, order alternating).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

ROW = {"step": 0, "reward_mean": 0.4375, "reward_std": 0.31, "kl": 0.0123, "entropy": 2.71, "completion_len": 41.5,
       "clip_frac": 0.02, "tokens_per_s": 812.3, "wall_s": 1.234, "rollout_s": 0.9, "samples_total": 64.0,
       "tokens_total": 2650.0, "completion_len_max": 64.0, "zero_var_groups": 0.25, "update_s": 0.33}
RECORD = {"step": 0, "split": "train", "group": 0, "task_id": "countdown-17", "prompt": "p" * 300,
          "answer": "42", "completion": "c" * 1200, "reward": 1.0, "reward_parts": {"format": 1.0},
          "info": {"score": {"format": {"reward": 1.0}}}, "completion_tokens": 300, "finish_reason": "stop",
          "advantage": 0.5, "policy_version": 0, "staleness": 0, "turns": 1}


def old_steps(out: Path, steps: int) -> float:
    """The writers as they were: plain ``open(..., "a")``."""
    started = time.perf_counter()
    metrics = open(out / "metrics.jsonl", "w", encoding="utf-8")
    rollouts = open(out / "rollouts.jsonl", "w", encoding="utf-8")
    for step in range(1, steps + 1):
        metrics.write(json.dumps({**ROW, "step": step}) + "\n")
        metrics.flush()
        if step % 10 == 0:
            for _ in range(8):
                rollouts.write(json.dumps({**RECORD, "step": step}, ensure_ascii=False) + "\n")
            rollouts.flush()
    metrics.close()
    rollouts.close()
    return (time.perf_counter() - started) / steps


def new_steps(out: Path, steps: int) -> float:
    """The writers as they are: :func:`llmgym.runtime.files.open_append`."""
    from llmgym.runtime.files import check_run_folder, open_append

    started = time.perf_counter()
    check_run_folder(out)
    metrics = open_append(out / "metrics.jsonl", truncate=True)
    rollouts = open_append(out / "rollouts.jsonl", truncate=True)
    for step in range(1, steps + 1):
        metrics.write(json.dumps({**ROW, "step": step}) + "\n")
        metrics.flush()
        if step % 10 == 0:
            for _ in range(8):
                rollouts.write(json.dumps({**RECORD, "step": step}, ensure_ascii=False) + "\n")
            rollouts.flush()
    metrics.close()
    rollouts.close()
    return (time.perf_counter() - started) / steps


def old_read(path: Path) -> float:
    started = time.perf_counter()
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return time.perf_counter() - started


def new_read(path: Path) -> float:
    from llmgym.runtime.files import scan_jsonl

    started = time.perf_counter()
    scan_jsonl(path)
    return time.perf_counter() - started


def curves(out: Path, rows: list[dict], new: bool) -> float:
    from llmgym.runtime import logging as run_logging

    started = time.perf_counter()
    if new:
        run_logging.plot_curves(rows, out / "curves.png")
    else:  # savefig straight to the path, as before
        plt = run_logging._pyplot()
        saved = run_logging._save_png
        run_logging._save_png = lambda plt_, fig, path, dpi: (fig.savefig(path, dpi=dpi), plt_.close(fig))
        try:
            run_logging.plot_curves(rows, out / "curves.png")
        finally:
            run_logging._save_png = saved
        del plt
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    step = {"before": [], "after": []}
    read = {"before": [], "after": []}
    plot = {"before": [], "after": []}
    rows = [{**ROW, "step": s} for s in range(1, 201)]
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for side in order:
                out = Path(d) / f"{side}-{r}"
                out.mkdir()
                step[side].append((old_steps if side == "before" else new_steps)(out, args.steps))
                read[side].append((old_read if side == "before" else new_read)(out / "rollouts.jsonl"))
                plot[side].append(curves(out, rows, new=side == "after"))
    med = {k: {s: statistics.median(v) for s, v in d_.items()} for k, d_ in
           (("step", step), ("read", read), ("curves", plot))}
    print(json.dumps({
        "what": "run-folder file handling, before/after, interleaved in one process",
        "steps_per_round": args.steps, "rounds": args.rounds,
        "per_step_write_us": {s: round(v * 1e6, 2) for s, v in med["step"].items()},
        "rollouts_read_ms": {s: round(v * 1e3, 2) for s, v in med["read"].items()},
        "rollouts_records_read": args.steps // 10 * 8,
        "curves_png_ms": {s: round(v * 1e3, 1) for s, v in med["curves"].items()},
        "load_before": load_before, "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "cpu": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }, indent=1))


if __name__ == "__main__":
    main()
