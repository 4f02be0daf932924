"""Train RLOO on the Copy toy task with a tiny model on CPU: warm up, learn, compare held-out reward."""

import argparse

import gymnasium as gym

import llmgym  # noqa: F401
from llmgym.agents import RLOO
from llmgym.envs.toy import sample_tasks
from llmgym.engines import HFEngine, SamplingParams
from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer, supervised_warmup
from llmgym.rollout import evaluate
from llmgym.runtime.threads import set_torch_threads

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("steps", nargs="?", type=int, help="RL steps (default 40; 2 with --quick)")
parser.add_argument("--quick", action="store_true",
                    help="a seconds-long smoke run (what the tests run): 2 steps, 10 warm-up steps, 16 held-out tasks")
args = parser.parse_args()
steps = args.steps or (2 if args.quick else 40)
tokenizer = build_tokenizer()
model = build_tiny_model(tokenizer, TinyModelConfig(hidden_size=64, num_layers=2, intermediate_size=256))
set_torch_threads(model)  # 1 CPU thread for a tiny model (OMP_NUM_THREADS=N in the environment picks N)
supervised_warmup(model, tokenizer, [(t.prompt, t.answer) for t in sample_tasks("copy", 2000, seed=1)],
                  steps=10 if args.quick else 80)

env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
held_out = sample_tasks("copy", 16 if args.quick else 64, seed=999) * (1 if args.quick else 4)
sampling = SamplingParams(max_new_tokens=6)
before = evaluate(env, HFEngine(model, tokenizer), held_out, sampling, seed=3)["reward_mean"]
agent = RLOO(model, tokenizer, lr=1e-3, tasks_per_step=16, group_size=8, max_new_tokens=6)
history = agent.learn(env, steps=steps, progress=True)
after = evaluate(env, agent.engine, held_out, sampling, seed=3)["reward_mean"]
print(f"RLOO: held-out reward {before:.3f} -> {after:.3f} in {steps} steps")
