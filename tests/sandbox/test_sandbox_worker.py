"""The persistent sandboxed worker (llmgym.sandbox.worker) against hostile calls.

Each call runs in a fresh child of the worker's zygote: whatever a call does -- loop, sleep, start
daemons, write files, signal its parent, exhaust memory or processes, flood its answer, lie in it --
ends with the call, leaves nothing on the host or for the next call, and the worker answers the next
call normally. A worker that cannot start, or cannot read its packages, raises naming the cause.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import pytest
from conftest import sandbox_missing_reason

from llmgym.sandbox import SandboxError, check_sandbox, pids_of_uids
from llmgym.sandbox.worker import SandboxWorker, interpreter_for, site_packages
from host_traces import cmdline_pids  # noqa: E402  (tests/ is on sys.path)


INFO = check_sandbox()
pytestmark = pytest.mark.skipif(
    bool(set(INFO["missing"]) - {"cgroup"}),
    reason=sandbox_missing_reason(INFO),
)

# handle() runs the request as code: the worst a scorer that evals its input could do
EXEC_SOURCE = textwrap.dedent("""
    import os, sys, time
    SEEN = []
    def handle(state, request):
        SEEN.append(request)
        scope = {"state": state, "SEEN": SEEN, "os": os, "sys": sys, "time": time}
        exec(request, scope)
        return scope.get("result", "done")
""")


@pytest.fixture(scope="module")
def worker():
    with SandboxWorker(EXEC_SOURCE) as w:
        yield w


def token() -> str:
    return uuid.uuid4().hex[:12]


def test_calls_answer_plain_data_and_state_does_not_carry_over(worker):
    assert worker.call(41, "result = state + 1", time_limit=10) == ("ok", 42)
    assert worker.call(None, "result = [1, 'two', {'three': 3.0}, None]", time_limit=10) == (
        "ok", [1, "two", {"three": 3.0}, None])
    # each call is a fresh fork of the zygote: what one call changed is gone for the next
    assert worker.call(None, "SEEN.append('leak'); import builtins; builtins.LEAK = 1", time_limit=10)[0] == "ok"
    assert worker.call(None, "import builtins; result = [len(SEEN), hasattr(builtins, 'LEAK')]", time_limit=10) == (
        "ok", [1, False])
    status, error = worker.call(None, "raise ValueError('bad answer')", time_limit=10)
    assert (status, error) == ("error", "ValueError: bad answer")


def test_a_call_runs_as_an_unprivileged_uid_that_can_write_nowhere(worker):
    status, (uid, gid, cwd, writable) = worker.call(None, textwrap.dedent("""
        import os
        writable = []
        for d in ("/tmp", "/dev/shm", "/", os.path.dirname(os.__file__)):
            try:
                open(os.path.join(d, "x"), "w").close()
                writable.append(d)
            except OSError:
                pass
        result = [os.getuid(), os.getgid(), os.getcwd(), writable]
    """), time_limit=10)
    assert status == "ok" and uid == gid and 60000 <= uid < 70000 and cwd == "/" and writable == []
    status, seen = worker.call(None, "import os; result = [os.path.exists(p) for p in ('/root', '/home', '/work')]",
                               time_limit=10)
    assert (status, seen) == ("ok", [False, False, False])
    status, error = worker.call(None, "import socket; socket.create_connection(('1.1.1.1', 80), timeout=1)",
                                time_limit=10)
    assert status == "error" and ("PermissionError" in error or "OSError" in error), error


@pytest.mark.parametrize("code", [
    "while True: pass",
    "time.sleep(60)",
    "import os; os.closerange(3, 1024); time.sleep(60)",  # closes its answer pipe, runs on
])
def test_a_call_past_its_limit_is_killed(worker, code):
    start = time.monotonic()
    assert worker.call(None, code, time_limit=1.0) == ("timeout", None)
    assert time.monotonic() - start < 30  # a hang guard: killed at ~1 s, not waited for
    assert worker.call(2, "result = state * 2", time_limit=10) == ("ok", 4)  # the worker goes on


def test_nothing_a_call_starts_outlives_it(worker):
    marker = f"{time.time() % 1000 + 3000:.6f}"
    status, _ = worker.call(None, textwrap.dedent(f"""
        import os, subprocess
        subprocess.Popen(["sleep", "{marker}"], start_new_session=True)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "{marker}"])
            os._exit(0)
        time.sleep(0.2)
    """), time_limit=10)
    assert status == "ok"
    assert cmdline_pids(marker) == []
    assert pids_of_uids([worker._uid]) == []  # nothing of the call's uid runs on the host


# Processes a call plants to outlive it. Each one, were it to survive, attacks what its uid can reach:
# the next calls' children (another call of the same worker runs as the same uid).
_ATTACK = """
def attack(sig):
    spare = {int(n) for n in os.listdir('/proc') if n.isdigit()}  # its own call: let it end in peace
    while True:
        for n in os.listdir('/proc'):
            if n.isdigit() and int(n) not in spare:
                try:
                    os.kill(int(n), sig)
                except OSError:
                    pass
        time.sleep(0.002)
