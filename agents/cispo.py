"""CISPO (MiniMax-M1, Chen et al., 2025): clipped importance-sampling-weight policy optimisation.

GRPO's group-relative advantages with a REINFORCE-style loss whose importance weight is clipped and
detached: ``loss_t = −sg(clip(r_t, 1 − ε_low, 1 + ε_high)) · A · log π_t`` (see
:func:`llmgym.agents.functional.cispo_loss`). No token loses its gradient, however far its ratio
moved — the paper's fix for the rare "fork" tokens PPO's clip drops after the first update. As in
the paper: no lower bound on the weight (ε_low = 1), token-level normalisation over the batch
("token-mean"), no KL term. The paper tunes only ε_high and does not publish it; 0.28 here.
"""

from __future__ import annotations

import dataclasses

from llmgym.agents import functional as F
from llmgym.agents.base import ForwardOutput
from llmgym.agents.grpo import GRPO, GRPOConfig
from llmgym.rollout.episodes import Batch

__all__ = ["CISPOConfig", "CISPO"]


@dataclasses.dataclass
class CISPOConfig(GRPOConfig):
    """CISPO settings: ``clip_low`` / ``clip_high`` bound the importance weight, not the update."""

    clip_low: float = 1.0  # weight ≥ 0: no lower bound (MiniMax-M1)
    clip_high: float = 0.28
    kl_coef: float = 0.0
    loss_agg: str = "token-mean"


class CISPO(GRPO):
    """Clipped IS-weight policy optimisation; ``clip_frac`` counts tokens whose weight was capped.

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.agents import CISPO
        >>> model, tok = load_model("tiny")
        >>> agent = CISPO(model, tok, tasks_per_step=2, group_size=4, max_new_tokens=4)
        >>> row = agent.learn(gymnasium.make("llmgym/Copy-v0", tokenizer=tok), steps=1)[0]
        >>> row["clip_frac"]  # one on-policy step: every weight is exactly 1
        0.0
    """

    config_class = CISPOConfig
    name = "cispo"

    def surrogate(self, batch: Batch, out: ForwardOutput):
        c = self.config
        return F.cispo_loss(out.logprobs, batch.old_logprobs, batch.advantages, c.clip_low, c.clip_high,
                            mask=batch.action_mask)  # −sg(clip(r))·A·log π
