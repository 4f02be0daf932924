"""Resource limits of a sandboxed run, the result it returns, and how a limit shows in that result.

Example:
    >>> from llmgym.sandbox.limits import SandboxLimits, rlimits
    >>> [name for name, _, _ in rlimits(SandboxLimits(), nproc=True)][:3]
    ['RLIMIT_CORE', 'RLIMIT_CPU', 'RLIMIT_AS']
"""

from __future__ import annotations

import dataclasses
import math
import signal

__all__ = ["SandboxLimits", "SandboxResult", "rlimits", "signal_reason"]

# The largest value each limit accepts: past these the kernel's own types overflow (RLIMIT_CPU is a
# whole number of seconds, tmpfs sizes are bytes) or the "limit" would not limit anything.
_LIMIT_MAX = {
    "cpu_seconds": 86_400,
    "wall_seconds": 86_400,
    "memory_mb": 1 << 20,
    "max_processes": 4096,
    "max_file_mb": 1 << 20,
    "max_open_files": 1 << 16,
    "tmp_size_mb": 1 << 20,
    "max_output_kb": 1 << 20,
}


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run.

    Attributes:
        cpu_seconds: CPU time of each process (``RLIMIT_CPU``; SIGXCPU, then SIGKILL a second later).
        wall_seconds: wall-clock time of the whole run, start-up included; then everything is killed.
        memory_mb: address space of each process (``RLIMIT_AS``).
        max_processes: processes + threads of the sandbox uid (``RLIMIT_NPROC``; needs ``setuid``).
        max_file_mb: size of any one file written (``RLIMIT_FSIZE``).
        max_open_files: file descriptors per process (``RLIMIT_NOFILE``).
        tmp_size_mb: size of the private tmpfs (working directory, ``/tmp``, ``HOME``).
        max_output_kb: bytes kept of stdout and of stderr (each); writing more kills the run.

    Example:
        >>> SandboxLimits(cpu_seconds=2, wall_seconds=5).memory_mb
        512
    """

    cpu_seconds: float = 10.0
    wall_seconds: float = 20.0
    memory_mb: int = 512
    max_processes: int = 16
    max_file_mb: int = 16
    max_open_files: int = 64
    tmp_size_mb: int = 64
    max_output_kb: int = 64

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise ValueError(
                    f"SandboxLimits.{f.name} must be a positive number, got {v!r}"
                )
            if not math.isfinite(v) or v > _LIMIT_MAX[f.name]:
                raise ValueError(
                    f"SandboxLimits.{f.name} must be finite and at most {_LIMIT_MAX[f.name]}, got {v!r} "
                    "(a limit that cannot hold is no limit)"
                )
        if self.memory_mb < 32:
            raise ValueError(
                "SandboxLimits.memory_mb must be at least 32 (the interpreter needs it)"
            )
        if self.max_open_files < 16:
            raise ValueError("SandboxLimits.max_open_files must be at least 16")


@dataclasses.dataclass
class SandboxResult:
    """Outcome of one sandboxed run.

    ``returncode`` follows :mod:`subprocess`: the exit status, or ``-N`` when signal ``N`` ended the
    program.  A program "passes" (:attr:`passed`) exactly when it exited with 0 and was not killed,
    which is what code-evaluation environments want: append the tests (asserts) to the program.

    Attributes:
        returncode: exit status, or minus the signal number.
        stdout, stderr: decoded (UTF-8, errors replaced) and capped at ``max_output_kb`` each.
        timed_out: the wall-clock limit was hit.
        killed: ended by a signal (a limit, a time-out, an output flood, or a crash).
        killed_reason: ``"timeout"``, ``"cpu_limit"``, ``"memory_limit"`` (the tree's cgroup
            cap; a single process over ``memory_mb`` gets ``MemoryError`` instead),
            ``"output_limit"``, ``"file_size_limit"`` or ``"signal:NAME"``; ``None`` when the
            program exited by itself (a sandbox killed from outside raises ``SandboxError``).
        duration_s: wall-clock seconds of the run, sandbox start-up included.
        cpu_s: CPU seconds used by the program (user + system, waited-for children included).
        max_rss_mb: peak resident memory of the largest process.
        stdout_truncated, stderr_truncated: output was cut at the cap.
        mechanisms: the isolation mechanisms that were in force.
        uid: the uid the program ran as.
        judge_report: a judged run's (:meth:`Sandbox.run_judged`) report, as the judge wrote it on its
            private channel (at most 16 KiB); ``None`` for a plain run.
        candidate_returncode: a judged run's candidate process status when it ended before the
            judge did (exit status, or minus the signal); ``None`` otherwise.

    Example:
        >>> from llmgym.sandbox import run_python
        >>> r = run_python("import sys; print('out'); sys.exit(3)")
        >>> r.returncode, r.passed, r.killed, r.stdout
        (3, False, False, 'out\\n')
    """

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    killed: bool = False
    killed_reason: str | None = None
    duration_s: float = 0.0
    cpu_s: float | None = None
    max_rss_mb: float | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    mechanisms: tuple[str, ...] = ()
    uid: int | None = None
    judge_report: str | None = None
    candidate_returncode: int | None = None

    @property
    def passed(self) -> bool:
        """True when the program exited with status 0 and was not killed."""
        return self.returncode == 0 and not self.killed and not self.timed_out


def rlimits(lim: SandboxLimits, nproc: bool) -> list[list]:
    """``[name, soft, hard]`` of every ``setrlimit`` a sandboxed process gets under ``lim``.

    ``nproc``: also cap processes (``RLIMIT_NPROC``) -- only meaningful, and only set, when the
    process runs under a uid of its own (for root, or a uid shared with the caller, it is not).
    """
    cpu = max(1, math.ceil(lim.cpu_seconds))
    rl = [
        ["RLIMIT_CORE", 0, 0],
        ["RLIMIT_CPU", cpu, cpu + 1],
        ["RLIMIT_AS", int(lim.memory_mb) << 20, int(lim.memory_mb) << 20],
        ["RLIMIT_FSIZE", int(lim.max_file_mb * (1 << 20)), int(lim.max_file_mb * (1 << 20))],
        ["RLIMIT_NOFILE", int(lim.max_open_files), int(lim.max_open_files)],
    ]
    if nproc:
        rl.append(["RLIMIT_NPROC", int(lim.max_processes), int(lim.max_processes)])
    return rl


def signal_reason(sig: int, cpu_s: float | None, lim: SandboxLimits) -> str:
    """Why a signal ended a sandboxed process: a CPU or file-size limit, or the signal's name."""
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s is not None
                                 and cpu_s >= math.ceil(lim.cpu_seconds) - 0.05):
        return "cpu_limit"  # SIGXCPU, or SIGKILL once the CPU time reached the limit
    if sig == signal.SIGXFSZ:
        return "file_size_limit"
    try:
        return "signal:" + signal.Signals(sig).name
    except ValueError:
        return f"signal:{sig}"
