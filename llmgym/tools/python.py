"""The sandboxed Python tool: ``python(code) -> what it prints``, run in :mod:`llmgym.sandbox`.

The code is the model's, so it runs only in the sandbox (no network, an unprivileged uid, rlimits, a
private tmpfs, a wall-clock kill of the whole process tree). The tool runs in the env's own process
(``isolated=False``): the sandbox is the killable process, and a sandbox that cannot start raises
:class:`~llmgym.sandbox.SandboxError` from ``step`` rather than pass for the model's error.
"""

from __future__ import annotations

from typing import Any

from llmgym.sandbox import SandboxLimits, run_python
from llmgym.tools.functions import Tool

__all__ = ["SandboxedPython", "python_tool", "PYTHON_TOOL_LIMITS"]

PYTHON_TOOL_LIMITS = SandboxLimits(cpu_seconds=5, wall_seconds=10, memory_mb=512, max_processes=8, max_output_kb=16)
"""Limits of one ``python`` call: a few seconds of CPU, 512 MB, 16 KB of output."""

_STDERR_TAIL = 1500  # characters of a failed program's stderr shown (its traceback's end)


class SandboxedPython:
    """The function behind :func:`python_tool` (a class, so the env pickles for vector envs).

    Example:
        >>> from llmgym.tools.python import SandboxedPython
        >>> SandboxedPython()("print(2 ** 100)")
        '1267650600228229401496703205376\\n'
        >>> SandboxedPython()("1 / 0").splitlines()[-2:]
        ['ZeroDivisionError: division by zero', '(exit status 1)']
    """

    def __init__(self, limits: SandboxLimits | None = None):
        self.limits = limits or PYTHON_TOOL_LIMITS

    def __call__(self, code: str) -> str:
        if not isinstance(code, str):
            raise TypeError(f"code must be a string, got {type(code).__name__}")
        result = run_python(code, limits=self.limits)
        if result.passed:
            return result.stdout
        parts = [result.stdout] if result.stdout else []
        if result.stderr:
            parts.append(result.stderr[-_STDERR_TAIL:])
        if result.killed_reason:
            parts.append(f"(stopped: {result.killed_reason})")
        else:
            parts.append(f"(exit status {result.returncode})")
        return "".join(p if p.endswith("\n") else p + "\n" for p in parts[:-1]) + parts[-1]


def python_tool(limits: SandboxLimits | None = None, *, name: str = "python") -> Tool:
    """A :class:`~llmgym.tools.Tool` that runs the model's Python program in the sandbox and returns what it printed.

    A program that fails returns its output, its traceback's tail and how it ended, as a result (the
    model reads its own error); one over the limits is stopped, and the result says which limit.

    Example:
        >>> from llmgym.tools import python_tool
        >>> tool = python_tool()
        >>> tool.name, tool.isolated, tool.schema["function"]["parameters"]["required"]
        ('python', False, ['code'])
        >>> tool.run({"code": "import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)"}).content.splitlines()[-2]
        'PermissionError: [Errno 1] Operation not permitted'
    """
    schema: dict[str, Any] = {
        "type": "function",
        "function": {
            "name": name,
            "description": "Run a Python 3 program in a sandbox (no network, no files kept, a few seconds) and "
                           "return what it prints. Print every value you need.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "the complete program"}},
                "required": ["code"],
            },
        },
    }
    return Tool(SandboxedPython(limits), schema=schema, isolated=False)
