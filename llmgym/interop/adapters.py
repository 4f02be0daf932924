"""Env specs ``<adapter>:<target>`` (``verifiers:echo_taskset``, ``textarena:TicTacToe-v0``) and their adapters.

An adapter spec names an env of another ecosystem wherever an llmgym env id goes on the command line
(``llmgym train|bench --env textarena:GuessTheNumber-v0``). :func:`check_env_spec` says what is wrong
with one (package missing, module or game unknown) without importing the heavy package where it can;
:func:`adapted_env_spec` checks it and gives the ``gymnasium`` ``EnvSpec`` that makes it, and
:func:`make_adapted_env` builds it through ``gymnasium.make`` (the usual wrappers, ``level="token"``
included), without registering anything.

Example:
    >>> from llmgym.interop.adapters import parse_env_spec
    >>> adapter, target = parse_env_spec("textarena:TicTacToe-v0")
    >>> adapter.name, target
    ('textarena', 'TicTacToe-v0')
    >>> parse_env_spec("llmgym/Copy-v0") is None
    True
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
from typing import Any

from llmgym.runtime.install import import_optional, install_hint

__all__ = ["Adapter", "ADAPTERS", "adapter_versions", "import_package", "parse_env_spec", "check_env_spec",
           "adapted_env_spec", "make_adapted_env"]


@dataclasses.dataclass(frozen=True)
class Adapter:
    """One ecosystem llmgym loads envs from."""

    name: str
    """The spec's prefix: ``<name>:<target>``."""
    module: str
    """The module it imports."""
    distribution: str
    """The PyPI distribution providing ``module``."""
    factory: str
    """``"module:function"`` that builds the env from ``(target, tokenizer=..., **kwargs)``."""
    target: str
    """What follows the colon, for help texts."""
    description: str


ADAPTERS: dict[str, Adapter] = {
    "verifiers": Adapter("verifiers", "verifiers", "verifiers", "llmgym.interop.verifiers_in:from_verifiers",
                         "<module>", "a PrimeIntellect verifiers environment (an installed package, or a module in the "
                                     "current folder, exporting its Taskset), single- or multi-turn"),
    "textarena": Adapter("textarena", "textarena", "textarena", "llmgym.interop.textarena_in:from_textarena",
                         "<game id>", "a TextArena game (multi-turn; other seats played by a fixed opponent)"),
}
"""The adapters, by spec prefix."""


def adapter_versions() -> dict[str, str | None]:
    """``{adapter name: installed version of its package, or None}`` (nothing is imported).

    Example:
        >>> from llmgym.interop.adapters import adapter_versions
        >>> sorted(adapter_versions())
        ['textarena', 'verifiers']
    """
    out: dict[str, str | None] = {}
    for name, adapter in ADAPTERS.items():
        try:
            out[name] = importlib.metadata.version(adapter.distribution)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def import_package(name: str, module: str | None = None) -> Any:
    """The adapter ``name``'s package (or its ``module``), or a ``ModuleNotFoundError`` saying which extra installs it.

    Example:
        >>> from llmgym.interop.adapters import import_package
        >>> import_package("textarena").__name__
        'textarena'
    """
    adapter = ADAPTERS[name]
    return import_optional(module or adapter.module, extra=name, distribution=adapter.distribution,
                           needed_by=f"the {name} adapter")


def parse_env_spec(spec: str) -> tuple[Adapter, str] | None:
    """``(adapter, target)`` of an adapter spec; ``None`` for anything else (an llmgym id)."""
    prefix, sep, target = spec.partition(":")
    if not sep or prefix not in ADAPTERS:
        return None
    return ADAPTERS[prefix], target


