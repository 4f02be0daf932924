"""Batching helpers shared by the ``transformers`` engine and its decode sessions.

Left padding, position ids that skip padding, and the KV-cache argument's name. A leaf module:
it imports nothing else from :mod:`llmgym.engines`, so ``hf`` and ``session`` can both build on it
without importing each other's internals.

Example:
    >>> from llmgym.engines.model_inputs import pad_left, position_ids
    >>> ids, mask = pad_left([[5, 6, 7], [8]], pad_id=0)
    >>> position_ids(mask).tolist()
    [[0, 1, 2], [0, 0, 0]]
"""

from __future__ import annotations

import inspect
from typing import Sequence

import torch

__all__ = ["pad_left", "position_ids", "cache_of", "cache_argument", "shared_rows"]


def pad_left(sequences: Sequence[Sequence[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists into ``(input_ids [B, L], attention_mask [B, L])``.

    Example:
        >>> from llmgym.engines.model_inputs import pad_left
        >>> ids, mask = pad_left([[5, 6], [7]], pad_id=0)
        >>> ids.tolist(), mask.tolist()
        ([[5, 6], [0, 7]], [[1, 1], [0, 1]])
    """
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if len(s):
            ids[i, width - len(s):] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids.to(device), mask.to(device)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids ``[B, L]`` that ignore padding on either side, as ``generate()`` computes them.

    Example:
        >>> import torch
        >>> from llmgym.engines.model_inputs import position_ids
        >>> position_ids(torch.tensor([[0, 1, 1], [1, 1, 0]])).tolist()
        [[0, 0, 1], [0, 1, 1]]
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def cache_of(output):
    """The KV cache of a ``transformers`` forward output (``cache`` in newer releases, else
    ``past_key_values``)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def cache_argument(model) -> str:
    """The name of ``model.forward``'s KV-cache argument: ``"cache"`` (transformers >= 5.2x) or
    ``"past_key_values"``; a ``peft`` model is looked through to its base model.

    Example:
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> from llmgym.engines.model_inputs import cache_argument
        >>> model = build_tiny_model(build_tokenizer(), TinyModelConfig(hidden_size=32, num_layers=1))
        >>> cache_argument(model) in ("cache", "past_key_values")
        True
    """
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def shared_rows(rows: Sequence[Sequence[int]]) -> tuple[list[int], torch.Tensor] | None:
    """``(first, index)`` when some rows repeat: ``first`` the position of each distinct row's first
    occurrence, ``index[i]`` the position in ``first`` of row ``i``'s copy; ``None`` when all differ.

    A GRPO batch holds each prompt ``group_size`` times: the engine and the decode sessions run the
    model over the distinct prompts only and copy their KV cache to the repeats (``index_select``
    with ``index``), so a prompt's prefill is paid once per group, not once per sample.

    Example:
        >>> from llmgym.engines.model_inputs import shared_rows
        >>> first, index = shared_rows([[5, 6], [7], [5, 6], [5, 6]])
        >>> first, index.tolist()
        ([0, 1], [0, 1, 0, 0])
        >>> shared_rows([[5], [6]]) is None
        True
    """
    seen: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    index = []
    for i, row in enumerate(rows):
        key = tuple(row)
        if key not in seen:
            seen[key] = len(first)
            first.append(i)
        index.append(seen[key])
    return None if len(first) == len(index) else (first, torch.tensor(index, dtype=torch.long))
