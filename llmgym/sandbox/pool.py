"""Pools of :class:`~llmgym.sandbox.worker.SandboxWorker`\\ s: a few per kind, lent one per concurrent caller.

A worker answers one call at a time, and starting one (a sandbox, a zygote importing a library) takes
seconds; so callers share a small set per kind (a scorer, an adapter with its module directories), started
on demand up to ``size`` and lent out one per concurrent call. :class:`WorkerPools` holds a process's pools
by key; after ``os.fork`` the child process starts pools of its own (the parent's workers are not its to use).

Example:
    >>> from llmgym.sandbox.pool import WorkerPools
    >>> from llmgym.sandbox.worker import SandboxWorker
    >>> pools = WorkerPools()
    >>> pool = pools.get("double", lambda: SandboxWorker("def handle(state, request):\\n    return 2 * request\\n"))
    >>> with pool.lend() as worker:
    ...     worker.call(None, 21, time_limit=5)
    ('ok', 42)
    >>> pools.close()
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Hashable, Iterator

from .worker import SandboxWorker

__all__ = ["DEFAULT_POOL_SIZE", "WorkerPool", "WorkerPools"]

#: Workers of one kind that concurrent calls may use (a slow call then holds up only its own).
DEFAULT_POOL_SIZE = max(1, min(4, os.cpu_count() or 1))


class WorkerPool:
    """Idle workers of one kind, lent one per concurrent call, started by ``factory`` up to ``size``."""

    def __init__(self, factory: Callable[[], SandboxWorker], size: int = DEFAULT_POOL_SIZE):
        if size < 1:
            raise ValueError(f"a pool needs at least one worker, got size={size}")
        self.factory, self.size = factory, size
        self.idle: list[SandboxWorker] = []
        self.count = 0
        self.cond = threading.Condition()

    @contextlib.contextmanager
    def lend(self) -> Iterator[SandboxWorker]:
        """An idle worker (a new one while fewer than ``size`` exist; else wait for one), returned after."""
        with self.cond:
            while not self.idle and self.count >= self.size:
                self.cond.wait()
            worker = self.idle.pop() if self.idle else None
            if worker is None:
                self.count += 1
        if worker is None:
            try:
                worker = self.factory()
            except BaseException:
                with self.cond:
                    self.count -= 1
                    self.cond.notify()
                raise
        try:
            yield worker
        finally:
            with self.cond:
                self.idle.append(worker)
                self.cond.notify()

    def close(self) -> None:
        """Stop the idle workers (lent ones stay with their callers and come back as usual)."""
        with self.cond:
            workers, self.idle = self.idle, []
            self.count -= len(workers)
        for worker in workers:
            worker.close()


class WorkerPools:
    """This process's :class:`WorkerPool`\\ s by key (a forked child process starts afresh)."""

    def __init__(self) -> None:
        self._pools: dict[Hashable, WorkerPool] = {}
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def _mine(self) -> dict[Hashable, WorkerPool]:
        if self._pid != os.getpid():  # a forked process: the parent's workers are not ours
            self._pools, self._pid = {}, os.getpid()
        return self._pools

    def get(self, key: Hashable, factory: Callable[[], SandboxWorker], size: int = DEFAULT_POOL_SIZE) -> WorkerPool:
        """The pool under ``key``, made with ``factory`` and ``size`` the first time."""
        with self._lock:
            pools = self._mine()
            if key not in pools:
                pools[key] = WorkerPool(factory, size)
            return pools[key]

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._mine()

    def close(self) -> None:
        """Stop every idle worker of this process's pools (they start again on the next call)."""
        with self._lock:
            pools = list(self._mine().values())
        for pool in pools:
            pool.close()
