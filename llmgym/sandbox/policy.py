"""What the sandbox requires and promises: its mechanisms, defaults, and the errors it raises.

Every name here is re-exported by :mod:`llmgym.sandbox`. A mechanism missing where it is required
raises :class:`SandboxUnavailableError` naming it and how to install it; running with less is an
explicit opt-out (:data:`ALLOW_UNSANDBOXED_ENV`) that warns (:class:`SandboxWarning`).

Example:
    >>> from llmgym.sandbox.policy import DEFAULT_REQUIRED, MECHANISMS
    >>> set(DEFAULT_REQUIRED) <= set(MECHANISMS)
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

try:
    from llmgym.errors import LLMGymError, LLMGymWarning
except ImportError:  # this package copied on its own: it needs only the standard library (tests/sandbox)

    class LLMGymError(Exception):  # type: ignore[no-redef]
        """Stands in for llmgym's error base where only the sandbox package is present."""

    class LLMGymWarning(UserWarning):  # type: ignore[no-redef]
        """Stands in for llmgym's warning base where only the sandbox package is present."""

__all__ = [
    "ALLOW_UNSANDBOXED_ENV",
    "DEFAULT_PYTHON",
    "DEFAULT_REQUIRED",
    "DEFAULT_UID_RANGE",
    "INSTALL_HINTS",
    "JUDGE_UID_OFFSET",
    "MECHANISMS",
    "WORKDIR_IN_SANDBOX",
    "NoCgroupWarning",
    "SandboxError",
    "SandboxUnavailableError",
    "SandboxWarning",
]

#: Every isolation mechanism, in the order they are reported.
MECHANISMS: tuple[str, ...] = ("bwrap", "seccomp", "setuid", "python", "cgroup")

#: The mechanisms a :class:`Sandbox` requires unless told otherwise.  ``"cgroup"`` (one memory
#: and process cap for the whole tree) is used wherever it works, but it is not required: many
#: containers do not delegate cgroups.
DEFAULT_REQUIRED: tuple[str, ...] = ("bwrap", "seccomp", "setuid", "python")

#: Environment variable that, set to ``1``, lets code run with whatever isolation is available.
ALLOW_UNSANDBOXED_ENV = "LLMGYM_ALLOW_UNSANDBOXED"

DEFAULT_PYTHON = "/usr/bin/python3"
DEFAULT_UID_RANGE = (60000, 60064)  # half-open: uids 60000..60063
#: A judged run's judge runs as its candidate's uid + this offset (61000..61063 by default).
JUDGE_UID_OFFSET = 1000

INSTALL_HINTS = {
    "bwrap": "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`), and make sure "
    "namespaces are allowed (in a container: run it with --privileged or a seccomp/apparmor "
    "profile that allows unshare)",
    "seccomp": "install the libseccomp binding for the system Python "
    "(Debian/Ubuntu: `apt-get install python3-seccomp`)",
    "setuid": "run as root (the sandbox drops to an unprivileged uid from a pool, "
    "so that RLIMIT_NPROC is enforced and the code cannot touch the caller's files)",
    "python": "install a system Python readable by every user (`apt-get install python3`) "
    "or pass Sandbox(python=...)",
    "cgroup": "optional: run as root where the cgroup tree is writable (cgroup v1 memory and "
    "pids controllers, or v2 with memory and pids delegated); without it memory is capped "
    "per process only",
}

#: The private tmpfs inside the sandbox: working directory, ``HOME`` and ``TMPDIR`` of every run.
WORKDIR_IN_SANDBOX = "/tmp"


class SandboxError(LLMGymError, RuntimeError):
    """The sandbox itself failed (could not start, bad arguments) -- not the sandboxed program."""


class SandboxUnavailableError(SandboxError):
    """A required isolation mechanism is missing on this machine.

    ``missing`` lists the mechanism names (see :data:`MECHANISMS`); the message says how to
    install each one and how to opt out.
    """

    def __init__(
        self, missing: Sequence[str], details: Mapping[str, str] | None = None
    ):
        self.missing = tuple(missing)
        details = dict(details or {})
        lines = [f"cannot sandbox untrusted code: missing {', '.join(self.missing)}"]
        for m in self.missing:
            why = f" ({details[m]})" if details.get(m) else ""
            lines.append(f"  - {m}{why}: {INSTALL_HINTS.get(m, '')}")
        lines.append(
            "  Install everything with `sudo bash .ci/install-sandbox.sh` "
            "(apt-get install bubblewrap python3-seccomp). To run with the isolation that is "
            f"available (UNSAFE for untrusted code), pass Sandbox(allow_unsafe=True), or "
            f"Sandbox(require=...) without them, or set {ALLOW_UNSANDBOXED_ENV}=1."
        )
        super().__init__("\n".join(lines))


class SandboxWarning(LLMGymWarning):
    """Code runs with less isolation than the full sandbox (an explicit opt-out is in force)."""


class NoCgroupWarning(SandboxWarning):
    """The sandbox runs without its cgroup (once per process): what is lost and how to get it back.

    Without a cgroup, memory is capped per process (``RLIMIT_AS``) and processes per uid
    (``RLIMIT_NPROC``), so one run or one worker call may hold ``memory_mb`` in each of its
    ``max_processes`` processes; nothing caps the tree's total memory (tmpfs included), and a
    worker's calls are ended by its namespace sweep instead of one ``cgroup.kill``.
    """


#: What :class:`NoCgroupWarning` says after the reason the probe gave.
NO_CGROUP_MESSAGE = (
    "the sandbox has no cgroup here, so it is weaker: memory is capped per process only -- a run or a "
    "worker call may hold memory_mb in each of its max_processes processes, and nothing caps the whole "
    "tree's memory (its tmpfs included) in one place. To get the cap back, run as root where the cgroup "
    "tree is writable (cgroup v1 memory and pids controllers, or cgroup v2 with memory and pids delegated; "
    "in a container, one started with a writable /sys/fs/cgroup, e.g. `docker run --privileged`); "
    "`llmgym.sandbox.check_sandbox()['why']['cgroup']` says what failed"
)
