"""The sandbox against hostile programs: each must fail (or be killed) and leave no trace on the host.

Every run is checked afterwards from the host: no live process of the run's uid (a /proc scan),
no file it tried to create, the host's own processes and files untouched.  Tests that need the
full sandbox skip, naming what is missing, where it is not installed (`.ci/install-sandbox.sh`).
"""

from __future__ import annotations

import dataclasses
import doctest
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import pytest
from conftest import sandbox_missing_reason

import llmgym.sandbox as sbm
from llmgym.sandbox import (
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailableError,
    SandboxWarning,
    check_sandbox,
    run_python,
)
from host_traces import cmdline_pids  # noqa: E402  (tests/ is on sys.path)


INFO = check_sandbox()
needs_sandbox = pytest.mark.skipif(
    bool(INFO["missing"]),
    reason=sandbox_missing_reason(INFO),
)

LIMITS = SandboxLimits(
    cpu_seconds=2,
    wall_seconds=4,
    memory_mb=256,
    max_processes=16,
    max_file_mb=4,
    max_open_files=64,
    tmp_size_mb=16,
    max_output_kb=16,
)
POOL_UIDS = range(*sbm.DEFAULT_UID_RANGE)


@pytest.fixture(scope="module")
def sb() -> Sandbox:
    if INFO["missing"]:
        pytest.skip(sandbox_missing_reason(INFO))
    return Sandbox(LIMITS)


def token() -> str:
    return uuid.uuid4().hex[:12]


def assert_no_trace(r: SandboxResult) -> None:
    """Nothing of the run is left running on the host."""
    assert r.uid is not None and r.uid in POOL_UIDS
    left = sbm.pids_of_uids([r.uid])
    info = []
    for p in left:
        try:
            with open(f"/proc/{p}/status") as fh:
                info.append(fh.read().splitlines()[:8])
        except OSError:
            pass
    assert left == [], f"processes of sandbox uid {r.uid} survived: {info}"


def run(sb: Sandbox, code: str, **kw) -> SandboxResult:
    r = sb.run_python(textwrap.dedent(code), **kw)
    assert_no_trace(r)
    return r


# ------------------------------------------------------------------ ordinary programs
@needs_sandbox
def test_print_and_exit_status(sb):
    r = run(sb, "print('hello'); import sys; print('err', file=sys.stderr)")
    assert (r.returncode, r.stdout, r.stderr, r.passed, r.killed) == (
        0,
        "hello\n",
        "err\n",
        True,
        False,
    )
    assert set(sbm.DEFAULT_REQUIRED) <= set(r.mechanisms)
    r = run(sb, "import sys; sys.exit(3)")
    assert (r.returncode, r.passed, r.killed, r.killed_reason) == (
        3,
        False,
        False,
        None,
    )
    # an exit status of 137 is the program's, not a kill
    r = run(sb, "raise SystemExit(137)")
    assert (r.returncode, r.killed) == (137, False)


@needs_sandbox
def test_threads_subprocesses_and_multiprocessing_work(sb):
    r = run(
        sb,
        """
        import threading, subprocess, multiprocessing, concurrent.futures, tempfile
        out = []
        t = threading.Thread(target=out.append, args=(1,)); t.start(); t.join()
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            out += list(ex.map(abs, [-2, -3]))
        out.append(subprocess.run(["echo", "sub"], capture_output=True, text=True).stdout.strip())
        with multiprocessing.Pool(2) as pool:
            out += pool.map(abs, [-4, -5])
        with tempfile.NamedTemporaryFile() as f:
            out.append(f.name.startswith("/tmp/"))
        print(out)
    """,
    )
    assert r.passed and r.stdout == "[1, 2, 3, 'sub', 4, 5, True]\n", r


