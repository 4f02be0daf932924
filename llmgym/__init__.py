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

import importlib
import importlib.abc
import importlib.util
import sys

# Modules that moved into the subpackages by concept keep their old import paths: ``import llmgym.models``
# gives the very module ``llmgym.runtime.models`` (one object: a monkeypatch or an isinstance check sees no
# difference), imported on first use.
MOVED_MODULES = {
    "llmgym.types": "llmgym.env.types", "llmgym.core": "llmgym.env.core", "llmgym.spaces": "llmgym.env.spaces",
    "llmgym.token_level": "llmgym.env.token_level", "llmgym.vector": "llmgym.env.vector",
    "llmgym.registry": "llmgym.env.registry", "llmgym.sources": "llmgym.env.sources",
    "llmgym.verifiers": "llmgym.env.verifiers", "llmgym.rollout": "llmgym.engines.rollout",
    "llmgym.batch": "llmgym.engines.batch", "llmgym.preferences": "llmgym.rlhf.preferences",
    "llmgym.reward_models": "llmgym.rlhf.reward_models", "llmgym.judges": "llmgym.rlhf.llm_judges",
    "llmgym.logging": "llmgym.runtime.logging", "llmgym.display": "llmgym.runtime.display",
    "llmgym.threads": "llmgym.runtime.threads", "llmgym.metrics": "llmgym.runtime.metrics",
    "llmgym.distributed": "llmgym.runtime.distributed", "llmgym.models": "llmgym.runtime.models",
    # renamed so that no two modules share a name for different ideas
    "llmgym.sandbox.judge": "llmgym.sandbox.judge_protocol", "llmgym.tools.runner": "llmgym.tools.helper_process",
    "llmgym.interop.sandboxed": "llmgym.interop.adapter_pools", "llmgym.envs.code.judge": "llmgym.envs.code.code_judge",
    "llmgym.envs.math.sandboxed": "llmgym.envs.math.scorer_pools",
    "llmgym.envs.math.verifier": "llmgym.envs.math.math_verifier", "llmgym.envs.code.verifier": "llmgym.envs.code.code_verifier",
}
"""Old module path -> where the module lives now."""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED_MODULES else None

    def create_module(self, spec):
        return importlib.import_module(MOVED_MODULES[spec.name])

    def exec_module(self, module):
        pass  # the module ran under its own name


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())

from llmgym.env.core import MultiTurnEnv, SequenceEnv, TaskSource, Turn  # noqa: E402
from llmgym.env.registry import env_info, register_env, registered_envs  # noqa: E402
from llmgym.env.sources import tasks_from_dataset  # noqa: E402
from llmgym.env.token_level import TokenLevel  # noqa: E402
from llmgym.env.types import Score, Task  # noqa: E402
from llmgym.env.vector import clone_env, make_group  # noqa: E402
from llmgym.env.verifiers import Verifier, as_verifier, from_reward_function  # noqa: E402

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
    "__version__",
]
