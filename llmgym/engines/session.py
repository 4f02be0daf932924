"""Incremental decoding: a KV cache that follows the episode.

A token-level episode grows its context by one token per step (and by the env's reply between turns
of a multi-turn episode). Recomputing the whole context at every step is quadratic in its length;
a :class:`HFDecodeSession` keeps the ``transformers`` KV cache (a ``DynamicCache``) between calls
and feeds the model only the tokens it has not seen, so each step costs one token per row.

Layout of the batched cache: rows are left-padded (``attention_mask`` 0) to a common width. When
rows grow by different numbers of tokens in one call (one row gets a sampled token, another its
token plus the env's reply), each row's new tokens are right-aligned in the chunk and the gap is
masked, so a row's history may have masked holes in the middle. Position ids count a row's real
tokens only, so every row sees exactly the positions and keys it would see alone. Rows that finish
leave through ``Cache.reorder_cache``; rows that join are prefilled on their own and concatenated
(left-padding the narrower cache).

:class:`RecomputeSession` is the same interface over an engine that only has
``next_token_logits`` (today's behaviour: the whole context every call). :class:`TokenStepper` gives a
user's own token loop the cache without managing it.
"""

from __future__ import annotations

import collections
import inspect
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch

from llmgym.engines.base import DecodeSession, EngineView
from llmgym.engines.model_inputs import cache_of, pad_left, shared_rows

__all__ = ["HFDecodeSession", "RecomputeSession", "TokenStepper", "open_decode_session", "token_stepper",
           "weights_version"]


def weights_version(model: torch.nn.Module | Sequence[torch.nn.Parameter]) -> int:
    """A number that changes whenever a parameter of ``model`` is modified in place.

    Optimiser steps, ``load_state_dict`` and ``sync_weights`` all write parameters in place, which
    bumps torch's per-tensor version counters; a cache built before such a write is stale.

    Example:
        >>> import torch
        >>> from llmgym.engines.session import weights_version
        >>> layer = torch.nn.Linear(2, 2)
        >>> before = weights_version(layer)
        >>> with torch.no_grad():
        ...     _ = layer.weight.add_(1.0)
        >>> weights_version(layer) != before
        True
    """
    params = model.parameters() if isinstance(model, torch.nn.Module) else model
    return sum(p._version for p in params)


def _as_ids(context: Any) -> list[int]:
    if type(context) is list and all(type(t) is int for t in context):  # the per-token case: already ids
        return list(context)
    if isinstance(context, np.ndarray):
        return context.astype(np.int64, copy=False).tolist()
    if isinstance(context, torch.Tensor):
        return context.tolist()
    return [int(t) for t in context]


def _concat_dynamic_caches(old, new, old_width: int, new_width: int) -> bool:
    """Append ``new``'s rows to ``old`` in place, left-padding the narrower one; False if unsupported."""
    from transformers.cache_utils import DynamicLayer

    layers = (*old.layers, *new.layers)
    if len(old.layers) != len(new.layers) or not all(
        type(layer) is DynamicLayer and layer.keys is not None and layer.keys.numel() > 0 for layer in layers
    ):
        return False  # sliding-window, quantised or linear-attention layers: the caller rebuilds instead
    width = max(old_width, new_width)
    for a, b in zip(old.layers, new.layers):
        a.keys = torch.cat([_pad_time(a.keys, width), _pad_time(b.keys, width)], dim=0)
        a.values = torch.cat([_pad_time(a.values, width), _pad_time(b.values, width)], dim=0)
    return True


def _crop_left_dynamic_cache(cache, columns: int) -> bool:
    """Remove the first ``columns`` time steps of every layer; False (nothing done) if unsupported."""
    from transformers.cache_utils import DynamicLayer

    if not all(type(layer) is DynamicLayer and layer.keys is not None for layer in cache.layers):
        return False
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[..., columns:, :], layer.values[..., columns:, :]
    return True


def _pad_time(states: torch.Tensor, width: int) -> torch.Tensor:
    # [B, H, L, D] -> [B, H, width, D], zeros on the left (masked out by the attention mask)
    missing = width - states.shape[-2]
    if missing == 0:
        return states
    pad = states.new_zeros((*states.shape[:-2], missing, states.shape[-1]))
    return torch.cat([pad, states], dim=-2)


