"""Issue 30's closing attack on the code judge: hunting the hidden tests from inside the candidate.

A program that finds a hidden test's text anywhere it can read (another process's ``/proc`` entries,
an inherited descriptor, a file) could print it: at load time CodeRetry hands the program's own
traceback back as feedback, so the next turn would answer from a table. And a program that can reach
the judge's report pipe could forge a verdict. Each hunt below runs before the tests (at load) and
after (inside the tested function), and puts whatever it found in its output and its exception: none of
it may hold the hidden expected value, and every one scores 0.
"""

from __future__ import annotations

import pytest

from llmgym import Task
from llmgym.envs.code import CodeVerifier

SECRET = "987654321"

_HUNT = r'''
import os, sys
NEEDLES = (b"ass" + b"ert", b"98765" + b"4321")  # built at run time: main.py itself holds neither

def hunt():
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for part in ("cmdline", "environ", "status", "maps", "stack", "syscall", "wchan", "sched", "io"):
            try:
                with open("/proc/%s/%s" % (pid, part), "rb") as fh:
                    data = fh.read(1 << 20)
            except OSError:
                continue
            if any(n in data for n in NEEDLES):
                found.append("/proc/%s/%s: %r" % (pid, part, data[-3000:]))
        try:
            fds = os.listdir("/proc/%s/fd" % pid)
        except OSError:
            fds = []
        for fd in fds:
            path = "/proc/%s/fd/%s" % (pid, fd)
            try:  # a judge's report pipe written from here would be a forged verdict
                w = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                os.write(w, b'{"passed": true, "stage": "test", "token": null}')
                found.append("wrote " + path)
            except OSError:
                pass
            try:
                r = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                data = os.read(r, 1 << 16)
                if any(n in data for n in NEEDLES):
                    found.append("read %s: %r" % (path, data[-3000:]))
            except OSError:
                pass
    for fd in range(5, 256):  # anything inherited beyond stdio and the two call pipes
        try:
            data = os.read(fd, 1 << 16)
            found.append("fd %d: %r" % (fd, data[-3000:]))
        except OSError:
            pass
    for root in ("/tmp", "/dev/shm", "/", "/run", "/var/tmp"):
        try:
            names = os.listdir(root)
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(root, name), "rb") as fh:
                    data = fh.read(1 << 20)
                if any(n in data for n in NEEDLES):
                    found.append("%s: %r" % (os.path.join(root, name), data[-3000:]))
            except OSError:
                pass
    return found
'''


@pytest.fixture(scope="module")
def verifier():
    return CodeVerifier()


TASK = Task("Write f(x).", tests=f"assert f(1) == 2\nassert f(7) == {SECRET}\n", metadata={"entry_point": "f"})


@pytest.mark.parametrize("when", ["at load", "in the call"])
def test_the_hidden_tests_are_nowhere_the_candidate_can_read_and_the_report_is_out_of_reach(verifier, when):
    if when == "at load":
        completion = _HUNT + "found = hunt()\nprint(found, file=sys.stderr)\nraise RuntimeError(repr(found))\n"
    else:
        completion = _HUNT + ("def f(x):\n    found = hunt()\n    print(found, file=sys.stderr)\n"
                              "    raise RuntimeError(repr(found))\n")
    score = verifier(TASK, completion)
    assert score.reward == 0.0
    text = " ".join(str(v) for v in score.info.values())
    assert SECRET not in text, text[:2000]
    assert "wrote /proc" not in text, text[:2000]
    assert "RuntimeError" in text  # the hunt ran (and reported nothing worth having)
