"""Exact bias and weight spread of each off-policy correction, by enumeration (no sampling, no timing).

The setup of ``tests/agents/test_correction_bias.py``: a target policy ``p`` over every completion of
``L`` tokens from a ``V``-token vocabulary (autoregressive, random logits of scale 1.5) and a sampler
``q`` that differs as a real one does — bf16-rounded logits, the weights of k versions ago (each version
moved every logit by N(0, 0.08²)), top-p 0.8. The estimand is a policy-gradient-like per-position
term: for each position t, ``E_p[g(y_≤t)]`` with ``g`` a random function of the prefix in [-1, 1]
(``--functions`` of them per position); a correction estimates it by ``E_q[w_t · g]``. Printed, as a
markdown table: the mean |bias| over positions and functions, the weights' standard deviation under
``q`` (the variance the correction lets through) and the share of tokens truncated or masked.

    python benchmarks/correction_bias.py [--length 3] [--vocab 5] [--seeds 4]
"""

from __future__ import annotations

import argparse
import itertools
import math

import torch

from llmgym.agents import functional as F

KINDS = ["bf16", "stale1", "stale2", "stale4", "stale8", "top_p0.8"]
ESTIMATORS = ["none", "is", *F.CORRECTIONS]


def _logprobs(logits: dict, seqs: torch.Tensor, top_p: float | None = None) -> torch.Tensor:
    vocab = next(iter(logits.values())).numel()
    out = torch.empty(seqs.shape, dtype=torch.float64)
    for i, row in enumerate(seqs.tolist()):
        for t, token in enumerate(row):
            logp = torch.log_softmax(logits[tuple(row[:t])], -1)
            if top_p is not None:
                order = torch.argsort(logp, descending=True)
                before = torch.cumsum(logp[order].exp(), 0) - logp[order].exp()
                kept = torch.zeros(vocab, dtype=torch.bool)
                kept[order[before < top_p]] = True
                logp = torch.where(kept, logp - torch.logsumexp(logp[kept], 0), torch.full_like(logp, -math.inf))
            out[i, t] = logp[token]
    return out


def measure(kind: str, length: int, vocab: int, seed: int, functions: int) -> dict[str, dict[str, float]]:
    g = torch.Generator().manual_seed(seed)
    prefixes = [p for n in range(length) for p in itertools.product(range(vocab), repeat=n)]
    logits = {p: 1.5 * torch.randn(vocab, generator=g, dtype=torch.float64) for p in prefixes}
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=length)))
    target = _logprobs(logits, seqs)
    if kind == "bf16":
        sampler = _logprobs({p: z.to(torch.bfloat16).double() for p, z in logits.items()}, seqs)
    elif kind.startswith("stale"):
        k = int(kind[5:])
        drift = {p: 0.08 * torch.randn(vocab, generator=g, dtype=torch.float64) for p in logits}
        sampler = _logprobs({p: z - k * drift[p] for p, z in logits.items()}, seqs)
    else:
        sampler = _logprobs(logits, seqs, top_p=float(kind[5:]))
    p, q = target.sum(-1).exp(), sampler.sum(-1).exp()
    support = q > 0
    log_ratio = torch.where(support[:, None], target - sampler, torch.zeros_like(target))
    ones = torch.ones_like(log_ratio)
    # g_t: a random function of the prefix y_≤t, per position, `functions` of them
    codes = torch.stack([(seqs[:, :t + 1] * vocab ** torch.arange(t + 1)).sum(-1) for t in range(length)], -1)
    tables = 2 * torch.rand(functions, length, vocab ** length, generator=g, dtype=torch.float64) - 1
    gvals = torch.stack([tables[:, t, codes[:, t]] for t in range(length)], -1)  # [functions, N, L]
    truth = (p[None, :, None] * gvals).sum(1)  # [functions, L]
    out = {}
    for name in ESTIMATORS:
        shares = {"truncated": 0.0, "masked": 0.0}
        if name == "none":
            w = ones
        elif name == "is":
            w = torch.exp(log_ratio.sum(-1, keepdim=True)).expand_as(log_ratio)
        else:
            w, _ = F.correction_weights(name, log_ratio, ones)
            qs = q / q.sum()
            row_log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
            trunc = {"tis-token": log_ratio > math.log(2), "tis-seq": row_log_ratio > math.log(2)}
            if name in trunc:
                shares["truncated"] = float((qs[:, None] * trunc[name].double()).sum() / length)
            else:
                shares["masked"] = float((qs[:, None] * (w == 0).double()).sum() / length)
        w = torch.where(support[:, None], w, torch.zeros_like(w))
        est = (q[None, :, None] * w[None] * gvals).sum(1)
        mean_w = (q[:, None] * w).sum(0)
        std_w = torch.sqrt(((q[:, None] * w ** 2).sum(0) - mean_w ** 2).clamp(min=0)).mean()
        out[name] = {"bias": float((est - truth).abs().mean()), "std": float(std_w), **shares}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--functions", type=int, default=16)
    args = ap.parse_args(argv)
    print(f"V = {args.vocab}, L = {args.length}, mean over {args.seeds} seeds × {args.functions} functions per "
          f"position; each cell: mean |bias| / std of the weight under q / share of q's tokens truncated (t) or "
          f"masked (m) at the default bands\n")
    print("| sampler | " + " | ".join(ESTIMATORS) + " |")
    print("|---|" + "---|" * len(ESTIMATORS))
    for kind in KINDS:
        runs = [measure(kind, args.length, args.vocab, s, args.functions) for s in range(args.seeds)]
        cells = []
        for name in ESTIMATORS:
            avg = {k: sum(r[name][k] for r in runs) / len(runs) for k in ("bias", "std", "truncated", "masked")}
            share = (f" / t {avg['truncated']:.2f}" if avg["truncated"] else "") + \
                    (f" / m {avg['masked']:.2f}" if avg["masked"] else "")
            cells.append(f"{avg['bias']:.4f} / {avg['std']:.3f}{share}")
        print(f"| {kind} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
