"""The secrets this process holds, and their removal from what it writes about the model's work.

A model that got hold of a secret (a tool that printed its environment before the tool's process was cut to
an allow-list, a verifier that echoed it) writes it into its completions; ``rollouts.jsonl`` then keeps it.
Defence in depth: a record's texts are written with every secret this process holds replaced by
:data:`REDACTED` -- the values of its environment variables whose names say they are secrets (a ``KEY``,
``SECRET``, ``TOKEN``, ``PASSWORD``, ``PASSWD``, ``CREDENTIAL(S)`` or ``AUTH`` part of the name:
``OPENAI_API_KEY``, ``LLMGYM_SERVE_SECRET``, ``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``), and the secrets the
run registered that never were in the environment (a fleet's secret given to ``FleetEngine(secret=...)``).
Values under :data:`MIN_SECRET_CHARS` characters (``EMPTY``, ``1``) are not secrets: replacing them would
garble the text.

Example:
    >>> from llmgym.runtime.secrets import register_secret, redact
    >>> register_secret("fleet-0123456789")
    >>> redact("the key is fleet-0123456789.")
    'the key is [redacted].'
"""

from __future__ import annotations

import json
import os
import re
import threading
from typing import Any, Optional

__all__ = ["MIN_SECRET_CHARS", "REDACTED", "is_secret_name", "known_secrets", "redact", "redact_tree", "register_secret"]

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 8
"""A value shorter than this is never treated as a secret."""

_SECRET_PARTS = frozenset({"KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "AUTH", "APIKEY"})
_registered: set[str] = set()
_lock = threading.Lock()


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret (one of its ``_``-separated parts does).

    Example:
        >>> from llmgym.runtime.secrets import is_secret_name
        >>> [is_secret_name(n) for n in ("OPENAI_API_KEY", "HF_TOKEN", "TOKENIZERS_PARALLELISM", "PATH")]
        [True, True, False, False]
    """
    return any(part in _SECRET_PARTS for part in re.split(r"[_\W]+", name.upper()))


def register_secret(value: Optional[str]) -> None:
    """Remember ``value`` as a secret of this process (``None``, or one under :data:`MIN_SECRET_CHARS`: ignored)."""
    if isinstance(value, str) and len(value) >= MIN_SECRET_CHARS:
        with _lock:
            _registered.add(value)


def known_secrets(environ: Optional[dict[str, str]] = None) -> list[str]:
    """Every secret this process holds (see the module docstring), longest first."""
    environ = os.environ if environ is None else environ
    found = {v for k, v in environ.items() if len(v) >= MIN_SECRET_CHARS and is_secret_name(k)}
    with _lock:
        found |= _registered
    return sorted(found, key=len, reverse=True)


def redact(text: str, secrets: Optional[list[str]] = None) -> str:
    """``text`` with every secret (default: :func:`known_secrets`) replaced by :data:`REDACTED`."""
    for secret in known_secrets() if secrets is None else secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact_tree(value: Any, secrets: Optional[list[str]] = None, _depth: int = 0) -> Any:
    """:func:`redact` applied to every string (dict keys too) of a JSON-like ``value`` (past 16 levels, the rest
    as one JSON string).

    Example:
        >>> from llmgym.runtime.secrets import redact_tree
        >>> redact_tree({"out": ["ok", "sk-abcdefgh1234"], "n": 1}, ["sk-abcdefgh1234"])
        {'out': ['ok', '[redacted]'], 'n': 1}
    """
    secrets = known_secrets() if secrets is None else secrets
    if not secrets:
        return value
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, (dict, list, tuple)) and _depth >= 16:
        return redact(json.dumps(value, default=str), secrets)
    if isinstance(value, dict):
        return {redact_tree(k, secrets, _depth + 1): redact_tree(v, secrets, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_tree(v, secrets, _depth + 1) for v in value]
    return value
