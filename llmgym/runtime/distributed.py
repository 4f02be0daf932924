"""Data-parallel helpers over ``torch.distributed`` (what ``torchrun`` sets up), no home-made cluster code.

Under ``torchrun --nproc_per_node N script.py`` every process reads ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` from its environment. :func:`init_distributed`
turns that into a process group (``nccl`` when CUDA is available, ``gloo`` on CPU); everything else
here is a thin, well-named wrapper that also works — as a no-op — in a plain single process:

* who am I: :func:`rank`, :func:`world_size`, :func:`local_rank`, :func:`is_main_process`,
  :func:`is_distributed`;
* splitting work: :func:`shard_range`, :func:`shard` (contiguous blocks, so groups of samples stay
  whole when tasks are sharded);
* counts: :func:`all_reduce_sum` (e.g. the global number of policy tokens, the token-mean
  denominator), :func:`all_reduce_mean`, :func:`all_gather_ints`;
* models: :func:`wrap_ddp`, :func:`apply_fsdp` (FSDP2 ``fully_shard``), :func:`is_fsdp_module`,
  :func:`broadcast_parameters`, :func:`average_gradients`.

The agents (``llmgym.agents.base.Agent``) use these to run data-parallel: each rank collects its share of
the tasks, losses are scaled so the gradient is the single-process gradient of the global batch,
and DDP (or FSDP) averages gradients across ranks. See ``docs/scale.md``.

Example (single process: every helper degrades gracefully):
    >>> from llmgym.runtime import distributed as dist
    >>> dist.is_distributed(), dist.rank(), dist.world_size()
    (False, 0, 1)
    >>> dist.shard(list(range(5)), rank=1, world_size=2)
    [3, 4]
    >>> dist.all_reduce_sum(3.0)
    3.0
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable, Sequence
from typing import TypeVar

import torch

__all__ = [
    "all_gather_ints",
    "all_reduce_mean",
    "all_reduce_sum",
    "apply_fsdp",
    "average_gradients",
    "barrier",
    "broadcast_parameters",
    "destroy",
    "device",
    "init_distributed",
    "is_distributed",
    "is_fsdp_module",
    "is_main_process",
    "local_rank",
    "rank",
    "shard",
    "shard_range",
    "world_size",
    "wrap_ddp",
]

T = TypeVar("T")


def _dist():
    import torch.distributed as dist

    return dist


def _initialized() -> bool:
    dist = _dist()
    return dist.is_available() and dist.is_initialized()


def init_distributed(backend: str | None = None, timeout_s: float = 600.0) -> bool:
    """Join the process group described by torchrun's environment; return whether it is distributed.

    Does nothing (and returns ``False``) when ``WORLD_SIZE`` is unset or 1, so the same script runs
    as ``python script.py`` and as ``torchrun --nproc_per_node N script.py``. The backend defaults
    to ``nccl`` when CUDA is available (each process then uses GPU ``LOCAL_RANK``) and ``gloo``
    otherwise. Calling it twice is harmless.

    Example:
        >>> import os
        >>> from llmgym.runtime.distributed import init_distributed
        >>> "WORLD_SIZE" in os.environ or init_distributed() is False
        True
    """
    if _initialized():
        return world_size() > 1
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return False
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(
            f"WORLD_SIZE={size} but {missing} are not set: launch with torchrun "
            f"(e.g. `torchrun --nproc_per_node {size} script.py`), which sets them"
        )
    cuda = torch.cuda.is_available()
    backend = backend or ("nccl" if cuda else "gloo")
    if backend == "nccl":
        if not cuda:
            raise RuntimeError("backend 'nccl' needs CUDA GPUs; use backend='gloo' on CPU")
        torch.cuda.set_device(local_rank())
    _dist().init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return world_size() > 1


def destroy() -> None:
    """Leave the process group (call at the end of a torchrun script); a no-op when there is none."""
    if _initialized():
        _dist().destroy_process_group()


def is_distributed() -> bool:
    """True inside an initialised process group with more than one process."""
    return _initialized() and _dist().get_world_size() > 1


def rank() -> int:
    """This process's global rank (0 without a process group)."""
    return _dist().get_rank() if _initialized() else 0


