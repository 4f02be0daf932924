'''``llmgym/MBPP-v0``: "write a function that passes these unit tests", from MBPP-style JSONL.

One record per line (the fields of MBPP and of its "sanitized" edition):

* ``text`` or ``prompt``: the problem statement (required);
* ``test_list``: assert statements (required, at least one);
* ``code``: a reference solution (optional; kept as the task's ``answer``);
* ``test_setup_code``: code run before the tests (optional), ``test_imports``: import lines (optional);
* ``task_id`` (optional; default: the line number), ``entry_point`` (optional; default: the first
  function of ``code`` that the tests call, else the first name the first assert calls).

The task's prompt shows the statement and the tests (MBPP's own prompt, :data:`MBPP_PROMPT`); a
completion is the whole program, bare or in a fenced code block. Task ids read ``"MBPP/<task_id>"``
(``"builtin/<name>"`` for the built-in problems).

Without ``path=`` the env serves :data:`BUILTIN_PROBLEMS`, eight small problems written for llmgym,
so that it runs out of the box; real MBPP files (e.g. ``mbpp.jsonl`` from google-research) load
with ``gymnasium.make("llmgym/MBPP-v0", path="mbpp.jsonl")``.

Example:
    >>> import gymnasium, llmgym
    >>> env = gymnasium.make("llmgym/MBPP-v0")
    >>> obs, info = env.reset(options={"task_id": "builtin/sum_of_squares"})
    >>> print(obs["prompt"].splitlines()[-1])  # one assert shown; every assert is judged
    assert sum_of_squares(0) == 0
    >>> code = "```python\\ndef sum_of_squares(n):\\n    return sum(i * i for i in range(1, n + 1))\\n```"
    >>> env.step(code)[1]
    1.0
'''

from __future__ import annotations

import ast
import gzip
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from llmgym.envs.code.code_verifier import CodeVerifier
from llmgym import SequenceEnv, Task
from llmgym.sandbox import Sandbox, SandboxLimits

__all__ = ["BUILTIN_PROBLEMS", "MBPP_PROMPT", "SHOWN_TESTS", "builtin_code_tasks", "load_mbpp_jsonl", "mbpp_env", "mbpp_task"]

#: MBPP's prompt: the statement, then the tests the code must pass.
MBPP_PROMPT = (
    "You are an expert Python programmer, and here is your task: {text} "
    "Your code should pass these tests:\n\n{tests}\n"
)
SHOWN_TESTS = 1
"""Asserts shown in the prompt by default. MBPP's paper shows all three, but a policy trained on
tasks whose prompt holds every test it is judged on learns a lookup table of them (a red-team pass
scored 5/5 that way): one shows the signature and the output format, the rest stay hidden. Pass
``shown_tests=None`` (all) to reproduce the paper's benchmark prompt."""


def _problem(task_id: str, text: str, code: str, tests: Sequence[str], setup: str = "") -> dict[str, Any]:
    return {"task_id": task_id, "text": text, "code": code, "test_list": list(tests), "test_setup_code": setup}


