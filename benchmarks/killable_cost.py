"""Cost per call of the killable child (``llmgym.sandbox.killable.call_in_killable_child``): this checkout's
module against another version of it (``--other FILE``, e.g. ``git show main:llmgym/sandbox/killable.py >
/tmp/old.py``), loaded side by side in one process and called alternately, so both see the same load.

Prints one JSON line per side and caller size: the median and quartiles of the seconds per trivial call
(``int(1)``), over ``--n`` calls per side. ``--ballast-mb`` gives the caller that much touched memory first
(a trainer is big: a fork copies its page tables). Report ``uptime`` with it.

    git show main:llmgym/sandbox/killable.py > /tmp/killable_main.py
    python benchmarks/killable_cost.py --other /tmp/killable_main.py --n 150 --ballast-mb 0 1024 [--this-mode user-namespace]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import time

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "llmgym", "sandbox", "killable.py")


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", required=True, help="another killable.py to compare with")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--ballast-mb", type=int, nargs="+", default=[0])
    parser.add_argument("--out", help="append the JSON lines to this file")
    parser.add_argument("--this-mode", choices=["auto", "user-namespace", "no-namespace"], default="auto",
                        help="this side's containment: as probed, the keeper's user + PID namespace (the way "
                             "without root), or no namespace (the keeper's subreaper and a cgroup)")
    args = parser.parse_args()
    sides = {"this": load(HERE, "killable_this"), "other": load(args.other, "killable_other")}
    this = sides["this"]
    if args.this_mode != "auto":
        this._namespace_modes[os.getpid()] = (
            this._CLONE_NEWUSER | this._CLONE_NEWPID | this._CLONE_NEWNS if args.this_mode == "user-namespace" else None)
    ballast = []
    for mb in sorted(args.ballast_mb):
        while len(ballast) < mb:
            ballast.append(bytearray(1 << 20))  # touched: zero-filled on allocation
        times: dict[str, list[float]] = {name: [] for name in sides}
        for module in sides.values():  # warm-up: probes (namespace, cgroup) happen once per process
            assert module.call_in_killable_child(int, 1, limit=60).status == "ok"
        for _ in range(args.n):
            for name, module in sides.items():
                t0 = time.perf_counter()
                outcome = module.call_in_killable_child(int, 1, limit=60)
                times[name].append(time.perf_counter() - t0)
                assert outcome.status == "ok", outcome
        for name, values in times.items():
            q = statistics.quantiles(values, n=4)
            line = {"side": name, "ballast_mb": mb, "n": args.n, "median_s": statistics.median(values),
                    "q1_s": q[0], "q3_s": q[2], "load": os.getloadavg(), "machine": platform.machine(),
                    "kernel": platform.release(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "mode": str(getattr(sides[name], "_call_namespace", lambda: "(none: the old child)")())}
            print(json.dumps(line))
            if args.out:
                with open(args.out, "a") as fh:
                    fh.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
