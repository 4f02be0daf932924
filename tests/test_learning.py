"""Learning: each agent raises a toy env's held-out reward on a tiny model on CPU.

The tiny model first gets a short supervised warm-up on Copy (it starts imperfect, not hopeless);
then each agent trains for a bounded number of steps, and the mean reward of sampled completions
on a fixed held-out set must rise by a clear margin.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest

import llmgym  # noqa: F401
from llmgym.agents import DAPO, GRPO, PPO, REINFORCE, RLOO
from llmgym.envs.toy import sample_tasks
from llmgym.engines import HFEngine, SamplingParams
from llmgym.models import build_tiny_model, supervised_warmup
from llmgym.rollout import evaluate

STEPS = 60
MARGIN = 0.03
MAX_NEW_TOKENS = 6
HELD_OUT = sample_tasks("copy", 128, seed=999) * 4
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW_TOKENS)
AGENTS = [
    (REINFORCE, dict(lr=1e-3, tasks_per_step=32)),
    (RLOO, dict(lr=1e-3)),
    (PPO, dict(lr=5e-4)),
    (GRPO, dict(lr=1e-3, kl_coef=0.0)),
    (DAPO, dict(lr=1e-3)),
]


WARMUP_STEPS = 100


def warm_model(tokenizer, tiny_config, steps: int = WARMUP_STEPS):
    model = build_tiny_model(tokenizer, tiny_config)
    pairs = [(t.prompt, t.answer) for t in sample_tasks("copy", 2000, seed=1)]
    supervised_warmup(model, tokenizer, pairs, steps=steps, batch_size=32, lr=3e-3, seed=0)
    return model


def held_out_reward(model, tokenizer, seed: int = 0) -> float:
    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    return evaluate(env, HFEngine(model, tokenizer), HELD_OUT, SAMPLING, seed=1000 + seed)["mean_reward"]


@pytest.fixture(scope="module")
def warm_base(tokenizer, tiny_config):
    return warm_model(tokenizer, tiny_config)


@pytest.mark.parametrize("cls, config", AGENTS, ids=lambda x: getattr(x, "name", ""))
def test_agent_raises_held_out_reward(cls, config, warm_base, tokenizer):
    model = copy.deepcopy(warm_base)
    before = held_out_reward(model, tokenizer)
    agent = cls(model, tokenizer, max_new_tokens=MAX_NEW_TOKENS, seed=0, **config)
    history = agent.learn(gym.make("llmgym/Copy-v0", tokenizer=tokenizer), steps=STEPS)
    after = held_out_reward(model, tokenizer)
    assert len(history) == STEPS
    assert after > before + MARGIN, f"{cls.name}: held-out reward {before:.3f} -> {after:.3f}"
