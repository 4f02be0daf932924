"""RLOO: REINFORCE Leave-One-Out (Kool et al., 2019; Ahmadian et al., 2024).

For G samples of one prompt, each sample's baseline is the mean reward of the *other* G−1:
``A_i = R_i − 1/(G−1) Σ_{j≠i} R_j``, where ``R_i`` is the verifier's reward minus β times the
sequence's KL to the reference (KL in the reward, as in the RLOO paper). The loss is the plain
REINFORCE loss ``−A_i · log π(y_i | x)`` over the whole completion.
"""

from __future__ import annotations

import dataclasses

from llmgym.agents import functional as F
from llmgym.agents.base import Agent, AgentConfig, ForwardOutput
from llmgym.rollout.episodes import Batch

__all__ = ["RLOOConfig", "RLOO"]


@dataclasses.dataclass
class RLOOConfig(AgentConfig):
    """RLOO defaults: 4 samples per prompt, KL (k1) in the reward with β = 0.05."""

    group_size: int = 4
    kl_coef: float = 0.05
    kl_estimator: str = "k1"
    kl_placement: str = "reward"
    loss_agg: str = "seq-mean-token-sum"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2:
            raise ValueError(f"RLOO needs group_size >= 2 (the leave-one-out baseline), got {self.group_size}")


class RLOO(Agent):
    """Leave-one-out baseline over each group of samples.

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.agents import RLOO
        >>> model, tok = load_model("tiny")
        >>> agent = RLOO(model, tok, tasks_per_step=2, group_size=2, max_new_tokens=4)
        >>> agent.learn(gymnasium.make("llmgym/Copy-v0", tokenizer=tok), steps=1)[0]["step"]
        1
    """

    config_class = RLOOConfig
    name = "rloo"

    def compute_advantages(self, batch: Batch) -> None:
        g = self.config.group_size
        # sequence score: verifier reward minus β·Σ_t KL_t (all folded into the per-token rewards)
        scores = F.masked_sum(self.kl_rewards(batch), batch.action_mask, dim=-1)
        advantages = F.rloo_advantages(scores.view(-1, g)).view(-1)
        batch.advantages = advantages[:, None] * batch.action_mask

    def loss(self, batch: Batch, out: ForwardOutput):
        c = self.config
        pg_loss = F.policy_gradient_loss(out.logprobs, batch.advantages)  # −A_i·log π(y_i | x)
        kl = self.reference_kl(batch, out)  # None without a reference model (β = 0)
        loss = F.policy_objective(pg_loss, batch.action_mask, c.loss_agg, kl=kl, kl_coef=self.kl_coef_in_loss,
                                  entropy=out.entropy, entropy_coef=c.entropy_coef)  # agg(ℓ + β·KL − c_H·H)
        return loss, self.policy_stats(batch, out, kl=kl)

