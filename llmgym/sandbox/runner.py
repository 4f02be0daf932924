"""The :class:`Sandbox`: starts one sandboxed run, feeds and drains it, kills it at its limits.

Example:
    >>> from llmgym.sandbox.runner import Sandbox
    >>> Sandbox().run_python("print(6 * 7)").stdout
    '42\\n'
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import marshal
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .bootstrap import BOOTSTRAP
from .cgroups import JOIN_CGROUPS, CallCgroup, Cgroups
from .limits import SandboxLimits, SandboxResult, rlimits, signal_reason
from .mounts import bwrap_base_args, minimal_env, tmpfs_args
from .policy import (
    ALLOW_UNSANDBOXED_ENV,
    DEFAULT_PYTHON,
    DEFAULT_REQUIRED,
    DEFAULT_UID_RANGE,
    JUDGE_UID_OFFSET,
    MECHANISMS,
    NO_CGROUP_MESSAGE,
    WORKDIR_IN_SANDBOX,
    NoCgroupWarning,
    SandboxError,
    SandboxUnavailableError,
    SandboxWarning,
)
from .probe import probe
from .uids import UidPool, default_lock_dir, kill_uid

__all__ = ["Sandbox", "SandboxIsolation", "ProcessTreeKiller", "memfd_with"]

log = logging.getLogger("llmgym.sandbox")

_MAIN = "main.py"


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


def memfd_with(data: bytes, name: str) -> int:
    """An anonymous in-memory file holding ``data``, read from its start: a descriptor to pass a child.

    Example:
        >>> import os
        >>> from llmgym.sandbox.runner import memfd_with
        >>> fd = memfd_with(b"cfg", "example"); os.read(fd, 10), os.close(fd)
        (b'cfg', None)
    """
    fd = os.memfd_create(name, 0)  # inheritable; only passed through pass_fds
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class ProcessTreeKiller:
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


_warned_no_cgroup = False


def _warn_no_cgroup(why: str) -> None:
    """Say once per process that the sandbox runs without its cgroup (:class:`NoCgroupWarning`)."""
    global _warned_no_cgroup
    if _warned_no_cgroup:
        return
    _warned_no_cgroup = True
    msg = f"llmgym.sandbox: {NO_CGROUP_MESSAGE} (here: {why or 'unknown'})."
    warnings.warn(msg, NoCgroupWarning, stacklevel=3)
    log.warning(msg)


@dataclass(frozen=True)
class SandboxIsolation:
    """What a :class:`Sandbox` isolates with, read-only: for code that starts sandboxed processes of its own
    (:class:`~llmgym.sandbox.SandboxWorker`) with the same mechanisms.

    Attributes:
        bwrap_path: the bubblewrap binary (``None``: no ``bwrap``).
        setuid: runs take an unprivileged uid from ``uid_pool``.
        seccomp: the seccomp filter applies (through bwrap, or installed by the program's bootstrap).
        seccomp_filter: the compiled BPF program bwrap installs (``None``: none).
        uid_pool: the pool of unprivileged uids (``None`` without ``setuid``).
        cgroups: per-run cgroups (``None``: no ``cgroup``).
        call_cgroup: the cgroup units a worker gives each call (``None``: none).

    Example:
        >>> iso = Sandbox().isolation
        >>> iso.setuid == (iso.uid_pool is not None) == ("setuid" in Sandbox().mechanisms)
        True
    """

    bwrap_path: str | None
    setuid: bool
    seccomp: bool
    seccomp_filter: bytes | None
    uid_pool: UidPool | None
    cgroups: Cgroups | None
    call_cgroup: CallCgroup | None


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
        info = probe(python)
        self._bpf: bytes | None = info.get("_bpf")
        missing_required = [m for m in MECHANISMS if m in required and not info[m]]
        if missing_required:
            raise SandboxUnavailableError(missing_required, info["why"])
        self.mechanisms: tuple[str, ...] = tuple(m for m in MECHANISMS if info[m])
        self.missing: tuple[str, ...] = tuple(m for m in MECHANISMS if not info[m])
        weaker = [m for m in self.missing if m in DEFAULT_REQUIRED]
        if "cgroup" in self.missing:
            _warn_no_cgroup(info["why"].get("cgroup", ""))
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
            bwrap_base_args(info["bwrap_path"], python, os.geteuid() == 0)
            if self._use_bwrap
            else None
        )
        self._pool = (
            UidPool(tuple(uid_range), lock_dir or default_lock_dir())
            if self._use_setuid
            else None
        )
        self._cgroups = (
            Cgroups(info["_cgroup_dirs"])
            if "cgroup" in self.mechanisms and self._pool is not None
            else None
        )
        # a worker's calls each end with one cgroup.kill of their own cgroup (see SandboxWorker)
        self._call_cgroup = (
            CallCgroup(info["_call_cgroup_base"])
            if info.get("_call_cgroup_base") and self._pool is not None
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

    @property
    def isolation(self) -> SandboxIsolation:
        """The mechanisms this sandbox set up (a read-only copy), for processes sandboxed like its runs.

        Example:
            >>> sb = Sandbox()
            >>> (sb.isolation.bwrap_path is not None) == ("bwrap" in sb.mechanisms)
            True
        """
        return SandboxIsolation(
            bwrap_path=self._bwrap_args[0] if self._use_bwrap else None, setuid=self._use_setuid,
            seccomp=self._use_seccomp, seccomp_filter=self._bpf, uid_pool=self._pool, cgroups=self._cgroups,
            call_cgroup=self._call_cgroup)

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
                workdir = WORKDIR_IN_SANDBOX
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
                "rlimits": rlimits(lim, nproc=self._use_setuid),  # NPROC only for a uid of its own
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
            cfg_fd = memfd_with(marshal.dumps(cfg, 4), "llmgym-sandbox-cfg")
            fds_to_close.append(cfg_fd)
            status_r, status_w = os.pipe()
            fds_to_close.append(status_w)
            pass_fds = [cfg_fd, status_w]
            boot = [self.python, "-I", "-c", BOOTSTRAP, str(cfg_fd), str(status_w)]
            if self._use_bwrap:
                cmd = list(self._bwrap_args)
                for k, v in env.items():
                    cmd += ["--setenv", k, v]
                tmp_bytes = int(lim.tmp_size_mb * (1 << 20))
                cmd += tmpfs_args(tmp_bytes) + ["--chdir", WORKDIR_IN_SANDBOX]
                if self._use_seccomp and self._bpf:
                    bpf_fd = memfd_with(self._bpf, "llmgym-sandbox-bpf")
                    fds_to_close.append(bpf_fd)
                    pass_fds.append(bpf_fd)
                    cmd += ["--seccomp", str(bpf_fd)]
                info_r, info_w = (
                    os.pipe()
                )  # bwrap tells the pid of the namespace's init
                fds_to_close.append(info_w)
                pass_fds.append(info_w)
                cmd += ["--info-fd", str(info_w), "--", *boot]
                popen_env = minimal_env()
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
                cmd = ["/bin/sh", "-c", JOIN_CGROUPS, "sh", *procs, "--", *cmd]
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
            killer = ProcessTreeKiller(proc, info_r)
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
                kill_uid(uid)
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
                kill_uid(uid)  # no pid namespace: daemonised leftovers die here
                if judge is not None:
                    kill_uid(uid + JUDGE_UID_OFFSET)
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
        self, proc, killer: ProcessTreeKiller, stdin: bytes, deadline: float, cap: int
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
            killed_reason = signal_reason(int(status["signal"]), cpu_s, lim)
        elif "exit" not in status:
            # the supervisor started the program and died without a word, with no limit hit: killed from
            # outside (nothing inside may signal it). The verdict is unknown; a 0 would be a lie.
            raise SandboxError(
                f"the sandbox was killed from outside during the run (its supervisor ended without "
                f"reporting; exit {proc.returncode}): the program's result is unknown. "
                f"{stderr.strip()[-500:]}".rstrip())
        candidate_rc = None
        if "candidate_signal" in status:
            candidate_rc = -int(status["candidate_signal"])
        elif "candidate_exit" in status:
            candidate_rc = int(status["candidate_exit"])
        if killed_reason is None and returncode != 0 and candidate_rc is not None and candidate_rc < 0:
            # a judged run failed because a limit killed the candidate: say which
            killed_reason = signal_reason(-candidate_rc, status.get("candidate_cpu_s"), lim)
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
