r"""Procedural arithmetic: multi-step integer expressions such as ``(7 + 3) * 4 - 12 / 6``.

Expressions are random binary trees over ``+ - * /`` with operands in ``[1, max_value]``, printed
with only the parentheses precedence needs. ``/`` is used only where it divides exactly, so every
answer is an integer; values are computed with Python integers (no ``eval``). Answers are checked by
:class:`~llmgym.envs.math.MathVerifier`, so ``\boxed{17}``, "The answer is 17." and ``17`` all count.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from llmgym import SequenceEnv, Task

__all__ = ["arithmetic_expression", "arithmetic_task", "arithmetic_env", "ARITHMETIC_PROMPT"]

ARITHMETIC_PROMPT = "Compute {expression}. Put the final answer within \\boxed{{}}."

_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def _operand(text: str, prec: int, parent: str, right: bool) -> str:
    need = prec < _PRECEDENCE[parent] or (right and prec == _PRECEDENCE[parent] and parent in "-/")
    return f"({text})" if need else text


def _build(rng: np.random.Generator, n_ops: int, max_value: int, ops: str) -> tuple[str, int, int]:
    """``(text, value, precedence)`` of a random expression with ``n_ops`` operators."""
    if n_ops == 0:
        value = int(rng.integers(1, max_value + 1))
        return str(value), value, 3
    left_ops = int(rng.integers(0, n_ops))
    left = _build(rng, left_ops, max_value, ops)
    right = _build(rng, n_ops - 1 - left_ops, max_value, ops)
    op = str(rng.choice(list(ops)))
    if op == "/" and (right[1] == 0 or left[1] % right[1] != 0):
        # keep answers integral: fall back to another operator (drawn the same seeded way)
        others = [o for o in ops if o != "/"] or ["+"]
        op = str(rng.choice(others))
    value = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
             "/": lambda a, b: a // b}[op](left[1], right[1])
    text = f"{_operand(left[0], left[2], op, False)} {op} {_operand(right[0], right[2], op, True)}"
    return text, value, _PRECEDENCE[op]


def arithmetic_expression(
    rng: np.random.Generator, min_ops: int = 1, max_ops: int = 3, max_value: int = 20, ops: str = "+-*/"
) -> tuple[str, int]:
    """A random expression and its integer value.

    Example:
        >>> import numpy as np
        >>> from llmgym.envs.math.arithmetic import arithmetic_expression
        >>> text, value = arithmetic_expression(np.random.default_rng(0), 3, 3)
        >>> eval(text.replace("/", "//")) == value
        True
    """
    if not 1 <= min_ops <= max_ops:
        raise ValueError(f"need 1 <= min_ops <= max_ops, got {min_ops}, {max_ops}")
    if max_value < 1:
        raise ValueError(f"max_value must be >= 1, got {max_value}")
    if not ops or set(ops) - set(_PRECEDENCE):
        raise ValueError(f"ops must be a non-empty string over '+-*/', got {ops!r}")
    n_ops = int(rng.integers(min_ops, max_ops + 1))
    text, value, _ = _build(rng, n_ops, max_value, ops)
    return text, value


def arithmetic_task(
    rng: np.random.Generator,
    min_ops: int = 1,
    max_ops: int = 3,
    max_value: int = 20,
    ops: str = "+-*/",
    prompt: str = ARITHMETIC_PROMPT,
) -> Task:
    """One arithmetic :class:`~llmgym.Task`; ``answer`` is the value as text.

    Example:
        >>> import numpy as np
        >>> from llmgym.envs.math.arithmetic import arithmetic_task
        >>> task = arithmetic_task(np.random.default_rng(1), max_ops=1)
        >>> task.prompt.startswith("Compute "), task.answer.lstrip("-").isdigit()
        (True, True)
    """
    text, value = arithmetic_expression(rng, min_ops, max_ops, max_value, ops)
    return Task(prompt.format(expression=text), answer=str(value), id=f"arith:{text}",
                metadata={"expression": text})


def arithmetic_env(
    tokenizer: Any = None,
    render_mode: str | None = None,
    *,
    tasks: Any = None,
    min_ops: int = 1,
    max_ops: int = 3,
    max_value: int = 20,
    ops: str = "+-*/",
    prompt: str = ARITHMETIC_PROMPT,
    verifier: Any = None,
    time_limit: float | None = 5.0,
) -> SequenceEnv:
    r"""``llmgym/Arithmetic-v0``: one seeded expression per episode, answer checked by MathVerifier.

    ``verifier`` replaces the default :class:`~llmgym.envs.math.MathVerifier` (e.g. ``math_reward()``);
    ``prompt`` is a template with ``{expression}``.

    Example:
        >>> from llmgym.envs.math import arithmetic_env
        >>> env = arithmetic_env(max_ops=2)
        >>> obs, info = env.reset(seed=3)
        >>> obs, reward, terminated, truncated, info = env.step(f"\\boxed{{{info['task'].answer}}}")
        >>> reward, terminated
        (1.0, True)
    """
    from llmgym.envs.math.math_verifier import MathVerifier

    if tasks is None:
        arithmetic_expression(np.random.default_rng(0), min_ops, max_ops, max_value, ops)  # fail fast on bad config
        # a partial, not a closure: the env must pickle (AsyncVectorEnv, multiprocessing)
        tasks = functools.partial(arithmetic_task, min_ops=min_ops, max_ops=max_ops, max_value=max_value,
                                  ops=ops, prompt=prompt)

    return SequenceEnv(tasks, verifier if verifier is not None else MathVerifier(time_limit=time_limit, literal_answer=True),
                       tokenizer, render_mode=render_mode)
