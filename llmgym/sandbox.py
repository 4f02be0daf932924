"""Run untrusted (model-written) Python code isolated from the host.

Model-written code is hostile input.  :class:`Sandbox` runs it in a separate process tree that,
by default, has

* **no network**: a new network namespace (only its own, empty loopback), and a seccomp filter
  that refuses every socket family except ``AF_UNIX``;
* **a read-only view of the system only**: bubblewrap mounts a fresh root holding ``/usr`` (and the
  ``/lib*``, ``/bin`` links), a few ``/etc`` files the interpreter needs, a new ``/proc`` and a
  minimal ``/dev``; nothing of ``/root``, ``/home``, ``/work``, the caller's venv or working directory;
* **a private, size-capped working directory**: a tmpfs at ``/tmp`` (also ``HOME`` and the cwd) of
  ``tmp_size_mb``, and another at ``/dev/shm``, both gone with the sandbox;
* **an unprivileged identity**: a real uid/gid from a pool (60000-60063 by default, one per
  concurrent run, held with a file lock) with no supplementary groups and no capabilities;
* **resource limits**: ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_NPROC`` (enforced because the uid is
  not root and is private to the run), ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, ``RLIMIT_CORE = 0``;
* **a seccomp filter**: ``socket`` (non-``AF_UNIX``), ``ptrace``, ``process_vm_*``, ``mount`` and
  the new mount API, ``unshare``/``setns``/namespace-creating ``clone`` (``clone3`` answers
  ``ENOSYS``), ``kill(-1)``, ``TIOCSTI``, ``bpf``, ``perf_event_open``, ``keyctl``, ``io_uring``,
  module loading, ``reboot``, clock setting ... all fail with ``EPERM``;
* **a wall-clock kill**: the whole tree lives in its own pid namespace (``--unshare-pid
  --as-pid-1 --die-with-parent``); when the program ends, or is killed (time-out, output flood,
  the caller dying), the kernel kills every process it started, daemonised ones included,
  before the run returns;
* **a clean environment**: none of the caller's environment variables (``--clearenv``; bubblewrap
  itself is started with a minimal environment too); inside: ``PATH``, ``HOME``, ``LANG``,
  ``TMPDIR``, ``USER``;
* **bounded output**: stdout and stderr are kept up to ``max_output_kb`` each; a program writing
  more is killed (``killed_reason == "output_limit"``); after the run every pipe is read to EOF, so
  output written just before a clean exit is never lost;
* **a judge apart** (:meth:`Sandbox.run_judged`): an untrusted program and a trusted judge in two
  processes under two uids, joined by pipes, the verdict on a channel only the judge holds.

The sandboxed interpreter is the *system* Python (``/usr/bin/python3``): the unprivileged uid must
be able to read it, and the caller's venv is deliberately invisible.

Mechanisms: ``"bwrap"`` (bubblewrap: namespaces, read-only root, tmpfs, pid-namespace kill),
``"seccomp"`` (libseccomp's Python binding for the system Python, used to compile the filter),
``"setuid"`` (the caller can switch to the pool uids, i.e. runs as root) and ``"python"`` (the
interpreter) are required by default (:data:`DEFAULT_REQUIRED`).  ``"cgroup"`` -- one memory
(``memory_mb + 2 * tmp_size_mb``) and process cap for the whole tree, so that a swarm of
processes each under ``RLIMIT_AS`` cannot add up -- is used wherever the cgroup tree is writable,
and only logged when it is not.  Where a required one is missing, :class:`Sandbox` raises
:class:`SandboxUnavailableError` naming it and how to install it (``.ci/install-sandbox.sh``, or
``apt-get install bubblewrap python3-seccomp``).  To run with whatever isolation is available,
opt out explicitly with ``Sandbox(require=(...))``, ``Sandbox(allow_unsafe=True)`` or the
environment variable ``LLMGYM_ALLOW_UNSANDBOXED=1``; a :class:`SandboxWarning` names what is
missing.  Nothing degrades silently.

Example:
    >>> from llmgym.sandbox import run_python
    >>> r = run_python("print(sum(range(10)))")
    >>> r.returncode, r.stdout, r.passed
    (0, '45\\n', True)
    >>> run_python("import os; print(os.environ.get('HOME'), os.getcwd())").stdout
    '/tmp /tmp\\n'
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import errno
import fcntl
import functools
import json
import logging
import marshal
import math
import os
import pwd
import random
import selectors
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "DEFAULT_REQUIRED",
    "JUDGE_UID_OFFSET",
    "MECHANISMS",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailableError",
    "SandboxWarning",
    "check_sandbox",
    "default_sandbox",
    "pids_of_uids",
    "run_python",
]

log = logging.getLogger(__name__)

#: Every isolation mechanism, in the order they are reported.
MECHANISMS: tuple[str, ...] = ("bwrap", "seccomp", "setuid", "python", "cgroup")

#: The mechanisms a :class:`Sandbox` requires unless told otherwise.  ``"cgroup"`` (one memory
#: and process cap for the whole tree) is used wherever it works, but it is not required: many
#: containers do not delegate cgroups.
DEFAULT_REQUIRED: tuple[str, ...] = ("bwrap", "seccomp", "setuid", "python")

#: Environment variable that, set to ``1``, lets code run with whatever isolation is available.
ALLOW_UNSANDBOXED_ENV = "LLMGYM_ALLOW_UNSANDBOXED"

DEFAULT_PYTHON = "/usr/bin/python3"
DEFAULT_UID_RANGE = (60000, 60064)  # half-open: uids 60000..60063
#: A judged run's judge runs as its candidate's uid + this offset (61000..61063 by default).
JUDGE_UID_OFFSET = 1000

_INSTALL_HINTS = {
    "bwrap": "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`), and make sure "
    "namespaces are allowed (in a container: run it with --privileged or a seccomp/apparmor "
    "profile that allows unshare)",
    "seccomp": "install the libseccomp binding for the system Python "
    "(Debian/Ubuntu: `apt-get install python3-seccomp`)",
    "setuid": "run as root (the sandbox drops to an unprivileged uid from a pool, "
    "so that RLIMIT_NPROC is enforced and the code cannot touch the caller's files)",
    "python": "install a system Python readable by every user (`apt-get install python3`) "
    "or pass Sandbox(python=...)",
    "cgroup": "optional: run as root where the cgroup tree is writable (cgroup v1 memory and "
    "pids controllers, or v2 with memory and pids delegated); without it memory is capped "
    "per process only",
}

_MAIN = "main.py"
_WORKDIR_IN_SANDBOX = "/tmp"


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, bad arguments) -- not the sandboxed program."""


