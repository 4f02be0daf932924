"""DPO: Direct Preference Optimization (Rafailov et al., 2023), offline and online.

The RLHF objective ``max E[r(x, y)] − β·KL(π‖π_ref)`` has the optimal policy
``π*(y|x) ∝ π_ref(y|x)·exp(r(x, y)/β)``, so ``r(x, y) = β·log π(y|x)/π_ref(y|x) + β·log Z(x)``: the
policy *is* a reward model. Putting that into the Bradley–Terry likelihood of a preference pair
``y⁺ ≻ y⁻`` (``Z(x)`` cancels) gives a classification loss on the policy itself:

    L = −log σ(β·[log π(y⁺|x)/π_ref(y⁺|x) − log π(y⁻|x)/π_ref(y⁻|x)])

with one-line variants (IPO's squared loss on per-token averaged log-ratios, conservative DPO's
label smoothing, SLiC's hinge) in :func:`llmgym.agents.functional.preference_loss`. Diagnostics are
the *implicit rewards* ``β·log π(y|x)/π_ref(y|x)``: their accuracy (share of pairs with
``r̂⁺ > r̂⁻``) and margin.

Pairs come from one of two places:

* **offline**: a preference file (``config.pairs``, JSONL of ``{"prompt", "chosen", "rejected"}``)
  or ``preferences=`` (a list, a ``datasets.Dataset``...) — ``tasks_per_step`` pairs per step; the
  env passed to ``learn`` is not sampled from;
* **online** (no pairs given): each step samples ``group_size`` completions for ``tasks_per_step``
  prompts of the env and pairs each group's best against its worst by the env's reward (groups
  with a reward gap ≤ ``min_reward_gap`` give no pair).

The reference policy is whatever :meth:`Agent.reference_logprobs` scores with (a frozen copy of
the starting model; the LoRA-disabled base where adapters are trained).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from llmgym.runtime import distributed
from llmgym.agents import functional as F
from llmgym.agents.base import Agent, AgentConfig, ForwardOutput
from llmgym.rollout.episodes import Batch, Episode
from llmgym.rlhf.preferences import PreferencePair, encode_pair, load_preferences
from llmgym.env.types import Task

__all__ = ["DPOConfig", "DPO", "pair_batch"]


@dataclasses.dataclass
class DPOConfig(AgentConfig):
    """DPO settings.

    Attributes:
        kl_coef: β, the strength of the implicit KL leash to the reference (must be > 0; IPO's τ).
        loss_type: ``"sigmoid"`` (DPO), ``"ipo"`` or ``"hinge"`` (see ``F.preference_loss``).
        loss_agg: the loss is the mean over pairs of a function of whole-sequence log-ratios; only
            ``"seq-mean-token-sum"`` describes it (a per-token aggregation does not apply).
        micro_batch_size: pairs per forward/backward (a pair's two rows are never split).
        label_smoothing: conservative DPO's ε (sigmoid loss only).
        pairs: a JSONL preference file for offline DPO; ``None`` = online DPO from the env.
        tasks_per_step: pairs per step (offline) or prompts per step (online).
        group_size: completions per prompt (online); the best and the worst form the pair.
        min_reward_gap: online: a group forms a pair only if best − worst reward exceeds this.
    """

    kl_coef: float = 0.1
    lr: float = 5e-4
    group_size: int = 4
    loss_agg: str = "seq-mean-token-sum"  # the loss is a mean over pairs: data parallel scales by rows
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0
    pairs: str | None = None
    min_reward_gap: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.kl_coef > 0:
            raise ValueError(f"DPO needs kl_coef (β) > 0: its implicit reward is β·log π/π_ref; got {self.kl_coef}")
        if self.loss_type not in F.PREFERENCE_LOSSES:
            raise ValueError(f"loss_type must be one of {F.PREFERENCE_LOSSES}, got {self.loss_type!r}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.label_smoothing and self.loss_type != "sigmoid":
            raise ValueError("label_smoothing (conservative DPO) applies to loss_type='sigmoid' only")
        if self.minibatch_size is not None:
            raise ValueError("DPO takes one optimiser step per batch of pairs (minibatches would split pairs): "
                             "leave minibatch_size=None and set tasks_per_step instead")
        if self.loss_agg != "seq-mean-token-sum":
            raise ValueError(f"DPO's loss is a mean over pairs of a function of each completion's summed "
                             f"log-ratio, not a per-token loss: loss_agg={self.loss_agg!r} does not apply; "
                             f"leave the default 'seq-mean-token-sum'")
        if self.tis is not None or self.correction is not None:
            raise ValueError("DPO does not weight sampled tokens by how likely the engine was to sample them "
                             "(its loss reads no π_old): a correction does not apply; leave correction (and tis) "
                             "None")
        if self.entropy_coef:
            raise ValueError(f"DPO's loss has no entropy term (it compares whole completions' log-ratios): "
                             f"entropy_coef={self.entropy_coef} would be ignored; leave it 0")
        if self.pairs is None and self.group_size < 2:
            raise ValueError(f"online DPO needs group_size >= 2 (best vs worst of a group), got {self.group_size}")


def _episode(task: Task, group: int, prompt_ids: list[int], completion_ids: list[int],
             logprobs: list[float] | None = None, reward: float = 0.0) -> Episode:
    n = len(completion_ids)
    rewards = [0.0] * (len(prompt_ids) + n)
    rewards[-1] = reward
    return Episode(task, group, prompt_ids + completion_ids, [0] * len(prompt_ids) + [1] * n,
                   [0.0] * len(prompt_ids) + (logprobs or [0.0] * n), rewards, len(prompt_ids),
                   finish_reasons=["stop"], turn_lengths=[n], terminated=True)


def pair_batch(pairs: list[PreferencePair], tokenizer: Any) -> Batch:
    """Rows ``2i`` (chosen) and ``2i+1`` (rejected) of pair ``i``, tokenised as an env would.

    Example:
        >>> from llmgym.runtime.models import build_tokenizer
        >>> from llmgym.rlhf.preferences import PreferencePair
        >>> from llmgym.agents.dpo import pair_batch
        >>> b = pair_batch([PreferencePair("2+2=", "4", "five")], build_tokenizer())
        >>> len(b), b.lengths.tolist()  # completion tokens + EOS
        (2, [2.0, 5.0])
    """
    episodes = []
    for i, pair in enumerate(pairs):
        task = Task(pair.prompt, id=f"pair-{i}")
        for completion in (pair.chosen, pair.rejected):
            prompt_ids, completion_ids = encode_pair(tokenizer, pair.prompt, completion)
            episodes.append(_episode(task, i, prompt_ids, completion_ids))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return Batch.from_episodes(episodes, pad)


def _sampled_entropy(batch: Batch) -> float:
    """``−mean log π`` of the sampled tokens: a Monte Carlo estimate of the policy's per-token entropy,
    reported on steps with nothing to learn (no forward pass was made)."""
    return float(-F.masked_mean(batch.old_logprobs, batch.action_mask))


class DPO(Agent):
    """Direct preference optimisation: offline from preference pairs, or online from env groups.

    Args:
        preferences: offline pairs in memory (a list of dicts/triples, a ``datasets.Dataset``, a
            path); overrides ``config.pairs``. Neither given: online DPO.

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.agents import DPO
        >>> model, tok = load_model("tiny")
        >>> pairs = [{"prompt": "copy:12=", "chosen": "12", "rejected": "ab"}] * 4
        >>> agent = DPO(model, tok, preferences=pairs, tasks_per_step=4, kl_coef=0.1)
        >>> row = agent.learn(gymnasium.make("llmgym/Copy-v0", tokenizer=tok), steps=1)[0]
        >>> round(row["loss"], 4), row["reward_accuracy"]  # π = π_ref at the first step: log 2, all ties
        (0.6931, 0.0)
        >>> online = DPO(model, tok, tasks_per_step=2, group_size=4, max_new_tokens=4)
        >>> online.mode
        'online'
    """

    config_class = DPOConfig
    name = "dpo"
    rows_per_example = 2  # (chosen, rejected): micro-batches hold whole pairs
    pipelined = False  # offline pairs follow step_count; online pairs have no π_old to correct

    def __init__(self, model, tokenizer, config: DPOConfig | None = None, *, engine=None,
                 preferences: Any = None, **overrides: Any):
        super().__init__(model, tokenizer, config, engine=engine, **overrides)
        source = preferences if preferences is not None else self.config.pairs
        self.preferences = load_preferences(source) if source is not None else None
        self.mode = "offline" if self.preferences is not None else "online"
        self.screens_batches = self.mode == "online"  # offline pairs are data, not an engine's samples

    # -- data ------------------------------------------------------------------------------------
    def next_pairs(self) -> list[PreferencePair]:
        """This step's ``tasks_per_step`` pairs: a seeded shuffle per epoch, a function of ``step_count``
        (so a resumed run continues exactly); under data parallel, this rank's share."""
        pairs, per_step = self.preferences, self.config.tasks_per_step
        chosen, orders = [], {}
        for i in range(self.step_count * per_step, (self.step_count + 1) * per_step):
            epoch, position = divmod(i, len(pairs))
            if epoch not in orders:
                orders[epoch] = np.random.default_rng([self.config.seed, epoch]).permutation(len(pairs))
            chosen.append(pairs[int(orders[epoch][position])])
        return distributed.shard(chosen) if distributed.is_distributed() else chosen

    def collect(self, env, num_tasks: int | None = None, draw: int = 0, **rollout) -> Batch:
        """Offline: the next pairs. Online: sample groups from ``env``; pair each group's best with its worst."""
        if self.mode == "offline":
            batch = pair_batch(self.next_pairs(), self.tokenizer).to(self.device)
            batch.stats = {"reward_mean": math.nan, "reward_std": math.nan, "pairs": float(len(batch) // 2)}
            return batch
        sampled = super().collect(env, num_tasks, draw, **rollout)
        rewards = sampled.rewards.view(-1, self.config.group_size)
        best, worst = rewards.argmax(dim=1), rewards.argmin(dim=1)
        gap = rewards.max(dim=1).values - rewards.min(dim=1).values
        rows = []
        for g in torch.nonzero(gap > self.config.min_reward_gap).flatten().tolist():
            rows += [g * self.config.group_size + int(best[g]), g * self.config.group_size + int(worst[g])]
        batch = sampled.select(rows)
        batch.sampled_from = sampled  # an untrusted engine's samples are tested before the choice (agents/screening.py)
        batch.stats = {**sampled.stats, "reward_mean": float(sampled.rewards.mean()),
                       "reward_std": float(sampled.rewards.std()) if len(sampled) > 1 else 0.0,
                       "pairs": float(len(rows) // 2), "pair_reward_gap": float(gap.mean()),
                       "sampled_entropy": _sampled_entropy(sampled)}
        return batch

    # -- the algorithm ---------------------------------------------------------------------------
    def prepare(self, batch: Batch) -> Batch:
        # DPO always needs π_ref, and takes it only from reference_logprobs (the one place a LoRA
        # learner switches to the adapter-disabled base), whatever holds the reference
        batch.ref_logprobs = self.reference_logprobs(batch)
        self.compute_advantages(batch)
        return batch

    def compute_advantages(self, batch: Batch) -> None:
        # the preference label is DPO's only "advantage": +1 on the chosen row, −1 on the rejected one
        if len(batch) % 2:
            raise ValueError(f"a DPO batch holds (chosen, rejected) row pairs; got {len(batch)} rows")
        batch.advantages = torch.tensor([1.0, -1.0], device=batch.input_ids.device).repeat(len(batch) // 2)

    def pair_losses(self, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor):
        """``[P]`` losses and ``([P], [P])`` chosen/rejected log-ratios of rows laid out as pairs ``(2i, 2i+1)``."""
        c = self.config
        # log π(y|x) − log π_ref(y|x) of every completion, summed over its tokens
        logratios = F.masked_sum(logprobs - ref_logprobs, mask, dim=-1).view(-1, 2)
        lengths = mask.sum(dim=-1).to(logratios.dtype).view(-1, 2)
        losses = F.preference_loss(logratios[:, 0], logratios[:, 1], c.kl_coef, c.loss_type, c.label_smoothing,
                                   chosen_lengths=lengths[:, 0], rejected_lengths=lengths[:, 1])
        return losses, (logratios[:, 0], logratios[:, 1])

    def loss(self, batch: Batch, out: ForwardOutput):
        losses, (chosen, rejected) = self.pair_losses(out.logprobs, batch.ref_logprobs, batch.action_mask)
        stats = self.policy_stats(batch, out)
        stats["kl"] = float(F.masked_mean(F.kl_k1(out.logprobs.detach(), batch.ref_logprobs), batch.action_mask))
        stats.update(self._implicit_reward_stats(chosen.detach(), rejected.detach()))
        return losses.mean(), stats

    def _implicit_reward_stats(self, chosen_logratios, rejected_logratios) -> dict[str, float]:
        reward_chosen, reward_rejected = self.config.kl_coef * chosen_logratios, self.config.kl_coef * rejected_logratios
        return {"reward_accuracy": float((reward_chosen > reward_rejected).float().mean()),
                "reward_margin": float((reward_chosen - reward_rejected).mean()),
                "reward_chosen": float(reward_chosen.mean()),
                "reward_rejected": float(reward_rejected.mean())}

    @torch.no_grad()
    def preference_metrics(self, pairs: Any) -> dict[str, float]:
        """Implicit-reward accuracy and margin of the current policy on ``pairs`` (e.g. held out); no update.

        ``reward_accuracy`` is the share of pairs with ``β·log π/π_ref`` higher on the chosen completion;
        ``loss`` is the configured preference loss on them.
        """
        batch = pair_batch(load_preferences(pairs), self.tokenizer).to(self.device)
        was_training = self.model.training
        self.model.eval()
        try:
            losses, (chosen, rejected) = self.pair_losses(self.forward(batch).logprobs, self.reference_logprobs(batch),
                                                          batch.action_mask)
        finally:
            self.model.train(was_training)
        return {**self._implicit_reward_stats(chosen, rejected), "loss": float(losses.mean()),
                "pairs": float(len(batch) // 2)}

    def update(self, batch: Batch) -> dict[str, float]:
        extra = {k: batch.stats[k] for k in ("pairs", "pair_reward_gap") if k in batch.stats}
        if len(batch) == 0:  # online: every group tied, no pair to learn from this step: no update
            self.step_count += 1
            return {**extra, "loss": 0.0, "entropy": batch.stats.get("sampled_entropy", math.nan)}
        return {**super().update(batch), **extra}
