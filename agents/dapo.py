"""DAPO (Yu et al., 2025): GRPO with clip-higher, dynamic sampling, token-level loss, overlong shaping.

1. Clip-higher: ε_low = 0.2, ε_high = 0.28, so low-probability tokens can still rise.
2. Dynamic sampling: groups whose rewards are all equal carry no signal; drop them and draw more
   tasks until the batch holds ``tasks_per_step`` informative groups (at most ``max_extra_draws``
   extra draws).
3. Token-level policy-gradient loss: every token of the batch weighs the same ("token-mean").
4. Overlong reward shaping: a soft penalty as completions approach the budget; truncated completions
   can also be masked out of the loss.
5. No KL term.
"""

from __future__ import annotations

import dataclasses

import torch

from llmgym.agents import functional as F
from llmgym.agents.grpo import GRPO, GRPOConfig
from llmgym.runtime import distributed
from llmgym.rollout.episodes import Batch

__all__ = ["DAPOConfig", "DAPO"]


@dataclasses.dataclass
class DAPOConfig(GRPOConfig):
    """DAPO settings.

    Attributes:
        dynamic_sampling: drop all-equal groups and draw more.
        max_extra_draws: cap on extra draws per step (each draws ``tasks_per_step`` more tasks).
        overlong_shaping: add DAPO's soft overlong penalty to the reward.
        overlong_cache: the penalty band ``L_cache`` in tokens (default: a quarter of max_new_tokens).
        mask_truncated: exclude completions cut at the token budget from the loss (overlong filtering).
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    loss_agg: str = "token-mean"
    dynamic_sampling: bool = True
    max_extra_draws: int = 3
    overlong_shaping: bool = True
    overlong_cache: int | None = None
    mask_truncated: bool = True


class DAPO(GRPO):
    """Decoupled clip and dynamic sampling policy optimisation.

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.agents import DAPO
        >>> model, tok = load_model("tiny")
        >>> agent = DAPO(model, tok, tasks_per_step=2, group_size=4, max_new_tokens=4)
        >>> (agent.config.clip_low, agent.config.clip_high, agent.ref_model)
        (0.2, 0.28, None)
    """

    config_class = DAPOConfig
    name = "dapo"

    @property
    def collects_once(self) -> bool:
        return not self.config.dynamic_sampling  # extra draws sample again after the first batch is scored

    def collect(self, env, num_tasks=None, draw=0, **rollout) -> Batch:
        c = self.config
        want = num_tasks or c.tasks_per_step
        # under data parallel each draw hands this rank its share of `want` tasks; it keeps that many
        target = len(distributed.shard_range(want)) if distributed.is_distributed() else want
        kept, draws, all_rewards, drawn_episodes = [], 0, [], []
        last = None
        while True:
            batch = super().collect(env, want, draw=draws, **rollout)  # each extra draw gets a fresh seed
            last = batch
            all_rewards.append(batch.rewards)
            drawn_episodes += batch.episodes
            groups = [batch.episodes[i:i + c.group_size] for i in range(0, len(batch.episodes), c.group_size)]
            informative = [g for g in groups if len({e.total_reward for e in g}) > 1] if c.dynamic_sampling else groups
            kept += informative
            if len(kept) >= target or not c.dynamic_sampling or draws >= c.max_extra_draws:
                break
            draws += 1
        if not kept:  # nothing informative within the cap: learn nothing from this step, honestly
            kept = [last.episodes[i:i + c.group_size] for i in range(0, len(last.episodes), c.group_size)]
        kept = kept[:target]
        episodes = []
        for g, group in enumerate(kept):
            for e in group:
                e.group = g
                episodes.append(e)
        pad = (rollout.get("engine") or self.engine).pad_id
        out = Batch.from_episodes(episodes, pad).to(self.device)
        if c.dynamic_sampling:  # an untrusted engine's samples are tested before the choice (agents/screening.py)
            out.sampled_from = Batch.from_episodes(drawn_episodes, pad).to(self.device)
        drawn = torch.cat(all_rewards)
        out.stats = {**last.stats, "extra_draws": float(draws), "kept_groups": float(len(kept)),
                     "reward_mean": float(drawn.mean()), "reward_std": float(drawn.std()) if len(drawn) > 1 else 0.0}
        return out

    def compute_advantages(self, batch: Batch) -> None:
        c = self.config
        rewards = self.sequence_scores(batch)
        if c.overlong_shaping:  # the budget is per completion: judge each episode by its longest turn
            cache = c.overlong_cache or max(1, c.max_new_tokens // 4)
            rewards = rewards + F.overlong_penalty(batch.longest_turn, c.max_new_tokens, cache)
        advantages = F.group_advantages(rewards.view(-1, c.group_size), normalize_std=c.normalize_std).view(-1)
        batch.advantages = advantages[:, None] * batch.action_mask

    def loss_mask(self, batch: Batch):
        if self.config.mask_truncated:
            return batch.action_mask * (~batch.truncated).float()[:, None]
        return batch.action_mask
