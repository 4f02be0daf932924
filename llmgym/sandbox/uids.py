"""The pool of unprivileged uids: one per concurrent run, held with a file lock across processes.

A uid belongs to one run at a time, so ``RLIMIT_NPROC`` counts only that run's processes and a
sweep of the uid (:func:`kill_uid`) kills only its leftovers. A judged run's judge uses the uid +
:data:`~llmgym.sandbox.JUDGE_UID_OFFSET`. Uids that belong to an account are never used.

Example:
    >>> from llmgym.sandbox.uids import pids_of_uids
    >>> pids_of_uids([61999]) == []
    True
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import pwd
import random
import signal
import tempfile
import time
from collections.abc import Iterable

from .policy import JUDGE_UID_OFFSET, SandboxError

__all__ = ["UidPool", "default_lock_dir", "kill_uid", "pids_of_uids"]

log = logging.getLogger("llmgym.sandbox")


def default_lock_dir() -> str:
    if os.geteuid() == 0 and os.path.isdir("/run/lock"):
        return "/run/lock/llmgym-sandbox"
    return os.path.join(tempfile.gettempdir(), f"llmgym-sandbox-{os.geteuid()}")


def _has_live_thread(pid: str) -> bool:
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                    return True
    except (OSError, IndexError):
        pass
    return False


def pids_of_uids(uids: Iterable[int]) -> list[int]:
    """Pids of live processes whose real uid is in ``uids`` (a ``/proc`` scan). A zombie is left out
    (it only waits for its parent to collect it) -- unless one of its threads still runs: a thread-group
    leader that exits with a second thread alive shows as a zombie and is anything but dead.

    Example:
        >>> import os
        >>> os.getpid() in pids_of_uids([os.getuid()])
        True
    """
    wanted = {int(u) for u in uids}
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as fh:
                fields = dict(line.split(b":", 1) for line in fh.read().splitlines() if b":" in line)
            if int(fields[b"Uid"].split()[0]) not in wanted:
                continue
            if fields[b"State"].split()[0] in (b"Z", b"X") and not _has_live_thread(name):
                continue
            found.append(int(name))
        except (OSError, ValueError, KeyError, IndexError):
            continue
    return found


def kill_uid(uid: int) -> int:
    """SIGKILL every process of ``uid`` (repeat until none is left); returns how many were seen."""
    seen = 0
    for _ in range(50):
        pids = pids_of_uids([uid])
        if not pids:
            break
        seen += len(pids)
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.005)
    return seen



class UidPool:
    """Hands out one uid per concurrent run, across threads *and* processes (flock per uid)."""

    def __init__(self, uid_range: tuple[int, int], lock_dir: str):
        lo, hi = uid_range
        uids = []
        for u in range(lo, hi):
            accounts = []
            for v in (u, u + JUDGE_UID_OFFSET):
                try:
                    pwd.getpwuid(v)
                    accounts.append(v)
                except KeyError:
                    pass
            if not accounts:
                uids.append(u)
            else:  # a real account: never run untrusted code as it, never kill its processes
                log.warning("sandbox: uid %d belongs to an account; not using uid %d", accounts[0], u)
        if not uids:
            raise SandboxError(
                f"no free uid in {lo}..{hi - 1} (all belong to accounts)"
            )
        self.uids = uids
        self.lock_dir = lock_dir
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)

    @contextlib.contextmanager
    def acquire(self, timeout: float = 120.0):
        deadline = time.monotonic() + timeout
        start = random.randrange(len(self.uids))
        while True:
            for k in range(len(self.uids)):
                uid = self.uids[(start + k) % len(self.uids)]
                fd = os.open(
                    os.path.join(self.lock_dir, f"uid-{uid}.lock"),
                    os.O_RDWR | os.O_CREAT,
                    0o600,
                )
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as e:
                    os.close(fd)
                    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                    continue
                try:
                    # leftovers of a run whose host process was killed
                    left = kill_uid(uid) + kill_uid(uid + JUDGE_UID_OFFSET)
                    if left:
                        log.warning(
                            "sandbox: killed %d leftover process(es) of uid %d",
                            left,
                            uid,
                        )
                    yield uid
                finally:
                    os.close(fd)
                return
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"no free sandbox uid within {timeout:.0f} s "
                    f"({len(self.uids)} uids, all busy)"
                )
            time.sleep(0.01)
