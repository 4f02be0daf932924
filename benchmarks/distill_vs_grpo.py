"""On-policy distillation vs GRPO from the same student on the same env, in one run: reward against sampled tokens.

Usage (one command; CPU, a few minutes)::

    python benchmarks/distill_vs_grpo.py                       # 80 steps, the JSON and the plot in benchmarks/results/
    python benchmarks/distill_vs_grpo.py --steps 10 --every 5 --json /tmp/x.json --plot /tmp/x.png   # a smoke run

The recipe is ``tests/learning/test_learning_distill.py``'s: a teacher warmed up for 200 supervised steps on
Copy (held-out reward ≈ 0.8) and a student (other initial weights) warmed up for 40 (≈ 0.24). From that same
student, each arm samples 16 prompts × 4 completions per step (the same tokens budget per step) on
``llmgym/Copy-v0``:

* ``distill``: :class:`~llmgym.agents.OnPolicyDistillation` — the teacher's per-token reverse KL is the
  reward; the env's reward is not used (lr 3e-3, the learning test's);
* ``grpo lr=1e-3`` / ``grpo lr=3e-3``: GRPO on the env's reward (no KL), at the learning tests' step size and
  at the distillation arm's.

Every ``--every`` steps each arm's student is evaluated on the learning test's held-out set: the reward of
sampled completions (256 episodes, fixed keys) and the reverse KL to the teacher per token. The x axis is
the number of completion tokens the arm has sampled for training so far (evaluation samples not counted).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "learning"))

RESULTS = ROOT / "benchmarks" / "results"


def run(steps: int, every: int, seed: int) -> dict:
    import gymnasium as gym
    import torch

    import llmgym  # noqa: F401
    import test_learning_distill as recipe
    from conftest import tiny_shape
    from llmgym.agents import GRPO, OnPolicyDistillation
    from llmgym.runtime.models import build_tokenizer

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    tokenizer = build_tokenizer()
    started = time.perf_counter()
    teacher, student = recipe.teacher_and_student(tokenizer, tiny_shape())
    warmup_s = time.perf_counter() - started
    teacher_reward, _ = recipe.held_out(teacher, teacher, tokenizer, seed)
    batch = dict(tasks_per_step=16, group_size=4, max_new_tokens=recipe.MAX_NEW_TOKENS, seed=seed)
    arms = {
        "distill": lambda m: OnPolicyDistillation(m, tokenizer, teacher=teacher, lr=3e-3, **batch),
        "grpo lr=1e-3": lambda m: GRPO(m, tokenizer, lr=1e-3, kl_coef=0.0, **batch),
        "grpo lr=3e-3": lambda m: GRPO(m, tokenizer, lr=3e-3, kl_coef=0.0, **batch),
    }
    out: dict = {"teacher_held_out_reward": teacher_reward, "warmup_s": round(warmup_s, 1), "arms": {}}
    for name, make in arms.items():
        model = copy.deepcopy(student)
        agent = make(model)
        env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
        reward, kl = recipe.held_out(model, teacher, tokenizer, seed)
        curve = [{"step": 0, "tokens": 0, "held_out_reward": reward, "reverse_kl": kl}]
        tokens, train_s = 0, 0.0
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            row = agent.learn(env, steps=1)[0]
            train_s += time.perf_counter() - t0
            tokens += int(row["tokens_sampled"])
            if step % every == 0 or step == steps:
                reward, kl = recipe.held_out(model, teacher, tokenizer, seed)
                curve.append({"step": step, "tokens": tokens, "held_out_reward": reward, "reverse_kl": kl})
                print(f"{name:14s} step {step:3d} tokens {tokens:6d} held-out reward {reward:.3f} "
                      f"reverse KL {kl:.3f}  (load {os.getloadavg()[0]:.1f})", flush=True)
        out["arms"][name] = {"curve": curve, "train_s": round(train_s, 1),
                             "final_held_out_reward": curve[-1]["held_out_reward"],
                             "final_reverse_kl": curve[-1]["reverse_kl"]}
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name, arm in result["arms"].items():
        xs = [p["tokens"] for p in arm["curve"]]
        left.plot(xs, [p["held_out_reward"] for p in arm["curve"]], marker="o", label=name)
        right.plot(xs, [p["reverse_kl"] for p in arm["curve"]], marker="o", label=name)
    left.axhline(result["teacher_held_out_reward"], color="grey", linestyle="--", label="teacher")
    left.set(xlabel="completion tokens sampled for training", ylabel="held-out reward (sampled)",
             title="reward vs sampled tokens")
    right.set(xlabel="completion tokens sampled for training", ylabel="KL(student ‖ teacher) per token",
              title="reverse KL to the teacher")
    left.legend()
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--every", type=int, default=10, help="evaluate every N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=str(RESULTS / "distill_vs_grpo_cpu.json"))
    parser.add_argument("--plot", default=str(RESULTS / "distill_vs_grpo_cpu.png"))
    args = parser.parse_args()
    load = os.getloadavg()[0]
    started = time.perf_counter()
    result = run(args.steps, args.every, args.seed)
    import torch

    result = {"benchmark": "distill_vs_grpo", "env": "llmgym/Copy-v0", "steps": args.steps, "seed": args.seed,
              "samples_per_step": 64, "torch_threads": torch.get_num_threads(),
              "machine": platform.processor() or platform.machine(), "load_before": round(load, 1),
              "load_after": round(os.getloadavg()[0], 1), "wall_s": round(time.perf_counter() - started, 1), **result}
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    plot(result, Path(args.plot))
    print(f"wrote {args.json} and {args.plot}")


if __name__ == "__main__":
    main()
