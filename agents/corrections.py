"""Corrections for the gap between the rollout engine's policy and the learner's.

A fast engine (vLLM: other kernels, bf16, a sampler of its own, top-p renormalisation) does not
compute exactly the same probabilities as the learner's ``transformers`` forward pass of the same
weights. The completions are then drawn from ``π_engine`` while the policy gradient assumes
``π_learner``; truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL framework
secretly brings you off-policy RL training") reweights each token's policy-gradient term by the
ratio, truncated from above so a rare token cannot blow up the variance.

Which log-probs are compared
----------------------------
* ``engine_logprobs``: what the engine reported **at generation time** for each sampled token
  (``Completion.logprobs`` → ``Batch.old_logprobs`` as collected);
* ``learner_logprobs``: the learner's teacher-forced log-probs of **the same tokens, with the weights
  the engine sampled from, before this update's optimiser step** (the learner's π_old), at the same
  temperature.

With :class:`~llmgym.engines.HFEngine` the two agree to ~1e-5 and every weight is ≈ 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["TIS_LEVELS", "truncated_importance_weights"]

TIS_LEVELS = ("token", "sequence")

# exp() of a log-ratio beyond this overflows float16/bfloat16 ranges; the cap truncates it anyway
_MAX_LOG_RATIO = 20.0


def truncated_importance_weights(
    learner_logprobs: Tensor,
    engine_logprobs: Tensor,
    mask: Tensor,
    level: str = "token",
    cap: float = 2.0,
) -> Tensor:
    """Truncated importance weights ``[B, T]`` (detached) that correct for the engine/learner gap.

    Formulas, with ``m`` the mask and ``r_t = π_learner(y_t) / π_engine(y_t)
    = exp(learner_logprobs_t − engine_logprobs_t)``:

    * ``level="token"``: ``w_t = min(r_t, C)`` for every valid token;
    * ``level="sequence"``: ``w = min(Π_t r_t, C) = min(exp(Σ_t m_t (log π_learner − log π_engine)), C)``,
      one weight per sequence, broadcast to its valid tokens.

    ``C = cap``. Only the upper side is truncated (TIS); ratios below 1 are kept. The weights
    multiply the per-token *policy-gradient* loss (equivalently, the advantages); KL and entropy
    terms are not reweighted. They are 0 at masked positions and carry no gradient.

    Args:
        learner_logprobs: ``[B, T]`` learner log-probs of the sampled tokens (π_old of the learner).
        engine_logprobs: ``[B, T]`` the engine's generation-time log-probs of the same tokens.
        mask: ``[B, T]`` 1 on policy tokens.
        level: ``"token"`` or ``"sequence"``.
        cap: ``C > 0``, the truncation.

    Returns:
        ``[B, T]`` weights.

    Example:
        >>> import math, torch
        >>> learner = torch.tensor([[-1.0, -2.0, 0.0]])
        >>> engine = torch.tensor([[-1.5, -1.0, 0.0]])
        >>> m = torch.tensor([[1, 1, 0]])
        >>> truncated_importance_weights(learner, engine, m, "token", cap=1.5)  # min(e^0.5, 1.5), e^-1
        tensor([[1.5000, 0.3679, 0.0000]])
        >>> w = truncated_importance_weights(learner, engine, m, "sequence", cap=2.0)  # e^(0.5 - 1)
        >>> torch.allclose(w, torch.tensor([[math.exp(-0.5), math.exp(-0.5), 0.0]]))
        True
    """
    if level not in TIS_LEVELS:
        raise ValueError(f"TIS level must be one of {TIS_LEVELS}, got {level!r}")
    if not cap > 0:
        raise ValueError(f"TIS cap must be > 0, got {cap}")
    valid = mask if mask.dtype == torch.bool else mask != 0
    log_ratio = (learner_logprobs.detach().float() - engine_logprobs.detach().float())
    log_ratio = torch.where(valid, log_ratio, torch.zeros_like(log_ratio))
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)
    log_ratio = log_ratio.clamp(max=min(_MAX_LOG_RATIO, torch.log(torch.tensor(float(cap))).item()))
    weights = torch.exp(log_ratio)
    return torch.where(valid, weights, torch.zeros_like(weights))
