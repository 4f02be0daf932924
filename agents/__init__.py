"""Algorithm-agnostic agents over the plain Gymnasium API.

Each agent is a short composition of the pure functions in :mod:`llmgym.agents.functional` plus its
config. ``act`` / ``collect`` / ``update`` / ``learn`` work on any llmgym env, at sequence level,
token level or multi-turn.

Example:
    >>> from llmgym.agents import REINFORCE, RLOO, PPO, GRPO, DAPO, AGENTS
    >>> sorted(a.name for a in (REINFORCE, RLOO, PPO, GRPO, DAPO))
    ['dapo', 'grpo', 'ppo', 'reinforce', 'rloo']
    >>> {"cispo", "sapo", "gdpo"} <= set(AGENTS)
    True
"""

from llmgym.agents.base import Agent, AgentConfig
from llmgym.agents.cispo import CISPO, CISPOConfig
from llmgym.agents.dapo import DAPO, DAPOConfig
from llmgym.agents.distill import DistillConfig, OnPolicyDistillation
from llmgym.agents.gdpo import GDPO, GDPOConfig
from llmgym.agents.dpo import DPO, DPOConfig
from llmgym.agents.grpo import GRPO, GSPO, DrGRPO, DrGRPOConfig, GRPOConfig, GSPOConfig
from llmgym.agents.ppo import PPO, PPOConfig
from llmgym.agents.reinforce import REINFORCE, REINFORCEConfig, REINFORCEPlusPlus, REINFORCEPlusPlusConfig, ReMax, ReMaxConfig
from llmgym.agents.rejection_sampling import RejectionSampling, RejectionSamplingConfig
from llmgym.agents.rloo import RLOO, RLOOConfig
from llmgym.agents.sapo import SAPO, SAPOConfig

AGENTS: dict[str, type[Agent]] = {
    cls.name: cls for cls in (REINFORCE, RLOO, PPO, GRPO, DAPO, DrGRPO, GSPO, REINFORCEPlusPlus, ReMax,
                              CISPO, SAPO, GDPO, DPO, RejectionSampling, OnPolicyDistillation)
}
"""Agents by their command-line name."""

__all__ = [
    "Agent", "AgentConfig", "AGENTS",
    "REINFORCE", "REINFORCEConfig", "RLOO", "RLOOConfig", "PPO", "PPOConfig",
    "GRPO", "GRPOConfig", "DAPO", "DAPOConfig", "DrGRPO", "DrGRPOConfig", "GSPO", "GSPOConfig",
    "REINFORCEPlusPlus", "REINFORCEPlusPlusConfig", "ReMax", "ReMaxConfig",
    "CISPO", "CISPOConfig", "SAPO", "SAPOConfig", "GDPO", "GDPOConfig",
    "DPO", "DPOConfig", "RejectionSampling", "RejectionSamplingConfig",
    "OnPolicyDistillation", "DistillConfig",
]