"""
PLANTS = {
    # the leader exits (SYS_exit, not exit_group) with a second thread running: /proc shows it as a zombie
    "zombie-leader-killing": _ATTACK + """
import ctypes, signal, threading
if os.fork() == 0:
    os.closerange(3, 1024)
    threading.Thread(target=attack, args=(signal.SIGKILL,), daemon=True).start()
    time.sleep(0.05)
    ctypes.CDLL(None).syscall(60, 0)
""",
    "zombie-leader-stopping": _ATTACK + """
import ctypes, signal, threading
if os.fork() == 0:
    os.closerange(3, 1024)
    threading.Thread(target=attack, args=(signal.SIGSTOP,), daemon=True).start()
    time.sleep(0.05)
    ctypes.CDLL(None).syscall(60, 0)
""",
    "stopped": """
import signal
if os.fork() == 0:
    os.closerange(3, 1024)
    os.kill(os.getpid(), signal.SIGSTOP)
""",
    "setsid-double-fork": _ATTACK + """
import signal
if os.fork() == 0:
    os.closerange(3, 1024)
    os.setsid()
    if os.fork() == 0:
        time.sleep(0.3)  # past the call's end
        attack(signal.SIGKILL)
    os._exit(0)
""",
}


@pytest.fixture(params=["cgroup-kill", "namespace-sweep"])
def fresh_worker(request, monkeypatch):
    """A worker per test: its calls ended by their cgroup's ``cgroup.kill``, or (where there is none) by
    the zygote's sweep of its pid namespace."""
    import llmgym.sandbox.worker as worker_module
    from llmgym.sandbox import Sandbox
    from llmgym.sandbox.worker import WORKER_LIMITS

    monkeypatch.setattr(worker_module, "START_TIMEOUT", 20.0)  # a stopped child fails fast, not in 180 s
    sandbox = Sandbox(WORKER_LIMITS, python=interpreter_for([]))
    if request.param == "cgroup-kill":
        if sandbox._call_cgroup is None:
            pytest.skip(f"no cgroup v2 with cgroup.kill here: {INFO['why'].get('cgroup_kill')}")
    else:
        sandbox._call_cgroup = None
    with SandboxWorker(EXEC_SOURCE, sandbox=sandbox) as w:
        yield w


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_process_planted_by_one_call_dies_with_it(fresh_worker, plant):
    status, _ = fresh_worker.call(None, PLANTS[plant] + "\ntime.sleep(0.2)\n", time_limit=5)
    assert status in ("ok", "timeout", "error")  # the planting call's own verdict is its business
    uid = fresh_worker._uid
    assert pids_of_uids([uid]) == []  # nothing of the worker's uid runs on the host, zombie leaders included
    for _ in range(4):  # the next honest calls score normally
        assert fresh_worker.call(2, "time.sleep(0.4); result = state * 2", time_limit=10) == ("ok", 4)
    # inside, the namespace holds the zygote and the call's own process, nothing else
    status, pids = fresh_worker.call(None, "result = sorted(int(n) for n in os.listdir('/proc') if n.isdigit())",
                                     time_limit=10)
    assert status == "ok" and len(pids) == 2 and pids[0] == 1, pids
    assert pids_of_uids([uid]) == []


def test_a_zombie_leader_with_a_live_thread_counts_as_alive():
    """The host-side scan the tests (and the uid pool's leftover sweep) rely on sees such a process."""
    code = "import ctypes, threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()\n" \
           "time.sleep(0.1)\nctypes.CDLL(None).syscall(60, 0)\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(1.0)
        assert proc.poll() is None and proc.pid in pids_of_uids([os.getuid()])
    finally:
        proc.kill()
        proc.wait()
    assert proc.pid not in pids_of_uids([os.getuid()])


