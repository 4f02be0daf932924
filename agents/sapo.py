"""SAPO (Gao et al., 2025, Soft Adaptive Policy Optimization): a soft gate in place of the hard clip.

GRPO's group-relative advantages and per-sequence averaging, with PPO's clipped surrogate replaced
by ``−σ(τ (r_t − 1)) · 4/τ · A`` (see :func:`llmgym.agents.functional.sapo_loss`): near-on-policy
tokens learn as in the unclipped surrogate, and the gradient fades smoothly (never to a cliff) as
the ratio drifts. τ_neg > τ_pos damps negative-advantage updates faster (paper: 1.0 and 1.05).
"""

from __future__ import annotations

import dataclasses

from llmgym.agents import functional as F
from llmgym.agents.base import ForwardOutput
from llmgym.agents.grpo import GRPO, GRPOConfig
from llmgym.rollout.episodes import Batch

__all__ = ["SAPOConfig", "SAPO"]


@dataclasses.dataclass
class SAPOConfig(GRPOConfig):
    """SAPO settings.

    Attributes:
        tau_pos, tau_neg: gate temperatures for positive and non-positive advantages (> 0).
    """

    tau_pos: float = 1.0
    tau_neg: float = 1.05
    kl_coef: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.tau_pos > 0 and self.tau_neg > 0):
            raise ValueError(f"tau_pos and tau_neg must be > 0, got {self.tau_pos}, {self.tau_neg}")


class SAPO(GRPO):
    """Soft adaptive policy optimisation; logs ``gate_weight`` (1 on policy) instead of a clip fraction.

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.agents import SAPO
        >>> model, tok = load_model("tiny")
        >>> agent = SAPO(model, tok, tasks_per_step=2, group_size=4, max_new_tokens=4)
        >>> row = agent.learn(gymnasium.make("llmgym/Copy-v0", tokenizer=tok), steps=1)[0]
        >>> round(row["gate_weight"], 6)  # on policy the gate passes the gradient unchanged
        1.0
    """

    config_class = SAPOConfig
    name = "sapo"

    def loss(self, batch: Batch, out: ForwardOutput):
        c = self.config
        pg_loss, gate_weight = F.sapo_loss(out.logprobs, batch.old_logprobs, batch.advantages,
                                           c.tau_pos, c.tau_neg, mask=batch.action_mask)  # −f(r)·A
        kl = self.reference_kl(batch, out)  # None without a reference model (β = 0)
        loss = F.policy_objective(pg_loss, self.loss_mask(batch), c.loss_agg, kl=kl, kl_coef=self.kl_coef_in_loss,
                                  entropy=out.entropy, entropy_coef=c.entropy_coef,
                                  normalizer=c.loss_normalizer or c.max_new_tokens)  # agg(ℓ + β·KL − c_H·H)
        stats = self.policy_stats(batch, out, kl=kl)
        stats["gate_weight"] = float(F.masked_mean(gate_weight, batch.action_mask))
        return loss, stats
