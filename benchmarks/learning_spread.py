"""Spread of the learning tests' improvement across seeds and torch thread counts.

A tiny model's RL trajectory repeats exactly on one machine but not across machines (CPU kernels
differ). Different ``torch.set_num_threads`` values use different kernels too, so running the
learning check under 1 and 2 threads and several seeds shows how much the held-out improvement moves:
``tests/test_learning.py`` asserts a margin that this spread cannot eat.

    python benchmarks/learning_spread.py --threads 1 --seeds 0 1 2 3
    python benchmarks/learning_spread.py --threads 2 --seeds 0 1 2 3
    python benchmarks/learning_spread.py --recipe test_learning_tools --threads 1 --seeds 0 1 2   # the tool task
    python benchmarks/learning_spread.py --engine vllm --threads 1   # tests/test_vllm.py's recipe
    python benchmarks/learning_spread.py --engine fleet --server URL1 --server URL2   # tests/test_fleet.py's
    python benchmarks/learning_spread.py --max-staleness 2 --agents grpo   # the pipelined learner (K = 2)
    python benchmarks/learning_spread.py --max-staleness 2 --agents grpo --no-correction   # without its correction

``--engine vllm`` measures the vLLM learning test instead: its agents and model shape (head size 32),
every rollout sampled by an in-process ``VLLMEngine`` with the weights synced after every update.
``--engine fleet`` measures ``tests/test_fleet.py``'s learning test: the same recipe with every rollout
from the ``llmgym serve`` servers at ``--server`` (started for a model of ``VLLM_SHAPE``; the weights
are pushed to them, so their own checkpoint does not matter).
``--recipe`` names another learning test whose recipe (agents, steps, held-out set, ``make_env``) to run.

One JSON line per (agent, seed, step checkpoint): held-out reward before/after, improvement, and the
process CPU seconds the training took (wall time is meaningless on a shared machine).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="test_learning",
                        help="the learning test whose recipe to run (a module in tests/; default test_learning)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--agents", nargs="+", default=None, help="agent names (default: all in the test)")
    parser.add_argument("--checkpoints", type=int, nargs="+", default=None,
                        help="step counts at which to evaluate (default: the test's STEPS)")
    parser.add_argument("--warmup-steps", type=int, default=None, help="default: the test's WARMUP_STEPS")
    parser.add_argument("--lr-scale", type=float, default=1.0, help="multiply every agent's lr")
    parser.add_argument("--engine", choices=("hf", "vllm", "fleet"), default="hf",
                        help="hf: tests/test_learning.py's recipe; vllm: tests/test_vllm.py's (vLLM rollouts); fleet: "
                             "tests/test_fleet.py's (rollouts from the servers at --server)")
    parser.add_argument("--server", action="append", default=[], metavar="URL",
                        help="--engine fleet: a rollout server (llmgym serve) to sample from (repeatable)")
    parser.add_argument("--max-staleness", type=int, default=None, metavar="K",
                        help="train with the pipelined learner, batches K updates stale (default: synchronous)")
    parser.add_argument("--no-correction", action="store_true",
                        help="with --max-staleness: do not reweight stale tokens (to measure what the correction does)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override an agent config field for every agent (repeatable)")
    args = parser.parse_args()
    if (args.engine == "fleet") != bool(args.server):
        parser.error("--engine fleet samples from the servers given with --server URL (and only it takes them)")
    if args.no_correction and args.max_staleness is None:
        parser.error("--no-correction turns off the pipelined learner's correction: pass --max-staleness K too")
    os.environ["LLMGYM_TEST_THREADS"] = str(args.threads)  # tests/conftest.py (imported by test_vllm) reads it
    torch.set_num_threads(args.threads)

    import importlib

    import gymnasium as gym

    recipe = importlib.import_module(args.recipe)  # the learning test's own recipe (agents, steps, held-out set)
    make_env = getattr(recipe, "make_env", lambda tok: gym.make("llmgym/Copy-v0", tokenizer=tok))
    from llmgym.models import TinyModelConfig, build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer()
    started = time.process_time()
    shape = TinyModelConfig(hidden_size=64, num_layers=2, intermediate_size=256)
    agents = recipe.AGENTS
    if args.engine in ("vllm", "fleet"):
        import test_vllm

        shape, agents = test_vllm.VLLM_SHAPE, test_vllm.VLLM_AGENTS
    base = recipe.warm_model(tokenizer, shape, args.warmup_steps or recipe.WARMUP_STEPS)
    print(json.dumps({"warmup_cpu_s": round(time.process_time() - started, 2), "threads": args.threads,
                      "engine": args.engine}), flush=True)
    checkpoints = args.checkpoints or [recipe.STEPS]
    for cls, config in agents:
        if args.agents and cls.name not in args.agents:
            continue
        overrides = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
        config = {**recipe.BATCH, **config, **overrides, "lr": config["lr"] * args.lr_scale}
        for seed in args.seeds:
            model = copy.deepcopy(base)
            before = recipe.held_out_reward(model, tokenizer, seed)
            engine = None
            if args.engine == "vllm":
                engine = test_vllm.make_engine(model, tokenizer)
            elif args.engine == "fleet":
                from llmgym.engines.fleet import FleetEngine

                engine = FleetEngine(args.server, tokenizer, model)
            agent = cls(model, tokenizer, max_new_tokens=recipe.MAX_NEW_TOKENS, seed=seed, engine=engine, **config)
            env = make_env(tokenizer)
            cpu, wall, done, history = 0.0, 0.0, 0, []
            agent.learner.correct_staleness = not args.no_correction
            for target in checkpoints:
                started, started_wall = time.process_time(), time.perf_counter()
                pipelined = {} if args.max_staleness is None else {"max_staleness": args.max_staleness}
                history += agent.learn(env, steps=target - done, **pipelined)
                cpu += time.process_time() - started
                wall += time.perf_counter() - started_wall
                done = target
                after = recipe.held_out_reward(model, tokenizer, seed)
                row = {"agent": cls.name, "engine": args.engine, "threads": args.threads, "seed": seed,
                       "max_staleness": args.max_staleness, "correction": not args.no_correction,
                       "steps": target, "lr": config["lr"], "before": round(before, 4),
                       "after": round(after, 4), "gain": round(after - before, 4),
                       "train_cpu_s": round(cpu, 2), "train_wall_s": round(wall, 1)}
                if args.max_staleness:  # how far the learner is from the weights that sampled its batches, late
                    row["late_drift"] = round(recipe.late_drift(history), 4)
                print(json.dumps(row), flush=True)
            if engine is not None:
                engine.close()


if __name__ == "__main__":
    main()
