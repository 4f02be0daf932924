"""CPU threads for torch: a sane count on small machines, and the user's choice first.

On a CPU torch runs each operation on a team of OpenMP threads, one per core by default. A small
model's matrices are too small to gain from a team, and on a busy machine the team's threads spin
while they wait for each other: on a 2-core machine with other jobs running,
``examples/train_grpo.py`` took 244 s with torch's default 2 threads and 13 s with one.

:func:`set_torch_threads` picks the count, in this order:

1. an explicit count: ``requested`` (``--threads N`` on the command line), else ``OMP_NUM_THREADS``
   when the user set it in the environment;
2. else 1 thread for a model under :data:`SMALL_MODEL_PARAMETERS` on the CPU;
3. else torch's own default (bigger models, GPUs).

:func:`passive_openmp` makes idle OpenMP threads sleep instead of spin (``OMP_WAIT_POLICY=PASSIVE``
unless the user set it). OpenMP reads that variable once, when torch loads it, so it only takes
effect before ``import torch``: the ``llmgym`` command calls it first thing, before any module that
imports torch. Neither function imports torch at module level.

Example:
    >>> from llmgym.runtime.threads import chosen_thread_count
    >>> chosen_thread_count(num_parameters=1_000_000, environ={})
    1
    >>> chosen_thread_count(num_parameters=1_000_000, requested=4, environ={"OMP_NUM_THREADS": "2"})
    4
    >>> chosen_thread_count(num_parameters=1_000_000, environ={"OMP_NUM_THREADS": "3"})
    3
    >>> chosen_thread_count(num_parameters=500_000_000, environ={}) is None  # torch's default
    True
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

__all__ = ["SMALL_MODEL_PARAMETERS", "chosen_thread_count", "cpu_has_fast_bf16", "passive_openmp", "set_torch_threads"]

SMALL_MODEL_PARAMETERS = 20_000_000
"""Below this size a model on the CPU runs on one thread unless the user asks for more."""


def passive_openmp() -> bool:
    """Let idle OpenMP threads sleep (``OMP_WAIT_POLICY=PASSIVE``) unless the user chose a policy;
    return whether it can still take effect (torch not imported yet in this process).

    Example:
        >>> import os
        >>> from llmgym.runtime.threads import passive_openmp
        >>> _ = passive_openmp()
        >>> os.environ["OMP_WAIT_POLICY"] in ("PASSIVE", "passive", "ACTIVE", "active")
        True
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return "torch" not in sys.modules


def _env_thread_count(environ: Mapping[str, str]) -> int | None:
    """``OMP_NUM_THREADS`` as a count >= 1 (its first entry: OpenMP allows a list), else ``None``."""
    raw = environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    try:
        count = int(raw)
    except ValueError:
        return None
    return count if count >= 1 else None


def chosen_thread_count(num_parameters: int | None = None, *, on_cpu: bool = True, requested: int | None = None,
                        environ: Mapping[str, str] | None = None) -> int | None:
    """The thread count :func:`set_torch_threads` sets, or ``None`` to keep torch's default.

    ``requested`` wins, then ``OMP_NUM_THREADS`` in ``environ`` (default ``os.environ``), then 1 for
    a model of fewer than :data:`SMALL_MODEL_PARAMETERS` parameters on the CPU.
    """
    if requested is not None:
        if requested < 1:
            raise ValueError(f"the thread count must be >= 1, got {requested}")
        return requested
    from_env = _env_thread_count(os.environ if environ is None else environ)
    if from_env is not None:
        return from_env
    if on_cpu and num_parameters is not None and num_parameters < SMALL_MODEL_PARAMETERS:
        return 1
    return None


def set_torch_threads(model=None, *, requested: int | None = None, num_parameters: int | None = None) -> int:
    """Set torch's CPU threads for running ``model`` (or a model of ``num_parameters``) by the rule
    of :func:`chosen_thread_count`; return the count now in use.

    Example:
        >>> import torch
        >>> from llmgym.runtime.threads import set_torch_threads
        >>> before = torch.get_num_threads()
        >>> set_torch_threads(requested=1)
        1
        >>> torch.set_num_threads(before)
    """
    import torch

    on_cpu = True
    if model is not None:
        first = next(model.parameters(), None)
        on_cpu = first is None or first.device.type == "cpu"
        num_parameters = sum(p.numel() for p in model.parameters())
    count = chosen_thread_count(num_parameters, on_cpu=on_cpu, requested=requested)
    if count is not None:
        torch.set_num_threads(count)
    return torch.get_num_threads()


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU has the instructions torch's bf16 kernels use (oneDNN's own check: AVX-512 with BW/VL/DQ,
    AVX-512 BF16, AMX). Without them (AVX2 only) bf16 is emulated: 3–5× slower than float32 in every engine,
    measured on this project's 2-core AMD EPYC (docs/scale.md, "bf16 on a CPU").

    Example:
        >>> from llmgym.runtime.threads import cpu_has_fast_bf16
        >>> isinstance(cpu_has_fast_bf16(), bool)
        True
    """
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch without the op: the kernel's own flags
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                flags = set(f.read().split())
        except OSError:
            return True  # unknown: say nothing
        return bool(flags & {"avx512_bf16", "amx_bf16", "avx512bw"})
