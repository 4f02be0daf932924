"""Mismatch you can see: how far the sampler's probabilities are from the learner's, per step.

The rollout engine (the *sampler* ``q``: vLLM's kernels, bf16, a fleet server, or simply older weights)
and the learner's ``transformers`` forward (``π``) should give the sampled tokens the same
probabilities; when they do not, the policy gradient is off-policy whether or not a correction is on.
The learner measures the gap on every update where it holds **both** log-probs of the same tokens at
no extra cost — the engine's generation-time ``log q(y_t)`` (``Batch.old_logprobs`` as collected) and
its own ``log π(y_t)`` under the weights it is about to update, which it computes anyway:

* the on-policy update (one optimiser step per batch): the forward of the gradient step itself, before
  that step, is ``π``;
* every other update that recomputes ``π_old`` itself (``tis`` set, ``precision`` other than fp32,
  stale tokens of the pipelined learner, an engine that checks its reported log-probs): that
  recomputation is ``π``.

An update that keeps the engine's log-probs as ``π_old`` without a learner pass of its own (several
optimiser steps per batch, fp32, no correction) measures nothing, and its row has no mismatch field —
never a 0 it did not measure. Neither does an agent whose batch is not the engine's samples (offline
DPO's pairs).

Metrics (with ``δ_t = log π(y_t) − log q(y_t)`` over the policy tokens; see
:func:`llmgym.agents.functional.mismatch_terms`):

* ``mismatch_kl``: the k3 estimate of ``KL(q ‖ π)``, ``mean_t (exp(δ_t) − 1 − δ_t)`` (unbiased, ≥ 0;
  NeMo-RL's ``gen_kl_error``, ~1e-3 typical for a vLLM sampler and a bf16 learner);
* ``mismatch_kl_k1``: the k1 estimate ``mean_t (−δ_t)`` (unbiased, noisier, can be negative);
* ``mismatch_prob_error``: ``mean_t exp(|δ_t|)`` (≥ 1; NeMo-RL's ``token_mult_prob_error``);
* by version lag (tokens tagged with the policy version that sampled them: the pipelined learner),
  ``mismatch_kl/lag{k}`` and ``mismatch_prob_error/lag{k}`` over the tokens sampled ``k`` updates
  before the learner's weights, for each lag present in the batch (lag 0: the engine gap alone; lag
  ``k ≥ 1``: the engine gap and ``k`` updates of drift).

:class:`MismatchMonitor` warns (:class:`MismatchWarning`) when ``mismatch_kl`` passes
``AgentConfig.mismatch_kl_warn`` (default 1e-2, ten times NeMo-RL's typical value) or
``mismatch_prob_error`` passes ``AgentConfig.mismatch_prob_error_warn`` (default 1.1, NeMo-RL's CI
gate): once when the value crosses its threshold, again only after it has come back under it.
"""

from __future__ import annotations

import math
import warnings
from typing import Mapping

import torch
from torch import Tensor

from llmgym.agents import functional as F
from llmgym.errors import LLMGymError, LLMGymWarning
from llmgym.runtime import distributed

__all__ = ["MismatchWarning", "MismatchConfigError", "MismatchStats", "MismatchMonitor", "check_mismatch_config",
           "MISMATCH_KL_WARN", "MISMATCH_PROB_ERROR_WARN"]

MISMATCH_KL_WARN = 1e-2
"""Default warning threshold of ``mismatch_kl`` (ten times NeMo-RL's typical ``gen_kl_error`` of ~1e-3)."""

MISMATCH_PROB_ERROR_WARN = 1.1
"""Default warning threshold of ``mismatch_prob_error`` (NeMo-RL's CI gate on ``token_mult_prob_error``)."""

_TERMS = ("k3", "k1", "prob_error")


class MismatchWarning(LLMGymWarning):
    """The sampler and the learner disagree on the sampled tokens' probabilities beyond a stated threshold."""


class MismatchConfigError(LLMGymError, ValueError):
    """A mismatch warning threshold that is not ``None`` or a finite number in its range."""


