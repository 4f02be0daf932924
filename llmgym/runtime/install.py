"""How to install an optional extra of this project: the one place every "pip install ..." hint comes from.

The distribution is ``llmgym-rl`` (the import package and the command stay ``llmgym``; the name
``llmgym`` on PyPI is an unrelated project). Run from a source checkout — an editable install, as
``scripts/setup.sh`` makes — a hint installs the extra from that checkout; from an installed wheel it
names the published distribution.

Example:
    >>> from llmgym.runtime.install import DISTRIBUTION, install_hint
    >>> DISTRIBUTION
    'llmgym-rl'
    >>> install_hint("math").startswith("pip install ") and "[math]'" in install_hint("math")
    True
    >>> "'llmgym[" in install_hint("math", "code")
    False
"""

from __future__ import annotations

import functools
import importlib
import re
from types import ModuleType
from pathlib import Path

__all__ = ["DISTRIBUTION", "import_optional", "install_hint", "source_checkout"]

DISTRIBUTION = "llmgym-rl"
"""The name pip knows this project by (``[project] name`` in pyproject.toml)."""


@functools.lru_cache(maxsize=1)
def source_checkout() -> Path | None:
    """The root of the source checkout llmgym is imported from, or ``None`` for an installed wheel."""
    root = Path(__file__).resolve().parents[2]
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    return root if re.search(rf'^name\s*=\s*"{re.escape(DISTRIBUTION)}"', text, flags=re.M) else None


def install_hint(*extras: str) -> str:
    """The command that installs this project with ``extras``: ``pip install -e '<checkout>[math]'`` from
    a checkout, else ``pip install 'llmgym-rl[math]'``."""
    bad = [e for e in extras if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", e)]
    if bad:
        raise ValueError(f"not an extra's name: {bad[0]!r} (lower-case letters, digits and '-')")
    spec = f"[{','.join(extras)}]" if extras else ""
    root = source_checkout()
    return f"pip install -e '{root}{spec}'" if root is not None else f"pip install '{DISTRIBUTION}{spec}'"


def import_optional(module: str, *, extra: str, distribution: str, needed_by: str) -> ModuleType:
    """``module``, imported; or a ``ModuleNotFoundError`` naming what needs it, the missing package, and the
    command that installs the extra ``extra`` (:func:`install_hint`).

    Example:
        >>> from llmgym.runtime.install import import_optional
        >>> import_optional("json", extra="math", distribution="json", needed_by="a doctest").__name__
        'json'
        >>> import_optional("no_such_module_xyz", extra="textarena", distribution="textarena",
        ...                 needed_by="the textarena adapter")
        Traceback (most recent call last):
        ...
        ModuleNotFoundError: the textarena adapter needs the textarena package (no_such_module_xyz is missing): pip install ...
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(f"{needed_by} needs the {distribution} package ({exc.name} is missing): "
                                  f"{install_hint(extra)}", name=exc.name) from exc
