"""Padded tensors of a batch of episodes, with explicit masks no algorithm needs to re-derive."""

from __future__ import annotations

import dataclasses
from typing import Iterator, Sequence

import torch

from llmgym.rollout.episodes import Episode

__all__ = ["Batch"]


@dataclasses.dataclass
class Batch:
    """``N`` episodes, right-padded to length ``L``; per-token tensors are ``[N, L-1]``.

    Per-token tensors are aligned with the *predicted* tokens ``input_ids[:, 1:]``: column ``j`` is
    about token ``j + 1`` (whose log-prob comes from the logits at position ``j``).

    Attributes:
        input_ids, attention_mask: ``[N, L]``.
        action_mask: ``[N, L-1]`` float, 1 on tokens the policy sampled (not prompt, env replies or padding).
        old_logprobs: ``[N, L-1]`` generation-time log-probs (π_old when there is one update per batch).
        token_rewards: ``[N, L-1]`` each turn's reward on its last sampled token.
        rewards: ``[N]`` episode returns (sum of turn rewards).
        groups: ``[N]`` long, which task (group) each episode belongs to.
        truncated: ``[N]`` bool, a completion hit the token budget.
        longest_turn: ``[N]`` sampled tokens of each episode's longest turn (the per-turn budget's unit).
        ref_logprobs, teacher_logprobs, values, advantages, returns: filled by agents where they need them
            (``teacher_logprobs``: a distillation teacher's log-probs of the same tokens).
        baseline_rewards: ``[N]`` an external per-episode baseline (ReMax's greedy rewards).
        policy_versions: ``[N, L-1]`` long, the policy version that sampled each token (``-1`` off the
            action mask); ``None`` when the engine reported no versions (the synchronous loop).
        stats: rollout statistics (``tokens_per_s``, ...); episodes: the source episodes.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    old_logprobs: torch.Tensor
    token_rewards: torch.Tensor
    rewards: torch.Tensor
    groups: torch.Tensor
    truncated: torch.Tensor
    longest_turn: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    baseline_rewards: torch.Tensor | None = None
    policy_versions: torch.Tensor | None = None
    stats: dict[str, float] = dataclasses.field(default_factory=dict)
    episodes: list[Episode] = dataclasses.field(default_factory=list, repr=False)

    @classmethod
    def from_episodes(cls, episodes: Sequence[Episode], pad_id: int = 0) -> "Batch":
        """Pad a list of :class:`~llmgym.rollout.episodes.Episode` into a batch.

        Example:
            >>> from llmgym.rollout.batch import Batch
            >>> from llmgym.rollout.episodes import Episode
            >>> from llmgym import Task
            >>> ep = Episode(Task("p"), 0, [1, 5, 6, 2], [0, 0, 1, 1], [0, 0, -0.5, -0.1], [0, 0, 0, 1.0], 2)
            >>> b = Batch.from_episodes([ep, ep])
            >>> b.input_ids.shape, b.action_mask[0].tolist(), b.rewards.tolist()
            (torch.Size([2, 4]), [0.0, 1.0, 1.0], [1.0, 1.0])
        """
        if not episodes:
            raise ValueError("cannot build a Batch from no episodes")
        n, width = len(episodes), max(len(e.token_ids) for e in episodes)
        ids = torch.full((n, width), pad_id, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        act = torch.zeros((n, width), dtype=torch.float32)
        lps = torch.zeros((n, width), dtype=torch.float32)
        rew = torch.zeros((n, width), dtype=torch.float32)
        tagged = all(len(e.policy_versions) == len(e.token_ids) for e in episodes)
        versions = torch.full((n, width), -1, dtype=torch.long) if tagged else None
        for i, e in enumerate(episodes):
            k = len(e.token_ids)
            ids[i, :k] = torch.tensor(e.token_ids)
            attn[i, :k] = 1
            act[i, :k] = torch.tensor(e.action_mask, dtype=torch.float32)
            lps[i, :k] = torch.tensor(e.logprobs, dtype=torch.float32)
            rew[i, :k] = torch.tensor(e.rewards, dtype=torch.float32)
            if versions is not None:
                versions[i, :k] = torch.tensor(e.policy_versions, dtype=torch.long)
        return cls(
            input_ids=ids,
            attention_mask=attn,
            action_mask=act[:, 1:],
            old_logprobs=lps[:, 1:],
            token_rewards=rew[:, 1:],
            rewards=torch.tensor([e.total_reward for e in episodes], dtype=torch.float32),
            groups=torch.tensor([e.group for e in episodes], dtype=torch.long),
            truncated=torch.tensor(["length" in e.finish_reasons for e in episodes], dtype=torch.bool),
            longest_turn=torch.tensor([max(e.turn_lengths, default=0) for e in episodes], dtype=torch.float32),
            policy_versions=versions[:, 1:] if versions is not None else None,
            episodes=list(episodes),
        )

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_tokens(self) -> int:
        """Policy tokens in the batch (the token-mean denominator)."""
        return int(self.action_mask.sum())

    @property
    def lengths(self) -> torch.Tensor:
        """Sampled tokens per episode ``[N]``."""
        return self.action_mask.sum(-1)

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: v for f in dataclasses.fields(self) if isinstance(v := getattr(self, f.name), torch.Tensor)}

    def to(self, device) -> "Batch":
        return dataclasses.replace(self, **{k: v.to(device) for k, v in self._tensors().items()})

    def select(self, index: torch.Tensor | Sequence[int]) -> "Batch":
        """The episodes at ``index`` (trailing all-padding columns are kept; they are masked)."""
        index = torch.as_tensor(index, dtype=torch.long)
        episodes = [self.episodes[i] for i in index.tolist()] if self.episodes else []
        return dataclasses.replace(self, episodes=episodes,
                                   **{k: v[index.to(v.device)] for k, v in self._tensors().items()})

    def minibatches(self, size: int, generator: torch.Generator | None = None) -> Iterator["Batch"]:
        """Shuffled minibatches of ``size`` episodes (the last may be smaller)."""
        order = torch.randperm(len(self), generator=generator)
        for start in range(0, len(self), size):
            yield self.select(order[start:start + size])
