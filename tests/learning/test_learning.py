"""Learning: each agent raises a toy env's held-out reward on a tiny model on CPU.

The tiny model first gets a short supervised warm-up on Copy (it starts imperfect, not hopeless);
then each agent trains for a bounded number of steps, and the mean reward of sampled completions on
a fixed held-out set must rise by a clear margin.

A seeded run repeats exactly on one machine but not on another: CPU kernels differ, and a small
model's RL trajectory amplifies the rounding (torch's thread count changes kernels too). So the
margin is set against the spread of the improvement measured over seeds and thread counts, with
``benchmarks/learning_spread.py`` (which imports this file's recipe): every agent's smallest measured
improvement is well above ``MARGIN``. The table of the spread (seeds × threads × CPU kernel families)
is in docs/learning_tests.md; re-measure with ``python benchmarks/learning_spread.py --recipes learning``
after changing anything below.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest

import llmgym  # noqa: F401
from llmgym.agents import DAPO, GRPO, PPO, REINFORCE, RLOO

# the warm-up, batch and held-out set, shared with the vLLM and fleet learning tests (tests/ is on sys.path)
from learning_recipe import BATCH, MAX_NEW_TOKENS, SEED, WARMUP_STEPS, held_out_reward, warm_model  # noqa: F401

STEPS = 40
MARGIN = 0.05
# Held-out improvement after STEPS, measured with benchmarks/learning_spread.py over agent seeds 0-3
# × torch threads 1 and 2 (8 runs per agent, 2026-11-26, 2-core machine; re-measured after the learner
# moved to agents/learner.py): min..max (mean). Seeds move
# it by up to 0.06; 1 vs 2 threads by 0 (same kernels at this size) to 0.04 (PPO). The smallest gain
# measured, 0.081, is 1.6× MARGIN. The old recipe (100 warm-up steps, 8 prompts × 4, 60 steps, margin
# 0.03) measured +0.003..+0.076 over seeds 0-3 on one thread, and failed on other machines.
AGENTS = [
    (REINFORCE, dict(lr=1e-3)),  # +0.109..+0.139 (0.119); threads: identical
    (RLOO, dict(lr=1e-3)),  # +0.081..+0.127 (0.108); threads: ≤ 0.012 apart
    # PPO's default minibatches of 8 make 32 noisy optimiser steps per batch of 128: same seed, 1 vs 2
    # threads ended 0.022 vs 0.108 after 40 steps. Minibatches of 32 (8 steps per batch) are steady.
    (PPO, dict(lr=5e-4, minibatch_size=32)),  # +0.133..+0.162 (0.148); threads: ≤ 0.028 apart
    (GRPO, dict(lr=1e-3, kl_coef=0.0)),  # +0.091..+0.121 (0.108); threads: identical (re-measured on the merged learner, 2026-11-26, threads 1: +0.078..+0.138)
    (DAPO, dict(lr=1e-3)),  # +0.096..+0.115 (0.103); threads: identical
]


def train(cls, config, model, tokenizer, seed: int = SEED, steps: int = STEPS, correct_staleness: bool = True,
          **learn):
    """``cls`` trained ``steps`` steps on Copy; ``learn`` goes to ``learn`` (``max_staleness=K``: pipelined,
    with its correction unless ``correct_staleness`` is false)."""
    agent = cls(model, tokenizer, max_new_tokens=MAX_NEW_TOKENS, seed=seed, **{**BATCH, **config})
    agent.learner.correct_staleness = correct_staleness
    return agent.learn(gym.make("llmgym/Copy-v0", tokenizer=tokenizer), steps=steps, **learn)


@pytest.fixture(scope="module")
def warm_base(tokenizer, tiny_config):
    model = warm_model(tokenizer, tiny_config)
    return model, held_out_reward(model, tokenizer)  # every agent starts from this model and score


@pytest.mark.parametrize("cls, config", AGENTS, ids=lambda x: getattr(x, "name", ""))
def test_agent_raises_held_out_reward(cls, config, warm_base, tokenizer):
    base, before = warm_base
    model = copy.deepcopy(base)
    history = train(cls, config, model, tokenizer)
    after = held_out_reward(model, tokenizer)
    assert len(history) == STEPS
    assert after > before + MARGIN, f"{cls.name}: held-out reward {before:.3f} -> {after:.3f}"


# The pipelined learner (llmgym.agents.pipeline): GRPO with the same recipe and margin, every batch
# after the first K sampled by the weights of K updates ago and importance-weighted. Measured with
# `benchmarks/learning_spread.py --agents grpo --max-staleness K [--no-correction]` over seeds 0-3 ×
# torch threads 1 and 2 (8 runs per K, 2026-11-26, 2-core machine, load 2-7 from other jobs):
#   K=1: +0.081..+0.104 (0.093); threads ≤ 0.001 apart.  K=2: +0.074..+0.117 (0.095); threads ≤ 0.003 apart.
# The smallest gain, 0.074, is 1.5× MARGIN (synchronous GRPO, measured the same day with the same script,
# threads 1: +0.078..+0.138 (0.103)).
# Without the correction: K=1 +0.069..+0.110 (0.089; threads 1 only); K=2 -0.005..+0.057 (0.032).
PIPELINED = [1, 2]
# Without the correction, stale batches are not reweighted: the test checks that the switch acts (the
# runs are identical up to the first stale batch and part there). It no longer asserts that the
# correction keeps the learner nearer the weights that sample its batches: ``late_drift``
# (uncorrected / corrected, K=2) was 2.06..2.93 on older numerics, but on this code 1.05 (AVX2
# kernels, seed 0), 1.24..2.49 (seeds 0-2), and over all 38 stale steps 0.84..1.85 — not a stable
# effect of the correction on this recipe (docs/learning_tests.md; the spread still records it).
UNCORRECTED_STEPS = 4  # enough to see the first stale batch (step 2) handled without the correction


def late_drift(history, last: int = 10) -> float:
    """Mean ``behaviour_log_ratio_abs`` of the last ``last`` steps: how far, per token, the weights being
    updated are from the stale weights that sampled the batch."""
    return sum(row["behaviour_log_ratio_abs"] for row in history[-last:]) / last


@pytest.fixture(scope="module")
def staleness_runs(warm_base, tokenizer):
    """``run(K, correct)`` → ``(history, held-out reward after)``, each run trained once per module."""
    runs = {}

    def run(max_staleness: int, correct: bool = True):
        if (max_staleness, correct) not in runs:
            model = copy.deepcopy(warm_base[0])
            history = train(GRPO, dict(AGENTS)[GRPO], model, tokenizer, correct_staleness=correct,
                            max_staleness=max_staleness)
            runs[max_staleness, correct] = history, held_out_reward(model, tokenizer)
        return runs[max_staleness, correct]

    return run


@pytest.mark.parametrize("max_staleness", PIPELINED, ids=lambda k: f"K={k}")
def test_pipelined_grpo_raises_held_out_reward(max_staleness, warm_base, staleness_runs):
    before = warm_base[1]
    history, after = staleness_runs(max_staleness)
    assert len(history) == STEPS
    # it really trained on stale samples, reweighted: K updates old from step K + 1 on
    assert all(row["staleness_max"] == max_staleness and row["is_corrected"] == 1.0 for row in history[max_staleness:])
    assert after > before + MARGIN, f"GRPO, max_staleness={max_staleness}: held-out reward {before:.3f} -> {after:.3f}"


def test_without_the_correction_stale_batches_are_not_reweighted(staleness_runs, warm_base, tokenizer):
    corrected, _ = staleness_runs(2, correct=True)
    uncorrected = train(GRPO, dict(AGENTS)[GRPO], copy.deepcopy(warm_base[0]), tokenizer, steps=UNCORRECTED_STEPS,
                        correct_staleness=False, max_staleness=2)
    assert [row["staleness_max"] for row in uncorrected] == [0, 1, 2, 2]  # stale batches from step 2 on
    assert all(row["is_corrected"] == 0.0 for row in uncorrected)
    # same weights, same first batch: the runs part where the correction first applies (step 2's batch is stale)
    assert corrected[0]["loss"] == uncorrected[0]["loss"] and corrected[1]["loss"] != uncorrected[1]["loss"]


def spread(seed: int):
    """This file's assertions at agent seed ``seed``, as rows for ``benchmarks/learning_spread.py``: each row's
    ``value`` is what a test compares with its ``bound`` (the test runs ``seed=SEED``)."""
    from conftest import tiny_shape

    from llmgym.runtime.models import build_tokenizer

    tokenizer = build_tokenizer()
    base = warm_model(tokenizer, tiny_shape())
    before = held_out_reward(base, tokenizer, seed)
    runs = {}
    for cls, config in AGENTS:
        model = copy.deepcopy(base)
        train(cls, config, model, tokenizer, seed=seed)
        after = held_out_reward(model, tokenizer, seed)
        yield {"check": f"test_agent_raises_held_out_reward[{cls.name}]", "value": after - before, "bound": MARGIN,
               "before": before, "after": after}
    for max_staleness, correct in [(k, True) for k in PIPELINED] + [(2, False)]:
        model = copy.deepcopy(base)
        history = train(GRPO, dict(AGENTS)[GRPO], model, tokenizer, seed=seed, correct_staleness=correct,
                        max_staleness=max_staleness)
        runs[max_staleness, correct] = history
        if correct:
            after = held_out_reward(model, tokenizer, seed)
            yield {"check": f"test_pipelined_grpo_raises_held_out_reward[K={max_staleness}]", "value": after - before,
                   "bound": MARGIN, "before": before, "after": after}
    # not asserted (see UNCORRECTED_STEPS): the spread of the statistic the suite used to assert, > 1.4
    drift = late_drift(runs[2, True]), late_drift(runs[2, False])
    yield {"check": "late drift, uncorrected / corrected, K=2 (not asserted)", "value": drift[1] / drift[0],
           "bound": 1.4, "statistic": "ratio", "before": drift[0], "after": drift[1]}
