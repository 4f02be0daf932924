"""Multiplication of numbers too large to do in one's head, with a calculator tool: ``llmgym/Calculator-v0``.

The policy calls ``calculator(expression)`` (run in the tool worker's killable child, like any user tool),
reads the result in the tool turn, and answers with the number. Only the answer is scored, by
:func:`integer_answer` (1.0 for the exact product, else 0.0): calling the calculator earns nothing by itself,
and content-free answers (the question's own numbers, ``0``, an echo) earn 0. A tiny model learns the
loop on a CPU after a short warm-up on the call format (``tests/learning/test_learning_tools.py``).
"""

from __future__ import annotations

import ast
import functools
import operator
import re
from typing import Any

import numpy as np

from llmgym import Task
from llmgym.tools import Tool, ToolEnv

__all__ = ["calculator", "calculator_tool", "integer_answer", "multiplication_task", "calculator_env", "CALCULATOR_PROMPT"]

CALCULATOR_PROMPT = "Use the calculator, then reply with the number alone. What is {a} * {b}?"
_MAX_EXPRESSION_CHARS = 200
_MAX_RESULT_DIGITS = 100
_MAX_EXPONENT = 64
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_INTEGER = re.compile(r"-?\d[\d,]*")


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponents above {_MAX_EXPONENT} are not supported")
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, int) and abs(value).bit_length() > 3.33 * _MAX_RESULT_DIGITS:
            raise ValueError(f"the result has more than {_MAX_RESULT_DIGITS} digits")
        return value
    raise ValueError(f"only numbers, + - * / // % ** and parentheses are allowed, not {type(node).__name__}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly (integers stay integers).

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "4821 * 9377"

    Example:
        >>> from llmgym.envs.tools.calculator import calculator
        >>> calculator("4821 * 9377"), calculator("7 / 2"), calculator("2 ** 10 - 1")
        ('45206517', '3.5', '1023')
        >>> calculator("__import__('os')")
        Traceback (most recent call last):
        ...
        ValueError: only numbers, + - * / // % ** and parentheses are allowed, not Call
    """
    if len(expression) > _MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {_MAX_EXPRESSION_CHARS} characters")
    tree = ast.parse(expression.strip(), mode="eval")
    value = _evaluate(tree.body)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return str(value)


def calculator_tool(time_limit: float = 5.0) -> Tool:
    """The calculator as a :class:`~llmgym.tools.Tool` (run in the tool worker, stopped at ``time_limit`` s)."""
    return Tool(calculator, time_limit=time_limit)


def integer_answer(task: Task, completion: str) -> float:
    """1.0 when the last integer of the completion's tail (commas allowed) equals the task's answer, else 0.0.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.envs.tools.calculator import integer_answer
        >>> t = Task("What is 12 * 34?", answer="408")
        >>> integer_answer(t, "408"), integer_answer(t, "It is 408."), integer_answer(t, "12 34"), integer_answer(t, "")
        (1.0, 1.0, 0.0, 0.0)
    """
    found = _INTEGER.findall(completion[-200:])
    if not found:
        return 0.0
    return float(int(found[-1].replace(",", "")) == int(task.answer))


def _number(rng: np.random.Generator, min_digits: int, max_digits: int) -> int:
    digits = int(rng.integers(min_digits, max_digits + 1))
    return int(rng.integers(max(2, 10 ** (digits - 1)), 10**digits))  # never 1: a * 1 would echo the question


def multiplication_task(rng: np.random.Generator, min_digits: int = 4, max_digits: int = 5) -> Task:
    """``a * b`` with ``min_digits``..``max_digits``-digit factors, as a chat task.

    Example:
        >>> import numpy as np
        >>> from llmgym.envs.tools.calculator import multiplication_task
        >>> task = multiplication_task(np.random.default_rng(0))
        >>> a, b = (int(x) for x in task.id.split("-")[1:])
        >>> int(task.answer) == a * b
        True
    """
    a, b = _number(rng, min_digits, max_digits), _number(rng, min_digits, max_digits)
    return Task([{"role": "user", "content": CALCULATOR_PROMPT.format(a=a, b=b)}], answer=str(a * b), id=f"mul-{a}-{b}")


def calculator_env(
    tokenizer: Any = None,
    render_mode: str | None = None,
    *,
    tasks: Any = None,
    min_digits: int = 4,
    max_digits: int = 5,
    max_turns: int = 3,
    call_cost: float = 0.0,
    call_format: str = "auto",
    **kwargs: Any,
) -> ToolEnv:
    """``llmgym/Calculator-v0``: multiply two ``min_digits``..``max_digits``-digit numbers with a calculator tool.

    Example:
        >>> import gymnasium, llmgym
        >>> env = gymnasium.make("llmgym/Calculator-v0")
        >>> obs, info = env.reset(seed=0)
        >>> a, b = info["task"].id.split("-")[1:]
        >>> info2 = env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "%s * %s"}}</tool_call>' % (a, b))[4]
        >>> info2["reply"][0]["content"] == info["task"].answer
        True
        >>> env.step(info["task"].answer)[1:3]
        (1.0, True)
    """
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
    if tasks is None:
        tasks = functools.partial(multiplication_task, min_digits=min_digits, max_digits=max_digits)
    return ToolEnv(tasks, integer_answer, tokenizer, tools=[calculator_tool()], max_turns=max_turns,
                   call_cost=call_cost, call_format=call_format, render_mode=render_mode, **kwargs)