def world_size() -> int:
    """Number of processes (1 without a process group)."""
    return _dist().get_world_size() if _initialized() else 1


def local_rank() -> int:
    """Rank within this node: ``LOCAL_RANK`` (set by torchrun), else 0 — the GPU index to use."""
    return int(os.environ.get("LOCAL_RANK", "0"))


_current_rank, _current_world_size = rank, world_size  # shard_range's arguments shadow the names


def is_main_process() -> bool:
    """Rank 0 (the one that logs, saves checkpoints and writes files)."""
    return rank() == 0


def barrier() -> None:
    """Wait for every rank (a no-op in a single process)."""
    if is_distributed():
        _dist().barrier()


def device() -> torch.device:
    """The device collectives run on: this rank's GPU under NCCL, else the CPU."""
    if _initialized() and _dist().get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def shard_range(n: int, rank: int | None = None, world_size: int | None = None) -> range:
    """Indices ``[start, stop)`` of rank ``rank``'s contiguous block of ``n`` items.

    Blocks differ in size by at most one (the first ``n % world_size`` ranks get one more).

    Example:
        >>> from llmgym.runtime.distributed import shard_range
        >>> [list(shard_range(5, r, 2)) for r in range(2)]
        [[0, 1, 2], [3, 4]]
    """
    r = _current_rank() if rank is None else rank
    w = _current_world_size() if world_size is None else world_size
    if not 0 <= r < w:
        raise ValueError(f"rank must be in [0, {w}), got {r}")
    base, extra = divmod(n, w)
    start = r * base + min(r, extra)
    return range(start, start + base + (1 if r < extra else 0))


def shard(items: Sequence[T], rank: int | None = None, world_size: int | None = None) -> list[T]:
    """This rank's contiguous block of ``items`` (all of them in a single process).

    Example:
        >>> from llmgym.runtime.distributed import shard
        >>> shard(["a", "b", "c", "d"], rank=0, world_size=2)
        ['a', 'b']
    """
    return [items[i] for i in shard_range(len(items), rank, world_size)]


def all_reduce_sum(value, *, dtype: torch.dtype = torch.float64):
    """Sum of ``value`` over ranks: a number gives a float, a tensor gives a tensor (on its device).

    Counts (tokens, sequences) are reduced in float64 so they stay exact.

    Example:
        >>> import torch
        >>> from llmgym.runtime.distributed import all_reduce_sum
        >>> all_reduce_sum(torch.tensor([2.0, 5.0]))
        tensor([2., 5.])
    """
    is_tensor = isinstance(value, torch.Tensor)
    if not is_distributed():
        return value.clone() if is_tensor else float(value)
    if is_tensor:
        out = value.detach().to(device=device(), dtype=dtype).clone()
    else:
        out = torch.tensor([float(value)], dtype=dtype, device=device())
    _dist().all_reduce(out, op=_dist().ReduceOp.SUM)
    if is_tensor:
        return out.to(device=value.device, dtype=value.dtype)
    return float(out.item())


def all_reduce_mean(values: dict[str, float]) -> dict[str, float]:
    """Mean over ranks of each entry of a dict of numbers (every rank must pass the same keys).

    Example:
        >>> from llmgym.runtime.distributed import all_reduce_mean
        >>> all_reduce_mean({"loss": 1.5})
        {'loss': 1.5}
    """
    if not is_distributed() or not values:
        return dict(values)
    keys = sorted(values)
    total = all_reduce_sum(torch.tensor([float(values[k]) for k in keys], dtype=torch.float64))
    return {k: float(v) / world_size() for k, v in zip(keys, total.tolist())}


