"""The judge protocol: how a judged run keeps the verdict out of the candidate's reach.

A judged run (:meth:`llmgym.sandbox.Sandbox.run_judged`) is two processes in one sandbox, under two
uids. The *candidate* -- a fresh interpreter running a trusted ``runner`` that runs the untrusted
``main.py`` -- talks to the *judge* over two pipes only (requests on the candidate's fd 3, replies on
its fd 4). The judge runs trusted source under the run's uid + :data:`~llmgym.sandbox.JUDGE_UID_OFFSET`,
with stdin/stdout/stderr on ``/dev/null``; its verdict goes to ``JUDGE_REPORT``, a pipe to the
sandbox's supervisor that no other process holds. So the candidate can neither signal the judge,
read or write its memory, files or pipes, nor print, raise or exit its way to a verdict: whatever it
does arrives at the judge as plain data.

The boundary not to break: no code of the candidate runs in the judge's process; nothing but the
two data pipes joins them; the report channel is created after the candidate is forked, so the
candidate never holds it.

:data:`JUDGED_SUPERVISOR` is the part of the in-sandbox bootstrap (:mod:`llmgym.sandbox.bootstrap`)
that starts both processes and reports their statuses and the judge's report to the host.

Example:
    >>> from llmgym.sandbox.judge_protocol import JUDGED_SUPERVISOR
    >>> "JUDGE_REPORT" in JUDGED_SUPERVISOR and "def _judged(cfg, status_fd)" in JUDGED_SUPERVISOR
    True
"""

from __future__ import annotations

__all__ = ["JUDGED_SUPERVISOR"]

#: Source (run by the system Python inside the sandbox, stdlib only, Python 3.8+) of ``_judged``:
#: forks the candidate (drops to the run's uid, execs the runner) and the judge (drops to the
#: judge's uid, runs the judge's source), reaps both as the namespace's init, and writes the
#: statuses and the judge's report (hex) on the status pipe.
JUDGED_SUPERVISOR = r"""
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
"""
