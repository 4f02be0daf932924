"""A long-lived sandboxed worker: imports once, answers every call in a fresh child, killed at its limit.

Starting an interpreter and importing SymPy or reasoning-gym takes seconds, far too long per check.
A :class:`SandboxWorker` starts one sandbox (the same isolation as :class:`~llmgym.sandbox.Sandbox`:
namespaces, no network, seccomp, a clean environment, nothing of the host but ``/usr`` and the
directories bound read-only on purpose) and, inside it, a trusted *zygote* that runs ``source`` --
``setup()`` once (imports, warm-up), then, per call, ``prepare(context)`` on trusted data -- and forks
one *child per call*. The child drops to the worker's unprivileged uid, takes its limits
(address space = the zygote's + ``memory_mb``, CPU, processes, files), unpickles the request and
runs ``handle(state, request)``; its answer goes back as JSON on a pipe of its own. When the call
ends -- answered, over its time limit, crashed -- the zygote kills the child and every process it
left behind, so no call can leave state for the next one, and nothing outlives a call.

The boundary not to break:

* the zygote never unpickles or parses the request (model text travels only inside it); it handles
  trusted ``context`` only; children cannot signal, trace or write the zygote (another uid);
* nothing flows from the sandbox to the host but length-prefixed frames written by the zygote, and a
  call's payload is the child's JSON, decoded on the host with :func:`json.loads` (never pickle) and
  checked by the caller: a child can only ever lie about its *own* call;
* the child's uid can write nowhere (``/tmp`` and ``/dev/shm`` belong to the zygote's root);
* time limits are enforced by killing processes: the zygote kills a child at the call's limit, and
  the host kills the whole sandbox if the zygote does not answer by then (plus a grace).

The host's framing: ``!IdII`` (call id, time limit, context bytes, request bytes) + both pickles; the
zygote's: ``!IBI`` (call id, status, payload bytes) + payload -- per call a "started" frame once the
child runs (the call's clock on the host starts there), then the answer.

A child that executes code of its input *can* write any answer for its own call; keep inputs that
could lead to code execution away from ``handle`` (validate them on the host first): the sandbox is
the second wall, not the first.

Example:
    >>> from llmgym.sandbox.worker import SandboxWorker
    >>> source = "def handle(state, request):\\n    return state + len(request)\\n"
    >>> with SandboxWorker(source) as worker:
    ...     worker.call(100, "four", time_limit=5)
    ('ok', 104)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import json
import marshal
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from .bootstrap import BOOTSTRAP_HELPERS
from .cgroups import JOIN_CGROUPS
from .limits import SandboxLimits, rlimits
from .mounts import bwrap_base_args, minimal_env, ro_bind_args, tmpfs_args, world_readable
from .policy import DEFAULT_PYTHON, SandboxError
from .probe import probe
from .runner import Sandbox, ProcessTreeKiller, memfd_with
from .uids import kill_uid

__all__ = ["WORKER_LIMITS", "SandboxWorker", "interpreter_for", "site_packages"]

#: Limits of each call of a worker: ``memory_mb`` of address space on top of the zygote's,
#: ``max_processes`` under the worker's uid, ``max_file_mb`` per file (there is nowhere to write
#: anyway), ``max_output_kb`` of answer. ``wall_seconds`` is the limit of a call made with
#: ``time_limit=None``; each call's CPU limit is its time limit.
WORKER_LIMITS = SandboxLimits(
    cpu_seconds=60, wall_seconds=60, memory_mb=1024, max_processes=8, max_file_mb=1,
    max_open_files=64, tmp_size_mb=1, max_output_kb=64,
)

#: Seconds the zygote may take to start and run ``setup()`` (reasoning-gym imports in ~4 s).
START_TIMEOUT = 180.0
#: Seconds past a call's time limit before the host gives up on the zygote and kills the sandbox.
GRACE_S = 3.0
#: Memory of the zygote itself, added to the tree's cgroup cap (where there is a cgroup).
ZYGOTE_MB = 1536

_DIED = ("died", None)  # _answer's sentinel: the zygote died during the call
_HEAD_IN = struct.Struct("!IdII")
_HEAD_OUT = struct.Struct("!IBI")
# statuses of the zygote's frames (the same numbers in _ZYGOTE below); _STARTED: the call's child runs
_READY, _START_ERROR, _OK, _TIMEOUT, _CRASH, _TOO_LARGE, _SETUP_ERROR, _PREPARE_ERROR, _STARTED = range(9)

# ----------------------------------------------------------------------------------------------
# The zygote: runs under the sandbox's interpreter (stdlib only, Python 3.8+), after the helpers of
# the bootstrap (uid drop, limits, seccomp).
# ----------------------------------------------------------------------------------------------
_ZYGOTE = r"""
import gc, json, marshal, math, pickle, select, signal, struct, time

