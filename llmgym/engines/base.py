"""The rollout-engine contract: :class:`SamplingParams` in, :class:`Completion` out."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

import torch

from llmgym.engines.sampling import row_keys

__all__ = ["SamplingParams", "Completion", "Engine", "OPTIONAL_MEMBERS", "optional_member", "EngineView", "DecodeSession",
           "expand_rows", "sync_engine_weights"]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample completions.

    Args:
        n: completions per prompt (a GRPO group).
        temperature: softmax temperature; ``0`` means greedy.
        top_p: nucleus sampling mass (``1.0`` = off).
        max_new_tokens: token budget per completion; hitting it gives ``finish_reason="length"``.
        stop: strings that end a completion (``finish_reason="stop"``); the tokens that complete the
            stop string are kept.
        seed: makes sampling reproducible; ``None`` draws one from torch's global generator.

    Example:
        >>> from llmgym.engines import SamplingParams
        >>> SamplingParams(n=4, temperature=0.7).n
        4
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))


@dataclasses.dataclass
class Completion:
    """One sampled completion.

    Attributes:
        prompt_ids: the ids the model conditioned on.
        token_ids: the sampled ids (EOS included when the model emitted it).
        logprobs: per sampled token, its log-prob under **the distribution it was drawn from**:
            ``log softmax(logits / T)`` of the model at that position, and with ``top_p < 1`` that
            nucleus renormalised (``log p(y) − log S``, ``S`` the tempered mass the nucleus keeps;
            :func:`~llmgym.engines.sampling.nucleus_log_mass`): the behaviour policy of importance
            weights. The learner's policy is the untruncated ``p``; it adds its own ``log S`` back
            (:mod:`llmgym.agents.truncation`). Greedy (``T = 0``) reports the ``T = 1`` log-prob.
        finish_reason: ``"stop"`` (EOS or a stop string) or ``"length"`` (budget spent).
        text: ``token_ids`` decoded without special tokens.
        key: the sampling key of this row (reproduces its noise; see :mod:`llmgym.engines.sampling`).
        policy_version: the version of the weights that sampled it, where the engine knows it (a fleet
            of rollout servers reports the version it synced; ``None``: the engine does not say).
    """

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str = ""
    key: int = 0
    policy_version: int | None = None


@runtime_checkable
class Engine(Protocol):
    """What an agent needs from a rollout engine: the required members.

    ``generate`` returns, for each prompt, ``n`` completions (a list per prompt, in prompt order).
    ``keys`` optionally fixes the per-row sampling keys (``len(prompts) * n`` of them, prompt-major),
    which makes a row's tokens independent of the batch it is generated in.
    ``sync_weights(model)`` makes the engine sample from ``model``'s current weights.
    ``tokenizer`` is the tokenizer whose ids the engine reads and writes; ``pad_id`` the id it pads with.

    An engine may also have any of the :data:`OPTIONAL_MEMBERS` (read through :func:`optional_member`,
    which gives the declared default where an engine has none); :func:`llmgym.engines.check_engine`
    checks both kinds, as ``check_env`` checks an env.
    """

    tokenizer: Any
    pad_id: int

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams | None = None,
        *,
        keys: Sequence[int] | None = None,
    ) -> list[list[Completion]]: ...

    def sync_weights(self, model) -> None: ...


OPTIONAL_MEMBERS: dict[str, tuple[Any, str]] = {
    "eos_ids": ((), "token ids that end a completion besides the tokenizer's EOS (a chat template's end of turn)"),
    "max_batch_size": (0, "the most rows one ``generate`` call takes (0: any number); a rollout splits a turn so"),
    "policy_version": (None, "the version of the weights the engine samples from now (``None``: it does not say)"),
    "versioned_weights": (False, "``sync_weights(model, version=N)`` records N as the policy version"),
    "top_p_renormalised_logprobs": (False, "with ``top_p < 1`` a log-prob is under the renormalised nucleus it was "
                                           "drawn from (every llmgym engine; ``False``: the engine reports the full "
                                           "softmax's, and the learner takes it as it is)"),
    "generation_done": (None, "``generation_done()``: the rollout is done generating for now (a colocated "
                              "engine may free memory while completions are verified)"),
    "open_session": (None, "``open_session(contexts) -> DecodeSession``: incremental decoding for token level"),
    "next_token_logits": (None, "``next_token_logits(contexts) -> [N, V]``: recomputed next-token logits"),
    "close": (None, "``close()``: release the engine's memory, processes or connections"),
    "check_logprobs": (None, "``check_logprobs(batch, learner_logprobs, version)``: an engine that cannot be taken "
                             "at its word (a fleet of servers) checks the log-probs it reported against the "
                             "learner's recomputation, which the update calls before any optimiser step"),
    "screen_batch": (None, "``screen_batch(batch, scores) -> [bool]``: an engine that cannot be taken at its word "
                           "checks its reported log-probs and its samples against the learner's scores "
                           "(:class:`llmgym.fleet.trust.TokenScores`) before the batch is used, and says which "
                           "rows stay"),
    "score_tokens": (None, "``score_tokens(sequences) -> [[float]]``: each sequence's teacher-forced log-probs at "
                           "temperature 1, one per token after the first (a teacher grading a student's tokens)"),
}
"""The members an engine may have, each with the default a rollout assumes where it has none, and its meaning."""


def optional_member(engine: Any, name: str) -> Any:
    """``engine.<name>`` for one of :data:`OPTIONAL_MEMBERS`, or its declared default where the engine has none.

    Example:
        >>> from llmgym.engines.base import optional_member
        >>> class Minimal:
        ...     max_batch_size = 8
        >>> optional_member(Minimal(), "max_batch_size"), optional_member(Minimal(), "eos_ids")
        (8, ())
    """
    if name not in OPTIONAL_MEMBERS:
        raise KeyError(f"{name!r} is not an optional engine member (OPTIONAL_MEMBERS: {', '.join(OPTIONAL_MEMBERS)})")
    value = getattr(engine, name, None)
    return OPTIONAL_MEMBERS[name][0] if value is None else value


@dataclasses.dataclass(frozen=True)
class EngineView:
    """An engine as a rollout drives it: its optional members read once, each with its declared default.

    A rollout builds one per call (:meth:`of`) and reads these fields instead of asking the engine
    member by member. ``policy_version`` alone is read afresh each time: it changes as weights are
    synced while a pipelined learner rolls out.

    Example:
        >>> from llmgym.engines.base import EngineView
        >>> class Minimal:
        ...     max_batch_size = 8
        ...     eos_ids = [2]
        >>> view = EngineView.of(Minimal())
        >>> view.max_batch_size, view.eos_ids, view.generation_done, view.policy_version
        (8, (2,), None, None)
    """

    engine: Any
    eos_ids: tuple[int, ...]
    max_batch_size: int
    generation_done: Callable[[], Any] | None
    open_session: Callable[..., DecodeSession] | None
    next_token_logits: Callable[..., Any] | None

    @classmethod
    def of(cls, engine: Any) -> EngineView:
        """The view of ``engine`` (its :data:`OPTIONAL_MEMBERS` through :func:`optional_member`)."""
        return cls(engine=engine, eos_ids=tuple(optional_member(engine, "eos_ids")),
                   max_batch_size=int(optional_member(engine, "max_batch_size")),
                   generation_done=optional_member(engine, "generation_done"),
                   open_session=optional_member(engine, "open_session"),
                   next_token_logits=optional_member(engine, "next_token_logits"))

    @property
    def policy_version(self) -> int | None:
        """The version of the weights the engine samples from now (``None``: it does not say)."""
        return optional_member(self.engine, "policy_version")

    @property
    def steps_tokens(self) -> bool:
        """Whether the engine can drive a token-level env (it has ``open_session`` or ``next_token_logits``)."""
        return self.open_session is not None or self.next_token_logits is not None


@runtime_checkable
class DecodeSession(Protocol):
    """Incremental decoding over a batch of growing contexts (token level at sequence-level cost).

    An engine that can keep its KV cache between calls offers ``engine.open_session(contexts)``
    returning one (:class:`llmgym.engines.session.HFDecodeSession`);
    :func:`llmgym.engines.session.open_decode_session` falls back to recomputing whole contexts for engines that cannot. Rows are integer handles:

    * ``add(contexts) -> handles``: rows join (a new episode; prefilled now);
    * ``logits(rows) -> [len(rows), V]``: each row's next-token logits (float32);
    * ``extend({row: ids})``: append ids to rows — a sampled token, or a token plus an env's reply —
      and compute only what is new; rows may grow by different amounts, or not at all;
    * ``drop(rows)``: rows leave (their episode or turn is over);
    * ``context(row)`` / ``context_length(row)``: the ids a row holds;
    * ``stale``: the model's weights changed since the cache was built.

    A session is also a context manager: ``with session:`` holds the model in eval mode for a block
    of calls (a rollout) instead of switching it per call.
    """

    @property
    def rows(self) -> list[int]: ...

    @property
    def stale(self) -> bool: ...

    def add(self, contexts: Sequence[Sequence[int]]) -> list[int]: ...

    def logits(self, rows: Sequence[int] | None = None): ...

    def extend(self, tokens: Mapping[int, Sequence[int]]) -> None: ...

    def drop(self, rows: Iterable[int]) -> None: ...

    def context(self, row: int) -> list[int]: ...

    def context_length(self, row: int) -> int: ...


def expand_rows(
    prompt_ids: Sequence[Sequence[int]],
    sampling: SamplingParams | None,
    keys: Sequence[int] | None,
) -> tuple[SamplingParams, list[list[int]], list[list[int]], list[int]]:
    """Check a ``generate`` request; return ``(sampling, prompts, rows, keys)``, one row per sample.

    Rows are prompt-major (``n`` copies of each prompt); without explicit ``keys`` they are derived
    from ``sampling.seed`` (or a seed drawn from torch's global generator).

    Example:
        >>> from llmgym.engines.base import SamplingParams, expand_rows
        >>> _, prompts, rows, keys = expand_rows([[1, 2], [3]], SamplingParams(n=2, seed=0), None)
        >>> rows, len(keys)
        ([[1, 2], [1, 2], [3], [3]], 4)
    """
    sampling = sampling or SamplingParams()
    prompts = [list(map(int, p)) for p in prompt_ids]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (did the tokenizer add no BOS to an empty prompt?)")
    rows = [p for p in prompts for _ in range(sampling.n)]
    if keys is None:
        seed = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, (1,)))
        keys = row_keys(seed, len(rows))
    elif len(keys) != len(rows):
        raise ValueError(f"got {len(keys)} keys for {len(rows)} rows (prompts x n)")
    return sampling, prompts, rows, [int(k) for k in keys]


def sync_engine_weights(engine, model, version: int) -> None:
    """``engine.sync_weights(model)``, telling an engine that records versions (one whose
    ``versioned_weights`` is true, as :class:`~llmgym.fleet.fleet_engine.FleetEngine`'s) that these weights are
    policy version ``version`` (the number of updates behind them); other engines get the plain call.

    Example:
        >>> from llmgym.engines.base import sync_engine_weights
        >>> class Recorder:
        ...     versioned_weights = True
        ...     def sync_weights(self, model, *, version=None):
        ...         self.version = version
        >>> engine = Recorder()
        >>> sync_engine_weights(engine, model=None, version=3)
        >>> engine.version
        3
    """
    if optional_member(engine, "versioned_weights"):
        engine.sync_weights(model, version=int(version))
    else:
        engine.sync_weights(model)