class HFDecodeSession:
    """Next-token logits for a batch of growing contexts, with the KV cache kept between calls.

    Open one with :meth:`llmgym.engines.HFEngine.open_session`. Rows are named by integer handles
    (returned by :meth:`add`); :meth:`logits` gives each row's next-token logits; :meth:`extend`
    appends tokens to some rows (one sampled token, or a token and the env's reply) and runs the
    model on those new tokens only; :meth:`drop` removes finished rows. Rows not named in an
    ``extend`` keep their logits.

    The session samples nothing: pair it with :func:`llmgym.engines.sample_next_token` for the
    keyed sampling every engine shares. It reads the model's weights as they are at each call: after
    an optimiser step, open a new session (``stale`` says when).

    Attributes:
        tokens_computed: real (unpadded) tokens fed to the model so far — each context token once, and a
            context several rows start with (a group's prompt) once for all of them.
        prefills: model calls that started a cache (the first :meth:`add`, rows joining, rebuilds).

    Example:
        >>> import torch
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> from llmgym.engines import HFEngine
        >>> tok = build_tokenizer()
        >>> engine = HFEngine(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)), tok)
        >>> session = engine.open_session([[5, 6, 7], [8]])
        >>> a, b = session.rows
        >>> session.extend({a: [9], b: [10, 11]})
        >>> session.drop([a])
        >>> full = engine.next_token_logits([[8, 10, 11]])
        >>> session.rows == [b], torch.allclose(session.logits([b]), full, atol=1e-5)
        (True, True)
        >>> session.tokens_computed
        7
    """

    def __init__(self, engine, contexts: Iterable[Sequence[int]] = ()):
        self.engine = engine
        self.model = engine.model
        self.pad_id = engine.pad_id
        self._params = list(self.model.parameters())  # walked once: the staleness check runs per token
        self.weights_version = weights_version(self._params)
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = engine.cache_arg
        self._keep_last = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._handles: list[int] = []  # batch order
        self._contexts: dict[int, list[int]] = {}
        self._next_handle = 0
        self._cache = None
        self._mask: torch.Tensor | None = None  # [B, W] 1 = real token
        self._lengths: torch.Tensor | None = None  # [B] real tokens per row
        self._logits: torch.Tensor | None = None  # [B, V] float32
        self.tokens_computed = 0
        self.prefills = 0
        contexts = [_as_ids(c) for c in contexts]
        if contexts:
            self.add(contexts)

    def __enter__(self) -> "HFDecodeSession":
        """Hold the model in eval mode for a block of calls (a rollout) instead of per call."""
        self._was_training = self.model.training
        if self._was_training:
            self.model.eval()
        return self

    def __exit__(self, *exc) -> None:
        if getattr(self, "_was_training", False):
            self.model.train()
        self._was_training = False

    # -- reading ------------------------------------------------------------------------------
    @property
    def rows(self) -> list[int]:
        """Live row handles, in batch order."""
        return list(self._handles)

    @property
    def stale(self) -> bool:
        """Whether the model's weights changed since the cache was built (its logits are then old)."""
        return self.engine.model is not self.model or weights_version(self._params) != self.weights_version

    def context(self, row: int) -> list[int]:
        """The ids of ``row`` so far (a copy)."""
        self._check_rows([row])
        return list(self._contexts[row])

    def context_length(self, row: int) -> int:
        """How many ids ``row`` holds."""
        self._check_rows([row])
        return len(self._contexts[row])

    def logits(self, rows: Sequence[int] | None = None) -> torch.Tensor:
        """Next-token logits ``[len(rows), V]`` (float32) after each row's context (all rows by default)."""
        if rows is None:
            return self._logits.clone() if self._logits is not None else torch.zeros(0)
        self._check_rows(rows)
        index = {h: i for i, h in enumerate(self._handles)}
        return self._logits[torch.tensor([index[r] for r in rows], device=self._logits.device)]

    # -- changing -----------------------------------------------------------------------------
    def add(self, contexts: Sequence[Sequence[int]]) -> list[int]:
        """Start rows for ``contexts`` (prefilled now); return their handles."""
        contexts = [_as_ids(c) for c in contexts]
        if not contexts:
            return []
        if any(len(c) == 0 for c in contexts):
            raise ValueError("every context needs at least one token (did the tokenizer add no BOS?)")
        handles = list(range(self._next_handle, self._next_handle + len(contexts)))
        self._next_handle += len(contexts)
        cache, mask, logits = self._prefill(contexts)
        if self._cache is None:
            self._cache, self._mask, self._logits = cache, mask, logits
            self._lengths = mask.sum(-1)
        elif _concat_dynamic_caches(self._cache, cache, self._mask.shape[1], mask.shape[1]):
            width = max(self._mask.shape[1], mask.shape[1])
            self._mask = torch.cat([_pad_mask(self._mask, width), _pad_mask(mask, width)])
            self._lengths = torch.cat([self._lengths, mask.sum(-1)])
            self._logits = torch.cat([self._logits, logits])
        else:  # a cache the session cannot splice: recompute every row together
            everything = [self._contexts[h] for h in self._handles] + contexts
            self._cache, self._mask, self._logits = self._prefill(everything)
            self._lengths = self._mask.sum(-1)
        self._handles += handles
        self._contexts.update(zip(handles, contexts))
        return handles

    def extend(self, tokens: Mapping[int, Sequence[int]]) -> None:
        """Append ``tokens[row]`` to each named row and compute their new next-token logits.

        Rows get any number of tokens (one sampled token, or a completion's last token plus an env
        reply); the model runs once over the longest extension, on the new tokens only.
        """
        tokens = {int(r): _as_ids(t) for r, t in tokens.items()}
        tokens = {r: t for r, t in tokens.items() if t}
        if not tokens:
            return
        self._check_rows(tokens)
        device = self._mask.device
        width = max(len(t) for t in tokens.values())
        # each row's new ids right-aligned in one [B, width] chunk (built as lists: one tensor call)
        if width == 1 and len(tokens) == len(self._handles):  # the per-token step: one id for every row
            chunk = torch.tensor([tokens[h] for h in self._handles], dtype=torch.long).to(device)
            chunk_mask = torch.ones_like(chunk)
            positions = self._lengths[:, None]
            mask = torch.cat([self._mask, chunk_mask], dim=1)
            self._cache, self._logits = self._forward(chunk, mask, positions, self._cache)
        else:
            rows = [tokens.get(h, ()) for h in self._handles]
            chunk = torch.tensor([[self.pad_id] * (width - len(t)) + list(t) for t in rows], dtype=torch.long)
            chunk_mask = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in rows], dtype=torch.long)
            changed = torch.tensor([len(t) > 0 for t in rows])
            chunk, chunk_mask, changed = chunk.to(device), chunk_mask.to(device), changed.to(device)
            positions = (self._lengths[:, None] + chunk_mask.cumsum(-1) - 1).clamp(min=0)
            mask = torch.cat([self._mask, chunk_mask], dim=1)
            self._cache, logits = self._forward(chunk, mask, positions, self._cache)
            self._logits = torch.where(changed[:, None], logits, self._logits)
        self._mask, self._lengths = mask, self._lengths + chunk_mask.sum(-1)
        self.tokens_computed += sum(len(t) for t in tokens.values())
        for h, new in tokens.items():
            self._contexts[h].extend(new)

    def drop(self, rows: Iterable[int]) -> None:
        """Remove finished rows (their cache slots are freed)."""
        rows = set(int(r) for r in rows)
        if not rows:
            return
        self._check_rows(rows)
        keep = [i for i, h in enumerate(self._handles) if h not in rows]
        for h in rows:
            del self._contexts[h]
        self._handles = [self._handles[i] for i in keep]
        if not keep:
            self._cache = self._mask = self._lengths = self._logits = None
            return
        index = torch.tensor(keep, device=self._mask.device)
        self._cache.reorder_cache(index)
        self._mask, self._lengths, self._logits = self._mask[index], self._lengths[index], self._logits[index]
        # columns that were padding for every remaining row (a long row left): cut them off the left
        first = int(self._mask.any(0).long().argmax())
        if first > 0 and _crop_left_dynamic_cache(self._cache, first):
            self._mask = self._mask[:, first:]

    # -- internals ----------------------------------------------------------------------------
    def _check_rows(self, rows: Iterable[int]) -> None:
        unknown = [r for r in rows if r not in self._contexts]
        if unknown:
            raise KeyError(f"rows {unknown} are not live in this session (live rows: {self._handles})")

    def _prefill(self, contexts: list[list[int]]):
        ids, mask = pad_left(contexts, self.pad_id, self.engine.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        shared = shared_rows(contexts)  # a group's samples share their prompt: run it once, copy its cache
        if shared is None:
            cache, logits = self._forward(ids, mask, positions, None)
            self.tokens_computed += int(mask.sum())
        else:
            first, index = torch.tensor(shared[0], device=ids.device), shared[1].to(ids.device)
            cache, logits = self._forward(ids[first], mask[first], positions[first], None)
            cache.reorder_cache(index)
            logits = logits.index_select(0, index)
            self.tokens_computed += int(mask[first].sum())
        self.prefills += 1
        return cache, mask, logits

    def _forward(self, ids, mask, positions, cache):
        kwargs = {self._cache_arg: cache} if cache is not None else {}
        # the engine's eval switch walks every module twice; a per-token call pays it only when needed
        mode = self.engine.eval_mode() if self.model.training else torch.inference_mode()
        with mode:
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                             **self._keep_last, **kwargs)
        return cache_of(out), out.logits[:, -1, :].float()