_IN = struct.Struct("!IdII")
_OUT = struct.Struct("!IBI")
READY, START_ERROR, OK, TIMEOUT, CRASH, TOO_LARGE, SETUP_ERROR, PREPARE_ERROR, STARTED = range(9)

def _read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)

def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]

def _send(fd, call_id, status, payload):
    _write_all(fd, _OUT.pack(call_id, status, len(payload)) + payload)

def _text(exc):
    return ("%s: %s" % (type(exc).__name__, exc)).encode("utf-8", "replace")[:4000]

def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return

def _alive(pid):
    # a thread-group leader that exited with a thread still running shows "Z" and runs on: a process
    # is dead only when every one of its threads is
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/stat" % (pid, tid), "rb") as fh:
                if fh.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                    return True
    except (OSError, IndexError):
        pass
    return False

def _leftovers(uid):
    # processes a call left. As our pid namespace's init: every process but us, zombies included
    # (ours to reap, or a leader whose threads live on); else the live ones of the call's uid.
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        if me != 1:
            try:
                with open("/proc/%s/status" % name, "rb") as fh:
                    fields = dict(line.split(b":", 1) for line in fh.read().splitlines() if b":" in line)
                if uid is None or int(fields[b"Uid"].split()[0]) != uid or not _alive(int(name)):
                    continue
            except (OSError, ValueError, KeyError, IndexError):
                continue
        found.append(int(name))
    return found

def _end_call(cfg, pid):
    # Kill everything the call started; True when nothing is left. Its cgroup (where there is one)
    # takes every process at once, whatever its state; the sweep kills what /proc still shows and
    # reaps, until our namespace holds nobody but us -- or reports that it could not.
    unit = cfg.get("call_unit")
    if unit is not None:
        try:
            os.write(unit[1], b"1")
        except OSError:
            pass
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    deadline = time.monotonic() + 2.0  # within the host's grace (GRACE_S)
    while True:
        _reap()
        left = _leftovers(cfg["uid"])
        if not left:
            return True
        if time.monotonic() > deadline:
            return False
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.001)

def _vm_bytes():
    with open("/proc/self/status", "rb") as fh:
        for line in fh:
            if line.startswith(b"VmSize:"):
                return int(line.split()[1]) * 1024
    return 0

def _child(cfg, handle, state, request, limit, ready_w, result_w):
    try:
        if cfg.get("call_unit") is not None:  # into the call's cgroup, before any of its code runs
            os.write(cfg["call_unit"][0], b"0")
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        lo = 3
        for fd in sorted((ready_w, result_w)):
            os.closerange(lo, fd)
            lo = fd + 1
        os.closerange(lo, 65536)
        lim = [list(x) for x in cfg["rlimits"]]
        for x in lim:
            if x[0] == "RLIMIT_AS":  # on top of what the fork already maps
                x[1] = x[2] = _vm_bytes() + x[1]
            elif x[0] == "RLIMIT_CPU":
                x[1] = max(1, int(math.ceil(limit)))
                x[2] = x[1] + 1
        _drop_and_limit(dict(cfg, rlimits=lim), cfg["uid"], False, cfg["uid"])
    except BaseException as e:
        try:
            os.write(ready_w, _text(e))
        finally:
            os._exit(125)
    os.close(ready_w)  # from here on, untrusted input is handled: the set-up channel is gone
    try:
        out = json.dumps({"ok": handle(state, pickle.loads(request))})
    except BaseException as e:
        out = json.dumps({"error": "%s: %s" % (type(e).__name__, str(e)[:2000])})
    _write_all(result_w, out.encode("utf-8", "replace"))
    os._exit(0)

