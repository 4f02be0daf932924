"""Cost per check of the math scorers: math-verify (MathVerifier) and reasoning-gym (ReasoningGymVerifier).

Prints one JSON line per measurement: the median seconds per check over ``--repeats`` rounds of
``--n`` checks each, single calls (``verifier(task, completion)``) and, for math-verify, a batch
(``verify_batch(..., max_workers=2)``). The first call (worker start-up) is timed apart. Run it on
two checkouts, side by side, to compare (``--label`` names the side); report ``uptime`` with it.

    python benchmarks/scoring_cost.py --label after
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from llmgym import Task
from llmgym.envs.math import MathVerifier, ReasoningGymVerifier, reasoning_gym_task

# (gold, completion template): numbers, then expressions. {i} makes every completion new, as in RL:
# a repeated string would be answered from math-verify's caches where a worker keeps them.
MATH = [
    ("18", r"so the answer is \boxed{18}"),
    ("18", r"\boxed{{{i}}}"),
    (r"\frac{1}{2}", r"\boxed{{\frac{{{i}}}{{{j}}}}}"),
    (r"\sqrt{2}", r"\boxed{{2^{{1/2}} + {i} - {i}}}"),
    ("x^2 + 2x + 1", r"\boxed{{(x+1)^2 + {i} - {i}}}"),
]
RG = [("basic_arithmetic", None), ("countdown", None), ("polynomial_multiplication", None), ("spiral_matrix", None)]


def timed(fn, n: int, repeats: int) -> float:
    """Median over ``repeats`` rounds of the mean seconds of ``fn(k)``, k running on across rounds."""
    rounds, k = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(k)
            k += 1
        rounds.append((time.perf_counter() - t0) / n)
    return statistics.median(rounds)


def fill(template: str, k: int) -> str:
    return template.format(i=k + 3, j=2 * k + 6) if "{i}" in template else template


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []

    verifier = MathVerifier(time_limit=5.0)
    t0 = time.perf_counter()
    verifier(Task("q", answer="x"), r"\boxed{x + 1}")  # an expression: starts the worker
    rows.append({"what": "math-verify first call (start-up)", "s": time.perf_counter() - t0})
    for gold, template in MATH:
        task = Task("q", answer=gold)
        rows.append({"what": f"math-verify {gold!r} vs {fill(template, 0)!r}",
                     "s": timed(lambda k: verifier(task, fill(template, k)), args.n, args.repeats)})
    tasks = [Task("q", answer=g) for g, _ in MATH] * 4
    verifier.verify_batch(tasks[-2:], [fill(MATH[-1][1], 999)] * 2, max_workers=2)  # start the batch workers
    per = timed(lambda k: verifier.verify_batch(tasks, [fill(c, 1000 + 20 * k + n) for n, (_, c) in
                                                        enumerate(MATH * 4)], max_workers=2),
                1, args.repeats) / len(tasks)
    rows.append({"what": f"math-verify verify_batch of {len(tasks)}, 2 workers, per check", "s": per})
    verifier.close()

    rg = ReasoningGymVerifier(time_limit=5.0)
    first = True
    for dataset, _ in RG:
        task = reasoning_gym_task(dataset, seed=1)
        good = f"<answer>{task.answer}</answer>"
        if first:
            t0 = time.perf_counter()
            rg(task, good)
            rows.append({"what": "reasoning-gym first call (start-up)", "s": time.perf_counter() - t0})
            first = False
        rg(task, good)
        rows.append({"what": f"reasoning-gym {dataset}, right answer",
                     "s": timed(lambda k: rg(task, good), args.n, args.repeats)})
        rows.append({"what": f"reasoning-gym {dataset}, wrong answer",
                     "s": timed(lambda k: rg(task, f"<answer>{k}</answer>"), args.n, args.repeats)})

    load = os.getloadavg()
    for row in rows:
        print(json.dumps({"label": args.label, **row, "ms": round(row["s"] * 1000, 2),
                          "load": [round(x, 2) for x in load]}))


if __name__ == "__main__":
    main()
