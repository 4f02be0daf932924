"""llmgym envs as a verifiers taskset and env: the classes behind :func:`llmgym.interop.to_verifiers`.

This module is a verifiers plugin (it imports ``verifiers`` at import time): verifiers loads a
taskset by importing a module and taking the one ``Taskset`` subclass in its ``__all__``. It
exports :class:`LlmgymTaskset`, whose config names the llmgym env (``env="llmgym/Copy-v0"``,
an adapter spec such as ``"textarena:TicTacToe-v0"``, or an env object handed over in this process
by :func:`~llmgym.interop.to_verifiers`). Each task's ``@vf.reward`` ``llmgym`` scores the last
assistant message with the env's verifier (its components become ``llmgym/<name>`` metrics); a
multi-turn llmgym env is played by :class:`LlmgymEnv`, whose ``run()`` steps the llmgym env with
each reply and records the episode's return as the ``llmgym`` reward.

verifiers 0.4 imports a plugin id as a top-level module name (a dotted id fails in its loader), so
:func:`~llmgym.interop.to_verifiers` makes this module importable as ``llmgym_taskset`` in the
calling process; a verifiers process of its own (its CLI, its env server) needs a module of that
name on its path: ``from llmgym.interop.verifiers_taskset import *`` in ``llmgym_taskset.py``.

Example:
    >>> from llmgym.interop.verifiers_taskset import LlmgymTaskset, LlmgymTasksetConfig
    >>> taskset = LlmgymTaskset(LlmgymTasksetConfig(env="llmgym/Copy-v0", num_tasks=3))
    >>> tasks = list(taskset)
    >>> len(tasks), tasks[0].data.prompt
    (3, 'copy:6523=')
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from typing import Any

from llmgym.runtime.install import install_hint

try:
    import verifiers.v1 as vf
except ModuleNotFoundError as exc:  # a plugin module: without verifiers there is nothing to define
    raise ModuleNotFoundError(f"llmgym's verifiers taskset needs the verifiers package ({exc.name} is missing): "
                              + install_hint("verifiers"), name=exc.name) from exc

from llmgym.env.types import Task

# verifiers picks a taskset module's Env from its __all__ too: LlmgymEnv stays out of it, so a single-turn
# llmgym env loads as verifiers' own SingleAgentEnv (to_verifiers builds LlmgymEnv itself for multi-turn ones)
__all__ = ["LlmgymTaskset", "LlmgymTasksetConfig", "LlmgymTask", "LlmgymTaskData", "PLUGIN_ID", "hand_over",
           "install_plugin_alias"]

PLUGIN_ID = "llmgym_taskset"
"""The taskset id verifiers loads this module by (see the module docstring)."""

_HANDED_OVER: dict[str, Any] = {}
_counter = itertools.count()


def hand_over(env: Any) -> str:
    """Keep ``env`` for tasksets built in this process; returns the ``env=`` value naming it."""
    key = f"object:{next(_counter)}:{type(env.unwrapped).__name__}"
    _HANDED_OVER[key] = env
    return key


def install_plugin_alias() -> str:
    """Make this module importable under :data:`PLUGIN_ID` (verifiers 0.4 cannot import a dotted id)."""
    sys.modules.setdefault(PLUGIN_ID, sys.modules[__name__])
    return PLUGIN_ID


class LlmgymTasksetConfig(vf.TasksetConfig):
    env: str = ""
    """The llmgym env: a registered id (``llmgym/Copy-v0``), an adapter spec (``textarena:TicTacToe-v0``)
    or a key from :func:`hand_over`."""
    env_args: dict[str, Any] = {}
    """Keyword arguments for ``gymnasium.make`` of a registered id or an adapter spec."""
    num_tasks: int | None = None
    """Tasks to take: every task of a finite list by default; a procedural env needs a number."""
    seed: int = 0
    """Which tasks: a procedural env's tasks come from reset seeds ``seed, seed+1, ...``."""


class LlmgymTaskData(vf.TaskData):
    answer: str | None = None
    """The llmgym task's reference answer, as text (for display; the verifier reads the task itself)."""