@pytest.mark.parametrize("code, expected", [
    ("import os; os.kill(1, 9)", "PermissionError"),  # the zygote is another uid
    ("import os; os.kill(os.getppid(), 9)", "PermissionError"),
    ("import os; os.kill(-1, 9)", "PermissionError"),
    ("x = bytearray(8 << 30)", "MemoryError"),
    ("import os\nwhile True: os.fork()", None),
    ("import ctypes; ctypes.string_at(0)", "SIGSEGV"),
    ("import os; os._exit(0)", "without an answer"),
    ("raise SystemExit(3)", "SystemExit"),
])
def test_a_hostile_call_fails_alone(worker, code, expected):
    status, error = worker.call(None, code, time_limit=5)
    assert status in ("error", "timeout"), (status, error)
    if expected:
        assert expected in error, error
    assert pids_of_uids([worker._uid]) == []
    assert worker.call(1, "result = state", time_limit=10) == ("ok", 1)


def test_an_answer_is_bounded_and_never_unpickled(worker):
    status, error = worker.call(None, "result = 'x' * (1 << 20)", time_limit=10)
    assert status == "error" and "exceeded" in error
    # a child that writes its own bytes on its answer pipe gets them decoded as JSON, nothing more
    lie = textwrap.dedent("""
        import os, pickle
        payload = pickle.dumps(os.system)  # would run os.system if the host unpickled it
        for fd in range(3, 64):
            try:
                os.write(fd, payload)
            except OSError:
                pass
        os._exit(0)
    """)
    status, error = worker.call(None, lie, time_limit=10)
    assert (status, error) == ("error", "malformed answer from the sandbox (UnicodeDecodeError)") or (
        status == "error" and "malformed" in error), error


def test_a_call_may_import_what_the_zygote_did_not():
    # directories on the way to a bound path must be readable by the call's uid (bwrap makes them 0700)
    paths = site_packages("sympy")
    with SandboxWorker("def handle(state, request):\n    import sympy.tensor.tensor\n    return 'ok'\n",
                       paths=paths) as w:
        assert w.call(None, None, time_limit=60) == ("ok", "ok")


def test_a_module_dir_under_tmp_is_importable_in_the_sandbox():
    # a checkout or venv under /tmp (CI clones, pip's build dirs) must not be hidden by the sandbox's own /tmp
    host_dir = tempfile.mkdtemp(prefix="llmgym-tmp-pkg-", dir="/tmp")
    try:
        os.chmod(host_dir, 0o755)
        with open(os.path.join(host_dir, "tmp_scorer.py"), "w") as fh:
            fh.write("VALUE = 41\n")
        os.chmod(os.path.join(host_dir, "tmp_scorer.py"), 0o644)
        source = "def setup():\n    import tmp_scorer\ndef handle(s, r):\n    import tmp_scorer\n    return tmp_scorer.VALUE + r\n"
        with SandboxWorker(source, paths=[host_dir]) as w:
            assert w.call(None, 1, time_limit=30) == ("ok", 42)
    finally:
        shutil.rmtree(host_dir)


def test_binding_the_whole_of_tmp_is_refused():
    # a user's module saved straight in /tmp would bind the host's /tmp over the sandbox's private one
    with pytest.raises(ValueError, match="cannot bind /tmp into the sandbox: put the module in a directory"):
        SandboxWorker("def handle(s, r):\n    return 0\n", paths=["/tmp"])


def test_a_worker_that_cannot_start_raises_naming_the_cause():
    with pytest.raises(SandboxError, match="(?s)could not start.*No module named 'no_such_scorer'.*pip install it"):
        SandboxWorker("def setup():\n    import no_such_scorer\ndef handle(s, r):\n    return 0\n",
                      start_hint="pip install it").call(None, None, time_limit=5)
    with pytest.raises(SandboxError, match="could not prepare a call: KeyError"):
        with SandboxWorker("def prepare(c):\n    return {}[c]\ndef handle(s, r):\n    return 0\n") as w:
            w.call("missing", None, time_limit=5)


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop (and so the check) needs root")
def test_packages_the_sandbox_uid_cannot_read_are_refused_with_the_fix():
    private = tempfile.mkdtemp(prefix="llmgym-private-")  # mode 0700, like /root
    try:
        with pytest.raises(SandboxError, match="cannot read .*chmod o\\+rx"):
            SandboxWorker("def handle(s, r):\n    return 0\n", paths=[private]).call(None, None, time_limit=5)
    finally:
        shutil.rmtree(private)


def test_interpreter_matches_this_python():
    exe = interpreter_for([])
    out = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
    assert out.stdout.strip() == str(sys.version_info[:2])