class SandboxUnavailableError(SandboxError):
    """A required isolation mechanism is missing on this machine.

    ``missing`` lists the mechanism names (see :data:`MECHANISMS`); the message says how to
    install each one and how to opt out.
    """

    def __init__(
        self, missing: Sequence[str], details: Mapping[str, str] | None = None
    ):
        self.missing = tuple(missing)
        details = dict(details or {})
        lines = [f"cannot sandbox untrusted code: missing {', '.join(self.missing)}"]
        for m in self.missing:
            why = f" ({details[m]})" if details.get(m) else ""
            lines.append(f"  - {m}{why}: {_INSTALL_HINTS.get(m, '')}")
        lines.append(
            "  Install everything with `sudo bash .ci/install-sandbox.sh` "
            "(apt-get install bubblewrap python3-seccomp). To run with the isolation that is "
            f"available (UNSAFE for untrusted code), pass Sandbox(allow_unsafe=True), or "
            f"Sandbox(require=...) without them, or set {ALLOW_UNSANDBOXED_ENV}=1."
        )
        super().__init__("\n".join(lines))


class SandboxWarning(UserWarning):
    """Code runs with less isolation than the full sandbox (an explicit opt-out is in force)."""


# The largest value each limit accepts: past these the kernel's own types overflow (RLIMIT_CPU is a
# whole number of seconds, tmpfs sizes are bytes) or the "limit" would not limit anything.
_LIMIT_MAX = {
    "cpu_seconds": 86_400,
    "wall_seconds": 86_400,
    "memory_mb": 1 << 20,
    "max_processes": 4096,
    "max_file_mb": 1 << 20,
    "max_open_files": 1 << 16,
    "tmp_size_mb": 1 << 20,
    "max_output_kb": 1 << 20,
}


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run.

    Attributes:
        cpu_seconds: CPU time of each process (``RLIMIT_CPU``; SIGXCPU, then SIGKILL a second later).
        wall_seconds: wall-clock time of the whole run, start-up included; then everything is killed.
        memory_mb: address space of each process (``RLIMIT_AS``).
        max_processes: processes + threads of the sandbox uid (``RLIMIT_NPROC``; needs ``setuid``).
        max_file_mb: size of any one file written (``RLIMIT_FSIZE``).
        max_open_files: file descriptors per process (``RLIMIT_NOFILE``).
        tmp_size_mb: size of the private tmpfs (working directory, ``/tmp``, ``HOME``).
        max_output_kb: bytes kept of stdout and of stderr (each); writing more kills the run.

    Example:
        >>> SandboxLimits(cpu_seconds=2, wall_seconds=5).memory_mb
        512
    """

    cpu_seconds: float = 10.0
    wall_seconds: float = 20.0
    memory_mb: int = 512
    max_processes: int = 16
    max_file_mb: int = 16
    max_open_files: int = 64
    tmp_size_mb: int = 64
    max_output_kb: int = 64

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise ValueError(
                    f"SandboxLimits.{f.name} must be a positive number, got {v!r}"
                )
            if not math.isfinite(v) or v > _LIMIT_MAX[f.name]:
                raise ValueError(
                    f"SandboxLimits.{f.name} must be finite and at most {_LIMIT_MAX[f.name]}, got {v!r} "
                    "(a limit that cannot hold is no limit)"
                )
        if self.memory_mb < 32:
            raise ValueError(
                "SandboxLimits.memory_mb must be at least 32 (the interpreter needs it)"
            )
        if self.max_open_files < 16:
            raise ValueError("SandboxLimits.max_open_files must be at least 16")


@dataclasses.dataclass
class SandboxResult:
    """Outcome of one sandboxed run.

    ``returncode`` follows :mod:`subprocess`: the exit status, or ``-N`` when signal ``N`` ended the
    program.  A program "passes" (:attr:`passed`) exactly when it exited with 0 and was not killed,
    which is what code-evaluation environments want: append the tests (asserts) to the program.

    Attributes:
        returncode: exit status, or minus the signal number.
        stdout, stderr: decoded (UTF-8, errors replaced) and capped at ``max_output_kb`` each.
        timed_out: the wall-clock limit was hit.
        killed: ended by a signal (a limit, a time-out, an output flood, or a crash).
        killed_reason: ``"timeout"``, ``"cpu_limit"``, ``"memory_limit"`` (the tree's cgroup
            cap; a single process over ``memory_mb`` gets ``MemoryError`` instead),
            ``"output_limit"``, ``"file_size_limit"``, ``"sandbox_error"`` or
            ``"signal:NAME"``; ``None`` when the program exited by itself.
        duration_s: wall-clock seconds of the run, sandbox start-up included.
        cpu_s: CPU seconds used by the program (user + system, waited-for children included).
        max_rss_mb: peak resident memory of the largest process.
        stdout_truncated, stderr_truncated: output was cut at the cap.
        mechanisms: the isolation mechanisms that were in force.
        uid: the uid the program ran as.
        judge_report: a judged run's (:meth:`Sandbox.run_judged`) report, as the judge wrote it on its
            private channel (at most 16 KiB); ``None`` for a plain run.
        candidate_returncode: a judged run's candidate process status when it ended before the
            judge did (exit status, or minus the signal); ``None`` otherwise.

    Example:
        >>> r = run_python("import sys; print('out'); sys.exit(3)")
        >>> r.returncode, r.passed, r.killed, r.stdout
        (3, False, False, 'out\\n')
    """

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    killed: bool = False
    killed_reason: str | None = None
    duration_s: float = 0.0
    cpu_s: float | None = None
    max_rss_mb: float | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    mechanisms: tuple[str, ...] = ()
    uid: int | None = None
    judge_report: str | None = None
    candidate_returncode: int | None = None

    @property
    def passed(self) -> bool:
        """True when the program exited with status 0 and was not killed."""
        return self.returncode == 0 and not self.killed and not self.timed_out


# --------------------------------------------------------------------------------------------
# The bootstrap: runs under the *system* Python inside the sandbox (first as root in bwrap's
# namespaces, with only CAP_SETUID/CAP_SETGID), forks, and the child drops to the sandbox uid,
# writes the files, applies the limits, and runs the program in a fresh ``__main__`` module.
# The parent stays behind as a tiny supervisor that reports the child's wait status and rusage
# on a private pipe (so a program that exits 137 is not mistaken for one killed by SIGKILL).
# It also compiles the seccomp filter (``--export-bpf``) once per host process.
# Keep it compatible with Python 3.8+ and free of imports beyond the standard library.
# --------------------------------------------------------------------------------------------
_BOOTSTRAP = r"""
import os, sys

