"""Toy task families a tiny model can learn on a CPU within minutes.

Prompts are short digit puzzles: ``"12+7="`` (addition), ``"copy:4821="``, ``"rev:4821="``. The
reward gives partial credit, the share of answer positions that are right, so that RL has a
gradient to climb before the model is ever exactly right; an exact answer scores 1.0.

Partial credit is paid for answers that hold no solution too: the question's own digits earn about
0.2 on Reverse (the middle digit of an odd-length string is always in place) and some on Addition
(``12+7=`` answered ``12`` shares the leading ``1`` of ``19``). That is this family's purpose (a tiny
model climbs it from nothing), so it is the default; ``scoring="binary"`` pays exact answers only
(:func:`llmgym.env.verifiers.exact_match`). Copy's answer *is* the prompt's digits echoed.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from llmgym import MultiTurnEnv, SequenceEnv, Task
from llmgym.env.verifiers import exact_match

__all__ = [
    "positional_match",
    "addition_task",
    "copy_task",
    "reverse_task",
    "addition_env",
    "copy_env",
    "reverse_env",
    "copy_retry_env",
    "sample_tasks",
    "TASK_MAKERS",
    "SCORINGS",
]

SCORINGS = ("partial", "binary")
"""The toy envs' ``scoring=``: ``"partial"`` (share of positions right; the default) or ``"binary"`` (exact)."""


def positional_match(task: Task, completion: str) -> float:
    """Share of positions where ``completion`` agrees with the answer, over the longer of the two.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.envs.toy import positional_match
        >>> t = Task("copy:123=", answer="123")
        >>> positional_match(t, "123"), positional_match(t, "129"), positional_match(t, "12345")
        (1.0, 0.6666666666666666, 0.6)
    """
    answer, text = str(task.answer), completion.strip()
    if not text:
        return 0.0
    hits = sum(a == b for a, b in zip(answer, text))
    return hits / max(len(answer), len(text))


def _digits(rng: np.random.Generator, low: int, high: int) -> str:
    length = int(rng.integers(low, high + 1))
    return "".join(str(d) for d in rng.integers(0, 10, size=length))


def addition_task(rng: np.random.Generator, max_value: int = 50) -> Task:
    """``a+b=`` with ``0 <= a, b < max_value``.

    Example:
        >>> import numpy as np
        >>> from llmgym.envs.toy import addition_task
        >>> t = addition_task(np.random.default_rng(0))
        >>> eval(t.prompt[:-1]) == int(t.answer)
        True
    """
    a, b = (int(x) for x in rng.integers(0, max_value, size=2))
    return Task(f"{a}+{b}=", answer=str(a + b), id=f"add-{a}-{b}")


def copy_task(rng: np.random.Generator, min_digits: int = 2, max_digits: int = 4) -> Task:
    """``copy:<digits>=`` answered by the same digits."""
    s = _digits(rng, min_digits, max_digits)
    return Task(f"copy:{s}=", answer=s, id=f"copy-{s}")


def reverse_task(rng: np.random.Generator, min_digits: int = 2, max_digits: int = 4) -> Task:
    """``rev:<digits>=`` answered by the digits reversed."""
    s = _digits(rng, min_digits, max_digits)
    return Task(f"rev:{s}=", answer=s[::-1], id=f"rev-{s}")


TASK_MAKERS: dict[str, Callable[..., Task]] = {"addition": addition_task, "copy": copy_task, "reverse": reverse_task}


def sample_tasks(kind: str, n: int, seed: int = 0, **kwargs: Any) -> list[Task]:
    """``n`` tasks of a toy kind from a seeded generator (held-out sets, warm-up data).

    Example:
        >>> from llmgym.envs.toy import sample_tasks
        >>> [t.prompt for t in sample_tasks("copy", 2, seed=3)] == [t.prompt for t in sample_tasks("copy", 2, seed=3)]
        True
    """
    rng = np.random.default_rng(seed)
    maker = TASK_MAKERS[kind]
    return [maker(rng, **kwargs) for _ in range(n)]


def _verifier(scoring: str):
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS} ('partial': share of positions right; "
                         f"'binary': exact answers only), got {scoring!r}")
    return positional_match if scoring == "partial" else exact_match


def _source(kind: str, tasks: Any, kwargs: dict[str, Any]):
    if tasks is not None:
        return tasks
    # a partial of a module-level function, not a lambda: the env must pickle (AsyncVectorEnv, multiprocessing)
    return functools.partial(TASK_MAKERS[kind], **kwargs)


def addition_env(tokenizer: Any = None, render_mode: str | None = None, tasks: Any = None, max_value: int = 50,
                 scoring: str = "partial") -> SequenceEnv:
    """``llmgym/Addition-v0`` (``scoring="binary"`` for exact answers only)."""
    return SequenceEnv(_source("addition", tasks, {"max_value": max_value}), _verifier(scoring), tokenizer,
                       render_mode=render_mode)


def copy_env(tokenizer: Any = None, render_mode: str | None = None, tasks: Any = None,
             min_digits: int = 2, max_digits: int = 4, scoring: str = "partial") -> SequenceEnv:
    """``llmgym/Copy-v0``."""
    return SequenceEnv(_source("copy", tasks, {"min_digits": min_digits, "max_digits": max_digits}),
                       _verifier(scoring), tokenizer, render_mode=render_mode)


def reverse_env(tokenizer: Any = None, render_mode: str | None = None, tasks: Any = None,
                min_digits: int = 2, max_digits: int = 4, scoring: str = "partial") -> SequenceEnv:
    """``llmgym/Reverse-v0`` (``scoring="binary"`` for exact answers only)."""
    return SequenceEnv(_source("reverse", tasks, {"min_digits": min_digits, "max_digits": max_digits}),
                       _verifier(scoring), tokenizer, render_mode=render_mode)


def copy_retry_env(tokenizer: Any = None, render_mode: str | None = None, tasks: Any = None,
                   max_turns: int = 3, min_digits: int = 2, max_digits: int = 4, scoring: str = "partial") -> MultiTurnEnv:
    """``llmgym/CopyRetry-v0``: Copy with feedback and another attempt until right or out of turns.

    Each turn pays :meth:`~llmgym.MultiTurnEnv.progress` of its partial credit, so an episode returns
    its last attempt's score: two near misses and the right answer return 1.0, as answering at once.
    """
    return MultiTurnEnv(_source("copy", tasks, {"min_digits": min_digits, "max_digits": max_digits}),
                        _verifier(scoring), tokenizer, max_turns=max_turns, render_mode=render_mode)
