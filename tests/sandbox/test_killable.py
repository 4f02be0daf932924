"""The killable child: nothing a call starts outlives it -- detached (``setsid``, ``setpgid``, double forks,
``clone(CLONE_PARENT)``), on a normal answer and at the time limit, in a PID namespace per call, with a cgroup
per call and with the keeper's subreaper alone; and the answer is read when the call's processes are gone,
from where they cannot hold or forge it.

Processes are found by a marker in their command line (a unique sleep duration), never by a pid the call
reports: inside the call's PID namespace, pids are the namespace's."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from llmgym.sandbox import killable


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is dead: it only waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _with_marker(marker: str) -> list[int]:
    """Live processes whose command line holds ``marker`` (this test's own sleeps, not another run's)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read() and _running(int(name)):
                        found.append(int(name))
            except OSError:
                continue
    return found


def _settled(check, seconds: float = 5.0):
    """``check()`` once it is falsy, or its last value after ``seconds`` (a loaded machine reaps late)."""
    give_up = time.monotonic() + seconds
    while (value := check()) and time.monotonic() < give_up:
        time.sleep(0.05)
    return value


def _marker() -> str:
    return f"{400 + random.random():.9f}"  # a unique sleep duration


NAMESPACES = ("namespace", "user namespace")
USER_NAMESPACE = killable._CLONE_NEWUSER | killable._CLONE_NEWPID | killable._CLONE_NEWNS


@pytest.fixture(params=["namespace", "user namespace", "cgroup", "subreaper"])
def mode(request, monkeypatch):
    """Each containment: a PID namespace per call (as root, forked straight into it), a user + PID namespace
    made by the keeper (the way without root), a cgroup per call (where this process can make one; no
    namespace) and the keeper's subreaper alone."""
    if request.param == "namespace":
        if killable._call_namespace() is None:
            pytest.skip("no PID namespace here (unshare refused: neither root nor user namespaces)")
        return "namespace"
    if request.param == "user namespace":
        monkeypatch.setitem(killable._namespace_modes, os.getpid(), USER_NAMESPACE)
        if killable.call_in_killable_child(os.getpid, limit=60) != ("ok", 1):
            pytest.skip("no user namespaces here")
        return request.param
    monkeypatch.setitem(killable._namespace_modes, os.getpid(), None)
    if request.param == "cgroup":
        if killable._call_cgroup_base() is None:
            pytest.skip("no writable cgroup v2 with cgroup.kill here (needs root, Linux >= 5.14)")
    else:
        monkeypatch.setitem(killable._cgroup_bases, os.getpid(), None)
    return request.param


def _double_fork_then_answer(marker: str) -> bool:
    """Fork, ``setsid``, fork again: the grandchild sleeps on, detached; the call answers once it runs."""
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.close(read)
            os.dup2(write, 1)  # says it runs on its standard output
            os.execv("/bin/sh", ["sh", "-c", f"echo; exec sleep {marker}"])
        os._exit(0)
    os.close(write)
    return os.read(read, 1) == b"\n"


def _detached_child_then_hang(pid_file: str, how: str, marker: str) -> None:
    """Start a detached process (its own process group or session), record its pid, then run past the limit."""
    code = f"import os, time; os.{how}(*{'(0, 0)' if how == 'setpgid' else '()'}); time.sleep({marker})"
    proc = subprocess.Popen([sys.executable, "-c", code])
    with open(pid_file, "w") as fh:
        fh.write(str(proc.pid))
    time.sleep(60)


def test_a_double_forked_setsid_grandchild_dies_with_a_call_that_answers(mode):
    marker = _marker()
    try:
        assert killable.call_in_killable_child(_double_fork_then_answer, marker, limit=30) == ("ok", True)
        assert _with_marker(marker) == []  # gone before the answer came back: no settling needed
    finally:
        for pid in _with_marker(marker):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["setpgid", "setsid"])
