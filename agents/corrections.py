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

Stale samples (the pipelined learner)
-------------------------------------
Under :mod:`llmgym.agents.pipeline` a batch may have been sampled by the weights of an earlier
update: each token carries the policy version that sampled it (``Batch.policy_versions``), and a
token is *stale* when that version is older than the learner's (:func:`stale_token_mask`). The
correction is the decoupled PPO objective of AReaL (Fu et al., 2025, "AReaL: a large-scale
asynchronous reinforcement learning system for language reasoning"), with its behaviour weight
truncated as TIS truncates:

    J(θ) = E_{y ~ π_behav} [ Σ_t  min(π_prox(y_t) / π_behav(y_t), C) · surrogate_t(π_θ / π_prox, A_t) ]

* ``π_behav``: the engine's generation-time log-probs (the stale weights that sampled the token);
* ``π_prox``: the learner's log-probs of the same tokens with **its weights at the start of this
  update** (the proximal policy: the trust region of PPO's clip is centred on it, not on the stale
  policy, so staleness does not eat the clip range);
* the behaviour weight ``min(π_prox / π_behav, C)`` is the same :func:`truncated_importance_weights`
  as TIS (AReaL instead drops tokens whose weight exceeds its cap; truncation keeps their gradient,
  bounded, as in Yao et al.).

Only stale tokens are reweighted (weight 1 on fresh ones), so ``max_staleness=0`` changes nothing: the
weights are exactly 1 and the update is the synchronous one. With a correction chosen
(``AgentConfig.correction``: the presets of :data:`llmgym.agents.functional.CORRECTIONS`; ``tis`` is
its older spelling, see :func:`resolve_correction`) every token is weighted by that preset instead
(the engine gap and the staleness are one ratio). :class:`ImportanceWeightStats` is what
the learner reports: the weights' mean, min, max and truncated share, and the mean
``|log π_prox − log π_behav|`` over policy tokens (the drift the weights correct).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from llmgym.agents import functional as F

__all__ = ["TIS_LEVELS", "truncated_importance_weights", "stale_token_mask", "ImportanceWeightStats",
           "resolve_correction"]

TIS_LEVELS = ("token", "sequence")
"""The levels of the older ``AgentConfig.tis`` option: ``tis="token"`` is ``correction="tis-token"``,
``tis="sequence"`` is ``correction="tis-seq"``."""

_TIS_PRESETS = {"token": "tis-token", "sequence": "tis-seq"}


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
    log_ratio = F.importance_log_ratio(learner_logprobs, engine_logprobs, mask)
    weigh = F.tis_token_weights if level == "token" else F.tis_sequence_weights
    return weigh(log_ratio, mask, cap).float()


def resolve_correction(config) -> tuple[str | None, float, float]:
    """``(name, low, high)`` of the correction an ``AgentConfig`` asks for, validated (``ValueError``
    naming the field otherwise); ``(None, 0, tis_cap)`` when none is.

    ``correction`` names a preset of :data:`llmgym.agents.functional.CORRECTIONS`; the older
    ``tis="token"``/``"sequence"`` is the same as ``correction="tis-token"``/``"tis-seq"`` (both may be
    given only when they agree). ``correction_low``/``correction_high`` replace the preset's default
    band (:data:`~llmgym.agents.functional.CORRECTION_BOUNDS`); the default ``high`` of ``tis-*`` and
    ``mis`` is ``tis_cap`` (the one cap ``C``, shared with the stale-token correction).

    Example:
        >>> from types import SimpleNamespace
        >>> def config(**kw):
        ...     fields = dict(correction=None, correction_low=None, correction_high=None, tis=None, tis_cap=2.0)
        ...     return SimpleNamespace(**{**fields, **kw})
        >>> resolve_correction(config(correction="icepop", correction_high=3.0))
        ('icepop', 0.5, 3.0)
        >>> resolve_correction(config(tis="sequence", tis_cap=1.5))
        ('tis-seq', 0.0, 1.5)
        >>> resolve_correction(config(correction="geo-rs"))
        Traceback (most recent call last):
        ...
        ValueError: correction must be None or one of tis-token, tis-seq, mis, geo, icepop, got 'geo-rs'
    """
    name, tis = config.correction, config.tis
    if tis is not None:
        if tis not in TIS_LEVELS:
            raise ValueError(f"tis must be None, 'token' or 'sequence', got {tis!r} (or use correction=NAME)")
        if name is not None and name != _TIS_PRESETS[tis]:
            raise ValueError(f"tis={tis!r} (the same as correction={_TIS_PRESETS[tis]!r}) contradicts "
                             f"correction={name!r}: give only correction")
        name = _TIS_PRESETS[tis]
    if not config.tis_cap > 0:
        raise ValueError(f"tis_cap must be > 0, got {config.tis_cap}")
    low, high = config.correction_low, config.correction_high
    if name is None:
        if low is not None or high is not None:
            raise ValueError("correction_low/correction_high are the band of a correction: set correction too "
                             f"(one of {', '.join(F.CORRECTIONS)})")
        return None, 0.0, float(config.tis_cap)
    if name not in F.CORRECTIONS:
        raise ValueError(f"correction must be None or one of {', '.join(F.CORRECTIONS)}, got {name!r}")
    d_low, d_high = F.CORRECTION_BOUNDS[name]
    if name in ("tis-token", "tis-seq", "mis"):
        d_high = float(config.tis_cap)
    low = d_low if low is None else float(low)
    high = d_high if high is None else float(high)
    if not (high > 0 and 0 <= low <= high):
        raise ValueError(f"correction {name}: its band must satisfy 0 <= low <= high, high > 0; got "
                         f"low={low}, high={high}")
    if name.startswith("tis-") and low != 0:
        raise ValueError(f"correction {name} truncates from above only: leave correction_low unset (got {low})")
    return name, low, high


def stale_token_mask(policy_versions: Tensor, current_version: int, mask: Tensor) -> Tensor:
    """``[B, T]`` bool: policy tokens sampled by weights older than ``current_version``.

    ``policy_versions`` is ``Batch.policy_versions`` (``-1`` where no policy sampled the token).

    Example:
        >>> import torch
        >>> versions = torch.tensor([[-1, 3, 4, 5]])
        >>> stale_token_mask(versions, 5, torch.tensor([[0, 1, 1, 1]])).tolist()
        [[False, True, True, False]]
    """
    valid = mask if mask.dtype == torch.bool else mask != 0
    return valid & (policy_versions >= 0) & (policy_versions < int(current_version))


class ImportanceWeightStats:
    """Running statistics of the importance weights a correction applied (or would apply), over
    micro-batches: ``is_weight_mean/min/max``, ``is_weight_clip_frac`` (share truncated at the cap)
    and ``behaviour_log_ratio_abs`` (mean ``|log π_prox − log π_behav|``), all over policy tokens.

    Example:
        >>> import torch
        >>> stats = ImportanceWeightStats(cap=2.0)
        >>> m = torch.tensor([[1, 1, 0]])
        >>> stats.add(torch.tensor([[1.0, 2.0, 0.0]]), torch.tensor([[0.0, 0.9, 5.0]]), m)
        >>> stats.result()["is_weight_max"], stats.result()["is_weight_clip_frac"]
        (2.0, 0.5)
    """

    def __init__(self, cap: float):
        self.cap = cap
        self.count = 0
        self.weight_sum = self.truncated = self.log_ratio_abs_sum = 0.0
        self.low, self.high = math.inf, -math.inf

    def add(self, weights: Tensor, log_ratio: Tensor, mask: Tensor) -> None:
        """``weights`` and ``log_ratio = log π_prox − log π_behav``, ``[B, T]``, counted where ``mask``."""
        valid = mask if mask.dtype == torch.bool else mask != 0
        w, r = weights.detach().float()[valid], log_ratio.detach().float()[valid]
        if w.numel() == 0:
            return
        self.count += w.numel()
        self.weight_sum += float(w.sum())
        self.truncated += float((w >= self.cap * (1 - 1e-6)).sum())
        self.log_ratio_abs_sum += float(r.abs().sum())
        self.low, self.high = min(self.low, float(w.min())), max(self.high, float(w.max()))

    def result(self) -> dict[str, float]:
        if not self.count:
            return {}
        return {"is_weight_mean": self.weight_sum / self.count, "is_weight_min": self.low,
                "is_weight_max": self.high, "is_weight_clip_frac": self.truncated / self.count,
                "behaviour_log_ratio_abs": self.log_ratio_abs_sum / self.count}
