"""Keyed sampling: a row's draw depends only on its logits and ``(key, position)``, never on the batch.

Sampling is by inverse CDF: one uniform ``u`` per row and position, made by a counter-based hash
(splitmix64) of the row's key and the position within the completion, picks the first token whose
cumulative probability exceeds ``u`` times the total,

    token = min { i : p_0 + ... + p_i > u · Σ p }        (p = softmax(logits / T), top-p applied)

— exactly a draw from ``p`` when ``u`` is uniform. The same key therefore reproduces the same tokens
whether a completion is generated in a batch of 64 by :class:`~llmgym.engines.HFEngine` or one token
at a time through a token-level env, on CPU or GPU (up to float round-off of the logits). It is what
``torch.multinomial`` does, keyed: one ``cumsum`` and one ``searchsorted`` over ``[B, V]``; the
integer hash runs over ``[B]`` values only, eagerly, never inside a compiled graph (Triton refused
the 64-bit constants of a hash over ``[B, V]`` when it was compiled: issue 28).

The log-prob a draw reports is of **the distribution it was drawn from**: with top-p that is the
nucleus renormalised, ``log q(y) = log p(y) − log S`` with ``S`` the tempered mass the nucleus keeps
(:func:`nucleus_log_mass`) — what vLLM's ``processed_logprobs`` report too, so every engine means the
same thing by a log-prob. The learner, whose policy is the untruncated ``p``, adds its own ``log S``
back before comparing (:mod:`llmgym.agents.truncation`).
"""

from __future__ import annotations

import torch

__all__ = ["row_keys", "keyed_uniforms", "sample_next_token", "tempered_logprobs", "nucleus_log_mass"]

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed 64-bit integer
_MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685  # 0x94D049BB133111EB


def _lshr(x: torch.Tensor, bits: int) -> torch.Tensor:
    # torch's >> on int64 is arithmetic; mask to get the logical shift splitmix64 needs
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = (x ^ _lshr(x, 30)) * _MIX1
    x = (x ^ _lshr(x, 27)) * _MIX2
    return x ^ _lshr(x, 31)


def row_keys(seed: int, num_rows: int) -> list[int]:
    """The sampling keys ``generate`` uses for rows ``0..num_rows-1`` given ``seed``.

    Example:
        >>> from llmgym.engines.sampling import row_keys
        >>> row_keys(0, 3) == row_keys(0, 3), row_keys(0, 2) == row_keys(1, 2)
        (True, False)
    """
    seeds = torch.full((num_rows,), int(seed) & 0x7FFFFFFFFFFFFFFF, dtype=torch.long)
    return _mix(_mix(seeds) + torch.arange(num_rows) * _GOLDEN).tolist()


def keyed_uniforms(keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One uniform draw in ``(0, 1)`` (float64) per ``(key, position)`` pair; shapes broadcast.

    52 hashed bits: the values are ``(k + 0.5) / 2**52``, never exactly 0 or 1.

    Example:
        >>> import torch
        >>> from llmgym.engines.sampling import keyed_uniforms
        >>> u = keyed_uniforms(torch.tensor([7, 8]), torch.tensor([0, 0]))
        >>> u.dtype, bool(((u > 0) & (u < 1)).all()), u[1] == keyed_uniforms(torch.tensor([8]), torch.tensor([0]))[0]
        (torch.float64, True, tensor(True))
    """
    bits = _mix(_mix(keys.long() * _GOLDEN + positions.long().to(keys.device)))
    return (_lshr(bits, 12).double() + 0.5) * (2.0**-52)


def tempered_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log_softmax(logits / T)`` in float32; ``T = 0`` (greedy) is scored as ``T = 1``.

    Example:
        >>> import torch
        >>> from llmgym.engines.sampling import tempered_logprobs
        >>> tempered_logprobs(torch.zeros(1, 4), 0.5).exp().sum().item()
        1.0
    """
    t = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits.float() / t, dim=-1)


