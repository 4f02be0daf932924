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
"""

from __future__ import annotations

import torch

__all__ = ["row_keys", "keyed_uniforms", "sample_next_token", "tempered_logprobs"]

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


def sample_next_token(
    logits: torch.Tensor,
    keys: torch.Tensor | None,
    positions: torch.Tensor | None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return ``(tokens [B], logprobs [B])``.

    ``logits`` is ``[B, V]``; ``keys`` and ``positions`` are ``[B]``. The log-prob is of the tempered
    distribution (see :func:`tempered_logprobs`), whatever ``top_p`` is. ``uniforms`` ``[B]`` replaces
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
            sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
            cdf = sorted_p.cumsum(-1, dtype=torch.float64)
            kept = ((cdf - sorted_p) < top_p).sum(-1, keepdim=True)  # a prefix: mass before it < top_p
            total = cdf.gather(-1, kept - 1)
            index = torch.searchsorted(cdf, u[:, None] * total, right=True).clamp_(max=kept - 1)
            tokens = order.gather(-1, index).squeeze(-1)
        else:
            cdf = probs.cumsum(-1, dtype=torch.float64)
            # u < 1 ⇒ the target is below the total, so a token of probability 0 is never picked
            index = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True)
            tokens = index.clamp_(max=logits.shape[-1] - 1).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
