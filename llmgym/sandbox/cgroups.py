"""One cgroup per uid slot: a memory and process cap for a sandbox's whole process tree (optional).

Used wherever the cgroup tree is writable (root, cgroup v1 memory+pids or v2 with both delegated);
without it memory is capped per process only (``RLIMIT_AS`` x ``RLIMIT_NPROC``).

Example:
    >>> from llmgym.sandbox.cgroups import JOIN_CGROUPS
    >>> JOIN_CGROUPS.endswith('exec "$@"')
    True
"""

from __future__ import annotations

import contextlib
import os
import subprocess

from .limits import SandboxLimits

__all__ = ["JOIN_CGROUPS", "Cgroups", "cgroup_probe"]


_CG_NAME = "llmgym-sandbox"
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


def cgroup_probe() -> tuple[dict[str, str] | None, str]:
    """Where per-run cgroups can be made: {"memory": dir, "pids": dir} (v1) or
    {"unified": dir} (v2), each a parent dir owned by llmgym; else (None, reason)."""
    try:
        own = _own_cgroups()
        root = "/sys/fs/cgroup"
        if os.path.exists(os.path.join(root, "cgroup.controllers")):  # pure v2
            base = os.path.join(root, own.get("", "/").lstrip("/"), _CG_NAME)
            os.makedirs(base, exist_ok=True)
            with open(os.path.join(base, "cgroup.subtree_control"), "w") as fh:
                fh.write("+memory +pids")
            dirs = {"unified": base}
        else:
            dirs = {}
            for c in ("memory", "pids"):
                mount = os.path.join(root, c)
                if c not in own or not os.path.exists(
                    os.path.join(mount, "cgroup.procs")
                ):
                    return None, f"no cgroup v1 {c} controller mounted"
                dirs[c] = os.path.join(mount, own[c].lstrip("/"), _CG_NAME)
                os.makedirs(dirs[c], exist_ok=True)
        # a trial: a child cgroup with limits, and a process that joins it
        cg = Cgroups(dirs)
        procs = cg.prepare("probe", SandboxLimits())
        script = 'for f in "$@"; do echo $$ > "$f" || exit 1; done'
        out = subprocess.run(
            ["/bin/sh", "-c", script, "sh", *procs],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        )
        cg.remove("probe")
        if out.returncode != 0:
            return None, f"cannot join a cgroup: {out.stderr.strip()[-200:]}"
        return dirs, ""
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
