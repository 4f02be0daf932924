"""Run untrusted (model-written) Python code isolated from the host.

Model-written code is hostile input.  :class:`Sandbox` runs it in a separate process tree that,
by default, has

* **no network**: a new network namespace (only its own, empty loopback), and a seccomp filter
  that refuses every socket family except ``AF_UNIX``;
* **a read-only view of the system only**: bubblewrap mounts a fresh root holding ``/usr`` (and the
  ``/lib*``, ``/bin`` links), a few ``/etc`` files the interpreter needs, a new ``/proc`` and a
  minimal ``/dev``; nothing of ``/root``, ``/home``, ``/work``, the caller's venv or working directory;
* **a private, size-capped working directory**: a tmpfs at ``/tmp`` (also ``HOME`` and the cwd) of
  ``tmp_size_mb``, and another at ``/dev/shm``, both gone with the sandbox;
* **an unprivileged identity**: a real uid/gid from a pool (60000-60063 by default, one per
  concurrent run, held with a file lock) with no supplementary groups and no capabilities;
* **resource limits**: ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_NPROC`` (enforced because the uid is
  not root and is private to the run), ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, ``RLIMIT_CORE = 0``;
* **a seccomp filter**: ``socket`` (non-``AF_UNIX``), ``ptrace``, ``process_vm_*``, ``mount`` and
  the new mount API, ``unshare``/``setns``/namespace-creating ``clone`` (``clone3`` answers
  ``ENOSYS``), ``kill(-1)``, ``TIOCSTI``, ``bpf``, ``perf_event_open``, ``keyctl``, ``io_uring``,
  module loading, ``reboot``, clock setting ... all fail with ``EPERM``;
* **a wall-clock kill**: the whole tree lives in its own pid namespace (``--unshare-pid
  --as-pid-1 --die-with-parent``); when the program ends, or is killed (time-out, output flood,
  the caller dying), the kernel kills every process it started, daemonised ones included,
  before the run returns;
* **a clean environment**: none of the caller's environment variables (``--clearenv``; bubblewrap
  itself is started with a minimal environment too); inside: ``PATH``, ``HOME``, ``LANG``,
  ``TMPDIR``, ``USER``;
* **bounded output**: stdout and stderr are kept up to ``max_output_kb`` each; a program writing
  more is killed (``killed_reason == "output_limit"``); after the run every pipe is read to EOF, so
  output written just before a clean exit is never lost;
* **a judge apart** (:meth:`Sandbox.run_judged`): an untrusted program and a trusted judge in two
  processes under two uids, joined by pipes, the verdict on a channel only the judge holds.

The sandboxed interpreter is the *system* Python (``/usr/bin/python3``): the unprivileged uid must
be able to read it, and the caller's venv is deliberately invisible.

Mechanisms: ``"bwrap"`` (bubblewrap: namespaces, read-only root, tmpfs, pid-namespace kill),
``"seccomp"`` (libseccomp's Python binding for the system Python, used to compile the filter),
``"setuid"`` (the caller can switch to the pool uids, i.e. runs as root) and ``"python"`` (the
interpreter) are required by default (:data:`DEFAULT_REQUIRED`).  ``"cgroup"`` -- one memory
(``memory_mb + 2 * tmp_size_mb``) and process cap for the whole tree, so that a swarm of
processes each under ``RLIMIT_AS`` cannot add up -- is used wherever the cgroup tree is writable,
and only logged when it is not.  Where a required one is missing, :class:`Sandbox` raises
:class:`SandboxUnavailableError` naming it and how to install it (``.ci/install-sandbox.sh``, or
``apt-get install bubblewrap python3-seccomp``).  To run with whatever isolation is available,
opt out explicitly with ``Sandbox(require=(...))``, ``Sandbox(allow_unsafe=True)`` or the
environment variable ``LLMGYM_ALLOW_UNSANDBOXED=1``; a :class:`SandboxWarning` names what is
missing.  Nothing degrades silently.

Modules (the package imports nothing but the standard library, so it also runs as a copy under any
interpreter -- keep it so):

* :mod:`~llmgym.sandbox.policy` -- the mechanisms, their defaults and install hints, the errors;
* :mod:`~llmgym.sandbox.limits` -- :class:`SandboxLimits`, :class:`SandboxResult`, the rlimits of a run
  and how a signal maps to the limit that sent it;
* :mod:`~llmgym.sandbox.bootstrap` -- the first program inside the sandbox (uid drop, limits, seccomp,
  the supervisor that reports the status): the boundary between privileges and untrusted code;
* :mod:`~llmgym.sandbox.judge_protocol` -- the judge protocol of judged runs (two uids, pipes, a private report);
* :mod:`~llmgym.sandbox.mounts` -- what the sandbox sees (bubblewrap's namespaces and mounts);
* :mod:`~llmgym.sandbox.probe` -- which mechanisms work here (:func:`check_sandbox`);
* :mod:`~llmgym.sandbox.uids` and :mod:`~llmgym.sandbox.cgroups` -- the uid pool and the per-tree caps;
* :mod:`~llmgym.sandbox.runner` -- the :class:`Sandbox` itself: start, feed, drain, kill;
* :mod:`~llmgym.sandbox.worker` -- :class:`SandboxWorker`, a persistent sandbox that imports once and
  answers each call in a fresh child (third-party scorers that read model text).

Example:
    >>> from llmgym.sandbox import run_python
    >>> r = run_python("print(sum(range(10)))")
    >>> r.returncode, r.stdout, r.passed
    (0, '45\\n', True)
    >>> run_python("import os; print(os.environ.get('HOME'), os.getcwd())").stdout
    '/tmp /tmp\\n'
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from .limits import SandboxLimits, SandboxResult
from .policy import (
    ALLOW_UNSANDBOXED_ENV,
    DEFAULT_PYTHON,
    DEFAULT_REQUIRED,
    DEFAULT_UID_RANGE,
    JUDGE_UID_OFFSET,
    MECHANISMS,
    NoCgroupWarning,
    SandboxError,
    SandboxUnavailableError,
    SandboxWarning,
)
from .probe import check_sandbox
from .runner import Sandbox, SandboxIsolation
from .uids import pids_of_uids
from .worker import SandboxWorker

__all__ = [
    "ALLOW_UNSANDBOXED_ENV",
    "DEFAULT_PYTHON",
    "DEFAULT_REQUIRED",
    "DEFAULT_UID_RANGE",
    "JUDGE_UID_OFFSET",
    "MECHANISMS",
    "NoCgroupWarning",
    "Sandbox",
    "SandboxError",
    "SandboxIsolation",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailableError",
    "SandboxWarning",
    "SandboxWorker",
    "check_sandbox",
    "default_sandbox",
    "pids_of_uids",
    "run_python",
]

_default: Sandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> Sandbox:
    """The shared :class:`Sandbox` behind :func:`run_python` (created on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Sandbox()
        return _default


def run_python(
    code: str,
    *,
    stdin: str | bytes = "",
    limits: SandboxLimits | None = None,
    files: Mapping[str, str | bytes] | None = None,
) -> SandboxResult:
    """Run ``code`` in the default :class:`Sandbox` (all mechanisms required).

    Example:
        >>> run_python("import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)").passed
        False
        >>> run_python("import os; print([os.path.exists(p) for p in ('/root', '/work', '/home')])").stdout
        '[False, False, False]\\n'
    """
    return default_sandbox().run_python(code, stdin=stdin, limits=limits, files=files)
