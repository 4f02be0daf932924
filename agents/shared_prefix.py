"""Rows that start alike are run through their common start once: a group's prompt is computed once,
not once per sample.

GRPO, RLOO, DAPO, ... sample ``G`` completions of one prompt; the learner's forward then runs ``G``
identical prompts. Causal attention makes a prompt's hidden states (and keys and values) independent
of what follows it, so the batch splits exactly into

* a **prefix pass** over the distinct prefixes (one row each, right-padded: no query row is fully
  masked, which some attention kernels turn into NaNs that a masked key would still carry), kept as
  a KV cache, and
* a **suffix pass** over every row's remainder (right-padded), attending to its prefix's cached
  keys and values (``index_select``-ed to the rows, so gradients flow back through the prefix pass
  and add up over the group).

A row's prefix is everything before the first position the loss reads (``select``): the last prompt
token stays in the suffix, since its hidden state predicts the first sampled token. The forward is
the same function of the weights as one pass over the padded batch (float summation differs);
``transformers``' layers drop a KV cache under gradient checkpointing, so the learner uses this only
without it (and not under data parallel, whose wrapper expects one forward per backward).

Under autocast the two passes share one low-precision cast of each linear layer's weights
(:func:`cast_linear_weights_once`): cast per pass, backward would keep two bf16 copies of the decoder's
weights (13 GiB more for a 7B model), more than sharing the prompt saves. Each pass still hands its own
gradient back to the weight in the weight's dtype, so the gradients are the same bits as with two casts.

Example:
    >>> import torch
    >>> from llmgym.agents.shared_prefix import shared_prefixes
    >>> ids = torch.tensor([[1, 5, 6, 7, 0], [1, 5, 6, 8, 9], [1, 4, 6, 8, 0]])
    >>> attn = (ids > 0).long()
    >>> select = torch.tensor([[0, 0, 1, 0], [0, 0, 1, 1], [0, 0, 1, 0]]).bool()
    >>> p = shared_prefixes(ids, attn, select)
    >>> p.starts.tolist(), p.row_prefix.tolist(), p.prefix_ids.tolist()  # two distinct prefixes of 2 tokens
    ([2, 2, 2], [0, 0, 1], [[1, 5], [1, 4]])
    >>> p.saved_tokens
    2
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["SharedPrefixes", "shared_prefixes", "shared_prefix_hidden", "supports_shared_prefixes", "TESTED_ATTENTION",
           "cast_linear_weights_once"]

TESTED_ATTENTION = ("sdpa", "eager")
"""Attention implementations the prefix/suffix split is tested with (a padding mask with a hole between
a prefix and its suffix, a KV cache longer than the queries). Others (flash, flex, custom ones, some
of which drop the padding mask) run the batch in one pass until a run has checked them."""


def supports_shared_prefixes(model: torch.nn.Module) -> bool:
    """Whether :func:`shared_prefix_hidden` computes exactly what one pass over the batch computes:
    a ``transformers`` causal LM (possibly under ``peft``, not under a data-parallel wrapper) with a
    decoder stack under its head (``base_model``), whose KV
    cache is a plain ``DynamicCache`` of full-attention layers (no sliding window, no recurrent
    state), with an attention implementation in :data:`TESTED_ATTENTION`, without gradient
    checkpointing (its layers drop a KV cache in training).

    Example:
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> from llmgym.agents.shared_prefix import supports_shared_prefixes
        >>> model = build_tiny_model(build_tokenizer(), TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64))
        >>> supports_shared_prefixes(model)
        True
        >>> model.gradient_checkpointing_enable(); supports_shared_prefixes(model)
        False
    """
    if hasattr(model, "module"):  # DistributedDataParallel: one forward per backward
        return False
    get_base = getattr(model, "get_base_model", None)  # peft.PeftModel
    core = get_base() if callable(get_base) else model
    if getattr(core, "base_model", core) is core:  # no decoder stack under a head to call
        return False
    if getattr(core, "is_gradient_checkpointing", False) or getattr(core, "is_activation_checkpointing", False):
        return False
    if getattr(core.config, "_attn_implementation", None) not in TESTED_ATTENTION:
        return False
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        layers = DynamicCache(config=core.config).layers
    except Exception:  # noqa: BLE001 - a model family transformers' DynamicCache does not describe
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


@dataclasses.dataclass
class SharedPrefixes:
    """How a right-padded ``[N, L]`` batch splits into distinct prefixes and per-row suffixes.

    Attributes:
        starts: ``[N]`` each row's prefix length (its suffix starts at that column).
        row_prefix: ``[N]`` index of each row's prefix in ``prefix_ids``.
        prefix_ids, prefix_mask: ``[U, P]`` the distinct prefixes, right-padded (mask 0 on padding).
        suffix_ids, suffix_mask: ``[N, S]`` each row's remainder, right-padded.
        saved_tokens: prefix tokens the forward no longer computes (``Σ starts − Σ prefix lengths``).
    """

    starts: torch.Tensor
    row_prefix: torch.Tensor
    prefix_ids: torch.Tensor
    prefix_mask: torch.Tensor
    suffix_ids: torch.Tensor
    suffix_mask: torch.Tensor
    saved_tokens: int


def shared_prefixes(input_ids: torch.Tensor, attention_mask: torch.Tensor, select: torch.Tensor) -> SharedPrefixes | None:
    """The split of :class:`SharedPrefixes`, or ``None`` when the batch does not allow one: a row that is
    not right-padded, reads no position, or starts reading at column 0 (nothing to share).

    ``select`` is ``[N, L-1]`` (column ``j`` is the hidden state at position ``j``, predicting token ``j + 1``).
    """
    n, width = input_ids.shape
    lengths = attention_mask.sum(-1)
    positions = torch.arange(width, device=input_ids.device)
    if not bool((attention_mask.bool() == (positions < lengths[:, None])).all()) or not bool(select.any(-1).all()):
        return None
    starts = select.float().argmax(-1)  # the first position read
    if int(starts.min()) == 0:
        return None
    keys: dict[tuple[int, ...], int] = {}
    row_prefix = []
    for ids, start in zip(input_ids.tolist(), starts.tolist()):
        row_prefix.append(keys.setdefault(tuple(ids[:start]), len(keys)))
    prefixes = list(keys)
    longest = max(len(p) for p in prefixes)
    prefix_ids = torch.zeros((len(prefixes), longest), dtype=input_ids.dtype, device=input_ids.device)
    prefix_mask = torch.zeros_like(prefix_ids)
    for u, prefix in enumerate(prefixes):  # right-padded: a padding query still sees its prefix's tokens
        prefix_ids[u, :len(prefix)] = torch.tensor(prefix, dtype=input_ids.dtype)
        prefix_mask[u, :len(prefix)] = 1
    suffix_len = lengths - starts
    span = int(suffix_len.max())
    gather = (starts[:, None] + torch.arange(span, device=input_ids.device)).clamp(max=width - 1)
    suffix_mask = (torch.arange(span, device=input_ids.device) < suffix_len[:, None]).long()
    suffix_ids = torch.where(suffix_mask.bool(), input_ids.gather(1, gather), torch.zeros_like(gather))
    saved = int(starts.sum()) - sum(len(p) for p in prefixes)
    return SharedPrefixes(starts, torch.tensor(row_prefix, device=input_ids.device), prefix_ids, prefix_mask,
                          suffix_ids, suffix_mask, saved)


def shared_prefix_hidden(backbone: torch.nn.Module, split: SharedPrefixes, select: torch.Tensor) -> torch.Tensor:
    """``[K, H]``: the last hidden states at the ``K`` positions of ``select`` (row-major order, as
    ``hidden[select]`` of one pass over the batch), by a prefix pass and a suffix pass of ``backbone``
    (the decoder stack under a causal LM's head, ``model.base_model``: its ``last_hidden_state`` is the
    head's input).

    Example:
        >>> import torch
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> from llmgym.agents.shared_prefix import shared_prefixes, shared_prefix_hidden
        >>> model = build_tiny_model(build_tokenizer(), TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64))
        >>> ids = torch.tensor([[1, 5, 6, 7, 0], [1, 5, 6, 8, 9]]); attn = (ids > 0).long()
        >>> select = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1]]).bool()
        >>> h = shared_prefix_hidden(model.base_model, shared_prefixes(ids, attn, select), select)
        >>> full = model(ids, attention_mask=attn, output_hidden_states=True).hidden_states[-1][:, :-1][select]
        >>> h.shape, torch.allclose(h, full, atol=1e-5)
        (torch.Size([5, 32]), True)
    """
    from transformers import DynamicCache

    backbone = cast_linear_weights_once(backbone)
    prefix_positions = (split.prefix_mask.cumsum(-1) - 1).clamp(min=0)
    out = backbone(input_ids=split.prefix_ids, attention_mask=split.prefix_mask, position_ids=prefix_positions,
                   use_cache=True)
    layers = out.past_key_values.layers
    cache = DynamicCache(ddp_cache_data=[(layer.keys.index_select(0, split.row_prefix),
                                          layer.values.index_select(0, split.row_prefix)) for layer in layers])
    del out, layers
    span = split.suffix_ids.shape[1]
    positions = split.starts[:, None] + torch.arange(span, device=split.starts.device)
    mask = torch.cat([split.prefix_mask.index_select(0, split.row_prefix), split.suffix_mask], dim=1)
    hidden = backbone(input_ids=split.suffix_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                      use_cache=True).last_hidden_state
    del cache
    # column t of a row's suffix is batch column starts + t; the selected ones, in row-major order
    columns = positions.clamp(max=select.shape[1] - 1)
    suffix_select = select.gather(1, columns) & (positions < select.shape[1]) & split.suffix_mask.bool()
    return hidden[suffix_select]


class _SharedCast(torch.autograd.Function):
    """``weight`` as its ready-made cast ``cast`` (the same storage for every use); backward returns the
    gradient in ``weight``'s dtype, as autocast's own cast does."""

    @staticmethod
    def forward(ctx, weight, cast):
        ctx.dtype = weight.dtype
        return cast.detach()

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype), None


def cast_linear_weights_once(module: torch.nn.Module):
    """``module``, or under autocast a callable like it whose ``nn.Linear`` weights and biases are cast
    to autocast's dtype once, here, and reused by every call (autocast without its cache casts them
    again at each call, and backward keeps every call's copy).

    Each call gets its own autograd node per weight, whose backward converts that call's gradient to the
    weight's dtype: the gradients accumulate at the weight in its dtype exactly as separate casts' do
    (not summed in bf16 first, as a shared cast or autocast's cache would). Only tensors autocast would
    cast are cast (floating, not float64, not already in its dtype), and only those no other kind of
    module uses (a weight tied to an embedding keeps its own dtype there). A node is made per linear
    module and call: a module a model calls twice in one forward (none of ``transformers``' decoders
    does) would sum its two uses' gradients in the cast's dtype, as autocast's cache does.

    Example:
        >>> import torch
        >>> from llmgym.agents.shared_prefix import cast_linear_weights_once
        >>> layer = torch.nn.Linear(4, 4)
        >>> cast_linear_weights_once(layer) is layer  # no autocast: nothing to share
        True
        >>> x = torch.randn(2, 4)
        >>> with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        ...     shared = cast_linear_weights_once(layer)
        ...     y = shared(x) + shared(x)
        >>> y.sum().backward(); layer.weight.grad.dtype
        torch.float32
    """
    params = list(module.parameters())
    if not params:
        return module
    device = params[0].device.type
    if not torch.is_autocast_enabled(device):
        return module
    dtype = torch.get_autocast_dtype(device)
    other = {id(p) for m in module.modules() if type(m) is not torch.nn.Linear for p in m.parameters(recurse=False)}
    casts: dict[int, tuple[torch.Tensor, torch.Tensor, list[str]]] = {}  # a tied weight: one cast, each of its names
    with torch.no_grad():
        for name, m in module.named_modules():
            if type(m) is not torch.nn.Linear:
                continue
            for pname, p in m.named_parameters(recurse=False):
                if p.is_floating_point() and p.dtype not in (dtype, torch.float64) and id(p) not in other:
                    entry = casts.get(id(p)) or casts.setdefault(id(p), (p, p.to(dtype), []))
                    entry[2].append(f"{name}.{pname}" if name else pname)
    if not casts:
        return module

    def call(*args, **kwargs):
        grad = torch.is_grad_enabled()
        # a node per use (per module name): each use's gradient reaches the weight in its dtype
        weights = {n: _SharedCast.apply(p, cast) if p.requires_grad and grad else cast
                   for p, cast, names in casts.values() for n in names}
        return torch.func.functional_call(module, weights, args=args, kwargs=kwargs, tie_weights=False)

    return call
