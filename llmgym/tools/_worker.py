"""The tool worker: a clean, single-threaded helper process that runs each tool call in a killable child.

Started by :mod:`llmgym.tools.runner` as ``python <this file>`` (a script, not ``-m``: nothing of ``llmgym``
or of the user's ``__main__`` is imported here). It reads length-prefixed pickles on its standard input and
answers on its standard output; the tools' own prints go to standard error. For each call it forks a child
(safe: this process has one thread), which runs the function and writes the result on a private pipe; past
the time limit the child's whole process group is killed. Standard library and cloudpickle's loader only.
"""

from __future__ import annotations

import json
import os
import pickle
import select
import signal
import struct
import sys
import time

__all__ = ["main"]

_HEADER = struct.Struct("!I")
_MAX_MESSAGE = 64 << 20  # a request larger than this is a protocol error, not a tool


def read_message(stream):
    """The next pickled message on ``stream``, or ``None`` at end of file."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    if size > _MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes is over the protocol limit")
    body = stream.read(size)
    if len(body) < size:
        return None
    return pickle.loads(body)


def write_message(stream, message) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


def _death_signal_setter():
    """A function that makes the calling process get SIGKILL when its parent dies (Linux ``prctl``; a no-op
    elsewhere, where the time limit still holds). Built once: loading libc in every child costs milliseconds."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except Exception:
        return lambda: None
    return lambda: prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG



def _as_text(value) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def _run_child(function, arguments, max_chars, pipe_w, die_with_parent) -> None:
    """In the forked child: run the tool, write ``(status, text, length)`` on the pipe, exit without cleanup."""
    try:
        os.setpgid(0, 0)  # its own process group: whatever it starts is killed with it
        die_with_parent()
        try:
            text = _as_text(function(**arguments))
            outcome = ("ok", text[:max_chars], len(text))
        except BaseException as exc:  # the tool's failure, reported to the model
            message = f"{type(exc).__name__}: {exc}"
            outcome = ("exception", message[:max_chars], len(message))
        data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(data)
        while view:
            view = view[os.write(pipe_w, view):]
    finally:
        os._exit(0)


def _call(function, arguments, time_limit, max_chars, control_fd, die_with_parent):
    """Fork, run, wait at most ``time_limit`` seconds: ``("ok"|"exception", text, length)``, ``("timeout",)``,
    ``("crashed", why)`` or ``("parent_gone",)``."""
    pipe_r, pipe_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(pipe_r)
        _run_child(function, arguments, max_chars, pipe_w, die_with_parent)
    os.close(pipe_w)
    chunks, size, cap = [], 0, 4 * max_chars + (1 << 16)
    deadline = time.monotonic() + time_limit
    outcome = None
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                outcome = ("timeout",)
                break
            ready, _, _ = select.select([pipe_r, control_fd], [], [], left)
            if control_fd in ready:  # the trainer went away (its end of our stdin closed)
                outcome = ("parent_gone",)
                break
            if pipe_r in ready:
                chunk = os.read(pipe_r, 1 << 16)
                if not chunk:
                    break
                size += len(chunk)
                if size > cap:
                    outcome = ("crashed", f"the tool wrote more than {cap} bytes of result")
                    break
                chunks.append(chunk)
    finally:
        os.close(pipe_r)
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _, status = os.waitpid(pid, 0)
    if outcome is not None:
        return outcome
    try:
        return pickle.loads(b"".join(chunks))
    except Exception:
        return ("crashed", f"the tool's process ended without a result (wait status {status})")


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
    die_with_parent = _death_signal_setter()
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
            _, key, arguments, time_limit, max_chars = message
            outcome = _call(functions[key], arguments, time_limit, max_chars, protocol_in.fileno(), die_with_parent)
            if outcome[0] == "parent_gone":
                return
            write_message(protocol_out, outcome)
        else:
            write_message(protocol_out, ("protocol_error", f"unknown request {kind!r}"))


if __name__ == "__main__":
    main()