def _pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - mask.shape[1]
    return mask if missing == 0 else torch.cat([mask.new_zeros((mask.shape[0], missing)), mask], dim=1)


class RecomputeSession:
    """The :class:`HFDecodeSession` interface over any engine with ``next_token_logits``, no cache.

    Every :meth:`extend` recomputes the extended rows' whole contexts — the behaviour before
    sessions existed, kept for engines that cannot hold a cache between calls.

    Example:
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> from llmgym.engines import HFEngine
        >>> from llmgym.engines.session import RecomputeSession
        >>> tok = build_tokenizer()
        >>> engine = HFEngine(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)), tok)
        >>> session = RecomputeSession(engine, [[5, 6]])
        >>> session.extend({0: [7]})
        >>> session.logits([0]).shape[0], session.tokens_computed
        (1, 5)
    """

    def __init__(self, engine, contexts: Iterable[Sequence[int]] = ()):
        self.engine = engine
        model = getattr(engine, "model", None)
        self._params = list(model.parameters()) if isinstance(model, torch.nn.Module) else None
        self.weights_version = weights_version(self._params) if self._params is not None else None
        self._contexts: dict[int, list[int]] = {}
        self._logits: dict[int, torch.Tensor] = {}
        self._handles: list[int] = []
        self._next_handle = 0
        self.tokens_computed = 0
        self.prefills = 0
        contexts = [_as_ids(c) for c in contexts]
        if contexts:
            self.add(contexts)

    def __enter__(self) -> "RecomputeSession":
        return self

    def __exit__(self, *exc) -> None:
        return None

    @property
    def rows(self) -> list[int]:
        return list(self._handles)

    @property
    def stale(self) -> bool:
        return self._params is not None and weights_version(self._params) != self.weights_version

    def context(self, row: int) -> list[int]:
        return list(self._contexts[row])

    def context_length(self, row: int) -> int:
        return len(self._contexts[row])

    def logits(self, rows: Sequence[int] | None = None) -> torch.Tensor:
        rows = self._handles if rows is None else rows
        missing = [r for r in rows if r not in self._contexts]
        if missing:
            raise KeyError(f"rows {missing} are not live in this session (live rows: {self._handles})")
        return torch.stack([self._logits[r] for r in rows])

    def _compute(self, rows: list[int]) -> None:
        contexts = [self._contexts[r] for r in rows]
        logits = self.engine.next_token_logits(contexts)
        self.tokens_computed += sum(len(c) for c in contexts)
        self._logits.update(zip(rows, logits))

    def add(self, contexts: Sequence[Sequence[int]]) -> list[int]:
        contexts = [_as_ids(c) for c in contexts]
        if any(len(c) == 0 for c in contexts):
            raise ValueError("every context needs at least one token (did the tokenizer add no BOS?)")
        handles = list(range(self._next_handle, self._next_handle + len(contexts)))
        self._next_handle += len(contexts)
        self._handles += handles
        self._contexts.update(zip(handles, contexts))
        if handles:
            self._compute(handles)
            self.prefills += 1
        return handles

    def extend(self, tokens: Mapping[int, Sequence[int]]) -> None:
        tokens = {int(r): _as_ids(t) for r, t in tokens.items()}
        tokens = {r: t for r, t in tokens.items() if t}
        missing = [r for r in tokens if r not in self._contexts]
        if missing:
            raise KeyError(f"rows {missing} are not live in this session (live rows: {self._handles})")
        for r, new in tokens.items():
            self._contexts[r].extend(new)
        if tokens:
            self._compute(list(tokens))

    def drop(self, rows: Iterable[int]) -> None:
        rows = set(int(r) for r in rows)
        for r in rows:
            del self._contexts[r], self._logits[r]
        self._handles = [h for h in self._handles if h not in rows]


