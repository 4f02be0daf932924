"""Train REINFORCE on the Copy toy task with a tiny model on CPU: warm up, learn, compare held-out reward."""

import sys

import gymnasium as gym

import llmgym  # noqa: F401
from llmgym.agents import REINFORCE
from llmgym.envs.toy import sample_tasks
from llmgym.engines import HFEngine, SamplingParams
from llmgym.models import TinyModelConfig, build_tiny_model, build_tokenizer, supervised_warmup
from llmgym.rollout import evaluate

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
tokenizer = build_tokenizer()
model = build_tiny_model(tokenizer, TinyModelConfig(hidden_size=64, num_layers=2, intermediate_size=256))
supervised_warmup(model, tokenizer, [(t.prompt, t.answer) for t in sample_tasks("copy", 2000, seed=1)], steps=100)

env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
held_out = sample_tasks("copy", 64, seed=999) * 4
sampling = SamplingParams(max_new_tokens=6)
before = evaluate(env, HFEngine(model, tokenizer), held_out, sampling, seed=3)["mean_reward"]
agent = REINFORCE(model, tokenizer, lr=1e-3, tasks_per_step=32, max_new_tokens=6)
history = agent.learn(env, steps=steps, progress=True)
after = evaluate(env, agent.engine, held_out, sampling, seed=3)["mean_reward"]
print(f"REINFORCE: held-out reward {before:.3f} -> {after:.3f} in {steps} steps")