def _nucleus(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(sorted probs, their float64 cdf, kept count [B, 1], kept mass [B, 1])`` of the top-p nucleus: the
    smallest prefix of the most likely tokens whose mass reaches ``top_p`` (at least one token; equal
    probabilities ordered by token id, a stable sort, so every device keeps the same set)."""
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    cdf = sorted_p.cumsum(-1, dtype=torch.float64)
    kept = ((cdf - sorted_p) < top_p).sum(-1, keepdim=True).clamp_(min=1)  # a prefix: mass before it < top_p
    return order, cdf, kept, cdf.gather(-1, kept - 1)


def nucleus_log_mass(logprobs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``log S`` per row of ``logprobs`` ``[..., V]`` (a tempered log-softmax): the log of the mass the top-p
    nucleus keeps, the offset between a sampler's log-prob ``log q(y) = log p(y) − log S`` and the full
    softmax's. ``0`` (no truncation) when ``top_p >= 1``.

    Example:
        >>> import math, torch
        >>> from llmgym.engines.sampling import nucleus_log_mass
        >>> lp = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
        >>> round(math.exp(nucleus_log_mass(lp, 0.75).item()), 6)  # 0.5 + 0.3 reach 0.75
        0.8
        >>> round(math.exp(nucleus_log_mass(lp, 0.4).item()), 6), nucleus_log_mass(lp, 1.0).item()
        (0.5, 0.0)
    """
    if top_p >= 1.0:
        return torch.zeros(logprobs.shape[:-1], dtype=torch.float32, device=logprobs.device)
    flat = logprobs.reshape(-1, logprobs.shape[-1]).float()
    total = _nucleus(flat.exp(), top_p)[3]
    return total.log().float().reshape(logprobs.shape[:-1])


def sample_next_token(
    logits: torch.Tensor,
    keys: torch.Tensor | None,
    positions: torch.Tensor | None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return ``(tokens [B], logprobs [B])``.

    ``logits`` is ``[B, V]``; ``keys`` and ``positions`` are ``[B]``. The log-prob is of the distribution
    the token was drawn from: the tempered one (see :func:`tempered_logprobs`), and with ``top_p < 1`` its
    nucleus renormalised (``log p(y) − log S``, :func:`nucleus_log_mass`); greedy (``temperature = 0``)
    draws nothing and reports the ``T = 1`` log-prob. ``uniforms`` ``[B]`` replaces
    ``keyed_uniforms(keys, positions)`` (then ``keys`` and ``positions`` may be ``None``) when a caller
    has computed them already: an engine hashes every position of a rollout at once. Top-p keeps the
    smallest set of most likely tokens whose mass reaches ``top_p`` (at least one; equal
    probabilities ordered by token id) and draws within it, renormalised.

    Example:
        >>> import torch
        >>> from llmgym.engines.sampling import sample_next_token
        >>> logits = torch.tensor([[0.0, 5.0, 0.0]])
        >>> tok, lp = sample_next_token(logits, torch.tensor([1]), torch.tensor([0]), temperature=0)
        >>> tok.item()
        1
        >>> masked = torch.tensor([[0.0, float("-inf"), 0.0]])
        >>> [sample_next_token(masked, torch.tensor([k]), torch.tensor([0]))[0].item() != 1 for k in range(4)]
        [True, True, True, True]
        >>> lp = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))  # top-p 0.75 keeps 0.5 + 0.3: q = p / 0.8
        >>> tok, q = sample_next_token(lp, torch.tensor([3]), torch.tensor([0]), top_p=0.75)
        >>> round(q.exp().item(), 6) == round(lp[0, tok].exp().item() / 0.8, 6)
        True
    """
    logprobs = tempered_logprobs(logits, temperature)
    if temperature == 0:
        tokens = logprobs.argmax(-1)
    else:
        if uniforms is None:
            if keys is None or positions is None:
                raise ValueError("sample_next_token needs keys and positions, or uniforms, to sample")
            uniforms = keyed_uniforms(keys, positions)
        u = uniforms.to(device=logits.device, dtype=torch.float64)
        probs = logprobs.exp()
        if top_p < 1.0:
            # a stable sort: equal probabilities (common in bf16) keep token order on every device
            order, cdf, kept, total = _nucleus(probs, top_p)
            index = torch.searchsorted(cdf, u[:, None] * total, right=True).clamp_(max=kept - 1)
            tokens = order.gather(-1, index).squeeze(-1)
            # the log-prob of what was sampled from: the renormalised nucleus
            return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1) - total.squeeze(-1).log().float()
        else:
            cdf = probs.cumsum(-1, dtype=torch.float64)
            # u < 1 ⇒ the target is below the total, so a token of probability 0 is never picked
            index = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True)
            tokens = index.clamp_(max=logits.shape[-1] - 1).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
