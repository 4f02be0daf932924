"""The environment of a process that runs model-driven work: an allow-list, never the parent's whole environment.

A tool the model calls, a verifier fed model text, a game's helper: whatever such a process reads or prints
may end up in the model's context and in the run's files. So it starts from a small explicit set of variables
(:data:`ALLOWED_NAMES`, the locale's ``LC_*``) -- the search path, the locale, the interpreter's settings,
thread counts -- and from nothing else: ``OPENAI_API_KEY``, ``LLMGYM_SERVE_SECRET``, ``HF_TOKEN``, cloud
credentials and any name nobody thought of stay behind. A variable such a process does need is named:
``Tool(fn, env={...}, pass_env=[...])`` for one tool, the variable ``LLMGYM_PASS_ENV`` (names separated by
commas) for every tool and time-limited verifier of the run.

Two places apply it: :mod:`llmgym.tools.helper_process` starts the tools' helper with
:func:`allowed_environment`, and every child forked by :mod:`llmgym.sandbox.killable` (a tool call, a
``Verifier(time_limit=...)``, a multi-turn ``respond``) calls :func:`scrub_environ` before the call runs: a
fork inherits the parent's ``os.environ`` and the block ``/proc/self/environ`` shows, and both are emptied of
what is not allowed. (The sandbox builds its own environment from nothing: :mod:`llmgym.sandbox.runner`.)

Standard library only: the tools' helper loads this file by path (it imports nothing of ``llmgym``).
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping, Optional

__all__ = ["ALLOWED_NAMES", "ALLOWED_PREFIXES", "PASS_ENV", "allowed_environment", "scrub_environ"]

ALLOWED_NAMES = frozenset({
    # where things are, who runs them, how text looks
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "TMP", "TEMP", "LANG", "LANGUAGE", "TZ", "TERM",
    # the interpreter's own settings (PYTHONPATH: a tool that starts `python` finds the user's modules)
    "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED", "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "VIRTUAL_ENV",
    # thread counts and devices (a tool that imports torch or numpy keeps the run's settings)
    "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
    "TOKENIZERS_PARALLELISM", "CUDA_VISIBLE_DEVICES",
    # offline switches (never the tokens)
    "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE",
    # llmgym's own switches that change what a check does (never LLMGYM_SERVE_SECRET)
    "LLMGYM_ALLOW_UNSANDBOXED", "LLMGYM_CACHE", "LLMGYM_TOOL_HELPER",
})
"""Variables a model-driven process gets from its parent, when the parent has them."""

ALLOWED_PREFIXES = ("LC_",)
"""Prefixes of allowed names (the locale's categories)."""

PASS_ENV = "LLMGYM_PASS_ENV"
"""Names (separated by commas) passed on too, for a run whose tools or verifiers need them: the user's explicit
choice (``LLMGYM_PASS_ENV=MY_JUDGE_KEY``), never a default."""


def _allowed(name: str, extra: frozenset) -> bool:
    return name in ALLOWED_NAMES or name == PASS_ENV or name in extra or name.startswith(ALLOWED_PREFIXES)


def _named(environ: Mapping[str, str], extra_names: Iterable[str]) -> frozenset:
    listed = (n.strip() for n in environ.get(PASS_ENV, "").split(","))
    return frozenset(n for n in (*listed, *extra_names) if n)


def allowed_environment(environ: Optional[Mapping[str, str]] = None, extra_names: Iterable[str] = ()) -> dict[str, str]:
    """The part of ``environ`` (default ``os.environ``) a model-driven process may see: the allow-listed
    names, those listed in ``LLMGYM_PASS_ENV`` (and that list itself: a process started from this one keeps
    them) and ``extra_names``.

    Example:
        >>> from llmgym.sandbox.child_env import allowed_environment
        >>> parent = {"PATH": "/usr/bin", "LC_ALL": "C", "OPENAI_API_KEY": "sk-1", "MY_TOKEN": "t", "MY_DIR": "/d"}
        >>> allowed_environment(parent)
        {'PATH': '/usr/bin', 'LC_ALL': 'C'}
        >>> allowed_environment(dict(parent, LLMGYM_PASS_ENV="MY_DIR"))
        {'PATH': '/usr/bin', 'LC_ALL': 'C', 'MY_DIR': '/d', 'LLMGYM_PASS_ENV': 'MY_DIR'}
    """
    environ = os.environ if environ is None else environ
    extra = _named(environ, extra_names)
    return {k: v for k, v in environ.items() if _allowed(k, extra)}


def _wipe_initial_block() -> None:
    """Zero the environment block the process was started with (what ``/proc/self/environ`` shows; after a
    fork, the parent's): ``os.environ`` changes leave it as it was. Called once nothing points into it any
    more (:func:`scrub_environ` has re-set every kept variable). Linux only; elsewhere a no-op."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end: fields 50 and 51 of proc(5), from 1
    except (OSError, ValueError, IndexError):
        return
    if 0 < start < end and end - start < (1 << 24):
        import ctypes

        ctypes.memset(start, 0, end - start)


def scrub_environ(extra_names: Iterable[str] = ()) -> None:
    """Keep in ``os.environ`` only what :func:`allowed_environment` allows, and zero the process's initial
    environment block: for a forked child about to run model-driven work (see the module docstring).

    Example:
        >>> import os
        >>> from llmgym.sandbox.killable import call_in_killable_child
        >>> os.environ["MY_TOKEN"] = "t0k3n"
        >>> call_in_killable_child(os.environ.get, "MY_TOKEN", limit=30).value is None
        True
        >>> call_in_killable_child(os.environ.get, "PATH", limit=30).value == os.environ["PATH"]
        True
        >>> del os.environ["MY_TOKEN"]
    """
    keep = allowed_environment(os.environ, extra_names)
    os.environ.clear()  # unsetenv each: the C environment no longer points into the initial block
    os.environ.update(keep)  # setenv each: fresh copies on the heap
    _wipe_initial_block()