def _seccomp_filter():
    import errno, seccomp as S
    f = S.SyscallFilter(defaction=S.ALLOW)
    deny = S.ERRNO(errno.EPERM)
    def rule(action, name, *args):
        try:
            f.add_rule(action, name, *args)
        except Exception:  # syscall unknown to this libseccomp / arch: nothing to deny
            pass
    for name in (
        "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
        "mount", "umount", "umount2", "pivot_root", "chroot", "mount_setattr", "move_mount",
        "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "unshare", "setns",
        "swapon", "swapoff", "reboot", "kexec_load", "kexec_file_load", "init_module",
        "finit_module", "delete_module", "acct", "bpf", "perf_event_open", "userfaultfd",
        "keyctl", "add_key", "request_key", "io_uring_setup", "io_uring_enter",
        "io_uring_register", "open_by_handle_at", "name_to_handle_at", "lookup_dcookie",
        "quotactl", "iopl", "ioperm", "syslog", "settimeofday", "clock_settime",
        "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "vhangup", "uselib",
        "nfsservctl", "fanotify_init", "personality", "remap_file_pages",
    ):
        rule(deny, name)
    # network: only AF_UNIX (1) sockets
    rule(deny, "socket", S.Arg(0, S.NE, 1))
    rule(deny, "socketpair", S.Arg(0, S.NE, 1))
    # no new namespaces through clone (NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID,
    # NEWNET); clone3 passes its flags in memory, out of seccomp's sight: make glibc fall back
    for flag in (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                 0x40000000):
        rule(deny, "clone", S.Arg(0, S.MASKED_EQ, flag, flag))
    rule(S.ERRNO(errno.ENOSYS), "clone3")
    # kill(-1, sig): every process the uid may signal
    rule(deny, "kill", S.Arg(0, S.MASKED_EQ, 0xFFFFFFFF, 0xFFFFFFFF))
    # TIOCSTI: push input into a terminal
    rule(deny, "ioctl", S.Arg(1, S.MASKED_EQ, 0xFFFFFFFF, 0x5412))
    return f

def _hook(etype, value, tb):
    # hide the bootstrap's frames so tracebacks look like `python3 main.py`
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    import traceback
    traceback.print_exception(etype, value, tb)

def _child(cfg, ready_w):
    try:
        _drop_and_limit(cfg, cfg["uid"], True, cfg["gid"])
    except BaseException as e:
        try:
            os.write(ready_w, ("%s: %s" % (type(e).__name__, e)).encode("utf-8", "replace")[:4000])
        finally:
            os._exit(125)
    os.close(ready_w)
    src = cfg["code"]
    path = os.path.join(cfg["workdir"], cfg["main"])
    mod = type(sys)("__main__")
    mod.__file__ = path
    mod.__builtins__ = __builtins__
    mod.__cached__ = None
    sys.modules["__main__"] = mod
    sys.argv = [cfg["main"]]
    sys.path.insert(0, cfg["workdir"])
    sys.excepthook = _hook
    exec(compile(src, path, "exec"), mod.__dict__)
    sys.exit(0)  # normal interpreter shutdown: atexit, thread joins, flushing

def _drop_and_limit(cfg, uid, with_files, gid=None):
    import resource
    if uid is not None:
        gid = uid if gid is None else gid
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if os.getuid() != uid or os.geteuid() != uid:
            raise OSError("uid drop did not stick")
        try:
            os.setuid(0)
        except OSError:
            pass
        else:
            raise OSError("could regain root after dropping privileges")
    os.umask(0o077)
    os.chdir(cfg["workdir"] if with_files else "/")
    if with_files:
        for name, data in cfg["files"]:
            d = os.path.dirname(name)
            if d:
                os.makedirs(d, exist_ok=True)
            with open(name, "wb") as fh:
                fh.write(data)
        with open(cfg["main"], "wb") as fh:
            fh.write(cfg["code"])
    if cfg["seccomp_inproc"]:
        _seccomp_filter().load()
    for name, soft, hard in cfg["rlimits"]:
        resource.setrlimit(getattr(resource, name), (soft, hard))

def _exit_on_setup_error(ready_r, pid, status_fd):
    # the child reports a failed set-up (uid drop, limits, files) on ready_r; EOF alone means ready
    err = b""
    while True:
        chunk = os.read(ready_r, 4096)
        if not chunk:
            break
        err += chunk
    os.close(ready_r)
    if err:
        os.waitpid(pid, 0)
        os.write(status_fd, b"setup_error " + err.replace(b"\n", b" ") + b"\n")
        os._exit(0)