def test_a_detached_child_dies_at_the_time_limit(mode, how, tmp_path):
    marker = _marker()
    pid_file = tmp_path / "pid"
    try:
        outcome = killable.call_in_killable_child(_detached_child_then_hang, str(pid_file), how, marker, limit=1.0)
        assert outcome.status == "timeout"
        assert pid_file.read_text() and _settled(lambda: _with_marker(marker)) == []
    finally:
        for pid in _with_marker(marker):
            os.kill(pid, signal.SIGKILL)


def _spawns_detached_sleepers(marker: str) -> None:
    """A shell that keeps starting ``setsid sleep``: the kill races new processes."""
    subprocess.Popen(["/bin/sh", "-c", f"while :; do setsid sleep {marker} & sleep 0.01; done"])
    time.sleep(60)


def test_processes_started_while_the_kill_runs_die_too(mode):
    marker = _marker()
    try:
        assert killable.call_in_killable_child(_spawns_detached_sleepers, marker, limit=0.5).status == "timeout"
        assert _settled(lambda: _with_marker(marker)) == []
    finally:
        for pid in _with_marker(marker):
            os.kill(pid, signal.SIGKILL)


def _killed_by_its_own_descendant(marker: str) -> str:
    """A detached descendant SIGKILLs the call's process, then sleeps on. (Inside a PID namespace the call's
    process is its init, which a SIGKILL from inside does not reach: the call then answers.)"""
    read, write = os.pipe()
    subprocess.Popen(["setsid", "/bin/sh", "-c", f"kill -9 {os.getpid()}; echo; exec sleep {marker}"], stdout=write)
    os.close(write)
    os.read(read, 1)
    return "survived"


def test_a_call_killed_by_its_own_descendant_takes_it_down(mode):
    """Its orphan goes to the keeper (a subreaper that runs none of the call's code), which ends it."""
    marker = _marker()
    try:
        outcome = killable.call_in_killable_child(_killed_by_its_own_descendant, marker, limit=30)
        assert outcome == ("ok", "survived") if mode in NAMESPACES else outcome.status == "died"
        assert _with_marker(marker) == []
    finally:
        for pid in _with_marker(marker):
            os.kill(pid, signal.SIGKILL)


def _leaves_its_cgroup_then_hang(procs: str, marker: str) -> None:
    """A detached descendant moves itself out of the call's cgroup (into the caller's: a process may write its
    pid into any ``cgroup.procs`` it can write), then sleeps on; the call runs past its limit."""
    subprocess.Popen(["setsid", "/bin/sh", "-c", f"echo $$ > {procs} && exec sleep {marker}"])
    time.sleep(60)


def test_with_a_cgroup_a_descendant_that_left_the_call_s_cgroup_dies_at_the_time_limit(mode):
    """cgroup.kill alone missed it, and the child it ran under then died: it was handed to init and slept on."""
    if mode == "subreaper" or killable._own_v2_cgroup() is None:
        pytest.skip("the subreaper alone: the detached-child tests above")
    marker = _marker()
    procs = os.path.join(killable._own_v2_cgroup(), "cgroup.procs")
    try:
        outcome = killable.call_in_killable_child(_leaves_its_cgroup_then_hang, procs, marker, limit=2.0)
        assert outcome.status == "timeout"
        assert _settled(lambda: _with_marker(marker)) == []
    finally:
        for pid in _with_marker(marker):
            os.kill(pid, signal.SIGKILL)


def _nested(marker: str) -> tuple:
    return killable.call_in_killable_child(_double_fork_then_answer, marker, limit=30)


def _own_call_cgroups() -> list[str]:
    """This process's call cgroups (``<pid>-<n>``): the base is shared with every process in the same cgroup
    (the suite's other workers make and remove theirs there meanwhile)."""
    return sorted(n for n in os.listdir(killable._call_cgroup_base()) if n.split("-")[0] == str(os.getpid()))


def test_a_call_inside_a_call_is_contained_and_its_cgroups_are_removed(mode):
    marker = _marker()
    try:
        assert killable.call_in_killable_child(_nested, marker, limit=30) == ("ok", ("ok", True))
        assert _with_marker(marker) == []
        if mode == "cgroup":  # the call cgroups (the nested one inside the outer one) are gone
            assert _own_call_cgroups() == []
    finally:
        for pid in _with_marker(marker):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("then", ["answers", "hangs"])
