"""The killable child: run one call in a forked process, SIGKILL it and all it started at its deadline.

A time limit is enforced by something that can stop the work -- a killed process, never a thread. This
module is the one implementation of that rule for code that runs on the host: a ``Verifier(time_limit=...)``,
a multi-turn env's ``respond_time_limit``, the tools' helper (``llmgym/tools/tool_helper.py`` loads this file
by path: it imports nothing of ``llmgym``), and the interop adapters, which ask :func:`in_killable_child`
before starting a sandboxed worker. (Inside the sandbox, the zygote of :mod:`llmgym.sandbox.worker` forks
its calls in its own namespace and cgroup.)

How: ``os.fork`` (no re-import of the user's ``__main__``, the callable need not pickle, and a daemonic
parent such as an ``AsyncVectorEnv`` worker may fork where ``multiprocessing`` would refuse it a child). The
child makes its own process group, asks to die with its parent, runs the call, writes the pickled outcome on
a private pipe and leaves with ``os._exit`` (no ``atexit`` handlers or flushing of the parent's copied state).
The parent reads at most ``max_result_bytes`` until the deadline, then kills the whole process group --
whatever the call started goes with it -- and reaps the child. Standard library only.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import time
from typing import Any, Callable, NamedTuple, Optional

__all__ = ["ChildOutcome", "call_in_killable_child", "in_killable_child", "mark_killable_child",
           "start_child_process", "DEFAULT_MAX_RESULT_BYTES"]

DEFAULT_MAX_RESULT_BYTES = 64 << 20
"""The most bytes of pickled result read back from a child (more is reported as a failure, not read)."""

_IN_KILLABLE_CHILD = False
_die_with_parent: Optional[Callable[[], Any]] = None


class ChildOutcome(NamedTuple):
    """How a killable call ended.

    ``status`` is ``"ok"`` (``value`` is the call's result), ``"raised"`` (``value`` is the exception, or
    its ``"Type: message"`` text where it does not pickle), ``"timeout"`` (killed at the limit),
    ``"died"`` (ended without a readable answer: ``value`` says how), ``"oversized"`` (its answer
    passed ``max_result_bytes``: killed, not read) or ``"watch_closed"`` (``watch_fd`` became readable first: the caller's caller went away).
    """

    status: str
    value: Any = None


def in_killable_child() -> bool:
    """True inside a child forked by :func:`call_in_killable_child` (the whole child dies at its limit,
    so starting anything slow there -- a sandboxed worker -- would eat the call's time).

    Example:
        >>> from llmgym.sandbox.killable import call_in_killable_child, in_killable_child
        >>> in_killable_child(), call_in_killable_child(in_killable_child, limit=30).value
        (False, True)
    """
    return _IN_KILLABLE_CHILD


def mark_killable_child() -> None:
    """Make :func:`in_killable_child` true in this process (done first thing in every such child)."""
    global _IN_KILLABLE_CHILD
    _IN_KILLABLE_CHILD = True


def start_child_process(process: Any) -> None:
    """Start a daemonic ``multiprocessing`` process, also from inside a daemonic process.

    ``multiprocessing`` refuses children of a daemonic process (an ``AsyncVectorEnv`` worker is one)
    because it could not join them at exit; a child its caller kills and joins itself may lift the flag
    for its start. (:func:`call_in_killable_child` forks directly and needs none of this.)

    Example:
        >>> import multiprocessing
        >>> p = multiprocessing.get_context("fork").Process(target=abs, args=(-1,), daemon=True)
        >>> start_child_process(p); p.join(); p.exitcode
        0
    """
    import multiprocessing

    config = multiprocessing.current_process()._config  # noqa: SLF001 (no public switch exists)
    parent_is_daemon = bool(config.get("daemon"))
    if parent_is_daemon:
        config["daemon"] = False
    try:
        process.start()
    finally:
        if parent_is_daemon:
            config["daemon"] = True


def _death_signal_setter() -> Callable[[], Any]:
    """A function that makes the calling process get SIGKILL when its parent dies (Linux ``prctl``; a no-op
    elsewhere, where the time limit still holds). Built once: loading libc in every child costs milliseconds."""
    global _die_with_parent
    if _die_with_parent is None:
        try:
            import ctypes

            prctl = ctypes.CDLL(None, use_errno=True).prctl
            _die_with_parent = lambda: prctl(1, signal.SIGKILL)  # noqa: E731  (PR_SET_PDEATHSIG)
        except Exception:
            _die_with_parent = lambda: None  # noqa: E731
    return _die_with_parent


def _child(fn: Callable[..., Any], args: tuple, pipe_w: int, die_with_parent: Callable[[], Any]) -> None:
    """In the forked child: run, write the pickled ``(status, value)``, exit without cleanup."""
    try:
        os.setpgid(0, 0)  # its own process group: whatever it starts is killed with it
        die_with_parent()
        mark_killable_child()
        try:
            outcome = ("ok", fn(*args))
            data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as exc:  # the call's own error, or a result that does not pickle
            try:
                data = pickle.dumps(("raised", exc), protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException:
                data = pickle.dumps(("raised", f"{type(exc).__name__}: {exc}"), protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(data)
        while view:
            view = view[os.write(pipe_w, view):]
    finally:
        os._exit(0)


def call_in_killable_child(fn: Callable[..., Any], *args: Any, limit: float,
                           max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
                           watch_fd: Optional[int] = None) -> ChildOutcome:
    """``fn(*args)`` in a forked child, killed with its whole process group after ``limit`` seconds.

    ``watch_fd``: a file descriptor whose readability ends the wait early (``"watch_closed"``): a helper
    process watches its parent's pipe with it.

    Example:
        >>> from llmgym.sandbox.killable import call_in_killable_child
        >>> call_in_killable_child(pow, 2, 10, limit=30)
        ChildOutcome(status='ok', value=1024)
        >>> import time
        >>> call_in_killable_child(time.sleep, 60, limit=0.5).status
        'timeout'
        >>> call_in_killable_child(int, "x", limit=30).value
        ValueError("invalid literal for int() with base 10: 'x'")
    """
    die_with_parent = _death_signal_setter()
    pipe_r, pipe_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(pipe_r)
        _child(fn, args, pipe_w, die_with_parent)
    os.close(pipe_w)
    chunks: list[bytes] = []
    size = 0
    deadline = time.monotonic() + limit
    outcome: Optional[ChildOutcome] = None
    watched = [pipe_r] if watch_fd is None else [pipe_r, watch_fd]
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                outcome = ChildOutcome("timeout")
                break
            ready, _, _ = select.select(watched, [], [], left)
            if watch_fd is not None and watch_fd in ready:
                outcome = ChildOutcome("watch_closed")
                break
            if pipe_r in ready:
                chunk = os.read(pipe_r, 1 << 16)
                if not chunk:
                    break
                size += len(chunk)
                if size > max_result_bytes:
                    outcome = ChildOutcome("oversized", max_result_bytes)
                    break
                chunks.append(chunk)
    finally:
        os.close(pipe_r)
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _, wait_status = os.waitpid(pid, 0)
    if outcome is not None:
        return outcome
    try:
        status, value = pickle.loads(b"".join(chunks))
    except Exception:
        code = os.waitstatus_to_exitcode(wait_status)
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return ChildOutcome("died", f"the process ended without an answer ({how})")
    return ChildOutcome(status, value)
