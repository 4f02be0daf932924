"""Rejection sampling fine-tuning: best-of-n, then supervised learning on the winners (RAFT).

"RL for the poor" (RAFT, Dong et al., 2023; the rejection-sampling stage of Llama 2): each step
samples ``n = group_size`` completions for each of ``tasks_per_step`` prompts, keeps the best one
of each group that has a winner — its reward reaches ``threshold``, or, without a threshold, it beats
the group's worst (a group whose completions all score the same has no best one: all failures, or
all equal) — and fine-tunes on the kept completions with the plain negative log-likelihood

    L = −(1/|kept tokens|) Σ_{kept y} Σ_t log π(y_t | x, y_<t)

for ``update_epochs`` passes; then it samples again from the improved policy (iterate). It is
REINFORCE with a 0/1 advantage that is 1 only on each group's winner, and no baseline.
"""

from __future__ import annotations

import dataclasses

import torch

from llmgym.agents import functional as F
from llmgym.agents.base import Agent, AgentConfig, ForwardOutput
from llmgym.rollout.episodes import Batch

__all__ = ["RejectionSamplingConfig", "RejectionSampling"]


@dataclasses.dataclass
class RejectionSamplingConfig(AgentConfig):
    """Rejection sampling settings.

    Attributes:
        group_size: n, completions sampled per prompt (best-of-n).
        threshold: keep a group's best only if its reward is ≥ this (``None``: only if it is > the
            group's worst reward; a group of equal rewards is skipped).
        update_epochs: supervised passes over each step's kept completions.
        minibatch_size: kept completions per optimiser step (``None``: all of them).
    """

    group_size: int = 8
    threshold: float | None = None
    update_epochs: int = 1
    loss_agg: str = "token-mean"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2:
            raise ValueError(f"rejection sampling needs group_size >= 2 (best of n), got {self.group_size}")


class RejectionSampling(Agent):
    """Best-of-n sampling, then supervised fine-tuning on the winners (RAFT).

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.agents import RejectionSampling
        >>> model, tok = load_model("tiny")
        >>> agent = RejectionSampling(model, tok, tasks_per_step=2, group_size=4, max_new_tokens=4, threshold=2.0)
        >>> row = agent.learn(gymnasium.make("llmgym/Copy-v0", tokenizer=tok), steps=1)[0]
        >>> row["kept"], row["skipped_groups"]  # no copy reward reaches 2.0: nothing is kept, nothing is learned
        (0.0, 2.0)
    """

    config_class = RejectionSamplingConfig
    name = "rejection-sampling"

    def collect(self, env, num_tasks: int | None = None, draw: int = 0, **rollout) -> Batch:
        """Sample groups from ``env``; return each group's winner (best ≥ threshold, or best > worst)."""
        sampled = super().collect(env, num_tasks, draw, **rollout)
        g = self.config.group_size
        rewards = sampled.rewards.view(-1, g)
        best_reward, best = rewards.max(dim=1)
        if self.config.threshold is not None:
            keep = best_reward >= self.config.threshold
        else:  # no threshold: a winner must beat someone (torch.max would pick index 0 of a tie)
            keep = best_reward > rewards.min(dim=1).values
        rows = [i * g + int(best[i]) for i in torch.nonzero(keep).flatten().tolist()]
        batch = sampled.select(rows)
        batch.sampled_from = sampled  # an untrusted engine's samples are tested before the choice (agents/screening.py)
        batch.stats = {**sampled.stats, "reward_mean": float(sampled.rewards.mean()),
                       "reward_std": float(sampled.rewards.std()) if len(sampled) > 1 else 0.0,
                       "kept": float(len(rows)), "kept_frac": len(rows) / rewards.shape[0],
                       "skipped_groups": float(rewards.shape[0] - len(rows)),
                       "kept_reward_mean": float(best_reward[keep].mean()) if rows else float("nan"),
                       # −mean log π of the sampled tokens (a Monte Carlo entropy estimate), for steps with no update
                       "sampled_entropy": float(-F.masked_mean(sampled.old_logprobs, sampled.action_mask))}
        return batch

    def compute_advantages(self, batch: Batch) -> None:
        batch.advantages = batch.action_mask.clone()  # weight 1 on every token of a winner: plain SFT

    def loss(self, batch: Batch, out: ForwardOutput):
        c = self.config
        nll = F.policy_gradient_loss(out.logprobs, batch.advantages)  # −1·log π(y_t | x, y_<t)
        kl = self.reference_kl(batch, out)  # None without a reference model (β = 0)
        loss = F.policy_objective(nll, batch.action_mask, c.loss_agg, kl=kl, kl_coef=self.kl_coef_in_loss,
                                  entropy=out.entropy, entropy_coef=c.entropy_coef)  # agg(NLL + β·KL − c_H·H)
        return loss, self.policy_stats(batch, out, kl=kl)

    def update(self, batch: Batch) -> dict[str, float]:
        kept = {"kept": float(len(batch)),
                **{k: batch.stats[k] for k in ("kept_frac", "kept_reward_mean", "skipped_groups") if k in batch.stats}}
        if len(batch) == 0:  # no group had a winner: no step (the policy and optimiser stay)
            self.step_count += 1
            return {**kept, "loss": 0.0, "entropy": batch.stats["sampled_entropy"]}
        return {**super().update(batch), **kept}