def test_a_forked_process_starts_its_own_worker(worker):
    assert worker.call(1, "result = state", time_limit=10) == ("ok", 1)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child must not talk over the parent's pipes
        try:
            os.write(write, repr(worker.call(5, "result = state", time_limit=60)).encode())
        finally:
            os._exit(0)
    os.close(write)
    got = b""
    while chunk := os.read(read, 1024):
        got += chunk
    os.waitpid(pid, 0)
    assert got == b"('ok', 5)"
    assert worker.call(7, "result = state", time_limit=10) == ("ok", 7)  # the parent's worker is intact


def test_the_caller_s_packages_come_before_the_system_s():
    import sympy

    paths = site_packages("sympy")
    source = "def handle(state, request):\n    import sys, sympy\n    return [sympy.__file__, sys.path]\n"
    with SandboxWorker(source, paths=paths) as w:
        status, (where, path) = w.call(None, None, time_limit=60)
    assert status == "ok" and where == sympy.__file__
    stdlib = next(i for i, p in enumerate(path) if p.endswith("lib-dynload"))
    assert stdlib < path.index(paths[0]) < min(i for i, p in enumerate(path) if p.endswith("dist-packages"))


def test_a_worker_started_from_a_short_lived_thread_outlives_it():
    # bwrap's --die-with-parent follows the thread that started it: a batch's pool thread ending
    # must not take the worker down with it
    import threading

    w = SandboxWorker("def handle(state, request):\n    return state\n")
    try:
        thread = threading.Thread(target=lambda: w.call(1, None, time_limit=30))
        thread.start()
        thread.join()
        time.sleep(0.5)
        assert w._proc is not None and w._proc.poll() is None
        assert w.call(2, None, time_limit=30) == ("ok", 2)
    finally:
        w.close()


def test_the_worker_reads_its_sandbox_through_the_public_read_only_isolation():
    """``SandboxWorker`` starts its zygote with its Sandbox's mechanisms, read through ``Sandbox.isolation``
    (issue 31): no private attribute of the Sandbox is read in llmgym/sandbox/worker.py, and the copy it
    reads cannot change the sandbox."""
    import ast
    import dataclasses

    import llmgym.sandbox.worker as worker_module
    from llmgym.sandbox import Sandbox, SandboxIsolation
    from llmgym.sandbox.worker import WORKER_LIMITS

    tree = ast.parse(open(worker_module.__file__).read())
    reads = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr.startswith("_")
             and not node.attr.startswith("__") and (
                 (isinstance(node.value, ast.Name) and node.value.id in ("sb", "sandbox"))
                 or (isinstance(node.value, ast.Attribute) and node.value.attr == "sandbox"))}
    assert reads == set(), f"worker.py reads the Sandbox's private {sorted(reads)}"
    sandbox = Sandbox(WORKER_LIMITS, python=interpreter_for([]))
    iso = sandbox.isolation
    assert isinstance(iso, SandboxIsolation)
    assert (iso.bwrap_path is not None) == ("bwrap" in sandbox.mechanisms)
    assert iso.setuid == ("setuid" in sandbox.mechanisms) == (iso.uid_pool is not None)
    assert iso.seccomp == ("seccomp" in sandbox.mechanisms)
    with pytest.raises(dataclasses.FrozenInstanceError):
        iso.bwrap_path = None
    with pytest.raises(AttributeError):
        sandbox.isolation = iso


def test_a_clone_parent_process_of_a_call_dies_with_it_and_cannot_hold_its_answer(worker):
    """clone(CLONE_PARENT) from a call makes the zygote its parent (not the call's child), in a session of its
    own, holding every descriptor the call had: the zygote's sweep of its namespace ends it."""
    marker = f"{time.time() % 1000 + 3000:.6f}"
    status, value = worker.call(None, textwrap.dedent(f"""
        import ctypes, fcntl, platform
        number = {{"x86_64": 56, "aarch64": 220}}[platform.machine()]
        pid = ctypes.CDLL(None, use_errno=True).syscall(number, 0x00008000 | 17, 0, 0, 0, 0)
        if pid == 0:
            try:
                os.setsid()
                for fd in range(3, 256):
                    try:
                        fcntl.fcntl(fd, fcntl.F_SETFD, 0)
                    except OSError:
                        pass
                os.execvp("sleep", ["sleep", "{marker}"])
            finally:
                os._exit(1)
        result = "made" if pid > 0 else "refused"
    """), time_limit=20)
    assert (status, value) == ("ok", "made")
    assert cmdline_pids(marker) == []
    assert pids_of_uids([worker._uid]) == []
