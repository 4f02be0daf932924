"""Which isolation mechanisms work on this machine (probed once per process and interpreter).

Example:
    >>> from llmgym.sandbox.probe import check_sandbox
    >>> sorted(k for k in ("bwrap", "seccomp", "setuid", "python", "cgroup") if k in check_sandbox())
    ['bwrap', 'cgroup', 'python', 'seccomp', 'setuid']
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

from .bootstrap import BOOTSTRAP
from .cgroups import call_cgroup_probe, cgroup_probe
from .mounts import bwrap_base_args, minimal_env, tmpfs_args, world_readable
from .policy import DEFAULT_PYTHON, INSTALL_HINTS, MECHANISMS

__all__ = ["check_sandbox", "probe"]


@functools.cache
def probe(python: str) -> dict:
    """Find which mechanisms work (cached per interpreter; ``check_sandbox(refresh=True)`` resets)."""
    info: dict = {m: False for m in MECHANISMS}
    why: dict[str, str] = {}
    as_root = os.geteuid() == 0

    # python
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        why["python"] = f"{python} not found"
    elif as_root and not world_readable(python):
        why["python"] = f"{python} is not readable by an unprivileged uid"
    else:
        try:
            out = subprocess.run(
                [
                    python,
                    "-I",
                    "-S",
                    "-c",
                    "import sys; print('%d.%d.%d' % sys.version_info[:3])",
                ],
                check=False,
                capture_output=True,
                text=True,
                timeout=30,
                env=minimal_env(),
            )
            if out.returncode == 0:
                info["python"] = True
                info["python_version"] = out.stdout.strip()
            else:
                why["python"] = f"{python} failed: {out.stderr.strip()[-200:]}"
        except (OSError, subprocess.SubprocessError) as e:
            why["python"] = f"{python} failed: {e}"
    info["python_path"] = python

    # setuid
    if as_root:
        info["setuid"] = True
    else:
        why["setuid"] = f"running as uid {os.geteuid()}, not root"

    # seccomp (compile the filter with the system interpreter's libseccomp binding)
    if info["python"]:
        try:
            out = subprocess.run(
                [python, "-I", "-c", BOOTSTRAP, "--export-bpf"],
                check=False,
                capture_output=True,
                timeout=30,
                env=minimal_env(),
            )
            if out.returncode == 0 and out.stdout and len(out.stdout) % 8 == 0:
                info["seccomp"] = True
                info["_bpf"] = out.stdout
            else:
                err = out.stderr.decode(errors="replace").strip().splitlines()
                why["seccomp"] = err[-1] if err else "filter export failed"
        except (OSError, subprocess.SubprocessError) as e:
            why["seccomp"] = str(e)
    else:
        why["seccomp"] = "needs the system python"

    # bwrap
    bwrap = shutil.which("bwrap")
    info["bwrap_path"] = bwrap
    if bwrap is None:
        why["bwrap"] = "bwrap not found on PATH"
    else:
        try:
            ver = subprocess.run(
                [bwrap, "--version"],
                check=False,
                capture_output=True,
                text=True,
                timeout=10,
            )
            info["bwrap_version"] = (
                ver.stdout.strip().split()[-1] if ver.stdout.strip() else None
            )
            target = python if info["python"] else "/bin/true"
            cmd = (
                bwrap_base_args(bwrap, python, as_root)
                + tmpfs_args(1 << 20)
                + [
                    "--",
                    target,
                    *(["-I", "-S", "-c", "pass"] if info["python"] else []),
                ]
            )
            out = subprocess.run(
                cmd,
                check=False,
                capture_output=True,
                text=True,
                timeout=30,
                env=minimal_env(),
            )
            if out.returncode == 0:
                info["bwrap"] = True
            else:
                msg = out.stderr.strip()[-300:]
                if "Unknown option" in msg:
                    msg += " (bubblewrap >= 0.7 is needed)"
                else:
                    msg = "bwrap cannot create the sandbox here: " + msg
                why["bwrap"] = msg
        except (OSError, subprocess.SubprocessError) as e:
            why["bwrap"] = f"bwrap failed: {e}"

    # cgroup: one memory + pids cap for the whole tree (root only)
    if as_root:
        dirs, reason = cgroup_probe()
        if dirs:
            info["cgroup"] = True
            info["_cgroup_dirs"] = dirs
            info["cgroup_version"] = 2 if "unified" in dirs else 1
        else:
            why["cgroup"] = reason
    else:
        why["cgroup"] = "needs root"
    # the kill unit of a worker's calls (not a mechanism of its own: without it the zygote sweeps its
    # pid namespace, and ends the namespace if anything survives)
    base, reason = call_cgroup_probe() if as_root else (None, "needs root")
    info["cgroup_kill"] = base is not None
    info["_call_cgroup_base"] = base
    if base is None:
        why["cgroup_kill"] = reason

    info["missing"] = [m for m in MECHANISMS if not info[m]]
    info["why"] = why
    return info


def check_sandbox(python: str = DEFAULT_PYTHON, *, refresh: bool = False) -> dict:
    """Report which isolation mechanisms are available on this machine.

    Returns a dict with one boolean per mechanism in :data:`MECHANISMS` (``bwrap``, ``seccomp``,
    ``setuid``, ``python``, ``cgroup``), ``missing`` (their names), ``why`` (a reason per
    missing mechanism), ``hints`` (how to install each missing one) and versions/paths; and
    ``cgroup_kill``: whether a worker's calls each get a cgroup v2 killed whole by ``cgroup.kill``
    (optional: without it the zygote's namespace sweep ends them).  The
    probe runs once per process (about 100 ms); pass ``refresh=True`` to run it again.

    Example:
        >>> from llmgym.sandbox import DEFAULT_REQUIRED, check_sandbox
        >>> info = check_sandbox()
        >>> [m for m in DEFAULT_REQUIRED if info[m]]
        ['bwrap', 'seccomp', 'setuid', 'python']
        >>> info["bwrap_version"], info["python_version"]  # doctest: +ELLIPSIS
        ('0...', '3...')
    """
    if refresh:
        probe.cache_clear()
    info = dict(probe(python))
    info.pop("_bpf", None)
    info.pop("_cgroup_dirs", None)
    info.pop("_call_cgroup_base", None)
    info["why"] = dict(info["why"])
    info["missing"] = list(info["missing"])
    info["hints"] = {m: INSTALL_HINTS[m] for m in info["missing"]}
    return info
