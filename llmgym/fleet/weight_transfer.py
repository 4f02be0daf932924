"""Weights from the learner to rollout servers over a ``torch.distributed`` gloo group (torch only).

Both ends of :class:`~llmgym.fleet.fleet_engine.FleetEngine`'s weight sync use this module: the learner
(:class:`GlooSender`) and, inside each vLLM server, the weight-transfer backend that
``llmgym serve`` registers with vLLM (:mod:`llmgym.fleet.vllm_plugin`). The protocol is vLLM's
own (``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
``/finish_weight_update``): this module is only its data plane on CPUs, where vLLM's NCCL and
CUDA-IPC backends cannot run.

* **One group per server**: the learner is rank 0 and the server's workers ranks 1..W (W = its
  tensor-parallel × pipeline-parallel size), so a server that dies breaks only its own group.
  The learner owns the rendezvous (:mod:`llmgym.fleet.rendezvous`) on a socket it bound itself (no
  port race): only peers holding the group's nonce (sent in the signed init request) join it, and
  it closes as soon as the group has formed.
* **Bytes in buckets**: tensors travel as their raw bytes (any dtype: gloo needs none of
  bfloat16's arithmetic), packed in the state dict's order into buckets of at most
  ``bucket_bytes`` (a tensor larger than that is a bucket of its own), one broadcast per bucket.
  Both ends derive the same buckets from the same metadata (:func:`plan_buckets`).

Example:
    >>> import torch
    >>> from llmgym.fleet.weight_transfer import pack_bucket, plan_buckets, unpack_bucket
    >>> names = ["a", "b", "c"]
    >>> tensors = [torch.ones(2, 3), torch.arange(4, dtype=torch.int64), torch.zeros(5, dtype=torch.bfloat16)]
    >>> meta = [(n, t.dtype, tuple(t.shape)) for n, t in zip(names, tensors)]
    >>> plan_buckets(meta, bucket_bytes=56)  # 24 + 32 bytes, then 10
    [[0, 1], [2]]
    >>> buffer = pack_bucket([tensors[0], tensors[1]])
    >>> [(n, t.tolist()) for n, t in unpack_bucket(buffer, meta[:2])][1]
    ('b', [0, 1, 2, 3])
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterator, Sequence

import torch

from llmgym.errors import LLMGymError

__all__ = [
    "ADAPTER_PATH_PREFIX",
    "BACKEND_NAME",
    "DEFAULT_BUCKET_BYTES",
    "GlooSender",
    "TransferError",
    "local_address_towards",
    "metadata",
    "open_group",
    "pack_bucket",
    "plan_buckets",
    "receive_named_tensors",
    "unpack_bucket",
]

ADAPTER_PATH_PREFIX = "/llmgym-in-memory/"
"""The ``lora_path`` under which a rollout server's worker finds an adapter the learner sent (in memory; no
such directory exists, so vLLM's own loader finds nothing there)."""
BACKEND_NAME = "llmgym_gloo"
"""The name ``llmgym serve`` registers its backend under in vLLM's ``WeightTransferEngineFactory``."""
DEFAULT_BUCKET_BYTES = 256 << 20
"""Largest broadcast, in bytes (a bigger tensor goes alone): 256 MiB bounds the extra memory at each end."""

Meta = tuple[str, torch.dtype, tuple[int, ...]]


class TransferError(LLMGymError, RuntimeError):
    """The weight transfer could not start or was cut (a peer died, a time-out, mismatched metadata)."""


def _nbytes(dtype: torch.dtype, shape: Sequence[int]) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count * torch.empty((), dtype=dtype).element_size()


