"""The killable child: nothing a call starts outlives it -- detached (``setsid``, ``setpgid``, double forks),
on a normal answer and at the time limit, with a cgroup per call and with the subreaper alone."""

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


@pytest.fixture(params=["cgroup", "subreaper"])
def mode(request, monkeypatch):
    """Both containments: a cgroup per call (where this process can make one) and the subreaper alone."""
    if request.param == "cgroup":
        if killable._call_cgroup_base() is None:
            pytest.skip("no writable cgroup v2 with cgroup.kill here (needs root, Linux >= 5.14)")
    else:
        monkeypatch.setitem(killable._cgroup_bases, os.getpid(), None)
    return request.param


def _double_fork_then_answer() -> int:
    """Fork, ``setsid``, fork again: the grandchild sleeps on, detached; the call answers its pid."""
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write, b"%d" % os.getpid())
            time.sleep(60)
            os._exit(0)
        os._exit(0)
    os.close(write)
    return int(os.read(read, 32))


def _detached_child_then_hang(pid_file: str, how: str, marker: str) -> None:
    """Start a detached process (its own process group or session), record its pid, then run past the limit."""
    code = f"import os, time; os.{how}(*{'(0, 0)' if how == 'setpgid' else '()'}); time.sleep({marker})"
    proc = subprocess.Popen([sys.executable, "-c", code])
    with open(pid_file, "w") as fh:
        fh.write(str(proc.pid))
    time.sleep(60)


def test_a_double_forked_setsid_grandchild_dies_with_a_call_that_answers(mode):
    outcome = killable.call_in_killable_child(_double_fork_then_answer, limit=30)
    assert outcome.status == "ok"
    try:
        assert not _running(outcome.value)  # gone before the answer came back: no settling needed
    finally:
        if _running(outcome.value):
            os.kill(outcome.value, signal.SIGKILL)


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


def _killed_by_its_own_descendant(marker: str) -> None:
    """A detached descendant SIGKILLs the call's process (its subreaper), then sleeps on."""
    subprocess.Popen(["setsid", "/bin/sh", "-c", f"kill -9 {os.getpid()}; exec sleep {marker}"])
    time.sleep(60)


def test_with_a_cgroup_a_call_killed_by_its_own_descendant_takes_it_down(mode):
    if mode != "cgroup":
        pytest.skip("without a cgroup the kernel hands the orphans of a killed child to init (docs/sandbox.md)")
    marker = _marker()
    try:
        assert killable.call_in_killable_child(_killed_by_its_own_descendant, marker, limit=10).status == "died"
        assert _settled(lambda: _with_marker(marker)) == []
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
    if mode != "cgroup":
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


def _nested() -> int:
    return killable.call_in_killable_child(_double_fork_then_answer, limit=30).value


def _own_call_cgroups() -> list[str]:
    """This process's call cgroups (``<pid>-<n>``): the base is shared with every process in the same cgroup
    (the suite's other workers make and remove theirs there meanwhile)."""
    return sorted(n for n in os.listdir(killable._call_cgroup_base()) if n.split("-")[0] == str(os.getpid()))


def test_a_call_inside_a_call_is_contained_and_its_cgroups_are_removed(mode):
    outcome = killable.call_in_killable_child(_nested, limit=30)
    assert outcome.status == "ok" and not _running(outcome.value)
    if mode == "cgroup":  # the call cgroups (the nested one inside the outer one) are gone
        assert _own_call_cgroups() == []


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

MARKER = os.environ["MARKER"]  # read here: the call's child sees only an allow-list of the environment

def detach_and_hang():
    subprocess.Popen(["setsid", "sleep", MARKER])  # (not in this script's command line)
    time.sleep(60)

killable.call_in_killable_child(detach_and_hang, limit=60)
"""


def test_what_a_killed_caller_left_in_its_call_cgroup_is_ended_by_the_next_process_that_makes_calls(mode):
    """The caller itself SIGKILLed mid-call: its child dies with it (``PR_SET_PDEATHSIG``), what the child started
    stays in the call's cgroup, and the next llmgym process to probe there kills it and removes the cgroup."""
    if mode != "cgroup":
        pytest.skip("without a cgroup, what a killed caller's call started is handed to init (docs/sandbox.md)")
    base = killable._call_cgroup_base()
    marker = _marker()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(killable.__file__))))
    caller = subprocess.Popen([sys.executable, "-c", CALLER], env={**os.environ, "ROOT": root, "MARKER": marker})
    try:
        assert _settled(lambda: not _with_marker(marker), 60) is False  # the detached sleep runs
        caller.kill()
        caller.wait()
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
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda _: killable.call_in_killable_child(_double_fork_then_answer, limit=60),
                                 range(12)))
    try:
        assert [o.status for o in outcomes] == ["ok"] * 12
        assert [o.value for o in outcomes if _running(o.value)] == []
        if mode == "cgroup":
            assert killable._call_cgroup_base() is not None
    finally:
        for o in outcomes:
            if o.status == "ok" and _running(o.value):
                os.kill(o.value, signal.SIGKILL)
