"""Running a user's tool with a time limit: a clean helper process forks a killable child per call.

Why not fork the trainer itself (as a verifier's ``time_limit`` does)? A trainer is multi-threaded (torch's
OpenMP pool, tokenizers' Rust threads, a CUDA context): a forked copy inherits whatever locks those
threads held at that instant, and its first touch of one deadlocks; forking a process of many GB also
costs time per call. And ``multiprocessing``'s spawn/forkserver re-import the user's ``__main__`` in the
child (a script without a main guard runs again). So the tools go to **one helper per trainer process**,
started with ``subprocess`` as ``python <llmgym/tools/tool_helper.py>`` — a fresh interpreter that imports
neither ``llmgym`` nor ``__main__`` — and the helper, single-threaded, forks one child per call. Past the
time limit the child's process group is SIGKILLed; a helper that does not answer in time is killed and
started again. The helper gets the trainer's ``sys.path`` and working directory, but not its environment: an
allow-list of it (:func:`llmgym.sandbox.child_env.allowed_environment`: the search path, the locale, the
interpreter's and the thread settings, what ``LLMGYM_PASS_ENV`` names) -- a tool the model drives never sees
``OPENAI_API_KEY`` or ``LLMGYM_SERVE_SECRET``. What one tool needs it names (``Tool(env=..., pass_env=...)``);
each call sets that in its own child.

Tools cross over as cloudpickle blobs (Gymnasium already depends on cloudpickle): a function from an
importable module travels by reference (its module is imported in the helper once), one defined in the
user's script by value. A tool that cannot be pickled is refused when its :class:`~llmgym.tools.Tool` is
built, with what to do. Each call runs in a fresh copy of the helper, so a tool keeps no state between
calls; a tool that must keep state runs in the env's process (``Tool(..., isolated=False)``, no time limit).
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import subprocess
import sys
import threading
import time
from typing import Any

from llmgym.sandbox.child_env import allowed_environment
from llmgym.tools import tool_helper

__all__ = ["ToolWorker", "tool_worker", "WORKER_GRACE_S", "LOAD_TIMEOUT_S", "HELPER_ENV"]

HELPER_ENV = "LLMGYM_TOOL_HELPER"
"""Set in the helper's environment. A tool's module that runs an episode when imported (no main guard)
would otherwise start a helper from the helper, without end: there an isolated tool call is refused."""

WORKER_GRACE_S = 5.0
"""Seconds the helper may take beyond a call's own limit (forking, passing the result) before it is killed."""
LOAD_TIMEOUT_S = 300.0
"""Seconds the helper may take to load a tool the first time (importing its module, which may import torch)."""


class ToolWorker:
    """The helper process of this trainer process (see the module docstring); thread-safe, one call at a time.

    Example:
        >>> from llmgym.tools.helper_process import tool_worker
        >>> import cloudpickle
        >>> tool_worker().call("dict", cloudpickle.dumps(dict), {"a": 2, "b": 3}, time_limit=5.0, max_chars=100)
        ('ok', '{"a": 2, "b": 3}', 16)
        >>> import os
        >>> tool_worker().call("getenv", cloudpickle.dumps(os.getenv), {"key": "X"}, time_limit=5.0, max_chars=100,
        ...                    env={"X": "set for this call"})
        ('ok', 'set for this call', 17)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._loaded: set[str] = set()

    def _start(self) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(tool_helper.__file__)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, close_fds=True,
            env={**allowed_environment(), HELPER_ENV: "1"},
        )
        tool_helper.write_message(proc.stdin, {"sys_path": [os.path.abspath(p) if p else os.getcwd() for p in sys.path]})
        self._loaded = set()
        return proc

    def close(self) -> None:
        """Stop the helper (it also stops by itself when this process exits)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                proc.stdin.close()
                proc.wait(timeout=2)
            except Exception:
                proc.kill()
                proc.wait()

    def _recv(self, proc: subprocess.Popen, deadline: float) -> tuple | None:
        """The helper's next answer, or ``None`` when it does not come by ``deadline`` (or the helper died)."""
        fd = proc.stdout.fileno()
        buffer = b""
        need = tool_helper.HEADER.size
        size = None
        while True:
            while len(buffer) < need:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    return None
                chunk = os.read(fd, max(need - len(buffer), 1 << 16))
                if not chunk:
                    return None
                buffer += chunk
            if size is None:
                (size,) = tool_helper.HEADER.unpack(buffer[: tool_helper.HEADER.size])
                buffer = buffer[tool_helper.HEADER.size:]
                need = size
                continue
            return pickle.loads(buffer[:size])

    def call(self, key: str, blob: bytes, arguments: dict[str, Any], *, time_limit: float, max_chars: int,
             env: dict[str, str] | None = None) -> tuple:
        """Run the pickled function ``blob`` (cached in the helper under ``key``) on ``arguments``, with ``env``
        added to the call's environment (the helper's own is an allow-list: see the module docstring).

        Returns ``("ok", text, length)`` (the result as text, cut to ``max_chars``; ``length`` before the
        cut), ``("exception", "Type: message", length)``, ``("timeout",)`` or ``("crashed", why)``; a tool that
        cannot be loaded in the helper gives ``("load_error", why)``.
        """
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = self._start()
            proc = self._proc
            try:
                if key not in self._loaded:  # the tool's own module import is no part of a call's time
                    tool_helper.write_message(proc.stdin, ("load", key, blob))
                    answer = self._recv(proc, time.monotonic() + LOAD_TIMEOUT_S)
                    if answer is None:
                        self._stop(proc)
                        return ("load_error", f"loading it took longer than {LOAD_TIMEOUT_S:g} s, or the worker died")
                    if answer[0] != "loaded":
                        return answer
                    self._loaded.add(key)
                deadline = time.monotonic() + time_limit + WORKER_GRACE_S
                tool_helper.write_message(proc.stdin, ("call", key, arguments, float(time_limit), int(max_chars), dict(env or {})))
                answer = self._recv(proc, deadline)
                if answer is None:
                    raise TimeoutError
                return answer
            except (TimeoutError, BrokenPipeError, OSError):  # a helper that hangs or died: start afresh next call
                try:  # a helper that died closed its pipe just before it was reaped: give that an instant
                    proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
                died_by_itself = proc.returncode is not None
                self._stop(proc)
                if died_by_itself:
                    return ("crashed", f"the tool worker process exited with status {proc.returncode}")
                return ("timeout",)

    def _stop(self, proc: subprocess.Popen) -> None:
        proc.kill()
        proc.wait()
        self._proc = None


_worker_instance: ToolWorker | None = None
_instance_lock = threading.Lock()


def tool_worker() -> ToolWorker:
    """The helper of this process (started on its first call; a forked child gets its own)."""
    global _worker_instance
    with _instance_lock:
        if _worker_instance is None:
            _worker_instance = ToolWorker()
            atexit.register(_worker_instance.close)
        return _worker_instance


def _forget_in_child() -> None:
    """A forked process (an ``AsyncVectorEnv`` worker) starts its own helper: the parent's pipes and lock are not its."""
    global _worker_instance, _instance_lock
    _worker_instance, _instance_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