class TokenStepper:
    """Next-token logits for your own token loop, with the KV cache reused between calls.

    A drop-in for ``engine.next_token_logits(contexts)``: when a context extends one seen before (by
    the token just emitted, or by an env's reply), only the new tokens are run through the model;
    any other context (a reset, another episode) starts a fresh cache. Up to ``max_contexts`` caches
    are kept (least recently used dropped), so interleaved episodes each keep theirs. A change of the
    model's weights (an optimiser step, ``sync_weights``) discards every cache.

    Engines without :meth:`open_session` fall back to ``next_token_logits`` (no cache).

    Args:
        engine: an :class:`~llmgym.engines.HFEngine` (or any engine with ``next_token_logits``).
        max_contexts: caches kept at once.

    Example:
        >>> import torch
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> from llmgym.engines import HFEngine, TokenStepper
        >>> tok = build_tokenizer()
        >>> engine = HFEngine(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)), tok)
        >>> stepper = TokenStepper(engine)
        >>> context = [5, 6, 7]
        >>> for _ in range(4):
        ...     token = int(stepper.next_token_logits([context])[0].argmax())
        ...     context = context + [token]
        >>> torch.allclose(stepper.next_token_logits([context]), engine.next_token_logits([context]), atol=1e-5)
        True
        >>> stepper.reuses, stepper.rebuilds
        (4, 1)
    """

    def __init__(self, engine, max_contexts: int = 8):
        if max_contexts < 1:
            raise ValueError(f"max_contexts must be >= 1, got {max_contexts}")
        self.engine = engine
        self.max_contexts = max_contexts
        self._sessions: collections.OrderedDict[int, Any] = collections.OrderedDict()  # id -> one-row session
        self._next_id = 0
        self.reuses = 0
        self.rebuilds = 0

    def reset(self) -> None:
        """Forget every cache."""
        self._sessions.clear()

    def next_token_logits(self, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Logits ``[B, V]`` (float32) of the next token after each context."""
        rows = [self._logits_of(_as_ids(c)) for c in contexts]
        return torch.stack(rows) if rows else torch.zeros(0)

    def _logits_of(self, ids: list[int]) -> torch.Tensor:
        if not ids:
            raise ValueError("a context needs at least one token")
        # every cache was built (or cleared) at the last call's weights: checking one checks all
        if self._sessions and next(iter(self._sessions.values())).stale:
            self._sessions.clear()  # new weights: every cached key/value is out of date
        best, best_len = None, -1
        for sid, session in self._sessions.items():
            n = session.context_length(0)
            if best_len < n <= len(ids) and session._contexts[0] == ids[:n]:
                best, best_len = sid, n
        if best is None:
            session = open_decode_session(self.engine, [ids])
            best = self._next_id
            self._next_id += 1
            self._sessions[best] = session
            self.rebuilds += 1
            while len(self._sessions) > self.max_contexts:
                self._sessions.popitem(last=False)
        else:
            session = self._sessions[best]
            self._sessions.move_to_end(best)
            if best_len < len(ids):
                session.extend({0: ids[best_len:]})
            self.reuses += 1
        return session.logits([0])[0]


def open_decode_session(engine, contexts: Sequence[Sequence[int]] = ()) -> DecodeSession:
    """A :class:`DecodeSession` over ``engine``: its own (cached) one, else a recomputing one.

    Uses ``engine.open_session`` where the engine has it and it does not raise
    ``NotImplementedError``; otherwise a :class:`RecomputeSession` over
    ``engine.next_token_logits`` (the whole context at every call). An engine with neither (vLLM)
    cannot step one token at a time: ``TypeError``. ``engine`` may also be the
    :class:`~llmgym.engines.base.EngineView` a rollout already holds.

    Example:
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> from llmgym.engines import HFEngine, open_decode_session
        >>> tok = build_tokenizer()
        >>> engine = HFEngine(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)), tok)
        >>> session = open_decode_session(engine, [[5, 6], [7]])
        >>> type(session).__name__, session.logits().shape[0]
        ('HFDecodeSession', 2)
    """
    view = engine if isinstance(engine, EngineView) else EngineView.of(engine)
    if view.open_session is not None:
        try:
            return view.open_session(contexts)
        except NotImplementedError:
            pass
    if view.next_token_logits is not None:
        return RecomputeSession(view.engine, contexts)
    raise TypeError(
        f"{type(view.engine).__name__} cannot step one token at a time (it has neither open_session nor "
        f"next_token_logits); use HFEngine for token-level envs, or the sequence-level env"
    )


def token_stepper(owner: Any) -> TokenStepper:
    """The :class:`TokenStepper` kept on ``owner`` (an agent) for its ``engine``, made on first use.

    A new one replaces it when ``owner.engine`` is swapped, so a cache never outlives its engine.

    Example:
        >>> from types import SimpleNamespace
        >>> from llmgym.engines.session import token_stepper
        >>> agent = SimpleNamespace(engine=object())
        >>> token_stepper(agent) is token_stepper(agent)
        True
    """
    stepper = getattr(owner, "_token_stepper", None)
    if stepper is None or stepper.engine is not owner.engine:
        stepper = TokenStepper(owner.engine)
        owner._token_stepper = stepper
    return stepper
