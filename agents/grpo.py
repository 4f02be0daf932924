"""GRPO (Shao et al., 2024, DeepSeekMath) and its neighbours Dr. GRPO and GSPO.

For G samples of one prompt with rewards r_1..r_G: ``A_i = (r_i − mean(r)) / std(r)`` on every
token of sample i; the loss is PPO's clipped surrogate plus β·KL(π‖π_ref) in the loss (k3 by
default), averaged per sequence and then over the batch.

Dr. GRPO (Liu et al., 2025) drops the std division and the per-sequence length normalisation
(a constant normaliser instead). GSPO (Zheng et al., 2025) clips a sequence-level ratio.
"""

from __future__ import annotations

import dataclasses

from llmgym.agents import functional as F
from llmgym.agents.base import Agent, AgentConfig, ForwardOutput
from llmgym.rollout.episodes import Batch

__all__ = ["GRPOConfig", "GRPO", "DrGRPO", "GSPO"]


@dataclasses.dataclass
class GRPOConfig(AgentConfig):
    """GRPO settings.

    Attributes:
        normalize_std: divide group-centred rewards by the group's std (False = Dr. GRPO).
        ratio: ``"token"`` (PPO/GRPO per-token ratio) or ``"sequence"`` (GSPO's length-normalised
            sequence ratio).
        loss_normalizer: Dr. GRPO's constant for ``seq-mean-token-sum-norm`` (default: max_new_tokens).
    """

    group_size: int = 8
    kl_coef: float = 0.04
    kl_estimator: str = "k3"
    kl_placement: str = "loss"
    loss_agg: str = "seq-mean-token-mean"
    normalize_std: bool = True
    ratio: str = "token"
    loss_normalizer: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ratio not in ("token", "sequence"):
            raise ValueError(f"ratio must be 'token' or 'sequence', got {self.ratio!r}")
        if self.group_size < 2:
            raise ValueError(f"GRPO needs group_size >= 2 (advantages are relative to the group), got {self.group_size}")


class GRPO(Agent):
    """Group-relative policy optimisation.

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.agents import GRPO
        >>> model, tok = load_model("tiny")
        >>> agent = GRPO(model, tok, tasks_per_step=2, group_size=4, max_new_tokens=4, kl_coef=0.0)
        >>> agent.ref_model is None  # β = 0: no reference model is loaded
        True
        >>> row = agent.learn(gymnasium.make("llmgym/Copy-v0", tokenizer=tok), steps=1)[0]
        >>> row["clip_frac"]  # one on-policy step: the ratio is exactly 1
        0.0
    """

    config_class = GRPOConfig
    name = "grpo"

    def compute_advantages(self, batch: Batch) -> None:
        rewards = self.sequence_scores(batch).view(-1, self.config.group_size)
        advantages = F.group_advantages(rewards, normalize_std=self.config.normalize_std).view(-1)
        batch.advantages = advantages[:, None] * batch.action_mask

    def surrogate(self, batch: Batch, out: ForwardOutput):
        c = self.config
        if c.ratio == "sequence":
            return F.sequence_ratio_surrogate_loss(out.logprobs, batch.old_logprobs, batch.advantages,
                                                   batch.action_mask, c.clip_low, c.clip_high)
        return F.clipped_surrogate_loss(out.logprobs, batch.old_logprobs, batch.advantages,
                                        c.clip_low, c.clip_high, c.dual_clip, mask=batch.action_mask)

    def loss(self, batch: Batch, out: ForwardOutput):
        c = self.config
        pg_loss, is_clipped = self.surrogate(batch, out)  # −min(r·A, clip(r)·A) per token (GSPO: per sequence)
        kl = self.reference_kl(batch, out)  # None without a reference model (β = 0)
        loss = F.policy_objective(pg_loss, self.loss_mask(batch), c.loss_agg, kl=kl, kl_coef=self.kl_coef_in_loss,
                                  entropy=out.entropy, entropy_coef=c.entropy_coef,
                                  normalizer=c.loss_normalizer or c.max_new_tokens)  # agg(ℓ + β·KL − c_H·H)
        return loss, self.policy_stats(batch, out, is_clipped, kl)


@dataclasses.dataclass
class DrGRPOConfig(GRPOConfig):
    """Dr. GRPO: no std division, a constant length normaliser, no KL."""

    kl_coef: float = 0.0
    normalize_std: bool = False
    loss_agg: str = "seq-mean-token-sum-norm"


class DrGRPO(GRPO):
    """GRPO "done right" (Liu et al., 2025): unbiased by response length and question difficulty."""

    config_class = DrGRPOConfig
    name = "drgrpo"


@dataclasses.dataclass
class GSPOConfig(GRPOConfig):
    """GSPO: sequence-level importance ratio with the paper's tight clip range, no KL."""

    kl_coef: float = 0.0
    ratio: str = "sequence"
    clip_low: float = 3e-4
    clip_high: float = 4e-4


class GSPO(GRPO):
    """Group Sequence Policy Optimisation (Zheng et al., 2025)."""

    config_class = GSPOConfig
    name = "gspo"


__all__ += ["DrGRPOConfig", "GSPOConfig"]