@needs_sandbox
def test_stdin_files_and_tests_as_asserts(sb):
    r = run(
        sb,
        "import sys\nfor line in sys.stdin: print(int(line) * 2)",
        stdin="1\n2\n21\n",
    )
    assert r.passed and r.stdout == "2\n4\n42\n"
    big = "x" * 300_000  # larger than a pipe buffer, never read: must not dead-lock
    assert run(sb, "print('ok')", stdin=big).stdout == "ok\n"
    program = "def add(a, b):\n    return a + b\n"
    assert run(sb, program + "assert add(2, 3) == 5\n").passed
    r = run(sb, program + "assert add(2, 3) == 6\n")
    assert (
        not r.passed
        and r.returncode == 1
        and r.stderr.rstrip().endswith("AssertionError")
    )
    assert 'File "/tmp/main.py", line 3' in r.stderr and "<string>" not in r.stderr
    r = run(
        sb,
        "from pkg.helper import f\nprint(f(), open('data.bin','rb').read())",
        files={"pkg/helper.py": "def f():\n    return 7\n", "data.bin": b"\x00\x01"},
    )
    assert r.stdout == "7 b'\\x00\\x01'\n", r.stderr
    with pytest.raises(ValueError):
        sb.run_python("pass", files={"../escape.py": ""})
    with pytest.raises(ValueError):
        sb.run_python("pass", files={"/tmp/abs.py": ""})
    with pytest.raises(
        SandboxError, match="setup failed"
    ):  # files larger than the tmpfs
        sb.run_python(
            "pass", files={"huge.bin": b"0" * (LIMITS.tmp_size_mb + 1) * 2**20}
        )


# ------------------------------------------------------------------ CPU, wall clock, memory
@needs_sandbox
def test_infinite_loop_is_killed_by_cpu_limit(sb):
    lim = SandboxLimits(cpu_seconds=1, wall_seconds=30, memory_mb=256)
    r = run(sb, "while True: pass", limits=lim)
    assert not r.passed and r.killed and not r.timed_out
    assert r.killed_reason == "cpu_limit" and r.returncode == -signal.SIGXCPU
    # ignoring SIGXCPU does not help: the hard limit sends SIGKILL a second later
    r = run(
        sb,
        "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass",
        limits=lim,
    )
    assert r.killed_reason == "cpu_limit" and r.returncode == -signal.SIGKILL
    assert r.cpu_s is None or r.cpu_s < 3  # bounded by CPU time, not by the wall clock


@needs_sandbox
def test_sleeping_forever_is_killed_by_wall_clock(sb):
    lim = SandboxLimits(cpu_seconds=5, wall_seconds=1, memory_mb=256)
    r = run(
        sb, "import time\nprint('started', flush=True)\ntime.sleep(1000)", limits=lim
    )
    assert r.timed_out and r.killed and r.killed_reason == "timeout" and not r.passed
    assert r.stdout == "started\n"  # output before the kill is kept
    assert 0.9 < r.duration_s < 15  # killed at 1 s; the upper bound is a hang guard on a loaded machine


@needs_sandbox
def test_memory_bomb(sb):
    r = run(sb, "x = bytearray(2 ** 31)")
    assert not r.passed and "MemoryError" in r.stderr
    r = run(sb, "a = []\nwhile True:\n    a.append(' ' * 10 ** 6)")
    assert not r.passed and "MemoryError" in r.stderr
    assert r.max_rss_mb is not None and r.max_rss_mb <= LIMITS.memory_mb


@needs_sandbox
@pytest.mark.skipif(
    not INFO["cgroup"], reason=f"no cgroup here: {INFO['why'].get('cgroup')}"
)
def test_memory_of_the_whole_tree_is_capped(sb):
    # 8 processes x 200 MB, each under the per-process RLIMIT_AS, 1.6 GB together: the
    # tree's cgroup (memory_mb + 2 x tmp_size_mb) stops them.
    r = run(
        sb,
        """
        import os, time
        kids = []
        for i in range(8):
            pid = os.fork()
            if pid == 0:
                b = b"x" * (200 * 2**20)
                time.sleep(1)
                os._exit(0)
            kids.append(pid)
        raise SystemExit(sum(os.waitpid(k, 0)[1] != 0 for k in kids))
    """,
        # the cgroup stops them whatever the speed; on a loaded machine 4 s of wall clock could
        # run out first, so the wall clock here is only a hang guard
        limits=dataclasses.replace(LIMITS, wall_seconds=120),
    )
    assert not r.passed and r.killed and r.killed_reason == "memory_limit", r


