"""The learning tests' recipe on Copy: a tiny model after a short supervised warm-up, and its held-out reward.

Shared by ``tests/learning/test_learning.py`` (each agent on this recipe), ``tests/engines/test_vllm.py`` and
``tests/engines/test_fleet.py`` (the same recipe with vLLM or a fleet of servers sampling the rollouts), and the
benchmarks that rerun it (``benchmarks/learning_spread.py``, ``benchmarks/async_speed.py``). Its numbers were
measured together with those tests' margins (their comments, docs/learning_tests.md): change one, re-measure.
"""

from __future__ import annotations

import gymnasium as gym

import llmgym  # noqa: F401  (registers the envs)
from llmgym.engines import HFEngine, SamplingParams
from llmgym.envs.toy import sample_tasks
from llmgym.runtime.models import build_tiny_model, supervised_warmup
from llmgym.rollout import evaluate

__all__ = ["BATCH", "HELD_OUT", "MAX_NEW_TOKENS", "SAMPLING", "SEED", "WARMUP_STEPS", "held_out_reward",
           "warm_model"]

WARMUP_STEPS = 80  # a shorter warm-up leaves more to learn: bigger, steadier gains than after 100
MAX_NEW_TOKENS = 6
# 16 prompts × 8 samples per step: a low-noise gradient, so the gain grows steadily with the steps
BATCH = dict(tasks_per_step=16, group_size=8)
HELD_OUT = sample_tasks("copy", 128, seed=999) * 4  # 512 samples: the held-out mean moves ≈ 0.01 by seed
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW_TOKENS)
SEED = 0


def warm_model(tokenizer, tiny_config, steps: int = WARMUP_STEPS):
    """A tiny model of shape ``tiny_config`` after ``steps`` supervised steps on Copy (it starts imperfect, not
    hopeless).

    Example:
        >>> from learning_recipe import warm_model
        >>> from llmgym.runtime.models import TinyModelConfig, build_tokenizer
        >>> model = warm_model(build_tokenizer(), TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64),
        ...                    steps=1)
        >>> model.config.num_hidden_layers
        1
    """
    model = build_tiny_model(tokenizer, tiny_config)
    pairs = [(t.prompt, t.answer) for t in sample_tasks("copy", 2000, seed=1)]
    supervised_warmup(model, tokenizer, pairs, steps=steps, batch_size=32, lr=3e-3, seed=0)
    return model


def held_out_reward(model, tokenizer, seed: int = SEED) -> float:
    """The mean reward of ``model``'s sampled completions on the fixed held-out set (``HELD_OUT``), sampled with
    :class:`~llmgym.engines.HFEngine` (the learner's own policy) and sampling seed ``1000 + seed``."""
    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    return evaluate(env, HFEngine(model, tokenizer), HELD_OUT, SAMPLING, seed=1000 + seed)["reward_mean"]
