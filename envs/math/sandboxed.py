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
    >>> from llmgym.envs.math.sandboxed import math_verify_equal
    >>> math_verify_equal(r"\frac{1}{2}", "0.5", time_limit=10)
    (1.0, None)
"""

from __future__ import annotations

import math
from typing import Any

from llmgym.sandbox.pool import DEFAULT_POOL_SIZE, WorkerPool, WorkerPools
from llmgym.sandbox import SandboxError
from llmgym.sandbox.worker import SandboxWorker, site_packages
from llmgym.verifiers import VerifierUnavailableError, in_time_limited_child

__all__ = ["DEFAULT_CONCURRENCY", "MATH_VERIFY_MAX_NUMBER_BITS", "MATH_VERIFY_WORKER", "REASONING_GYM_WORKER", "close_workers", "math_verify_equal", "reasoning_gym_score"]

_INSTALL = {
    "math_verify": "pip install 'llmgym[math]' (or pip install math-verify)",
    "reasoning_gym": "pip install 'llmgym[math]' (or pip install reasoning-gym)",
}

#: Numbers beyond this many bits are refused before math-verify compares them: SymPy would compute
#: 9^{9^{9}} (~1.2e9 bits) exactly, in C, for minutes. 2^20 bits (~315,000 digits) is far beyond
#: any real answer and still quick to handle.
MATH_VERIFY_MAX_NUMBER_BITS = 1 << 20

#: A gold answer gets at least this long to parse (it is trusted, and one that fails makes the step
#: raise: a check's short time limit on a loaded machine must not stop a run).
MATH_VERIFY_GOLD_PARSE_SECONDS = 20.0
_GOLD_UNUSABLE = "gold answer unusable: "  # the zygote's prepare() error that means the task's gold, not a check

#: Worker source (runs in the sandbox): math-verify's parse and comparison, without its signal-based
#: time-out (the sandbox kills the check).
MATH_VERIFY_WORKER = r'''
import logging, math

MAX_NUMBER_BITS = __MAX_NUMBER_BITS__
GOLD_PARSE_SECONDS = __GOLD_PARSE_SECONDS__
GOLD_UNUSABLE = "__GOLD_UNUSABLE__"
mv = None
_golds = {}

class _DropDisabledTimeoutWarning(logging.Filter):
    def filter(self, record):  # parsing_timeout=None is on purpose: the sandbox enforces the limit
        return not record.getMessage().startswith("Timeout is disabled")

def setup():
    global mv
    import math_verify
    mv = math_verify
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropDisabledTimeoutWarning())
    # Import SymPy's lazy parts (simplification, sets, relations, ...) here, once, in the zygote:
    # each check's child would otherwise import them again.
    for gold, predicted in (("1", "2"), ("x^2 + 2x + 1", "(x+1)^2"), ("\\sqrt{2}", "2^{1/2}"),
                            ("\\frac{1}{3}", "0.333333"), ("\\{1, 2\\}", "(1, 2)"), ("[0, 1)", "(0, 1]"),
                            ("x = 3", "3"), ("10\\%", "0.1"), ("\\sin(x)^2 + \\cos(x)^2", "1"),
                            ("\\begin{pmatrix} 1 & 2 \\end{pmatrix}", "\\pi"), ("x < 2", "(-\\infty, 2)")):
        mv.verify(_parse(gold), _parse(predicted), timeout_seconds=None)

def _parse(candidate):
    parsed = mv.parse("$" + candidate + "$", parsing_timeout=None)
    if not parsed:
        parsed = mv.parse(candidate, parsing_timeout=None)
    return list(parsed)

def _log2_size(expr):
    # an upper bound on log2 of the magnitude of expr's numbers (inf when astronomical)
    if getattr(expr, "is_Integer", False):
        return float(abs(int(expr)).bit_length())
    if getattr(expr, "is_Rational", False):
        return float(max(abs(int(expr.p)).bit_length(), int(expr.q).bit_length()))
    if getattr(expr, "is_Float", False):
        value = abs(float(expr))
        return math.log2(value + 1.0) if math.isfinite(value) else math.inf
    args = getattr(expr, "args", ())
    if not args:
        return 0.0
    name = type(expr).__name__
    if getattr(expr, "is_Pow", False):
        base, exponent = _log2_size(args[0]), _log2_size(args[1])
        if base == 0.0:
            return 0.0
        return math.inf if exponent > 60 else base * 2.0 ** exponent
    if name in ("factorial", "factorial2", "subfactorial", "binomial", "gamma", "RisingFactorial", "FallingFactorial"):
        n_bits = max(_log2_size(a) for a in args)
        return math.inf if n_bits > 60 else 2.0 ** n_bits * n_bits
    return sum(_log2_size(a) for a in args)

def _too_large(parsed):
    return any(not isinstance(p, str) and _log2_size(p) > MAX_NUMBER_BITS for p in parsed)

def _parse_gold(gold, limit):
    # In a throw-away fork of the zygote, killed at the limit: a gold SymPy takes forever to parse must
    # not hang the zygote. Trusted data only (the dataset's answer), so its pickle may come back.
    import os, pickle, select, time
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            parsed = _parse(gold)
            out = (parsed, None if parsed else "the gold answer %r could not be parsed" % gold)
        except Exception as e:
            out = ([], "the gold answer %r could not be parsed (%s)" % (gold, type(e).__name__))
        data = memoryview(pickle.dumps(out))
        while data:
            data = data[os.write(write, data):]
        os._exit(0)
    os.close(write)
    buf, deadline = b"", time.monotonic() + limit
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([read], [], [], left)[0]:
            buf = None
            break
        chunk = os.read(read, 1 << 16)
        if not chunk:
            break
        buf += chunk
    os.close(read)
    if buf is None:
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    if buf is None:
        return None
    return pickle.loads(buf)

def prepare(context):  # in the zygote, on trusted data: the gold answer, parsed once
    gold, settings, limit = context
    if gold not in _golds:
        # trusted data, and a gold that fails makes the step raise: a loaded machine gets time
        parsed = _parse_gold(gold, max(limit, GOLD_PARSE_SECONDS))
        if parsed is None:  # not cached: a loaded machine may do it next time
            raise ValueError(GOLD_UNUSABLE + "parsing the gold answer took longer than %s s" % max(limit, GOLD_PARSE_SECONDS))
        if len(_golds) >= 4096:
            _golds.clear()
        _golds[gold] = parsed
    gold_parsed, error = _golds[gold]
    if error is not None:  # raised here, in the trusted zygote: a check's child could forge anything it sends
        raise ValueError(GOLD_UNUSABLE + error)
    return gold_parsed, settings

def handle(state, predicted):  # in the check's child: model text
    gold_parsed, (float_rounding, numeric_precision, strict) = state
    parsed = _parse(predicted)
    if not parsed:
        return [0.0, None]
    for side, p in (("gold answer", gold_parsed), ("answer", parsed)):
        if _too_large(p):
            return [0.0, "the %s holds a number over %d bits: not compared" % (side, MAX_NUMBER_BITS)]
    equal = mv.verify(gold_parsed, parsed, float_rounding=float_rounding, numeric_precision=numeric_precision,
                      strict=strict, timeout_seconds=None)
    return [1.0 if equal else 0.0, None]
'''

#: Worker source (runs in the sandbox): a reasoning-gym dataset's own ``score_answer(answer, entry)``.
#: The dataset object is built in the zygote from trusted data (name, configuration, seed) and kept:
#: scorers read only its configuration and loaded data, never its seed.
REASONING_GYM_WORKER = r'''
reasoning_gym = None
_datasets = {}

def setup():
    global reasoning_gym
    import reasoning_gym
    import sympy
    sympy.simplify(sympy.parse_expr("x**2 - x*x"))  # import SymPy's lazy parts now, not per check

def prepare(context):  # in the zygote, on trusted data
    name, config, seed = context
    key = (name, repr(sorted(config.items())))
    if key not in _datasets:
        if len(_datasets) >= 64:
            _datasets.clear()
        _datasets[key] = reasoning_gym.create_dataset(name, size=1, seed=seed, **config)
    return _datasets[key]

def handle(dataset, request):  # in the check's child: model text
    answer, entry = request
    return float(dataset.score_answer(answer, entry) or 0.0)
'''

MATH_VERIFY_WORKER = MATH_VERIFY_WORKER.replace("__MAX_NUMBER_BITS__", str(MATH_VERIFY_MAX_NUMBER_BITS)).replace(
    "__GOLD_PARSE_SECONDS__", repr(MATH_VERIFY_GOLD_PARSE_SECONDS)).replace("__GOLD_UNUSABLE__", _GOLD_UNUSABLE)

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
    if in_time_limited_child() and module not in _pools:
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
        >>> from llmgym.envs.math.sandboxed import close_workers
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
) -> tuple[float, str | None]:
    r"""``(reward, error)``: math-verify's verdict on ``predicted`` against ``gold`` (both LaTeX without
    ``$``), computed in the sandbox within ``time_limit`` seconds; 0.0 with the error when the check
    fails, times out or answers malformed. Concurrent callers share up to :data:`DEFAULT_CONCURRENCY`
    workers (each a sandbox holding the library, ~100-250 MB), started as they are needed.

    Example:
        >>> from llmgym.envs.math.sandboxed import math_verify_equal
        >>> math_verify_equal("x^2 + 2x + 1", "(x+1)^2", time_limit=10)
        (1.0, None)
    """
    with _kind("math_verify").lend() as worker:
        try:
            status, value = worker.call((gold, (float_rounding, numeric_precision, strict), worker.limit(time_limit)),
                                        predicted, time_limit)
        except SandboxError as exc:  # only the trusted zygote reports this: no completion can forge it
            if _GOLD_UNUSABLE not in str(exc):
                raise
            reason = str(exc).split(_GOLD_UNUSABLE, 1)[1]
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
        >>> from llmgym.envs.math.sandboxed import reasoning_gym_score
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
