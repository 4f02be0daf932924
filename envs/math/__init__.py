"""Math tasks: a math-verify answer checker, procedural arithmetic, GSM8K/MATH files, reasoning-gym.

* :class:`MathVerifier` — answer equivalence with math-verify (extraction rules and gold
  normalisation in :mod:`llmgym.envs.math.answer_extraction`, what a question asks of an answer's form and
  the units it may carry in :mod:`llmgym.envs.math.answer_forms`, one spelling for text, fonts, spaces and
  percent words in :mod:`llmgym.envs.math.answer_text`), batchable in worker processes with a time
  limit;
  :class:`ThinkAnswerFormat` and :func:`math_reward` for ``<think>…</think><answer>…</answer>``.
* ``llmgym/Arithmetic-v0`` (:func:`arithmetic_env`), ``llmgym/GSM8K-v0`` / ``llmgym/MATH-v0``
  (:func:`gsm8k_env`, :func:`math_env` over :func:`load_gsm8k`, :func:`load_math`), and one
  ``llmgym/RG-<dataset>-v0`` per offline reasoning-gym dataset (:mod:`llmgym.envs.math.reasoning`).

``math_verify`` and ``reasoning_gym`` are imported on first use, not by ``import llmgym.envs.math``.

Example:
    >>> from llmgym import Task
    >>> from llmgym.envs.math import MathVerifier
    >>> MathVerifier()(Task("1/2 = ?", answer="0.5"), r"\\boxed{\\frac{1}{2}}").reward
    1.0
"""

from llmgym.envs.math.arithmetic import arithmetic_env, arithmetic_task
from llmgym.envs.math.loaders import gsm8k_env, load_gsm8k, load_math, math_env
from llmgym.envs.math.reasoning import ReasoningGymVerifier, reasoning_gym_task
from llmgym.envs.math.reasoning import make_env as reasoning_gym_env
from llmgym.envs.math.math_verifier import (
    MathVerifier,
    ThinkAnswerFormat,
    extract_answer,
    math_reward,
    normalize_gold,
)

__all__ = [
    "MathVerifier",
    "ThinkAnswerFormat",
    "math_reward",
    "extract_answer",
    "normalize_gold",
    "arithmetic_task",
    "arithmetic_env",
    "load_gsm8k",
    "load_math",
    "gsm8k_env",
    "math_env",
    "ReasoningGymVerifier",
    "reasoning_gym_task",
    "reasoning_gym_env",
]