def test_a_time_limited_verifier_whose_check_starts_setsid_sleep_leaves_nothing_running(then):
    from llmgym import Task, as_verifier

    marker = _marker()

    def check(task, completion):
        subprocess.Popen(["setsid", "sleep", marker])
        _settled(lambda: not _with_marker(marker))  # it runs before the check goes on (or 5 s pass)
        if then == "hangs":
            time.sleep(60)
        return 1.0

    try:
        score = as_verifier(check, time_limit=1.0)(Task("x"), "y")
        assert score.reward == (1.0 if then == "answers" else 0.0)
        assert _settled(lambda: _with_marker(marker)) == []
    finally:
        for pid in _with_marker(marker):
            os.kill(pid, signal.SIGKILL)


CALLER = """
import os, subprocess, sys, time
sys.path.insert(0, os.environ["ROOT"])
from llmgym.sandbox import killable

if os.environ["MODE"] == "user namespace":
    killable._namespace_modes[os.getpid()] = killable._CLONE_NEWUSER | killable._CLONE_NEWPID | killable._CLONE_NEWNS
elif os.environ["MODE"] != "namespace":
    killable._namespace_modes[os.getpid()] = None

MARKER = os.environ["MARKER"]  # read here: the call's child sees only an allow-list of the environment

def detach_and_hang():
    subprocess.Popen(["setsid", "sleep", MARKER])  # (not in this script's command line)
    time.sleep(60)

killable.call_in_killable_child(detach_and_hang, limit=60)
"""


def test_what_a_killed_caller_left_in_its_call_cgroup_is_ended_by_the_next_process_that_makes_calls(mode):
    """The caller itself SIGKILLed mid-call: its keeper and the call's process die with it (``PR_SET_PDEATHSIG``);
    in a PID namespace everything the call started goes with them; with a cgroup what it started stays in the
    call's cgroup, and the next llmgym process to probe there kills it and removes the cgroup."""
    if mode == "subreaper":
        pytest.skip("without a cgroup, what a killed caller's call started is handed to init (docs/sandbox.md)")
    marker = _marker()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(killable.__file__))))
    caller = subprocess.Popen([sys.executable, "-c", CALLER],
                              env={**os.environ, "ROOT": root, "MARKER": marker, "MODE": mode})
    try:
        assert _settled(lambda: not _with_marker(marker), 60) is False  # the detached sleep runs
        caller.kill()
        caller.wait()
        if mode in NAMESPACES:
            assert _settled(lambda: _with_marker(marker)) == []
            return
        base = killable._call_cgroup_base()
        left = [name for name in os.listdir(base) if name.startswith(f"{caller.pid}-")]
        assert left and _with_marker(marker)  # it outlived its caller, in the caller's call cgroup
        killable._cgroup_bases.pop(os.getpid())  # as a new process would: probe (and sweep) again
        assert killable._call_cgroup_base() == base
        assert _settled(lambda: _with_marker(marker)) == []
        assert not [name for name in os.listdir(base) if name.startswith(f"{caller.pid}-")]
    finally:
        if caller.poll() is None:
            caller.kill()
        for pid in _with_marker(marker):
            os.kill(pid, signal.SIGKILL)


def test_calls_from_several_threads_at_once_each_end_what_they_started(mode, monkeypatch):
    """Threads of one caller (a pipelined learner's verify workers) make calls at once: the first ones probe
    for call cgroups together, and every call's detached grandchild is gone when it answers."""
    from concurrent.futures import ThreadPoolExecutor

    if mode == "cgroup":
        monkeypatch.delitem(killable._cgroup_bases, os.getpid())  # probed anew, by the threads at once
    if mode == "namespace":
        monkeypatch.delitem(killable._namespace_modes, os.getpid())
    marker = _marker()
    try:
        with ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(lambda _: killable.call_in_killable_child(_double_fork_then_answer, marker,
                                                                               limit=60), range(12)))
        assert outcomes == [("ok", True)] * 12
        assert _with_marker(marker) == []
        if mode == "cgroup":
            assert killable._call_cgroup_base() is not None
        if mode in NAMESPACES:
            assert killable._call_namespace() is not None
    finally:
        for pid in _with_marker(marker):
            os.kill(pid, signal.SIGKILL)