def _judged(cfg, status_fd):
    # Two processes under two uids: the candidate (a fresh interpreter running the runner, which
    # runs main.py) and the judge (trusted source, forked from here). Pipes: judge -> candidate
    # (candidate's fd 3), candidate -> judge (candidate's fd 4), and the judge's private report.
    import fcntl, time
    j = cfg["judge"]
    j2c_r, j2c_w = os.pipe()
    c2j_r, c2j_w = os.pipe()
    rep_r, rep_w = os.pipe()
    ready_r, ready_w = os.pipe()
    t0 = time.monotonic()
    cpid = os.fork()
    if cpid == 0:
        try:
            a = fcntl.fcntl(j2c_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(c2j_w, fcntl.F_DUPFD, 10)
            w = fcntl.fcntl(ready_w, fcntl.F_DUPFD_CLOEXEC, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.closerange(5, w)
            os.closerange(w + 1, 65536)
            ready_w = w
            _drop_and_limit(cfg, cfg["uid"], True)
            os.execv(j["python"], [j["python"], "-I", "-c", j["runner"], cfg["main"]])
        except BaseException as e:
            try:
                os.write(ready_w, ("%s: %s" % (type(e).__name__, e)).encode("utf-8", "replace")[:4000])
            finally:
                os._exit(125)
    for fd in (j2c_r, c2j_w, ready_w):
        os.close(fd)
    _exit_on_setup_error(ready_r, cpid, status_fd)
    jpid = os.fork()
    if jpid == 0:
        try:
            os.close(status_fd)
            os.close(rep_r)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            _drop_and_limit(cfg, j["uid"], False)
            ns = {"__name__": "__judge__", "JUDGE_IN": c2j_r, "JUDGE_OUT": j2c_w, "JUDGE_REPORT": rep_w}
            exec(compile(j["source"], "<judge>", "exec"), ns)
        except BaseException as e:
            try:
                os.write(rep_w, ("judge error %s: %s" % (type(e).__name__, e)).encode("utf-8", "replace")[:4000])
            finally:
                os._exit(124)
        os._exit(0)
    for fd in (c2j_r, j2c_w, rep_w):
        os.close(fd)
    t1 = time.monotonic()
    os.write(status_fd, b"started %f\n" % (t1 - t0))
    jst = cst = jru = cru = None
    while jst is None:  # as the namespace's init, also reap orphans
        try:
            got, st, ru = os.wait4(-1, 0)
        except ChildProcessError:
            break
        if got == jpid:
            jst, jru = st, ru
        elif got == cpid:
            cst, cru = st, ru
    # the candidate closes its pipes (the judge sees EOF) a moment before it becomes a zombie:
    # give an exiting candidate 50 ms to be reaped, never wait for a running one
    for _ in range(50):
        if cst is not None:
            break
        try:
            got, st, ru = os.wait4(cpid, os.WNOHANG)
        except ChildProcessError:
            break
        if got == cpid:
            cst, cru = st, ru
        else:
            time.sleep(0.001)
    report = b""
    os.set_blocking(rep_r, False)
    try:
        while len(report) < 16384:
            chunk = os.read(rep_r, 16384)
            if not chunk:
                break
            report += chunk
    except OSError:
        pass
    out = b"run_s %f\n" % (time.monotonic() - t1)
    if jru is not None:
        out += b"cpu_s %f\nmaxrss_kb %d\n" % (jru.ru_utime + jru.ru_stime, jru.ru_maxrss)
    if jst is not None:
        if os.WIFSIGNALED(jst):
            out += b"signal %d\n" % os.WTERMSIG(jst)
        else:
            out += b"exit %d\n" % os.WEXITSTATUS(jst)
    if cst is not None:
        if cru is not None:
            out += b"candidate_cpu_s %f\n" % (cru.ru_utime + cru.ru_stime)
        if os.WIFSIGNALED(cst):
            out += b"candidate_signal %d\n" % os.WTERMSIG(cst)
        else:
            out += b"candidate_exit %d\n" % os.WEXITSTATUS(cst)
    out += b"judge_report " + report[:16384].hex().encode() + b"\n"
    os.write(status_fd, out)
    os._exit(0)  # as pid 1: the kernel now kills whatever the candidate left running

def _main():
    if sys.argv[1] == "--export-bpf":
        _seccomp_filter().export_bpf(sys.stdout)
        return
    import marshal, time  # both built in: json or base64 would add ~10 ms of imports per run
    cfg_fd, status_fd = int(sys.argv[1]), int(sys.argv[2])
    with os.fdopen(cfg_fd, "rb") as fh:
        cfg = marshal.loads(fh.read())
    sys.dont_write_bytecode = True
    if cfg.get("judge") is not None:
        _judged(cfg, status_fd)
        return
    ready_r, ready_w = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(status_fd)
        _child(cfg, ready_w)
        os._exit(0)
    os.close(ready_w)
    _exit_on_setup_error(ready_r, pid, status_fd)
    t1 = time.monotonic()
    os.write(status_fd, b"started %f\n" % (t1 - t0))
    while True:  # as the namespace's init, also reap orphans (zombies count against RLIMIT_NPROC)
        try:
            got, st, ru = os.wait4(-1, 0)
        except ChildProcessError:
            os._exit(0)
        if got == pid:
            break
    out = b"run_s %f\ncpu_s %f\nmaxrss_kb %d\n" % (
        time.monotonic() - t1, ru.ru_utime + ru.ru_stime, ru.ru_maxrss)
    if os.WIFSIGNALED(st):
        out += b"signal %d\n" % os.WTERMSIG(st)
    else:
        out += b"exit %d\n" % os.WEXITSTATUS(st)
    os.write(status_fd, out)
    os._exit(0)

_main()
"""


# --------------------------------------------------------------------------------------------
# Availability checks
# --------------------------------------------------------------------------------------------
def _world_executable(path: str) -> bool:
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


def _mirror_root_args(python: str) -> list[str]:
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


def _bwrap_base_args(bwrap: str, python: str, as_root: bool) -> list[str]:
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
    args += _mirror_root_args(python)
    args += ["--proc", "/proc", "--dev", "/dev"]
    # defence in depth for the root-side supervisor: no sysctl or sysrq writes, whatever caps remain
    # (bwrap covers /proc/irq and /proc/bus itself; /proc/sys is read-only per task anyway)
    for path in ("/proc/sys", "/proc/sysrq-trigger"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def _tmpfs_args(size_bytes: int) -> list[str]:
    """The private, size-capped tmpfs at /tmp (the working directory) and at /dev/shm
    (POSIX semaphores and shared memory, which multiprocessing needs)."""
    return [
        "--size",
        str(size_bytes),
        "--perms",
        "1777",
        "--tmpfs",
        _WORKDIR_IN_SANDBOX,
        "--size",
        str(size_bytes),
        "--perms",
        "1777",
        "--tmpfs",
        "/dev/shm",
    ]


def _minimal_env() -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


@functools.cache
def _probe(python: str) -> dict:
    """Find which mechanisms work (cached per interpreter; ``check_sandbox(refresh=True)`` resets)."""
    info: dict = {m: False for m in MECHANISMS}
    why: dict[str, str] = {}
    as_root = os.geteuid() == 0

    # python
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        why["python"] = f"{python} not found"
    elif as_root and not _world_executable(python):
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
                env=_minimal_env(),
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
                [python, "-I", "-c", _BOOTSTRAP, "--export-bpf"],
                check=False,
                capture_output=True,
                timeout=30,
                env=_minimal_env(),
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
                _bwrap_base_args(bwrap, python, as_root)
                + _tmpfs_args(1 << 20)
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
                env=_minimal_env(),
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
        dirs, reason = _cgroup_probe()
        if dirs:
            info["cgroup"] = True
            info["_cgroup_dirs"] = dirs
            info["cgroup_version"] = 2 if "unified" in dirs else 1
        else:
            why["cgroup"] = reason
    else:
        why["cgroup"] = "needs root"

    info["missing"] = [m for m in MECHANISMS if not info[m]]
    info["why"] = why
    return info


def check_sandbox(python: str = DEFAULT_PYTHON, *, refresh: bool = False) -> dict:
    """Report which isolation mechanisms are available on this machine.

    Returns a dict with one boolean per mechanism in :data:`MECHANISMS` (``bwrap``, ``seccomp``,
    ``setuid``, ``python``, ``cgroup``), ``missing`` (their names), ``why`` (a reason per
    missing mechanism), ``hints`` (how to install each missing one) and versions/paths.  The
    probe runs once per process (about 100 ms); pass ``refresh=True`` to run it again.

    Example:
        >>> info = check_sandbox()
        >>> [m for m in DEFAULT_REQUIRED if info[m]]
        ['bwrap', 'seccomp', 'setuid', 'python']
        >>> info["bwrap_version"], info["python_version"]  # doctest: +ELLIPSIS
        ('0...', '3...')
    """
    if refresh:
        _probe.cache_clear()
    info = dict(_probe(python))
    info.pop("_bpf", None)
    info.pop("_cgroup_dirs", None)
    info["why"] = dict(info["why"])
    info["missing"] = list(info["missing"])
    info["hints"] = {m: _INSTALL_HINTS[m] for m in info["missing"]}
    return info


# --------------------------------------------------------------------------------------------
# uid pool
# --------------------------------------------------------------------------------------------
def _default_lock_dir() -> str:
    if os.geteuid() == 0 and os.path.isdir("/run/lock"):
        return "/run/lock/llmgym-sandbox"
    return os.path.join(tempfile.gettempdir(), f"llmgym-sandbox-{os.geteuid()}")


def pids_of_uids(uids: Iterable[int]) -> list[int]:
    """Pids of live processes whose real uid is in ``uids`` (a ``/proc`` scan; zombies excluded:
    they are dead and only wait for their parent to collect them)."""
    wanted = {int(u) for u in uids}
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as fh:
                for line in fh:
                    if line.startswith(b"State:") and line.split()[1] in (b"Z", b"X"):
                        break
                    if line.startswith(b"Uid:"):
                        if int(line.split()[1]) in wanted:
                            found.append(int(name))
                        break
        except (OSError, ValueError, IndexError):
            continue
    return found


def _kill_uid(uid: int) -> int:
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


_CG_NAME = "llmgym-sandbox"
# launcher: join the cgroups given before "--", then become the command after it
_JOIN_CGROUPS = (
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


def _cgroup_probe() -> tuple[dict[str, str] | None, str]:
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
        cg = _Cgroups(dirs)
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


class _Cgroups:
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


class _UidPool:
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
                    left = _kill_uid(uid) + _kill_uid(uid + JUDGE_UID_OFFSET)
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


# --------------------------------------------------------------------------------------------
# The sandbox
# --------------------------------------------------------------------------------------------
def _validate_name(name: str) -> str:
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(f"bad file name {name!r}")
    norm = os.path.normpath(name)
    if os.path.isabs(name) or norm.startswith("..") or norm in (".", _MAIN):
        raise ValueError(
            f"file name {name!r} must be relative, inside the working directory, "
            f"and not {_MAIN!r} (the program itself)"
        )
    return norm


def _memfd(data: bytes, name: str) -> int:
    fd = os.memfd_create(name, 0)  # inheritable; only passed through pass_fds
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class _Killer:
    """Kills a running sandbox and everything in it.

    With bwrap, SIGKILL goes to the init of the sandbox's pid namespace (the bootstrap, started
    ``--as-pid-1``): the kernel then kills every process in the namespace, and bwrap exits only
    after that init is gone, which is after all the others are.  If the init's pid is not known
    yet (killed during start-up), bwrap's process group is killed, ``--die-with-parent`` takes
    the namespace down, and the uid sweep after the run catches anything still exiting.
    Without bwrap: the process group, then the uid sweep.
    """

    def __init__(self, proc: subprocess.Popen, info_fd: int | None):
        self.proc = proc
        self.info_fd = info_fd
        self.killed = False
        self._info = b""

    def _ns_init_pid(self) -> int | None:
        if self.info_fd is None:
            return None
        os.set_blocking(self.info_fd, False)
        with contextlib.suppress(BlockingIOError, OSError):
            self._info += os.read(self.info_fd, 65536)
        with contextlib.suppress(
            ValueError, TypeError, AttributeError, OSError, IndexError
        ):
            pid = int(
                json.loads(self._info.decode("utf-8", "replace")).get("child-pid")
            )
            # only while it is still bwrap's child (never a recycled pid)
            with open(f"/proc/{pid}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
            return pid if ppid == self.proc.pid else None
        return None

    def kill(self) -> None:
        self.killed = True
        pid = self._ns_init_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            # bwrap exits once its child, the namespace's init, is gone -- and the kernel lets
            # an init go only after every other process of its namespace
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
                return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()


def _signal_reason(sig: int, cpu_s: float | None, lim: "SandboxLimits") -> str:
    """Why a signal ended a sandboxed process: a CPU or file-size limit, or the signal's name."""
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s is not None
                                 and cpu_s >= math.ceil(lim.cpu_seconds) - 0.05):
        return "cpu_limit"  # SIGXCPU, or SIGKILL once the CPU time reached the limit
    if sig == signal.SIGXFSZ:
        return "file_size_limit"
    try:
        return "signal:" + signal.Signals(sig).name
    except ValueError:
        return f"signal:{sig}"


