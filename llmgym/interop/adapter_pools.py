"""The interop adapters' sandbox, host side: what goes in (a payload), who runs it (pooled workers), what comes back.

Third-party code that reads model text -- a verifiers taskset's reward functions, a verifiers ``Env.run()``,
a TextArena game and its opponent -- runs in :class:`~llmgym.sandbox.worker.SandboxWorker`\\ s whose source is
:mod:`llmgym.interop.in_sandbox`: no network, an unprivileged uid, rlimits, seccomp, a cleared environment,
nothing of the host but ``/usr``, the ``site-packages`` and -- read-only -- the directories of the user's own
modules. One call, one fresh child, killed at its time limit with everything it started; only JSON comes
back, checked here.

**Payloads.** The user's objects (the verifiers task or env, the opponent) are trusted data: they are
pickled here with ``cloudpickle`` -- by reference where their module is a file the sandbox can import (its
directory is then bound read-only), by value where it is not (a class defined in ``__main__``, in a notebook,
in a function, in a module made in memory, or in one that imports llmgym, which the sandbox does not have) --
and unpickled once per worker, in its zygote. Nothing re-imports the user's ``__main__``.
A module directory the sandbox's uid cannot read (under ``/root``, mode 700) is refused here, naming the fix.

**Failures.** A call that times out, crashes or answers malformed is the completion's: 0 with the error.
A worker that cannot start or cannot load the payload, a missing sandbox
(:class:`~llmgym.sandbox.SandboxUnavailableError`; the one opt-out is the sandbox's own,
``LLMGYM_ALLOW_UNSANDBOXED=1``), and an import that fails inside a check *and* again on a reference input
(see :func:`reference_check`) are the verifier's: raised, never a silent 0.

Example:
    >>> from llmgym.interop.adapter_pools import failure, make_payload, run
    >>> game = {"op": "textarena", "env_id": "GuessTheNumber-v0", "num_players": 1, "player_id": 0, "opponent": None}
    >>> payload = make_payload("textarena", game)
    >>> request = {"seed": 3, "opening": "not its opening", "completions": [], "replies": [], "max_turns": 4}
    >>> failure(*run(payload, request, time_limit=30), 30)["not_reproducible"]  # the replay checks, and says so
    True
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import io
import os
import pickle
import sys
import threading
import types
from typing import Any

from llmgym.errors import LLMGymError
from llmgym.runtime.install import install_hint

import llmgym.interop.in_sandbox as in_sandbox
from llmgym.sandbox import SandboxError
from llmgym.sandbox.killable import in_killable_child
from llmgym.sandbox.mounts import world_readable
from llmgym.sandbox.pool import DEFAULT_POOL_SIZE, WorkerPool, WorkerPools
from llmgym.sandbox.worker import WORKER_LIMITS, SandboxWorker, site_packages
from llmgym.env.verifiers import VerifierUnavailableError

__all__ = ["INTEROP_LIMITS", "EpisodeError", "Payload", "check_available", "close_workers", "failure", "make_payload",
           "reference_check", "run"]

INTEROP_LIMITS = dataclasses.replace(WORKER_LIMITS, max_output_kb=2048)
"""Limits of each call: :data:`~llmgym.sandbox.worker.WORKER_LIMITS`, with room for an episode's reply."""

_PACKAGES = {"verifiers": "verifiers", "textarena": "textarena"}
_INSTALL = {"verifiers": install_hint("verifiers"), "textarena": install_hint("textarena")}


class EpisodeError(LLMGymError, RuntimeError):
    """An episode's call failed (the env's code raised, timed out, crashed or sent bad data): the completion's 0."""


@dataclasses.dataclass(frozen=True)
class Payload:
    """Trusted objects pickled for the sandbox, and the directories their modules need bound."""

    kind: str
    """``"verifiers"`` or ``"textarena"``: which package the worker's zygote imports."""
    key: str
    """The pickle's digest: the zygote unpickles each payload once."""
    blob: bytes = dataclasses.field(repr=False)
    paths: tuple[str, ...]
    """Directories of the user's modules, bound read-only (site-packages are bound anyway)."""


# ------------------------------------------------------------------------------------------------
# payloads


class _Recorder(pickle.Unpickler):
    """Unpickles, noting every module the pickle imports (classes by reference, and cloudpickle's module globals)."""

    def __init__(self, data: bytes):
        super().__init__(io.BytesIO(data))
        self.modules: set[str] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.modules.add(module)
        found = super().find_class(module, name)
        if module.startswith("cloudpickle") and name == "subimport":
            def subimport(module_name: str, _real=found) -> Any:
                self.modules.add(module_name)
                return _real(module_name)
            return subimport
        return found


def _referenced_modules(blob: bytes) -> set[str]:
    recorder = _Recorder(blob)
    recorder.load()
    return recorder.modules


