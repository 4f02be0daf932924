"""Shared math of the agents: advantages, policy/value losses, KL estimators, loss aggregation.

Every function here is a pure function of tensors: no module state, no config objects, no
Python loop over samples (the only loops are the reversed loops over time steps of the recursive
GAE / discounted-return computations). An agent is a short composition of these functions.

Conventions
-----------
* ``B`` is the batch size (number of sequences), ``T`` the padded number of completion positions,
  ``V`` the vocabulary size.
* ``mask`` is a float or bool tensor ``[B, T]``: 1 (True) at positions that count — the tokens the
  policy generated — and 0 (False) at padding *and* at environment tokens of multi-turn episodes.
  A float mask may carry weights; only ``mask != 0`` decides which positions are valid.
* Values at masked positions never leak into outputs: they are selected away with ``torch.where``
  (not multiplied by 0), so even ``inf``/``nan`` padding cannot turn a result into NaN.
* All-masked rows and all-equal groups give 0, never NaN.
* Advantages, returns and old/ref log-probs are data, not functions of the parameters being
  trained: the losses detach them, so a stray graph cannot leak gradients into the wrong place.

References: PPO (Schulman et al. 2017), GAE (Schulman et al. 2016), dual-clip PPO (Ye et al. 2020),
GRPO (Shao et al. 2024, DeepSeekMath), DAPO (Yu et al. 2025), RLOO (Ahmadian et al. 2024),
Dr. GRPO (Liu et al. 2025), GSPO (Zheng et al. 2025), REINFORCE++ (Hu 2025), ReMax (Li et al. 2023),
KL estimators k1/k2/k3 (Schulman 2020, "Approximating KL divergence"), on-policy distillation
(Agarwal et al. 2024, GKD; Lu et al. 2025, Thinking Machines "On-Policy Distillation").
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor

__all__ = [
    # masked statistics
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    # returns and advantages
    "discounted_returns",
    "gae_advantages",
    "baseline_advantages",
    "group_advantages",
    "decoupled_group_advantages",
    "gdpo_advantages",
    "rloo_advantages",
    "batch_whitened_advantages",
    "remax_advantages",
    # rewards
    "token_level_rewards",
    "kl_penalised_rewards",
    "overlong_penalty",
    "reverse_kl_rewards",
    "distillation_advantages",
    # log-probs, entropy and KL
    "logprobs_from_logits",
    "entropy_from_logits",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_estimate",
    "KL_ESTIMATORS",
    # losses
    "policy_gradient_loss",
    "clipped_surrogate_loss",
    "sequence_ratio_surrogate_loss",
    "cispo_loss",
    "sapo_loss",
    "distillation_loss",
    "clipped_value_loss",
    "aggregate_loss",
    "LOSS_AGG_MODES",
    # diagnostics
    "explained_variance",
    "clip_fraction",
]

# exp() of a log-ratio above this overflows float16/bfloat16-friendly ranges and only happens for
# samples so off-policy that their ratio is clipped anyway; clamping keeps the loss finite.
_MAX_LOG_RATIO = 20.0


# --------------------------------------------------------------------------------------------
# helpers (private)
# --------------------------------------------------------------------------------------------


def _valid(mask: Tensor) -> Tensor:
    """Bool view of a float/bool mask: True where the position counts."""
    return mask if mask.dtype == torch.bool else mask != 0


def _weights(mask: Tensor, like: Tensor) -> Tensor:
    """Mask as a floating tensor of ``like``'s dtype (bool -> 0./1.; float weights kept)."""
    return mask.to(like.dtype) if like.is_floating_point() else mask.to(torch.get_default_dtype())


def _as_float(x: Tensor) -> Tensor:
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


def _zero_masked(mask: Optional[Tensor], *xs: Tensor) -> tuple[Tensor, ...]:
    """Each ``x`` with its masked positions replaced by 0, *before* any arithmetic.

    Padded log-probs may be ±inf or NaN. Masking the result afterwards keeps the value finite but
    not the gradient: autograd multiplies the zero upstream gradient by the local derivative at the
    padded position (``exp(inf)``, ``inf − inf``) and ``0 · inf`` is NaN. ``torch.where`` on the
    inputs routes exactly zero gradient to them, so padding can never poison a backward pass.
    """
    if mask is None:
        return xs
    valid = _valid(mask)
    return tuple(torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device)) for x in xs)


def _expand_to(x: Tensor, ref: Tensor) -> Tensor:
    """Broadcast per-sequence ``x [B]`` against per-token ``ref [B, T]`` (adds a trailing dim)."""
    while x.dim() < ref.dim():
        x = x.unsqueeze(-1)
    return x


# --------------------------------------------------------------------------------------------
# masked statistics
# --------------------------------------------------------------------------------------------