# -- clone(CLONE_PARENT): a process made the caller's child, not the call's ------------------------------------

CLONE_PARENT = r'''
import ctypes, fcntl, os, platform

def clone_parent_then_sleep(marker, keep_fds=False, cgroup_procs=None, how="clone"):
    """clone(CLONE_PARENT | SIGCHLD) from this process (``how``: the ``clone`` or the ``clone3`` system call):
    the new process is a child of this one's parent, in a session of its own. It may keep every descriptor
    (close-on-exec cleared: it then holds whatever answer pipe there is) and move itself into
    ``cgroup_procs``, then becomes ``sleep <marker>``. 'made', or 'refused' by the kernel."""
    libc = ctypes.CDLL(None, use_errno=True)
    if how == "clone3":  # struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal (none with
        args = (ctypes.c_uint64 * 11)(0x00008000)  # CLONE_PARENT: the parent's own is used), stack, ...
        pid = libc.syscall(435, ctypes.byref(args), ctypes.sizeof(args))
    else:
        pid = libc.syscall({"x86_64": 56, "aarch64": 220}[platform.machine()], 0x00008000 | 17, 0, 0, 0, 0)
    if pid == 0:
        try:
            os.setsid()
            if keep_fds:
                for fd in range(3, 256):
                    try:
                        fcntl.fcntl(fd, fcntl.F_SETFD, 0)
                    except OSError:
                        pass
            if cgroup_procs:
                with open(cgroup_procs, "w") as fh:
                    fh.write(str(os.getpid()))
            os.execv("/bin/sleep", ["sleep", marker])
        finally:
            os._exit(1)
    return "made" if pid > 0 else "refused"
'''
_clone_globals: dict = {}
exec(CLONE_PARENT, _clone_globals)
clone_parent_then_sleep = _clone_globals["clone_parent_then_sleep"]


def _caller_cgroup_procs() -> str | None:
    """The caller's own cgroup v2 ``cgroup.procs`` (the attacker's way out of the call's cgroup), if any."""
    own = killable._own_v2_cgroup()
    return os.path.join(own, "cgroup.procs") if own and os.geteuid() == 0 else None


@pytest.mark.parametrize("how", ["clone", "clone3"])
@pytest.mark.parametrize("then", ["answers", "hangs"])
def test_a_clone_parent_process_of_the_call_dies_with_it(mode, then, how):
    """clone(CLONE_PARENT) from the call's own process, holding every descriptor, moved into the caller's
    cgroup: it used to be the caller's child (outside the ancestry sweep and cgroup.kill) and to hold the
    answer pipe open, turning an answer into a timeout."""
    marker = _marker()

    def call():
        made = clone_parent_then_sleep(marker, keep_fds=True, cgroup_procs=_caller_cgroup_procs(), how=how)
        if then == "hangs":
            time.sleep(60)
        return made

    try:
        outcome = killable.call_in_killable_child(call, limit=30 if then == "answers" else 1.0)
        assert outcome.status == ("ok" if then == "answers" else "timeout")
        if then == "answers":  # the init of a PID namespace may not clone(CLONE_PARENT); the others may
            assert outcome.value == ("refused" if mode in NAMESPACES else "made")
        assert _settled(lambda: _with_marker(marker)) == []
    finally:
        for pid in _with_marker(marker):
            os.kill(pid, signal.SIGKILL)


def test_a_verifier_whose_check_runs_the_completion_leaves_nothing_running():
    """The attack as a completion: a public ``Verifier(time_limit=3)`` whose check executes the text."""
    from llmgym import Task, as_verifier

    marker = _marker()
    completion = CLONE_PARENT + f"\nclone_parent_then_sleep({marker!r}, cgroup_procs={_caller_cgroup_procs()!r})\n"

    def check(task, completion):
        exec(completion, {})
        return 1.0

    try:
        as_verifier(check, time_limit=3)(Task("x"), completion)
        assert _settled(lambda: _with_marker(marker)) == []
    finally:
        for pid in _with_marker(marker):
            os.kill(pid, signal.SIGKILL)