def check_env_spec(spec: str) -> tuple[Adapter, str]:
    """``(adapter, target)``, or a ``ValueError`` saying what is wrong (one line, with what to do).

    Example:
        >>> from llmgym.interop.adapters import check_env_spec
        >>> check_env_spec("textarena:")
        Traceback (most recent call last):
        ...
        ValueError: textarena: names no game id: give textarena:<game id>, e.g. textarena:GuessTheNumber-v0
    """
    parsed = parse_env_spec(spec)
    if parsed is None:
        raise ValueError(f"{spec!r} is not an adapter spec; adapters: "
                         + ", ".join(f"{a.name}:{a.target}" for a in ADAPTERS.values()))
    adapter, target = parsed
    example = {"verifiers": "verifiers:echo_taskset", "textarena": "textarena:GuessTheNumber-v0"}[adapter.name]
    if not target.strip():
        what = adapter.target.strip("<>")
        raise ValueError(f"{adapter.name}: names no {what}: give {adapter.name}:{adapter.target}, e.g. {example}")
    if importlib.util.find_spec(adapter.module) is None:
        raise ValueError(f"{spec} needs the Python package {adapter.distribution!r}, not installed here: "
                         + install_hint(adapter.name))
    if adapter.name == "verifiers":
        module = target.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()  # verifiers' own id rule
        _search_current_folder()  # a module of the user's, as --import finds one (the `llmgym` script has not)
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ValueError(f"{spec}: no verifiers environment module {module!r} installed or in the current "
                             f"folder: install the environment's package, run from the folder that holds "
                             f"{module}.py, or put that folder on PYTHONPATH")
    else:
        import_package("textarena")
        from textarena.envs.registration import ENV_REGISTRY

        if target not in ENV_REGISTRY:
            import difflib

            close = difflib.get_close_matches(target, list(ENV_REGISTRY), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"{spec}: TextArena has no game {target!r}.{hint}")
        from llmgym.interop.textarena_in import count_players

        count_players(target)  # a game that cannot start here (NLTK corpora, an API key) says so now
    return adapter, target


def _search_current_folder() -> None:
    """Put the current folder first on ``sys.path`` where it is not (``python -m`` puts it there; a console
    script does not), so a module saved there loads by its id from every command."""
    import os
    import sys

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def adapted_env_spec(spec: str) -> Any:
    """The checked (:func:`check_env_spec`) ``gymnasium.envs.registration.EnvSpec`` of an adapter spec:
    ``gymnasium.make(it, tokenizer=..., level=..., max_new_tokens=..., **kwargs)`` builds the env, as
    often as wanted, without checking the spec again.

    Example:
        >>> from llmgym.interop.adapters import adapted_env_spec
        >>> env_spec = adapted_env_spec("textarena:GuessTheNumber-v0")
        >>> env_spec.id, env_spec.entry_point
        ('textarena:GuessTheNumber-v0', 'llmgym.env.registry:make_env')
    """
    import gymnasium

    adapter, target = check_env_spec(spec)
    return gymnasium.envs.registration.EnvSpec(
        id=spec, entry_point="llmgym.env.registry:make_env",
        kwargs={"factory": adapter.factory, adapter_argument(adapter): target}, disable_env_checker=False)


def make_adapted_env(spec: str, tokenizer: Any = None, *, level: str = "sequence", max_new_tokens: int = 64,
                     **kwargs: Any) -> Any:
    """``gymnasium.make`` of an adapter spec, with llmgym's ``level=`` / ``max_new_tokens=`` and the adapter's kwargs.

    Example:
        >>> from llmgym.interop import make_adapted_env
        >>> env = make_adapted_env("textarena:GuessTheNumber-v0", max_turns=4)
        >>> env.spec.id, type(env.unwrapped).__name__
        ('textarena:GuessTheNumber-v0', 'TextArenaEnv')
    """
    import gymnasium

    return gymnasium.make(adapted_env_spec(spec), tokenizer=tokenizer, level=level, max_new_tokens=max_new_tokens,
                          **kwargs)


def adapter_argument(adapter: Adapter) -> str:
    """The factory's parameter that takes the spec's target."""
    return {"verifiers": "source", "textarena": "env_id"}[adapter.name]
