"""REINFORCE (Williams, 1992) with an optional baseline, and ReMax (Li et al., 2023).

Loss: ``−(G_t − b) · log π(a_t | s_t)`` with ``G_t`` the reward-to-go of token ``t`` (policy tokens
only; in a single-turn episode it is the episode's reward at every token).
"""

from __future__ import annotations

import dataclasses

import torch

from llmgym.agents import functional as F
from llmgym.agents.base import Agent, AgentConfig, ForwardOutput
from llmgym.rollout.episodes import Batch, collect_episodes

__all__ = ["REINFORCEConfig", "REINFORCE", "ReMaxConfig", "ReMax"]


@dataclasses.dataclass
class REINFORCEConfig(AgentConfig):
    """REINFORCE settings.

    Attributes:
        baseline: ``"batch-mean"`` (mean return of the batch), ``"ema"`` (a running mean across
            steps, with ``baseline_decay``) or ``"none"``.
        gamma: discount of the reward-to-go.
    """

    group_size: int = 1
    tasks_per_step: int = 16
    baseline: str = "batch-mean"
    baseline_decay: float = 0.9
    gamma: float = 1.0
    loss_agg: str = "seq-mean-token-sum"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.baseline not in ("batch-mean", "ema", "none"):
            raise ValueError(f"baseline must be 'batch-mean', 'ema' or 'none', got {self.baseline!r}")


class REINFORCE(Agent):
    """Vanilla policy gradient on reward-to-go with a baseline.

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.agents import REINFORCE
        >>> model, tok = load_model("tiny")
        >>> agent = REINFORCE(model, tok, tasks_per_step=2, max_new_tokens=4)
        >>> history = agent.learn(gymnasium.make("llmgym/Copy-v0", tokenizer=tok), steps=1)
        >>> sorted(k for k in ("step", "reward_mean", "loss", "entropy") if k in history[0])
        ['entropy', 'loss', 'reward_mean', 'step']
    """

    config_class = REINFORCEConfig
    name = "reinforce"

    def __init__(self, model, tokenizer, config=None, **kw):
        super().__init__(model, tokenizer, config, **kw)
        self.running_baseline: float | None = None

    def compute_advantages(self, batch: Batch) -> None:
        c = self.config
        returns = F.discounted_returns(self.kl_rewards(batch), batch.action_mask, c.gamma)
        if c.baseline == "batch-mean":
            b = self.batch_mean(returns, batch.action_mask)
        elif c.baseline == "ema":
            mean = float(self.batch_mean(batch.rewards, torch.ones_like(batch.rewards)))
            prev = self.running_baseline
            b = torch.tensor(0.0 if prev is None else prev)  # the baseline must not see this batch
            self.running_baseline = mean if prev is None else c.baseline_decay * prev + (1 - c.baseline_decay) * mean
        else:
            b = torch.tensor(0.0)
        batch.advantages = (returns - b) * batch.action_mask
        batch.returns = returns

    def loss(self, batch: Batch, out: ForwardOutput):
        c = self.config
        pg_loss = F.policy_gradient_loss(out.logprobs, batch.advantages)  # −(G_t − b)·log π
        kl = self.reference_kl(batch, out)  # None without a reference model (β = 0)
        loss = F.policy_objective(pg_loss, batch.action_mask, c.loss_agg, kl=kl, kl_coef=self.kl_coef_in_loss,
                                  entropy=out.entropy, entropy_coef=c.entropy_coef)  # agg(ℓ + β·KL − c_H·H)
        return loss, self.policy_stats(batch, out, kl=kl)

    def extra_state(self):
        return {"running_baseline": self.running_baseline}

    def load_extra_state(self, extra):
        self.running_baseline = extra.get("running_baseline")


@dataclasses.dataclass
class ReMaxConfig(REINFORCEConfig):
    """ReMax: the baseline is the reward of the greedy completion of the same prompt."""

    baseline: str = "none"


class ReMax(REINFORCE):
    """ReMax (Li et al., 2023): ``A = r(x, y) − r(x, ŷ_greedy)`` — one extra greedy rollout per task.

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.agents import ReMax
        >>> model, tok = load_model("tiny")
        >>> agent = ReMax(model, tok, tasks_per_step=2, max_new_tokens=4)
        >>> batch = agent.collect(gymnasium.make("llmgym/Copy-v0", tokenizer=tok))
        >>> batch.baseline_rewards.shape  # the greedy reward of each sample's prompt
        torch.Size([2])
    """

    config_class = ReMaxConfig
    name = "remax"

    collects_once = False  # the greedy baseline is a second rollout

    def collect(self, env, num_tasks=None, draw=0, *, engine=None, step=None, **rollout) -> Batch:
        batch = super().collect(env, num_tasks, draw, engine=engine, step=step, **rollout)
        tasks = [e.task for e in batch.episodes[:: self.config.group_size]]
        greedy, _ = collect_episodes(env, engine or self.engine, num_tasks=len(tasks), group_size=1,
                                     sampling=self.sampling(temperature=0.0), seed=0, tasks=tasks, **rollout)
        greedy_rewards = torch.tensor([e.total_reward for e in greedy], device=batch.groups.device)
        batch.baseline_rewards = greedy_rewards[batch.groups]
        return batch

    def compute_advantages(self, batch: Batch) -> None:
        advantages = F.remax_advantages(self.sequence_scores(batch), batch.baseline_rewards)
        batch.advantages = advantages[:, None] * batch.action_mask


@dataclasses.dataclass
class REINFORCEPlusPlusConfig(REINFORCEConfig):
    """REINFORCE++: KL in the per-token reward, γ = 1 returns, whitened over the whole batch,
    PPO's clipped surrogate; no critic and no per-prompt baseline.

    The reward's KL is the k1 estimate ``log π_old − log π_ref`` (Hu, 2025, eq. for r(s_t, a_t);
    OpenRLHF's and verl's defaults): ``r_t = −β (log π_old(a_t) − log π_ref(a_t)) + R·[t = last]``.
    """

    baseline: str = "none"
    kl_coef: float = 0.01
    kl_estimator: str = "k1"
    kl_placement: str = "reward"
    loss_agg: str = "token-mean"


class REINFORCEPlusPlus(REINFORCE):
    """REINFORCE++ (Hu, 2025): global batch normalisation of token-level returns."""

    config_class = REINFORCEPlusPlusConfig
    name = "reinforce++"

    def compute_advantages(self, batch: Batch) -> None:
        returns = F.discounted_returns(self.kl_rewards(batch), batch.action_mask, self.config.gamma)
        batch.returns = returns
        batch.advantages = self.batch_whiten(returns, batch.action_mask)  # over the global batch

    def loss(self, batch: Batch, out: ForwardOutput):
        c = self.config
        pg_loss, is_clipped = F.clipped_surrogate_loss(out.logprobs, batch.old_logprobs, batch.advantages,
                                                       c.clip_low, c.clip_high, c.dual_clip, mask=batch.action_mask)
        kl = self.reference_kl(batch, out)  # None without a reference model (β = 0)
        loss = F.policy_objective(pg_loss, batch.action_mask, c.loss_agg, kl=kl, kl_coef=self.kl_coef_in_loss,
                                  entropy=out.entropy, entropy_coef=c.entropy_coef)  # agg(ℓ + β·KL − c_H·H)
        return loss, self.policy_stats(batch, out, is_clipped, kl)


__all__ += ["REINFORCEPlusPlusConfig", "REINFORCEPlusPlus"]
