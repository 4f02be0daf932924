"""Math that needs a program, with the sandboxed Python tool: ``llmgym/PythonMath-v0``.

Each task asks for an exact integer that is tedious by hand and a few lines of Python away: the sum of
the primes below ``n``, the sum of the digits of ``a ** b``, the ``k``-th Fibonacci number modulo ``m``.
The policy writes a program, calls ``python(code)`` (run in :mod:`llmgym.sandbox`), reads what it
printed, and answers. Only the answer is scored (:func:`~llmgym.envs.tools.calculator.integer_answer`).
Reference answers are computed here, on the host, by trusted code.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from llmgym import Task
from llmgym.sandbox import SandboxLimits
from llmgym.envs.tools.calculator import integer_answer
from llmgym.tools import ToolEnv, python_tool

__all__ = ["python_math_task", "python_math_env", "KINDS"]

KINDS = ("prime_sum", "digit_sum", "fibonacci_mod")


def _prime_sum(n: int) -> int:
    sieve = bytearray([1]) * n
    sieve[:2] = b"\x00\x00"
    for p in range(2, int(n**0.5) + 1):
        if sieve[p]:
            sieve[p * p::p] = bytearray(len(range(p * p, n, p)))
    return sum(i for i in range(n) if sieve[i])


def _fibonacci_mod(k: int, m: int) -> int:
    a, b = 0, 1
    for _ in range(k):
        a, b = b, (a + b) % m
    return a


def python_math_task(rng: np.random.Generator, kinds: tuple[str, ...] = KINDS) -> Task:
    """One problem of a kind drawn from ``kinds``, with its exact answer.

    Example:
        >>> import numpy as np
        >>> from llmgym.envs.tools.python_math import python_math_task
        >>> task = python_math_task(np.random.default_rng(0), kinds=("prime_sum",))
        >>> task.prompt[0]["content"].startswith("What is the sum of all prime numbers below"), task.answer.isdigit()
        (True, True)
    """
    kind = str(kinds[int(rng.integers(len(kinds)))])
    if kind == "prime_sum":
        n = int(rng.integers(2_000, 50_000))
        question, answer, key = f"What is the sum of all prime numbers below {n}?", _prime_sum(n), f"{n}"
    elif kind == "digit_sum":
        a, b = int(rng.integers(3, 100)), int(rng.integers(50, 300))
        question, answer, key = f"What is the sum of the decimal digits of {a}**{b}?", sum(map(int, str(a**b))), f"{a}-{b}"
    elif kind == "fibonacci_mod":
        k, m = int(rng.integers(1_000, 100_000)), int(rng.integers(10_007, 1_000_000))
        question = f"With F(1) = F(2) = 1, what is the Fibonacci number F({k}) modulo {m}?"
        answer, key = _fibonacci_mod(k, m), f"{k}-{m}"
    else:
        raise ValueError(f"unknown kind {kind!r}: choose from {KINDS}")
    prompt = question + " Compute it with the python tool, then reply with the number alone."
    return Task([{"role": "user", "content": prompt}], answer=str(answer), id=f"{kind}-{key}")


def python_math_env(
    tokenizer: Any = None,
    render_mode: str | None = None,
    *,
    tasks: Any = None,
    kinds: tuple[str, ...] = KINDS,
    max_turns: int = 4,
    call_cost: float = 0.0,
    call_format: str = "auto",
    limits: SandboxLimits | None = None,
    **kwargs: Any,
) -> ToolEnv:
    """``llmgym/PythonMath-v0``: exact-integer problems solved with ``python(code)`` in the sandbox.

    Example:
        >>> import gymnasium, llmgym
        >>> env = gymnasium.make("llmgym/PythonMath-v0", kinds=("digit_sum",))
        >>> obs, info = env.reset(seed=0)
        >>> a, b = info["task"].id.split("-")[1:]
        >>> call = '<tool_call>{"name": "python", "arguments": {"code": "print(sum(map(int, str(%s**%s))))"}}</tool_call>'
        >>> env.step(call % (a, b))[4]["reply"][0]["content"].strip() == info["task"].answer
        True
        >>> env.step(info["task"].answer)[1:3]
        (1.0, True)
    """
    unknown = set(kinds) - set(KINDS)
    if not kinds or unknown:
        raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {kinds}")
    if tasks is None:
        tasks = functools.partial(python_math_task, kinds=tuple(kinds))
    return ToolEnv(tasks, integer_answer, tokenizer, tools=[python_tool(limits)], max_turns=max_turns,
                   call_cost=call_cost, call_format=call_format, render_mode=render_mode, **kwargs)
