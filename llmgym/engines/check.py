"""``check_engine``: the rollout-engine contract as a checker a user can run, as ``check_env`` is for envs.

A new engine (a class with ``generate``, ``sync_weights``, ``tokenizer`` and ``pad_id``) passes
:func:`check_engine` before an agent trusts it: the shapes and types of what it returns, per-token
log-probs that are log-probabilities, finish reasons that match the tokens, sampling keys that reproduce
a row whatever batch it is in, and, given the model the engine samples from, log-probs equal to that
model's own teacher-forced ones and a ``sync_weights`` that takes. Every engine of llmgym passes it in the
suite (``tests/engines/``).

Example:
    >>> from llmgym.engines import HFEngine, check_engine
    >>> from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer
    >>> tok = build_tokenizer()
    >>> model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64))
    >>> check_engine(HFEngine(model, tok), model=model)
    >>> class Broken(HFEngine):
    ...     def generate(self, prompt_ids, sampling=None, *, keys=None):
    ...         return super().generate(prompt_ids, sampling, keys=keys)[:-1]
    >>> check_engine(Broken(model, tok))
    Traceback (most recent call last):
    ...
    llmgym.engines.check.EngineContractError: Broken.generate returned 1 groups for 2 prompts (one list of n completions per prompt)
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from llmgym.engines.base import OPTIONAL_MEMBERS, Completion, Engine, SamplingParams
from llmgym.errors import LLMGymError

__all__ = ["EngineContractError", "check_engine"]

_CALLABLE = ("generation_done", "open_session", "next_token_logits", "close", "check_logprobs", "screen_batch",
             "score_tokens")
_TYPES = {"max_batch_size": int, "versioned_weights": bool, "top_p_renormalised_logprobs": bool}


class EngineContractError(LLMGymError, AssertionError):
    """An engine broke the contract :func:`check_engine` checks; the message names the member and the promise."""


def _fail(message: str) -> None:
    raise EngineContractError(message)


def _check_members(engine: Any, name: str) -> None:
    if not isinstance(engine, Engine):
        missing = [m for m in ("generate", "sync_weights", "tokenizer", "pad_id") if not hasattr(engine, m)]
        _fail(f"{name} is not an Engine: it lacks {', '.join(missing)} (llmgym.engines.Engine)")
    if not isinstance(engine.pad_id, int) or isinstance(engine.pad_id, bool):
        _fail(f"{name}.pad_id must be an int token id, got {engine.pad_id!r}")
    for member in OPTIONAL_MEMBERS:
        value = getattr(engine, member, None)
        if value is None:
            continue
        if member in _CALLABLE and not callable(value):
            _fail(f"{name}.{member} must be callable ({OPTIONAL_MEMBERS[member][1]})")
        if member in _TYPES and (not isinstance(value, _TYPES[member]) or (member == "max_batch_size" and value < 0)):
            _fail(f"{name}.{member} must be a {'non-negative ' if member == 'max_batch_size' else ''}"
                  f"{_TYPES[member].__name__}, got {value!r}")
        if member == "eos_ids" and not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
            _fail(f"{name}.eos_ids must be token ids (ints), got {list(value)!r}")
        if member == "policy_version" and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            _fail(f"{name}.policy_version must be None or a non-negative int, got {value!r}")


def _check_completion(name: str, c: Any, prompt: list[int], max_new: int, eos: int | None, tokenizer) -> None:
    if not isinstance(c, Completion):
        _fail(f"{name}.generate must return llmgym.engines.Completion objects, got {type(c).__name__}")
    if list(c.prompt_ids) != prompt:
        _fail(f"{name}: a completion's prompt_ids are not the prompt it was generated for")
    if not 1 <= len(c.token_ids) <= max_new:
        _fail(f"{name}: a completion has {len(c.token_ids)} tokens, outside 1..max_new_tokens={max_new}")
    if len(c.logprobs) != len(c.token_ids):
        _fail(f"{name}: {len(c.logprobs)} log-probs for {len(c.token_ids)} tokens (one per sampled token)")
    bad = [lp for lp in c.logprobs if not (isinstance(lp, float) and math.isfinite(lp) and -1e4 < lp <= 1e-6)]
    if bad:
        _fail(f"{name}: log-prob {bad[0]!r} is not a log-probability (finite, in (-1e4, 0])")
    if c.finish_reason not in ("stop", "length"):
        _fail(f"{name}: finish_reason {c.finish_reason!r} (expected 'stop' or 'length')")
    if eos is not None:
        if c.finish_reason == "length" and (len(c.token_ids) != max_new or eos in c.token_ids):
            _fail(f"{name}: finish_reason 'length' on a completion of {len(c.token_ids)} tokens "
                  f"(max_new_tokens={max_new}) or one that holds EOS")
        if c.finish_reason == "stop" and (c.token_ids[-1] != eos or eos in c.token_ids[:-1]):
            _fail(f"{name}: finish_reason 'stop' without stop strings must end at EOS, kept as the last token")
    if c.text != tokenizer.decode(c.token_ids, skip_special_tokens=True):
        _fail(f"{name}: a completion's text is not its token_ids decoded without special tokens")


def _teacher_forced(model, tokenizer, c: Completion) -> torch.Tensor:
    from llmgym.engines.hf import sequence_logprobs

    device = next(model.parameters()).device
    ids = torch.tensor([c.prompt_ids + c.token_ids], device=device)
    with torch.no_grad():
        logprobs = sequence_logprobs(model, ids, torch.ones_like(ids), 1.0)
    return logprobs[0, len(c.prompt_ids) - 1:].float().cpu()


def _check_scores(name: str, engine: Any, completions: list[Completion], tol: float) -> None:
    """``score_tokens`` of generated rows: one log-probability per token after the first, equal to the log-probs
    ``generate`` reported for the sampled tokens (both at temperature 1)."""
    sequences = [list(c.prompt_ids) + list(c.token_ids) for c in completions]
    scores = engine.score_tokens(sequences)
    if not isinstance(scores, list) or len(scores) != len(sequences):
        _fail(f"{name}.score_tokens returned {len(scores) if isinstance(scores, list) else type(scores).__name__} "
              f"rows for {len(sequences)} sequences")
    for seq, row, c in zip(sequences, scores, completions):
        if len(row) != len(seq) - 1:
            _fail(f"{name}.score_tokens gave {len(row)} log-probs for a sequence of {len(seq)} tokens "
                  f"(one per token after the first)")
        bad = [lp for lp in row if not (isinstance(lp, float) and math.isfinite(lp) and -1e4 < lp <= 1e-6)]
        if bad:
            _fail(f"{name}.score_tokens: {bad[0]!r} is not a log-probability (finite, in (-1e4, 0])")
        worst = max(abs(a - b) for a, b in zip(row[len(c.prompt_ids) - 1:], c.logprobs))
        if worst > tol:
            _fail(f"{name}.score_tokens differs from the log-probs generate reported for the same tokens by "
                  f"{worst:.3g} nats > {tol}")


def check_engine(
    engine: Any,
    *,
    model: Any = None,
    prompts: Sequence[Sequence[int]] | None = None,
    max_new_tokens: int = 8,
    logprob_tol: float = 1e-2,
    min_agreement: float = 0.75,
    sync: bool = True,
) -> None:
    """Check that ``engine`` keeps the rollout-engine contract; raise :class:`EngineContractError` if not.

    Checks the required members (``generate``, ``sync_weights``, ``tokenizer``, an int ``pad_id``) and the
    types of any :data:`~llmgym.engines.base.OPTIONAL_MEMBERS` the engine has; that ``generate`` returns
    ``n`` :class:`~llmgym.engines.Completion`\\ s per prompt with one finite log-probability per token,
    ``finish_reason`` ``"length"`` exactly at the budget and ``"stop"`` exactly at EOS, and text that is
    the decoded tokens; that the same keys give the same rows (at least ``min_agreement`` of them: vLLM's
    batched kernels may flip a near-tie) whatever batch a row is in, and that other seeds differ.

    An engine with ``score_tokens`` scores the rows it generated: one log-probability per token after the
    first, equal to what ``generate`` reported for the sampled tokens within ``logprob_tol``.

    With ``model`` (the weights the engine samples from), also: per-token log-probs within
    ``logprob_tol`` nats of the model's teacher-forced ones (temperature 1), and ``sync_weights(model)``
    runs and leaves them so (``sync=False`` for an engine that samples from weights it cannot take, a
    served model's: its log-probs are still compared with ``model``'s).

    Example:
        >>> from llmgym.engines import HFEngine, check_engine
        >>> from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer
        >>> tok = build_tokenizer()
        >>> engine = HFEngine(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)), tok)
        >>> engine.pad_id = "0"
        >>> check_engine(engine)
        Traceback (most recent call last):
        ...
        llmgym.engines.check.EngineContractError: HFEngine.pad_id must be an int token id, got '0'
    """
    name = type(engine).__name__
    _check_members(engine, name)
    tokenizer = engine.tokenizer
    prompts = [list(map(int, p)) for p in (prompts or [tokenizer.encode("12+3="), tokenizer.encode("a longer prompt")])]
    eos = getattr(tokenizer, "eos_token_id", None)
    n = 3
    sampling = SamplingParams(n=n, max_new_tokens=max_new_tokens, seed=11)
    groups = engine.generate(prompts, sampling)
    if not isinstance(groups, list) or len(groups) != len(prompts):
        _fail(f"{name}.generate returned {len(groups) if isinstance(groups, list) else type(groups).__name__} "
              f"groups for {len(prompts)} prompts (one list of n completions per prompt)")
    for prompt, group in zip(prompts, groups):
        if len(group) != n:
            _fail(f"{name}.generate returned {len(group)} completions for a prompt with n={n}")
        for c in group:
            _check_completion(name, c, prompt, max_new_tokens, eos, tokenizer)
    flat = [c for g in groups for c in g]
    again = [c for g in engine.generate(prompts, sampling) for c in g]
    same = sum(a.token_ids == b.token_ids for a, b in zip(flat, again))
    if same < min_agreement * len(flat):
        _fail(f"{name}: the same seed reproduced {same} of {len(flat)} rows")
    alone = engine.generate([prompts[-1]], SamplingParams(n=1, max_new_tokens=max_new_tokens), keys=[flat[-1].key])
    if len(alone) != 1 or len(alone[0]) != 1:
        _fail(f"{name}.generate with explicit keys returned the wrong number of completions")
    if min_agreement >= 1 and alone[0][0].token_ids != flat[-1].token_ids:
        _fail(f"{name}: a row's key did not reproduce its tokens in a batch of its own")
    other = [c for g in engine.generate(prompts, SamplingParams(n=n, max_new_tokens=max_new_tokens, seed=12)) for c in g]
    if sum(a.token_ids != b.token_ids for a, b in zip(flat, other)) == 0:
        _fail(f"{name}: seeds 11 and 12 sampled the very same rows (is the seed ignored?)")
    scores = getattr(engine, "score_tokens", None) is not None
    if model is None:
        if scores:
            _check_scores(name, engine, flat, logprob_tol)
        return
    if sync:
        engine.sync_weights(model)
    for c in [c for g in engine.generate(prompts, sampling) for c in g]:
        worst = float((torch.tensor(c.logprobs) - _teacher_forced(model, tokenizer, c)).abs().max())
        if worst > logprob_tol:
            _fail(f"{name}: reported log-probs differ from the model's teacher-forced ones by {worst:.3g} nats "
                  f"> {logprob_tol}")
    if scores:  # after the log-probs were checked against the model: the scores are then checked against it too
        _check_scores(name, engine, flat, logprob_tol)
