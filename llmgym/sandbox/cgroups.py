"""One cgroup per uid slot: a memory and process cap for a sandbox's whole process tree (optional);
and, for a worker's calls, one cgroup v2 whose ``cgroup.kill`` ends every process a call started.

The caps are used wherever the cgroup tree is writable (root, cgroup v1 memory+pids or v2 with both
delegated); without them memory is capped per process only (``RLIMIT_AS`` x ``RLIMIT_NPROC``).

:class:`CallCgroup` is the unit a :class:`~llmgym.sandbox.worker.SandboxWorker` kills after each call:
the call's child joins it before it drops its privileges, everything it starts is born inside, and one
write to ``cgroup.kill`` SIGKILLs them all -- zombie thread-group leaders with live threads, stopped,
``setsid``/double-forked processes included -- with the kernel refusing new forks meanwhile. It needs
cgroup v2 (pure, or the ``unified`` half of a hybrid tree), kernel >= 5.14 and root; without it the
worker's zygote sweeps its pid namespace instead (and ends the namespace if anything survives).

Example:
    >>> from llmgym.sandbox.cgroups import JOIN_CGROUPS
    >>> JOIN_CGROUPS.endswith('exec "$@"')
    True
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess

from .limits import SandboxLimits

__all__ = ["JOIN_CGROUPS", "CallCgroup", "Cgroups", "call_cgroup_probe", "cgroup_probe"]


_CG_NAME = "llmgym-sandbox"
_probe_counter = itertools.count()
# launcher: join the cgroups given before "--", then become the command after it
JOIN_CGROUPS = (
    'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
)


def _own_cgroups() -> dict[str, str]:
    """controller ("memory", "pids", or "" for cgroup v2) -> this process's cgroup path."""
    own = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                own[c] = path
    return own


def _make_bases(own: dict[str, str]) -> dict[str, str]:
    """Make (or find) the parent folders llmgym's cgroups live in: ``{"unified": dir}`` on cgroup v2, with the
    memory and pids controllers enabled for its children, else ``{"memory": dir, "pids": dir}`` (v1)."""
    root = "/sys/fs/cgroup"
    if os.path.exists(os.path.join(root, "cgroup.controllers")):  # pure v2
        base = os.path.join(root, own.get("", "/").lstrip("/"), _CG_NAME)
        os.makedirs(base, exist_ok=True)
        with open(os.path.join(base, "cgroup.subtree_control"), "w") as fh:
            fh.write("+memory +pids")
        return {"unified": base}
    dirs = {}
    for c in ("memory", "pids"):
        mount = os.path.join(root, c)
        if c not in own or not os.path.exists(os.path.join(mount, "cgroup.procs")):
            raise _NoController(f"no cgroup v1 {c} controller mounted")
        dirs[c] = os.path.join(mount, own[c].lstrip("/"), _CG_NAME)
        os.makedirs(dirs[c], exist_ok=True)
    return dirs


class _NoController(Exception):
    pass


def cgroup_probe() -> tuple[dict[str, str] | None, str]:
    """Where per-run cgroups can be made: {"memory": dir, "pids": dir} (v1) or
    {"unified": dir} (v2), each a parent dir owned by llmgym; else (None, reason).

    The parent folders are shared by every llmgym process of the machine (two runs, a second test suite, a
    sandboxed scorer); each process probes in a trial cgroup of its own (``probe-<pid>-<n>``), so one
    process's clean-up never removes what another is about to join."""
    try:
        dirs = _make_bases(_own_cgroups())
        # a trial: a child cgroup with limits, and a process that joins it
        cg = Cgroups(dirs)
        slot = f"probe-{os.getpid()}-{next(_probe_counter)}"
        procs = cg.prepare(slot, SandboxLimits())
        script = 'for f in "$@"; do echo $$ > "$f" || exit 1; done'
        try:
            out = subprocess.run(
                ["/bin/sh", "-c", script, "sh", *procs],
                check=False,
                capture_output=True,
                text=True,
                timeout=10,
            )
        finally:
            cg.remove(slot)
        if out.returncode != 0:
            return None, f"cannot join a cgroup: {out.stderr.strip()[-200:]}"
        return dirs, ""
    except _NoController as e:
        return None, str(e)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return None, f"cgroups not writable here: {e}"