def _call(cfg, handle, state, request, limit, started):
    ready_r, ready_w = os.pipe()
    result_r, result_w = os.pipe()
    deadline = time.monotonic() + limit
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(result_r)
        _child(cfg, handle, state, request, limit, ready_w, result_w)
        os._exit(125)
    os.close(ready_w)
    os.close(result_w)
    err = _setup_error(ready_r)
    if err:
        return SETUP_ERROR, err, _end_call(cfg, pid)
    started()  # the host's clock for this call starts now (prepare() and the set-up are not the check's)
    buf, status, wait_status = bytearray(), None, None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            status = TIMEOUT
            break
        if not select.select([result_r], [], [], min(left, 0.01))[0]:
            # the answer ends when the call's process has exited, not when the pipe's last writer closes it:
            # a process the call left (a clone(CLONE_PARENT) sibling, a daemon) may hold it open
            got, st = os.waitpid(pid, os.WNOHANG)
            if got == pid:
                wait_status = st
                os.set_blocking(result_r, False)
                try:
                    while len(buf) <= cfg["max_result"]:
                        chunk = os.read(result_r, 65536)
                        if not chunk:
                            break
                        buf += chunk
                except BlockingIOError:
                    pass
                if len(buf) > cfg["max_result"]:
                    status = TOO_LARGE
                break
            continue
        chunk = os.read(result_r, 65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > cfg["max_result"]:
            status = TOO_LARGE
            break
    os.close(result_r)
    while status is None and wait_status is None:  # it answered: give it until the deadline to exit
        got, st = os.waitpid(pid, os.WNOHANG)
        if got == pid:
            wait_status = st
            break
        if time.monotonic() >= deadline:
            status = TIMEOUT
            break
        time.sleep(0.0005)
    clean = _end_call(cfg, pid)
    if status is not None:
        return status, b"", clean
    if os.WIFSIGNALED(wait_status):
        return CRASH, b"signal %d" % os.WTERMSIG(wait_status), clean
    if os.WEXITSTATUS(wait_status) != 0 or not buf:
        return CRASH, b"exit %d" % os.WEXITSTATUS(wait_status), clean
    return OK, bytes(buf), clean

def _worker():
    cfg_fd = int(sys.argv[1])
    with os.fdopen(cfg_fd, "rb") as fh:
        cfg = marshal.loads(fh.read())
    sys.dont_write_bytecode = True
    # after the standard library, before the system's own site/dist-packages: the caller's versions win
    at = next((i for i, p in enumerate(sys.path) if p.endswith(("site-packages", "dist-packages"))), len(sys.path))
    sys.path[at:at] = cfg["paths"]
    inp, out = 0, 1
    sys.stdout = sys.stderr  # a print() in setup() must not corrupt the frames on fd 1
    ns = {"__name__": "__sandbox_worker__"}
    try:
        exec(compile(cfg["source"], "<worker>", "exec"), ns)
        if "setup" in ns:
            ns["setup"]()
        handle, prepare = ns["handle"], ns.get("prepare")
    except BaseException:
        import traceback
        _send(out, 0, START_ERROR, traceback.format_exc()[-4000:].encode("utf-8", "replace"))
        return
    gc.collect()
    gc.freeze()  # children share the imported modules' pages instead of copying them on first GC
    _send(out, 0, READY, b"")
    while True:
        head = _read_exact(inp, _IN.size)
        if head is None:
            return
        call_id, limit, n_context, n_request = _IN.unpack(head)
        context, request = _read_exact(inp, n_context), _read_exact(inp, n_request)
        if context is None or request is None:
            return
        try:
            state = pickle.loads(context)
            if prepare is not None:
                state = prepare(state)
        except BaseException as e:
            _send(out, call_id, PREPARE_ERROR, _text(e))
            continue
        status, payload, clean = _call(cfg, handle, state, request, limit,
                                       lambda: _send(out, call_id, STARTED, b""))
        _send(out, call_id, status, payload)
        if not clean:  # something of the call would not die: end the namespace, and the kernel kills it
            os._exit(3)

_worker()
"""

ZYGOTE_SOURCE = BOOTSTRAP_HELPERS + _ZYGOTE


_launcher: concurrent.futures.ThreadPoolExecutor | None = None
_launcher_pid = 0
_launcher_lock = threading.Lock()


def _popen(*args: Any, **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen`` from one long-lived thread of this process.

    bwrap's ``--die-with-parent`` (``PR_SET_PDEATHSIG``) fires when the *thread* that started it ends,
    not the process: a worker started from a batch's pool thread would be SIGKILLed when the pool
    shuts down. This thread lives as long as the process.
    """
    global _launcher, _launcher_pid
    with _launcher_lock:
        if _launcher is None or _launcher_pid != os.getpid():  # after a fork the old thread is gone
            _launcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="llmgym-sandbox-launcher")
            _launcher_pid = os.getpid()
        launcher = _launcher
    return launcher.submit(subprocess.Popen, *args, **kwargs).result()


