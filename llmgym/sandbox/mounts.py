"""What a sandboxed process sees: the bubblewrap command line (namespaces, read-only mounts, tmpfs).

Only ``/usr`` (and the ``/lib*``, ``/bin`` links), the few ``/etc`` files an interpreter needs, a new
``/proc`` and a minimal ``/dev`` are visible, read-only; ``/tmp`` and ``/dev/shm`` are private,
size-capped tmpfs. Nothing of ``/root``, ``/home``, ``/work``, the caller's venv or working directory
is mounted unless a caller binds it read-only on purpose (:func:`ro_bind_args`).

Example:
    >>> from llmgym.sandbox.mounts import bwrap_base_args
    >>> args = bwrap_base_args("/usr/bin/bwrap", "/usr/bin/python3", as_root=True)
    >>> "--unshare-net" in args and "--clearenv" in args and "/work" not in args
    True
"""

from __future__ import annotations

import contextlib
import os
import stat

from .policy import WORKDIR_IN_SANDBOX

__all__ = ["bwrap_base_args", "minimal_env", "mirror_root_args", "ro_bind_args", "tmpfs_args", "world_readable"]


def world_readable(path: str) -> bool:
    """True when every directory on the way to ``path`` is o+x and the file is o+rx."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
        if not (st.st_mode & stat.S_IROTH and st.st_mode & stat.S_IXOTH):
            return False
        d = os.path.dirname(real)
        while True:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return False
            parent = os.path.dirname(d)
            if parent == d:
                return True
            d = parent
    except OSError:
        return False


def mirror_root_args(python: str) -> list[str]:
    """bwrap arguments giving a read-only view of what the system interpreter needs."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    # an explicit mode, else bwrap makes /etc 0700: unusable after the uid drop
    args += ["--perms", "0755", "--dir", "/etc"]
    for etc in (
        "/etc/ld.so.cache",
        "/etc/ld.so.conf",
        "/etc/ld.so.conf.d",
        "/etc/localtime",
        "/etc/alternatives",
        "/etc/nsswitch.conf",
    ):
        if os.path.exists(etc):
            args += ["--ro-bind", etc, etc]
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir("/etc")):
            # Debian's sitecustomize lives in /etc/python3.X
            if name.startswith("python3"):
                args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    real = os.path.realpath(python)
    if not real.startswith("/usr/"):
        prefix = os.path.dirname(os.path.dirname(real))  # .../bin/python3 -> ...
        args += ["--ro-bind", prefix, prefix]
    return args


def bwrap_base_args(bwrap: str, python: str, as_root: bool, extra_caps: tuple[str, ...] = ()) -> list[str]:
    """bwrap's options for a sandbox running ``python``: new namespaces, a clean environment, the
    read-only system view; as root, every capability dropped but CAP_SETUID/CAP_SETGID (the
    bootstrap's uid drop) and ``extra_caps``."""
    args = [bwrap]
    if not as_root:
        args.append("--unshare-user")
    args += [
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
        "--as-pid-1",  # the bootstrap is the namespace's init: when it ends, the kernel kills
        "--die-with-parent",  # every process left, *before* bwrap (which waits for it) exits
        "--new-session",
        "--clearenv",
    ]
    if as_root:
        # the bootstrap only needs to switch uid; everything else is dropped
        args += [
            "--cap-drop",
            "ALL",
            "--cap-add",
            "CAP_SETUID",
            "--cap-add",
            "CAP_SETGID",
        ]
        for cap in extra_caps:
            args += ["--cap-add", cap]
    args += mirror_root_args(python)
    args += ["--proc", "/proc", "--dev", "/dev"]
    # defence in depth for the root-side supervisor: no sysctl or sysrq writes, whatever caps remain
    # (bwrap covers /proc/irq and /proc/bus itself; /proc/sys is read-only per task anyway)
    for path in ("/proc/sys", "/proc/sysrq-trigger"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def ro_bind_args(paths: list[str], mounted: tuple[str, ...] = ("/usr",)) -> list[str]:
    """bwrap options binding host directories read-only at the same place, each directory on the way
    created world-traversable (bwrap would make it 0700: unreadable after the uid drop).

    Example:
        >>> from llmgym.sandbox.mounts import ro_bind_args
        >>> ro_bind_args(["/opt/venv/lib"])
        ['--perms', '0755', '--dir', '/opt', '--perms', '0755', '--dir', '/opt/venv', '--ro-bind', '/opt/venv/lib', '/opt/venv/lib']
    """
    args: list[str] = []
    made: set[str] = set()
    for path in paths:
        parts = path.strip("/").split("/")
        for k in range(1, len(parts)):
            parent = "/" + "/".join(parts[:k])
            if parent in made or any(parent == m or parent.startswith(m + "/") for m in mounted):
                continue
            made.add(parent)
            args += ["--perms", "0755", "--dir", parent]
        if not any(path == m or path.startswith(m + "/") for m in mounted):
            args += ["--ro-bind", path, path]
    return args


def tmpfs_args(size_bytes: int, mode: str = "1777") -> list[str]:
    """The private, size-capped tmpfs at /tmp (the working directory) and at /dev/shm
    (POSIX semaphores and shared memory, which multiprocessing needs). ``mode`` 1777: writable by the
    run's uid; 0755: owned by the bootstrap's root, so a process under the run's uid can write nowhere."""
    return [
        "--size",
        str(size_bytes),
        "--perms",
        mode,
        "--tmpfs",
        WORKDIR_IN_SANDBOX,
        "--size",
        str(size_bytes),
        "--perms",
        mode,
        "--tmpfs",
        "/dev/shm",
    ]


def minimal_env() -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