#: Eight small function-writing problems in MBPP's record format (written for llmgym; the default
#: task set of ``llmgym/MBPP-v0`` and ``llmgym/CodeRetry-v0``).
BUILTIN_PROBLEMS: tuple[dict[str, Any], ...] = (
    _problem(
        "sum_of_squares",
        "Write a function sum_of_squares(n) that returns 1*1 + 2*2 + ... + n*n (0 for n < 1).",
        "def sum_of_squares(n):\n    return sum(i * i for i in range(1, n + 1))\n",
        ["assert sum_of_squares(0) == 0", "assert sum_of_squares(3) == 14", "assert sum_of_squares(10) == 385"],
    ),
    _problem(
        "is_palindrome",
        "Write a function is_palindrome(s) that tells whether s reads the same backwards, ignoring case "
        "and every character that is not a letter or a digit.",
        "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n",
        [
            "assert is_palindrome('A man, a plan, a canal: Panama') is True",
            "assert is_palindrome('abc') is False",
            "assert is_palindrome('') is True",
        ],
    ),
    _problem(
        "count_vowels",
        "Write a function count_vowels(s) that counts the vowels (a, e, i, o, u, either case) in s.",
        "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)\n",
        ["assert count_vowels('hello') == 2", "assert count_vowels('RHYTHM') == 0", "assert count_vowels('AEiou x') == 5"],
    ),
    _problem(
        "fizzbuzz",
        "Write a function fizzbuzz(n) that returns a list of strings for 1..n: 'Fizz' for multiples of 3, "
        "'Buzz' for multiples of 5, 'FizzBuzz' for multiples of both, else the number.",
        "def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n"
        "        out.append('Fizz' * (i % 3 == 0) + 'Buzz' * (i % 5 == 0) or str(i))\n    return out\n",
        [
            "assert fizzbuzz(5) == ['1', '2', 'Fizz', '4', 'Buzz']",
            "assert fizzbuzz(15)[-1] == 'FizzBuzz'",
            "assert fizzbuzz(0) == []",
        ],
    ),
    _problem(
        "second_largest",
        "Write a function second_largest(nums) that returns the second largest distinct value of a list "
        "of numbers, or None when there is none.",
        "def second_largest(nums):\n    values = sorted(set(nums))\n    return values[-2] if len(values) > 1 else None\n",
        [
            "assert second_largest([3, 1, 4, 1, 5]) == 4",
            "assert second_largest([7, 7]) is None",
            "assert second_largest([-2, -5]) == -5",
        ],
    ),
    _problem(
        "run_length",
        "Write a function run_length(s) that encodes runs of equal characters as the character followed "
        "by the run's length, e.g. 'aaab' -> 'a3b1'.",
        "def run_length(s):\n    out, i = [], 0\n    while i < len(s):\n        j = i\n"
        "        while j < len(s) and s[j] == s[i]:\n            j += 1\n"
        "        out.append(f'{s[i]}{j - i}')\n        i = j\n    return ''.join(out)\n",
        ["assert run_length('aaab') == 'a3b1'", "assert run_length('') == ''", "assert run_length('abcc') == 'a1b1c2'"],
    ),
    _problem(
        "flatten",
        "Write a function flatten(items) that flattens arbitrarily nested lists into one flat list.",
        "def flatten(items):\n    out = []\n    for x in items:\n"
        "        out.extend(flatten(x) if isinstance(x, list) else [x])\n    return out\n",
        ["assert flatten([1, [2, [3, [4]]], 5]) == [1, 2, 3, 4, 5]", "assert flatten([]) == []", "assert flatten([[[]]]) == []"],
    ),
    _problem(
        "gcd_of_list",
        "Write a function gcd_of_list(nums) that returns the greatest common divisor of a non-empty list "
        "of positive integers.",
        "import math\n\ndef gcd_of_list(nums):\n    g = 0\n    for x in nums:\n        g = math.gcd(g, x)\n    return g\n",
        ["assert gcd_of_list([12, 18, 24]) == 6", "assert gcd_of_list([7]) == 7", "assert gcd_of_list([9, 28]) == 1"],
    ),
)

_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_NOT_ENTRY = {"assert", "not", "set", "sorted", "list", "tuple", "len", "abs", "round", "str", "int", "float",
              "isinstance", "all", "any", "sum", "min", "max", "dict", "frozenset", "bool", "type"}