def _llmgym_env(config: LlmgymTasksetConfig) -> Any:
    if not config.env:
        raise ValueError("LlmgymTasksetConfig needs env=: a registered llmgym id, an adapter spec or a handed-over env")
    if config.env.startswith("object:"):
        if config.env not in _HANDED_OVER:
            raise ValueError(f"no env {config.env!r} was handed over in this process: pass a registered llmgym id "
                             f"(llmgym/...) to use the taskset in another process")
        return _HANDED_OVER[config.env]
    from llmgym.interop.adapters import make_adapted_env, parse_env_spec

    if parse_env_spec(config.env) is not None:
        return make_adapted_env(config.env, **config.env_args)
    import gymnasium

    import llmgym  # noqa: F401  (registers the llmgym/ ids)

    return gymnasium.make(config.env, **config.env_args)


class LlmgymTask(vf.Task[LlmgymTaskData, vf.State, vf.TaskConfig]):
    """One llmgym task; its reward is the llmgym env's verdict on the last assistant message."""

    llmgym_env: Any = None
    llmgym_task: Task | None = None

    @vf.reward
    async def llmgym(self, trace: vf.Trace) -> Any:
        env = self.llmgym_env.unwrapped
        from llmgym.env.core import MultiTurnEnv

        if isinstance(env, MultiTurnEnv):
            return {}  # the episode's return is recorded by LlmgymEnv.run
        replies = trace.assistant_messages
        completion = (replies[-1].content or "") if replies else ""
        completion = completion[: env.max_completion_chars]  # what env.step would score
        score = await asyncio.to_thread(env.verifier, self.llmgym_task, completion)
        for name, part in score.info.items():  # a WeightedSum's components, unweighted, as metrics
            if isinstance(part, dict) and isinstance(part.get("reward"), (int, float)):
                trace.record_metric(f"llmgym/{name}", part["reward"])
        if "error" in score.info:
            trace.info["llmgym_error"] = str(score.info["error"])
        return score.reward


class LlmgymTaskset(vf.Taskset[LlmgymTask, LlmgymTasksetConfig]):
    """The tasks of an llmgym env (see :class:`LlmgymTasksetConfig`)."""

    def load(self) -> list[LlmgymTask]:
        from llmgym.rollout import distinct_tasks

        env = _llmgym_env(self.config)
        tasks, _ = distinct_tasks(env, self.config.num_tasks, seed=self.config.seed)
        out = []
        for i, task in enumerate(tasks):
            prompt = ([vf.types.UserMessage(content=m["content"]) if m["role"] == "user" else
                       vf.types.SystemMessage(content=m["content"]) if m["role"] == "system" else
                       vf.types.AssistantMessage(content=m["content"]) for m in task.prompt]
                      if task.is_chat else task.prompt)
            answer = None if task.answer is None else str(task.answer)
            vf_task = LlmgymTask(LlmgymTaskData(idx=i, id=task.id or None, prompt=prompt, answer=answer),
                                 self.config.task)
            vf_task.llmgym_env, vf_task.llmgym_task = env, task
            out.append(vf_task)
        return out


class LlmgymEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()
    """The seat of the model playing the llmgym env."""


class LlmgymEnv(vf.Env[LlmgymEnvConfig]):
    """A multi-turn llmgym env as a verifiers env: each reply steps it; the env's replies are the user's turns."""

    async def run(self, task: LlmgymTask, agents: Any) -> None:
        from llmgym.env.vector import clone_env

        env = clone_env(task.llmgym_env.unwrapped)
        await asyncio.to_thread(env.reset, options={"task": task.llmgym_task})
        total, info = 0.0, {}
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                replies = [m for m in segment.messages if isinstance(m, vf.AssistantMessage)]
                completion = (replies[-1].content or "") if replies else ""
                _, reward, terminated, truncated, info = await asyncio.to_thread(env.step, completion)
                total += float(reward)
                if terminated or truncated:
                    break
                segment = await interaction.turn(str(info.get("reply") or ""))
        interaction.trace.record_reward("llmgym", total, 1.0)
        if "error" in info:
            interaction.trace.info["llmgym_error"] = str(info["error"])