def _loadable_in_the_sandbox(name: str) -> bool:
    """Whether the sandbox can import module ``name`` as this process did: from a file (or built in), and
    without llmgym, which it does not have."""
    top = name.partition(".")[0]
    if top in sys.builtin_module_names or top in sys.stdlib_module_names or top == "llmgym":
        return True  # llmgym's own: refused apart (make_payload), never pickled by value
    module = sys.modules.get(name)
    if module is not None and any(_is_llmgym(value) for value in list(vars(module).values())):
        return False  # a test file, a user's script: it imports llmgym, which the sandbox cannot
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):  # made in memory (types.ModuleType): nothing on disk to bind
        return False
    return spec is not None and (spec.origin not in (None, "namespace") or bool(spec.submodule_search_locations))


def _is_llmgym(value: Any) -> bool:
    name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
    return isinstance(name, str) and name.partition(".")[0] == "llmgym" and name != in_sandbox.MODULE


def _pickled(obj: Any) -> tuple[bytes, set[str]]:
    """``cloudpickle`` of ``obj``, and the modules it imports. Classes and functions of a module the sandbox
    cannot import (made in memory, or importing llmgym) are pickled by value."""
    import cloudpickle

    registered: list[Any] = []
    try:
        for _ in range(8):
            blob = cloudpickle.dumps(obj, protocol=pickle.DEFAULT_PROTOCOL)
            modules = _referenced_modules(blob)
            by_value = sorted(m for m in modules if m in sys.modules and not _loadable_in_the_sandbox(m))
            if not by_value:
                return blob, modules
            for name in by_value:
                cloudpickle.register_pickle_by_value(sys.modules[name])
                registered.append(sys.modules[name])
        raise ValueError(f"cannot pickle {type(obj).__name__} for the sandbox: modules {by_value} keep coming back")
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)


def _module_directory(name: str) -> str | None:
    """The directory that must be on ``sys.path`` for ``name``'s top-level package (``None``: the stdlib)."""
    top = name.partition(".")[0]
    if top in sys.builtin_module_names or top in sys.stdlib_module_names:
        return None
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise ModuleNotFoundError(f"no module named {top!r}", name=top)
    if spec.submodule_search_locations:  # a package: its parent
        return os.path.dirname(os.path.realpath(list(spec.submodule_search_locations)[0]))
    return os.path.dirname(os.path.realpath(spec.origin))


def make_payload(kind: str, spec: dict[str, Any]) -> Payload:
    """``spec`` (trusted objects) pickled for a ``kind`` worker, with the directories its modules need.

    Raises:
        ValueError: ``spec`` refers to llmgym itself (not importable in the sandbox).
        SandboxError: a module lives where the sandbox's unprivileged uid cannot read it (the fix is named).
    """
    if kind not in _PACKAGES:
        raise ValueError(f"kind must be one of {sorted(_PACKAGES)}, got {kind!r}")
    blob, modules = _pickled(spec)
    ours = sorted(m for m in modules if m.partition(".")[0] == "llmgym" and m != in_sandbox.MODULE)
    if ours:
        raise ValueError(f"what runs in the sandbox refers to {ours}, which it cannot import (llmgym itself is not "
                         f"in the sandbox): keep your env's reward functions, run() and opponent to your own "
                         f"modules and their dependencies")
    paths = []
    for name in sorted(modules):
        directory = _module_directory(name)
        if directory is None or directory in paths or directory == "/usr" or directory.startswith("/usr/"):
            continue
        if not world_readable(directory):
            raise SandboxError(
                f"module {name!r} lives in {directory}, which the sandbox's unprivileged uid cannot read (a "
                f"directory on the way is not world-readable, e.g. /root is mode 700). Fix: move the module (or "
                f"the venv) where every user can read it (e.g. /opt or a project folder), or `chmod o+rx` each "
                f"directory on the way to {directory}.")
        paths.append(directory)
    return Payload(kind, hashlib.sha256(blob).hexdigest(), blob, tuple(paths))


# ------------------------------------------------------------------------------------------------
# workers

_pools = WorkerPools()
_keys: set[tuple[str, tuple[str, ...]]] = set()
_keys_lock = threading.Lock()


@functools.cache
def _source() -> str:
    with open(in_sandbox.__file__, encoding="utf-8") as fh:
        return fh.read()


def _worker(kind: str, user_paths: tuple[str, ...]) -> SandboxWorker:
    package = _PACKAGES[kind]
    try:
        paths = site_packages(package, "cloudpickle")
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(f"the {kind} adapter needs {exc.name!r}: {_INSTALL[kind]}", name=exc.name) from exc
    order = {os.path.realpath(p): i for i, p in reversed(list(enumerate(sys.path))) if p}
    every = list(dict.fromkeys([*paths, *user_paths]))
    every.sort(key=lambda p: order.get(p, len(order)))  # as this process finds them
    return SandboxWorker(
        _source(), paths=every, limits=INTEROP_LIMITS, env={in_sandbox.KIND_ENV: kind},
        start_hint=f"The {kind} adapter's sandbox needs {package!r} and cloudpickle importable from {every} by the "
                   f"sandbox's interpreter ({_INSTALL[kind]}).",
    )


