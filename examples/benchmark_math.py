"""A math benchmark from Python: pass@k and mean reward of a model on a math env.

    python examples/benchmark_math.py [--env llmgym/RG-basic_arithmetic-v0] [--model tiny] [--tasks 8] [--samples 4]

The tiny random model scores about 0; point --model at a real checkpoint directory to measure one.
"""

import argparse

import gymnasium as gym

import llmgym  # noqa: F401
from llmgym.engines import HFEngine, SamplingParams
from llmgym.metrics import mean_confidence_interval, pass_at_k
from llmgym.models import load_model
from llmgym.rollout import collect_episodes

parser = argparse.ArgumentParser()
parser.add_argument("--env", default="llmgym/Arithmetic-v0")
parser.add_argument("--model", default="tiny")
parser.add_argument("--tasks", type=int, default=8)
parser.add_argument("--samples", type=int, default=4)
args = parser.parse_args()

model, tokenizer = load_model(args.model)
env = gym.make(args.env, tokenizer=tokenizer)
episodes, stats = collect_episodes(env, HFEngine(model, tokenizer), num_tasks=args.tasks, group_size=args.samples,
                                   sampling=SamplingParams(temperature=1.0, max_new_tokens=32), seed=0)
passes = [sum(e.total_reward >= 1.0 for e in episodes[g * args.samples:(g + 1) * args.samples]) for g in range(args.tasks)]
mean, half_width = mean_confidence_interval([e.total_reward for e in episodes])
for k in sorted({1, args.samples}):
    print(f"pass@{k}: {sum(pass_at_k(args.samples, c, k) for c in passes) / args.tasks:.3f}")
print(f"mean reward: {mean:.3f} ± {half_width:.3f} (95% CI), {stats['tokens_per_s']:.0f} tokens/s")
