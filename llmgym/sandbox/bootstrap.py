"""The bootstrap: the first program inside the sandbox, and the only one that sees its privileges.

It runs under the *system* Python inside the sandbox (first as root in bwrap's namespaces, with only
CAP_SETUID/CAP_SETGID), forks, and the child drops to the sandbox uid, writes the files, applies the
limits (:func:`llmgym.sandbox.limits.rlimits`) and runs the program in a fresh ``__main__`` module.
The parent stays behind as a tiny supervisor that reports the child's wait status and rusage on a
private pipe (so a program that exits 137 is not mistaken for one killed by SIGKILL). A judged run's
supervisor is :data:`llmgym.sandbox.judge_protocol.JUDGED_SUPERVISOR`. Run with ``--export-bpf`` it prints
the compiled seccomp filter (once per host process).

The configuration arrives as a ``marshal``-ed dict on a memfd (no imports beyond built-ins), the
status leaves as ``key value`` lines on a pipe only the supervisor writes. Keep the source
compatible with Python 3.8+ and free of imports beyond the standard library.

Example:
    >>> from llmgym.sandbox.bootstrap import BOOTSTRAP
    >>> compile(BOOTSTRAP, "<bootstrap>", "exec") is not None
    True
"""

from __future__ import annotations

from .judge_protocol import JUDGED_SUPERVISOR

__all__ = ["BOOTSTRAP", "BOOTSTRAP_HELPERS"]

#: Functions shared by every program started in the sandbox: the seccomp filter, the uid drop and
#: limits, the plain child, and the reader of a child's set-up error.
BOOTSTRAP_HELPERS = r"""
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

def _setup_error(ready_r):
    # a child reports a failed set-up (uid drop, limits, files) on ready_r; EOF alone means ready
    err = b""
    while True:
        chunk = os.read(ready_r, 4096)
        if not chunk:
            break
        err += chunk
    os.close(ready_r)
    return err

def _exit_on_setup_error(ready_r, pid, status_fd):
    err = _setup_error(ready_r)
    if err:
        os.waitpid(pid, 0)
        os.write(status_fd, b"setup_error " + err.replace(b"\n", b" ") + b"\n")
        os._exit(0)
"""

_MAIN = r"""
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

#: The whole bootstrap (``python3 -I -c BOOTSTRAP <cfg_fd> <status_fd>`` or ``--export-bpf``).
BOOTSTRAP = BOOTSTRAP_HELPERS + JUDGED_SUPERVISOR + _MAIN