class Cgroups:
    """One cgroup per uid slot capping the memory (tmpfs included) and the process count of the
    whole sandbox tree; a launcher shell joins it before exec'ing bwrap, so every process of
    the run is inside from its first instruction."""

    def __init__(self, dirs: dict[str, str]):
        self.dirs = dirs

    def _dir(self, ctrl: str, slot: str) -> str:
        return os.path.join(self.dirs.get("unified") or self.dirs[ctrl], slot)

    @staticmethod
    def _write(path: str, value: str) -> None:
        with open(path, "w") as fh:
            fh.write(value)

    def prepare(self, slot: str, lim: SandboxLimits) -> list[str]:
        """Make/refresh the slot's cgroups; return the cgroup.procs files to join."""
        mem = int((lim.memory_mb + 2 * lim.tmp_size_mb) * (1 << 20))
        pids = int(lim.max_processes) + 8  # bwrap, the supervisor, launcher slack
        mdir, pdir = self._dir("memory", slot), self._dir("pids", slot)
        if not all(os.path.isdir(d) for d in self.dirs.values()):  # the shared folders, removed meanwhile
            self.dirs.update(_make_bases(_own_cgroups()))
        for d in {mdir, pdir}:
            os.makedirs(d, exist_ok=True)
        if "unified" in self.dirs:
            self._write(os.path.join(mdir, "memory.max"), str(mem))
            with contextlib.suppress(OSError):
                self._write(os.path.join(mdir, "memory.swap.max"), "0")
            self._write(os.path.join(pdir, "pids.max"), str(pids))
            return [os.path.join(mdir, "cgroup.procs")]
        limit = os.path.join(mdir, "memory.limit_in_bytes")
        memsw = os.path.join(
            mdir, "memory.memsw.limit_in_bytes"
        )  # with swap accounting
        try:  # v1 wants memory <= memory+swap at every step: lower memory first ...
            self._write(limit, str(mem))
            if os.path.exists(memsw):
                self._write(memsw, str(mem))
        except OSError:  # ... raise memory+swap first
            if not os.path.exists(memsw):
                raise
            self._write(memsw, str(mem))
            self._write(limit, str(mem))
        self._write(os.path.join(pdir, "pids.max"), str(pids))
        return [os.path.join(mdir, "cgroup.procs"), os.path.join(pdir, "cgroup.procs")]

    def oom_kills(self, slot: str) -> int:
        name = "memory.events" if "unified" in self.dirs else "memory.oom_control"
        try:
            with open(os.path.join(self._dir("memory", slot), name)) as fh:
                for line in fh:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            pass
        return 0

    def remove(self, slot: str) -> None:
        for d in {self._dir("memory", slot), self._dir("pids", slot)}:
            with contextlib.suppress(OSError):
                if (
                    "unified" not in self.dirs
                ):  # v1 refuses to shrink below usage: reset first
                    with contextlib.suppress(OSError):
                        self._write(os.path.join(d, "memory.force_empty"), "0")
                os.rmdir(d)


def _v2_base() -> str | None:
    """This process's cgroup in the cgroup v2 hierarchy (pure v2 at /sys/fs/cgroup, or a hybrid tree's
    /sys/fs/cgroup/unified), or None where there is none."""
    own = _own_cgroups().get("", "/").lstrip("/")
    for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if os.path.exists(os.path.join(mount, "cgroup.controllers")):
            return os.path.join(mount, own).rstrip("/")
    return None


class CallCgroup:
    """The kill unit of a worker's calls: ``<v2 base>/llmgym-sandbox/uid-N/call`` (under the slot's
    memory and pids caps on a pure v2 tree)."""

    def __init__(self, base: str):
        self.base = base

    def open(self, slot: str) -> tuple[int, int]:
        """Make the slot's call cgroup, kill whatever an earlier host process left in it, and return
        ``(cgroup.procs, cgroup.kill)`` opened for writing (close-on-exec: only ``pass_fds`` hands them on).
        The permission to move a process is checked against the opener (root here), so the sandboxed
        zygote can use them without seeing the cgroup tree."""
        path = os.path.join(self.base, _CG_NAME, slot, "call")
        os.makedirs(path, exist_ok=True)
        self._write(os.path.join(path, "cgroup.kill"), "1")
        procs = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        try:
            kill = os.open(os.path.join(path, "cgroup.kill"), os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            os.close(procs)
            raise
        return procs, kill

    _write = staticmethod(Cgroups._write)


def call_cgroup_probe() -> tuple[str | None, str]:
    """``(v2 base, "")`` where a :class:`CallCgroup` works here (a trial process joins one and is killed
    by ``cgroup.kill``); else ``(None, reason)``."""
    try:
        base = _v2_base()
        if base is None:
            return None, "no cgroup v2 hierarchy mounted"
        slot = f"probe-{os.getpid()}"  # other processes may probe at the same time
        procs, kill = CallCgroup(base).open(slot)
        try:
            if not os.path.exists(os.path.join(base, _CG_NAME, slot, "call", "cgroup.kill")):
                return None, "no cgroup.kill (Linux >= 5.14 is needed)"
            trial = subprocess.Popen(["/bin/sleep", "30"], stdin=subprocess.DEVNULL)
            try:
                os.write(procs, b"%d" % trial.pid)
                os.write(kill, b"1")
                trial.wait(timeout=5)
            finally:
                if trial.poll() is None:
                    trial.kill()
                    trial.wait()
            if trial.returncode != -9:
                return None, f"cgroup.kill did not kill the trial process (status {trial.returncode})"
            return base, ""
        finally:
            os.close(procs)
            os.close(kill)
            for d in ("call", ""):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(base, _CG_NAME, slot, d))
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return None, f"cgroup v2 not writable here: {e}"
