"""The env registry: ids ``llmgym/<Name>-v0`` registered with ``gymnasium.register``.

Entry points are strings into the ``envs`` package, so ``import llmgym`` imports neither ``envs``
nor any task library; an env's factory is imported by ``gymnasium.make`` when first asked for. Every
registered env accepts ``tokenizer=``, ``level=`` (``"sequence"`` or ``"token"``) and
``max_new_tokens=`` through ``gymnasium.make``.

Example:
    >>> import gymnasium, llmgym
    >>> env = gymnasium.make("llmgym/Addition-v0")
    >>> obs, info = env.reset(seed=0)
    >>> isinstance(obs["prompt"], str)
    True
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

import gymnasium as gym

__all__ = ["EnvInfo", "register_env", "make_env", "registered_envs", "env_info", "REASONING_GYM_DATASETS"]

NAMESPACE = "llmgym"


@dataclasses.dataclass(frozen=True)
class EnvInfo:
    """What ``llmgym list`` shows about a registered env."""

    id: str
    factory: str
    family: str
    description: str = ""
    multi_turn: bool = False
    requires: tuple[str, ...] = ()  # importable modules the factory needs (for a clear error)


_INFO: dict[str, EnvInfo] = {}


def register_env(
    name: str,
    factory: str | Callable[..., gym.Env],
    *,
    family: str = "custom",
    description: str = "",
    multi_turn: bool = False,
    requires: tuple[str, ...] = (),
    version: int = 0,
    kwargs: dict[str, Any] | None = None,
) -> str:
    """Register ``llmgym/<name>-v<version>``; returns the id.

    ``factory`` is ``"module:function"`` (imported lazily) or a callable; it is called with the
    ``make`` keyword arguments (``tokenizer`` included) and returns a sequence-level or multi-turn env.

    Example:
        >>> import gymnasium
        >>> from llmgym import SequenceEnv, Task, register_env
        >>> def make_echo(tokenizer=None):
        ...     return SequenceEnv([Task("say hi", answer="hi")], lambda t, c: c == t.answer, tokenizer)
        >>> register_env("EchoDoc", make_echo, family="example")
        'llmgym/EchoDoc-v0'
        >>> gymnasium.make("llmgym/EchoDoc-v0").reset(seed=0)[0]["prompt"]
        'say hi'
    """
    env_id = f"{NAMESPACE}/{name}-v{version}"
    factory_ref = factory if isinstance(factory, str) else _callable_ref(factory)
    gym.register(
        id=env_id,
        entry_point=make_env,
        kwargs={"factory": factory, **(kwargs or {})},
        disable_env_checker=False,
    )
    _INFO[env_id] = EnvInfo(env_id, factory_ref, family, description, multi_turn, tuple(requires))
    return env_id


def _callable_ref(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def _load(factory: str | Callable[..., gym.Env]) -> Callable[..., gym.Env]:
    if callable(factory):
        return factory
    module_name, _, attr = factory.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"this env needs the Python module {exc.name!r}, which is not installed: "
            f"pip install 'llmgym[math,code]' (or the package that provides {exc.name!r})"
        ) from exc
    return getattr(module, attr)


def make_env(
    factory: str | Callable[..., gym.Env],
    level: str = "sequence",
    tokenizer: Any = None,
    max_new_tokens: int = 64,
    render_mode: str | None = None,
    **kwargs: Any,
) -> gym.Env:
    """The entry point behind every registered id: build the env, wrap it for ``level="token"``."""
    if level not in ("sequence", "token"):
        raise ValueError(f"level must be 'sequence' or 'token', got {level!r}")
    if level == "token" and tokenizer is None:
        raise ValueError("level='token' needs a tokenizer: gymnasium.make(id, level='token', tokenizer=tok)")
    if render_mode is not None:  # user factories need not know about rendering
        kwargs["render_mode"] = render_mode
    env = _load(factory)(tokenizer=tokenizer, **kwargs)
    if level == "token":
        from llmgym.token_level import TokenLevel

        env = TokenLevel(env, tokenizer, max_new_tokens=max_new_tokens)
    return env


def registered_envs(family: str | None = None) -> list[EnvInfo]:
    """Registered llmgym envs, sorted by id (optionally one family).

    Example:
        >>> from llmgym import registered_envs
        >>> "llmgym/Copy-v0" in [e.id for e in registered_envs("toy")]
        True
    """
    return sorted((i for i in _INFO.values() if family is None or i.family == family), key=lambda i: i.id)


def env_info(env_id: str) -> EnvInfo:
    """The :class:`EnvInfo` of a registered id, with a clear error for an unknown one."""
    try:
        return _INFO[env_id]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(env_id, list(_INFO), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else " See `llmgym list`."
        raise KeyError(f"unknown env id {env_id!r}.{hint}") from None


# reasoning-gym datasets that build offline (0.1.25; `composite` needs a configuration). Listed here
# so registration does not import reasoning_gym; a test checks the list against the library.
REASONING_GYM_DATASETS: tuple[str, ...] = ()


def _register_builtin() -> None:
    toy = "envs.toy"
    register_env("Addition", f"{toy}:addition_env", family="toy",
                 description="a+b= with small numbers; partial credit per correct digit")
    register_env("Copy", f"{toy}:copy_env", family="toy",
                 description="copy a digit string; reward = share of positions right")
    register_env("Reverse", f"{toy}:reverse_env", family="toy",
                 description="reverse a digit string; reward = share of positions right")
    register_env("CopyRetry", f"{toy}:copy_retry_env", family="toy", multi_turn=True,
                 description="Copy with up to 3 attempts and feedback after a wrong one")


_register_builtin()
