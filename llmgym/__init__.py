"""llmgym: Gymnasium environments and RL agents for language models.

Prompts, tokens and verifiers become real ``gymnasium.Env``\\ s at sequence level (an action is a
whole completion), token level (an action is one token id) and multi-turn (the env answers, the
policy speaks again). Importing ``llmgym`` registers the ``llmgym/...`` env ids with Gymnasium; it
imports neither the ``envs`` nor the ``agents`` package.

Example:
    >>> import gymnasium, llmgym
    >>> env = gymnasium.make("llmgym/Copy-v0")
    >>> obs, info = env.reset(seed=1)
    >>> obs, reward, terminated, truncated, info = env.step(info["task"].answer)
    >>> reward, terminated
    (1.0, True)
"""

from llmgym.env.core import MultiTurnEnv, SequenceEnv, TaskSource, Turn
from llmgym.env.registry import env_info, register_env, registered_envs
from llmgym.env.sources import tasks_from_dataset
from llmgym.env.token_level import TokenLevel
from llmgym.env.types import Score, Task
from llmgym.env.vector import clone_env, make_group
from llmgym.env.verifiers import Verifier, as_verifier, from_reward_function
from llmgym.errors import LLMGymError

__version__ = "0.1.0"

__all__ = [
    "Task",
    "Score",
    "Verifier",
    "as_verifier",
    "from_reward_function",
    "tasks_from_dataset",
    "SequenceEnv",
    "MultiTurnEnv",
    "Turn",
    "TaskSource",
    "TokenLevel",
    "register_env",
    "registered_envs",
    "env_info",
    "clone_env",
    "make_group",
    "LLMGymError",
    "__version__",
]