def plan_buckets(meta: Sequence[Meta], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[list[int]]:
    """Indices of ``meta`` (``(name, dtype, shape)``) grouped into broadcasts, in order.

    Example:
        >>> import torch
        >>> from llmgym.fleet.weight_transfer import plan_buckets
        >>> plan_buckets([("w", torch.float32, (10,)), ("b", torch.float32, (2,))], bucket_bytes=16)
        [[0], [1]]
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    buckets: list[list[int]] = []
    size = 0
    for i, (_, dtype, shape) in enumerate(meta):
        n = _nbytes(dtype, shape)
        if buckets and size + n <= bucket_bytes:
            buckets[-1].append(i)
            size += n
        else:
            buckets.append([i])
            size = n
    return buckets


def pack_bucket(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors' bytes, one after the other, as one flat ``uint8`` CPU tensor."""
    parts = [t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    return torch.cat(parts) if len(parts) > 1 else parts[0].clone()


def unpack_bucket(buffer: torch.Tensor, meta: Sequence[Meta]) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` views of ``buffer`` laid out as :func:`pack_bucket` packed them."""
    out, offset = [], 0
    for name, dtype, shape in meta:
        n = _nbytes(dtype, shape)
        out.append((name, buffer[offset:offset + n].view(dtype).reshape(shape)))
        offset += n
    if offset != buffer.numel():
        raise TransferError(f"a weight bucket holds {buffer.numel()} bytes but its metadata describes {offset}")
    return out


def local_address_towards(host: str, port: int = 9) -> str:
    """This machine's address on the interface that routes to ``host`` (no packet is sent).

    Example:
        >>> from llmgym.fleet.weight_transfer import local_address_towards
        >>> local_address_towards("127.0.0.1")
        '127.0.0.1'
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


def open_group(master_address: str, master_port: int, rank: int, world_size: int, *, timeout_s: float, nonce: str,
               listener: socket.socket | None = None, local_address: str | None = None):
    """A gloo process group of ``world_size`` outside torch's default group (a vLLM worker has its own).

    Rank 0 hosts the rendezvous (:class:`~llmgym.fleet.rendezvous.RendezvousHost` on ``listener``, a socket it
    bound and listens on, which it owns from then on); the others connect to ``master_address:master_port``.
    Every peer proves it holds ``nonce`` (the learner's, from the signed init request); once the group has
    formed the rendezvous is closed (rank 0 waits until every peer says so). ``local_address`` is the address
    gloo binds here (default: the interface that routes to the master). Returns ``(group, store)``; keep the
    store object as long as the group (gloo holds it; it refuses every request once closed)."""
    import torch.distributed as dist

    from llmgym.fleet.rendezvous import RendezvousClient, RendezvousError, RendezvousHost

    timeout = datetime.timedelta(seconds=timeout_s)
    host = store = None
    try:
        if rank == 0:
            if listener is None:
                raise ValueError("rank 0 hosts the rendezvous: pass the socket it listens on")
            host = RendezvousHost(listener, nonce, peers=world_size - 1, timeout_s=timeout_s)
            store = host.store
        else:
            store = RendezvousClient(master_address, master_port, nonce, timeout_s=timeout_s)
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        address = local_address or local_address_towards(master_address, master_port)
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
        group = dist.ProcessGroupGloo(dist.PrefixStore("llmgym-weights", store), rank, world_size, options)
        if host is not None:
            host.wait_joined()  # every worker's mesh is whole: nobody needs the rendezvous any more
        else:
            store.joined()
    except (RuntimeError, OSError) as exc:
        if isinstance(store, RendezvousClient):
            store.close()
        raise TransferError(f"the weight-transfer group (rank {rank} of {world_size}, rendezvous "
                            f"{master_address}:{master_port}) did not form: {_one_line(exc)}") from None
    finally:
        if host is not None:
            host.close()
    return group, store


def receive_named_tensors(group, meta: Sequence[Meta], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """On a receiving rank: yield each bucket's ``(name, tensor)`` pairs as its broadcast from rank 0 lands."""
    for indices in plan_buckets(meta, bucket_bytes):
        part = [meta[i] for i in indices]
        buffer = torch.empty(sum(_nbytes(d, s) for _, d, s in part), dtype=torch.uint8)
        try:
            group.broadcast(buffer, 0).wait()
        except RuntimeError as exc:
            raise TransferError(f"the learner's weights stopped arriving: {_one_line(exc)}") from None
        yield unpack_bucket(buffer, part)


class GlooSender:
    """The learner's end of one server's weight-transfer group (rank 0).

    :meth:`rendezvous` binds a port on ``address`` and returns the init info the server's
    ``/init_weight_transfer_engine`` takes; :meth:`join` completes the group (call it while the
    server joins); :meth:`send` broadcasts ``(name, tensor)`` pairs in :func:`plan_buckets`' buckets.

    Example:
        >>> from llmgym.fleet.weight_transfer import GlooSender
        >>> sender = GlooSender("127.0.0.1", world_size=2, timeout_s=5)
        >>> info = sender.rendezvous()
        >>> sorted(info), info["rank_offset"], info["world_size"]
        (['bucket_bytes', 'master_address', 'master_port', 'nonce', 'rank_offset', 'timeout_s', 'world_size'], 1, 2)
        >>> sender.close()
    """

    def __init__(self, address: str, world_size: int, *, timeout_s: float = 120.0,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        if world_size < 2:
            raise ValueError(f"a weight-transfer group needs the learner and >= 1 worker, got world_size={world_size}")
        self.address, self.world_size, self.timeout_s, self.bucket_bytes = address, world_size, timeout_s, bucket_bytes
        self.group = self._store = self._socket = None
        self.nonce: str | None = None
        """The rendezvous nonce of the group being formed (fresh per :meth:`rendezvous`)."""
        self.bytes_sent = 0
        """Bytes the last :meth:`send` broadcast (the buckets' sizes)."""

    def rendezvous(self) -> dict:
        """Listen for the server's workers; the ``init_info`` to send to its ``/init_weight_transfer_engine`` (a
        signed request: it carries the group's fresh nonce, which only invited peers then hold)."""
        from llmgym.fleet.rendezvous import new_nonce

        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((self.address, 0))
        self._socket.listen(self.world_size)
        self.nonce = new_nonce()
        return {"master_address": self.address, "master_port": self._socket.getsockname()[1], "rank_offset": 1,
                "world_size": self.world_size, "timeout_s": self.timeout_s, "bucket_bytes": self.bucket_bytes,
                "nonce": self.nonce}

    def join(self) -> None:
        """Form the group (blocks until every worker of the server has joined, or the time-out)."""
        if self._socket is None:
            raise RuntimeError("GlooSender.join needs a rendezvous first (one join per rendezvous)")
        listener, self._socket = self._socket, None  # the rendezvous owns it from here on, and closes it
        self.group, self._store = open_group(self.address, listener.getsockname()[1], 0, self.world_size,
                                             timeout_s=self.timeout_s, nonce=self.nonce, listener=listener,
                                             local_address=self.address)

    def send(self, pairs: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Broadcast the tensors (the server receives the same buckets, planned from the same metadata)."""
        if self.group is None:
            raise RuntimeError("GlooSender.send before join")
        meta = metadata(pairs)
        self.bytes_sent = 0
        for indices in plan_buckets(meta, self.bucket_bytes):
            buffer = pack_bucket([pairs[i][1] for i in indices])
            try:
                self.group.broadcast(buffer, 0).wait()
            except RuntimeError as exc:
                raise TransferError(f"sending weights failed: {_one_line(exc)}") from None
            self.bytes_sent += buffer.numel()

    def close(self) -> None:
        """Drop the group and the rendezvous socket."""
        group, self.group = self.group, None
        if group is not None:
            try:
                group.shutdown()
            except (RuntimeError, AttributeError):  # older torch: no shutdown; the group ends with its object
                pass
        self._store = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def metadata(pairs: Sequence[tuple[str, torch.Tensor]]) -> list[Meta]:
    """``(name, dtype, shape)`` of each pair (what the server is told before the broadcast)."""
    return [(name, t.dtype, tuple(t.shape)) for name, t in pairs]


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__