class MismatchStats:
    """Token sums of the mismatch terms over an update's micro-batches, overall and by version lag.

    ``add`` takes the learner's and the sampler's log-probs of the same tokens; ``result`` is the
    metrics (token-weighted means over everything added; over every rank under data parallel).

    Example:
        >>> import torch
        >>> stats = MismatchStats()
        >>> learner, sampler = torch.tensor([[-1.0, -1.0, -1.0]]), torch.tensor([[-1.0, -1.5, 0.0]])
        >>> stats.add(learner, sampler, torch.tensor([[1, 1, 0]]), lags=torch.tensor([[0, 1, 1]]))
        >>> r = stats.result()
        >>> sorted(r)
        ['mismatch_kl', 'mismatch_kl/lag0', 'mismatch_kl/lag1', 'mismatch_kl_k1', 'mismatch_prob_error', 'mismatch_prob_error/lag0', 'mismatch_prob_error/lag1']
        >>> r["mismatch_kl/lag0"], r["mismatch_prob_error/lag0"], round(r["mismatch_kl_k1"], 4)
        (0.0, 1.0, -0.25)
        >>> MismatchStats().result()  # nothing measured: no metric at all
        {}
    """

    def __init__(self) -> None:
        self.sums = torch.zeros(len(_TERMS) + 1, dtype=torch.float64)  # k3, k1, prob_error, count
        self.lag_sums: dict[int, torch.Tensor] = {}

    def add(self, learner_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, lags: Tensor | None = None) -> None:
        """Count the tokens of ``mask`` (``[B, T]``); ``lags`` (``[B, T]``, long): each token's version lag
        (``learner version − policy version``; negative where no policy sampled the token: not split)."""
        valid = mask if mask.dtype == torch.bool else mask != 0
        if learner_logprobs.shape != sampler_logprobs.shape or valid.shape != learner_logprobs.shape:
            raise ValueError(f"mismatch needs log-probs and mask of one shape, got {tuple(learner_logprobs.shape)}, "
                             f"{tuple(sampler_logprobs.shape)} and {tuple(valid.shape)}")
        terms = F.mismatch_terms(learner_logprobs, sampler_logprobs, valid)
        values = torch.stack([terms[k] for k in _TERMS] + [valid.to(terms["k3"].dtype)], dim=-1).flatten(0, -2)
        self.sums += values.sum(dim=0, dtype=torch.float64).cpu()
        if lags is None:
            return
        # one bucket per lag (bucket 0: tokens off the mask or untagged), summed in one pass on the device
        tagged = valid & (lags >= 0)
        if not bool(tagged.any()):
            return
        bucket = torch.where(tagged, lags + 1, torch.zeros_like(lags)).flatten()
        table = torch.stack([torch.bincount(bucket, weights=values[:, j].double()) for j in range(values.shape[-1])],
                            dim=-1).cpu()
        for lag in range(table.shape[0] - 1):
            if table[lag + 1, -1] > 0:
                self.lag_sums[lag] = self.lag_sums.get(lag, torch.zeros_like(table[0])) + table[lag + 1]

    def add_batch(self, learner_logprobs: Tensor, batch, version: int) -> None:
        """:meth:`add` for a :class:`~llmgym.rollout.episodes.Batch` whose ``old_logprobs`` are the sampler's
        (the engine's, as collected), with lags ``version − batch.policy_versions`` where tokens are tagged."""
        if batch.old_logprobs is None:
            return
        versions = batch.policy_versions
        lags = None if versions is None else torch.where(versions >= 0, int(version) - versions,
                                                         torch.full_like(versions, -1))
        self.add(learner_logprobs, batch.old_logprobs, batch.action_mask, lags)

    def reduce(self) -> None:
        """Sum the counts over data-parallel ranks (every rank calls it; a no-op in one process)."""
        if not distributed.is_distributed():
            return
        top = max(distributed.all_gather_ints(max(self.lag_sums, default=-1)))
        table = torch.zeros(top + 2, len(_TERMS) + 1, dtype=torch.float64)
        table[0] = self.sums
        for lag, part in self.lag_sums.items():
            table[lag + 1] = part
        table = distributed.all_reduce_sum(table).cpu()
        self.sums = table[0]
        self.lag_sums = {lag: table[lag + 1] for lag in range(top + 1) if table[lag + 1, -1] > 0}

    def result(self) -> dict[str, float]:
        """The metrics; ``{}`` when no token was counted (not measured)."""
        out: dict[str, float] = {}
        count = float(self.sums[-1])
        if count <= 0:
            return out
        k3, k1, prob = (float(v) / count for v in self.sums[:-1])
        out.update({"mismatch_kl": k3, "mismatch_kl_k1": k1, "mismatch_prob_error": prob})
        for lag in sorted(self.lag_sums):
            part = self.lag_sums[lag]
            if float(part[-1]) > 0:
                out[f"mismatch_kl/lag{lag}"] = float(part[0]) / float(part[-1])
                out[f"mismatch_prob_error/lag{lag}"] = float(part[2]) / float(part[-1])
        return out


