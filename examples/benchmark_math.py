"""A math benchmark from Python: pass@k and mean reward of a model on a math env.

    python examples/benchmark_math.py [--env llmgym/RG-basic_arithmetic-v0] [--model tiny] [--tasks 8] [--samples 4]

The tiny random model scores about 0; point --model at a real checkpoint directory to measure one.
"""

import argparse

import gymnasium as gym

import llmgym  # noqa: F401
from llmgym.engines import HFEngine, SamplingParams
from llmgym.runtime.metrics import pass_at_k, reward_interval
from llmgym.runtime.models import load_model
from llmgym.rollout.episodes import collect_episodes
from llmgym.runtime.threads import set_torch_threads

parser = argparse.ArgumentParser()
parser.add_argument("--env", default="llmgym/Arithmetic-v0")
parser.add_argument("--model", default="tiny")
parser.add_argument("--tasks", type=int, default=8)
parser.add_argument("--samples", type=int, default=4)
args = parser.parse_args()

model, tokenizer = load_model(args.model)
set_torch_threads(model)  # 1 CPU thread for a tiny model (OMP_NUM_THREADS=N in the environment picks N)
env = gym.make(args.env, tokenizer=tokenizer)
episodes, stats = collect_episodes(env, HFEngine(model, tokenizer), num_tasks=args.tasks, group_size=args.samples,
                                   sampling=SamplingParams(temperature=1.0, max_new_tokens=32), seed=0)
groups = [episodes[g * args.samples:(g + 1) * args.samples] for g in range(args.tasks)]
passes = [sum(e.total_reward >= 1.0 for e in group) for group in groups]
means = [sum(e.total_reward for e in group) / args.samples for group in groups]  # one observation per task
# Wilson when every reward is 0/1, else a bootstrap over tasks: either way inside the reward's range
low, high, method = reward_interval(means, pass_fail=all(e.total_reward in (0.0, 1.0) for e in episodes))
for k in sorted({1, args.samples}):
    print(f"pass@{k}: {sum(pass_at_k(args.samples, c, k) for c in passes) / args.tasks:.3f}")
print(f"mean reward: {sum(means) / args.tasks:.3f} [{low:.3f}, {high:.3f}] (95% CI over {args.tasks} tasks, {method}); "
      f"sampling {stats['tokens_per_s']:.0f} tokens/s, verification {stats['verify_s']:.2f} s")