def all_gather_ints(value: int) -> list[int]:
    """Every rank's ``value`` (e.g. local batch sizes), in rank order.

    Example:
        >>> from llmgym.runtime.distributed import all_gather_ints
        >>> all_gather_ints(7)
        [7]
    """
    if not is_distributed():
        return [int(value)]
    out = torch.zeros(world_size(), dtype=torch.long, device=device())
    out[rank()] = int(value)
    _dist().all_reduce(out, op=_dist().ReduceOp.SUM)
    return [int(v) for v in out.tolist()]


def wrap_ddp(model: torch.nn.Module, **kwargs) -> torch.nn.Module:
    """``DistributedDataParallel(model)`` on this rank's device (broadcasts rank 0's weights).

    DDP *averages* gradients over ranks during ``backward``; the agents compensate by scaling each
    rank's loss (see ``llmgym.agents.base.Agent.update``).
    """
    from torch.nn.parallel import DistributedDataParallel

    param = next(model.parameters())
    if param.device.type == "cuda":
        kwargs.setdefault("device_ids", [param.device.index])
    return DistributedDataParallel(model, **kwargs)


def is_fsdp_module(model: torch.nn.Module) -> bool:
    """Whether ``model`` is sharded by FSDP (FSDP2 ``fully_shard`` or FSDP1's wrapper)."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    if isinstance(model, FullyShardedDataParallel):
        return True
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch < 2.6
        return False
    return isinstance(model, FSDPModule)


def apply_fsdp(model: torch.nn.Module, layer_class_suffix: str = "DecoderLayer", **kwargs) -> torch.nn.Module:
    """Shard ``model`` in place with FSDP2 (``torch.distributed.fsdp.fully_shard``) and return it.

    Each transformer block (every submodule whose class name ends with ``layer_class_suffix``, e.g.
    ``LlamaDecoderLayer``, ``Qwen2DecoderLayer``) becomes its own FSDP unit, then the root. The model
    object stays the same, so an :class:`~llmgym.engines.HFEngine` built on it keeps working (its
    forward passes all-gather the shards). Use it when the model plus optimiser state does not fit
    one GPU; DDP is simpler and faster otherwise. Needs torch >= 2.6. Tested here on CPU with gloo
    and two processes (``tests/agents/test_distributed.py``: same update as one process); not yet on GPUs.
    """
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError as err:  # pragma: no cover - torch < 2.6
        raise ImportError("apply_fsdp needs torch >= 2.6 (torch.distributed.fsdp.fully_shard)") from err
    for module in list(model.modules()):
        if type(module).__name__.endswith(layer_class_suffix):
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    # FSDP2 allocates its all-gather buffers at the first forward. If that forward ran inside
    # torch.inference_mode (as HFEngine's generation does), they would be inference tensors and the
    # next training forward could not write into them. So run one tiny training iteration first
    # (forward + backward of a zero loss; a no_grad forward is not enough: it leaves the root
    # FSDP group without its post-backward reduction, and the root's parameters would never move).
    out = model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device()))
    logits = out.logits if hasattr(out, "logits") else out[0]
    (logits.float().sum() * 0.0).backward()
    for p in model.parameters():
        p.grad = None
    return model


def broadcast_parameters(params: Iterable[torch.nn.Parameter], src: int = 0) -> None:
    """Copy rank ``src``'s values of ``params`` to every rank (for parameters outside DDP's module)."""
    if not is_distributed():
        return
    for p in params:
        buf = p.data.to(device())
        _dist().broadcast(buf, src=src)
        if buf.data_ptr() != p.data.data_ptr():
            p.data.copy_(buf)


def average_gradients(params: Iterable[torch.nn.Parameter]) -> None:
    """Average ``.grad`` over ranks, as DDP does (for parameters DDP does not own, e.g. a value head)."""
    if not is_distributed():
        return
    size = world_size()
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        buf = p.grad.to(device())
        _dist().all_reduce(buf, op=_dist().ReduceOp.SUM)
        buf /= size
        if buf.data_ptr() != p.grad.data_ptr():
            p.grad.copy_(buf)
