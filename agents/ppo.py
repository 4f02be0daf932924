"""PPO for language models (Schulman et al., 2017; Ouyang et al., 2022): GAE + a value head.

Per token: the reward is the verifier's score on the last token minus β·KL(π‖π_ref) on every
token (KL folded into the reward); GAE(γ, λ) over policy tokens gives advantages and returns; the
loss is the clipped surrogate + ``vf_coef`` × the clipped value loss − ``entropy_coef`` × entropy,
optimised for several epochs over minibatches.
"""

from __future__ import annotations

import dataclasses

import torch

from llmgym.agents import functional as F
from llmgym.agents.base import Agent, AgentConfig, ForwardOutput
from llmgym.rollout.episodes import Batch

__all__ = ["PPOConfig", "PPO"]


@dataclasses.dataclass
class PPOConfig(AgentConfig):
    """PPO settings.

    Attributes:
        gamma, lam: GAE discount and λ.
        vf_coef: value-loss weight; value_clip: ε of the clipped value loss.
        whiten_advantages: normalise advantages over the batch's policy tokens.
    """

    group_size: int = 1
    tasks_per_step: int = 16
    lr: float = 5e-4  # several optimiser steps per batch: a smaller step than the on-policy agents
    update_epochs: int = 2
    minibatch_size: int | None = 8
    kl_coef: float = 0.05
    kl_estimator: str = "k1"
    kl_placement: str = "reward"
    entropy_coef: float = 0.0
    gamma: float = 1.0
    lam: float = 0.95
    vf_coef: float = 0.5
    value_clip: float = 0.2
    whiten_advantages: bool = True
    loss_agg: str = "token-mean"


class PPO(Agent):
    """Clipped-surrogate PPO with a value head on the policy's last hidden state.

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.agents import PPO
        >>> model, tok = load_model("tiny")
        >>> agent = PPO(model, tok, tasks_per_step=4, minibatch_size=2, max_new_tokens=4)
        >>> row = agent.learn(gymnasium.make("llmgym/Copy-v0", tokenizer=tok), steps=1)[0]
        >>> "value_loss" in row and "explained_variance" in row and 0.0 <= row["clip_frac"] <= 1.0
        True
    """

    config_class = PPOConfig
    name = "ppo"
    uses_values = True

    def __init__(self, model, tokenizer, config=None, **kw):
        hidden = model.config.hidden_size
        self.value_head = torch.nn.Linear(hidden, 1).to(next(model.parameters()).device)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)
        super().__init__(model, tokenizer, config, **kw)

    def parameters(self):
        return list(self.model.parameters()) + list(self.value_head.parameters())

    def forward(self, batch: Batch, model=None, with_values: bool = False):
        out = super().forward(batch, model, with_values)
        if with_values:  # V(s_t) from the policy's last hidden state at each position
            out.values = self.value_head(out.hidden.float()).squeeze(-1)
        return out

    def compute_advantages(self, batch: Batch) -> None:
        c = self.config
        with torch.no_grad():
            batch.values = self.forward(batch, with_values=True).values * batch.action_mask
        rewards = self.kl_rewards(batch)
        advantages, returns = F.gae_advantages(rewards, batch.values, batch.action_mask, c.gamma, c.lam)
        if c.whiten_advantages:
            advantages = self.batch_whiten(advantages, batch.action_mask)
        batch.advantages, batch.returns = advantages, returns

    def loss(self, batch: Batch, out: ForwardOutput):
        c = self.config
        mask = batch.action_mask
        pg_loss, is_clipped = F.clipped_surrogate_loss(
            out.logprobs, batch.old_logprobs, batch.advantages, c.clip_low, c.clip_high, c.dual_clip, mask=mask
        )
        kl = self.reference_kl(batch, out)  # None without a reference model (β = 0)
        pg = F.policy_objective(pg_loss, mask, c.loss_agg, kl=kl, kl_coef=self.kl_coef_in_loss,
                                entropy=out.entropy, entropy_coef=c.entropy_coef)  # agg(ℓ + β·KL − c_H·H)
        v_loss = F.clipped_value_loss(out.values, batch.values, batch.returns, c.value_clip)
        vf = F.aggregate_loss(v_loss, mask, "token-mean")
        stats = self.policy_stats(batch, out, is_clipped, kl)
        stats.update(
            pg_loss=float(pg.detach()),
            value_loss=float(vf.detach()),
            explained_variance=float(F.explained_variance(out.values.detach(), batch.returns, mask)),
        )
        return pg + c.vf_coef * vf, stats

    def extra_state(self):
        return {"value_head": self.value_head.state_dict()}

    def load_extra_state(self, extra):
        if "value_head" in extra:
            self.value_head.load_state_dict(extra["value_head"])
