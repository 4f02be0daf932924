"""llmgym envs where a verifiers environment is expected: :func:`to_verifiers`.

Example:
    >>> import gymnasium, llmgym
    >>> from llmgym.interop import to_verifiers
    >>> vf_env = to_verifiers(gymnasium.make("llmgym/Copy-v0"), num_tasks=4)
    >>> type(vf_env).__name__, len(list(vf_env.taskset))
    ('SingleAgentEnv', 4)
"""

from __future__ import annotations

from typing import Any

__all__ = ["to_verifiers"]


def to_verifiers(env: Any, *, num_tasks: int | None = None, seed: int = 0, env_args: dict[str, Any] | None = None
                 ) -> Any:
    """A verifiers ``Env`` playing an llmgym env: its tasks, scored by its verifier or stepped turn by turn.

    A single-turn env becomes verifiers' own ``SingleAgentEnv`` over an
    :class:`~llmgym.interop.verifiers_taskset.LlmgymTaskset` (each task's ``@vf.reward`` ``llmgym``
    is the env's verifier on the last assistant message, its components ``llmgym/<name>``
    metrics); a multi-turn env becomes :class:`~llmgym.interop.verifiers_taskset.LlmgymEnv`, whose
    ``run()`` steps the llmgym env with each reply and answers with the env's reply, the episode's
    return recorded as the ``llmgym`` reward. The model plays at sequence level (a token-level
    wrapper is looked through).

    Args:
        env: an llmgym env object, a registered llmgym id (``"llmgym/Copy-v0"``) or an adapter spec
            (``"textarena:TicTacToe-v0"``). Only an id or a spec can be named in another process.
        num_tasks: tasks to take (every task of a finite list by default; a procedural env needs it,
            default 100).
        seed: a procedural env's tasks come from reset seeds ``seed, seed+1, ...``.
        env_args: ``gymnasium.make`` keyword arguments for an id or a spec.
    """
    from llmgym.interop.verifiers_in import import_verifiers

    vf = import_verifiers()
    from llmgym.env.core import MultiTurnEnv, TaskSource
    from llmgym.interop import verifiers_taskset as plugin

    if isinstance(env, str):
        name, base = env, plugin._llmgym_env(plugin.LlmgymTasksetConfig(env=env, env_args=env_args or {}))
    else:
        if env_args:
            raise ValueError("env_args= configures an env made from an id or a spec; pass a configured env object")
        base = env.unwrapped
        name = plugin.hand_over(base)
    source = getattr(base.unwrapped, "tasks", None)
    if num_tasks is None and not (isinstance(source, TaskSource) and source.kind == "sequence"):
        num_tasks = 100
    taskset = plugin.LlmgymTasksetConfig(id=plugin.install_plugin_alias(), env=name, env_args=env_args or {},
                                         num_tasks=num_tasks, seed=seed)
    if isinstance(base.unwrapped, MultiTurnEnv):
        return plugin.LlmgymEnv(plugin.LlmgymEnvConfig(taskset=taskset))
    return vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset=taskset))
