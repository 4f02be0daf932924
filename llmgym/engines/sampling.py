"""Keyed sampling: a row's draws depend only on ``(key, position, token)``, never on the batch.

Sampling uses the Gumbel-max trick, ``token = argmax(logits / T + g)``, with Gumbel noise ``g`` made
by a counter-based hash (splitmix64) of the row's key, the position within the completion and the
token id. The same key therefore reproduces the same tokens whether a completion is generated in a
batch of 64 by :class:`~llmgym.engines.HFEngine` or one token at a time through a token-level env,
on CPU or GPU. It is vectorised: no per-row generators.
"""

from __future__ import annotations

import torch

__all__ = ["row_keys", "gumbel_noise", "sample_next_token", "tempered_logprobs"]

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


def gumbel_noise(keys: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Standard Gumbel noise ``[B, V]`` (float32) determined by ``keys [B]`` and ``positions [B]``.

    Example:
        >>> import torch
        >>> from llmgym.engines.sampling import gumbel_noise
        >>> a = gumbel_noise(torch.tensor([7, 8]), torch.tensor([0, 0]), 5)
        >>> b = gumbel_noise(torch.tensor([8]), torch.tensor([0]), 5)
        >>> a.shape, torch.equal(a[1], b[0])
        (torch.Size([2, 5]), True)
    """
    device = keys.device
    base = _mix(keys.long() * _GOLDEN + positions.long().to(device))
    vocab = torch.arange(vocab_size, device=device, dtype=torch.long)
    bits = _mix(base[:, None] + vocab[None, :] * _GOLDEN)
    # top 53 bits -> uniform in (0, 1), never exactly 0 or 1
    uniform = (_lshr(bits, 11).double() + 0.5) * (2.0**-53)
    return (-torch.log(-torch.log(uniform))).float()


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
    keys: torch.Tensor,
    positions: torch.Tensor,
    temperature: float = 1.0,
    top_p: float = 1.0,
    noise_fn=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return ``(tokens [B], logprobs [B])``.

    ``logits`` is ``[B, V]``. The log-prob is of the tempered distribution (see
    :func:`tempered_logprobs`), whatever ``top_p`` is. ``noise_fn`` replaces :func:`gumbel_noise`
    with a function computing the same values (e.g. its ``torch.compile``-d form: one fused kernel
    instead of ~35 elementwise passes over ``[B, V]`` int64 tensors).

    Example:
        >>> import torch
        >>> from llmgym.engines.sampling import sample_next_token
        >>> logits = torch.tensor([[0.0, 5.0, 0.0]])
        >>> tok, lp = sample_next_token(logits, torch.tensor([1]), torch.tensor([0]), temperature=0)
        >>> tok.item()
        1
    """
    logprobs = tempered_logprobs(logits, temperature)
    if temperature == 0:
        tokens = logprobs.argmax(-1)
    else:
        scores = logprobs.clone()
        if top_p < 1.0:
            sorted_lp, order = scores.sort(dim=-1, descending=True)
            mass_before = sorted_lp.exp().cumsum(-1) - sorted_lp.exp()
            drop_sorted = mass_before >= top_p  # keeps the smallest prefix reaching top_p (>= 1 token)
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            scores = scores.masked_fill(drop, float("-inf"))
        noise = (noise_fn or gumbel_noise)(keys, positions, logits.shape[-1])
        tokens = (scores + noise.to(scores.device)).argmax(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
