"""Decoding with a static KV cache and, optionally, a compiled decoding step (CUDA graphs on a GPU).

:class:`~llmgym.engines.HFEngine` decodes one token per step. With ``transformers``' dynamic cache
every step allocates, concatenates and launches dozens of small kernels from Python; on a GPU that
overhead, not arithmetic, sets the speed. A *static* cache (``transformers.StaticCache``) is
allocated once at ``prompt width + max_new_tokens`` (rounded up to a bucket so repeated calls reuse
it), the attention mask has a fixed width, and every step has the same shapes — so the step can be
compiled with ``torch.compile`` (mode ``"reduce-overhead"`` on CUDA: the step is replayed as a CUDA
graph).

Sampling is untouched and never compiled: the engine draws each token with its keyed sampler
(:mod:`llmgym.engines.sampling`) from the step's logits, so the same keys give the same tokens as the
eager path (exactly, in float32, up to float round-off of the logits; tested on CPU). Only the
model's step is handed to ``torch.compile``.

Example:
    >>> import torch
    >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
    >>> from llmgym.engines import HFEngine, SamplingParams
    >>> tok = build_tokenizer()
    >>> model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1))
    >>> params = SamplingParams(n=2, max_new_tokens=5, seed=3)
    >>> eager = HFEngine(model, tok).generate([tok.encode("7*6=")], params)
    >>> static = HFEngine(model, tok, decode="static").generate([tok.encode("7*6=")], params)
    >>> [c.token_ids for c in eager[0]] == [c.token_ids for c in static[0]]
    True
"""

from __future__ import annotations

import torch

__all__ = ["DECODE_MODES", "StaticCacheDecoder", "last_logits_only"]

DECODE_MODES = ("eager", "static", "compiled")
"""``eager``: dynamic KV cache (``transformers`` default). ``static``: static KV cache, uncompiled.
``compiled``: static KV cache + ``torch.compile`` of the decoding step (CUDA graphs on a GPU)."""

_BUCKET = 64  # cache lengths are rounded up to a multiple of this, so nearby requests share a compiled step


def _cache_len(width: int, max_new_tokens: int) -> int:
    need = width + max_new_tokens
    return -(-need // _BUCKET) * _BUCKET


def _step(model, cache_arg: str, input_ids, attention_mask, position_ids, cache, last_only: dict | None = None):
    # in the weights' dtype, never under autocast: there RoPE turns keys float32 while values stay
    # bf16, and a static cache (one dtype for both) fails in index_copy_ (seen on an H200)
    with torch.autocast(input_ids.device.type, enabled=False):
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    use_cache=True, **{cache_arg: cache}, **(last_only or {}))
    return out.logits[:, -1, :]


def last_logits_only(model) -> dict:
    """``{"logits_to_keep": 1}`` where the model's forward takes it (a prefill then applies the LM
    head to the last position only, not to every prompt token: a ``[B, W, V]`` float32 tensor at a
    151,936-token vocabulary is ~0.5 GB for 32 prompts of 25 tokens), else ``{}``.

    Example:
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> last_logits_only(build_tiny_model(build_tokenizer(), TinyModelConfig(hidden_size=32, num_layers=1)))
        {'logits_to_keep': 1}
    """
    import inspect

    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model  # peft
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(base.forward).parameters else {}


def _copy_static_rows(src, dst, index: torch.Tensor) -> bool:
    """Fill static cache ``dst`` (batch ``len(index)``) with rows ``index`` of the prefilled ``src``;
    False (``dst`` reset) when either holds layers other than plain ``StaticLayer`` or the layer's
    internals are not the ones this copies."""
    from transformers.cache_utils import StaticLayer

    pairs = list(zip(src.layers, dst.layers))
    if len(src.layers) != len(dst.layers) or not all(
            type(a) is StaticLayer and type(b) is StaticLayer and a.is_initialized
            and isinstance(getattr(a, "cumulative_length", None), torch.Tensor) for a, b in pairs):
        return False
    try:
        for a, b in pairs:
            keys, values = a.keys.index_select(0, index), a.values.index_select(0, index)
            if not b.is_initialized:
                b.lazy_initialization(keys, values)
            b.keys.copy_(keys)
            b.values.copy_(values)
            b.cumulative_length.copy_(a.cumulative_length)
    except (TypeError, AttributeError, RuntimeError):  # another transformers' StaticLayer: prefill every row
        dst.reset()
        return False
    return True


