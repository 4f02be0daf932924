"""Learning: the newer group-policy presets (CISPO, SAPO, GDPO) raise the toy env's held-out reward.

Same recipe as tests/test_learning.py: a tiny model gets a short supervised warm-up on Copy, then
each preset trains for a bounded number of steps and the mean reward of sampled completions on a
fixed held-out Copy set must rise. CISPO and SAPO take two minibatches per batch, so the second
optimiser step sees ratios ≠ 1 and their clipped weight / soft gate actually act. GDPO trains on
Copy scored by a two-part verifier (positional match + exact match, a WeightedSum) — the
multi-reward case it is made for — and is judged on the plain Copy reward like the others.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest

import llmgym  # noqa: F401
from llmgym import SequenceEnv
from llmgym.agents import CISPO, GDPO, GRPO, SAPO
from llmgym.engines import HFEngine, SamplingParams
from llmgym.envs.toy import positional_match, sample_tasks
from llmgym.models import build_tiny_model, supervised_warmup
from llmgym.rollout import evaluate
from llmgym.verifiers import WeightedSum, exact_match

STEPS = 40
HELD_OUT = sample_tasks("copy", 64, seed=999) * 4
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=6)
COMMON = dict(lr=1e-3, tasks_per_step=8, group_size=4, max_new_tokens=6)
PRESETS = {
    "grpo": (GRPO, dict(kl_coef=0.0)),  # the reference the new presets are compared with
    # two optimiser steps per batch: half the step size of the on-policy agents
    "cispo": (CISPO, dict(minibatch_size=16, lr=5e-4)),
    "sapo": (SAPO, dict(minibatch_size=16, lr=5e-4)),
    "gdpo": (GDPO, dict(lr=5e-4)),
}
# Held-out gain (after − before; before = 0.693) measured with exactly this file's recipe, seeds
# 0 / 1 / 2, torch.set_num_threads(1) and (2), on a loaded shared 2-core machine:
#   cispo  threads 1: 0.063 0.057 0.048   threads 2: 0.063 0.057 0.048
#   sapo   threads 1: 0.072 0.066 0.047   threads 2: 0.072 0.066 0.047
#   gdpo   threads 1: 0.037 0.058 0.041   threads 2: 0.037 0.058 0.041
#   (grpo on-policy, lr 1e-3, for comparison, threads 1: 0.038 0.027)
# (1 and 2 threads gave identical trajectories here for this small model.) Spread 0.015-0.025 per
# preset; the margin sits 0.017 below the smallest gain measured (gdpo, seed 0, which this test runs).
MARGIN = 0.02


def two_part_copy_env(tokenizer):
    verifier = WeightedSum({"match": (1.0, positional_match), "exact": (1.0, exact_match)})
    return SequenceEnv(lambda rng: sample_tasks("copy", 1, seed=int(rng.integers(2**31)))[0], verifier, tokenizer)


def make_warm_base(tokenizer, tiny_config):
    model = build_tiny_model(tokenizer, tiny_config)
    pairs = [(t.prompt, t.answer) for t in sample_tasks("copy", 2000, seed=1)]
    supervised_warmup(model, tokenizer, pairs, steps=100, batch_size=32, lr=3e-3, seed=0)
    return model


def held_out_reward(model, tokenizer) -> float:
    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    return evaluate(env, HFEngine(model, tokenizer), HELD_OUT, SAMPLING, seed=3)["mean_reward"]


def train_and_score(name, warm_base, tokenizer, seed=0, steps=STEPS):
    """``(before, after)`` held-out reward of one preset trained from ``warm_base``."""
    cls, config = PRESETS[name]
    model = copy.deepcopy(warm_base)
    before = held_out_reward(model, tokenizer)
    agent = cls(model, tokenizer, **{**COMMON, "seed": seed, **config})
    env = two_part_copy_env(tokenizer) if name == "gdpo" else gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    history = agent.learn(env, steps=steps)
    assert len(history) == steps
    return before, held_out_reward(model, tokenizer)


@pytest.fixture(scope="module")
def warm_base(tokenizer, tiny_config):
    return make_warm_base(tokenizer, tiny_config)


@pytest.mark.parametrize("name", ["cispo", "sapo", "gdpo"])
def test_new_loss_preset_raises_held_out_reward(name, warm_base, tokenizer):
    before, after = train_and_score(name, warm_base, tokenizer)
    assert after > before + MARGIN, f"{name}: held-out reward {before:.3f} -> {after:.3f}"


def spread(seed: int):
    """The assertions of this file at agent seed ``seed`` (the test runs 0), as rows for
    ``benchmarks/learning_spread.py``: ``value`` is compared with ``bound``."""
    from conftest import tiny_shape

    from llmgym.models import build_tokenizer

    tokenizer = build_tokenizer()
    base = make_warm_base(tokenizer, tiny_shape())
    for name in ("cispo", "sapo", "gdpo"):
        before, after = train_and_score(name, base, tokenizer, seed=seed)
        yield {"check": f"test_new_loss_preset_raises_held_out_reward[{name}]", "value": after - before, "bound": MARGIN,
               "before": before, "after": after}
