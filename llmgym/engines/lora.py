"""LoRA adapters as a rollout engine takes them: the adapter's tensors and config out of a ``peft`` model.

A learner that trains LoRA (``AgentConfig.lora_r > 0``) has ``peft``'s layers injected into its model in
place: each adapted ``Linear`` becomes ``<module>.base_layer`` (the frozen weight) plus
``<module>.lora_A.<adapter>`` and ``<module>.lora_B.<adapter>``. A vLLM engine holds the base weights once
and takes only the adapter after each update; this module splits a state dict into the two, in the names
vLLM reads (``peft``'s saved format: ``base_model.model.<module>.lora_A.weight``), and gives the adapter's
config as plain data (what ``adapter_config.json`` would hold). Torch only: the fleet's learner side and
the in-process engine share it.

Example:
    >>> import torch
    >>> from llmgym.engines.lora import split_lora_state
    >>> state = {"model.q.base_layer.weight": torch.zeros(4, 4), "model.q.lora_A.default.weight": torch.ones(2, 4),
    ...          "model.q.lora_B.default.weight": torch.ones(4, 2), "model.norm.weight": torch.ones(4)}
    >>> base, adapter = split_lora_state(state)
    >>> sorted(base), sorted(adapter)
    (['model.norm.weight', 'model.q.weight'], ['base_model.model.model.q.lora_A.weight', 'base_model.model.model.q.lora_B.weight'])
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from llmgym.errors import LLMGymError

__all__ = ["AdapterError", "VLLM_LORA_RANKS", "adapter_bytes", "adapter_config", "has_lora", "split_lora_state",
           "vllm_lora_rank"]

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``max_lora_rank`` (an adapter of a lower rank runs in a slot of the next one)."""

_LORA = re.compile(r"^(?P<module>.+)\.(?P<kind>lora_A|lora_B)\.(?P<adapter>[^.]+)\.weight$")
_OTHER_ADAPTER_PART = re.compile(r"\.(lora_embedding_[AB]|lora_magnitude_vector|lora_bias)\b")


class AdapterError(LLMGymError, RuntimeError):
    """A rollout engine cannot sample the adapter version it was asked for (it is missing, stale or not
    what vLLM can serve): never a silent fall back to the base model."""


def has_lora(state: Mapping[str, Any]) -> bool:
    """Whether a state dict holds ``peft`` LoRA layers.

    Example:
        >>> from llmgym.engines.lora import has_lora
        >>> has_lora({"model.q.lora_A.default.weight": None}), has_lora({"model.q.weight": None})
        (True, False)
    """
    return any(".lora_A." in name for name in state)


def split_lora_state(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(base, adapter)`` of a LoRA-injected model's state dict: the base model's weights under their plain
    names (``.base_layer`` dropped), and the adapter's ``A``/``B`` matrices in ``peft``'s saved names
    (``base_model.model.<module>.lora_A.weight``). Raises :class:`AdapterError` for adapter parts vLLM
    cannot serve (embedding LoRA, DoRA's magnitudes, LoRA biases) or more than one adapter."""
    base: dict[str, torch.Tensor] = {}
    adapter: dict[str, torch.Tensor] = {}
    names: set[str] = set()
    for name, tensor in state.items():
        found = _LORA.match(name)
        if found:
            names.add(found["adapter"])
            adapter[f"base_model.model.{found['module']}.{found['kind']}.weight"] = tensor
        elif _OTHER_ADAPTER_PART.search(name):
            raise AdapterError(f"the model's adapter has a part vLLM cannot serve ({name}): train plain LoRA "
                               f"(no DoRA, no embedding or bias adapters) for a vLLM engine")
        else:
            base[name.replace(".base_layer.", ".")] = tensor
    if len(names) > 1:
        raise AdapterError(f"the model holds several LoRA adapters ({', '.join(sorted(names))}); an engine "
                           f"samples one: keep only the trained one")
    return base, adapter


def adapter_config(model: Any) -> dict[str, Any] | None:
    """The ``peft`` config of ``model``'s (single) adapter as JSON-safe data, or ``None`` without one.

    Example:
        >>> from llmgym.engines.lora import adapter_config
        >>> adapter_config(object()) is None
        True
    """
    configs = getattr(model, "peft_config", None)
    if not configs:
        return None
    if len(configs) > 1:
        raise AdapterError(f"the model holds several LoRA adapters ({', '.join(sorted(configs))}); an engine "
                           f"samples one: keep only the trained one")
    config = next(iter(configs.values()))
    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, (set, frozenset)):
            value = sorted(value)
        elif hasattr(value, "value") and not isinstance(value, (str, int, float, bool)):
            value = value.value  # enums (task_type, peft_type)
        if value is None or isinstance(value, (str, int, float, bool, list, dict)):
            out[key] = value
    return out


def adapter_bytes(adapter: Mapping[str, torch.Tensor]) -> int:
    """The adapter's size in bytes (what one adapter sync moves).

    Example:
        >>> import torch
        >>> from llmgym.engines.lora import adapter_bytes
        >>> adapter_bytes({"a": torch.zeros(8, 64), "b": torch.zeros(64, 8)})
        4096
    """
    return sum(t.numel() * t.element_size() for t in adapter.values())


def vllm_lora_rank(rank: int) -> int:
    """vLLM's ``max_lora_rank`` for an adapter of rank ``rank``: the smallest value vLLM accepts that holds it.

    Example:
        >>> from llmgym.engines.lora import vllm_lora_rank
        >>> vllm_lora_rank(4), vllm_lora_rank(8), vllm_lora_rank(9)
        (8, 8, 16)
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"a LoRA rank must be a whole number >= 1, got {rank!r}")
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} is over vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]})")