def masked_sum(x: Tensor, mask: Tensor, dim: Optional[int] = None) -> Tensor:
    """Sum of ``x`` over the valid positions of ``mask``.

    Formula: ``Σ_t m_t · x_t`` (masked entries of ``x`` are ignored, even if they are inf/nan).

    Args:
        x: any shape, e.g. ``[B, T]``.
        mask: same shape as ``x`` (bool or float).
        dim: dimension to reduce; ``None`` reduces everything to a scalar.

    Returns:
        scalar if ``dim is None`` else ``x`` reduced over ``dim`` (e.g. ``[B]``).

    Example:
        >>> x = torch.tensor([[1., 2., 3.], [4., 5., 6.]])
        >>> m = torch.tensor([[1, 1, 0], [1, 0, 0]])
        >>> masked_sum(x, m)
        tensor(7.)
        >>> masked_sum(x, m, dim=1)
        tensor([3., 4.])
    """
    x = _as_float(x)
    w = _weights(mask, x)
    xw = torch.where(_valid(mask), x, torch.zeros_like(x)) * w
    return xw.sum() if dim is None else xw.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: Optional[int] = None) -> Tensor:
    """Mean of ``x`` over the valid positions of ``mask``; 0 where nothing is valid.

    Formula: ``Σ_t m_t x_t / Σ_t m_t`` (denominator clamped so an empty row gives 0, not NaN).

    Args:
        x: any shape, e.g. ``[B, T]``.
        mask: same shape as ``x`` (bool or float).
        dim: dimension to reduce; ``None`` reduces everything to a scalar.

    Returns:
        scalar if ``dim is None`` else ``x`` reduced over ``dim``.

    Example:
        >>> x = torch.tensor([[1., 2., 3.], [4., 5., 6.]])
        >>> m = torch.tensor([[1, 1, 0], [0, 0, 0]])
        >>> masked_mean(x, m)
        tensor(1.5000)
        >>> masked_mean(x, m, dim=1)  # empty second row -> 0
        tensor([1.5000, 0.0000])
    """
    x = _as_float(x)
    num = masked_sum(x, mask, dim)
    den = _weights(mask, x).sum() if dim is None else _weights(mask, x).sum(dim=dim)
    return num / den.clamp(min=torch.finfo(x.dtype).tiny)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``x`` over all valid positions of ``mask`` (a scalar).

    Formula: ``μ = masked_mean(x)``, ``var = Σ m (x − μ)² / (n − 1)`` with ``n = Σ m``
    (``unbiased=True``, Bessel's correction, as ``torch.var``), or ``/ n`` when ``unbiased=False``.
    With fewer than two valid entries (``n ≤ 1`` unbiased, ``n = 0`` biased) the result is 0.

    Args:
        x: any shape.
        mask: same shape as ``x``.
        unbiased: apply Bessel's correction.

    Returns:
        scalar tensor.

    Example:
        >>> masked_var(torch.tensor([1., 3., 100.]), torch.tensor([1, 1, 0]))  # (1+1)/(2-1)
        tensor(2.)
        >>> masked_var(torch.tensor([1., 3., 100.]), torch.tensor([1, 1, 0]), unbiased=False)
        tensor(1.)
    """
    x = _as_float(x)
    mean = masked_mean(x, mask)
    sq_dev = masked_sum((x - mean) ** 2, mask)
    n = _weights(mask, x).sum()
    den = n - 1 if unbiased else n
    var = sq_dev / den.clamp(min=torch.finfo(x.dtype).tiny)
    return torch.where(den > 0, var, torch.zeros_like(var))


def masked_whiten(
    x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> Tensor:
    """Standardise ``x`` with the mean and (unbiased) variance of its valid positions.

    Formula: ``(x − μ) / sqrt(var + eps)``; with ``shift_mean=False`` the mean is added back,
    ``(x − μ) / sqrt(var + eps) + μ`` (scale only). Masked positions of the output are 0.

    Args:
        x: any shape, e.g. ``[B, T]``.
        mask: same shape as ``x``.
        shift_mean: subtract the mean (True) or only rescale (False).
        eps: added to the variance so constant inputs give 0, not NaN.

    Returns:
        tensor of ``x``'s shape.

    Example:
        >>> x = torch.tensor([[1., 3.], [5., 99.]])
        >>> m = torch.tensor([[1, 1], [1, 0]])
        >>> masked_whiten(x, m)  # μ = 3, var = (4 + 0 + 4)/2 = 4 -> (x - 3)/2
        tensor([[-1.,  0.],
                [ 1.,  0.]])
    """
    x = _as_float(x)
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(_valid(mask), whitened, torch.zeros_like(whitened))


# --------------------------------------------------------------------------------------------
# returns and advantages
# --------------------------------------------------------------------------------------------


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """Reward-to-go over policy positions: ``G_t = r_t + γ G_{t'}``.

    ``t'`` is the next *valid* position after ``t`` (``G = 0`` after the last one). Masked positions
    (padding, environment tokens) are skipped: they add no reward and do not count as a step of
    discount. The output is 0 at masked positions. Put rewards at policy positions (see
    :func:`token_level_rewards`); a reward at a masked position is ignored.

    Args:
        rewards: ``[B, T]`` per-position rewards.
        mask: ``[B, T]``.
        gamma: discount factor γ.

    Returns:
        ``[B, T]`` returns (detached: they are regression / advantage targets).

    Example:
        >>> r = torch.tensor([[0., 0., 1.], [1., 0., 2.]])
        >>> m = torch.tensor([[1, 1, 1], [1, 0, 1]])  # row 2: position 1 is an env token
        >>> discounted_returns(r, m, gamma=0.5)  # row 2: G_2 = 2, G_0 = 1 + 0.5*2 (one step)
        tensor([[0.2500, 0.5000, 1.0000],
                [2.0000, 0.0000, 2.0000]])
    """
    rewards = _as_float(rewards).detach()
    valid = _valid(mask)
    rewards = torch.where(valid, rewards, torch.zeros_like(rewards))
    running = torch.zeros_like(rewards[:, 0])
    out = []
    for t in reversed(range(rewards.shape[1])):
        # a masked step leaves the running return untouched, so it is not a step of discount
        running = torch.where(valid[:, t], rewards[:, t] + gamma * running, running)
        out.append(torch.where(valid[:, t], running, torch.zeros_like(running)))
    return torch.stack(out[::-1], dim=1)


def gae_advantages(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    *,
    last_values: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation GAE(γ, λ) over policy positions only.

    Formulas (Schulman et al. 2016), with ``t'`` the next *valid* position after ``t``:

    * ``δ_t = r_t + γ V_{t'} − V_t`` (``V_{t'} = 0`` after the last valid position, or
      ``last_values`` to bootstrap a truncated episode);
    * ``A_t = δ_t + γ λ A_{t'}`` (``A = 0`` after the last valid position);
    * ``returns_t = A_t + V_t`` (the λ-return, the value-function target).

    Masked positions are skipped entirely, so environment tokens between two turns do not count
    as time steps, and the rewards/values stored there cannot change any output at a valid
    position. Both outputs are 0 at masked positions.

    Args:
        rewards: ``[B, T]``.
        values: ``[B, T]`` value estimates ``V(s_t)``.
        mask: ``[B, T]``.
        gamma: discount factor γ.
        lam: GAE λ (λ = 1: Monte-Carlo return minus V; λ = 0: one-step TD error).
        last_values: optional ``[B]`` value of the state after the last valid position
            (for episodes cut by a limit rather than terminated); default 0.

    Returns:
        ``(advantages [B, T], returns [B, T])``, both detached.

    Example:
        >>> r = torch.tensor([[0., 0., 1.]])
        >>> v = torch.tensor([[0.5, 0.5, 0.5]])
        >>> m = torch.ones(1, 3)
        >>> adv, ret = gae_advantages(r, v, m, gamma=1.0, lam=0.5)
        >>> adv  # δ = [0, 0, 0.5]; A_2 = 0.5, A_1 = 0 + 0.5*0.5, A_0 = 0 + 0.5*0.25
        tensor([[0.1250, 0.2500, 0.5000]])
        >>> ret
        tensor([[0.6250, 0.7500, 1.0000]])
    """
    rewards = _as_float(rewards).detach()
    values = values.to(rewards.dtype).detach()
    valid = _valid(mask)
    zeros = torch.zeros_like(rewards)
    rewards = torch.where(valid, rewards, zeros)
    values = torch.where(valid, values, zeros)

    next_value = (
        torch.zeros_like(rewards[:, 0])
        if last_values is None
        else last_values.to(rewards.dtype).detach().reshape(-1)
    )
    next_adv = torch.zeros_like(rewards[:, 0])
    out = []
    for t in reversed(range(rewards.shape[1])):
        v_t = valid[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        # carry V and A of the last *valid* position backwards across masked positions
        next_value = torch.where(v_t, values[:, t], next_value)
        next_adv = torch.where(v_t, adv_t, next_adv)
        out.append(torch.where(v_t, adv_t, torch.zeros_like(adv_t)))
    advantages = torch.stack(out[::-1], dim=1)
    returns = advantages + values  # values are already 0 at masked positions
    return advantages, returns


def baseline_advantages(rewards: Tensor, baseline: Tensor) -> Tensor:
    """REINFORCE with a baseline: ``A = r − b``.

    Args:
        rewards: ``[B]`` sequence rewards or ``[B, T]`` per-token returns.
        baseline: scalar, ``[B]`` (broadcast over ``T`` when ``rewards`` is ``[B, T]``) or the
            shape of ``rewards``.

    Returns:
        tensor of ``rewards``' shape.

    Example:
        >>> baseline_advantages(torch.tensor([1., 0., 1.]), torch.tensor(0.5))
        tensor([ 0.5000, -0.5000,  0.5000])
        >>> baseline_advantages(torch.tensor([[1., 1.], [0., 0.]]), torch.tensor([0.5, 0.25]))
        tensor([[ 0.5000,  0.5000],
                [-0.2500, -0.2500]])
    """
    rewards = _as_float(rewards)
    baseline = torch.as_tensor(baseline, dtype=rewards.dtype, device=rewards.device)
    return rewards - _expand_to(baseline, rewards)


def _check_groups(rewards: Tensor, name: str) -> Tensor:
    if rewards.dim() != 2:
        raise ValueError(
            f"{name} expects rewards of shape [num_groups, group_size], got {tuple(rewards.shape)};"
            " reshape a flat batch with rewards.view(-1, group_size)."
        )
    return _as_float(rewards)


def group_advantages(
    rewards: Tensor, normalize_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """Group-relative advantages of GRPO (and Dr. GRPO).

    Formula: ``A_i = (r_i − mean(r)) / (std(r) + eps)`` over the group of completions of one prompt
    (DeepSeekMath's outcome supervision). ``std`` is the **unbiased** sample standard deviation
    (``torch.std``, divisor ``G − 1``), as DeepSeekMath's reference code, TRL and verl use.
    With ``normalize_std=False`` this is Dr. GRPO's ``A_i = r_i − mean(r)`` (no std division,
    which removes the question-difficulty bias).

    A group whose rewards are all equal (including a group of size 1) carries no learning signal:
    its advantages are exactly 0 — never NaN and never float round-off.

    Args:
        rewards: ``[num_groups, group_size]`` sequence rewards.
        normalize_std: divide by the group std (GRPO) or not (Dr. GRPO).
        eps: added to the std.

    Returns:
        ``[num_groups, group_size]``.

    Example:
        >>> r = torch.tensor([[1., 0., 1., 0.], [2., 2., 2., 2.]])
        >>> group_advantages(r)  # mean 0.5, unbiased std sqrt(1/3) = 0.5774
        tensor([[ 0.8660, -0.8660,  0.8660, -0.8660],
                [ 0.0000,  0.0000,  0.0000,  0.0000]])
        >>> group_advantages(r, normalize_std=False)
        tensor([[ 0.5000, -0.5000,  0.5000, -0.5000],
                [ 0.0000,  0.0000,  0.0000,  0.0000]])
    """
    rewards = _check_groups(rewards, "group_advantages")
    mean = rewards.mean(dim=-1, keepdim=True)
    centred = rewards - mean
    if normalize_std:
        if rewards.shape[-1] > 1:
            std = rewards.std(dim=-1, keepdim=True)  # unbiased (correction=1)
        else:
            std = torch.zeros_like(mean)  # torch.std of one sample is NaN
        centred = centred / (std + eps)
    # mean() of equal floats may differ from them in the last bit; force exact zeros
    all_equal = (rewards == rewards[..., :1]).all(dim=-1, keepdim=True)
    return torch.where(all_equal, torch.zeros_like(centred), centred)


def decoupled_group_advantages(
    component_rewards: Tensor, weights: Optional[Tensor] = None, eps: float = 1e-6
) -> Tensor:
    """GDPO's group-decoupled advantage, before its batch normalisation.

    GDPO (Liu et al., 2026) normalises each reward component *within the group on its own* and only
    then sums: ``A_sum = Σ_k w_k · (r_k − mean_g(r_k)) / (std_g(r_k) + eps)``. Summing first and
    normalising the sum (GRPO) maps distinct combinations — e.g. rewards (1, 0) vs (0, 0) and
    (1, 1) vs (0, 0) — to the same advantages; decoupling keeps them apart. Each component uses
    :func:`group_advantages` (unbiased std; an all-equal component contributes exactly 0).

    Args:
        component_rewards: ``[num_groups, group_size, K]``, one column per reward component.
        weights: ``[K]`` component weights ``w_k`` (default: all 1).
        eps: added to each component's group std.

    Returns:
        ``[num_groups, group_size]``.

    Example:
        >>> r = torch.tensor([[[1., 0.], [0., 0.]], [[1., 1.], [0., 0.]]])  # 2 groups of 2, K = 2
        >>> decoupled_group_advantages(r)  # GRPO on the sums would give ±0.7071 to both groups
        tensor([[ 0.7071, -0.7071],
                [ 1.4142, -1.4142]])
    """
    if component_rewards.dim() != 3:
        raise ValueError(
            "decoupled_group_advantages expects component rewards of shape [num_groups, group_size, K], "
            f"got {tuple(component_rewards.shape)}"
        )
    r = _as_float(component_rewards)
    k = r.shape[-1]
    w = torch.ones(k, dtype=r.dtype, device=r.device) if weights is None else torch.as_tensor(
        weights, dtype=r.dtype, device=r.device)
    if w.shape != (k,):
        raise ValueError(f"weights must have one entry per reward component ({k}), got shape {tuple(w.shape)}")
    per_component = torch.stack([group_advantages(r[..., j], eps=eps) for j in range(k)], dim=-1)
    return (per_component * w).sum(dim=-1)


def gdpo_advantages(
    component_rewards: Tensor, weights: Optional[Tensor] = None, eps: float = 1e-6, batch_eps: float = 1e-8
) -> Tensor:
    """GDPO advantages: :func:`decoupled_group_advantages`, then normalised over the whole batch.

    Formula: ``Â = (A_sum − mean_batch(A_sum)) / sqrt(var_batch(A_sum) + batch_eps)`` (unbiased
    variance over every sample of the batch), which keeps the advantage's scale from growing with
    the number of reward components.

    Args:
        component_rewards: ``[num_groups, group_size, K]``.
        weights: ``[K]`` (default: all 1).
        eps: group-std epsilon of each component.
        batch_eps: added to the batch variance (an all-zero batch stays 0).

    Returns:
        ``[num_groups, group_size]``.

    Example:
        >>> r = torch.tensor([[[1., 0.], [0., 0.]], [[1., 1.], [0., 0.]]])
        >>> gdpo_advantages(r)  # A_sum = ±0.7071, ±1.4142; batch var = 5/3
        tensor([[ 0.5477, -0.5477],
                [ 1.0954, -1.0954]])
    """
    summed = decoupled_group_advantages(component_rewards, weights, eps)
    return masked_whiten(summed, torch.ones_like(summed, dtype=torch.bool), eps=batch_eps)


def rloo_advantages(rewards: Tensor) -> Tensor:
    """REINFORCE leave-one-out advantages (Ahmadian et al. 2024).

    Formula: ``A_i = r_i − (1 / (k − 1)) Σ_{j ≠ i} r_j`` for a group of ``k`` completions of one
    prompt (equivalently ``k / (k − 1) · (r_i − mean(r))``). Sample ``i``'s baseline excludes
    ``r_i``, which keeps the estimator unbiased.

    Args:
        rewards: ``[num_groups, group_size]``, ``group_size ≥ 2``.

    Returns:
        ``[num_groups, group_size]``.

    Raises:
        ValueError: if ``group_size < 2`` (the leave-one-out baseline needs another sample).

    Example:
        >>> rloo_advantages(torch.tensor([[1., 0., 0., 1.]]))  # 1 - (0+0+1)/3, 0 - (1+0+1)/3
        tensor([[ 0.6667, -0.6667, -0.6667,  0.6667]])
    """
    rewards = _check_groups(rewards, "rloo_advantages")
    k = rewards.shape[-1]
    if k < 2:
        raise ValueError(
            f"rloo_advantages needs at least 2 completions per prompt (group_size={k}): the "
            "leave-one-out baseline of a sample is the mean of the *other* samples of its group."
        )
    baseline = (rewards.sum(dim=-1, keepdim=True) - rewards) / (k - 1)
    return rewards - baseline


def batch_whitened_advantages(advantages: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """REINFORCE++ global advantage normalisation over all valid tokens of the batch.

    Formula: ``A' = (A − μ_batch) / sqrt(var_batch + eps)`` where μ and var (unbiased) are taken
    over every valid token of the whole batch (not per prompt group). Masked positions give 0.

    Args:
        advantages: ``[B, T]`` (e.g. KL-penalised reward-to-go from :func:`discounted_returns`).
        mask: ``[B, T]``.
        eps: added to the variance.

    Returns:
        ``[B, T]``, detached.

    Example:
        >>> a = torch.tensor([[1., 3.], [5., 0.]])
        >>> batch_whitened_advantages(a, torch.tensor([[1, 1], [1, 0]]))
        tensor([[-1.,  0.],
                [ 1.,  0.]])
    """
    return masked_whiten(advantages.detach(), mask, shift_mean=True, eps=eps)


def remax_advantages(rewards: Tensor, greedy_rewards: Tensor) -> Tensor:
    """ReMax advantages (Li et al. 2023): the greedy completion's reward is the baseline.

    Formula: ``A_i = r(x, y_i) − r(x, ŷ_greedy)``.

    Args:
        rewards: ``[B]`` (or ``[B, T]``) rewards of the sampled completions.
        greedy_rewards: ``[B]`` rewards of the greedy completions of the same prompts.

    Returns:
        tensor of ``rewards``' shape.

    Example:
        >>> remax_advantages(torch.tensor([1., 0., 1.]), torch.tensor([1., 1., 0.]))
        tensor([ 0., -1.,  1.])
    """
    return baseline_advantages(rewards, greedy_rewards)


# --------------------------------------------------------------------------------------------
# rewards
# --------------------------------------------------------------------------------------------


def token_level_rewards(sequence_rewards: Tensor, mask: Tensor) -> Tensor:
    """Place each sequence's reward at its last valid (policy) position; 0 elsewhere.

    Formula: ``r_{i,t} = R_i · [t = max{t' : m_{i,t'} = 1}]``. A row without valid positions gets
    all zeros.

    Args:
        sequence_rewards: ``[B]``.
        mask: ``[B, T]``.

    Returns:
        ``[B, T]``.

    Example:
        >>> m = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 0, 0]])
        >>> token_level_rewards(torch.tensor([2., 3., 4.]), m)
        tensor([[0., 2., 0.],
                [0., 0., 3.],
                [0., 0., 0.]])
    """
    sequence_rewards = _as_float(sequence_rewards)
    valid = _valid(mask)
    positions = torch.arange(valid.shape[-1], device=valid.device).expand_as(valid)
    last = torch.where(valid, positions, torch.full_like(positions, -1)).max(dim=-1).values
    is_last = (positions == last.unsqueeze(-1)) & valid  # empty rows: last = -1 matches nothing
    return torch.where(
        is_last,
        sequence_rewards.unsqueeze(-1).expand(valid.shape),
        torch.zeros((), dtype=sequence_rewards.dtype, device=sequence_rewards.device),
    )


def kl_penalised_rewards(
    sequence_rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    kl_coef: float = 0.05,
    estimator: str = "k1",
) -> Tensor:
    """Per-token rewards with the KL penalty *in the reward* (PPO-RLHF / RLOO / REINFORCE++).

    Formula: ``r_t = −β · KL_t + R · [t = last valid position]`` with ``KL_t`` one of the k1/k2/k3
    estimates of ``KL(π ‖ π_ref)`` at token ``t``. Masked positions are 0.

    Args:
        sequence_rewards: ``[B]`` verifier / reward-model scores.
        logprobs: ``[B, T]`` log π of the sampled tokens (at sampling time).
        ref_logprobs: ``[B, T]`` log π_ref of the same tokens.
        mask: ``[B, T]``.
        kl_coef: β.
        estimator: ``"k1"`` (InstructGPT's ``log π − log π_ref``), ``"k2"`` or ``"k3"``.

    Returns:
        ``[B, T]``, detached.

    Example:
        >>> lp = torch.tensor([[-1.0, -1.0, -2.0]])
        >>> ref = torch.tensor([[-1.5, -1.0, -1.0]])
        >>> m = torch.tensor([[1, 1, 0]])
        >>> kl_penalised_rewards(torch.tensor([1.]), lp, ref, m, kl_coef=0.1)  # -0.1*0.5, 1 - 0
        tensor([[-0.0500,  1.0000,  0.0000]])
    """
    kl = kl_estimate(logprobs.detach(), ref_logprobs.detach(), estimator, mask)
    rewards = token_level_rewards(sequence_rewards, mask).to(kl.dtype) - kl_coef * kl
    return torch.where(_valid(mask), rewards, torch.zeros_like(rewards)).detach()


def overlong_penalty(lengths: Tensor, max_length: int, cache_length: int) -> Tensor:
    """DAPO's soft overlong punishment (a length-aware reward term added to the task reward).

    Formula, with ``L_max = max_length`` and ``L_cache = cache_length``::

        R(L) = 0                               if L ≤ L_max − L_cache
             = ((L_max − L_cache) − L) / L_cache if L_max − L_cache < L ≤ L_max
             = −1                              if L > L_max

    Args:
        lengths: ``[B]`` completion lengths in tokens.
        max_length: ``L_max``.
        cache_length: ``L_cache`` (the width of the linear ramp), ``0 < L_cache ≤ L_max``.

    Returns:
        ``[B]`` penalties in ``[−1, 0]``.

    Example:
        >>> overlong_penalty(torch.tensor([10, 16, 18, 20, 21]), max_length=20, cache_length=4)
        tensor([ 0.0000,  0.0000, -0.5000, -1.0000, -1.0000])
    """
    if not 0 < cache_length <= max_length:
        raise ValueError(
            "overlong_penalty needs 0 < cache_length <= max_length, got "
            f"cache_length={cache_length}, max_length={max_length}"
        )
    lengths = _as_float(lengths)
    soft_start = max_length - cache_length
    ramp = (soft_start - lengths) / cache_length
    penalty = torch.where(lengths <= soft_start, torch.zeros_like(lengths), ramp)
    return torch.where(lengths > max_length, torch.full_like(lengths, -1.0), penalty)


# --------------------------------------------------------------------------------------------
# log-probs, entropy, KL
# --------------------------------------------------------------------------------------------


def logprobs_from_logits(logits: Tensor, token_ids: Tensor) -> Tensor:
    """Log-probability of the chosen tokens: ``log softmax(logits)[token_ids]``.

    Args:
        logits: ``[B, T, V]`` (already aligned: ``logits[:, t]`` predicts ``token_ids[:, t]``).
        token_ids: ``[B, T]`` int64.

    Returns:
        ``[B, T]``.

    Example:
        >>> logits = torch.log(torch.tensor([[[0.25, 0.75], [0.5, 0.5]]]))
        >>> logprobs_from_logits(logits, torch.tensor([[1, 0]])).exp()
        tensor([[0.7500, 0.5000]])
    """
    # gather - logsumexp avoids materialising the whole [B, T, V] log-softmax a second time
    picked = logits.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the next-token distribution at every position.

    Formula: ``H = −Σ_v p_v log p_v = logsumexp(z) − Σ_v p_v z_v`` with ``p = softmax(z)``,
    computed on ``z − max(z)`` (H is shift-invariant) so large logits lose no precision;
    ``−inf`` logits (banned tokens) contribute 0.

    Args:
        logits: ``[B, T, V]``.

    Returns:
        ``[B, T]`` in nats.

    Example:
        >>> entropy_from_logits(torch.zeros(1, 1, 4))  # uniform over 4: log 4
        tensor([[1.3863]])
        >>> entropy_from_logits(torch.tensor([[[1000., 0.]]]))  # one-hot
        tensor([[0.]])
    """
    # H is shift-invariant; shifting by the max first avoids the cancellation of two large
    # numbers (logsumexp(z) ≈ Σ p z ≈ 1e4 would lose all digits of H in float32)
    z_max = logits.detach().amax(dim=-1, keepdim=True)
    z = logits - torch.where(torch.isfinite(z_max), z_max, torch.zeros_like(z_max))
    probs = torch.softmax(z, dim=-1)
    p_z = torch.where(probs > 0, probs * z, torch.zeros_like(z))  # 0·(−inf) -> 0
    return torch.logsumexp(z, dim=-1) - p_z.sum(dim=-1)


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """k1 estimator of ``KL(π ‖ π_ref)`` from samples of π: ``log π − log π_ref``.

    Unbiased, high variance, can be negative per token.

    Args:
        logprobs, ref_logprobs: ``[B, T]``.
        mask: optional ``[B, T]``; masked positions give 0 with a zero (never NaN) gradient, even
            where the padded log-probs are ±inf or NaN.

    Returns:
        ``[B, T]``.

    Example:
        >>> kl_k1(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]))
        tensor([[ 0.5000, -1.0000]])
    """
    logprobs, ref_logprobs = _zero_masked(mask, logprobs, ref_logprobs)
    return logprobs - ref_logprobs


def kl_k2(logprobs: Tensor, ref_logprobs: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """k2 estimator of ``KL(π ‖ π_ref)``: ``½ (log π − log π_ref)²``.

    Biased, low variance, ≥ 0; its gradient is that of the true KL's (Schulman 2020).

    Args:
        logprobs, ref_logprobs: ``[B, T]``.
        mask: optional ``[B, T]``; masked positions give 0 with a zero gradient (see :func:`kl_k1`).

    Returns:
        ``[B, T]``, ≥ 0.

    Example:
        >>> kl_k2(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]))
        tensor([[0.1250, 0.5000]])
    """
    logprobs, ref_logprobs = _zero_masked(mask, logprobs, ref_logprobs)
    return 0.5 * (logprobs - ref_logprobs) ** 2


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """k3 estimator of ``KL(π ‖ π_ref)`` (GRPO's KL term): ``exp(ρ) − ρ − 1``.

    Here ``ρ = log π_ref − log π``.

    Unbiased and ≥ 0 (since ``e^x ≥ 1 + x``), lower variance than k1.

    Args:
        logprobs, ref_logprobs: ``[B, T]``.
        mask: optional ``[B, T]``; masked positions give 0 with a zero gradient (see :func:`kl_k1`).

    Returns:
        ``[B, T]``, ≥ 0.

    Example:
        >>> kl_k3(torch.tensor([[-1.0, -1.0]]), torch.tensor([[-1.0, 0.0]]))  # ρ = 0, 1: e − 2
        tensor([[0.0000, 0.7183]])
    """
    logprobs, ref_logprobs = _zero_masked(mask, logprobs, ref_logprobs)
    log_ratio = ref_logprobs - logprobs
    return torch.expm1(log_ratio) - log_ratio  # expm1 keeps precision near ρ = 0


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3", mask: Optional[Tensor] = None) -> Tensor:
    """Per-token estimate of ``KL(π ‖ π_ref)`` by estimator name (``"k1"``, ``"k2"``, ``"k3"``).

    Args:
        logprobs, ref_logprobs: ``[B, T]``.
        estimator: name in :data:`KL_ESTIMATORS`.
        mask: optional ``[B, T]``: masked positions give 0 with a zero gradient.

    Returns:
        ``[B, T]``.

    Raises:
        ValueError: unknown estimator name.

    Example:
        >>> kl_estimate(torch.tensor([[-1.0]]), torch.tensor([[-1.5]]), "k2")
        tensor([[0.1250]])
    """
    try:
        fn = KL_ESTIMATORS[estimator]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown KL estimator {estimator!r}; choose one of {sorted(KL_ESTIMATORS)}"
        ) from None
    return fn(logprobs, ref_logprobs, mask)


# --------------------------------------------------------------------------------------------
# sampler–learner mismatch (what the engine sampled from vs what the learner computes)
# --------------------------------------------------------------------------------------------


def mismatch_terms(learner_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Per-token terms of the sampler-vs-learner mismatch, ``[B, T]`` each, 0 off the mask.

    The tokens ``y_t`` were drawn from the sampler ``q`` (the rollout engine, at generation time);
    ``δ_t = log π(y_t) − log q(y_t)`` with ``π`` the learner's policy of the same tokens, same weights
    version the learner holds, same temperature. Three terms:

    * ``"k1"``: ``−δ_t`` — Schulman's k1 estimator of ``KL(q ‖ π)`` (unbiased, can be negative);
    * ``"k3"``: ``exp(δ_t) − 1 − δ_t`` — the k3 estimator of ``KL(q ‖ π)`` (unbiased since
      ``E_q[exp(δ)] = 1``, and ≥ 0 on every token);
    * ``"prob_error"``: ``exp(|δ_t|)`` — the multiplicative probability error of the token (≥ 1;
      NeMo-RL's ``token_mult_prob_error`` is its mean).

    Example:
        >>> import math, torch
        >>> t = mismatch_terms(torch.tensor([[-1.0, -2.0, 0.0]]), torch.tensor([[-1.5, -1.0, 9.0]]),
        ...                    torch.tensor([[1, 1, 0]]))  # δ = 0.5, -1, (masked)
        >>> t["k1"]
        tensor([[-0.5000,  1.0000,  0.0000]])
        >>> torch.allclose(t["k3"], torch.tensor([[math.exp(0.5) - 1.5, math.exp(-1.0), 0.0]]))
        True
        >>> torch.allclose(t["prob_error"], torch.tensor([[math.exp(0.5), math.e, 0.0]]))
        True
    """
    valid = _valid(mask)
    learner, sampler = _zero_masked(valid, _as_float(learner_logprobs.detach()), _as_float(sampler_logprobs.detach()))
    delta = (learner - sampler).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    zero = torch.zeros_like(delta)
    return {"k1": torch.where(valid, -delta, zero),
            "k3": torch.where(valid, torch.expm1(delta) - delta, zero),  # expm1: exact near δ = 0
            "prob_error": torch.where(valid, torch.exp(delta.abs()), zero)}


def mismatch_kl(learner_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, estimator: str = "k3") -> Tensor:
    """``KL(q ‖ π)`` between the sampler ``q`` and the learner ``π``, estimated on the sampled tokens.

    ``mean_t (exp(δ_t) − 1 − δ_t)`` over the mask with ``estimator="k3"`` (the default, reported as
    ``mismatch_kl``; unbiased and ≥ 0), ``mean_t (−δ_t)`` with ``"k1"`` (``mismatch_kl_k1``), where
    ``δ_t = log π(y_t) − log q(y_t)`` and ``y_t ~ q`` (see :func:`mismatch_terms`). NeMo-RL reports
    ~1e-3 as typical for its ``gen_kl_error`` (a vLLM sampler against a bf16 learner). A scalar
    (an empty mask measures nothing: the learner then reports no mismatch at all).

    Example:
        >>> import math, torch
        >>> learner, sampler, m = torch.tensor([[-1.0, -2.0, 0.0]]), torch.tensor([[-1.5, -1.0, 9.0]]), torch.tensor([[1, 1, 0]])
        >>> abs(float(mismatch_kl(learner, sampler, m)) - (math.exp(0.5) - 1.5 + math.exp(-1.0)) / 2) < 1e-6
        True
        >>> float(mismatch_kl(learner, sampler, m, "k1"))  # (-0.5 + 1) / 2
        0.25
    """
    if estimator not in ("k1", "k3"):
        raise ValueError(f"mismatch_kl estimator must be 'k1' or 'k3', got {estimator!r}")
    return masked_mean(mismatch_terms(learner_logprobs, sampler_logprobs, mask)[estimator], _valid(mask).float())


def token_prob_error(learner_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> Tensor:
    """The mean multiplicative token probability error ``mean_t exp(|log π(y_t) − log q(y_t)|)`` over the mask.

    NeMo-RL's ``token_mult_prob_error`` (reported as ``mismatch_prob_error``): 1 when the sampler and
    the learner agree on every sampled token, ``1 + ε`` when they disagree by a factor ``≈ 1 + ε``
    per token on average, in either direction. A scalar ≥ 1 (for a non-empty mask).

    Example:
        >>> import torch
        >>> learner, sampler = torch.tensor([[-1.0, -2.0, 0.0]]), torch.tensor([[-1.5, -1.0, 9.0]])
        >>> round(float(token_prob_error(learner, sampler, torch.tensor([[1, 1, 0]]))), 4)  # (e^0.5 + e) / 2
        2.1835
        >>> float(token_prob_error(learner, learner, torch.tensor([[1, 1, 1]])))
        1.0
    """
    return masked_mean(mismatch_terms(learner_logprobs, sampler_logprobs, mask)["prob_error"], _valid(mask).float())


__all__ += ["mismatch_terms", "mismatch_kl", "token_prob_error"]


# --------------------------------------------------------------------------------------------
# losses (per token, [B, T]; reduce with aggregate_loss)
# --------------------------------------------------------------------------------------------


def policy_gradient_loss(logprobs: Tensor, advantages: Tensor) -> Tensor:
    """Vanilla policy-gradient (REINFORCE) loss per token: ``−A · log π``.

    Its gradient is ``−A ∇ log π``. Advantages are constants (detached).

    Args:
        logprobs: ``[B, T]`` log π of the sampled tokens (with grad).
        advantages: ``[B, T]`` or ``[B]`` (broadcast over tokens).

    Returns:
        ``[B, T]``.

    Example:
        >>> policy_gradient_loss(torch.tensor([[-1.0, -2.0]]), torch.tensor([0.5]))
        tensor([[0.5000, 1.0000]])
    """
    return -_expand_to(advantages.detach(), logprobs) * logprobs


def clipped_surrogate_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: Optional[float] = None,
    mask: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate loss per token, with DAPO's clip-higher and optional dual-clip.

    Formulas::

        ratio    = exp(log π − log π_old)
        pg_loss1 = −A · ratio
        pg_loss2 = −A · clip(ratio, 1 − ε_low, 1 + ε_high)
        loss     = max(pg_loss1, pg_loss2)                 # = −min(ratio·A, clip(ratio)·A)
        if dual_clip = c > 1 and A < 0:  loss = min(loss, −A · c)   (Ye et al. 2020)

    ``ε_low = ε_high`` is PPO; ``ε_high > ε_low`` is DAPO's clip-higher. Dual-clip bounds the loss
    of a negative-advantage token whose ratio has exploded (> c) so that one stale sample cannot
    dominate the batch. ``is_clipped`` marks tokens whose gradient the clipping removed
    (``pg_loss2 > pg_loss1``, or the dual clip active). The log-ratio is clamped to ±20 so
    ``exp`` never overflows (such tokens are clipped anyway).

    Args:
        logprobs: ``[B, T]`` log π (with grad).
        old_logprobs: ``[B, T]`` log π_old (sampling policy; detached).
        advantages: ``[B, T]`` or ``[B]`` (broadcast over tokens; detached).
        clip_low: ε_low.
        clip_high: ε_high.
        dual_clip: c > 1, or ``None`` to disable.
        mask: optional ``[B, T]``: padded log-probs (±inf, NaN) are zeroed before the arithmetic,
            so masked positions get a zero gradient (aggregate with the same mask).

    Returns:
        ``(loss [B, T], is_clipped [B, T] bool)``.

    Example:
        >>> lp = torch.log(torch.tensor([[1.5, 1.5, 0.5]]))   # old log-probs 0 -> ratio = p
        >>> adv = torch.tensor([[1.0, -1.0, 1.0]])
        >>> loss, clipped = clipped_surrogate_loss(lp, torch.zeros(1, 3), adv, 0.2, 0.28)
        >>> loss  # -min(1.5, 1.28), -min(-1.5, -1.28) = 1.5, -min(0.5, 0.8)
        tensor([[-1.2800,  1.5000, -0.5000]])
        >>> clipped
        tensor([[ True, False, False]])
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (it caps the ratio for A < 0), got {dual_clip}")
    advantages = _expand_to(advantages.detach(), logprobs)
    logprobs, old_logprobs = _zero_masked(mask, logprobs, old_logprobs.detach())
    log_ratio = (logprobs - old_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(pg_loss1, pg_loss2)
    is_clipped = pg_loss2 > pg_loss1
    if dual_clip is not None:
        pg_loss3 = -advantages * dual_clip
        dual_active = (advantages < 0) & (loss > pg_loss3)
        loss = torch.where(dual_active, pg_loss3, loss)
        is_clipped = is_clipped | dual_active
    return loss, is_clipped


def sequence_ratio_surrogate_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> tuple[Tensor, Tensor]:
    """GSPO's clipped surrogate with a sequence-level importance ratio, in per-token form.

    GSPO (Zheng et al. 2025) uses the length-normalised sequence ratio
    ``s_i = exp( (1/|y_i|) Σ_t (log π_{i,t} − log π_old_{i,t}) )`` and clips it per sequence:
    ``J = mean_i min(s_i A_i, clip(s_i, 1 − ε_low, 1 + ε_high) A_i)``.

    To keep per-token aggregation available, each token gets
    ``s_{i,t} = sg[s_i] · π_{i,t} / sg[π_{i,t}]`` (``sg`` = stop-gradient): its *value* is ``s_i``
    and its gradient is ``s_i ∇ log π_{i,t}``. Aggregated with ``"seq-mean-token-mean"``, the
    gradient is exactly GSPO's ``mean_i s_i A_i (1/|y_i|) Σ_t ∇ log π_{i,t}`` (unclipped sequences).
    Then, per token: ``pg_loss1 = −A s_{i,t}``, ``pg_loss2 = −A clip(s_{i,t})``,
    ``loss = max(pg_loss1, pg_loss2)``. Clipping is decided per sequence, so ``is_clipped`` is
    constant along each row. The paper's defaults are ε_low = 3e-4, ε_high = 4e-4.

    Args:
        logprobs: ``[B, T]`` (with grad).
        old_logprobs: ``[B, T]`` (detached).
        advantages: ``[B]`` or ``[B, T]`` (GSPO uses one advantage per sequence).
        mask: ``[B, T]``; the mean log-ratio runs over valid tokens only.
        clip_low, clip_high: ε_low, ε_high.

    Returns:
        ``(loss [B, T], is_clipped [B, T] bool)``.

    Example:
        >>> lp = torch.tensor([[-1.0, -1.0, -9.0], [-1.0, -1.0, -1.0]])
        >>> old = torch.tensor([[-1.0, -1.2, 0.0], [-1.0, -1.0, -1.0]])
        >>> m = torch.tensor([[1, 1, 0], [1, 1, 1]])
        >>> adv = torch.tensor([1., -1.])
        >>> loss, clipped = sequence_ratio_surrogate_loss(lp, old, adv, m, 0.2, 0.2)
        >>> loss  # row 1: s = exp(0.1) = 1.105 (inside 1.2); row 2: s = 1
        tensor([[-1.1052, -1.1052, -1.1052],
                [ 1.0000,  1.0000,  1.0000]])
        >>> clipped.any().item()
        False
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    advantages = _expand_to(advantages.detach(), logprobs)
    logprobs, old_logprobs = _zero_masked(mask, logprobs, old_logprobs.detach())  # padding may be ±inf/NaN
    token_log_ratio = logprobs - old_logprobs
    seq_log_ratio = masked_mean(token_log_ratio, mask, dim=-1)  # [B], NaN-safe on padding
    seq_log_ratio = seq_log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).unsqueeze(-1)
    # value s_i, gradient s_i · ∇log π_t: sg[log s_i] + log π_t − sg[log π_t]
    log_ratio = seq_log_ratio.detach() + logprobs - logprobs.detach()
    ratio = torch.exp(log_ratio)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(pg_loss1, pg_loss2)
    is_clipped = pg_loss2 > pg_loss1
    return loss, is_clipped


def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
    mask: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """CISPO's per-token loss (MiniMax-M1, 2025): clip the importance-sampling *weight*, not the update.

    Formula::

        r    = π / π_old
        r̂    = clip(r, 1 − ε_low, 1 + ε_high)
        loss = −sg(r̂) · A · log π          (sg = stop-gradient)

    Every token keeps its gradient ``sg(r̂)·A·∇log π`` — PPO's clip would zero the gradient of a
    token whose ratio left the band (often the rare "fork" tokens of a reasoning chain); CISPO only
    caps how much such a token weighs. MiniMax-M1 sets no lower bound (a large ε_low: the default
    ``clip_low = 1`` makes the lower bound 0) and tunes only ε_high. ``is_clipped`` marks tokens
    whose weight was capped (their gradient is kept, only scaled).

    Args:
        logprobs: ``[B, T]`` log π (with grad).
        old_logprobs: ``[B, T]`` log π_old (detached).
        advantages: ``[B, T]`` or ``[B]`` (detached).
        clip_low, clip_high: ε_low, ε_high of the weight's clip.
        mask: optional ``[B, T]``: padded log-probs (±inf, NaN) get a zero gradient.

    Returns:
        ``(loss [B, T], is_clipped [B, T] bool)``.

    Example:
        >>> lp = torch.log(torch.tensor([[2.0, 0.5, 1.1]]))  # old log-probs 0: r = 2, 0.5, 1.1
        >>> loss, capped = cispo_loss(lp, torch.zeros(1, 3), torch.tensor([1.0]), 1.0, 0.28)
        >>> loss  # -1.28·log 2, -0.5·log 0.5, -1.1·log 1.1
        tensor([[-0.8872,  0.3466, -0.1048]])
        >>> capped
        tensor([[ True, False, False]])
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    advantages = _expand_to(advantages.detach(), logprobs)
    logprobs, old_logprobs = _zero_masked(mask, logprobs, old_logprobs.detach())
    ratio = torch.exp((logprobs - old_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)).detach()
    weight = ratio.clamp(max(0.0, 1.0 - clip_low), 1.0 + clip_high)
    is_clipped = weight != ratio
    return -weight * advantages * logprobs, is_clipped


def sapo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    mask: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """SAPO's per-token loss (Gao et al., 2025): a smooth sigmoid gate in place of PPO's hard clip.

    Formula::

        r    = π / π_old
        τ    = τ_pos if A > 0 else τ_neg
        f(r) = σ(τ (r − 1)) · 4 / τ
        loss = −f(r) · A

    Its gradient is ``−A · w · r · ∇log π`` with the gate weight ``w = 4 σ(1 − σ)``
    (σ = σ(τ(r − 1))): the unclipped surrogate's gradient ``−A · r · ∇log π`` scaled by ``w``, which
    is 1 on policy (r = 1) and decays smoothly as r leaves 1 — a soft trust region instead of PPO's
    cliff; ``4/τ`` makes the slope at r = 1 independent of τ. A larger τ decays faster; the paper
    takes ``τ_neg > τ_pos`` because negative-advantage updates spread probability to many unsampled
    tokens and destabilise training (τ_pos = 1.0, τ_neg = 1.05).

    Args:
        logprobs: ``[B, T]`` log π (with grad).
        old_logprobs: ``[B, T]`` log π_old (detached).
        advantages: ``[B, T]`` or ``[B]`` (detached).
        tau_pos, tau_neg: gate temperatures (> 0) for A > 0 and A ≤ 0.
        mask: optional ``[B, T]``: padded log-probs (±inf, NaN) get a zero gradient.

    Returns:
        ``(loss [B, T], gate_weight [B, T])``: ``gate_weight`` is ``w`` above (detached), the factor
        the gate puts on the unclipped surrogate's gradient.

    Example:
        >>> lp = torch.log(torch.tensor([[1.0, 1.5]]))  # old log-probs 0: r = 1, 1.5
        >>> loss, w = sapo_loss(lp, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]))
        >>> loss  # -σ(0)·4/1 = -2;  +σ(1.05·0.5)·4/1.05 = 0.62832·3.80952 = 2.3936
        tensor([[-2.0000,  2.3936]])
        >>> w  # 4·σ(1-σ): 1 on policy; 4·0.62832·0.37168 = 0.9341
        tensor([[1.0000, 0.9341]])
    """
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"tau_pos and tau_neg must be > 0, got {tau_pos}, {tau_neg}")
    advantages = _expand_to(advantages.detach(), logprobs)
    logprobs, old_logprobs = _zero_masked(mask, logprobs, old_logprobs.detach())
    ratio = torch.exp((logprobs - old_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    tau = torch.where(advantages > 0, torch.full_like(advantages, tau_pos), torch.full_like(advantages, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = -gate * (4.0 / tau) * advantages
    gate_weight = (4.0 * gate * (1.0 - gate)).detach()
    return loss, gate_weight


def reverse_kl_rewards(logprobs: Tensor, teacher_logprobs: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """Per-token reward of on-policy distillation: the negative reverse-KL sample.

    Formula::

        r_t = −(log π_S(x_t | x_<t) − log π_T(x_t | x_<t))

    for a token ``x_t`` the student π_S sampled. Its expectation under the student is
    ``E_{x_t ~ π_S}[r_t] = −KL(π_S(·|x_<t) ‖ π_T(·|x_<t))``: the reverse (mode-seeking) KL,
    per position, to the teacher π_T (the k1 estimator of :func:`kl_k1`, negated). Positive where the
    teacher likes the token more than the student does. 0 at masked positions.

    Example:
        >>> s = torch.log(torch.tensor([[0.5, 0.25, 0.1]]))
        >>> t = torch.log(torch.tensor([[0.5, 0.5, 1e-9]]))
        >>> reverse_kl_rewards(s, t, torch.tensor([[1, 1, 0]]))  # log(.5/.5), log(.5/.25), masked
        tensor([[0.0000, 0.6931, 0.0000]])
    """
    logprobs, teacher_logprobs = _zero_masked(mask, logprobs.detach(), teacher_logprobs.detach())
    return teacher_logprobs - logprobs


def distillation_advantages(
    old_logprobs: Tensor,
    teacher_logprobs: Tensor,
    mask: Tensor,
    env_advantages: Optional[Tensor] = None,
    distill_coef: float = 1.0,
) -> Tensor:
    """Per-token advantage of on-policy distillation, optionally mixed with the env's.

    Formula::

        A_t = α · r_t + (1 − α) · A_env,    r_t = −(log π_old(x_t) − log π_T(x_t))    (reverse_kl_rewards)

    Each token's advantage is its own reverse-KL sample: discount 0, as in the Thinking Machines
    post — the student is graded on the next token only, since the teacher has already scored every
    later token where the student wrote it. α = ``distill_coef``; ``A_env`` (``[B, T]`` or ``[B]``) is
    the env reward's advantage, weighted 1 − α (GKD's ``(1 − α)·r − α·D`` objective, Agarwal et al.
    2024, for RL with on-policy distillation). 0 off ``mask``.

    Example:
        >>> old = torch.log(torch.tensor([[0.5, 0.25]]))
        >>> teacher = torch.log(torch.tensor([[0.5, 0.5]]))
        >>> distillation_advantages(old, teacher, torch.ones(1, 2), torch.tensor([1.0]), distill_coef=0.5)
        tensor([[0.5000, 0.8466]])
    """
    if not 0.0 <= distill_coef <= 1.0:
        raise ValueError(f"distill_coef must be in [0, 1] (the weight of the reverse-KL reward), got {distill_coef}")
    advantages = distill_coef * reverse_kl_rewards(old_logprobs, teacher_logprobs, mask)
    if env_advantages is not None and distill_coef < 1.0:
        env = _expand_to(env_advantages.detach().to(advantages.dtype), advantages)
        advantages = advantages + (1.0 - distill_coef) * torch.where(_valid(mask), env, torch.zeros_like(env))
    return advantages


def distillation_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    teacher_logprobs: Tensor,
    mask: Tensor,
    *,
    env_advantages: Optional[Tensor] = None,
    distill_coef: float = 1.0,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> tuple[Tensor, Tensor]:
    """Per-token loss of on-policy distillation (GKD's on-policy reverse KL; the Thinking Machines recipe).

    Formulas::

        A_t   = α · (log π_T(x_t) − log π_old(x_t)) + (1 − α) · A_env      (distillation_advantages)
        ratio = exp(log π − log π_old)
        loss  = −min(ratio · A_t, clip(ratio, 1 − ε_low, 1 + ε_high) · A_t)  (clipped_surrogate_loss)

    ``A_t`` is data (detached). At an on-policy step (ratio = 1) the gradient is
    ``−∇log π(x_t) · A_t``, whose expectation over ``x_t ~ π`` is exactly ``α·∇ KL(π ‖ π_T)`` per
    position: ``∇ KL = E[∇log π · (log π − log π_T)] + E[∇log π]`` and the score function's mean
    ``E[∇log π]`` is 0. Minimising it moves the student towards the teacher's modes (reverse KL is
    mode-seeking), on the student's own samples.

    Args:
        logprobs: ``[B, T]`` log π (with grad).
        old_logprobs: ``[B, T]`` log π_old of the sampled tokens (the student when it sampled).
        teacher_logprobs: ``[B, T]`` log π_T of the same tokens (detached; the teacher never trains).
        mask: ``[B, T]`` the student's tokens (not prompts, env replies or padding).
        env_advantages: ``[B, T]`` or ``[B]`` advantage from the env's reward; ``None`` = 0.
        distill_coef: α in [0, 1].
        clip_low, clip_high: the PPO clip of :func:`clipped_surrogate_loss` (inactive on-policy).

    Returns:
        ``(loss [B, T], is_clipped [B, T] bool)``; aggregate with :func:`aggregate_loss` over ``mask``.

    Example:
        >>> old = torch.log(torch.tensor([[0.5, 0.25]]))
        >>> teacher = torch.log(torch.tensor([[0.5, 0.5]]))
        >>> loss, _ = distillation_loss(old.clone().requires_grad_(), old, teacher, torch.ones(1, 2))
        >>> loss.detach() + 0.0  # −A_t on-policy: A = (0, log 2)
        tensor([[ 0.0000, -0.6931]])
    """
    advantages = distillation_advantages(old_logprobs, teacher_logprobs, mask, env_advantages, distill_coef)
    return clipped_surrogate_loss(logprobs, old_logprobs, advantages, clip_low, clip_high, mask=mask)


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, clip: Optional[float] = 0.2
) -> Tensor:
    """PPO's clipped value loss per token.

    Formula: ``½ · max((V − R)², (clip(V, V_old − c, V_old + c) − R)²)``; with ``clip=None`` it is
    the plain ``½ (V − R)²``.

    Args:
        values: ``[B, T]`` current value predictions (with grad).
        old_values: ``[B, T]`` value predictions at rollout time (detached).
        returns: ``[B, T]`` targets, e.g. GAE returns (detached).
        clip: c.

    Returns:
        ``[B, T]``.

    Example:
        >>> v = torch.tensor([[1.0, 0.5]])
        >>> v_old = torch.tensor([[0.0, 0.0]])
        >>> R = torch.tensor([[2.0, -1.0]])
        >>> clipped_value_loss(v, v_old, R, clip=0.2)  # 0.5*max(1, 1.8²), 0.5*max(1.5², 1.2²)
        tensor([[1.6200, 1.1250]])
    """
    returns = returns.detach()
    vf_loss1 = (values - returns) ** 2
    if clip is None:
        return 0.5 * vf_loss1
    old_values = old_values.detach()
    values_clipped = old_values + (values - old_values).clamp(-clip, clip)
    vf_loss2 = (values_clipped - returns) ** 2
    return 0.5 * torch.maximum(vf_loss1, vf_loss2)


LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def aggregate_loss(
    loss: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    num_tokens: Optional[float] = None,
    num_sequences: Optional[float] = None,
    normalizer: Optional[float] = None,
) -> Tensor:
    """Reduce a per-token loss ``[B, T]`` to the scalar that is back-propagated.

    With ``m`` the mask, ``n_i = Σ_t m_{i,t}`` the valid tokens of sequence ``i``,
    ``N = num_tokens`` (default ``Σ_i n_i``, the batch's valid tokens) and
    ``S = num_sequences`` (default ``B``, the number of rows — an all-masked row counts as a
    sequence with loss 0, so drop padding rows or pass ``num_sequences``):

    * ``"token-mean"`` (DAPO; every token weighs the same):
      ``Σ_{i,t} m ℓ / N``.
    * ``"seq-mean-token-mean"`` (original GRPO; every sequence weighs the same, so tokens of
      short sequences weigh more): ``(1/S) Σ_i (Σ_t m ℓ / n_i)`` (a row with ``n_i = 0`` gives 0).
    * ``"seq-mean-token-sum"``: ``(1/S) Σ_i Σ_t m ℓ``.
    * ``"seq-mean-token-sum-norm"`` (Dr. GRPO; a constant normaliser, no length bias):
      ``Σ_{i,t} m ℓ / (S · normalizer)`` with ``normalizer`` defaulting to ``T = loss.shape[1]``
      — pass the max generation length explicitly so the constant does not depend on padding.

    Micro-batching / data parallelism. Every mode is a *sum over sequences* divided by a constant,
    so splitting a batch into micro-batches (or ranks) and summing their gradients reproduces the
    full-batch gradient exactly **if each part is given the full batch's denominators**:

    * ``"token-mean"``: pass ``num_tokens`` = valid tokens of the whole (global) batch. Without it,
      each part divides by its own count and the sum of parts is *not* the full-batch loss when
      the parts have different token counts.
    * ``"seq-mean-token-mean"``, ``"seq-mean-token-sum"``: pass ``num_sequences`` = rows of the
      whole batch (the per-sequence term only depends on its own row).
    * ``"seq-mean-token-sum-norm"``: pass ``num_sequences`` and the same fixed ``normalizer`` to
      every part (the default ``T`` changes with each part's padding).

    Under DDP, which *averages* gradients over ``world_size`` ranks, multiply each rank's loss by
    ``world_size`` (or pass ``num_tokens``/``num_sequences`` divided by ``world_size``).

    Args:
        loss: ``[B, T]`` per-token loss.
        mask: ``[B, T]``.
        mode: one of :data:`LOSS_AGG_MODES`.
        num_tokens: token-mean denominator override (e.g. the global valid-token count).
        num_sequences: sequence-mean denominator override (e.g. the global number of sequences).
        normalizer: Dr. GRPO's constant (default ``T``).

    Returns:
        scalar tensor.

    Raises:
        ValueError: unknown mode.

    Example:
        >>> loss = torch.tensor([[1., 1., 1., 1.], [4., 0., 0., 0.]])
        >>> m = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
        >>> aggregate_loss(loss, m, "token-mean")           # (4 + 4) / 5
        tensor(1.6000)
        >>> aggregate_loss(loss, m, "seq-mean-token-mean")  # (1 + 4) / 2
        tensor(2.5000)
        >>> aggregate_loss(loss, m, "seq-mean-token-sum")   # (4 + 4) / 2
        tensor(4.)
        >>> aggregate_loss(loss, m, "seq-mean-token-sum-norm")  # 8 / (2 * 4)
        tensor(1.)
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"unknown loss aggregation mode {mode!r}; valid modes: {list(LOSS_AGG_MODES)}"
        )
    if loss.dim() != 2:
        raise ValueError(f"aggregate_loss expects a per-token loss [B, T], got {tuple(loss.shape)}")
    tiny = torch.finfo(loss.dtype).tiny
    w = _weights(mask, loss)
    seq_sums = masked_sum(loss, mask, dim=-1)  # [B]
    n_seq = loss.shape[0] if num_sequences is None else num_sequences

    if mode == "token-mean":
        den = w.sum() if num_tokens is None else torch.as_tensor(num_tokens, dtype=loss.dtype)
        return seq_sums.sum() / den.clamp(min=tiny)
    if mode == "seq-mean-token-mean":
        seq_means = seq_sums / w.sum(dim=-1).clamp(min=tiny)
        return seq_means.sum() / max(n_seq, tiny)
    if mode == "seq-mean-token-sum":
        return seq_sums.sum() / max(n_seq, tiny)
    # seq-mean-token-sum-norm
    norm = loss.shape[1] if normalizer is None else normalizer
    return seq_sums.sum() / max(n_seq * norm, tiny)


def policy_objective(
    pg_loss: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    kl: Optional[Tensor] = None,
    kl_coef: float = 0.0,
    entropy: Optional[Tensor] = None,
    entropy_coef: float = 0.0,
    **aggregate_kw: Any,
) -> Tensor:
    """The scalar objective of a policy-gradient agent: ``aggregate(ℓ_pg + β·KL − c_H·H)``.

    ``ℓ_pg`` is the per-token surrogate (:func:`policy_gradient_loss`, :func:`clipped_surrogate_loss`,
    ...), ``KL`` a per-token estimate of KL(π‖π_ref) (:func:`kl_estimate`) added with weight β when
    the penalty sits in the loss (GRPO; pass ``kl=None`` when it sits in the reward), ``H`` the
    per-token entropy; :func:`aggregate_loss` reduces over ``mask`` in ``mode`` (``aggregate_kw``:
    its ``num_tokens``, ``num_sequences``, ``normalizer``).

    Args:
        pg_loss, mask: ``[B, T]``.
        mode: one of :data:`LOSS_AGG_MODES`.
        kl: ``[B, T]`` or ``None`` (no KL term).
        kl_coef: β.
        entropy: ``[B, T]`` or ``None``.
        entropy_coef: c_H; 0 adds nothing (not even a zero-weighted gradient through the entropy).

    Returns:
        scalar tensor.

    Example:
        >>> pg = torch.tensor([[1.0, -1.0, 0.0]])
        >>> kl = torch.tensor([[0.5, 0.5, 9.0]])
        >>> m = torch.tensor([[1, 1, 0]])
        >>> policy_objective(pg, m, "token-mean", kl=kl, kl_coef=0.1)  # ((1 + .05) + (-1 + .05)) / 2
        tensor(0.0500)
    """
    token_loss = pg_loss if kl is None or not kl_coef else pg_loss + kl_coef * kl
    if entropy_coef:  # 0·H would still send a gradient through the entropy's [K, V] softmax
        token_loss = token_loss - entropy_coef * entropy
    return aggregate_loss(token_loss, mask, mode, **aggregate_kw)


# --------------------------------------------------------------------------------------------
# diagnostics
# --------------------------------------------------------------------------------------------


def explained_variance(predicted: Tensor, target: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Explained variance of a value head: ``1 − Var[R − V] / Var[R]`` over valid positions.

    1 is perfect, 0 is no better than a constant, < 0 is worse than a constant. When the target's
    variance is ~0 (``Var[R] ≤ eps``, or nothing is valid) the ratio is undefined — and dividing by
    round-off gives nonsense such as −4·10⁸ when every reward is 0 and the returns hold only a tiny
    KL penalty — so 0 is returned: logs and plots stay clean, and a constant target has nothing
    left to explain.

    Args:
        predicted: ``[B, T]`` values V.
        target: ``[B, T]`` returns R.
        mask: ``[B, T]``.
        eps: variance of R at or below which the quantity is reported as 0.

    Returns:
        scalar tensor (detached).

    Example:
        >>> R = torch.tensor([[1., 2., 3., 4.]])
        >>> explained_variance(R, R, torch.ones(1, 4))
        tensor(1.)
        >>> explained_variance(torch.full((1, 4), 2.5), R, torch.ones(1, 4))
        tensor(0.)
        >>> explained_variance(torch.zeros(1, 4), torch.tensor([[0., 1e-6, 0., -1e-6]]), torch.ones(1, 4))
        tensor(0.)
    """
    predicted, target = predicted.detach(), target.detach()
    var_target = masked_var(target, mask)
    var_residual = masked_var(target - predicted, mask)
    defined = var_target > eps
    ev = 1.0 - var_residual / torch.where(defined, var_target, torch.ones_like(var_target))
    return torch.where(defined, ev, torch.zeros_like(ev))


def clip_fraction(is_clipped: Tensor, mask: Tensor) -> Tensor:
    """Fraction of valid tokens whose gradient the clipping removed: ``Σ m·clipped / Σ m``.

    Args:
        is_clipped: ``[B, T]`` bool (from :func:`clipped_surrogate_loss`).
        mask: ``[B, T]``.

    Returns:
        scalar in ``[0, 1]`` (0 if nothing is valid).

    Example:
        >>> clip_fraction(torch.tensor([[True, False, True]]), torch.tensor([[1, 1, 0]]))
        tensor(0.5000)
    """
    return masked_mean(is_clipped.detach().to(torch.get_default_dtype()), mask)


# --------------------------------------------------------------------------------------------
# preference losses (DPO and its one-line variants) — issue 14
# --------------------------------------------------------------------------------------------

PREFERENCE_LOSSES = ("sigmoid", "ipo", "hinge")


def preference_loss(
    chosen_logratios: Tensor,
    rejected_logratios: Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    chosen_lengths: Optional[Tensor] = None,
    rejected_lengths: Optional[Tensor] = None,
) -> Tensor:
    """Per-pair DPO-family loss from sequence log-ratios ``h_± = log π(y_±|x) − log π_ref(y_±|x)``.

    With ``h = h_+ − h_-`` (log-ratios summed over each completion's tokens):

    * ``"sigmoid"`` (DPO, Rafailov et al. 2023): ``−log σ(β·h)``; with ``label_smoothing`` ε > 0 the
      conservative DPO (cDPO, Mitchell 2023) loss ``−(1−ε)·log σ(β·h) − ε·log σ(−β·h)`` (labels
      flipped with probability ε).
    * ``"ipo"`` (IPO, Azar et al. 2023, Eq. 17 with τ = β): ``(h̄ − 1/(2β))²`` with the log-ratios
      *averaged* per token, ``h̄ = h_+/|y_+| − h_-/|y_-|`` — the form the authors ran (TRL confirms
      it with them); it regresses the margin to a finite target instead of pushing it to infinity.
      Needs ``chosen_lengths`` and ``rejected_lengths``.
    * ``"hinge"`` (SLiC, Zhao et al. 2023): ``max(0, 1 − β·h)``.

    Args:
        chosen_logratios, rejected_logratios: ``[B]`` summed over each completion's tokens.
        beta: β > 0 (the KL strength of the implicit RLHF objective; IPO's τ).
        loss_type: one of ``PREFERENCE_LOSSES``.
        label_smoothing: ε in ``[0, 0.5)`` (``"sigmoid"`` only).
        chosen_lengths, rejected_lengths: ``[B]`` completion tokens ``|y_±|`` (``"ipo"`` only).

    Returns:
        ``[B]`` losses (mean them for the batch loss).

    Example:
        >>> h_plus, h_minus = torch.tensor([0.0, 2.0]), torch.tensor([0.0, 0.0])
        >>> preference_loss(h_plus, h_minus, beta=1.0)  # log 2 at a tie, −log σ(2)
        tensor([0.6931, 0.1269])
        >>> n = torch.tensor([1.0, 2.0])
        >>> preference_loss(h_plus, h_minus, beta=0.5, loss_type="ipo", chosen_lengths=n, rejected_lengths=n)
        tensor([1., 0.])
        >>> preference_loss(h_plus, h_minus, beta=1.0, label_smoothing=0.1)[1]  # 0.9·0.1269 + 0.1·2.1269
        tensor(0.3269)
    """
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if loss_type not in PREFERENCE_LOSSES:
        raise ValueError(f"loss_type must be one of {PREFERENCE_LOSSES}, got {loss_type!r}")
    if label_smoothing and loss_type != "sigmoid":
        raise ValueError(f"label_smoothing applies to the 'sigmoid' loss only, not {loss_type!r}")
    if loss_type == "ipo":
        if chosen_lengths is None or rejected_lengths is None:
            raise ValueError("the IPO loss averages each log-ratio over its completion's tokens: pass "
                             "chosen_lengths and rejected_lengths (tokens per completion)")
        h_mean = chosen_logratios / chosen_lengths.clamp(min=1) - rejected_logratios / rejected_lengths.clamp(min=1)
        return (h_mean - 1.0 / (2.0 * beta)) ** 2
    h = chosen_logratios - rejected_logratios
    if loss_type == "sigmoid":
        logsig = torch.nn.functional.logsigmoid
        return -(1.0 - label_smoothing) * logsig(beta * h) - label_smoothing * logsig(-beta * h)
    return torch.relu(1.0 - beta * h)  # hinge


__all__ += ["preference_loss", "PREFERENCE_LOSSES", "policy_objective"]


# --------------------------------------------------------------------------------------------
# off-policy corrections: the sampler's distribution is not the learner's
# --------------------------------------------------------------------------------------------
#
# The samples come from a sampler q (an inference engine's kernels and precision, stale weights,
# a truncated sampler) while the policy gradient is an expectation under the learner's policy p.
# Each correction below turns the per-token importance ratio ρ_t = p(y_t) / q(y_t) into a detached
# weight that multiplies the per-token policy-gradient loss. Plain importance sampling (w = Π_t ρ_t)
# is unbiased but its variance explodes with the length; each preset trades a bounded bias for
# bounded weights:
#
# * ``tis-token`` / ``tis-seq``: truncated importance sampling (Yao et al. 2025, "Your efficient RL
#   framework secretly brings you off-policy RL training"): ``min(ρ, C)``;
# * ``mis``: sequence-level masked importance sampling (Liu et al. 2025, "When speed kills
#   stability"; verl's ``seq-mis`` preset, TRL's ``sequence_mask``): ``ρ_seq · 1[lo ≤ ρ_seq ≤ C]``;
# * ``geo``: geometric sequence mask (SkyRL, verl's ``geo-rs``): keep a row, at weight 1, when its
#   per-token geometric-mean ratio is within ``[lo, hi]``;
# * ``icepop``: two-sided token mask (IcePop, Ling team 2025, the Ring-1T report): ``ρ_t · 1[α ≤ ρ_t ≤ β]``.
#
# The bias of each, against the exact expectation, is tested on small vocabularies by enumeration
# (``tests/agents/test_correction_bias.py``).

CORRECTIONS = ("tis-token", "tis-seq", "mis", "geo", "icepop")
"""The correction presets by name (``AgentConfig.correction``, ``llmgym train --correction``)."""

CORRECTION_BOUNDS = {"tis-token": (0.0, 2.0), "tis-seq": (0.0, 2.0), "mis": (0.0, 2.0),
                     "geo": (0.99, 1.01), "icepop": (0.5, 2.0)}
"""Each preset's default ``(low, high)``: for ``tis-*`` the cap ``C = high`` (``low`` must be 0:
truncation is from above only); for ``mis`` the kept band of the sequence ratio (``low = 0``: only
the upper side masks, as verl's and TRL's sequence masks); for ``geo`` the band of the geometric-mean
ratio (SkyRL's ``[0.99, 1.01]``: a 1 % average per-token disagreement); for ``icepop`` the band
``[α, β]`` of the token ratio (``[0.5, 2]``, symmetric in log space)."""


def _check_band(low: float, high: float, what: str) -> None:
    if not (high > 0 and 0 <= low <= high):
        raise ValueError(f"{what} bounds must satisfy 0 <= low <= high and high > 0, got ({low}, {high})")


def _log_ratio_rows(log_ratio: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(valid, log_ratio)``: the log-ratio detached, in at least float32, 0 at masked positions."""
    valid = _valid(mask)
    lr = log_ratio.detach()
    lr = lr.to(torch.promote_types(lr.dtype, torch.float32))
    return valid, torch.where(valid, lr, torch.zeros_like(lr))


def importance_log_ratio(learner_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> Tensor:
    """``log ρ_t = log π_learner(y_t) − log π_sampler(y_t)``, detached, 0 at masked positions.

    Example:
        >>> importance_log_ratio(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, 9.0]]), torch.tensor([[1, 0]]))
        tensor([[0.5000, 0.0000]])
    """
    _, lr = _log_ratio_rows(learner_logprobs.detach() - sampler_logprobs.detach(), mask)
    return lr


def tis_token_weights(log_ratio: Tensor, mask: Tensor, cap: float = 2.0) -> Tensor:
    """Token-level truncated importance weights: ``w_t = min(ρ_t, C)``, ``ρ_t = exp(log_ratio_t)``.

    Only the upper side is truncated; ratios below 1 are kept. 0 at masked positions; detached.
    Bias (sequence length 1): ``E_q[w f] − E_p[f] = −E_q[(ρ − C)_+ f]``, at most ``|f|_max`` times the
    truncated mass ``E_q[(ρ − C)_+]``. At longer lengths the token weight does not correct the prefix's
    distribution (the prefix was drawn from ``q``): the token-level trade of variance for bias.

    Example:
        >>> tis_token_weights(torch.tensor([[0.5, -1.0, 3.0]]), torch.tensor([[1, 1, 0]]), cap=1.5)
        tensor([[1.5000, 0.3679, 0.0000]])
    """
    _check_band(0.0, cap, "tis-token")
    valid, lr = _log_ratio_rows(log_ratio, mask)
    w = torch.exp(lr.clamp(max=min(_MAX_LOG_RATIO, math.log(cap))))
    return torch.where(valid, w, torch.zeros_like(w))


def tis_sequence_weights(log_ratio: Tensor, mask: Tensor, cap: float = 2.0) -> Tensor:
    """Sequence-level truncated importance weights: ``w = min(Π_t ρ_t, C) = min(exp(Σ_t m_t log ρ_t), C)``,
    one weight per row on each of its valid tokens (computed in log space; 0 at masked positions).

    Bias: ``E_q[w f] − E_p[f] = −E_q[(ρ_seq − C)_+ f]``, at most ``|f|_max`` times the truncated mass.

    Example:
        >>> w = tis_sequence_weights(torch.tensor([[0.5, -1.0, 3.0]]), torch.tensor([[1, 1, 0]]), cap=2.0)
        >>> torch.allclose(w, torch.tensor([[math.exp(-0.5), math.exp(-0.5), 0.0]]))
        True
    """
    _check_band(0.0, cap, "tis-seq")
    valid, lr = _log_ratio_rows(log_ratio, mask)
    seq = lr.sum(dim=-1, keepdim=True).clamp(max=min(_MAX_LOG_RATIO, math.log(cap)))
    w = torch.exp(seq).expand_as(lr)
    return torch.where(valid, w, torch.zeros_like(w))


def mis_sequence_weights(log_ratio: Tensor, mask: Tensor, cap: float = 2.0, low: float = 0.0) -> Tensor:
    """Sequence-level masked importance sampling: ``w = ρ_seq · 1[low ≤ ρ_seq ≤ C]``, ``ρ_seq = Π_t ρ_t``
    (compared in log space). A row outside the band leaves the loss entirely (weight 0 on every token);
    a kept row keeps its full, untruncated importance weight.

    Bias: ``E_q[w f] − E_p[f] = −E_p[1[ρ_seq ∉ [low, C]] f]``, at most ``|f|_max`` times the target's
    mass on the masked rows. Unlike TIS the masked rows contribute nothing (no bounded gradient from
    a sample the sampler and the learner disagree on); the kept weights are at most ``C``.

    Example:
        >>> lr = torch.tensor([[0.5, 0.4], [0.1, -0.3]])
        >>> w = mis_sequence_weights(lr, torch.ones(2, 2), cap=2.0)  # row 0: e^0.9 ≈ 2.46 > 2, masked
        >>> w[0].tolist(), torch.allclose(w[1], torch.full((2,), math.exp(-0.2)))
        ([0.0, 0.0], True)
    """
    _check_band(low, cap, "mis")
    valid, lr = _log_ratio_rows(log_ratio, mask)
    seq = lr.sum(dim=-1, keepdim=True)
    keep = seq <= math.log(cap)
    if low > 0:
        keep = keep & (seq >= math.log(low))
    w = torch.where(keep, torch.exp(seq.clamp(max=math.log(cap))), torch.zeros_like(seq)).expand_as(lr)
    return torch.where(valid, w, torch.zeros_like(w))


def geo_sequence_mask(log_ratio: Tensor, mask: Tensor, low: float = 0.99, high: float = 1.01) -> Tensor:
    """Geometric sequence mask: ``r_geo = exp(Σ_t m_t log ρ_t / Σ_t m_t)``, the per-token geometric mean
    of the row's ratios; ``w = 1[low ≤ r_geo ≤ high]`` on each valid token. No importance weight on the
    kept rows: a pure rejection of the rows whose average disagreement exceeds the band, whatever
    their length (the product ``Π_t ρ_t`` grows with the length; the geometric mean does not).

    Bias: on a kept row of ``L`` tokens ``ρ_seq = r_geo^L ∈ [low^L, high^L]``, so
    ``|E_q[w f] − E_p[f]| ≤ |f|_max (ε · P_q(kept) + P_p(masked))`` with ``ε = max(high^L − 1, 1 − low^L)``.

    Example:
        >>> lr = torch.tensor([[0.001, -0.003, 0.0], [0.05, 0.0, 0.0]])
        >>> geo_sequence_mask(lr, torch.tensor([[1, 1, 0], [1, 1, 1]]))  # means -0.001 and 0.0167
        tensor([[1., 1., 0.],
                [0., 0., 0.]])
    """
    _check_band(low, high, "geo")
    valid, lr = _log_ratio_rows(log_ratio, mask)
    count = valid.sum(dim=-1, keepdim=True).clamp(min=1)
    mean = lr.sum(dim=-1, keepdim=True) / count
    keep = mean <= math.log(high)
    if low > 0:
        keep = keep & (mean >= math.log(low))
    w = keep.to(lr.dtype).expand_as(lr)
    return torch.where(valid, w, torch.zeros_like(w))


def icepop_token_weights(log_ratio: Tensor, mask: Tensor, low: float = 0.5, high: float = 2.0) -> Tensor:
    """IcePop's two-sided token mask: ``w_t = ρ_t · 1[α ≤ ρ_t ≤ β]`` with ``α = low``, ``β = high``: a
    token whose ratio leaves the band loses its gradient (weight 0) instead of being truncated.

    Bias (sequence length 1): ``E_q[w f] − E_p[f] = −E_p[1[ρ ∉ [α, β]] f]``, at most ``|f|_max`` times
    the target's mass on the masked tokens.

    Example:
        >>> lr = torch.log(torch.tensor([[0.4, 1.5, 2.5, 1.0]]))
        >>> icepop_token_weights(lr, torch.tensor([[1, 1, 1, 0]]))
        tensor([[0.0000, 1.5000, 0.0000, 0.0000]])
    """
    _check_band(low, high, "icepop")
    valid, lr = _log_ratio_rows(log_ratio, mask)
    keep = lr <= math.log(high)
    if low > 0:
        keep = keep & (lr >= math.log(low))
    w = torch.where(keep, torch.exp(lr.clamp(max=math.log(high))), torch.zeros_like(lr))
    return torch.where(valid, w, torch.zeros_like(w))


def correction_weights(name: str, log_ratio: Tensor, mask: Tensor, low: Optional[float] = None,
                       high: Optional[float] = None) -> tuple[Tensor, dict[str, Tensor]]:
    """The weights ``[B, T]`` of the correction ``name`` (one of :data:`CORRECTIONS`) and their statistics.

    ``low``/``high`` default to :data:`CORRECTION_BOUNDS`. Statistics, over valid tokens (rows: those
    with a valid token):

    * ``correction_weight_mean``: the mean weight;
    * ``correction_truncated_share``: share of tokens whose weight was truncated at ``C`` (``tis-*``;
      for ``tis-seq`` every token of a row whose ``ρ_seq > C``);
    * ``correction_masked_share``: share of tokens given weight 0 by a mask (``mis``, ``geo``, ``icepop``);
    * ``correction_rows_masked_share``: share of rows every valid token of which was masked.

    Example:
        >>> lr = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
        >>> w, s = correction_weights("tis-token", lr, torch.ones(2, 2))
        >>> w.tolist(), float(s["correction_truncated_share"]), float(s["correction_masked_share"])
        ([[2.0, 1.0], [1.0, 1.0]], 0.25, 0.0)
        >>> w, s = correction_weights("mis", lr, torch.ones(2, 2))
        >>> w.tolist(), float(s["correction_masked_share"]), float(s["correction_rows_masked_share"])
        ([[0.0, 0.0], [1.0, 1.0]], 0.5, 0.5)
        >>> correction_weights("seq-tis", lr, torch.ones(2, 2))
        Traceback (most recent call last):
        ...
        ValueError: unknown correction 'seq-tis': choose one of tis-token, tis-seq, mis, geo, icepop
    """
    if name not in CORRECTIONS:
        raise ValueError(f"unknown correction {name!r}: choose one of {', '.join(CORRECTIONS)}")
    d_low, d_high = CORRECTION_BOUNDS[name]
    low = d_low if low is None else float(low)
    high = d_high if high is None else float(high)
    valid, lr = _log_ratio_rows(log_ratio, mask)
    zero = torch.zeros_like(lr, dtype=torch.bool)
    truncated = masked = zero
    if name in ("tis-token", "tis-seq"):
        if low != 0:
            raise ValueError(f"{name} truncates from above only: its low bound must be 0, got {low}")
        if name == "tis-token":
            weights = tis_token_weights(lr, valid, high)
            truncated = valid & (lr > math.log(high))
        else:
            weights = tis_sequence_weights(lr, valid, high)
            truncated = valid & (lr.sum(dim=-1, keepdim=True) > math.log(high))
    elif name == "mis":
        weights = mis_sequence_weights(lr, valid, high, low)
        seq = lr.sum(dim=-1, keepdim=True)
        masked = valid & ((seq > math.log(high)) | ((seq < math.log(low)) if low > 0 else zero))
    elif name == "geo":
        weights = geo_sequence_mask(lr, valid, low, high)
        masked = valid & (weights == 0)
    else:
        weights = icepop_token_weights(lr, valid, low, high)
        masked = valid & ((lr > math.log(high)) | ((lr < math.log(low)) if low > 0 else zero))
    rows = valid.any(dim=-1)
    rows_masked = rows & ~(valid & ~masked).any(dim=-1)
    stats = {"correction_weight_mean": masked_mean(weights, valid),
             "correction_truncated_share": masked_mean(truncated.to(lr.dtype), valid),
             "correction_masked_share": masked_mean(masked.to(lr.dtype), valid),
             "correction_rows_masked_share": rows_masked.sum().to(lr.dtype) / rows.sum().clamp(min=1).to(lr.dtype)}
    return weights, stats


__all__ += ["CORRECTIONS", "CORRECTION_BOUNDS", "importance_log_ratio", "tis_token_weights", "tis_sequence_weights",
            "mis_sequence_weights", "geo_sequence_mask", "icepop_token_weights", "correction_weights"]