class MismatchMonitor:
    """Warns when a step's ``mismatch_kl`` or ``mismatch_prob_error`` passes its threshold.

    Once per crossing: the step that goes over warns (naming the step, the value, the threshold and
    what to do); the steps that stay over do not; a step back under re-arms it. ``None`` turns a
    threshold off.

    Example:
        >>> import warnings
        >>> monitor = MismatchMonitor(kl_warn=1e-2, prob_error_warn=None)
        >>> with warnings.catch_warnings(record=True) as seen:
        ...     warnings.simplefilter("always")
        ...     for step, kl in enumerate([1e-3, 0.05, 0.07, 1e-3, 0.02], start=1):
        ...         monitor.observe({"mismatch_kl": kl}, step)
        >>> [str(w.message).split(":")[0] for w in seen]
        ['step 2', 'step 5']
    """

    def __init__(self, kl_warn: float | None = MISMATCH_KL_WARN, prob_error_warn: float | None = MISMATCH_PROB_ERROR_WARN):
        self.thresholds = {"mismatch_kl": kl_warn, "mismatch_prob_error": prob_error_warn}
        self.above = {name: False for name in self.thresholds}

    def finish(self, stats: MismatchStats, step: int) -> dict[str, float]:
        """An update's metrics from ``stats`` (summed over data-parallel ranks), checked: ``{}`` when not measured."""
        stats.reduce()
        result = stats.result()
        self.observe(result, step)
        return result

    def observe(self, metrics: Mapping[str, float], step: int) -> None:
        """Check one step's metrics (absent metrics: nothing measured, nothing said)."""
        for name, threshold in self.thresholds.items():
            value = metrics.get(name)
            if threshold is None or value is None or not math.isfinite(value):
                continue
            over = value > threshold
            if over and not self.above[name]:
                lags = ", ".join(f"{k.split('/')[1]} {v:.3g}" for k, v in sorted(metrics.items())
                                 if k.startswith(name + "/lag"))
                warnings.warn(
                    f"step {step}: {name} = {value:.4g} is over its threshold {threshold:g}"
                    + (f" (by version lag: {lags})" if lags else "")
                    + ": the sampler's probabilities of the sampled tokens are far from the learner's, so the update "
                      "is off-policy; turn a correction on (tis='token'), check the engine's and the learner's dtype "
                      "(bf16 vs fp32) and sampling settings, or lower the staleness (max_staleness)",
                    MismatchWarning, stacklevel=2)
            self.above[name] = over


def check_mismatch_config(config) -> None:
    """Validate ``mismatch_kl_warn`` (``None`` or a finite number > 0) and ``mismatch_prob_error_warn``
    (``None`` or a finite number > 1) of an ``AgentConfig``.

    Example:
        >>> from types import SimpleNamespace
        >>> check_mismatch_config(SimpleNamespace(mismatch_kl_warn=1e-2, mismatch_prob_error_warn=None))
        >>> try:
        ...     check_mismatch_config(SimpleNamespace(mismatch_kl_warn=0.0, mismatch_prob_error_warn=1.1))
        ... except MismatchConfigError as error:
        ...     print(error)
        mismatch_kl_warn must be None (no warning) or a finite number > 0, got 0.0
    """
    for name, low in (("mismatch_kl_warn", 0.0), ("mismatch_prob_error_warn", 1.0)):
        value = getattr(config, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= low:
            raise MismatchConfigError(f"{name} must be None (no warning) or a finite number > {low:g}, got {value!r}")