# ------------------------------------------------------------------ processes
@needs_sandbox
def test_fork_bomb_is_contained(sb):
    t0 = time.monotonic()
    r = run(
        sb,
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """,
        limits=dataclasses.replace(LIMITS, wall_seconds=2),
    )
    assert not r.passed and r.killed and r.killed_reason in ("timeout", "cpu_limit")
    assert time.monotonic() - t0 < 2 + 2
    # RLIMIT_NPROC caps the tree: 1 + 15 children, then fork fails
    r = run(
        sb,
        """
        import os, time
        n = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
                n += 1
        except OSError as e:
            print(n, e.errno)
    """,
    )
    assert r.stdout.split() == [str(LIMITS.max_processes - 1), "11"], r  # EAGAIN


@needs_sandbox
def test_daemonised_processes_do_not_survive(sb):
    marker = f"{time.time() % 1000 + 1000:.6f}"  # a unique `sleep` argument
    r = run(
        sb,
        f"""
        import os
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv('/usr/bin/sleep', ['sleep', '{marker}'])
            os._exit(0)
        os.wait()
        print('parent leaves')
    """,
    )
    assert r.passed and r.stdout == "parent leaves\n"
    assert cmdline_pids(marker) == []


@needs_sandbox
def test_cannot_signal_host_processes(sb):
    victim = subprocess.Popen(["sleep", "30"])
    try:
        r = run(
            sb,
            f"""
            import os, signal
            for what, call in [
                ("runner", lambda: os.kill({os.getpid()}, signal.SIGKILL)),
                ("victim", lambda: os.kill({victim.pid}, signal.SIGKILL)),
                ("group", lambda: os.killpg({os.getpgid(0)}, signal.SIGKILL)),
                ("all", lambda: os.kill(-1, signal.SIGKILL)),
            ]:
                try:
                    call()
                    print(what, "sent")
                except OSError as e:
                    print(what, type(e).__name__)
        """,
        )
        lines = dict(line.split() for line in r.stdout.splitlines())
        assert lines == {
            "runner": "ProcessLookupError",
            "victim": "ProcessLookupError",
            "group": "ProcessLookupError",
            "all": "PermissionError",
        }, r
        assert victim.poll() is None, "a host process was killed"
    finally:
        victim.kill()
        victim.wait()


@needs_sandbox
def test_concurrent_sandboxes_get_distinct_uids(sb):
    # Each run forks as many sleepers as RLIMIT_NPROC allows and holds them for a while; they
    # overlap in time.  A shared uid would make them split one budget of max_processes.
    prog = """
        import os, time
        n = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
                n += 1
        except OSError:
            pass
        time.sleep(0.6)
        print(os.getuid(), n)
    """
    t0 = time.monotonic()
    results = sb.run_many([textwrap.dedent(prog)] * 3, max_workers=3)
    took = time.monotonic() - t0
    for r in results:
        assert_no_trace(r)
    uids = [int(r.stdout.split()[0]) for r in results]
    counts = [int(r.stdout.split()[1]) for r in results]
    assert len(set(uids)) == 3 and all(r.uid == u for r, u in zip(results, uids))
    assert counts == [LIMITS.max_processes - 1] * 3
    assert took < 3 * 0.6 + 1.0, f"runs did not overlap ({took:.2f} s)"


# ------------------------------------------------------------------ files
@needs_sandbox
def test_cannot_write_outside_the_sandbox(sb):
    tok = token()
    targets = [
        f"/tmp/pwned-{tok}",
        f"/root/pwned-{tok}",
        f"{os.getcwd()}/pwned-{tok}",
        f"/work/pwned-{tok}",
        f"/usr/pwned-{tok}",
        f"/etc/pwned-{tok}",
        f"/var/tmp/pwned-{tok}",
        f"/dev/shm/pwned-{tok}",
        f"{sys.prefix}/pwned-{tok}",
        f"/proc/pwned-{tok}",
        f"/home/pwned-{tok}",
    ]
    os_py = "/usr/lib/python3.11/os.py"
    before = os.stat(os_py).st_mtime if os.path.exists(os_py) else None
    r = run(
        sb,
        f"""
        for p in {targets!r} + [{os_py!r}]:
            try:
                with open(p, 'a') as f:
                    f.write('pwned')
                print(p, 'written')
            except OSError as e:
                print(p, type(e).__name__)
    """,
    )
    out = dict(line.split() for line in r.stdout.splitlines())
    assert out.pop(f"/tmp/pwned-{tok}") == "written"  # its own private tmpfs
    assert out.pop(f"/dev/shm/pwned-{tok}") == "written"  # ditto
    assert all(v != "written" for v in out.values()), out
    for p in targets:
        assert not os.path.exists(p), f"{p} appeared on the host"
    if before is not None:
        assert os.stat(os_py).st_mtime == before


@needs_sandbox
def test_cannot_fill_the_disk(sb):
    usage = shutil.disk_usage("/")
    r = run(sb, "with open('big', 'wb') as f:\n    while True: f.write(b'x' * 2**20)")
    assert not r.passed and "File too large" in r.stderr  # RLIMIT_FSIZE
    r = run(
        sb,
        """
        i = 0
        while True:
            with open(f'f{i}', 'wb') as f:
                f.write(b'x' * (3 * 2**20))
            i += 1
    """,
    )
    assert not r.passed and "No space left on device" in r.stderr  # the tmpfs cap
    r = run(
        sb,
        """
        import os
        while True:
            name = f'/dev/shm/{os.urandom(4).hex()}'
            os.write(os.open(name, os.O_CREAT | os.O_WRONLY), b'x' * 2**20)
    """,
    )
    assert (
        not r.passed and "No space left on device" in r.stderr
    )  # /dev/shm is capped too
    assert shutil.disk_usage("/").used - usage.used < 64 * 2**20


@needs_sandbox
def test_cannot_read_secrets(sb, tmp_path, monkeypatch):
    tok = token()
    secret = f"s3cret-{tok}"
    root_secret = f"/root/.llmgym-sandbox-secret-{tok}"
    tmp_secret = tmp_path / "secret.txt"
    tmp_public = (
        tmp_path / "public.txt"
    )  # world-readable, but not in the sandbox's view
    monkeypatch.setenv("LLMGYM_TEST_SECRET", secret)
    try:
        for p, mode in [(root_secret, 0o600), (tmp_secret, 0o600), (tmp_public, 0o644)]:
            with open(p, "w") as f:
                f.write(secret)
            os.chmod(p, mode)
        paths = [
            root_secret,
            str(tmp_secret),
            str(tmp_public),
            "/root",
            os.getcwd(),
            __file__,
            sys.executable,
            sys.prefix,
            "/etc/shadow",
            "/proc/1/environ",
            "/proc/2/environ",
        ]
        r = run(
            sb,
            f"""
            import os, glob
            print(dict(os.environ))
            for p in {paths!r}:
                print('exists' if os.path.exists(p) else 'absent', p)
                try:
                    print(open(p).read() if os.path.isfile(p) else os.listdir(p))
                except OSError as e:
                    print(type(e).__name__)
            for p in glob.glob('/proc/*/environ'):
                try:
                    print(p, open(p).read())
                except OSError:
                    pass
        """,
        )
        assert r.returncode == 0, r.stderr
        assert secret not in r.stdout and tok not in r.stdout.replace(
            root_secret, ""
        ).replace(f"absent {root_secret}", "")
        assert "LLMGYM_TEST_SECRET" not in r.stdout
        for p in [
            root_secret,
            str(tmp_secret),
            str(tmp_public),
            "/root",
            os.getcwd(),
            __file__,
            sys.executable,
            "/etc/shadow",
        ]:
            assert f"absent {p}" in r.stdout, p
    finally:
        os.unlink(root_secret)


@needs_sandbox
def test_environment_is_cleared(sb, monkeypatch):
    monkeypatch.setenv("LLMGYM_TEST_SECRET", "hunter2")
    r = run(sb, "import os, json; print(json.dumps(dict(os.environ)))")
    import json

    env = json.loads(r.stdout)
    assert "LLMGYM_TEST_SECRET" not in env
    assert set(env) <= {
        "PATH",
        "HOME",
        "LANG",
        "TMPDIR",
        "USER",
        "LOGNAME",
        "PWD",
        "LC_CTYPE",
    }
    assert env["HOME"] == "/tmp"
    r = run(
        Sandbox(LIMITS, env={"EXTRA": "given"}), "import os; print(os.environ['EXTRA'])"
    )
    assert r.stdout == "given\n"


# ------------------------------------------------------------------ network and kernel surface
@needs_sandbox
def test_no_network(sb):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    port = server.getsockname()[1]
    try:
        prog = f"""
            import socket
            tries = [
                ("host-loopback", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=1)),
                ("public-ip", lambda: socket.create_connection(("1.1.1.1", 53), timeout=1)),
                ("public-ip6", lambda: socket.create_connection(("2606:4700:4700::1111", 53), timeout=1)),
                ("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53))),
                ("dns", lambda: socket.getaddrinfo("example.com", 80)),
                ("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)),
                ("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)),
            ]
            for name, f in tries:
                try:
                    f()
                    print(name, "connected")
                except Exception as e:
                    print(name, type(e).__name__)
            a, b = socket.socketpair()  # AF_UNIX stays usable
            a.sendall(b"ok"); print("unix", b.recv(2).decode())
        """
        r = run(sb, prog)
        out = dict(line.split() for line in r.stdout.splitlines())
        assert out.pop("unix") == "ok", r
        assert set(out) == {
            "host-loopback",
            "public-ip",
            "public-ip6",
            "udp",
            "dns",
            "netlink",
            "packet",
        }
        assert all(out[k] == "PermissionError" for k in out if k != "dns"), (
            out
        )  # seccomp
        # the network namespace alone (seccomp off) also holds: nothing to connect to
        r = run(_without_seccomp(), prog)
        out = dict(line.split() for line in r.stdout.splitlines())
        for name in (
            "host-loopback",
            "public-ip",
            "public-ip6",
            "udp",
            "dns",
            "packet",
        ):
            assert out[name] != "connected", out
        server.settimeout(0.2)
        with pytest.raises(socket.timeout):  # nothing ever reached the host's listener
            server.accept()
    finally:
        server.close()


def _without_seccomp() -> Sandbox:
    s = Sandbox(LIMITS)
    s._use_seccomp = False
    return s


@needs_sandbox
def test_kernel_surface_and_privileges(sb):
    r = run(
        sb,
        """
        import ctypes, os, errno
        libc = ctypes.CDLL(None, use_errno=True)
        def call(name, *args):
            ret = getattr(libc, name)(*args)
            return 'ok' if ret == 0 else errno.errorcode[ctypes.get_errno()]
        print('unshare-user', call('unshare', 0x10000000))
        print('unshare-net', call('unshare', 0x40000000))
        print('ptrace', call('ptrace', 16, 1, 0, 0))  # PTRACE_ATTACH to pid 1
        print('mount', call('mount', b'none', b'/tmp', b'tmpfs', 0, None))
        try:
            os.setuid(0); print('setuid ok')
        except OSError as e:
            print('setuid', errno.errorcode[e.errno])
        status = dict(l.split(':', 1) for l in open('/proc/self/status'))
        print('caps', status['CapEff'].strip())
        print('seccomp', status['Seccomp'].strip())
        print('nnp', status['NoNewPrivs'].strip())
    """,
    )
    out = dict(line.split() for line in r.stdout.splitlines())
    assert out == {
        "unshare-user": "EPERM",
        "unshare-net": "EPERM",
        "ptrace": "EPERM",
        "mount": "EPERM",
        "setuid": "EPERM",
        "caps": "0000000000000000",
        "seccomp": "2",
        "nnp": "1",
    }, r


@needs_sandbox
def test_output_flood_is_cut_and_killed(sb):
    r = run(sb, "while True:\n    print('x' * 1000)")
    assert r.killed and r.killed_reason == "output_limit" and not r.passed
    assert r.stdout_truncated and len(r.stdout) == LIMITS.max_output_kb * 1024
    assert r.duration_s < 2


# ------------------------------------------------------------------ availability and opt-outs
@pytest.fixture
def no_bwrap(monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(
        shutil,
        "which",
        lambda name, *a, **k: None if name == "bwrap" else real_which(name, *a, **k),
    )
    check_sandbox(refresh=True)
    yield
    monkeypatch.undo()
    check_sandbox(refresh=True)


def test_missing_mechanism_refuses_to_run(no_bwrap, monkeypatch):
    monkeypatch.delenv(sbm.ALLOW_UNSANDBOXED_ENV, raising=False)
    assert check_sandbox()["bwrap"] is False and "bwrap" in check_sandbox()["missing"]
    with pytest.raises(
        SandboxUnavailableError, match="apt-get install bubblewrap"
    ) as exc:
        Sandbox()
    assert "bwrap" in exc.value.missing
    with pytest.raises(SandboxUnavailableError):
        Sandbox(require=("bwrap",))
    with pytest.raises(ValueError):
        Sandbox(require=("bogus",))


@pytest.mark.skipif(
    os.geteuid() != 0 or not INFO["python"], reason="needs root and /usr/bin/python3"
)
def test_explicit_opt_out_warns_and_keeps_what_it_can(no_bwrap, monkeypatch):
    monkeypatch.setenv("LLMGYM_TEST_SECRET", "hunter2")
    monkeypatch.setenv(sbm.ALLOW_UNSANDBOXED_ENV, "1")
    with pytest.warns(SandboxWarning, match="WITHOUT bwrap"):
        s = Sandbox(LIMITS)
    assert "bwrap" not in s.mechanisms and "setuid" in s.mechanisms
    marker = f"{time.time() % 1000 + 2000:.6f}"
    r = s.run_python(
        textwrap.dedent(f"""
        import os, subprocess
        subprocess.Popen(['setsid', 'sleep', '{marker}'])
        print(os.getuid(), os.getcwd(), 'LLMGYM_TEST_SECRET' in os.environ)
    """)
    )
    assert r.passed and r.duration_s < 2, (
        r
    )  # the daemon holding the pipes does not stall it
    uid, cwd, leaked = r.stdout.split()
    assert int(uid) == r.uid and leaked == "False", r
    assert not os.path.exists(cwd), "the per-run directory was not removed"
    assert cmdline_pids(marker) == [] and sbm.pids_of_uids([r.uid]) == []
    monkeypatch.delenv(sbm.ALLOW_UNSANDBOXED_ENV)
    with pytest.warns(SandboxWarning):
        Sandbox(require=("setuid", "seccomp"))
    with pytest.warns(SandboxWarning):
        Sandbox(allow_unsafe=True)


@pytest.fixture
def no_cgroup(monkeypatch):
    """The probe finds no writable cgroup tree (as in a container that delegates none)."""
    import llmgym.sandbox.probe as probe_module
    import llmgym.sandbox.runner as runner_module

    monkeypatch.setattr(probe_module, "cgroup_probe", lambda: (None, "cgroups not writable here: test"))
    monkeypatch.setattr(runner_module, "_warned_no_cgroup", False, raising=False)
    check_sandbox(refresh=True)
    yield
    monkeypatch.undo()
    check_sandbox(refresh=True)


@pytest.mark.skipif(any(m in sbm.DEFAULT_REQUIRED for m in INFO["missing"]), reason="needs the full sandbox")
def test_a_sandbox_without_its_cgroup_says_so_once_naming_what_is_lost_and_the_way_back(no_cgroup):
    import warnings

    with pytest.warns(SandboxWarning, match="no cgroup here") as record:
        first = Sandbox(LIMITS)
    said = [w for w in record if "no cgroup here" in str(w.message)]
    assert len(said) == 1 and said[0].category.__name__ == "NoCgroupWarning"
    message = str(said[0].message)
    for what in ("memory is capped per process only", "max_processes", "tmpfs", "run as root", "cgroup v2",
                 "cgroups not writable here: test"):
        assert what in message, what
    assert "cgroup" in first.missing and first.run_python("print(1)").stdout == "1\n"  # it still runs
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        Sandbox(LIMITS)
    assert not [w for w in again if "no cgroup" in str(w.message)]  # once per process


def test_limits_are_validated():
    with pytest.raises(ValueError):
        SandboxLimits(cpu_seconds=0)
    with pytest.raises(ValueError):
        SandboxLimits(memory_mb=8)


@needs_sandbox
def test_docstring_examples():
    import importlib
    import pkgutil

    attempted = 0
    for name in ["llmgym.sandbox"] + [m.name for m in pkgutil.iter_modules(sbm.__path__, "llmgym.sandbox.")]:
        res = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
        assert res.failed == 0, name
        attempted += res.attempted
    assert attempted >= 10


@needs_sandbox
def test_module_level_run_python_and_overhead():
    run_python("pass")  # warm the default sandbox
    t0 = time.monotonic()
    rs = [run_python("print(1)") for _ in range(10)]
    per_run = (time.monotonic() - t0) / 10
    assert all(r.passed and r.stdout == "1\n" for r in rs)
    assert per_run < 0.5, f"{per_run * 1000:.0f} ms per run"


@needs_sandbox
@pytest.mark.skipif(
    shutil.which("setpriv") is None, reason="needs setpriv (util-linux)"
)
def test_non_root_caller_is_refused_unless_it_opts_out():
    # The module runs as `nobody` under the system Python (it needs only the stdlib).
    d = tempfile.mkdtemp(prefix="llmgym-sbtest-")
    try:
        os.chmod(d, 0o755)
        # the package needs only the standard library: a copy runs under the system Python
        shutil.copytree(os.path.dirname(sbm.__file__), os.path.join(d, "llmgym_sandbox_copy"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        for root, dirs, files in os.walk(d):
            for name in dirs + files:
                os.chmod(os.path.join(root, name), 0o755)
        script = textwrap.dedent("""
            import warnings, llmgym_sandbox_copy as m
            try:
                m.Sandbox()
                print("no-error")
            except m.SandboxUnavailableError as e:
                print("refused", ",".join(e.missing))
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                s = m.Sandbox(require=("bwrap", "seccomp"))
            print("warned", any(issubclass(x.category, m.SandboxWarning) for x in w))
            r = s.run_python("import os, socket\\nprint(os.getuid(), os.path.exists('/work'))\\n"
                             "socket.socket()")
            print("ran", r.stdout.strip(), r.passed, r.stderr.splitlines()[-1].split(":")[0])
        """)
        out = subprocess.run(
            [
                "setpriv",
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                "/usr/bin/python3",
                "-I",
                "-c",
                f"import sys; sys.path.insert(0, {d!r})\n" + script,
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=d,
            env={"PATH": "/usr/bin:/bin"},
        )
        assert out.stdout.splitlines() == [
            "refused setuid",
            "warned True",
            "ran 65534 False False PermissionError",
        ], out
    finally:
        shutil.rmtree(d)


# ------------------------------------------------------------------ judged runs (issue 10)
@needs_sandbox
def test_run_judged_runs_the_judge_under_its_own_uid_with_a_private_report(sb):
    runner = "import os, sys; os.write(4, b'%d' % os.getuid()); exec(open(sys.argv[1]).read())"
    judge = "import os\nuid = int(os.read(JUDGE_IN, 20))\nos.write(JUDGE_REPORT, b'%d %d' % (uid, os.getuid()))\n"
    r = sb.run_judged("print('candidate ran')", judge, runner)
    assert r.returncode == 0 and r.stdout == "candidate ran\n" and not r.killed, r
    candidate_uid, judge_uid = map(int, r.judge_report.split())
    assert candidate_uid == r.uid and judge_uid == r.uid + sbm.JUDGE_UID_OFFSET
    assert_no_trace(r)
    assert sbm.pids_of_uids([judge_uid]) == []


@needs_sandbox
def test_run_judged_reports_a_limit_that_killed_the_candidate(sb):
    runner = "import sys; exec(open(sys.argv[1]).read())"
    judge = "import os\nos.write(JUDGE_REPORT, b'eof' if os.read(JUDGE_IN, 1) == b'' else b'data')\nos._exit(1)\n"
    lim = SandboxLimits(cpu_seconds=1, wall_seconds=120, memory_mb=256)  # the wall clock: a hang guard
    r = sb.run_judged("while True: pass", judge, runner, limits=lim)
    assert r.judge_report == "eof" and r.returncode == 1
    assert r.killed_reason == "cpu_limit" and r.candidate_returncode in (-signal.SIGXCPU, -signal.SIGKILL), r
