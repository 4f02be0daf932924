r"""The third-party scorers that read model text -- math-verify, reasoning-gym's ``score_answer`` -- run in the sandbox.

Both hand the completion's answer to code we do not control: reasoning-gym's scorers ``eval`` it or
``sympy.parse_expr`` it (nine datasets), math-verify parses it with SymPy. So neither ever runs on the
host with model text. Each runs in a :class:`~llmgym.sandbox.worker.SandboxWorker`: a sandbox (no
network, an unprivileged uid, rlimits, seccomp, a cleared environment, nothing of the host but
``/usr`` and -- read-only -- the ``site-packages`` the scorer imports from) in which a zygote imports
the library once and forks a fresh child per check; the child's answer comes back as JSON and is
checked here; a check over its time limit is killed with everything it started.

Two walls, in this order:

1. on the host, inputs that could lead to code execution never reach the scorer: answers of the
   reasoning-gym datasets that ``eval`` / ``parse_expr`` pass a strict grammar first
   (:mod:`llmgym.envs.math.answer_grammar`); math-verify's LaTeX parser builds SymPy objects without
   ``eval``, and its expression parser only ever sees digits and operators;
2. the sandbox, for whatever the first wall misses: a payload that ran code there could lie about
   its own check's score, and nothing else -- no file, no process, no state survives the check.

The gold answer (trusted data) is parsed once per worker -- in a throw-away fork of the zygote, killed
at the time limit like a check -- and shared by its checks.

Workers are per process and start on first use (math-verify ~1 s, reasoning-gym ~4 s; each holds
one uid of the sandbox's pool); a forked process starts its own. A worker that cannot start raises
:class:`~llmgym.sandbox.SandboxError` naming the cause -- never a silent 0.

Example:
    >>> from llmgym.envs.math.scorer_pools import math_verify_equal
    >>> math_verify_equal(r"\frac{1}{2}", "0.5", time_limit=10)
    (1.0, None)
"""

from __future__ import annotations

import math
from typing import Any

from llmgym.envs.math import math_verify_scorer, reasoning_gym_scorer
from llmgym.runtime.install import install_hint
from llmgym.sandbox import SandboxError
from llmgym.sandbox.killable import in_killable_child
from llmgym.sandbox.pool import DEFAULT_POOL_SIZE, WorkerPool, WorkerPools
from llmgym.sandbox.worker import SandboxWorker, site_packages
from llmgym.env.verifiers import VerifierUnavailableError

__all__ = ["ANSWER_FORMS", "DEFAULT_CONCURRENCY", "MATH_VERIFY_MAX_NUMBER_BITS", "MATH_VERIFY_WORKER", "REASONING_GYM_WORKER", "close_workers", "math_verify_equal", "reasoning_gym_score"]

_INSTALL = {
    "math_verify": f"{install_hint('math')} (or pip install math-verify)",
    "reasoning_gym": f"{install_hint('math')} (or pip install reasoning-gym)",
}

MATH_VERIFY_MAX_NUMBER_BITS = math_verify_scorer.MAX_NUMBER_BITS
"""Numbers beyond this many bits are refused before math-verify compares them (see the scorer module)."""
MATH_VERIFY_GOLD_PARSE_SECONDS = math_verify_scorer.GOLD_PARSE_SECONDS
"""A gold answer gets at least this long to parse."""


def _module_source(module: Any) -> str:
    """A worker module's text: the sandbox's zygote runs it (it does not import llmgym)."""
    with open(module.__file__, encoding="utf-8") as fh:
        return fh.read()


MATH_VERIFY_WORKER = _module_source(math_verify_scorer)
"""Worker source (runs in the sandbox): :mod:`llmgym.envs.math.math_verify_scorer`."""
REASONING_GYM_WORKER = _module_source(reasoning_gym_scorer)
"""Worker source (runs in the sandbox): :mod:`llmgym.envs.math.reasoning_gym_scorer`."""

#: The forms a question may ask an answer to be written in (see :func:`math_verify_equal`).
ANSWER_FORMS = ("lowest_terms", "decimal", "radical", "interval", "scientific", "exact", "normal")
#: The question's math spans read for echoes: at most this many, each cut to this many characters.
MAX_SPANS, MAX_SPAN_CHARS = 64, 1000

#: Workers of one kind that concurrent single checks may use (a slow check then holds up only its own).
DEFAULT_CONCURRENCY = DEFAULT_POOL_SIZE

_SOURCES = {"math_verify": MATH_VERIFY_WORKER, "reasoning_gym": REASONING_GYM_WORKER}


def _new_worker(module: str) -> SandboxWorker:
    try:
        paths = site_packages(module)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(f"the {module!r} scorer is not installed: {_INSTALL[module]}", name=module) from exc
    return SandboxWorker(
        _SOURCES[module],
        paths=paths,
        start_hint=f"The sandboxed scorer needs {module!r} importable from {paths} by the sandbox's "
        f"interpreter ({_INSTALL[module]}).",
    )


_pools = WorkerPools()


