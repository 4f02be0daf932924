"""The weight-transfer backend ``llmgym serve`` adds to vLLM: the learner's weights over a gloo group.

vLLM (>= 0.2x with ``vllm.distributed.weight_transfer``) drives weight updates of a served model
through a *weight-transfer engine* chosen by ``--weight-transfer-config '{"backend": ...}'`` and
the RL routes of its server (``VLLM_SERVER_DEV_MODE=1``): ``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights``, ``/finish_weight_update`` (which also sets the
server's weight version), ``/pause`` and ``/resume``. Its built-in backends (NCCL, CUDA IPC, ...)
need GPUs. :class:`GlooWeightTransferEngine` is the same contract over a ``torch.distributed``
gloo group, so it runs on vLLM's CPU build (and on GPUs, through host memory); the learner's end is
:class:`llmgym.fleet.weight_transfer.GlooSender`.

The received tensors are loaded the way vLLM's own NCCL backend loads them: between
``initialize_layerwise_reload`` (at ``start_weight_update``) and ``finalize_layerwise_reload`` (at
``finish_weight_update``) vLLM's model takes checkpoint-format weights through ``load_weights`` and
re-runs its kernels' weight processing (the CPU backend repacks linear layers for oneDNN).

:func:`register` adds the backend to vLLM's ``WeightTransferEngineFactory`` under
:data:`~llmgym.fleet.weight_transfer.BACKEND_NAME`. vLLM calls it in every process it starts
(API server, engine core, workers) because the package declares it as a ``vllm.general_plugins``
entry point; it only registers a name (the module below is imported when a server asks for the
backend), so it costs nothing to a vLLM that does not use it.

Example:
    >>> from llmgym.fleet.vllm_plugin import register
    >>> from llmgym.fleet.weight_transfer import BACKEND_NAME
    >>> from vllm.config.weight_transfer import WeightTransferConfig
    >>> register(); register()  # idempotent
    >>> WeightTransferConfig(backend=BACKEND_NAME).backend
    'llmgym_gloo'
"""

from __future__ import annotations

import collections
import dataclasses
import re
import threading
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo

from llmgym.fleet.weight_transfer import (
    ADAPTER_PATH_PREFIX,
    BACKEND_NAME,
    DEFAULT_BUCKET_BYTES,
    TransferError,
    open_group,
    receive_named_tensors,
)

__all__ = ["ADAPTER_PATH_PREFIX", "GlooInitInfo", "GlooUpdateInfo", "GlooWeightTransferEngine",
           "compile_helpers_eagerly_on_generic_kernels", "register"]

_ADAPTER_NAME = re.compile(r"llmgym-v[0-9]{1,12}")
_MAX_RECEIVED_ADAPTERS = 16
# name -> (tensors, config): the adapters this worker received, newest last (bounded: the oldest are dropped)
_received: collections.OrderedDict[str, tuple[dict, dict]] = collections.OrderedDict()
_received_lock = threading.Lock()


@dataclasses.dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """Where the learner's rendezvous listens, and the group's shape (what ``GlooSender.rendezvous`` returns)."""

    master_address: str
    master_port: int
    world_size: int
    rank_offset: int = 1
    timeout_s: float = 120.0
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    nonce: str = ""
    """The group's rendezvous nonce (the learner draws one per group; only holders join it)."""

    def __post_init__(self) -> None:
        if not 1 <= int(self.master_port) <= 65535:
            raise ValueError(f"master_port must be a TCP port, got {self.master_port!r}")
        if int(self.world_size) < 2 or int(self.rank_offset) < 1 or float(self.timeout_s) <= 0:
            raise ValueError(f"bad group shape: world_size={self.world_size!r}, rank_offset={self.rank_offset!r}, "
                             f"timeout_s={self.timeout_s!r}")
        if int(self.bucket_bytes) < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {self.bucket_bytes!r}")
        if not isinstance(self.nonce, str) or not re.fullmatch(r"[0-9a-f]{64}", self.nonce):
            raise ValueError("init_info carries no rendezvous nonce (64 hex characters): the learner is an older "
                             "llmgym; upgrade it to the servers' version")