class Sandbox:
    """Runs untrusted Python programs isolated from the host (see the module docstring).

    Args:
        limits: default :class:`SandboxLimits` of every run (each call may pass its own).
        require: mechanisms that must be present (default: :data:`DEFAULT_REQUIRED`); the ones
            left out may be missing, with a :class:`SandboxWarning`.  ``"python"`` is always needed.
        allow_unsafe: run with whatever isolation is available (same as ``require=()``); also
            switched on by the environment variable ``LLMGYM_ALLOW_UNSANDBOXED=1``.
        python: the interpreter that runs the code; it must be readable by an unprivileged uid.
        uid_range: half-open range of uids handed to concurrent runs (accounts are skipped).
        env: extra environment variables for the program (the caller's are never passed).
        lock_dir: where the uid locks live (shared by every process on the machine).

    Raises:
        SandboxUnavailableError: a required mechanism is missing.

    Example:
        >>> sb = Sandbox(SandboxLimits(cpu_seconds=2, wall_seconds=5))
        >>> sb.run_python("print(input()[::-1])", stdin="olleh").stdout
        'hello\\n'
        >>> sb.run_python("from helper import f; assert f(2) == 4", files={"helper.py": "f = lambda x: x * x"}).passed
        True
        >>> sb.run_python("while True: pass", limits=SandboxLimits(cpu_seconds=1, wall_seconds=60)).killed_reason
        'cpu_limit'
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        require: Iterable[str] | None = None,
        allow_unsafe: bool | None = None,
        python: str = DEFAULT_PYTHON,
        uid_range: tuple[int, int] = DEFAULT_UID_RANGE,
        env: Mapping[str, str] | None = None,
        lock_dir: str | None = None,
    ):
        self.limits = limits or SandboxLimits()
        self.python = python
        if allow_unsafe is None:
            allow_unsafe = os.environ.get(
                ALLOW_UNSANDBOXED_ENV, ""
            ).strip().lower() in ("1", "true", "yes")
        if allow_unsafe:
            required: set[str] = {"python"}
        elif require is None:
            required = set(DEFAULT_REQUIRED)
        else:
            required = set(require) | {"python"}
            unknown = required - set(MECHANISMS)
            if unknown:
                raise ValueError(
                    f"unknown mechanism(s) {sorted(unknown)}; known: {MECHANISMS}"
                )
        info = _probe(python)
        self._bpf: bytes | None = info.get("_bpf")
        missing_required = [m for m in MECHANISMS if m in required and not info[m]]
        if missing_required:
            raise SandboxUnavailableError(missing_required, info["why"])
        self.mechanisms: tuple[str, ...] = tuple(m for m in MECHANISMS if info[m])
        self.missing: tuple[str, ...] = tuple(m for m in MECHANISMS if not info[m])
        weaker = [m for m in self.missing if m in DEFAULT_REQUIRED]
        if "cgroup" in self.missing:
            log.info(
                "llmgym.sandbox: no cgroup (%s): memory is capped per process "
                "(memory_mb x max_processes for the tree)",
                info["why"].get("cgroup", ""),
            )
        if weaker:
            msg = (
                "llmgym.sandbox: running untrusted code WITHOUT "
                + ", ".join(f"{m} ({info['why'].get(m, '')})" for m in weaker)
                + f" because of an explicit opt-out (allow_unsafe / require= / {ALLOW_UNSANDBOXED_ENV}). "
                + "The code may read or damage this machine. Install: `sudo bash .ci/install-sandbox.sh`."
            )
            warnings.warn(msg, SandboxWarning, stacklevel=2)
            log.warning(msg)
        self._use_bwrap = "bwrap" in self.mechanisms
        self._use_setuid = "setuid" in self.mechanisms
        self._use_seccomp = "seccomp" in self.mechanisms
        self._bwrap_args = (
            _bwrap_base_args(info["bwrap_path"], python, os.geteuid() == 0)
            if self._use_bwrap
            else None
        )
        self._pool = (
            _UidPool(tuple(uid_range), lock_dir or _default_lock_dir())
            if self._use_setuid
            else None
        )
        self._cgroups = (
            _Cgroups(info["_cgroup_dirs"])
            if "cgroup" in self.mechanisms and self._pool is not None
            else None
        )
        self.env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "USER": "sandbox",
            "LOGNAME": "sandbox",
        }
        if env:
            self.env.update({str(k): str(v) for k, v in env.items()})

    def __repr__(self) -> str:
        return f"Sandbox(mechanisms={self.mechanisms}, missing={self.missing}, limits={self.limits})"

    # ---------------------------------------------------------------- public API
    def run_python(
        self,
        code: str,
        *,
        stdin: str | bytes = "",
        limits: SandboxLimits | None = None,
        files: Mapping[str, str | bytes] | None = None,
        _judge: Mapping[str, str] | None = None,
    ) -> SandboxResult:
        """Run ``code`` as ``main.py`` in a fresh sandbox; return its :class:`SandboxResult`.

        ``stdin`` is fed to the program; ``files`` (relative name -> text or bytes) are written
        into its working directory first (importable: the directory is on ``sys.path``).
        The program's failure is never an exception: it is in the result.  :class:`SandboxError`
        is raised only when the sandbox itself cannot run (bad arguments, files too large for
        the tmpfs, bwrap failing to start).

        Example:
            >>> r = Sandbox().run_python("def add(a, b): return a + b\\nassert add(2, 2) == 5")
            >>> r.passed, r.returncode, r.stderr.strip().splitlines()[-1]
            (False, 1, 'AssertionError')
        """
        if not isinstance(code, str):
            raise TypeError(f"code must be str, got {type(code).__name__}")
        lim = limits or self.limits
        file_list = []
        for name, data in (files or {}).items():
            norm = _validate_name(name)
            if isinstance(data, str):
                data = data.encode("utf-8")
            elif not isinstance(data, (bytes, bytearray, memoryview)):
                raise TypeError(f"files[{name!r}] must be str or bytes")
            file_list.append((norm, bytes(data)))
        stdin_b = (
            stdin.encode("utf-8", "surrogatepass")
            if isinstance(stdin, str)
            else bytes(stdin)
        )
        if self._pool is not None:
            with self._pool.acquire() as uid:
                return self._run(code, stdin_b, lim, file_list, uid, _judge)
        return self._run(code, stdin_b, lim, file_list, None, _judge)

    def run_judged(
        self,
        code: str,
        judge: str,
        runner: str,
        *,
        limits: SandboxLimits | None = None,
        files: Mapping[str, str | bytes] | None = None,
    ) -> SandboxResult:
        """Run untrusted ``code`` and a trusted ``judge`` in two processes of one sandbox, under two uids.

        The *candidate* process is a fresh interpreter (``python3 -I -c runner main.py``) under the
        run's uid: ``runner`` (trusted source) runs ``code``, saved as ``main.py``, and talks to the
        judge over two pipes, reading requests on fd 3 and writing replies on fd 4. Nothing of the
        judge is in its memory (it is a new ``exec``). The *judge* process runs ``judge`` under
        another uid (the run's uid + :data:`JUDGE_UID_OFFSET`), so the candidate can neither
        signal it, nor read its memory or files (``/proc/<pid>/mem``, ``fd``, ``environ``), nor
        trace it; in its globals ``JUDGE_IN`` / ``JUDGE_OUT`` are its ends of the pipes and
        ``JUDGE_REPORT`` a pipe to the sandbox's supervisor that only the judge holds. Its
        stdin/stdout/stderr are ``/dev/null``; the sandbox's stdout and stderr are the candidate's.

        The result's ``returncode`` (and signal, CPU time) is the *judge's*; ``judge_report`` is what
        it wrote on ``JUDGE_REPORT`` (16 KiB at most); ``candidate_returncode`` the candidate's status
        if it ended first. When the judge ends, the sandbox ends: the candidate's leftovers die
        with the pid namespace. Without the ``setuid`` mechanism both run as the caller's uid (a
        :class:`SandboxWarning` says so): the process boundary then holds only what the uid allows.

        Example:
            >>> runner = "import os; os.write(4, b'%d' % eval(open('main.py').read()))"
            >>> judge = "import os; os.write(JUDGE_REPORT, b'ok' if os.read(JUDGE_IN, 9) == b'4' else b'no')"
            >>> r = Sandbox().run_judged("2 + 2", judge, runner)
            >>> r.returncode, r.judge_report
            (0, 'ok')
        """
        for name, value in (("code", code), ("judge", judge), ("runner", runner)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be str, got {type(value).__name__}")
        if not self._use_setuid:
            warnings.warn(
                "llmgym.sandbox: judged run without the setuid mechanism: the judge and the candidate "
                "share a uid", SandboxWarning, stacklevel=2,
            )
        return self.run_python(code, limits=limits, files=files, _judge={"source": judge, "runner": runner})

    def run_many(
        self,
        codes: Sequence[str],
        *,
        stdin: str | Sequence[str] = "",
        limits: SandboxLimits | None = None,
        files: Mapping[str, str | bytes] | None = None,
        max_workers: int | None = None,
        judges: Sequence[tuple[str, str] | None] | None = None,
    ) -> list[SandboxResult]:
        """Run several programs concurrently (threads driving sandboxes); results keep the order.

        ``stdin`` is one string for all programs or one per program.  ``max_workers`` defaults
        to the number of CPUs; each concurrent run gets its own uid.

        Example:
            >>> [r.stdout for r in Sandbox().run_many(["print(1)", "print(2)", "print(3)"], max_workers=2)]
            ['1\\n', '2\\n', '3\\n']
        """
        codes = list(codes)
        stdins = (
            [stdin] * len(codes) if isinstance(stdin, (str, bytes)) else list(stdin)
        )
        if len(stdins) != len(codes):
            raise ValueError(f"{len(codes)} programs but {len(stdins)} stdins")
        judge_list = list(judges) if judges is not None else [None] * len(codes)
        if len(judge_list) != len(codes):
            raise ValueError(f"{len(codes)} programs but {len(judge_list)} judges")
        jobs = [
            {"_judge": None if j is None else {"source": j[0], "runner": j[1]}} for j in judge_list
        ]
        if not codes:
            return []
        workers = max_workers or os.cpu_count() or 1
        if self._pool is not None:
            workers = min(workers, len(self._pool.uids))
        workers = max(1, min(workers, len(codes)))
        if workers == 1:
            return [
                self.run_python(c, stdin=s, limits=limits, files=files, **j)
                for c, s, j in zip(codes, stdins, jobs)
            ]
        with concurrent.futures.ThreadPoolExecutor(
            workers, thread_name_prefix="llmgym-sandbox"
        ) as ex:
            futs = [
                ex.submit(self.run_python, c, stdin=s, limits=limits, files=files, **j)
                for c, s, j in zip(codes, stdins, jobs)
            ]
            return [f.result() for f in futs]

    # ---------------------------------------------------------------- internals
    def _rlimits(self, lim: SandboxLimits) -> list[list]:
        cpu = max(1, math.ceil(lim.cpu_seconds))
        rl = [
            ["RLIMIT_CORE", 0, 0],
            ["RLIMIT_CPU", cpu, cpu + 1],
            ["RLIMIT_AS", int(lim.memory_mb) << 20, int(lim.memory_mb) << 20],
            [
                "RLIMIT_FSIZE",
                int(lim.max_file_mb * (1 << 20)),
                int(lim.max_file_mb * (1 << 20)),
            ],
            ["RLIMIT_NOFILE", int(lim.max_open_files), int(lim.max_open_files)],
        ]
        if (
            self._use_setuid
        ):  # for root (or a shared uid) NPROC is meaningless or harmful
            rl.append(["RLIMIT_NPROC", int(lim.max_processes), int(lim.max_processes)])
        return rl

    def _run(
        self, code: str, stdin: bytes, lim: SandboxLimits, files: list, uid: int | None,
        judge: Mapping[str, str] | None = None,
    ) -> SandboxResult:
        host_workdir = None
        fds_to_close: list[int] = []
        status_r = info_r = None
        try:
            env = dict(self.env)
            if self._use_bwrap:
                workdir = _WORKDIR_IN_SANDBOX
            else:
                host_workdir = tempfile.mkdtemp(prefix="llmgym-sandbox-")
                if uid is not None:
                    os.chown(host_workdir, uid, uid)
                os.chmod(host_workdir, 0o700)
                workdir = host_workdir
            env.update(HOME=workdir, TMPDIR=workdir)
            cfg = {
                "uid": uid,
                "gid": uid,
                "workdir": workdir,
                "main": _MAIN,
                "files": files,
                "code": code.encode("utf-8", "surrogatepass"),
                "rlimits": self._rlimits(lim),
                "seccomp_inproc": self._use_seccomp and not self._use_bwrap,
                "judge": None
                if judge is None
                else {
                    "source": judge["source"].encode("utf-8", "surrogatepass"),
                    "runner": judge["runner"],
                    "python": self.python,
                    "uid": None if uid is None else uid + JUDGE_UID_OFFSET,
                },
            }
            # marshal: the bootstrap reads it without importing anything (format 4: Python >= 3.4)
            cfg_fd = _memfd(marshal.dumps(cfg, 4), "llmgym-sandbox-cfg")
            fds_to_close.append(cfg_fd)
            status_r, status_w = os.pipe()
            fds_to_close.append(status_w)
            pass_fds = [cfg_fd, status_w]
            boot = [self.python, "-I", "-c", _BOOTSTRAP, str(cfg_fd), str(status_w)]
            if self._use_bwrap:
                cmd = list(self._bwrap_args)
                for k, v in env.items():
                    cmd += ["--setenv", k, v]
                tmp_bytes = int(lim.tmp_size_mb * (1 << 20))
                cmd += _tmpfs_args(tmp_bytes) + ["--chdir", _WORKDIR_IN_SANDBOX]
                if self._use_seccomp and self._bpf:
                    bpf_fd = _memfd(self._bpf, "llmgym-sandbox-bpf")
                    fds_to_close.append(bpf_fd)
                    pass_fds.append(bpf_fd)
                    cmd += ["--seccomp", str(bpf_fd)]
                info_r, info_w = (
                    os.pipe()
                )  # bwrap tells the pid of the namespace's init
                fds_to_close.append(info_w)
                pass_fds.append(info_w)
                cmd += ["--info-fd", str(info_w), "--", *boot]
                popen_env = _minimal_env()
                cwd = "/"
            else:
                cmd = boot
                popen_env = env
                cwd = workdir
            slot = f"uid-{uid}"
            oom_before = 0
            if self._cgroups is not None:
                procs = self._cgroups.prepare(slot, lim)
                oom_before = self._cgroups.oom_kills(slot)
                cmd = ["/bin/sh", "-c", _JOIN_CGROUPS, "sh", *procs, "--", *cmd]
            t0 = time.monotonic()
            try:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=popen_env,
                    cwd=cwd,
                    pass_fds=pass_fds,
                    start_new_session=True,
                )
            except OSError as e:
                raise SandboxError(f"could not start the sandbox: {e}") from e
            for fd in fds_to_close:
                os.close(fd)
            fds_to_close = []
            killer = _Killer(proc, info_r)
            deadline = t0 + lim.wall_seconds
            try:
                out, err, out_trunc, err_trunc, timed_out, flooded = self._communicate(
                    proc, killer, stdin, deadline, int(lim.max_output_kb * 1024)
                )
                if proc.poll() is None and not killer.killed:
                    # both pipes are closed: it is exiting -- or it closed them and runs on
                    try:
                        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        timed_out = True
                        killer.kill()
            finally:
                if proc.poll() is None:
                    killer.kill()
                proc.wait()
            duration = time.monotonic() - t0
            status = self._read_status(status_r)
            if killer.killed and uid is not None:
                # belt and braces: the namespace is normally gone already
                _kill_uid(uid)
            oom = (
                self._cgroups is not None and self._cgroups.oom_kills(slot) > oom_before
            )
        finally:
            for fd in fds_to_close:
                with contextlib.suppress(OSError):
                    os.close(fd)
            for fd in (status_r, info_r):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            if uid is not None and not self._use_bwrap:
                _kill_uid(uid)  # no pid namespace: daemonised leftovers die here
                if judge is not None:
                    _kill_uid(uid + JUDGE_UID_OFFSET)
            if host_workdir is not None:
                shutil.rmtree(host_workdir, ignore_errors=True)
        return self._result(
            proc,
            status,
            out,
            err,
            out_trunc,
            err_trunc,
            timed_out,
            flooded,
            duration,
            lim,
            uid,
            oom,
        )

    def _communicate(
        self, proc, killer: _Killer, stdin: bytes, deadline: float, cap: int
    ):
        bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
        trunc = {proc.stdout: False, proc.stderr: False}
        timed_out = flooded = False
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        sel.register(proc.stderr, selectors.EVENT_READ)
        view = memoryview(stdin)
        if view:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        try:
            while len(sel.get_map()) > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    killer.kill()
                    break
                events = sel.select(timeout=min(left, 0.25))
                if not events and proc.poll() is not None:
                    # The sandbox has ended. What it wrote just before exiting may have arrived
                    # after select() gave up: drain every pipe to EOF (or, where a daemon without
                    # bwrap's pid namespace still holds one, to what is there now), then stop.
                    for key in list(sel.get_map().values()):
                        f = key.fileobj
                        if f is proc.stdin:
                            continue
                        os.set_blocking(f.fileno(), False)
                        with contextlib.suppress(BlockingIOError, OSError):
                            while True:
                                chunk = os.read(f.fileno(), 65536)
                                if not chunk:
                                    break
                                if self._keep(bufs[f], chunk, cap):
                                    trunc[f] = True
                                    if not flooded:
                                        flooded = True
                    break
                for key, _ in events:
                    f = key.fileobj
                    if f is proc.stdin:
                        try:
                            n = os.write(f.fileno(), view[:65536])
                            view = view[n:]
                        except BlockingIOError:
                            continue
                        except (BrokenPipeError, OSError):
                            view = view[:0]
                        if not view:
                            sel.unregister(f)
                            f.close()
                        continue
                    chunk = os.read(f.fileno(), 65536)
                    if not chunk:
                        sel.unregister(f)
                        continue
                    if self._keep(bufs[f], chunk, cap):
                        trunc[f] = True
                        if not flooded:
                            flooded = True
                            killer.kill()
        finally:
            sel.close()
            for f in (proc.stdin, proc.stdout, proc.stderr):
                with contextlib.suppress(OSError):
                    f.close()
        return (
            bytes(bufs[proc.stdout]),
            bytes(bufs[proc.stderr]),
            trunc[proc.stdout],
            trunc[proc.stderr],
            timed_out,
            flooded,
        )

    @staticmethod
    def _keep(buf: bytearray, chunk: bytes, cap: int) -> bool:
        """Append ``chunk`` to ``buf`` up to ``cap`` bytes; True when some of it did not fit."""
        room = cap - len(buf)
        if len(chunk) > room:
            buf += chunk[: max(room, 0)]
            return True
        buf += chunk
        return False

    @staticmethod
    def _read_status(fd: int) -> dict:
        os.set_blocking(fd, False)
        data = b""
        with contextlib.suppress(BlockingIOError, OSError):
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                data += chunk
        status: dict = {}
        for line in data.decode("utf-8", "replace").splitlines():
            key, _, value = line.partition(" ")
            if key in ("setup_error",):
                status[key] = value
            elif key == "judge_report":
                with contextlib.suppress(ValueError):
                    status[key] = bytes.fromhex(value).decode("utf-8", "replace")
            elif key in ("exit", "signal", "maxrss_kb", "candidate_exit", "candidate_signal"):
                with contextlib.suppress(ValueError):
                    status[key] = int(value)
            elif key in ("started", "run_s", "cpu_s", "candidate_cpu_s"):
                with contextlib.suppress(ValueError):
                    status[key] = float(value)
        return status

    def _result(
        self,
        proc,
        status,
        out,
        err,
        out_trunc,
        err_trunc,
        timed_out,
        flooded,
        duration,
        lim,
        uid,
        oom=False,
    ) -> SandboxResult:
        stdout = out.decode("utf-8", "replace")
        stderr = err.decode("utf-8", "replace")
        if "setup_error" in status:
            raise SandboxError(f"sandbox setup failed: {status['setup_error']}")
        if "started" not in status and not (timed_out or flooded or oom):
            raise SandboxError(
                f"sandbox failed to start (exit {proc.returncode}): {stderr.strip()[-2000:]}"
            )
        killed_reason = None
        if "exit" in status:
            returncode = int(status["exit"])
        elif "signal" in status:
            returncode = -int(status["signal"])
        else:  # the supervisor did not report: we killed the sandbox (or it died)
            returncode = -signal.SIGKILL
        cpu_s = status.get("cpu_s")
        if timed_out:
            killed_reason = "timeout"
        elif oom:  # the cgroup's OOM killer took a process of the tree
            killed_reason = "memory_limit"
        elif flooded:
            killed_reason = "output_limit"
        elif "signal" in status:
            killed_reason = _signal_reason(int(status["signal"]), cpu_s, lim)
        elif "exit" not in status:
            killed_reason = "sandbox_error"
        candidate_rc = None
        if "candidate_signal" in status:
            candidate_rc = -int(status["candidate_signal"])
        elif "candidate_exit" in status:
            candidate_rc = int(status["candidate_exit"])
        if killed_reason is None and returncode != 0 and candidate_rc is not None and candidate_rc < 0:
            # a judged run failed because a limit killed the candidate: say which
            killed_reason = _signal_reason(-candidate_rc, status.get("candidate_cpu_s"), lim)
        maxrss = status.get("maxrss_kb")
        return SandboxResult(
            returncode=returncode,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            killed=killed_reason is not None,
            killed_reason=killed_reason,
            duration_s=duration,
            cpu_s=cpu_s,
            max_rss_mb=(maxrss / 1024.0) if maxrss is not None else None,
            stdout_truncated=out_trunc,
            stderr_truncated=err_trunc,
            mechanisms=self.mechanisms,
            uid=uid,
            judge_report=status.get("judge_report"),
            candidate_returncode=candidate_rc,
        )


_default: Sandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> Sandbox:
    """The shared :class:`Sandbox` behind :func:`run_python` (created on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Sandbox()
        return _default


def run_python(
    code: str,
    *,
    stdin: str | bytes = "",
    limits: SandboxLimits | None = None,
    files: Mapping[str, str | bytes] | None = None,
) -> SandboxResult:
    """Run ``code`` in the default :class:`Sandbox` (all mechanisms required).

    Example:
        >>> run_python("import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)").passed
        False
        >>> run_python("import os; print([os.path.exists(p) for p in ('/root', '/work', '/home')])").stdout
        '[False, False, False]\\n'
    """
    return default_sandbox().run_python(code, stdin=stdin, limits=limits, files=files)