class StaticCacheDecoder:
    """Prefill then one-token steps over a reusable ``transformers.StaticCache``.

    One decoder per engine. Compiled, it keeps a cache per ``(batch size, cache length)`` (reset, not
    reallocated, between calls — a compiled step is specialised to the cache's tensors) and one
    compiled step function; uncompiled, the engine calls :meth:`release` after each ``generate`` so
    no KV cache is held while the learner trains.

    Args:
        model: the causal LM.
        cache_arg: the name of the forward's KV-cache argument (``cache`` or ``past_key_values``).
        compiled: compile the decoding step with ``torch.compile``.
        compile_mode: ``torch.compile`` mode (default: ``"reduce-overhead"`` on CUDA, else ``None``).

    Example:
        >>> import torch
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> tok = build_tokenizer()
        >>> model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)).eval()
        >>> ids = torch.tensor([tok.encode("hello")])
        >>> decoder = StaticCacheDecoder(model, "cache")
        >>> with torch.no_grad():
        ...     first = decoder.prefill(ids, torch.ones_like(ids), max_new_tokens=4)
        ...     second = decoder.step(first.argmax(-1))
        >>> first.shape == second.shape == (1, model.config.vocab_size)
        True
    """

    def __init__(self, model, cache_arg: str = "cache", compiled: bool = False, compile_mode: str | None = None):
        self.model = model
        self.cache_arg = cache_arg
        self.compiled = compiled
        self.compile_mode = compile_mode
        self._caches: dict[tuple, object] = {}
        self._compiled_step = None
        self._last_only = last_logits_only(model)
        self._mask = self._cache = self._pos = None
        self._slot = 0

    def _get_cache(self, batch: int, length: int, dtype: torch.dtype, device: torch.device):
        from transformers import StaticCache

        key = (batch, length, dtype, str(device))
        cache = self._caches.get(key)
        if cache is None:
            cache = StaticCache(config=self.model.config, max_cache_len=length)
            self._caches = {key: cache}  # keep one: a new shape means a new compiled graph anyway
        else:
            cache.reset()
        return cache

    def release(self) -> None:
        """Drop the KV cache and the mask (the next :meth:`prefill` allocates them again)."""
        self._caches = {}
        self._mask = self._cache = self._pos = None

    def _step_fn(self):
        if not self.compiled:
            return _step
        if self._compiled_step is None:
            mode = self.compile_mode
            if mode is None and next(self.model.parameters()).device.type == "cuda":
                mode = "reduce-overhead"  # CUDA graphs: one launch per step
            self._compiled_step = torch.compile(_step, mode=mode, dynamic=False, fullgraph=False)
        return self._compiled_step

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                shared: tuple[list[int], torch.Tensor] | None = None) -> torch.Tensor:
        """Run the (left-padded) prompts; return the next-token logits ``[B, V]``.

        ``shared`` (from :func:`~llmgym.engines.model_inputs.shared_rows`) names repeated rows: the
        model then runs on the distinct rows only and their cache entries are copied to the repeats.
        """
        batch, width = input_ids.shape
        length = _cache_len(width, max_new_tokens)
        dtype = next(self.model.parameters()).dtype
        self._cache = self._get_cache(batch, length, dtype, input_ids.device)
        self._mask = torch.zeros((batch, length), dtype=attention_mask.dtype, device=input_ids.device)
        self._mask[:, :width] = attention_mask
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        self._pos = positions[:, -1:].clone()
        self._slot = width
        if shared is not None:
            from transformers import StaticCache

            first = torch.tensor(shared[0], device=input_ids.device)
            index = shared[1].to(input_ids.device)
            distinct = StaticCache(config=self.model.config, max_cache_len=length)
            logits = _step(self.model, self.cache_arg, input_ids[first], self._mask[first], positions[first],
                           distinct, self._last_only)
            if _copy_static_rows(distinct, self._cache, index):
                return logits.float().index_select(0, index)
            self._cache.reset()  # a cache layout this cannot copy: prefill every row
        logits = _step(self.model, self.cache_arg, input_ids, self._mask, positions, self._cache, self._last_only)
        return logits.float()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row ``[B]``; return the next-token logits ``[B, V]``."""
        self._mask[:, self._slot] = 1
        self._slot += 1
        self._pos += 1
        logits = self._step_fn()(self.model, self.cache_arg, tokens[:, None], self._mask, self._pos, self._cache)
        return logits.float().clone()  # a CUDA-graph output is overwritten by the next replay