def _kind(module: str) -> WorkerPool:
    if in_killable_child() and module not in _pools:
        # a worker's start-up (seconds) would be counted in the wrapper's limit: every check would
        # time out, a silent 0 -- refuse, saying how to set the limit instead
        raise VerifierUnavailableError(
            f"the {module} scorer runs in a sandboxed worker, which it cannot start inside a child "
            "forked to enforce another verifier's time limit (e.g. WeightedSum(..., time_limit=...) or "
            "as_verifier(v, time_limit=...) around it): give the time limit to the math verifier itself "
            "(MathVerifier(time_limit=...), ReasoningGymVerifier(time_limit=...)) and none to the wrapper"
        )
    return _pools.get(module, lambda: _new_worker(module), DEFAULT_CONCURRENCY)


def close_workers() -> None:
    """Stop this process's idle scorer workers (they start again on the next check).

    Example:
        >>> from llmgym.envs.math.scorer_pools import close_workers
        >>> close_workers()
    """
    _pools.close()


def _outcome(status: str, value: Any, time_limit: float | None) -> tuple[str, Any]:
    if status == "timeout":
        return "error", f"timeout: verification took longer than {time_limit} s"
    return status, value


def math_verify_equal(
    gold: str,
    predicted: str,
    *,
    float_rounding: int = 6,
    numeric_precision: int = 15,
    strict: bool = True,
    time_limit: float | None = 5.0,
    question_spans: tuple[str, ...] = (),
    forms: tuple[str, ...] = (),
) -> tuple[float, str | None]:
    r"""``(reward, error)``: math-verify's verdict on ``predicted`` against ``gold`` (both LaTeX without
    ``$``), computed in the sandbox within ``time_limit`` seconds; 0.0 with the error when the check
    fails, times out or answers malformed. Concurrent callers share up to :data:`DEFAULT_CONCURRENCY`
    workers (each a sandbox holding the library, ~100-250 MB), started as they are needed.

    An answer equal to the reference is then read *as written* (math-verify's LaTeX normaliser and
    parser, SymPy's evaluation off, fractions of integers not reduced): it scores 0 with the reason if
    it is, as a tree, one of ``question_spans`` (the question's own math, or a side of an ``=`` in
    it) and not the reference, or if it is not written in each of ``forms`` that the reference itself
    is written in (:data:`ANSWER_FORMS`: ``"lowest_terms"``, ``"decimal"``, ``"radical"``,
    ``"interval"``, ``"scientific"``; and ``"exact"`` -- decimals that give exactly the reference's value --
    and ``"normal"`` -- a tree SymPy's evaluation leaves as it is -- which the reference sets by being so). Spelling does not matter (``\frac{\,3}{6}``, ``3/6``, ``\dfrac36`` are one tree;
    so are ``2^3 \cdot 3`` and ``3 \times 2^3``).

    Example:
        >>> from llmgym.envs.math.scorer_pools import math_verify_equal
        >>> math_verify_equal("x^2 + 2x + 1", "(x+1)^2", time_limit=10)
        (1.0, None)
    """
    with _kind("math_verify").lend() as worker:
        try:
            unknown = set(forms) - set(ANSWER_FORMS)
            if unknown:
                raise ValueError(f"unknown answer form(s) {sorted(unknown)}; known: {ANSWER_FORMS}")
            spans = tuple(str(s)[:MAX_SPAN_CHARS] for s in question_spans[:MAX_SPANS])
            status, value = worker.call((gold, (float_rounding, numeric_precision, strict), worker.limit(time_limit)),
                                        (predicted, spans, tuple(forms)), time_limit)
        except SandboxError as exc:  # only the trusted zygote reports this: no completion can forge it
            if math_verify_scorer.GOLD_UNUSABLE not in str(exc):
                raise
            reason = str(exc).split(math_verify_scorer.GOLD_UNUSABLE, 1)[1]
            raise VerifierUnavailableError(
                f"{reason}: the task's reference answer cannot be checked, so no completion can be scored "
                "against it (not even the right one). Fix or drop this row of the dataset") from None
    status, value = _outcome(status, value, time_limit)
    if status != "ok":
        return 0.0, value
    if (not isinstance(value, list) or len(value) != 2 or value[0] not in (0.0, 1.0)
            or not (value[1] is None or isinstance(value[1], str))):
        return 0.0, "malformed verdict from the sandbox"
    return float(value[0]), value[1]


def reasoning_gym_score(
    dataset: str,
    config: dict[str, Any],
    seed: int,
    entry: dict[str, Any],
    answer: str,
    *,
    time_limit: float | None = 5.0,
) -> tuple[float, str | None]:
    """``(score, error)``: reasoning-gym's ``score_answer(answer, entry)`` for the dataset built from
    ``(dataset, config, seed)``, computed in the sandbox within ``time_limit`` seconds; 0.0 with the
    error when the scorer raises, times out, or answers anything but a finite number in [0, 1].

    Example:
        >>> from llmgym.envs.math.reasoning import reasoning_gym_task
        >>> from llmgym.envs.math.scorer_pools import reasoning_gym_score
        >>> task = reasoning_gym_task("chain_sum", seed=1)
        >>> meta = task.metadata
        >>> reasoning_gym_score("chain_sum", {}, meta["seed"], meta["entry"], task.answer, time_limit=10)
        (1.0, None)
    """
    with _kind("reasoning_gym").lend() as worker:
        status, value = worker.call((dataset, dict(config), int(seed)), (answer, entry), time_limit)
    status, value = _outcome(status, value, time_limit)
    if status != "ok":
        return 0.0, value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0, "malformed score from the sandbox"
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        return 0.0, f"the scorer returned {value!r}, not a number in [0, 1]: scored 0"
    return float(value), None
