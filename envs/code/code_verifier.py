r"""Scoring code completions by running them with their unit tests in :mod:`llmgym.sandbox`.

A *code task* is a :class:`llmgym.Task` whose ``tests`` hold Python test code (asserts, or
HumanEval's ``check(candidate)`` plus its call) and whose ``metadata`` may hold

* ``"prompt_code"``: code the completion continues (HumanEval's prompt: imports, the signature and
  the docstring); absent or ``""`` when the completion is a whole program (MBPP);
* ``"entry_point"``: the name of the function under test (used to find it in a completion).

:class:`CodeVerifier` builds the program (:func:`build_program`), runs it in a fresh sandbox with
the tests in a separate judge process (below), and scores **1.0 when the judge says every test
passed** and **0.0 otherwise** (a failing assert, an exception, a syntax error, a kill by a limit,
a value that is not plain data).

Completion conventions (:func:`build_program`), in this order:

1. *Fenced code.* If the completion holds a Markdown code fence (```` ```python ```` / ```` ``` ````,
   any language tag; an unclosed fence runs to the end of the text), the code is the first fenced
   block that defines ``entry_point`` at the top level, else the first fenced block. Prose outside
   the fences is ignored. Without a fence the code is the completion itself.
2. *Whole function.* If the code defines the entry point at column 0 (``def name(`` / ``async def
   name(``; with no ``entry_point`` given: any top-level ``def``), it is a whole function: the
   program is ``prompt_code`` up to its own ``def <entry_point>(`` (imports and helper functions
   stay defined; the prompt's stub is dropped), then the code.
3. *Body.* Otherwise the code continues ``prompt_code`` verbatim (HumanEval's own convention:
   ``prompt + completion``).

With no ``prompt_code`` (MBPP-style tasks) the code is the whole program.

**The judge** (:mod:`llmgym.envs.code.code_judge`). The program runs in one sandboxed process, the tests
in another, under another uid; the tests call the program's functions through proxies, and values
cross as plain data only. A pass is the judge's verdict alone: its exit status 0 and a per-run secret
on a channel only it holds, after the last test. Nothing the program prints, raises, traces or exits
with can produce a pass (an early ``sys.exit(0)`` / ``os._exit(0)`` ends the program, so the next
call fails), and the tests' source (the expected answers) never enters the program's process.

Host-side parsing is linear in the completion's length (the fence scanner below; no regex with
overlapping quantifiers), and the completion itself is capped by the env's ``max_completion_chars``.

Example:
    >>> from llmgym import Task
    >>> from llmgym.envs.code import CodeVerifier
    >>> task = Task("def add(a, b):\n", tests="assert add(2, 3) == 5",
    ...             metadata={"prompt_code": "def add(a, b):\n", "entry_point": "add"})
    >>> verifier = CodeVerifier()
    >>> verifier(task, "    return a + b\n").reward
    1.0
    >>> verifier(task, "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```").reward
    1.0
    >>> score = verifier(task, "    return a - b\n")
    >>> score.reward, score.info["feedback"].splitlines()[-1]
    (0.0, 'AssertionError')
    >>> cheat = verifier(task, "import os\ndef add(a, b):\n    os._exit(0)\n")   # exit 0 inside the call
    >>> cheat.reward, cheat.info["early_exit"]
    (0.0, True)
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import secrets
import threading
from collections.abc import Sequence
from typing import Any

from llmgym import Score, Task, Verifier
from llmgym.envs.code.code_judge import RUNNER, judge_source
from llmgym.sandbox import Sandbox, SandboxLimits, SandboxResult

__all__ = [
    "DEFAULT_CODE_LIMITS",
    "CodeVerifier",
    "build_program",
    "defines_function",
    "extract_code",
    "failure_feedback",
    "strip_terminal_escapes",
]

#: Limits of one test run unless a :class:`CodeVerifier` is given others: ample for HumanEval /
#: MBPP solutions (the slowest canonical HumanEval solution needs well under a second).
DEFAULT_CODE_LIMITS = SandboxLimits(
    cpu_seconds=5,
    wall_seconds=10,
    memory_mb=512,
    max_processes=8,
    max_file_mb=8,
    max_open_files=64,
    tmp_size_mb=32,
    max_output_kb=64,
)

_ANY_TOP_LEVEL_DEF = re.compile(r"^(?:async[ \t]+)?def[ \t]+\w+[ \t]*\(", re.MULTILINE)
_SANDBOX_MAIN = 'File "/tmp/main.py"'
# ECMA-48 escape sequences (CSI ... final byte, OSC ... BEL/ST, two-byte ESC x) and the other C0/C1
# controls except tab and newline: each alternative is one linear pass, no nested quantifiers.
_TERMINAL_ESCAPE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]|\x9b[0-?]*[ -/]*[@-~]"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


def strip_terminal_escapes(text: str) -> str:
    r"""``text`` without terminal escape sequences and control characters (tab and newline kept).

    Sandbox output flows back into observations (CodeRetry's feedback) and into logs a person reads
    in a terminal: a program must not be able to move the cursor, retitle the window or hide text.

    Example:
        >>> from llmgym.envs.code import strip_terminal_escapes
        >>> strip_terminal_escapes("\x1b[2J\x1b[31mred\x1b[0m\x1b]0;title\x07 ok\rno\tyes\n")
        'red okno\tyes\n'
    """
    return _TERMINAL_ESCAPE.sub("", text)


def defines_function(code: str, name: str | None = None) -> bool:
    """Whether ``code`` defines function ``name`` (any function when ``None``) at column 0.

    Example:
        >>> from llmgym.envs.code import defines_function
        >>> defines_function("import math\\ndef area(r):\\n    return math.pi * r * r", "area")
        True
        >>> defines_function("    def area(r): ...", "area"), defines_function("    return 1")
        (False, False)
    """
    pattern = _ANY_TOP_LEVEL_DEF if name is None else _def_pattern(name)
    return pattern.search(code) is not None


def _def_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", re.MULTILINE)


def _fenced_blocks(text: str) -> list[str]:
    """The bodies of Markdown code fences, in one linear pass (each character is looked at O(1) times).

    An opening fence is ```` ``` ```` anywhere, its line (the language tag) skipped; the body runs to
    the next line that starts with optional blanks and ```` ``` ```` or, unclosed, to the end.
    """
    blocks = []
    pos, n = 0, len(text)
    while True:
        start = text.find("```", pos)
        if start < 0:
            return blocks
        eol = text.find("\n", start + 3)
        if eol < 0:  # an opening fence with nothing after its line
            return blocks
        body = line = eol + 1
        while True:
            if line >= n:
                blocks.append(text[body:])
                return blocks
            nl = text.find("\n", line)
            end = n if nl < 0 else nl
            indent = end - len(text[line:end].lstrip(" \t"))
            if text.startswith("```", indent):
                blocks.append(text[body:line])
                pos = indent + 3
                break
            line = end + 1


def _dedent(text: str) -> str:
    """``textwrap.dedent`` in linear time (textwrap compiles the common margin into a regex: a
    256k-character margin took a second to parse)."""
    lines = text.split("\n")
    margin: str | None = None
    for line in lines:
        body = line.lstrip(" \t")
        if body:
            indent = line[: len(line) - len(body)]
            margin = indent if margin is None else os.path.commonprefix([margin, indent])
    cut = len(margin or "")
    return "\n".join(line[cut:] if line.lstrip(" \t") else "" for line in lines)


def extract_code(completion: str, entry_point: str | None = None) -> tuple[str, bool]:
    """The code of a completion and whether it came from a Markdown fence (rule 1 above).

    Example:
        >>> from llmgym.envs.code import extract_code
        >>> extract_code("Sure!\\n```python\\ndef f():\\n    return 1\\n```\\nDone.", "f")
        ('def f():\\n    return 1\\n', True)
        >>> extract_code("    return 1\\n")
        ('    return 1\\n', False)
    """
    blocks = _fenced_blocks(completion)
    if not blocks:
        return completion, False
    for block in blocks:
        if defines_function(block, entry_point):
            return block, True
        # a fence inside a Markdown list is indented; a dedented *body* must not pass for a function,
        # so this needs the entry point's name
        if entry_point is not None and defines_function(_dedent(block), entry_point):
            return _dedent(block), True
    return blocks[0], True


def build_program(completion: str, *, prompt_code: str = "", entry_point: str | None = None) -> tuple[str, str]:
    """``(program, style)`` for a completion: style is ``"function"``, ``"body"`` or ``"program"``.

    Example:
        >>> from llmgym.envs.code import build_program
        >>> prompt = "def sq(x):\\n    '''x squared'''\\n"
        >>> build_program("    return x * x\\n", prompt_code=prompt, entry_point="sq")
        ("def sq(x):\\n    '''x squared'''\\n    return x * x\\n", 'body')
        >>> build_program("```python\\ndef sq(x):\\n    return x ** 2\\n```", prompt_code=prompt, entry_point="sq")[1]
        'function'
        >>> build_program("print(1)")
        ('print(1)', 'program')
    """
    code, _ = extract_code(completion, entry_point)
    if not prompt_code:
        return code, "program"
    if defines_function(code, entry_point):
        head = prompt_code
        stubs = list(_def_pattern(entry_point).finditer(prompt_code)) if entry_point else []
        if stubs:  # keep the prompt's imports and helpers, drop its stub of the entry point
            head = prompt_code[: stubs[-1].start()]
        return (head.rstrip("\n") + "\n\n\n" + code if head.strip() else code), "function"
    return prompt_code + code, "body"


def _tail(text: str, max_chars: int) -> str:
    text = text.replace(_SANDBOX_MAIN, 'File "main.py"')
    return text if len(text) <= max_chars else "...\n" + text[-max_chars:]


def failure_feedback(result: SandboxResult, limits: SandboxLimits | None = None, max_chars: int = 1000) -> str:
    """What went wrong in a failed run, for a human or a policy: the kill reason and the traceback tail.

    The traceback is cut to its last ``max_chars`` characters (from its last ``Traceback`` line);
    sandbox paths read ``main.py``.

    Example:
        >>> from llmgym.sandbox import SandboxResult
        >>> from llmgym.envs.code import failure_feedback
        >>> r = SandboxResult(1, "", 'Traceback (most recent call last):\\n  File "/tmp/main.py", line 3, in <module>\\n'
        ...                   '    assert add(1, 1) == 2\\nAssertionError\\n')
        >>> print(failure_feedback(r))
        Traceback (most recent call last):
          File "main.py", line 3, in <module>
            assert add(1, 1) == 2
        AssertionError
        >>> failure_feedback(SandboxResult(-9, "", "", killed=True, killed_reason="timeout"), max_chars=50)
        'Killed: the program ran past the wall-clock limit.'
    """
    lim = limits or SandboxLimits()
    parts = []
    reasons = {
        "timeout": f"the program ran past the wall-clock limit{f' of {lim.wall_seconds:g} s' if limits else ''}.",
        "cpu_limit": f"the program used more CPU time than allowed{f' ({lim.cpu_seconds:g} s)' if limits else ''}.",
        "memory_limit": "the program used more memory than allowed.",
        "output_limit": "the program wrote more output than allowed.",
        "file_size_limit": "the program wrote a file larger than allowed.",
    }
    if result.killed or result.timed_out:
        reason = result.killed_reason or "timeout"
        parts.append("Killed: " + reasons.get(reason, f"{reason.replace('signal:', 'signal ')}."))
    stderr = result.stderr.rstrip()
    if stderr:
        start = stderr.rfind("Traceback (most recent call last):")
        parts.append(_tail(stderr[start:] if start >= 0 else stderr, max_chars))
    elif not parts:
        parts.append(f"The program exited with status {result.returncode}.")
        if result.stdout.strip():
            parts.append("Its output ended with:\n" + _tail(result.stdout.rstrip(), max_chars))
    return "\n".join(parts)


def _failed_test(report: dict[str, Any]) -> dict[str, Any] | None:
    """Where the tests failed, from the judge's own report (``None`` unless a test itself failed).

    ``line``: the line of the tests' source that raised (the innermost one in the tests);
    ``exception``: the exception's type name; ``text``: its type and message as Python prints them.
    The judge is trusted code in its own process: nothing the candidate does writes these fields.
    """
    line, name, text = report.get("test_line"), report.get("exception"), report.get("exception_text")
    if report.get("stage") != "test" or type(line) is not int or type(name) is not str or not name.isidentifier():
        return None
    return {"line": line, "exception": name[:100], "text": str(text or name)[-500:]}


class CodeVerifier(Verifier):
    """Run the program and, in a separate judge process, its tests (:mod:`llmgym.envs.code.code_judge`): 1.0 on a pass.

    Args:
        limits: :class:`~llmgym.sandbox.SandboxLimits` of each run (default :data:`DEFAULT_CODE_LIMITS`);
            the wall-clock limit is this verifier's time limit.
        sandbox: the :class:`~llmgym.sandbox.Sandbox` to run in. By default a ``Sandbox()`` with
            every isolation mechanism required is created on first use; where one is missing that
            raises :class:`~llmgym.sandbox.SandboxUnavailableError` (naming it and how to install
            it) out of ``env.step`` -- model code never runs unsandboxed unless you opt out through
            the sandbox itself (``Sandbox(allow_unsafe=True)`` or ``LLMGYM_ALLOW_UNSANDBOXED=1``).
        max_workers: concurrent sandboxes in :meth:`verify_batch` (default: the CPU count).
        max_feedback_chars: how much of the traceback ``info["feedback"]`` keeps.

    ``Score.info``: ``passed``, ``style`` (``"function"`` / ``"body"`` / ``"program"``, see
    :func:`build_program`), ``returncode``, ``killed_reason``, ``timed_out``, ``stderr_tail``,
    ``stdout_tail``, ``early_exit`` (exited 0 before the tests finished), ``feedback`` (what
    failed, ``""`` on a pass: the judge's traceback quotes the failing test, expected value included)
    ``stage`` (where the judge stopped: ``"load"``, ``"test"``, or ``None`` without a report) and
    ``failed_test`` (``{"line", "exception", "text"}`` when a test failed: where in the tests and
    how, for feedback that must not quote a hidden test) -- all deterministic for a deterministic
    program (no timings).

    A failure of the sandbox itself (:class:`~llmgym.sandbox.SandboxError`, e.g. bubblewrap cannot
    start) is raised, never scored 0: it is not the completion's fault, and silent zeros would
    corrupt training.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.envs.code import CodeVerifier
        >>> task = Task("Write inc(x).", tests="assert inc(1) == 2", metadata={"entry_point": "inc"})
        >>> scores = CodeVerifier().verify_batch([task, task], ["def inc(x): return x + 1", "def inc(x): return x"])
        >>> [s.reward for s in scores]
        [1.0, 0.0]
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        sandbox: Sandbox | None = None,
        max_workers: int | None = None,
        max_feedback_chars: int = 1000,
    ):
        super().__init__(None)
        self.limits = limits or DEFAULT_CODE_LIMITS
        self.max_workers = max_workers
        self.max_feedback_chars = max_feedback_chars
        self._sandbox = sandbox
        self._owns_sandbox = sandbox is None
        self._lock = threading.Lock()

    @property
    def time_limit(self) -> float:  # type: ignore[override]  # the sandbox kills; no watchdog thread
        """Seconds one run may take: the sandbox's wall-clock limit (setting it changes ``limits``)."""
        return self.limits.wall_seconds

    @time_limit.setter
    def time_limit(self, seconds: float | None) -> None:
        if seconds is not None:
            self.limits = dataclasses.replace(self.limits, wall_seconds=seconds)

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox (created on first use; raises ``SandboxUnavailableError`` where it cannot be)."""
        with self._lock:
            if self._sandbox is None:
                self._sandbox = Sandbox(self.limits)
            return self._sandbox

    # -- scoring -----------------------------------------------------------------------------------
    def __call__(self, task: Task, completion: str) -> Score:
        return self.verify_batch([task], [completion])[0]

    def verify(self, task: Task, completion: str) -> Score:
        """Score one completion (same as calling the verifier)."""
        return self.verify_batch([task], [completion])[0]

    def verify_batch(
        self, tasks: Sequence[Task], completions: Sequence[str], max_workers: int | None = None
    ) -> list[Score]:
        """Score many completions, running their judged programs concurrently with ``Sandbox.run_many``."""
        if len(tasks) != len(completions):
            raise ValueError(f"verify_batch got {len(tasks)} tasks but {len(completions)} completions")
        sandbox = self.sandbox  # SandboxUnavailableError propagates: never a silent zero
        scores: list[Score | None] = [None] * len(tasks)
        runs: list[tuple[int, str, str, str, str]] = []  # index, program, judge, style, token
        for i, (task, completion) in enumerate(zip(tasks, completions)):
            try:
                program, style = self.program(task, completion)
                tests, prompt, entry_point = self._trusted(task)
            except Exception as exc:  # noqa: BLE001  # a malformed task or action: this completion's zero
                scores[i] = Score(0.0, {"passed": False, "error": f"{type(exc).__name__}: {exc}", "feedback": str(exc)})
                continue
            token = secrets.token_hex(16)
            judge = judge_source(tests, prompt=prompt, entry_point=entry_point, token=token)
            runs.append((i, program, judge, style, token))
        if runs:
            results = sandbox.run_many(
                [program for _, program, *_ in runs],
                judges=[(judge, RUNNER) for _, _, judge, _, _ in runs],
                limits=self.limits,
                max_workers=max_workers or self.max_workers,
            )
            for (i, _, _, style, token), result in zip(runs, results):
                scores[i] = self._score(result, style, token)
        return scores  # type: ignore[return-value]

    def program(self, task: Task, completion: str) -> tuple[str, str]:
        """``(program, style)``: the candidate's program as it runs in the sandbox (the tests run apart)."""
        if not isinstance(completion, str):
            raise TypeError(f"a completion must be text, got {type(completion).__name__}")
        meta = task.metadata or {}
        program, style = build_program(
            completion, prompt_code=str(meta.get("prompt_code") or ""), entry_point=meta.get("entry_point")
        )
        return program, style

    @staticmethod
    def _trusted(task: Task) -> tuple[str, str, str | None]:
        """``(tests, prompt, entry_point)``: what the judge runs, all from the task, none from the completion.

        ``prompt`` is ``prompt_code`` without the entry point's stub (its imports and helpers, such as
        HumanEval's ``poly`` or ``encode_cyclic``, which tests call), when that parses on its own.
        """
        tests = task.tests
        if isinstance(tests, (list, tuple)):
            tests = "\n".join(str(t) for t in tests)
        if not isinstance(tests, str) or not tests.strip():
            raise ValueError(
                f"task {task.id!r} has no tests: a code task needs Task(tests='assert ...') "
                "(test code run against the program's functions)"
            )
        meta = task.metadata or {}
        entry_point = meta.get("entry_point") or None
        prompt = str(meta.get("prompt_code") or "")
        stubs = list(_def_pattern(entry_point).finditer(prompt)) if (prompt and entry_point) else []
        if stubs:
            prompt = prompt[: stubs[-1].start()]
        try:
            ast.parse(prompt)
        except SyntaxError:
            prompt = ""
        return tests, prompt, entry_point

    def _score(self, result: SandboxResult, style: str, token: str) -> Score:
        report: dict[str, Any] = {}
        if result.judge_report:
            try:
                parsed = json.loads(result.judge_report)
                report = parsed if isinstance(parsed, dict) else {}
            except ValueError:
                report = {"error": result.judge_report[-self.max_feedback_chars:]}
        passed = bool(
            result.passed and report.get("passed") is True and report.get("token") == token
        )
        early_exit = not passed and result.candidate_returncode == 0
        stdout = strip_terminal_escapes(result.stdout)
        judge_says = _tail(str(report.get("error") or "the tests did not pass."), self.max_feedback_chars)
        if passed:
            feedback = ""
        elif early_exit:
            feedback = (
                "The program exited with status 0 before the tests finished "
                "(sys.exit() or os._exit() in the solution?)."
            )
        elif result.killed or result.timed_out or (report.get("stage") == "load" and result.stderr.strip()):
            # a limit, or the program failed before the tests ran: its own traceback says why
            feedback = failure_feedback(result, self.limits, self.max_feedback_chars)
        else:  # the judge's traceback of the failing test
            feedback = judge_says
        info: dict[str, Any] = {
            "passed": passed,
            "style": style,
            "returncode": result.returncode,
            "killed_reason": result.killed_reason,
            "timed_out": result.timed_out,
            "early_exit": early_exit,
            "stderr_tail": _tail(strip_terminal_escapes(result.stderr), self.max_feedback_chars),
            "stdout_tail": _tail(stdout, self.max_feedback_chars),
            "feedback": strip_terminal_escapes(feedback),
            "stage": report.get("stage") if report.get("stage") in ("load", "test") else None,
            "failed_test": None if passed else _failed_test(report),
        }
        return Score(1.0 if passed else 0.0, info)

    def __getstate__(self) -> dict[str, Any]:  # picklable (vector envs): the lock and own sandbox are rebuilt
        state = dict(self.__dict__)
        state["_lock"] = None
        if self._owns_sandbox:
            state["_sandbox"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CodeVerifier(limits={self.limits})"
