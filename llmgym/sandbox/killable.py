"""The killable child: run one call in a forked process; nothing the call starts outlives it.

A time limit is enforced by something that can stop the work -- a killed process, never a thread. This
module is the one implementation of that rule for code that runs on the host: a ``Verifier(time_limit=...)``,
a multi-turn env's ``respond_time_limit``, the tools' helper (``llmgym/tools/tool_helper.py`` loads this file
by path: it imports nothing of ``llmgym``), and the interop adapters, which ask :func:`in_killable_child`
before starting a sandboxed worker. (Inside the sandbox, the zygote of :mod:`llmgym.sandbox.worker` forks
its calls in its own namespace and cgroup.)

How: ``os.fork`` (no re-import of the user's ``__main__``, the callable need not pickle, and a daemonic
parent such as an ``AsyncVectorEnv`` worker may fork where ``multiprocessing`` would refuse it a child). The
child asks to die with its parent, runs the call, writes the pickled outcome on a private pipe and leaves
with ``os._exit`` (no ``atexit`` handlers or flushing of the parent's copied state). The parent reads at most
``max_result_bytes`` until the deadline.

Everything the call starts dies with it, whether it answers or runs out of time -- a process group is not
enough (``setsid``, ``setpgid(0, 0)`` and a double fork leave it), so containment is by ancestry and cgroup:

* the child is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): whatever it starts, however it detaches,
  stays its descendant; before it answers it kills and reaps all of them;
* where this process may make a cgroup v2 with ``cgroup.kill`` (root, Linux >= 5.14), each call gets one
  (``<own cgroup>/llmgym-killable/<pid>-<n>``), joined before the call's code runs, and is ended with one
  write to ``cgroup.kill`` -- also what a crashed child or a child killed by its own descendant left;
* at the deadline the parent freezes the call's cgroup (the child stays the subreaper of what it started), kills
  every descendant it finds in ``/proc`` (those that moved to another cgroup too), then writes ``cgroup.kill``;
  without a cgroup it stops the child (``SIGSTOP``: it can
  fork no more, and stays the subreaper), kills every descendant it finds in ``/proc``, then the child.

Without a cgroup two things escape: the descendants of a child that died on its own before answering
(``os._exit``, a crash, ``SIGKILL`` from one of its own processes), which the kernel hands to ``init``.
Standard library only.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import select
import signal
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


class ChildOutcome(NamedTuple):
    """How a killable call ended.

    ``status`` is ``"ok"`` (``value`` is the call's result), ``"raised"`` (``value`` is the exception, or
    its ``"Type: message"`` text where it does not pickle), ``"timeout"`` (killed at the limit),
    ``"died"`` (ended without a readable answer: ``value`` says how), ``"oversized"`` (its answer
    passed ``max_result_bytes``: killed, not read) or ``"watch_closed"`` (``watch_fd`` became readable first: the caller's caller went away).
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


def _child_setup() -> Callable[[], Any]:
    """A function that makes the calling process die with its parent (``PR_SET_PDEATHSIG``) and a child
    subreaper (``PR_SET_CHILD_SUBREAPER``: orphans of its descendants come back to it, not to ``init``).
    Linux ``prctl``; a no-op elsewhere, where the time limit still holds. Built once: loading libc in every
    child costs milliseconds."""
    global _die_with_parent
    if _die_with_parent is None:
        try:
            import ctypes

            prctl = ctypes.CDLL(None, use_errno=True).prctl

            def setup() -> None:
                prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
                prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
            _die_with_parent = setup
        except Exception:
            _die_with_parent = lambda: None  # noqa: E731
    return _die_with_parent



# -- finding and killing a call's processes ---------------------------------------------------------------


def _descendants(root: int) -> list[tuple[int, bytes]]:
    """``(pid, state)`` of every descendant of ``root`` now, from ``/proc/*/stat`` (parent pids)."""
    children: dict[int, list[tuple[int, bytes]]] = {}
    try:
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
    """In the child (a subreaper): kill and reap everything the call started, until it has no child left."""
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
    """From the parent, without a cgroup: stop the child (it forks no more and stays the subreaper its
    descendants' orphans go to), kill every live descendant until none is left, then the child."""
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


def _child(fn: Callable[..., Any], args: tuple, pipe_w: int, setup: Callable[[], Any],
           cgroup: Optional[str], cgroup_procs: Optional[int]) -> None:
    """In the forked child: join the call's cgroup, run, end what the call started, write the pickled
    ``(status, value)``, exit without cleanup."""
    global _probe_lock
    try:
        _probe_lock = threading.Lock()  # another thread of the parent may have held it at the fork
        os.setpgid(0, 0)  # its own process group (a terminal's Ctrl-C reaches the caller, not the call)
        setup()
        if cgroup_procs is not None:
            try:
                os.write(cgroup_procs, b"0")
                _cgroup_bases[os.getpid()] = os.path.join(cgroup, _CGROUP_DIR)  # its own calls' cgroups go inside
            except OSError:
                pass  # the parent sees a failed join and sweeps by hand
            os.close(cgroup_procs)
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
        _end_own_descendants()  # nothing the call started outlives its answer
        view = memoryview(data)
        while view:
            view = view[os.write(pipe_w, view):]
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


def call_in_killable_child(fn: Callable[..., Any], *args: Any, limit: float,
                           max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
                           watch_fd: Optional[int] = None) -> ChildOutcome:
    """``fn(*args)`` in a forked child, killed with everything it started after ``limit`` seconds; when it
    answers in time, what it started is killed before it answers.

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
    cgroup, cgroup_procs = _open_call_cgroup()
    try:
        pipe_r, pipe_w = os.pipe()
        pid = os.fork()
    except BaseException:
        if cgroup_procs is not None:
            os.close(cgroup_procs)
            _remove_cgroup(cgroup)
        raise
    if pid == 0:
        os.close(pipe_r)
        _child(fn, args, pipe_w, setup, cgroup, cgroup_procs)
    os.close(pipe_w)
    if cgroup_procs is not None:
        os.close(cgroup_procs)
    chunks: list[bytes] = []
    size = 0
    deadline = time.monotonic() + limit
    outcome: Optional[ChildOutcome] = None
    watched = [pipe_r] if watch_fd is None else [pipe_r, watch_fd]
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                outcome = ChildOutcome("timeout")
                break
            ready, _, _ = select.select(watched, [], [], left)
            if watch_fd is not None and watch_fd in ready:
                outcome = ChildOutcome("watch_closed")
                break
            if pipe_r in ready:
                chunk = os.read(pipe_r, 1 << 16)
                if not chunk:
                    break
                size += len(chunk)
                if size > max_result_bytes:
                    outcome = ChildOutcome("oversized", max_result_bytes)
                    break
                chunks.append(chunk)
    finally:
        os.close(pipe_r)
        if outcome is not None:  # the child may still run: end it and all it started
            if cgroup is not None:
                # frozen, nothing in the cgroup forks again and the child stays the subreaper of what it started:
                # the sweep by ancestry then kills its descendants that moved to another cgroup (a process may
                # write its pid into any cgroup.procs it can write), cgroup.kill the rest
                with contextlib.suppress(OSError):
                    with open(os.path.join(cgroup, "cgroup.freeze"), "w") as fh:
                        fh.write("1")
                _stop_and_sweep(pid)
                with contextlib.suppress(OSError):
                    with open(os.path.join(cgroup, "cgroup.kill"), "w") as fh:
                        fh.write("1")
            else:
                _stop_and_sweep(pid)
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _, wait_status = os.waitpid(pid, 0)
        if cgroup is not None:  # also whatever left the child's ancestry (it crashed, or was killed)
            _remove_cgroup(cgroup)
    if outcome is not None:
        return outcome
    try:
        status, value = pickle.loads(b"".join(chunks))
    except Exception:
        code = os.waitstatus_to_exitcode(wait_status)
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return ChildOutcome("died", f"the process ended without an answer ({how})")
    return ChildOutcome(status, value)