def _pool(payload: Payload) -> WorkerPool:
    key = (payload.kind, payload.paths)
    with _keys_lock:  # a worker that binds every directory the payload needs will do (each start costs seconds)
        key = next((k for k in _keys if k[0] == payload.kind and set(payload.paths) <= set(k[1])), key)
        _keys.add(key)
    if in_killable_child() and key not in _pools:
        # the worker's start-up (seconds) would be counted in the wrapper's time limit: every check would time
        # out, a silent 0 -- refuse, saying how to set the limit instead
        raise VerifierUnavailableError(
            f"the {payload.kind} adapter runs its code in a sandboxed worker, which it cannot start inside a child "
            "forked to enforce another verifier's time limit (a WeightedSum(..., time_limit=...) or "
            "as_verifier(v, time_limit=...) around it): give the time limit to the adapter (time_limit=) instead")
    return _pools.get(key, lambda: _worker(payload.kind, payload.paths), DEFAULT_POOL_SIZE)


def check_available(payload: Payload) -> None:
    """Raise now what a call would raise first: the sandbox missing (:class:`~llmgym.sandbox.SandboxUnavailableError`),
    the package missing (``ModuleNotFoundError``). Starts nothing."""
    with _pool(payload).lend():
        pass


def run(payload: Payload, request: Any, time_limit: float | None) -> tuple[str, Any]:
    """``handle(payload, request)`` in a fresh sandboxed child: ``("ok", answer)``, ``("error", message)``
    or ``("timeout", None)`` (see :meth:`~llmgym.sandbox.worker.SandboxWorker.call`); the answer is
    unchecked JSON. A worker that cannot start or load the payload raises :class:`~llmgym.sandbox.SandboxError`."""
    with _pool(payload).lend() as worker:
        try:
            return worker.call((payload.key, payload.blob), request, time_limit)
        except SandboxError as exc:
            raise SandboxError(
                f"{exc}\nThe {payload.kind} adapter's sandbox loads your env from {list(payload.paths) or 'its pickle'} "
                f"and site-packages: every module it imports must be importable there by an unprivileged user."
            ) from exc


def failure(status: str, answer: Any, time_limit: float | None) -> dict[str, Any] | None:
    """The call's failure as ``{"error", "import_error", "not_reproducible"}``, or ``None`` if it answered.

    A malformed ``"failed"`` is a failure too (its text is what the child wrote: a claim, never trusted).
    """
    if status == "timeout":
        limit = INTEROP_LIMITS.wall_seconds if time_limit is None else time_limit
        return {"error": f"timeout: took longer than {limit} s (killed)", "import_error": None, "not_reproducible": False}
    if status != "ok":
        return {"error": str(answer)[:2000], "import_error": None, "not_reproducible": False}
    if not isinstance(answer, dict) or len(answer) != 1:
        return {"error": "malformed answer from the sandbox", "import_error": None, "not_reproducible": False}
    failed = answer.get("failed")
    if failed is None:
        return None
    if not isinstance(failed, dict):
        return {"error": "malformed answer from the sandbox", "import_error": None, "not_reproducible": False}
    missing = failed.get("import_error")
    return {"error": str(failed.get("error", ""))[:2000], "import_error": str(missing)[:200] if missing else None,
            "not_reproducible": failed.get("not_reproducible") is True}


def reference_check(payload: Payload, request: Any, time_limit: float | None, failed: dict[str, Any], what: str) -> None:
    """Raise :class:`~llmgym.env.verifiers.VerifierUnavailableError` if an import that failed on model text fails on
    ``request`` too -- a reference input, no model text: the code cannot run here, whatever it is given.

    A child's "import failed" is only a claim (code the completion ran could make it); a verdict that stops the
    run must not rest on it, so the same call runs again on trusted input first.
    """
    again = failure(*run(payload, request, time_limit), time_limit)
    if again is not None and again["import_error"]:
        raise VerifierUnavailableError(
            f"{what} cannot run in the sandbox: {again['error']} -- on a reference input too, so not the "
            f"completion's doing. The sandbox imports from site-packages and {list(payload.paths) or 'nothing else'} "
            f"(read-only, as an unprivileged user): install the module where every user can read it, or import it "
            f"at the top of your env's module (its directory is bound).")


def close_workers() -> None:
    """Stop this process's idle interop workers (they start again on the next call).

    Example:
        >>> from llmgym.interop.adapter_pools import close_workers
        >>> close_workers()
    """
    _pools.close()
