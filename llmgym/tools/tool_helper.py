"""The tool worker: a clean, single-threaded helper process that runs each tool call in a killable child.

Started by :mod:`llmgym.tools.helper_process` as ``python <this file>`` (a script, not ``-m``: nothing of ``llmgym``
or of the user's ``__main__`` is imported here). It reads length-prefixed pickles on its standard input and
answers on its standard output; the tools' own prints go to standard error. Each call runs in a killable
child (:mod:`llmgym.sandbox.killable`, loaded from its file; forking is safe: this process has one thread):
past the time limit the child's whole process group is killed. Standard library and cloudpickle's loader only.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import struct
import sys

__all__ = ["HEADER", "as_text", "main", "read_message", "write_message"]

HEADER = struct.Struct("!I")
_MAX_MESSAGE = 64 << 20  # a request larger than this is a protocol error, not a tool


def read_message(stream):
    """The next pickled message on ``stream``, or ``None`` at end of file."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    (size,) = HEADER.unpack(header)
    if size > _MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes is over the protocol limit")
    body = stream.read(size)
    if len(body) < size:
        return None
    return pickle.loads(body)


def write_message(stream, message) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(body)) + body)
    stream.flush()


def _load_killable():
    """:mod:`llmgym.sandbox.killable` loaded from its file (this script imports nothing of ``llmgym``, whose
    package ``__init__`` would pull in torch and gymnasium; that module is standard library only)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sandbox", "killable.py")
    spec = importlib.util.spec_from_file_location("llmgym_killable_in_tool_helper", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def as_text(value) -> str:
    """A tool's result as the text the model reads: a string as it is, else JSON, else ``str``.

    Example:
        >>> from llmgym.tools.tool_helper import as_text
        >>> as_text({"a": 1}), as_text("hi"), as_text({1, 2}) in ("{1, 2}", "{2, 1}")
        ('{"a": 1}', 'hi', True)
    """
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def _tool_outcome(function, arguments, max_chars, env) -> tuple:
    """In the killable child (its environment already cut to the allow-list): the tool's own ``env`` set, then
    ``("ok", text, length)`` or the tool's failure, reported to the model."""
    os.environ.update(env)
    try:
        text = as_text(function(**arguments))
        return ("ok", text[:max_chars], len(text))
    except BaseException as exc:
        message = f"{type(exc).__name__}: {exc}"
        return ("exception", message[:max_chars], len(message))


def _call(killable, function, arguments, time_limit, max_chars, control_fd, env):
    """One call in a killable child: ``("ok"|"exception", text, length)``, ``("timeout",)``,
    ``("crashed", why)`` or ``("parent_gone",)``."""
    outcome = killable.call_in_killable_child(_tool_outcome, function, arguments, max_chars, env, limit=time_limit,
                                              max_result_bytes=4 * max_chars + (1 << 16), watch_fd=control_fd)
    if outcome.status == "ok":
        return outcome.value
    if outcome.status == "timeout":
        return ("timeout",)
    if outcome.status == "watch_closed":  # the trainer went away (its end of our stdin closed)
        return ("parent_gone",)
    if outcome.status == "oversized":
        return ("crashed", f"the tool wrote more than {outcome.value} bytes of result")
    return ("crashed", str(outcome.value))  # "died" (how) or "raised" (_tool_outcome catches the tool's own)


def main() -> None:
    protocol_in = os.fdopen(os.dup(0), "rb")
    protocol_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # tools read nothing from the protocol pipe ...
    os.dup2(2, 1)  # ... and their prints go to standard error, not into it
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the trainer; the closed pipe stops us
    init = read_message(protocol_in)
    if init is None:
        return
    sys.path[:] = list(init["sys_path"])
    killable = _load_killable()
    functions = {}
    while True:
        message = read_message(protocol_in)
        if message is None:
            return
        kind = message[0]
        if kind == "load":
            _, key, blob = message
            try:
                functions[key] = pickle.loads(blob)
                write_message(protocol_out, ("loaded",))
            except BaseException as exc:
                write_message(protocol_out, ("load_error", f"{type(exc).__name__}: {exc}"[:2000]))
        elif kind == "call":
            _, key, arguments, time_limit, max_chars, env = message
            outcome = _call(killable, functions[key], arguments, time_limit, max_chars, protocol_in.fileno(), env)
            if outcome[0] == "parent_gone":
                return
            write_message(protocol_out, outcome)
        else:
            write_message(protocol_out, ("protocol_error", f"unknown request {kind!r}"))


if __name__ == "__main__":
    main()