def site_packages(*modules: str) -> list[str]:
    """The ``sys.path`` directories a sandbox needs to import ``modules`` as this process does.

    The directory each module imports from, plus every other ``site-packages`` / ``dist-packages``
    of this interpreter (their dependencies may live there), in ``sys.path`` order; directories
    under ``/usr`` are visible in every sandbox anyway and are left out. A directory other users
    cannot read (under ``/root``, mode 700) is kept only if one of ``modules`` needs it, so that
    :class:`SandboxWorker` can say so.

    Raises:
        ModuleNotFoundError: a module is not installed.

    Example:
        >>> import os, sympy
        >>> from llmgym.sandbox.worker import site_packages
        >>> any(os.path.realpath(sympy.__file__).startswith(p + os.sep) for p in site_packages("sympy"))
        True
    """
    import importlib.util
    import sysconfig

    stdlib = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")}
    entries = list(dict.fromkeys(os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)))
    needed: list[str] = []
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or not (spec.origin or spec.submodule_search_locations):
            raise ModuleNotFoundError(f"no module named {name!r}", name=name)
        location = spec.origin if spec.origin not in (None, "namespace") else list(spec.submodule_search_locations)[0]
        path = os.path.realpath(location)
        entry = max((p for p in entries if path.startswith(p + os.sep)), key=len, default=None)
        if entry is None:
            raise ModuleNotFoundError(f"{name!r} ({path}) is not under any sys.path entry", name=name)
        if entry not in stdlib:  # the sandbox's interpreter has its own
            needed.append(entry)
    found = [p for p in entries
             if p in needed or (p.endswith(("site-packages", "dist-packages")) and world_readable(p))]
    return [p for p in found if not (p == "/usr" or p.startswith("/usr/"))]


def interpreter_for(paths: Iterable[str], python: str = DEFAULT_PYTHON) -> str:
    """An interpreter a sandbox can run with packages from ``paths``: same ``major.minor`` as this one
    (compiled extensions are built for it) and readable by an unprivileged uid.

    ``python`` first, then this process's own interpreter (its real path, not the venv's link).

    Raises:
        SandboxError: none fits; the message names the candidates and the fix.

    Example:
        >>> from llmgym.sandbox.worker import interpreter_for
        >>> import subprocess, sys
        >>> exe = interpreter_for([])
        >>> subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True).stdout.strip() == str(sys.version_info[:2])
        True
    """
    want = "%d.%d" % sys.version_info[:2]
    tried = []
    for candidate in dict.fromkeys([python, os.path.realpath(sys.executable)]):
        info = probe(candidate)
        version = ".".join(str(info.get("python_version", "")).split(".")[:2])
        if info["python"] and version == want:
            return candidate
        tried.append(f"{candidate} ({'Python ' + version if info['python'] else info['why'].get('python', 'unusable')})")
    raise SandboxError(
        f"no interpreter the sandbox can run packages of this Python {want} with (compiled packages are "
        f"built for it): tried " + ", ".join(tried) + f". Fix: install Python {want} where every user can "
        f"read it (e.g. `apt-get install python{want}`, or a Python outside /root), or run this process "
        f"with a Python of the same version as {python}."
    )


