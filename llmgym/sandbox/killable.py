"""The killable child: run one call in a forked process; nothing the call starts outlives it.

A time limit is enforced by something that can stop the work -- a killed process, never a thread. This
module is the one implementation of that rule for code that runs on the host: a ``Verifier(time_limit=...)``,
a multi-turn env's ``respond_time_limit``, the tools' helper (``llmgym/tools/tool_helper.py`` loads this file
by path: it imports nothing of ``llmgym``), and the interop adapters, which ask :func:`in_killable_child`
before starting a sandboxed worker. (Inside the sandbox, the zygote of :mod:`llmgym.sandbox.worker` forks
its calls in its own namespace and cgroup.)

How: ``os.fork`` (no re-import of the user's ``__main__``, the callable need not pickle, and a daemonic
parent such as an ``AsyncVectorEnv`` worker may fork where ``multiprocessing`` would refuse it a child). The
call's process (the *worker*) is, wherever one can be made, the **init of a PID namespace** of its own, with
a private mount namespace and its own ``/proc``: a process it starts cannot leave that namespace -- not by
``setsid``, a double fork, ``clone(CLONE_PARENT)`` (refused to an init; from its descendants it only makes a
sibling inside) or a move to another cgroup -- and when the worker ends, the kernel kills every process in
it before the caller's wait returns.

* As root the caller forks the worker straight into a new PID namespace (``unshare(CLONE_NEWPID)`` applies
  to the calling thread's next child; ``setns`` then brings the thread back): one fork per call.
* Otherwise a **keeper** (the caller's child, which runs none of the call's code) makes a user namespace
  that maps only the caller's uid and gid, and the PID + mount namespaces inside it, then forks the worker
  and waits for it. Where no namespace can be made at all, the keeper is a child subreaper: whatever the
  call starts stays its descendant (``clone(CLONE_PARENT)`` from the worker makes a child of the keeper),
  and it kills and reaps all of them before it exits; where this process may make a cgroup v2 with
  ``cgroup.kill`` (root, Linux >= 5.14), each call also gets one (``<own cgroup>/llmgym-killable/<pid>-<n>``),
  joined by the keeper before the worker is forked, frozen at the deadline and ended by ``cgroup.kill``.

The answer: the worker writes the pickled outcome into a shared anonymous mapping (``MADV_DONTFORK``: the
processes the call forks do not have it), the length last; the caller waits for its child's **exit** -- not
for a pipe's end of file that a descendant could hold open -- and reads the answer only then, when nothing
the call started runs any more. No answer, or a keeper killed before it finished, is ``"died"``. At the
deadline the caller kills the worker (its namespace goes with it) or stops the keeper, kills every
descendant it finds in ``/proc``, then the keeper.

What escapes without a namespace: a call that kills its own keeper (same uid) hands what it started to
``init`` (the cgroup still ends it, where there is one); its answer is refused. Standard library only.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
from typing import Any, Callable, Iterable, NamedTuple, Optional

try:
    from .child_env import scrub_environ as _scrub_environ
except ImportError:  # loaded by path in the tools' helper (it imports nothing of llmgym): its sibling file, by path
    import importlib.util as _util

    _spec = _util.spec_from_file_location("llmgym_child_env", os.path.join(os.path.dirname(__file__), "child_env.py"))
    _child_env = _util.module_from_spec(_spec)
    _spec.loader.exec_module(_child_env)
    _scrub_environ = _child_env.scrub_environ

__all__ = ["ChildOutcome", "call_in_killable_child", "in_killable_child", "mark_killable_child",
           "start_child_process", "DEFAULT_MAX_RESULT_BYTES"]

DEFAULT_MAX_RESULT_BYTES = 64 << 20
"""The most bytes of pickled result read back from a child (more is reported as a failure, not read)."""

_IN_KILLABLE_CHILD = False
_die_with_parent: Optional[Callable[[], Any]] = None
_libc: Any = None

_HEADER = struct.Struct("<Q")  # the answer's length, written after the answer itself
_OVERSIZED = (1 << 64) - 1  # the length that says "the answer passed max_result_bytes"

# unshare(2) and mount(2) flags
_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18


class ChildOutcome(NamedTuple):
    """How a killable call ended.

    ``status`` is ``"ok"`` (``value`` is the call's result), ``"raised"`` (``value`` is the exception, or
    its ``"Type: message"`` text where it does not pickle), ``"timeout"`` (killed at the limit),
    ``"died"`` (ended without a readable answer: ``value`` says how), ``"oversized"`` (its answer
    passed ``max_result_bytes``: not read) or ``"watch_closed"`` (``watch_fd`` became readable first: the caller's caller went away).
    """

    status: str
    value: Any = None


def in_killable_child() -> bool:
    """True inside a child forked by :func:`call_in_killable_child` (the whole child dies at its limit,
    so starting anything slow there -- a sandboxed worker -- would eat the call's time).

    Example:
        >>> from llmgym.sandbox.killable import call_in_killable_child, in_killable_child
        >>> in_killable_child(), call_in_killable_child(in_killable_child, limit=30).value
        (False, True)
    """
    return _IN_KILLABLE_CHILD


def mark_killable_child() -> None:
    """Make :func:`in_killable_child` true in this process (done first thing in every such child)."""
    global _IN_KILLABLE_CHILD
    _IN_KILLABLE_CHILD = True


def start_child_process(process: Any) -> None:
    """Start a daemonic ``multiprocessing`` process, also from inside a daemonic process.

    ``multiprocessing`` refuses children of a daemonic process (an ``AsyncVectorEnv`` worker is one)
    because it could not join them at exit; a child its caller kills and joins itself may lift the flag
    for its start. (:func:`call_in_killable_child` forks directly and needs none of this.)

    Example:
        >>> import multiprocessing
        >>> p = multiprocessing.get_context("fork").Process(target=abs, args=(-1,), daemon=True)
        >>> start_child_process(p); p.join(); p.exitcode
        0
    """
    import multiprocessing

    config = multiprocessing.current_process()._config  # noqa: SLF001 (no public switch exists)
    parent_is_daemon = bool(config.get("daemon"))
    if parent_is_daemon:
        config["daemon"] = False
    try:
        process.start()
    finally:
        if parent_is_daemon:
            config["daemon"] = True


def _load_libc() -> Any:
    """The C library through ``ctypes`` (``None`` where there is none); loaded once: it costs milliseconds."""
    global _libc
    if _libc is None:
        try:
            import ctypes

            _libc = ctypes.CDLL(None, use_errno=True)
        except Exception:
            _libc = False
    return _libc or None


def _child_setup() -> Callable[[], Any]:
    """A function that makes the calling process die with its parent (``PR_SET_PDEATHSIG``) and a child
    subreaper (``PR_SET_CHILD_SUBREAPER``: orphans of its descendants come back to it, not to ``init``).
    Linux ``prctl``; a no-op elsewhere, where the time limit still holds."""
    global _die_with_parent
    if _die_with_parent is None:
        libc = _load_libc()
        if libc is None or not hasattr(libc, "prctl"):
            _die_with_parent = lambda: None  # noqa: E731
        else:
            prctl = libc.prctl

            def setup() -> None:
                prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
                prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
            _die_with_parent = setup
    return _die_with_parent


# -- the call's PID namespace ------------------------------------------------------------------------------


_NOT_PROBED = object()
_DIRECT = "direct"  # a mode: this thread forks the call straight into a new PID namespace (root)
_namespace_modes: dict[int, Any] = {}  # pid -> how calls get their namespace here (see _call_namespace)
_own_pid_namespace: dict[int, int] = {}  # pid -> an fd of this process's PID namespace (to come back to)


def _unshare(flags: int) -> bool:
    """``unshare(flags)`` in this thread; with a user namespace, map the caller's uid and gid only."""
    libc = _load_libc()
    if libc is None:
        return False
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(flags) != 0:
        return False
    if flags & _CLONE_NEWUSER:
        try:
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as fh:
                    fh.write(text)
        except OSError:
            return False
    return True


def _own_proc(new_mount_namespace: bool) -> bool:
    """In a new PID namespace's first process: (make a mount namespace and) make every mount private, so
    that nothing propagates back to the host, then mount a ``/proc`` that shows this PID namespace
    (``/proc/<os.getpid()>`` is this process again, and no process outside it is listed)."""
    libc = _load_libc()
    if libc is None or (new_mount_namespace and libc.unshare(_CLONE_NEWNS) != 0):
        return False
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return False
    return libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None) == 0


_CAP_SYS_PTRACE, _CAP_SYS_ADMIN = 19, 21
_PR_CAPBSET_DROP = 24
_CAPABILITY_VERSION_3 = 0x20080522


def _give_up_reach() -> bool:
    """In a call's process that runs as root (the namespace the caller forked it into): give up
    ``CAP_SYS_ADMIN`` and ``CAP_SYS_PTRACE``, from the bounding set and from the effective, permitted and
    inheritable sets. With them, root could unmount the namespace's ``/proc`` (the host's shows below), join
    the host's mount namespace, and open the caller's ``/proc/<pid>/mem`` to read and write it: code that
    outlives the call. ``False`` where it could not (the caller then ends the call unanswered)."""
    import ctypes

    libc = _load_libc()
    if libc is None or not hasattr(libc, "capget"):
        return False
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable}: capabilities 0-31, 32-63
    if libc.capget(ctypes.byref(header), ctypes.byref(data)) != 0:
        return False
    for cap in (_CAP_SYS_ADMIN, _CAP_SYS_PTRACE):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            return False
        for i in range(3):
            data[3 * (cap // 32) + i] &= ~(1 << (cap % 32)) & 0xFFFFFFFF
    return libc.capset(ctypes.byref(header), ctypes.byref(data)) == 0


def _proc_is_ours() -> bool:
    """Whether ``/proc`` shows this process's PID namespace (else pids read there name other processes)."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False


def _fork_into_new_pid_namespace() -> int:
    """``os.fork()`` whose child is the first process (init) of a new PID namespace; this thread's later
    children are born in this process's own namespace again (``setns`` back). Needs ``CAP_SYS_ADMIN``;
    the namespace of the children is per thread, so other threads' forks are not affected."""
    libc = _load_libc()
    own = _own_pid_namespace.get(os.getpid())
    if own is None:
        own = _own_pid_namespace[os.getpid()] = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    if libc.unshare(_CLONE_NEWPID) != 0:  # (it worked when probed: a limit such as user.max_pid_namespaces)
        raise OSError(_errno(), "cannot make the call's PID namespace: unshare(CLONE_NEWPID) failed")
    pid = -1
    try:
        pid = os.fork()
    finally:
        if pid != 0 and libc.setns(own, _CLONE_NEWPID) != 0:  # never seen: the probe did the same
            raise OSError(_errno(), "setns back to this process's PID namespace failed")
    return pid


def _errno() -> int:
    import ctypes

    return ctypes.get_errno()


def _probe_namespace() -> Any:
    """How a call gets a PID namespace here, tried on a trial call whose first process mounts its own
    ``/proc``: ``"direct"`` (root: forked straight into one), else the ``unshare`` flags of a user + PID +
    mount namespace that a keeper process makes before it forks the call; ``None`` where neither works."""
    if not sys.platform.startswith("linux") or _load_libc() is None:
        return None

    def trial() -> None:
        os._exit(0 if _own_proc(new_mount_namespace=True) and os.getpid() == 1 and _proc_is_ours() else 1)

    if os.geteuid() == 0:
        try:
            pid = _fork_into_new_pid_namespace()
            if pid == 0:
                trial()
            if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0:
                return _DIRECT
        except OSError:
            pass
    flags = _CLONE_NEWUSER | _CLONE_NEWPID | _CLONE_NEWNS
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:
        code = 1
        try:
            if _unshare(flags):
                inner = os.fork()
                if inner == 0:
                    os._exit(0 if _own_proc(new_mount_namespace=False) and os.getpid() == 1 and _proc_is_ours() else 1)
                code = os.waitstatus_to_exitcode(os.waitpid(inner, 0)[1])
        finally:
            os._exit(code)
    return flags if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0 else None


def _call_namespace() -> Any:
    """How this process's calls get their PID namespace (probed once per process): ``"direct"``, the flags
    a keeper unshares, or ``None`` (no namespace: the keeper's subreaper and, where possible, a cgroup)."""
    pid = os.getpid()
    mode = _namespace_modes.get(pid, _NOT_PROBED)
    if mode is _NOT_PROBED:
        with _probe_lock:
            mode = _namespace_modes.get(pid, _NOT_PROBED)
            if mode is _NOT_PROBED:
                mode = _namespace_modes[pid] = _probe_namespace()
    return mode


# -- finding and killing a call's processes ---------------------------------------------------------------


def _descendants(root: int) -> list[tuple[int, bytes]]:
    """``(pid, state)`` of every descendant of ``root`` now, from ``/proc/*/stat`` (parent pids); nothing
    where ``/proc`` shows another PID namespace than this process's (its pids would name other processes)."""
    children: dict[int, list[tuple[int, bytes]]] = {}
    try:
        if not _proc_is_ours():
            return []
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
            fields = stat[stat.rindex(b")") + 2:].split()
            children.setdefault(int(fields[1]), []).append((int(name), fields[0]))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    found: list[tuple[int, bytes]] = []
    stack = [root]
    while stack:
        for pid, state in children.get(stack.pop(), ()):
            found.append((pid, state))
            stack.append(pid)
    return found


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _end_own_descendants() -> None:
    """In the keeper (a subreaper): kill and reap every descendant, until it has no child left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no child: as a subreaper, no descendant either
        if pid:
            continue
        _kill(p for p, _ in _descendants(os.getpid()))
        time.sleep(0.0005)


def _stop_and_sweep(pid: int, patience: float = 5.0) -> None:
    """From the caller: stop the keeper (it forks no more and stays the subreaper its descendants' orphans
    go to), kill every live descendant until none is left, then the keeper."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        return
    give_up = time.monotonic() + patience
    while time.monotonic() < give_up:
        found = _descendants(pid)
        _kill(p for p, _ in found)  # zombies too: SIGKILL to a zombie leader reaches its live threads
        if all(state == b"Z" for _, state in found):
            break
        time.sleep(0.0005)
    _kill([pid])


_CGROUP_DIR = "llmgym-killable"
_call_counter = itertools.count()
_cgroup_bases: dict[int, Optional[str]] = {}  # pid -> where this process makes its calls' cgroups (None: nowhere)
_probe_lock = threading.Lock()  # one probe at a time (their trial cgroups share a name)


def _own_v2_cgroup() -> Optional[str]:
    """This process's directory in the cgroup v2 hierarchy (pure v2, or a hybrid tree's ``unified``)."""
    with open("/proc/self/cgroup") as fh:
        own = next((line[3:].strip() for line in fh if line.startswith("0::")), None)
    if own is None:
        return None
    for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if os.path.exists(os.path.join(mount, "cgroup.controllers")):
            return os.path.join(mount, own.lstrip("/")).rstrip("/")
    return None


def _remove_cgroup(path: str, patience: float = 5.0) -> bool:
    """Kill every process of the cgroup ``path`` (its sub-cgroups included) and remove it; False when
    something stays (the directory is then left for a later sweep)."""
    give_up = time.monotonic() + patience
    while True:
        try:
            with open(os.path.join(path, "cgroup.kill"), "w") as fh:
                fh.write("1")
        except FileNotFoundError:
            return True
        except OSError:
            pass
        try:
            for top, dirs, _ in os.walk(path, topdown=False):
                for d in dirs:
                    os.rmdir(os.path.join(top, d))
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:  # busy: its processes are still dying
            if time.monotonic() > give_up:
                return False
            time.sleep(0.0005)


def _sweep_stale_cgroups(base: str) -> None:
    """Remove the call cgroups of processes that are gone (a caller killed mid-call leaves its call's)."""
    for name in os.listdir(base):
        owner = name.split("-", 1)[0]
        if not owner.isdigit() or int(owner) == os.getpid():
            continue
        try:
            os.kill(int(owner), 0)
            continue  # its owner runs: its cgroup is in use
        except ProcessLookupError:
            _remove_cgroup(os.path.join(base, name), patience=1.0)
        except PermissionError:
            continue


def _call_cgroup_base() -> Optional[str]:
    """Where this process makes a cgroup per call (``None`` where it cannot: no cgroup v2, not writable,
    no ``cgroup.kill``). Probed once per process: a trial child joins one and is killed by ``cgroup.kill``."""
    pid = os.getpid()
    if pid in _cgroup_bases:
        return _cgroup_bases[pid]
    with _probe_lock:
        if pid not in _cgroup_bases:
            _cgroup_bases[pid] = _probe_call_cgroups(pid)
    return _cgroup_bases[pid]


def _probe_call_cgroups(pid: int) -> Optional[str]:
    """The base of this process's call cgroups if a trial child can join one there and be killed by its
    ``cgroup.kill``, else ``None``; on the way, remove what callers that are gone left there."""
    base: Optional[str] = None
    try:
        own = _own_v2_cgroup()
        if own is not None:
            candidate = os.path.join(own, _CGROUP_DIR)
            os.makedirs(candidate, exist_ok=True)
            if os.path.exists(os.path.join(candidate, "cgroup.kill")):
                _sweep_stale_cgroups(candidate)
                trial = os.path.join(candidate, f"{pid}-probe")
                os.makedirs(trial, exist_ok=True)
                procs = os.open(os.path.join(trial, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
                joined_r, joined_w = os.pipe()
                child = os.fork()
                if child == 0:
                    try:
                        os.write(procs, b"0")
                        os.write(joined_w, b"j")
                        time.sleep(30)
                    finally:
                        os._exit(1)
                os.close(procs)
                os.close(joined_w)
                try:
                    joined = bool(select.select([joined_r], [], [], 10)[0]) and os.read(joined_r, 1) == b"j"
                finally:
                    os.close(joined_r)
                removed = _remove_cgroup(trial, patience=5.0)
                _kill([child])
                _, status = os.waitpid(child, 0)
                if joined and removed and os.waitstatus_to_exitcode(status) == -signal.SIGKILL:
                    base = candidate
    except (OSError, ValueError):
        base = None
    return base


def _open_call_cgroup() -> tuple[Optional[str], Optional[int]]:
    """A new cgroup for one call and its ``cgroup.procs`` opened for writing (``(None, None)`` without)."""
    base = _call_cgroup_base()
    if base is None:
        return None, None
    path = os.path.join(base, f"{os.getpid()}-{next(_call_counter)}")
    try:
        try:
            os.mkdir(path)
        except FileNotFoundError:  # a call's own calls: their base inside its cgroup is made on first use
            os.makedirs(path)
        return path, os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(path)
        return None, None


def _keeper(fn: Callable[..., Any], args: tuple, answer: mmap.mmap, setup: Callable[[], Any], caller: int,
            flags: Optional[int], cgroup: Optional[str], cgroup_procs: Optional[int]) -> None:
    """In the caller's child, which runs none of the call's code (where the caller cannot fork straight into a
    PID namespace): make the call's user + PID namespace (or join its cgroup), fork the worker, wait for it,
    end whatever is left, and exit with how the worker ended (0: it exited 0; 128 + n: killed by signal n;
    else its exit code)."""
    code = 1
    try:
        os.setpgid(0, 0)  # its own process group (a terminal's Ctrl-C reaches the caller, not the call)
        setup()  # dies with the caller; a subreaper (without a namespace, orphans come back here)
        if os.getppid() != caller:
            return  # the caller died before the line above
        if cgroup_procs is not None:
            try:
                os.write(cgroup_procs, b"0")  # the worker is born inside
            except OSError:
                cgroup = None  # the caller sees a failed join and sweeps by hand
            os.close(cgroup_procs)
        isolated = flags is not None and _unshare(flags)
        lifeline_r, lifeline_w = os.pipe()  # only the keeper holds the write end: EOF says it is gone
        worker = os.fork()
        if worker == 0:
            os.close(lifeline_w)
            _worker(fn, args, answer, lifeline_r, isolated and "mount", cgroup)
        os.close(lifeline_r)
        status = os.waitpid(worker, 0)[1]  # with a namespace: its init's end kills and reaps all in it first
        if not isolated:
            _end_own_descendants()
        exit_code = os.waitstatus_to_exitcode(status)
        code = 128 + min(-exit_code, 127) if exit_code < 0 else min(exit_code, 127)
    finally:
        os._exit(code)


def _worker(fn: Callable[..., Any], args: tuple, answer: mmap.mmap, gone: Optional[int], isolated: Any,
            cgroup: Optional[str]) -> None:
    """The call's process: run the call, write its pickled ``(status, value)`` into ``answer`` (the length
    last), exit without cleanup. ``gone``: readable once the process above is gone; ``isolated``: the init of
    a new PID namespace, which mounts its ``/proc`` (``"unshare"``: in a mount namespace of its own making)."""
    global _probe_lock
    try:
        libc = _load_libc()
        if libc is not None and hasattr(libc, "prctl"):
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: dies with the process above
        if gone is not None:
            if select.select([gone], [], [], 0)[0]:
                os._exit(1)  # the process above died before the line above
            os.close(gone)
        if isolated == "unshare":
            os.setpgid(0, 0)  # (a keeper did it otherwise)
        with contextlib.suppress(AttributeError, OSError):
            answer.madvise(mmap.MADV_DONTFORK)  # what the call forks does not get the answer
        _probe_lock = threading.Lock()  # another thread of the caller may have held it at the fork
        for pid_fd in _own_pid_namespace.values():
            with contextlib.suppress(OSError):
                os.close(pid_fd)
        _own_pid_namespace.clear()
        _namespace_modes.clear()
        _cgroup_bases.clear()
        if isolated and not _own_proc(new_mount_namespace=isolated == "unshare"):
            os._exit(2)  # (the probe mounted one: not reached in practice)
        if isolated == "unshare" and not _give_up_reach():  # root: no way out of the namespace it was given
            os._exit(2)
        if cgroup is not None:
            _cgroup_bases[os.getpid()] = os.path.join(cgroup, _CGROUP_DIR)  # its own calls' cgroups go inside
        _scrub_environ()  # the call is model-driven work: none of the parent's secrets (llmgym/sandbox/child_env.py)
        mark_killable_child()
        try:
            outcome = ("ok", fn(*args))
            data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as exc:  # the call's own error, or a result that does not pickle
            try:
                data = pickle.dumps(("raised", exc), protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException:
                data = pickle.dumps(("raised", f"{type(exc).__name__}: {exc}"), protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > len(answer) - _HEADER.size:
            _HEADER.pack_into(answer, 0, _OVERSIZED)
        else:
            answer[_HEADER.size:_HEADER.size + len(data)] = data
            _HEADER.pack_into(answer, 0, len(data))
    finally:
        os._exit(0)


def _in_cgroup(pid: int, cgroup: str) -> bool:
    """Whether process ``pid`` is (still) in the cgroup directory ``cgroup``."""
    try:
        with open(f"/proc/{pid}/cgroup") as fh:
            own = next((line[3:].strip() for line in fh if line.startswith("0::")), "")
    except OSError:
        return False
    return bool(own) and cgroup.endswith(own)


def _wait_for_exit(pid: int, deadline: float, watch_fd: Optional[int]) -> Optional[str]:
    """Wait until process ``pid`` exits (``None``; it is not reaped), the deadline passes (``"timeout"``) or
    ``watch_fd`` becomes readable (``"watch_closed"``)."""
    try:
        pidfd: Optional[int] = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None  # (Linux < 5.3) poll
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            fds = [fd for fd in (watch_fd, pidfd) if fd is not None]
            wait = left if pidfd is not None else min(left, 0.002)
            ready = select.select(fds, [], [], wait)[0] if fds else time.sleep(wait) or []
            if watch_fd is not None and watch_fd in ready:
                return "watch_closed"
            if pidfd in ready or (pidfd is None and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)):
                return None
    finally:
        if pidfd is not None:
            os.close(pidfd)


def call_in_killable_child(fn: Callable[..., Any], *args: Any, limit: float,
                           max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
                           watch_fd: Optional[int] = None) -> ChildOutcome:
    """``fn(*args)`` in a forked child, killed with everything it started after ``limit`` seconds; when it
    answers in time, what it started is killed before the answer is read.

    ``watch_fd``: a file descriptor whose readability ends the wait early (``"watch_closed"``): a helper
    process watches its parent's pipe with it.

    Example:
        >>> from llmgym.sandbox.killable import call_in_killable_child
        >>> call_in_killable_child(pow, 2, 10, limit=30)
        ChildOutcome(status='ok', value=1024)
        >>> import time
        >>> call_in_killable_child(time.sleep, 60, limit=0.5).status
        'timeout'
        >>> call_in_killable_child(int, "x", limit=30).value
        ValueError("invalid literal for int() with base 10: 'x'")
    """
    setup = _child_setup()
    mode = _call_namespace()
    cgroup, cgroup_procs = (None, None) if mode is not None else _open_call_cgroup()
    answer = mmap.mmap(-1, _HEADER.size + max(int(max_result_bytes), 0) + 1)  # shared, anonymous, zero-filled
    parent = os.getpid()
    gone: Optional[int] = None
    try:
        if mode == _DIRECT:
            with contextlib.suppress(AttributeError, OSError):
                gone = os.pidfd_open(parent)  # readable once this process is gone
            pid = _fork_into_new_pid_namespace()
            if pid == 0:
                _worker(fn, args, answer, gone, "unshare", None)
        else:
            pid = os.fork()
            if pid == 0:
                _keeper(fn, args, answer, setup, parent, mode, cgroup, cgroup_procs)
    except BaseException:
        answer.close()
        if cgroup_procs is not None:
            os.close(cgroup_procs)
            _remove_cgroup(cgroup)
        raise
    finally:
        if gone is not None and os.getpid() == parent:
            os.close(gone)
    if cgroup_procs is not None:
        os.close(cgroup_procs)
    ended: Optional[str] = "timeout"
    try:
        ended = _wait_for_exit(pid, time.monotonic() + limit, watch_fd)
    finally:
        if ended is not None:  # the call may still run: end it and all it started
            if cgroup is not None:
                # frozen, nothing in the cgroup forks again and the keeper stays the subreaper of what the call
                # started: the sweep by ancestry then kills its descendants that moved to another cgroup (a
                # process may write its pid into any cgroup.procs it can write), cgroup.kill the rest
                with contextlib.suppress(OSError):
                    with open(os.path.join(cgroup, "cgroup.freeze"), "w") as fh:
                        fh.write("1")
            if mode == _DIRECT:
                _kill([pid])  # the init of the call's namespace: the kernel kills everything in it
            else:
                _stop_and_sweep(pid)
            if cgroup is not None:
                with contextlib.suppress(OSError):
                    with open(os.path.join(cgroup, "cgroup.kill"), "w") as fh:
                        fh.write("1")
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        wait_status = os.waitpid(pid, 0)[1]
        if cgroup is not None:  # also whatever left the keeper's ancestry
            _remove_cgroup(cgroup)
        if ended is not None:
            answer.close()
    if ended is not None:
        return ChildOutcome(ended)
    try:
        return _read_answer(answer, os.waitstatus_to_exitcode(wait_status), max_result_bytes, mode == _DIRECT)
    finally:
        answer.close()


def _read_answer(answer: mmap.mmap, code: int, max_result_bytes: int, direct: bool) -> ChildOutcome:
    """The outcome the worker wrote, once the caller's child (the worker itself when ``direct``, else its
    keeper) has exited with ``code``."""
    if direct and code < 0:
        code = 128 - code  # as a keeper reports its worker's
    keeper_code = code
    if keeper_code < 0:  # the keeper did not finish its sweep: whatever the worker wrote does not count
        return ChildOutcome("died", f"the call's keeper process was killed (signal {-keeper_code}) before it "
                                    "ended what the call started")
    (size,) = _HEADER.unpack_from(answer, 0)
    if size == _OVERSIZED:
        return ChildOutcome("oversized", max_result_bytes)
    how = f"killed by signal {keeper_code - 128}" if keeper_code > 128 else f"exit code {keeper_code}"
    if size == 0 or size > max_result_bytes:
        return ChildOutcome("died", f"the process ended without an answer ({how})")
    try:
        status, value = pickle.loads(answer[_HEADER.size:_HEADER.size + size])
    except Exception:
        return ChildOutcome("died", f"the process ended without a readable answer ({how})")
    return ChildOutcome(status, value)