def _entry_point(code: str | None, tests: Sequence[str]) -> str | None:
    joined = "\n".join(tests)
    if code:
        try:
            names = [n.name for n in ast.parse(code).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        except SyntaxError:
            names = []
        for name in names:
            if re.search(rf"\b{re.escape(name)}\s*\(", joined):
                return name
    for name in _CALL.findall(tests[0] if tests else ""):
        if name not in _NOT_ENTRY and "." not in name:
            return name
    return None


def mbpp_task(record: Mapping[str, Any], *, index: int = 0, source: str = "MBPP",
              prompt_template: str = MBPP_PROMPT, shown_tests: int | None = SHOWN_TESTS) -> Task:
    """One MBPP-style record as a code Task (see the module docstring for the fields).

    Example:
        >>> from llmgym.envs.code import mbpp_task
        >>> t = mbpp_task({"task_id": 11, "text": "Write double(x).", "code": "def double(x): return 2 * x",
        ...                "test_list": ["assert double(2) == 4"]})
        >>> t.id, t.metadata["entry_point"], t.tests
        ('MBPP/11', 'double', 'assert double(2) == 4')
    """
    where = f"{source} record {index}"
    text = record.get("text", record.get("prompt"))
    if not isinstance(text, str) or not text.strip():
        raise KeyError(f"{where}: no problem statement (a 'text' or 'prompt' field); it has {sorted(record)}")
    tests = record.get("test_list")
    if isinstance(tests, str):
        tests = [tests]
    if not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError(f"{where}: 'test_list' must be a non-empty list of assert statements, got {tests!r:.80}")
    setup_lines = [*(record.get("test_imports") or []), record.get("test_setup_code") or ""]
    setup = "\n".join(line for line in setup_lines if line.strip())
    code = record.get("code")
    entry_point = record.get("entry_point") or _entry_point(code, tests)
    task_id = record.get("task_id", index)
    return Task(
        prompt_template.format(text=text.strip(), tests="\n".join(tests if shown_tests is None else tests[:shown_tests])),
        answer=code,
        tests=(setup + "\n" if setup else "") + "\n".join(tests),
        metadata={"entry_point": entry_point, "text": text, "test_list": list(tests), "source": source},
        id=f"{source}/{task_id}",
    )


def _read_jsonl(path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: not a JSON object ({exc.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{line_no}: expected a JSON object, got {type(record).__name__}")  # noqa: TRY004
            yield line_no, record


def load_mbpp_jsonl(path: str | Path, *, prompt_template: str = MBPP_PROMPT, shown_tests: int | None = SHOWN_TESTS,
                    limit: int | None = None,
                    source: str = "MBPP") -> list[Task]:
    """Code tasks from an MBPP-style ``.jsonl`` (or ``.jsonl.gz``) file.

    Example:
        >>> from llmgym.envs.code import load_mbpp_jsonl
        >>> tasks = load_mbpp_jsonl("tests/data/mbpp_sample.jsonl")
        >>> len(tasks), tasks[0].id, tasks[0].metadata["entry_point"]
        (5, 'MBPP/901', 'celsius_to_fahrenheit')
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such task file: {path} (an MBPP-style JSONL: text, code, test_list per line)")
    tasks = []
    for line_no, record in _read_jsonl(path):
        if limit is not None and len(tasks) >= limit:
            break
        record.setdefault("task_id", line_no - 1)
        tasks.append(mbpp_task(record, index=line_no - 1, source=source, prompt_template=prompt_template,
                               shown_tests=shown_tests))
    if not tasks:
        raise ValueError(f"{path} holds no records")
    return tasks


def builtin_code_tasks(prompt_template: str = MBPP_PROMPT, shown_tests: int | None = SHOWN_TESTS) -> list[Task]:
    """:data:`BUILTIN_PROBLEMS` as tasks (ids ``"builtin/<name>"``).

    Example:
        >>> from llmgym.envs.code import builtin_code_tasks
        >>> [t.id for t in builtin_code_tasks()][:2]
        ['builtin/sum_of_squares', 'builtin/is_palindrome']
    """
    return [mbpp_task(r, index=i, source="builtin", prompt_template=prompt_template, shown_tests=shown_tests)
            for i, r in enumerate(BUILTIN_PROBLEMS)]


def mbpp_env(
    tokenizer: Any = None,
    render_mode: str | None = None,
    *,
    path: str | Path | None = None,
    tasks: Sequence[Task] | None = None,
    limit: int | None = None,
    prompt_template: str = MBPP_PROMPT,
    shown_tests: int | None = SHOWN_TESTS,
    limits: SandboxLimits | None = None,
    sandbox: Sandbox | None = None,
    verifier: CodeVerifier | None = None,
) -> SequenceEnv:
    """``llmgym/MBPP-v0``: tasks from ``path`` (MBPP-style JSONL), ``tasks``, or the built-in problems.

    Args:
        path: an MBPP-style ``.jsonl``; ``limit`` keeps its first records.
        tasks: code tasks of your own instead.
        prompt_template: with ``{text}`` and ``{tests}``.
        shown_tests: how many of a task's asserts the prompt shows (default 1; ``None``: all, as in
            MBPP's paper). Every assert is judged: a prompt holding them all invites a lookup table.
        limits / sandbox: passed to the default :class:`~llmgym.envs.code.CodeVerifier`; ``verifier``: your own.
    """
    if tasks is None:
        tasks = (load_mbpp_jsonl(path, prompt_template=prompt_template, shown_tests=shown_tests, limit=limit)
                 if path is not None else builtin_code_tasks(prompt_template, shown_tests))
    verifier = verifier or CodeVerifier(limits, sandbox=sandbox)
    return SequenceEnv(tasks, verifier, tokenizer, render_mode=render_mode)