class SandboxWorker:
    """A sandboxed process that runs trusted ``source`` once and answers calls in fresh children.

    ``source`` (trusted Python, run by the sandbox's interpreter) defines ``handle(state, request)``
    (runs in the call's child; returns JSON-able data), and optionally ``setup()`` (once, in the
    zygote, before the first call: imports) and ``prepare(context) -> state`` (per call, in the zygote:
    trusted context only, e.g. a cache of objects built from it). ``paths`` are host directories
    bound read-only into the sandbox and added to its ``sys.path`` (e.g. :func:`site_packages`).

    :meth:`call` returns ``("ok", value)``, ``("error", message)`` (``handle`` raised, or its child
    crashed, or answered malformed or too much) or ``("timeout", None)``; the value is whatever JSON
    the child wrote -- validate it. A worker that cannot start or set up a call raises
    :class:`~llmgym.sandbox.SandboxError` (naming the cause): that is the machine's failure, never a
    call's. A worker whose zygote died is restarted at the next call. Calls are serialised; use one
    worker per concurrent caller. After ``os.fork`` the child process starts a worker of its own.

    Args:
        source: the trusted worker source (see above).
        paths: host directories bound read-only and put on the worker's ``sys.path``.
        limits: limits of each call (default :data:`WORKER_LIMITS`).
        sandbox: the :class:`~llmgym.sandbox.Sandbox` whose mechanisms, uid pool and interpreter to
            use (default: ``Sandbox(python=interpreter_for(paths))``, so every required mechanism
            must be present unless opted out).
        start_hint: appended to a start-up error (what the user should install or fix).
        env: extra environment variables of the worker.
    """

    def __init__(
        self,
        source: str,
        *,
        paths: Iterable[str] = (),
        limits: SandboxLimits | None = None,
        sandbox: Sandbox | None = None,
        start_hint: str = "",
        env: Mapping[str, str] | None = None,
    ):
        if not isinstance(source, str):
            raise TypeError(f"source must be str, got {type(source).__name__}")
        self.source = source
        self.paths = [os.path.realpath(p) for p in paths]
        for path in self.paths:
            if path in ("/", "/tmp", "/dev", "/proc"):  # would expose the host's own (or replace the private) tree
                raise ValueError(f"cannot bind {path} into the sandbox: put the module in a directory of its own "
                                 f"(e.g. {path.rstrip('/')}/my_env/) and import it from there")
        self.limits = limits or WORKER_LIMITS
        if sandbox is None:
            sandbox = Sandbox(self.limits, python=interpreter_for(self.paths))
        self.sandbox = sandbox
        self.start_hint = start_hint
        self.env = dict(env or {})
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._reset()

    def _reset(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._killer: ProcessTreeKiller | None = None
        self._slot: contextlib.ExitStack | None = None
        self._stderr: Any = None
        self._uid: int | None = None
        self._pid = os.getpid()

    def __repr__(self) -> str:
        state = "running" if self._proc is not None and self._proc.poll() is None else "stopped"
        return f"SandboxWorker({state}, paths={self.paths}, mechanisms={self.sandbox.mechanisms})"

    # ------------------------------------------------------------------ start / stop
    def _check_paths(self) -> None:
        for path in self.paths:
            if not os.path.isdir(path):
                raise SandboxError(f"the worker's path {path} is not a directory")
            if self.sandbox.isolation.setuid and not world_readable(path):
                raise SandboxError(
                    f"the sandbox's unprivileged uid cannot read {path} (a directory on the way is not "
                    f"world-readable -- a venv under /root, mode 700, is not). {self.start_hint or ''} "
                    f"Fix: create the venv where every user can read it (e.g. /opt or the project "
                    f"folder), or `chmod o+rx` each directory on the way to {path}."
                )

    def _start(self) -> None:
        self._check_paths()
        sb, iso = self.sandbox, self.sandbox.isolation
        self._slot = contextlib.ExitStack()
        fds: list[int] = []
        try:
            if iso.uid_pool is not None:
                self._uid = self._slot.enter_context(iso.uid_pool.acquire())
            lim = self.limits
            cfg = {
                "uid": self._uid,
                "workdir": "/",
                "paths": self.paths,
                "source": self.source.encode("utf-8", "surrogatepass"),
                "rlimits": rlimits(lim, nproc=self._uid is not None),
                "seccomp_inproc": iso.seccomp and iso.bwrap_path is None,
                "max_result": int(lim.max_output_kb * 1024),
            }
            pass_fds = []
            if iso.call_cgroup is not None and self._uid is not None:
                unit = iso.call_cgroup.open(f"uid-{self._uid}")
                fds += unit
                pass_fds += unit
                cfg["call_unit"] = list(unit)
            cfg_fd = memfd_with(marshal.dumps(cfg, 4), "llmgym-worker-cfg")
            fds.append(cfg_fd)
            pass_fds.append(cfg_fd)
            env = dict(sb.env, HOME="/tmp", TMPDIR="/tmp", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                       MKL_NUM_THREADS="1", **self.env)
            boot = [sb.python, "-I", "-c", ZYGOTE_SOURCE, str(cfg_fd)]
            info_r = None
            if iso.bwrap_path is not None:
                # CAP_KILL: the zygote (root of the namespace) kills each call's child, another uid
                cmd = bwrap_base_args(iso.bwrap_path, sb.python, os.geteuid() == 0, ("CAP_KILL",))
                # the tmpfs first: a module dir under /tmp (a checkout or venv there) is bound on top of it,
                # not hidden by it
                cmd += tmpfs_args(int(lim.tmp_size_mb * (1 << 20)), mode="0755") + ["--chdir", "/"]
                cmd += ro_bind_args(self.paths)
                for k, v in env.items():
                    cmd += ["--setenv", k, v]
                if iso.seccomp and iso.seccomp_filter:
                    bpf_fd = memfd_with(iso.seccomp_filter, "llmgym-worker-bpf")
                    fds.append(bpf_fd)
                    pass_fds.append(bpf_fd)
                    cmd += ["--seccomp", str(bpf_fd)]
                info_r, info_w = os.pipe()
                fds.append(info_w)
                pass_fds.append(info_w)
                cmd += ["--info-fd", str(info_w), "--", *boot]
                popen_env = minimal_env()
            else:
                cmd, popen_env = boot, env
            if iso.cgroups is not None and self._uid is not None:
                tree = dataclasses.replace(lim, memory_mb=lim.memory_mb + ZYGOTE_MB, tmp_size_mb=1)
                procs = iso.cgroups.prepare(f"uid-{self._uid}", tree)
                cmd = ["/bin/sh", "-c", JOIN_CGROUPS, "sh", *procs, "--", *cmd]
            self._stderr = tempfile.TemporaryFile()
            try:
                proc = _popen(
                    cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                    env=popen_env, cwd="/", pass_fds=pass_fds, start_new_session=True,
                )
            except OSError as e:
                raise SandboxError(f"could not start the sandboxed worker: {e}") from e
            self._proc, self._killer = proc, ProcessTreeKiller(proc, info_r)
            for fd in fds:
                os.close(fd)
            fds = []
            _, status, payload = self._read_frame(time.monotonic() + START_TIMEOUT)
        except BaseException:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._stop()
            raise
        if status != _READY:
            detail = payload.decode("utf-8", "replace").strip() if payload else self._stderr_tail()
            self._stop()
            what = "did not start" if status is None else "could not start"
            raise SandboxError(
                f"the sandboxed worker {what}: {detail or 'no message'}"
                + (f"\n{self.start_hint}" if self.start_hint else "")
            )

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            self._stderr.seek(0)
            return self._stderr.read()[-3000:].decode("utf-8", "replace").strip()
        return ""

    def _read_frame(self, deadline: float) -> tuple[int | None, int | None, bytes]:
        """``(call id, status, payload)`` of the zygote's next frame; ``(None, None, b"")`` on EOF or
        past ``deadline``."""
        fd = self._proc.stdout.fileno()
        head = self._read_exact(fd, _HEAD_OUT.size, deadline)
        if head is None:
            return None, None, b""
        call_id, status, size = _HEAD_OUT.unpack(head)
        payload = self._read_exact(fd, size, deadline)
        if payload is None:
            return None, None, b""
        return call_id, status, payload

    @staticmethod
    def _read_exact(fd: int, n: int, deadline: float) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                if time.monotonic() >= deadline:
                    return None
                continue
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def _stop(self) -> None:
        proc, killer = self._proc, self._killer
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            if proc.poll() is None and killer is not None:
                killer.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            with contextlib.suppress(OSError):
                proc.stdout.close()
        if killer is not None and killer.info_fd is not None:
            with contextlib.suppress(OSError):
                os.close(killer.info_fd)
        if self._uid is not None and self.sandbox.isolation.bwrap_path is None:
            kill_uid(self._uid)  # no pid namespace took the leftovers down
        if self._slot is not None:
            self._slot.close()  # frees the uid
        if self._stderr is not None:
            with contextlib.suppress(OSError):
                self._stderr.close()
        self._reset()

    def close(self) -> None:
        """Stop the worker (idempotent; the next call starts a new one)."""
        with self._lock:
            if self._pid != os.getpid():  # a forked copy: the parent's worker is not ours to stop
                self._reset()
                return
            self._stop()

    def __enter__(self) -> SandboxWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # ------------------------------------------------------------------ calls
    def limit(self, time_limit: float | None) -> float:
        """The seconds a call with ``time_limit`` gets (``None``: ``limits.wall_seconds``)."""
        limit = float(self.limits.wall_seconds if time_limit is None else time_limit)
        if not limit > 0:
            raise ValueError(f"time_limit must be positive, got {time_limit!r}")
        return limit

    def call(self, context: Any, request: Any, time_limit: float | None) -> tuple[str, Any]:
        """Run ``handle(prepare(context), request)`` in a fresh child, killed after ``time_limit`` s.

        ``context`` and ``request`` are pickled here (host to sandbox only); ``context`` must be
        trusted (the zygote reads it), ``request`` may hold hostile text (only the child reads it).
        ``time_limit=None`` means ``limits.wall_seconds``.
        """
        limit = self.limit(time_limit)
        context_b, request_b = pickle.dumps(context, 4), pickle.dumps(request, 4)
        with self._lock:
            if self._pid != os.getpid():
                self._reset()
            for attempt in (0, 1):
                if self._proc is None or self._proc.poll() is not None:
                    if self._proc is not None:
                        self._stop()
                    self._start()
                call_id = next(self._ids) & 0xFFFFFFFF
                try:
                    self._proc.stdin.write(_HEAD_IN.pack(call_id, limit, len(context_b), len(request_b)))
                    self._proc.stdin.write(context_b)
                    self._proc.stdin.write(request_b)
                    self._proc.stdin.flush()
                except (BrokenPipeError, OSError):
                    self._stop()  # it died while idle (nothing of this call ran): start afresh, once
                    if attempt:
                        raise SandboxError("the sandboxed worker died before it could take the call") from None
                    continue
                answer = self._answer(call_id, limit)
                if answer is _DIED and not attempt:
                    # killed from outside (or by the tree's memory cap) mid-call: the verdict is unknown,
                    # and a 0 would be a lie -- the call runs again on a fresh worker; dying twice is the
                    # call's own doing, and its error
                    continue
                if answer is _DIED:
                    return "error", "the sandboxed worker died during the call, twice (it is restarted for the next one)"
                return answer
        raise AssertionError("unreachable")

    def _answer(self, call_id: int, limit: float) -> tuple[str, Any]:
        # first the zygote's "started" (after prepare() and the child's set-up: not the check's time),
        # then the answer, within the call's limit plus a grace
        got, status, payload = self._read_frame(time.monotonic() + START_TIMEOUT)
        if got is None:  # the trusted part (prepare, the child's set-up) hung or died: not the check's fault
            detail = self._stderr_tail()
            self._stop()
            raise SandboxError(f"the sandboxed worker did not start the call within {START_TIMEOUT:.0f} s"
                               + (f": {detail}" if detail else ""))
        if got == call_id and status == _STARTED:
            got, status, payload = self._read_frame(time.monotonic() + limit + GRACE_S)
        elif status not in (_SETUP_ERROR, _PREPARE_ERROR):
            self._stop()
            raise SandboxError(f"the sandboxed worker answered out of order (status {status})")
        if got is None:  # the zygote stopped answering (killed by the tree's memory cap, or hung)
            alive = self._proc.poll() is None
            self._stop()
            if alive:
                return "timeout", None
            return _DIED
        if got != call_id:
            self._stop()
            raise SandboxError(f"the sandboxed worker answered call {got} to call {call_id}")
        if status == _OK:
            try:
                answer = json.loads(payload.decode("utf-8", "strict"))
            except (UnicodeDecodeError, ValueError, RecursionError) as e:
                return "error", f"malformed answer from the sandbox ({type(e).__name__})"
            if isinstance(answer, dict) and len(answer) == 1:
                if "ok" in answer:
                    return "ok", answer["ok"]
                if isinstance(answer.get("error"), str):
                    return "error", answer["error"]
            return "error", "malformed answer from the sandbox"
        if status == _TIMEOUT:
            return "timeout", None
        if status == _CRASH:
            text = payload.decode("ascii", "replace")
            if text.startswith("signal "):
                with contextlib.suppress(ValueError):
                    text = "killed by " + signal.Signals(int(text.split()[1])).name
            return "error", f"the check's process ended without an answer ({text})"
        if status == _TOO_LARGE:
            return "error", f"the check's answer exceeded {self.limits.max_output_kb} KiB"
        detail = payload.decode("utf-8", "replace")
        if status == _SETUP_ERROR:
            raise SandboxError(f"the sandboxed worker could not set up a call: {detail}")
        if status == _PREPARE_ERROR:
            raise SandboxError(f"the sandboxed worker could not prepare a call: {detail}")
        self._stop()
        raise SandboxError(f"the sandboxed worker sent an unknown status {status}")

