"""Worker processes with a wall-clock limit per call: a call past its limit has its worker killed.

A hung pure-Python computation cannot be stopped from another thread, and ``signal.alarm`` works
only on a process's main thread and cannot interrupt long C calls (a huge integer power inside
SymPy). A separate process can always be killed, so :class:`DeadlinePool` runs each call in a
worker process, waits on all of them with ``multiprocessing.connection.wait`` and, when a call
overstays its limit, kills that one worker and starts a fresh one; the other workers keep going.
Workers live as long as the pool, so their start-up (importing the verifier) is paid once.
"""

from __future__ import annotations

import collections
import multiprocessing
import multiprocessing.connection
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from llmgym.verifiers import start_child_process

__all__ = ["DeadlinePool", "default_mp_context"]


def default_mp_context() -> multiprocessing.context.BaseContext:
    """``forkserver`` where the platform has it (safe in a process with threads), else ``spawn``.

    Plain ``fork`` would copy a training process mid-flight (CUDA, tokenizer and watchdog threads),
    which can deadlock the child; ``forkserver`` forks from a small clean server instead.

    Example:
        >>> from llmgym.envs.math.pool import default_mp_context
        >>> default_mp_context().get_start_method() in ("forkserver", "spawn")
        True
    """
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _serve(
    conn: multiprocessing.connection.Connection, fn: Callable[..., Any], initializer: Callable[[], Any] | None
) -> None:
    # Ctrl-C belongs to the parent, which decides what to do with its workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        try:
            initializer()
        except Exception:  # a failed warm-up shows up in the first real call instead
            pass
    conn.send(_READY)  # the clock of the first call starts only now, not during imports
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, args = message
        try:
            outcome = ("ok", fn(*args))
        except BaseException as exc:  # report, never die: the parent maps it to the item
            outcome = ("error", f"{type(exc).__name__}: {exc}")
        try:
            conn.send((index, outcome))
        except Exception as exc:  # an unpicklable result must not kill the worker
            conn.send((index, ("error", f"the result could not be sent back: {type(exc).__name__}: {exc}")))


_READY = "ready"
START_TIMEOUT = 120.0  # seconds a new worker may take to import and warm up


class _Worker:
    def __init__(self, ctx: multiprocessing.context.BaseContext, fn: Callable[..., Any], initializer: Any):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_serve, args=(child, fn, initializer), daemon=True, name="llmgym-verifier"
        )
        start_child_process(self.process)  # also inside an AsyncVectorEnv worker (a daemonic process)
        child.close()
        self.ready = False
        self.started = time.monotonic()

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(timeout=1)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.conn.close()


class DeadlinePool:
    """Run ``fn(*args)`` for many ``args`` in worker processes, each call limited to ``time_limit`` s.

    ``initializer()`` runs once in each new worker (imports, warm-up) before its clock starts.

    Results come back in input order as ``("ok", value)``, ``("error", message)`` (an exception in
    ``fn`` or a worker that died) or ``("timeout", None)``. ``fn`` must be picklable (a module-level
    function or a bound method of a picklable object). Calls to :meth:`map` from several threads are
    serialised. Close the pool (or use it as a context manager) to stop its workers; they are
    daemons, so they also end with the parent.

    Example:
        >>> from llmgym.envs.math.pool import DeadlinePool
        >>> with DeadlinePool(abs, max_workers=2) as pool:
        ...     pool.map([(-1,), (2,), (-3,)], time_limit=10)
        [('ok', 1), ('ok', 2), ('ok', 3)]
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        max_workers: int,
        mp_context: Any = None,
        initializer: Callable[[], Any] | None = None,
    ):
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.fn, self.max_workers, self.initializer = fn, max_workers, initializer
        if isinstance(mp_context, str):
            mp_context = multiprocessing.get_context(mp_context)
        self.ctx = mp_context or default_mp_context()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False

    def map(self, args_list: Sequence[tuple], time_limit: float | None) -> list[tuple[str, Any]]:
        """Run every call; a call's clock starts when a worker picks it up."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this DeadlinePool is closed")
            try:
                return self._run(list(args_list), time_limit)
            except BaseException:  # Ctrl-C or a failed start: busy workers would send stale results later
                for worker in list(self._workers):
                    self._discard(worker)
                raise

    def _run(self, args_list: list[tuple], time_limit: float | None) -> list[tuple[str, Any]]:
        results: list[tuple[str, Any] | None] = [None] * len(args_list)
        queue = collections.deque(range(len(args_list)))
        busy: dict[_Worker, tuple[int, float | None]] = {}
        wanted = min(self.max_workers, len(args_list))
        while queue or busy:
            while len(self._workers) < wanted:
                self._workers.append(_Worker(self.ctx, self.fn, self.initializer))
            for worker in list(self._workers):
                if not worker.ready or worker in busy or not queue:
                    continue
                index = queue.popleft()
                try:
                    worker.conn.send((index, args_list[index]))
                except OSError:  # the worker died while idle: replace it, retry the item
                    self._discard(worker)
                    queue.appendleft(index)
                    continue
                busy[worker] = (index, None if time_limit is None else time.monotonic() + time_limit)
            starting = [w for w in self._workers if not w.ready]
            waiting = list(busy) + starting
            if not waiting:
                continue
            deadlines = [d for _, d in busy.values() if d is not None]
            deadlines += [w.started + START_TIMEOUT for w in starting]
            wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            by_conn = {w.conn: w for w in waiting}
            for conn in multiprocessing.connection.wait(list(by_conn), timeout=wait_s):
                worker = by_conn[conn]
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    message = None
                if not worker.ready:
                    if message == _READY:
                        worker.ready = True
                        continue
                    code = worker.process.exitcode
                    self._discard(worker)
                    raise RuntimeError(f"a verifier worker process failed to start (exit code {code})")
                index, _ = busy.pop(worker)
                if message is None:
                    code = worker.process.exitcode
                    results[index] = ("error", f"the worker process died (exit code {code}) while verifying")
                    self._discard(worker)
                else:
                    results[index] = message[1]
            now = time.monotonic()
            for worker, (index, deadline) in list(busy.items()):
                if deadline is not None and now >= deadline:
                    busy.pop(worker)
                    results[index] = ("timeout", None)
                    self._discard(worker)  # the only way to stop a hung call is to end its process
            for worker in starting:
                if not worker.ready and now >= worker.started + START_TIMEOUT:
                    self._discard(worker)
                    raise RuntimeError(f"a verifier worker process did not start within {START_TIMEOUT} s")
        return results  # type: ignore[return-value]

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        self._workers.remove(worker)

    def close(self) -> None:
        """Stop all workers (idempotent)."""
        with self._lock:
            self._closed = True
            for worker in self._workers:
                worker.stop()
            self._workers = []

    def __enter__(self) -> DeadlinePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
