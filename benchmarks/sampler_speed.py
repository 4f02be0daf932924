"""The keyed sampler side by side with ``softmax + torch.multinomial``: speed and exactness, one run.

1. Speed: one draw for ``B × V`` logits (default 64 × 151,936, the Qwen2 vocabulary), median of
   ``--repeats``, the variants interleaved within each repeat (load falls on all alike):
   ``sample_next_token`` at temperature 1 (the log-softmax it returns included), with top-p 0.9,
   and ``softmax`` + ``multinomial`` (unkeyed; no log-probs) and its top-p 0.9 as ``transformers``
   applies it, plus ``log_softmax`` alone (the floor every sampler that returns log-probs pays).
2. Exactness: ``--draws`` draws from one row of ``--exact-vocab`` tokens (a keyed draw per key;
   ``multinomial`` with replacement), the total-variation distance of each empirical distribution
   from the exact softmax and Pearson's chi-square (``V - 1 ± sqrt(2 (V - 1))`` for an exact sampler).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/sampler_speed.py              # CPU, one thread
    python benchmarks/sampler_speed.py --device cuda --json out.json  # a GPU (benchmarks/gpu_check.py calls run())
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

__all__ = ["run"]


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _top_p_multinomial(logits, top_p: float):
    """``transformers``' ``TopPLogitsWarper`` (ascending sort, mask the tail below ``1 - top_p``), then
    ``multinomial``: the unkeyed reference for the top-p row."""
    import torch

    sorted_logits, order = torch.sort(logits, descending=False)
    tail = sorted_logits.softmax(-1).cumsum(-1) <= (1 - top_p)
    tail[..., -1:] = False
    masked = logits.masked_fill(tail.scatter(1, order, tail), float("-inf"))
    return torch.multinomial(torch.softmax(masked, -1), 1)


def run(device: str = "cpu", batch: int = 64, vocab: int = 151_936, repeats: int = 5, draws: int = 200_000,
        exact_vocab: int = 1000) -> dict:
    """Both measurements on ``device``; returns a JSON-able dict (seconds, ratios, distances)."""
    import torch

    from llmgym.engines.sampling import row_keys, sample_next_token

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(batch, vocab, generator=g) * 3).to(device)
    keys = torch.tensor(row_keys(0, batch), device=device)
    positions = torch.zeros(batch, dtype=torch.long, device=device)
    variants = {
        "keyed (T=1)": lambda: sample_next_token(logits, keys, positions, 1.0, 1.0),
        "keyed (T=1, top-p 0.9)": lambda: sample_next_token(logits, keys, positions, 1.0, 0.9),
        "softmax + multinomial": lambda: torch.multinomial(torch.softmax(logits.float(), -1), 1),
        "top-p 0.9 as transformers + multinomial": lambda: _top_p_multinomial(logits.float(), 0.9),
        "log_softmax alone": lambda: torch.log_softmax(logits.float(), -1),
    }
    for fn in variants.values():  # warm-up (kernels, allocator)
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    load_before = _load()
    # one CPU thread: CPU time is what the work costs and holds on a loaded machine; a GPU: wall time
    clock = time.process_time if device == "cpu" else time.perf_counter
    for _ in range(repeats):
        for name, fn in variants.items():
            sync()
            t0 = clock()
            fn()
            sync()
            times[name].append(clock() - t0)
    speed = {k: round(statistics.median(v), 5) for k, v in times.items()}
    base = speed["softmax + multinomial"]
    ratios = {k: round(v / base, 3) for k, v in speed.items()}

    # exactness: one row, many keys (keyed) / many samples (multinomial)
    row = (torch.randn(exact_vocab, generator=g) * 2).to(device)
    exact = torch.softmax(row.double(), -1)
    chunk, counts = 50_000, torch.zeros(exact_vocab, dtype=torch.float64, device=device)
    for start in range(0, draws, chunk):
        n = min(chunk, draws - start)
        k = torch.tensor(row_keys(1, draws)[start:start + n], device=device)
        tok, _ = sample_next_token(row.expand(n, -1), k, torch.zeros(n, dtype=torch.long, device=device))
        counts += torch.bincount(tok, minlength=exact_vocab).double()
    gen = torch.Generator(device=device).manual_seed(1)
    multi = torch.multinomial(torch.softmax(row.float(), -1), draws, replacement=True, generator=gen)
    counts_multi = torch.bincount(multi, minlength=exact_vocab).double()

    def stats(c):
        freq = c / draws
        chi2 = ((c - draws * exact) ** 2 / (draws * exact)).sum().item()
        return {"tv_distance": round(0.5 * (freq - exact).abs().sum().item(), 5), "chi_square": round(chi2, 1)}

    return {
        "device": device, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "speed": {"batch": batch, "vocab": vocab, "repeats": repeats, "median_s": speed,
                  "clock": "process_time (CPU seconds)" if device == "cpu" else "perf_counter (wall)",
                  "ratio_to_softmax_multinomial": ratios},
        "exactness": {"vocab": exact_vocab, "draws": draws,
                      "chi_square_expected": f"{exact_vocab - 1} ± {round((2 * (exact_vocab - 1)) ** 0.5)}",
                      "keyed": stats(counts), "multinomial": stats(counts_multi)},
        "load_before": load_before, "load_after": _load(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--draws", type=int, default=200_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out = run(args.device, args.batch, args.vocab, args.repeats, args.draws)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
