"""Learning: on-policy distillation from a teacher the test trains brings a fresh student towards it.

The teacher is a tiny model after a long supervised warm-up on Copy (as the quickstart trains its
model); the student is another tiny model (other initial weights) after a short one. 50 steps of
:class:`~llmgym.agents.OnPolicyDistillation` (16 prompts × 4 samples, the env's reward unused) must
lower the reverse KL ``KL(π_S ‖ π_T)`` per token on the student's held-out samples by ``KL_MARGIN`` and
raise the held-out reward of its sampled completions by ``REWARD_MARGIN``: the teacher's log-probs alone
teach the task.

The margins are set against the spread over seeds × torch threads × CPU kernel families, measured with
``benchmarks/learning_spread.py --recipes distill`` and tabled in docs/benchmarks.md (re-measure there
after changing anything below).
"""

from __future__ import annotations

import copy

import gymnasium as gym

import llmgym  # noqa: F401
from llmgym.agents import OnPolicyDistillation
from llmgym.agents.distill import sampled_reverse_kl
from llmgym.engines import HFEngine, SamplingParams
from llmgym.envs.toy import sample_tasks
from llmgym.rollout import evaluate
from llmgym.runtime.models import TinyModelConfig, build_tiny_model, supervised_warmup

TEACHER_WARMUP = 200  # held-out reward ≈ 0.8
STUDENT_WARMUP = 40  # ≈ 0.24: far from the teacher
STEPS = 50
MAX_NEW_TOKENS = 6
CONFIG = dict(tasks_per_step=16, group_size=4, lr=1e-3, max_new_tokens=MAX_NEW_TOKENS)
HELD_OUT = sample_tasks("copy", 128, seed=999) * 2  # 256 sampled episodes
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW_TOKENS)
SEED = 0
REWARD_MARGIN = 0.05
KL_MARGIN = 0.3


def warm(tokenizer, shape: TinyModelConfig, steps: int, seed: int):
    model = build_tiny_model(tokenizer, TinyModelConfig(**{**shape.__dict__, "seed": seed}))
    pairs = [(t.prompt, t.answer) for t in sample_tasks("copy", 2000, seed=1)]
    supervised_warmup(model, tokenizer, pairs, steps=steps, batch_size=32, lr=3e-3, seed=seed)
    return model


def teacher_and_student(tokenizer, shape: TinyModelConfig):
    return warm(tokenizer, shape, TEACHER_WARMUP, seed=11), warm(tokenizer, shape, STUDENT_WARMUP, seed=0)


def held_out(model, teacher, tokenizer, seed: int = SEED) -> tuple[float, float]:
    """``(reward, reverse KL per token)`` of ``model``'s sampled completions on the held-out tasks (fixed keys)."""
    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    reward = evaluate(env, HFEngine(model, tokenizer), HELD_OUT, SAMPLING, seed=1000 + seed)["reward_mean"]
    prompts = [tokenizer.encode(t.prompt) for t in HELD_OUT]
    sampling = SamplingParams(n=1, temperature=1.0, max_new_tokens=MAX_NEW_TOKENS, seed=2000 + seed)
    done = [c for g in HFEngine(model, tokenizer).generate(prompts, sampling) for c in g]
    return reward, sampled_reverse_kl(done, HFEngine(teacher, tokenizer))


def distill(teacher, student, tokenizer, seed: int = SEED):
    """``((reward, kl) before, (reward, kl) after)`` of STEPS distillation steps of a copy of ``student``."""
    student = copy.deepcopy(student)
    before = held_out(student, teacher, tokenizer, seed)
    agent = OnPolicyDistillation(student, tokenizer, teacher=teacher, seed=seed, **CONFIG)
    assert len(agent.learn(gym.make("llmgym/Copy-v0", tokenizer=tokenizer), steps=STEPS)) == STEPS
    return before, held_out(student, teacher, tokenizer, seed)


def test_distillation_lowers_the_reverse_kl_and_raises_the_reward(tokenizer, tiny_config):
    teacher, student = teacher_and_student(tokenizer, tiny_config)
    (r0, kl0), (r1, kl1) = distill(teacher, student, tokenizer)
    assert kl1 < kl0 - KL_MARGIN, f"reverse KL {kl0:.3f} -> {kl1:.3f}"
    assert r1 > r0 + REWARD_MARGIN, f"held-out reward {r0:.3f} -> {r1:.3f}"


def spread(seed: int):
    """The assertions of this file at agent seed ``seed`` (the test runs ``SEED``), as rows for
    ``benchmarks/learning_spread.py``: ``value`` is compared with ``bound``."""
    from conftest import tiny_shape

    from llmgym.runtime.models import build_tokenizer

    tokenizer = build_tokenizer()
    teacher, student = teacher_and_student(tokenizer, tiny_shape())
    (r0, kl0), (r1, kl1) = distill(teacher, student, tokenizer, seed)
    check = "test_distillation_lowers_the_reverse_kl_and_raises_the_reward"
    yield {"check": f"{check}[kl]", "statistic": "reverse KL drop", "value": kl0 - kl1, "bound": KL_MARGIN,
           "before": kl0, "after": kl1}
    yield {"check": f"{check}[reward]", "value": r1 - r0, "bound": REWARD_MARGIN, "before": r0, "after": r1}