@dataclasses.dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """One update: every tensor's name, dtype name (``"float32"``) and shape, in the order they are sent."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    lora_name: str = ""
    """Non-empty: the tensors are a LoRA adapter (``peft``'s names), kept in memory under this name for
    ``/v1/load_lora_adapter`` (path ``ADAPTER_PATH_PREFIX + lora_name``), not loaded into the base weights."""
    lora_config: dict | None = None
    """The adapter's ``adapter_config.json`` as data (with ``lora_name``)."""

    def __post_init__(self) -> None:
        if self.lora_name and (not isinstance(self.lora_name, str) or not _ADAPTER_NAME.fullmatch(self.lora_name)):
            raise ValueError(f"lora_name must match {_ADAPTER_NAME.pattern}, got {str(self.lora_name)[:80]!r}")
        if self.lora_name and not isinstance(self.lora_config, dict):
            raise ValueError("an adapter update needs its lora_config (the adapter's peft config as a JSON object)")
        if not (len(self.names) == len(self.dtype_names) == len(self.shapes)):
            raise ValueError(f"names, dtype_names and shapes differ in length: {len(self.names)}, "
                             f"{len(self.dtype_names)}, {len(self.shapes)}")
        for dtype in self.dtype_names:
            if not isinstance(getattr(torch, str(dtype), None), torch.dtype):
                raise ValueError(f"{dtype!r} is not a torch dtype")

    def meta(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        return [(str(n), getattr(torch, d), tuple(int(x) for x in s))
                for n, d, s in zip(self.names, self.dtype_names, self.shapes)]


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """A vLLM worker's end of the learner's gloo group (see the module doc)."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group = self._store = None
        self.bucket_bytes = DEFAULT_BUCKET_BYTES
        self._reloading = False  # whether this update has started vLLM's layerwise reload (base weights came)
        if getattr(vllm_config, "lora_config", None) is not None:
            _install_adapter_loader()

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        self.shutdown()  # a learner that reconnects (a new run) replaces the old group
        parallel = self.parallel_config
        rank = parallel.data_parallel_index * parallel.world_size + parallel.rank + int(init_info.rank_offset)
        self.group, self._store = open_group(init_info.master_address, int(init_info.master_port), rank,
                                             int(init_info.world_size), timeout_s=float(init_info.timeout_s),
                                             nonce=str(init_info.nonce))
        self.bucket_bytes = int(init_info.bucket_bytes)

    def start_weight_update(self) -> None:
        # vLLM's layerwise reload starts when base weights arrive: an update that carries only an adapter
        # leaves the base weights as they are
        self._reloading = False

    def _start_reload(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        if not self._reloading:
            initialize_layerwise_reload(self.model)
            self._reloading = True

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        if self._reloading:
            finalize_layerwise_reload(self.model, self.model_config)
            self._reloading = False

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class ends with torch.accelerator.synchronize(), which raises where there is no
        # accelerator (vLLM's CPU build); gloo's wait() has already made the tensors whole
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise TransferError("no weight-transfer group: the learner must call /init_weight_transfer_engine first")
        if update_info.lora_name:
            if getattr(self.vllm_config, "lora_config", None) is None:
                raise TransferError("this server was started without LoRA: start it with llmgym serve --lora-r N to "
                                    "take adapters")
            tensors = {}
            for pairs in receive_named_tensors(self.group, update_info.meta(), self.bucket_bytes):
                tensors.update((name, tensor.clone()) for name, tensor in pairs)
            with _received_lock:
                _received.pop(update_info.lora_name, None)
                _received[update_info.lora_name] = (tensors, dict(update_info.lora_config))
                while len(_received) > _MAX_RECEIVED_ADAPTERS:
                    _received.popitem(last=False)
            return
        self._start_reload()
        for pairs in receive_named_tensors(self.group, update_info.meta(), self.bucket_bytes):
            self.model.load_weights(pairs)

    def shutdown(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            try:
                group.shutdown()
            except (RuntimeError, AttributeError):
                pass
        self._store = None


def _install_adapter_loader() -> None:
    """Make this worker's LoRA manager load an adapter named by :data:`ADAPTER_PATH_PREFIX` from the adapters
    the learner sent (in memory), and nothing else: a rollout server's job is its learner's adapters, so a
    ``lora_path`` on disk or a hub id (which ``/v1/load_lora_adapter`` would otherwise read or fetch) is
    refused. Idempotent; only in a rollout server's worker (the weight-transfer backend installs it). An
    adapter it does not hold is vLLM's own "not found" error: the request fails, it is never answered by the
    base model."""
    from vllm.exceptions import LoRAAdapterNotFoundError
    from vllm.lora.worker_manager import WorkerLoRAManager

    if getattr(WorkerLoRAManager._load_adapter, "_llmgym", False):
        return

    def _load_adapter(self, lora_request):
        path = getattr(lora_request, "lora_path", "") or ""
        if not path.startswith(ADAPTER_PATH_PREFIX):  # not one the learner sent: never read from disk or a hub
            raise LoRAAdapterNotFoundError(lora_request.lora_name, f"{path} (a rollout server loads only the "
                                           f"adapters its learner sends, {ADAPTER_PATH_PREFIX}<name>)")
        from llmgym.engines.vllm import lora_model_from_tensors

        with _received_lock:
            found = _received.get(path[len(ADAPTER_PATH_PREFIX):])
        if found is None:
            raise LoRAAdapterNotFoundError(lora_request.lora_name, path)
        tensors, config = found
        return lora_model_from_tensors(self, lora_request.lora_int_id, tensors, config)

    _load_adapter._llmgym = True
    WorkerLoRAManager._load_adapter = _load_adapter


def register() -> None:
    """Add the gloo backend to vLLM's weight-transfer registry (idempotent; vLLM calls it per process)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(BACKEND_NAME, __name__, "GlooWeightTransferEngine")
    except ValueError:  # registered already: vLLM may load its plugins more than once per process
        pass
    compile_helpers_eagerly_on_generic_kernels()


def compile_helpers_eagerly_on_generic_kernels() -> bool:
    """On torch's generic x86-64 kernels, run vLLM's small ``torch.compile``-d helpers eagerly.

    With ``ATEN_CPU_CAPABILITY=default`` (a CPU without AVX2, or a run forcing the generic kernels to
    check that results do not depend on them), torch 2.13's inductor writes C++ that does not compile
    (an int64 ``vec_reduce_all`` in vLLM's logprob rank count, ``batched_count_greater_than``), so every
    sampling request failed. vLLM compiles those helpers with its platform's ``simple_compile_backend``
    when their module is imported, after this plugin has run: ``"eager"`` there runs them as plain torch.
    Returns whether it switched (only on vLLM's CPU platform under the generic kernels).

    Example:
        >>> from llmgym.fleet.vllm_plugin import compile_helpers_eagerly_on_generic_kernels
        >>> import torch
        >>> compile_helpers_eagerly_on_generic_kernels() == (torch.backends.cpu.get_cpu_capability() == "DEFAULT")
        True
    """
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    type(current_platform).simple_compile_backend = "eager"
    current_platform.__dict__.pop("simple_compile_backend", None)
    return True
