"""What measuring the sampler-vs-learner mismatch costs per update, and the values it reads on CPU.

1. The measurement alone (``MismatchStats.add`` + ``result``) on log-prob tensors of a real batch's
   shape, with version lags.
2. A tiny GRPO update with and without it (the same batch, lr 0, interleaved repeats): the update's
   wall time, median of each.
3. Typical values on the tiny model: the HF engine against an fp32 learner, against a bf16-mixed
   learner, and the pipelined learner at max_staleness 2 (per version lag).

    python benchmarks/mismatch_cost.py --out benchmarks/results/mismatch_cost_cpu.json
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
import warnings

import torch


def measurement_cost(rows: int, width: int, repeats: int) -> float:
    from llmgym.agents.mismatch import MismatchStats

    g = torch.Generator().manual_seed(0)
    learner = -torch.rand(rows, width, generator=g) * 5
    sampler = learner + 1e-3 * torch.randn(rows, width, generator=g)
    mask = torch.rand(rows, width, generator=g) < 0.8
    lags = torch.randint(0, 3, (rows, width), generator=g)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        stats = MismatchStats()
        stats.add(learner, sampler, mask, lags)
        stats.result()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def update_cost(repeats: int) -> dict[str, float]:
    import gymnasium

    import llmgym  # noqa: F401
    from llmgym.agents import GRPO
    from llmgym.runtime.models import load_model

    model, tok = load_model("tiny")
    env = gymnasium.make("llmgym/Copy-v0", tokenizer=tok)
    agent = GRPO(model, tok, tasks_per_step=8, group_size=4, max_new_tokens=16, lr=0.0, kl_coef=0.0)
    batch = agent.collect(env)
    start = agent.learner._start_mismatch
    timings: dict[str, list[float]] = {"with": [], "without": []}
    for i in range(2 * repeats + 2):
        kind = "with" if i % 2 else "without"
        agent.learner._start_mismatch = start if kind == "with" else (
            lambda agent_, engine: setattr(agent.learner, "_mismatch", None))
        b = copy.deepcopy(batch)
        started = time.perf_counter()
        metrics = agent.update(b)
        elapsed = time.perf_counter() - started
        if i >= 2:  # the first pair warms up
            timings[kind].append(elapsed)
        assert ("mismatch_kl" in metrics) == (kind == "with")
    return {k: statistics.median(v) for k, v in timings.items()} | {"tokens": float(batch.action_mask.sum())}


def typical_values(steps: int) -> dict[str, dict[str, float]]:
    import gymnasium

    import llmgym  # noqa: F401
    from llmgym.agents import GRPO
    from llmgym.runtime.models import load_model

    out = {}
    for name, kw in (("hf engine, fp32 learner", {}), ("hf engine, bf16-mixed learner", {"precision": "bf16-mixed"})):
        model, tok = load_model("tiny")
        env = gymnasium.make("llmgym/Copy-v0", tokenizer=tok)
        agent = GRPO(model, tok, tasks_per_step=4, group_size=4, max_new_tokens=8, lr=1e-2, kl_coef=0.0, seed=1, **kw)
        rows = agent.learn(env, steps)
        out[name] = {k: statistics.mean(r[k] for r in rows) for k in ("mismatch_kl", "mismatch_kl_k1",
                                                                     "mismatch_prob_error")}
    model, tok = load_model("tiny")
    env = gymnasium.make("llmgym/Copy-v0", tokenizer=tok)
    agent = GRPO(model, tok, tasks_per_step=4, group_size=4, max_new_tokens=8, lr=1e-2, kl_coef=0.0, seed=1)
    rows = agent.learn(env, steps, max_staleness=2)
    keys = sorted({k for r in rows for k in r if k.startswith("mismatch")})
    out["pipelined, max_staleness 2, fp32"] = {k: statistics.mean(r[k] for r in rows if k in r) for k in keys}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    warnings.simplefilter("ignore")
    result = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    result["measurement_s"] = {f"{r}x{w}": measurement_cost(r, w, args.repeats) for r, w in ((64, 512), (256, 2048))}
    result["update_s"] = update_cost(args.repeats)
    result["typical"] = typical_values(args.steps)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