# -- the answer: read after the exit, from where the call's processes cannot reach it -------------------------

def _forks_a_forger(callers_fds: frozenset = frozenset()) -> str:
    """A process the call forks writes a forged answer into every pipe it can write and every shared
    writable mapping it has, then the call answers honestly. ``callers_fds``: descriptors the caller had
    open before the call (under pytest-xdist one is the worker's channel to the controller: a forged
    answer written there ends the worker, not the test); every pipe the call machinery makes is tried."""
    import ctypes
    import fcntl
    import pickle
    import struct

    forged = pickle.dumps(("ok", "forged"))
    child = os.fork()
    if child == 0:
        try:
            for name in os.listdir("/proc/self/fd"):
                fd = int(name)
                try:
                    if fd > 2 and fd not in callers_fds and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:") and \
                            fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
                        os.write(fd, forged)
                except OSError:
                    pass
            with open("/proc/self/maps") as fh:
                shared = [line.split()[0] for line in fh if line.split()[1].startswith("rw") and line.split()[1][3] == "s"]
            for span in shared:
                start, end = (int(x, 16) for x in span.split("-"))
                if end - start >= 8 + len(forged):
                    ctypes.memmove(start + 8, forged, len(forged))
                    ctypes.memmove(start, struct.pack("<Q", len(forged)), 8)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    return "honest"


def test_a_process_the_call_forks_cannot_forge_its_answer(mode):
    callers_fds = frozenset(int(name) for name in os.listdir("/proc/self/fd"))
    assert killable.call_in_killable_child(_forks_a_forger, callers_fds, limit=30) == ("ok", "honest")


def _kills_its_keeper(marker: str) -> str:
    """Start a detached sleep, then SIGKILL the process above the call (its keeper) and answer."""
    subprocess.Popen(["setsid", "sleep", marker])
    _settled(lambda: not _with_marker(marker))
    if os.getppid():  # (in a PID namespace the keeper is outside: it has no pid here)
        os.kill(os.getppid(), signal.SIGKILL)
    return "answered"


def test_an_answer_given_after_killing_the_keeper_is_refused(mode):
    marker = _marker()
    try:
        outcome = killable.call_in_killable_child(_kills_its_keeper, marker, limit=30)
        assert outcome == ("ok", "answered") if mode in NAMESPACES else outcome.status == "died"
        if mode != "subreaper":  # alone, the subreaper's orphans go to init (docs/sandbox.md)
            assert _settled(lambda: _with_marker(marker)) == []
    finally:
        for pid in _with_marker(marker):
            os.kill(pid, signal.SIGKILL)


def _reach_the_caller(caller: int) -> dict:
    """A call that, as root, tries to get out of its namespace: unmount its /proc (the host's is below), then open
    the caller's memory for writing (code that would outlive the call) and read its maps."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    found = {"umount": libc.umount2(b"/proc", 2) == 0}
    for name, flags in (("mem", os.O_RDWR), ("maps", os.O_RDONLY)):
        try:
            os.close(os.open(f"/proc/{caller}/{name}", flags))
            found[name] = True
        except OSError:
            found[name] = False
    return found


@pytest.mark.skipif(os.geteuid() != 0 or killable._call_namespace() != killable._DIRECT,
                    reason="the root path: the call forked straight into a PID namespace")
def test_a_root_call_cannot_unmount_its_proc_or_open_the_callers_memory():
    """Found by the second attacker's pass: as root, a call could unmount its namespace's /proc, see the host's
    below it, and open the caller's /proc/<pid>/mem read-write (write code into the trainer: it outlives the call).
    Rule: a call's process running as root gives up CAP_SYS_ADMIN and CAP_SYS_PTRACE before the call runs."""
    outcome = killable.call_in_killable_child(_reach_the_caller, os.getpid(), limit=30)
    assert outcome.status == "ok" and outcome.value == {"umount": False, "mem": False, "maps": False}, outcome
