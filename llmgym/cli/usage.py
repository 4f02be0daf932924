"""The usage error and exit codes of every ``llmgym`` command: a user's mistake is one line, exit 2.

Example:
    >>> from llmgym.cli.usage import EXIT_USAGE, UsageError, first_line
    >>> EXIT_USAGE, first_line(ValueError("bad value\\nmore detail"))
    (2, 'bad value')
"""

from __future__ import annotations

from llmgym.errors import LLMGymError

__all__ = ["EXIT_USAGE", "EXIT_INTERRUPTED", "LIST_HINT", "UsageError", "first_line", "invoked_as"]

EXIT_USAGE = 2
"""Exit code of a usage error (what argparse uses too)."""


EXIT_INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), once the checkpoint is saved."""


LIST_HINT = "run `llmgym list` to see the registered envs and agents"


def invoked_as() -> str:
    """How to run ``llmgym`` again, for the commands a command prints (``next: ... bench ...``): ``llmgym``
    where that name finds this very script on ``$PATH``, else the path it was started by
    (``.venv/bin/llmgym`` when the venv is not activated).

    Example:
        >>> from llmgym.cli.usage import invoked_as
        >>> invoked_as()  # under the doctest runner: not the llmgym script
        'llmgym'
    """
    import os
    import shlex
    import shutil
    import sys

    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) != "llmgym":
        return "llmgym"
    found = shutil.which("llmgym")
    if found and os.path.realpath(found) == os.path.realpath(argv0):
        return "llmgym"
    return shlex.quote(argv0)


class UsageError(LLMGymError):
    """A mistake the user can fix: printed as one line on stderr; the command exits with code 2."""


def first_line(exc: BaseException) -> str:
    """An exception's message as one line: a pydantic ValidationError's first error, else its first line."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or type(exc).__name__
            return f"{where}: {' '.join(str(first['msg']).split())}"[:400]
        except Exception:
            pass
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return lines[0][:400]
