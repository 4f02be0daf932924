"""GDPO (Liu et al., 2026): group reward-decoupled normalisation for multi-reward RL.

With several reward components per completion (format, correctness, length, ...), GRPO sums them
and normalises the sum within each group, which maps different combinations to the same advantage.
GDPO normalises each component within its group separately, sums them with their weights, then
normalises the sum over the whole batch (:func:`llmgym.agents.functional.gdpo_advantages`); the
loss is GRPO's.

Where the components come from: a multi-part verifier such as :class:`llmgym.env.verifiers.WeightedSum`
puts each part's score in ``Score.info[name] = {"reward": r_k, "weight": w_k, ...}``, which the env
returns as ``info["score"]`` of the final step and each episode keeps in ``Episode.info``. GDPO
reads every entry with a numeric ``"reward"`` (or the names in ``reward_components``), weighting
each by its ``"weight"`` (default 1; ``component_weights`` overrides). A component missing from an
episode's info (e.g. the verifier failed) counts as 0. With no components at all (a single-reward
verifier) the env's reward is the one component (logged as ``reward_env``): GRPO's advantage,
then batch-normalised.
Multi-turn envs: the components of the final turn's score are used. Each step logs
``reward_components`` (K) and ``reward_<name>``, the batch mean of every component.

Every component's group advantages sum to 0 within the group, so the batch mean of the summed
advantage is 0 and the batch normalisation only rescales: under Adam it changes little (Adam is
nearly scale-invariant; the gradient-norm clip still sees the scale), under SGD it sets the step.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Mapping

import torch

from llmgym.agents import functional as F
from llmgym.agents.base import ForwardOutput
from llmgym.agents.grpo import GRPO, GRPOConfig
from llmgym.rollout.episodes import Batch

__all__ = ["GDPOConfig", "GDPO", "reward_components"]


@dataclasses.dataclass
class GDPOConfig(GRPOConfig):
    """GDPO settings.

    Attributes:
        reward_components: component names to read from each episode's score info; ``None`` = all.
        component_weights: weight per component name, overriding the verifier's ``"weight"``.
        batch_normalize: normalise the summed advantage over the batch (GDPO's second stage).
    """

    kl_coef: float = 0.0
    # plain `tuple` / `dict` annotations: the command line's --set passes JSON lists/objects through
    reward_components: tuple | None = None  # of str
    component_weights: dict | None = None  # str -> float
    batch_normalize: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kl_coef > 0 and self.kl_placement == "reward":
            raise ValueError("GDPO normalises the verifier's reward components: put the KL in the loss "
                             "(kl_placement='loss'), not in the reward")
        if self.reward_components is not None:
            if isinstance(self.reward_components, str):
                self.reward_components = (self.reward_components,)
            self.reward_components = tuple(self.reward_components)
            if not self.reward_components or not all(isinstance(n, str) for n in self.reward_components):
                raise ValueError(f"reward_components must be a non-empty list of component names (or None for "
                                 f"all), got {self.reward_components!r}")
        if self.component_weights is not None:
            ok = isinstance(self.component_weights, dict) and all(
                isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                for k, v in self.component_weights.items())
            if not ok:
                raise ValueError(f"component_weights must map component names to numbers, e.g. "
                                 f'{{"format": 0.2, "correct": 1.0}}, got {self.component_weights!r}')


def _score_info(info: Mapping[str, Any]) -> Mapping[str, Any]:
    score = info.get("score")
    return score if isinstance(score, Mapping) else info  # multi-turn envs merge the score info in


def _is_component(value: Any) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get("reward"), numbers.Real) and not isinstance(
        value.get("reward"), bool)


def reward_components(infos: list[Mapping[str, Any]], names: tuple[str, ...] | None = None):
    """``(names, rewards [N, K], weights [K])`` of the reward components in episodes' step infos.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.env.verifiers import WeightedSum, RegexFormat, exact_match
        >>> from llmgym.agents.gdpo import reward_components
        >>> v = WeightedSum({"format": (0.2, RegexFormat(r"\\d+")), "correct": (0.8, exact_match)})
        >>> infos = [{"score": dict(v(Task("1+1=", answer=2), text).info)} for text in ("2", "3", "x")]
        >>> names, rewards, weights = reward_components(infos)
        >>> names, rewards.tolist(), weights
        (('format', 'correct'), [[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]], tensor([0.2000, 0.8000]))
    """
    scores = [_score_info(info) for info in infos]
    if names is None:
        found: dict[str, None] = {}
        for score in scores:
            for key, value in score.items():
                if _is_component(value):
                    found.setdefault(key, None)
        names = tuple(found)
    elif not any(name in score for score in scores for name in names):
        raise ValueError(f"none of the reward components {list(names)} appear in the episodes' score info; "
                         f"the verifier must report them as info[name] = {{'reward': ...}} (WeightedSum does)")
    rewards = torch.zeros(len(scores), len(names))
    weights = torch.ones(len(names))
    seen = [False] * len(names)
    for i, score in enumerate(scores):
        for k, name in enumerate(names):
            part = score.get(name)
            if _is_component(part):
                rewards[i, k] = float(part["reward"])
                if not seen[k] and isinstance(part.get("weight"), numbers.Real):
                    weights[k], seen[k] = float(part["weight"]), True
    return names, rewards, weights


class GDPO(GRPO):
    """Group reward-decoupled normalisation policy optimisation.

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym import SequenceEnv, Task
        >>> from llmgym.env.verifiers import WeightedSum, exact_match
        >>> from llmgym.envs.toy import positional_match
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.agents import GDPO
        >>> model, tok = load_model("tiny")
        >>> env = SequenceEnv([Task("copy:12=", answer="12")],
        ...                   WeightedSum({"match": (1.0, positional_match), "exact": (1.0, exact_match)}), tok)
        >>> agent = GDPO(model, tok, tasks_per_step=2, group_size=4, max_new_tokens=4)
        >>> row = agent.learn(env, steps=1)[0]
        >>> row["reward_components"]
        2.0
    """

    config_class = GDPOConfig
    name = "gdpo"

    def compute_advantages(self, batch: Batch) -> None:
        c = self.config
        names, rewards, weights = reward_components([e.info for e in batch.episodes], c.reward_components)
        if not names:  # a single-reward verifier: the env's reward is the one component
            names, rewards, weights = ("env",), batch.rewards.detach().float().cpu()[:, None], torch.ones(1)
        for k, name in enumerate(names):
            if c.component_weights and name in c.component_weights:
                weights[k] = float(c.component_weights[name])
        grouped = rewards.view(-1, c.group_size, len(names))
        advantages = F.decoupled_group_advantages(grouped, weights).view(-1, 1).to(batch.rewards.device)
        if c.batch_normalize:  # over the global batch under data parallel
            advantages = self.batch_whiten(advantages, torch.ones_like(advantages))
        batch.advantages = advantages * batch.action_mask
        self._component_stats = {"reward_components": float(len(names))}
        self._component_stats.update({f"reward_{name}": float(rewards[:, k].mean()) for k, name in enumerate(names)})

    def loss(self, batch: Batch, out: ForwardOutput):
        loss, stats = super().loss(batch, out)
        stats.update(getattr(self, "_component_stats", {}))
        return loss, stats
