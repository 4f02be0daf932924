"""Every offline ``reasoning-gym`` dataset as an env, ``llmgym/RG-<dataset>-v0``, scored by its own ``score_answer``.

Items are generated lazily, one per reset: the env's seeded generator draws a seed, and the item is
``reasoning_gym.create_dataset(name, size=1, seed=seed, **config)[0]`` — never a pre-built list
(some datasets take seconds per thousand items, and a few build time grows with ``size``). Recent
items are cached per process by ``(dataset, config, seed)``, so a group of resets with the same seed
(and ``gymnasium``'s env checker) pays once. Same seed, same item. A generator that finds no item for
a seed (``word_ladder`` can run out of word pairs) is retried with a seed derived from it.

The answer handed to the dataset's ``score_answer`` is what reasoning-gym's own
``reasoning_gym.utils.extract_answer`` returns: the content of the completion's last closed
``<answer>…</answer>`` block (tags in lower case), stripped. A completion without one has no answer
(``None``) and scores what ``score_answer(None, entry)`` gives (0; 0.01 for a few datasets), exactly
as in reasoning-gym. ``lenient=True`` (off by default) also accepts an unclosed last tag, tags in any
case, and — with no tag at all — the whole completion: llmgym's extra leniency, not reasoning-gym's
convention, so rewards then differ from reasoning-gym's.

Datasets with several valid answers (``boxnet``, ``graph_color``, ``propositional_logic``,
``rubiks_cube``, ``rush_hour``) store no single answer (``task.answer`` is ``None``); their
``score_answer`` checks a proposed solution itself.

Reproducibility: a few generators (:data:`HASH_SEED_DEPENDENT`) iterate over Python sets of strings,
whose order changes with Python's per-process hash randomisation: the same seed gives a different
item in another process unless ``PYTHONHASHSEED`` is fixed (run with ``PYTHONHASHSEED=0``). Making
one of these envs without it warns once. ``list_functions`` draws some items from the global
``random`` module; it is seeded from the item's seed around each draw, so its items are reproducible.
"""

from __future__ import annotations

import collections
import copy
import functools
import os
import random
import re
import threading
import warnings
from typing import Any

import numpy as np

from llmgym import Score, SequenceEnv, Task, Verifier
from llmgym.envs.math import rg_guards
from llmgym.envs.math.answer_grammar import check_answer
from llmgym.envs.math.scorer_pools import reasoning_gym_score
from llmgym.runtime.install import install_hint

__all__ = [
    "ANSWER_INSTRUCTION",
    "ANSWER_SHARE_CAP",
    "CAPPED_FAMILIES",
    "CONTENT_FREE_CHANCE",
    "PILOT_ITEMS",
    "answer_in_prompt",
    "answer_values",
    "CHOICE_FAMILIES",
    "item_chance",
    "content_free_chance",
    "prompt_segments",
    "HASH_SEED_DEPENDENT",
    "LABELLED_FAMILIES",
    "MAX_ANSWER_CHARS",
    "REUSABLE_DATASETS",
    "extract_tagged_answer",
    "reasoning_gym_datasets",
    "reasoning_gym_task",
    "ReasoningGymVerifier",
    "make_env",
    "upstream_score",
]

ANSWER_INSTRUCTION = "Give your final answer inside <answer></answer> tags."

_CACHE_SIZE = 512
_ATTEMPTS, _RETRY_STRIDE = 5, 7919
_cache: collections.OrderedDict[tuple, tuple[Any, dict]] = collections.OrderedDict()
_cache_lock = threading.Lock()
_OPEN, _CLOSE = "<answer>", "</answer>"
_OPEN_ANY_CASE = re.compile(re.escape(_OPEN), re.IGNORECASE)
_CLOSE_ANY_CASE = re.compile(re.escape(_CLOSE), re.IGNORECASE)


def _rg() -> Any:
    try:
        import reasoning_gym
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"reasoning-gym envs need the 'reasoning-gym' package: {install_hint('math')} "
            "(or pip install reasoning-gym)"
        ) from exc
    return reasoning_gym


def reasoning_gym_datasets() -> list[str]:
    """Names of the datasets the installed ``reasoning_gym`` registers (offline or not).

    Example:
        >>> from llmgym.envs.math.reasoning import reasoning_gym_datasets
        >>> "basic_arithmetic" in reasoning_gym_datasets()
        True
    """
    _rg()
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _find(text: str, tag: str, start: int, any_case: bool) -> int:
    """Index of the first ``tag`` at or after ``start`` (−1 if none); a literal search, linear."""
    if not any_case:
        return text.find(tag, start)
    found = (_OPEN_ANY_CASE if tag == _OPEN else _CLOSE_ANY_CASE).search(text, start)
    return found.start() if found else -1


def extract_tagged_answer(completion: str, lenient: bool = False) -> str | None:
    """The answer in a completion, as reasoning-gym's own ``reasoning_gym.utils.extract_answer``.

    The content of the last closed ``<answer>…</answer>`` block (tags in lower case), stripped;
    ``None`` when there is none. Blocks are paired as reasoning-gym's non-overlapping left-to-right
    regex scan pairs them (each opening tag with the first closing tag after it; the scan resumes
    after that closing tag), but found with literal substring search: linear time on any input.

    ``lenient=True`` is llmgym's extra leniency (not reasoning-gym's): tags in any case, an unclosed
    last tag runs to the end, and a completion without any opening tag is the answer as a whole.

    Example:
        >>> from llmgym.envs.math.reasoning import extract_tagged_answer
        >>> extract_tagged_answer("<think>hmm</think><answer> 42 </answer>")
        '42'
        >>> extract_tagged_answer(" 42\\n") is None  # no tags: no answer, as in reasoning-gym
        True
        >>> extract_tagged_answer(" 42\\n", lenient=True), extract_tagged_answer("<ANSWER>7", lenient=True)
        ('42', '7')
    """
    answer, pos = None, 0
    while True:
        opened = _find(completion, _OPEN, pos, lenient)
        if opened < 0:
            break
        start = opened + len(_OPEN)
        closed = _find(completion, _CLOSE, start, lenient)
        if closed < 0:
            if lenient:  # an unclosed last tag runs to the end
                answer = completion[start:]
            break
        answer, pos = completion[start:closed], closed + len(_CLOSE)
    if answer is None:  # no opening tag at all
        return completion.strip() if lenient else None
    return answer.strip()


# Datasets whose constructor loads a data file (0.1-0.3 s) and does not depend on the seed, and whose
# items depend only on ``self.seed`` (``Random(self.seed + idx)``): one loaded instance is copied and
# re-seeded instead of loading the file at every draw. A test checks this against fresh instances.
REUSABLE_DATASETS = frozenset({"arc_agi", "codeio", "figlet_font", "group_anagrams", "word_ladder"})
_templates: dict[tuple[str, str], Any] = {}


# Datasets whose items for a seed depend on Python's string-hash randomisation (they iterate over sets
# of strings): reproducible across processes only with a fixed PYTHONHASHSEED. A test generates every
# dataset's first item under two hash seeds and checks that exactly these differ.
HASH_SEED_DEPENDENT = frozenset(
    {"isomorphic_strings", "knight_swap", "polynomial_multiplication", "ransom_note", "word_ladder"}
)
# Datasets that draw from the global ``random`` module: seeded from the item's seed around each draw.
_GLOBAL_RANDOM_DATASETS = frozenset({"list_functions"})
_global_random_lock = threading.Lock()
_warned_hash_seed: set[str] = set()


def _warn_if_hash_seed_dependent(dataset: str) -> None:
    """Warn once per dataset if its items depend on hash randomisation and ``PYTHONHASHSEED`` is not fixed."""
    if dataset not in HASH_SEED_DEPENDENT or dataset in _warned_hash_seed:
        return
    if os.environ.get("PYTHONHASHSEED", "random") != "random":
        return
    _warned_hash_seed.add(dataset)
    warnings.warn(
        f"reasoning-gym {dataset!r} items depend on Python's hash randomisation: the same seed gives a "
        f"different task in another process. Run with PYTHONHASHSEED=0 (set before Python starts) for "
        f"reproducible tasks.",
        RuntimeWarning,
        stacklevel=3,
    )


def _config_key(config: dict[str, Any]) -> str:
    return repr(sorted(config.items()))


def _build(dataset: str, config: dict[str, Any], seed: int) -> Any:
    """A size-1 dataset object for ``seed``."""
    if dataset not in REUSABLE_DATASETS:
        return _rg().create_dataset(dataset, size=1, seed=seed, **config)
    key = (dataset, _config_key(config))
    with _cache_lock:
        template = _templates.get(key)
    if template is None:
        template = _rg().create_dataset(dataset, size=1, seed=0, **config)
        with _cache_lock:
            _templates[key] = template
    ds = copy.copy(template)  # shares the loaded (read-only) data
    ds.seed = seed
    return ds


def _item(dataset: str, config: dict[str, Any], seed: int) -> tuple[Any, dict]:
    """``(dataset object, item)`` for one seed, through the per-process cache."""
    key = (dataset, _config_key(config), seed)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    ds = _build(dataset, config, seed)
    if dataset in _GLOBAL_RANDOM_DATASETS:
        with _global_random_lock:
            state = random.getstate()
            random.seed(seed)
            try:
                entry = ds[0]
            finally:
                random.setstate(state)
    else:
        entry = ds[0]
    with _cache_lock:
        _cache[key] = (ds, entry)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return ds, entry


def _scorer(dataset: str, config: dict[str, Any], seed: int) -> Any:
    """The dataset object whose ``score_answer`` judges an item (cached one, else a fresh size-1 one)."""
    with _cache_lock:
        cached = _cache.get((dataset, _config_key(config), seed))
    if cached is not None:
        return cached[0]
    return _build(dataset, config, seed)


def reasoning_gym_task(
    dataset: str, seed: int, config: dict[str, Any] | None = None, instruction: str | None = ANSWER_INSTRUCTION
) -> Task:
    """The item of ``dataset`` for ``seed`` as a :class:`~llmgym.Task` (the raw entry in ``metadata``).

    Example:
        >>> from llmgym.envs.math.reasoning import reasoning_gym_task
        >>> task = reasoning_gym_task("basic_arithmetic", seed=7)
        >>> task.id, task.metadata["entry"]["answer"] == task.answer
        ('basic_arithmetic/7', True)
    """
    config = dict(config or {})
    for attempt in range(_ATTEMPTS):
        try:
            _, entry = _item(dataset, config, seed)
            break
        except (IndexError, RuntimeError):  # a generator that found no valid item for this seed
            if attempt == _ATTEMPTS - 1:
                raise
            seed = (seed + _RETRY_STRIDE) % (2**31 - 1)  # deterministic: same seed, same retries
    question = entry["question"]
    prompt = f"{question}\n\n{instruction}" if instruction else question
    return Task(
        prompt,
        answer=entry.get("answer"),
        metadata={"dataset": dataset, "seed": seed, "config": config, "entry": entry},
        id=f"{dataset}/{seed}",
    )


#: Longest answer (characters) handed to a dataset's scorer; a longer one scores 0 unread.
MAX_ANSWER_CHARS = 65_536


def upstream_score(
    task: Task, answer: str | None, *, time_limit: float | None = 5.0
) -> tuple[float, str | None]:
    """``(score, error)``: the dataset's own ``score_answer(answer, entry)`` for a reasoning-gym task.

    Model text never reaches reasoning-gym's code on the host. A ``None`` answer (nothing extracted)
    is scored here -- no model text is involved. Any other answer is checked against its dataset's
    grammar where the scorer would ``eval`` or ``sympy.parse_expr`` it
    (:func:`llmgym.envs.math.answer_grammar.check_answer`; outside it, the answer is never read: it
    scores what the dataset gives an empty answer -- its floor, 0.0 or 0.01 -- and the error says
    why), then scored in the sandbox (:func:`llmgym.envs.math.scorer_pools.reasoning_gym_score`), killed after
    ``time_limit`` seconds (``None``: the sandbox worker's limit). A score that is not a finite
    number in [0, 1], an exception or a time-out is 0.0 with the error. An answer over
    :data:`MAX_ANSWER_CHARS` characters is not read either (the floor, with the error).

    Example:
        >>> from llmgym.envs.math.reasoning import reasoning_gym_task, upstream_score
        >>> task = reasoning_gym_task("countdown", seed=3)
        >>> upstream_score(task, task.metadata["entry"]["metadata"]["expression"])
        (1.0, None)
        >>> upstream_score(task, "__import__('os').system('touch /tmp/pwned')")  # never reaches the scorer
        (0.01, 'not allowed in a countdown answer: a call')
    """
    meta = task.metadata
    if "entry" not in meta or "dataset" not in meta:
        raise ValueError(
            "this task is not a reasoning-gym item (metadata lacks 'dataset'/'entry'): make it with "
            "llmgym.envs.math.reasoning.reasoning_gym_task"
        )
    dataset, config, seed, entry = meta["dataset"], dict(meta.get("config", {})), int(meta.get("seed", 0)), meta["entry"]
    if answer is None:  # no model text: the dataset's code may run here
        return float(_scorer(dataset, config, seed).score_answer(None, entry) or 0.0), None
    if len(answer) > MAX_ANSWER_CHARS:
        rejected = f"the answer is {len(answer)} characters long (over {MAX_ANSWER_CHARS}): not read"
    else:
        rejected = check_answer(dataset, answer, entry)
    if rejected is not None:  # scored as the dataset scores an answer it cannot parse: its floor
        return float(_scorer(dataset, config, seed).score_answer("", entry) or 0.0), rejected
    return reasoning_gym_score(dataset, config, seed, entry, answer, time_limit=time_limit)


class ReasoningGymVerifier(Verifier):
    """Score with the dataset's own ``score_answer(answer, entry)`` in the sandbox, made binary by default.

    ``scoring="binary"`` (default) pays 1.0 for a right answer and 0.0 otherwise
    (:func:`llmgym.envs.math.rg_guards.guard`: several upstream scores pay content-free or wrong
    answers); ``scoring="upstream"`` returns reasoning-gym's score as it is (evaluation parity).
    The dataset's scorer runs only in the sandbox (:func:`upstream_score`); the guard runs on the host
    and never evaluates the answer.

    The answer is :func:`extract_tagged_answer` of the completion — reasoning-gym's own extraction,
    and the dataset scores exactly what reasoning-gym's pipeline scores: a completion without a closed
    ``<answer>…</answer>`` block is scored as ``score_answer(None, entry)`` — 0 (with ``"upstream"``
    scoring, 0.01 for ``countdown``, ``fraction_simplification`` and ``puzzle24``, reasoning-gym 0.1.25).
    ``lenient=True`` opts into llmgym's extra leniency (see :func:`extract_tagged_answer`).
    ``info["extracted"]`` holds the answer.

    The scorer never sees model text on the host (:func:`upstream_score`): it runs in the sandbox,
    killed after ``time_limit`` seconds, and the nine datasets whose scorers ``eval`` the answer get
    only answers that pass a strict grammar (:mod:`llmgym.envs.math.answer_grammar`) — others score
    the dataset's floor (what it gives an empty answer: 0.0, or 0.01) with ``info["error"]``.
    Without the sandbox, scoring an answer raises
    :class:`~llmgym.sandbox.SandboxUnavailableError` naming what to install.

    Example:
        >>> from llmgym.envs.math.reasoning import ReasoningGymVerifier, reasoning_gym_task
        >>> task = reasoning_gym_task("chain_sum", seed=1)
        >>> v = ReasoningGymVerifier()
        >>> v(task, f"<answer>{task.answer}</answer>").reward, v(task, "<answer>no</answer>").reward
        (1.0, 0.0)
    """

    time_limit = 5.0

    def __init__(self, time_limit: float | None = 5.0, lenient: bool = False, scoring: str = "binary"):
        super().__init__()
        if scoring not in rg_guards.SCORINGS:
            raise ValueError(f"scoring must be one of {rg_guards.SCORINGS} ('binary': 1.0 for a right answer, the RL "
                             f"default; 'upstream': reasoning-gym's own score), got {scoring!r}")
        self.time_limit = time_limit
        self.lenient = lenient
        self.scoring = scoring

    def verify(self, task: Task, completion: str) -> Score:
        answer = extract_tagged_answer(completion, lenient=self.lenient)
        score, error = upstream_score(task, answer, time_limit=self.time_limit)
        meta = task.metadata
        reward, info = rg_guards.guard(meta["dataset"], answer, meta["entry"], score, self.scoring)
        info = {"extracted": answer, **info}
        return Score(reward, info if error is None else {**info, "error": error})

    def _safe(self, task: Task, completion: str) -> Score:
        # No forked child of the caller: the scorer runs in the sandbox, which kills it at the limit.
        return self._guarded(task, completion)


#: Families whose answer is one of a few labels, sampled balanced by label by default (``balanced=None``):
#: a label is drawn uniformly, then items until one has it, so that no constant answer beats chance
#: (1/k). Their base rates unbalanced (reasoning-gym 0.1.25, default configuration) are in docs/math.md.
LABELLED_FAMILIES: dict[str, tuple[str, ...]] = {
    "acre": ("on", "off", "undetermined"),
    "circuit_logic": ("0", "1"),
    "course_schedule": ("False", "True"),
    "game_of_life_halting": ("False", "True"),
    "isomorphic_strings": ("False", "True"),
    "mahjong_puzzle": ("Chi", "Pass", "Peng"),
    "ransom_note": ("False", "True"),
    "syllogism": ("No", "Yes"),
}
#: Items drawn for one reset of a balanced family before giving up (a label below ~3 % would need more).
MAX_BALANCED_DRAWS = 200

# -- content-free answers: no constant, copy or learned guess beats chance ------------------------------------

#: The most a content-free strategy -- a constant, a copy of (a segment of) the prompt, the commonest answer
#: learned from other items -- may earn on a family whose answers are open: one item in ten. A family whose
#: answers are ``k`` values (its labels, or the values it gives) cannot be held below ``1/k`` (a constant
#: earns that on the family balanced), so its chance is ``max(CONTENT_FREE_CHANCE, 1/k)``:
#: :func:`content_free_chance`.
CONTENT_FREE_CHANCE = 0.1
#: The share one answer may take in a family of :data:`CAPPED_FAMILIES` (half of chance: room for noise).
ANSWER_SHARE_CAP = CONTENT_FREE_CHANCE / 2
#: Items of the pilot sample that estimates a capped family's answer shares (once per process and configuration);
#: fewer for the families that take a second or so per item (:data:`SLOW_PILOTS`).
PILOT_ITEMS = 200
SLOW_PILOTS = {"zebra_puzzles": 40, "polynomial_equations": 100}
#: An answer with at least this share of the pilot is one of the family's *values*. When its values cover
#: :data:`SMALL_DOMAIN_COVERAGE` of the pilot, the family is a choice among them: sampled balanced over them
#: as a labelled family is (a value drawn uniformly, then items until one has it; items with a rarer answer
#: are dropped), and its chance is ``1/k`` for ``k`` values. Otherwise its answers are open: each answer seen
#: :data:`PILOT_CAP_COUNT` times or more is kept with the probability that caps its share at
#: :data:`ANSWER_SHARE_CAP`; rarer answers are kept as drawn.
PILOT_VALUE_SHARE = 0.05
SMALL_DOMAIN_COVERAGE = 0.8
#: In an open family, answers seen at least this many times in the pilot are capped (rarer ones are kept as drawn).
PILOT_CAP_COUNT = 3
_PILOT_SEED = 0x5EED_C0DE
#: Families whose answers concentrate on a few values as reasoning-gym 0.1.25 generates them (default
#: configuration; the commonest answer's share over 100 items): ``shortest_path`` ``infeasible`` 0.31,
#: ``gcd`` ``1``/``2``, ``self_reference`` ``2`` 0.37, ``letter_counting`` ``1`` 0.33, ``rotten_oranges``
#: ``-1`` 0.44, ``maze`` 0.29, ``zebra_puzzles`` a few names ... Sampled with every
#: answer's share capped at :data:`ANSWER_SHARE_CAP` (or uniform over the answers, when there are too few
#: for the cap). ``tests/tasks/test_reward_integrity.py`` measures every family and names any missing here.
CAPPED_FAMILIES = frozenset({
    "aiw", "binary_alternation", "calendar_arithmetic", "count_bits", "family_relationships", "game_of_life",
    "gcd", "largest_island", "letter_counting", "list_functions", "maze", "number_sequence",
    "polynomial_equations", "power_function", "rectangle_count", "rotten_oranges", "self_reference",
    "shortest_path", "zebra_puzzles",
})
#: Draws for one reset of a filtered or capped family before giving up.
MAX_FILTERED_DRAWS = 500


def content_free_chance(k: int | None = None) -> float:
    """What "chance" is for a family whose answers are ``k`` values (``None``: open answers): the most a
    content-free strategy may earn on it, ``max(CONTENT_FREE_CHANCE, 1/k)``.

    Example:
        >>> from llmgym.envs.math.reasoning import content_free_chance
        >>> content_free_chance(), content_free_chance(2), content_free_chance(50)
        (0.1, 0.5, 0.1)
    """
    return CONTENT_FREE_CHANCE if not k else max(CONTENT_FREE_CHANCE, 1.0 / k)


_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3}){1,10}|\d{1,40})(?:\.\d{0,40})?(?:e[+-]?\d{1,2})?|[+-]?\.\d{1,40}")


def _number_key(word: str) -> str:
    import decimal

    return format(decimal.Decimal(word.replace(",", "")).normalize(), "f")


def _norm(text: str) -> str:
    """Case, runs of white space and the spelling of plain numbers aside (``6.0`` is ``6``, ``1,000`` is ``1000``,
    ``4.2e+02`` is ``420``): what a lenient scorer (a matrix read with numpy, a number parsed) cannot tell apart."""
    words = text.lower().split()
    return " ".join(_number_key(w) if _PLAIN_NUMBER.fullmatch(w) else w for w in words)


#: Families that ask to pick one of the options their question lists (the answer is in the prompt by
#: construction): the entry's metadata field that counts the options. Chance on an item is one over its
#: options; the copy filter does not apply.
CHOICE_FAMILIES = {"number_format": "num_candidates"}


def item_chance(dataset: str, entry: dict[str, Any]) -> float | None:
    """What a content-free pick earns on one item of a :data:`CHOICE_FAMILIES` family (one over its options),
    else ``None``.

    Example:
        >>> from llmgym.envs.math.reasoning import item_chance
        >>> item_chance("number_format", {"metadata": {"num_candidates": 4}}), item_chance("gcd", {})
        (0.25, None)
    """
    field = CHOICE_FAMILIES.get(dataset)
    if field is None:
        return None
    return 1.0 / max(1, int(entry["metadata"][field]))


_QUOTED = re.compile(r'"([^"\n]{1,2000})"|\'([^\'\n]{1,2000})\'|`([^`]{1,2000})`')
_MAX_SEGMENT_QUESTION = 200_000
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
#: Colons and quotes of a question read for segments: at most this many of each.
MAX_SEGMENTS = 64


def prompt_segments(question: str) -> dict[str, str]:
    r"""The pieces of a question a content-free strategy can copy, by name: the whole question, each line
    (``line 0``, ``line -1``, ...), each paragraph, what follows each colon (the rest of its line, or the
    paragraph after it when the line ends there: the input of "...the following matrix:"), each quoted or
    back-quoted segment (the first :data:`MAX_SEGMENTS` of each kind), the last word. Linear in the
    question's length (times :data:`MAX_SEGMENTS` at most).

    Example:
        >>> from llmgym.envs.math.reasoning import prompt_segments
        >>> segments = prompt_segments("Rotate the matrix below:\n1 2\n3 4\n\nAnswer in 'rows'.")
        >>> segments["after colon 0"], segments["line -1"], segments["quote 0"], segments["last word"]
        ('1 2\n3 4', "Answer in 'rows'.", 'rows', "'rows'")
    """
    question = question[:_MAX_SEGMENT_QUESTION]
    out = {"input": question.strip()}
    lines = [line.strip() for line in question.splitlines() if line.strip()]
    blocks = [b.strip() for b in re.split(r"\n[ \t]*\n", question) if b.strip()]
    for name, items in (("line", lines), ("paragraph", blocks)):
        for i, item in enumerate(items):
            out[f"{name} {i}"] = item
            out[f"{name} {i - len(items)}"] = item
    for i, found in enumerate(re.finditer(":", question)):
        if i >= MAX_SEGMENTS:
            break
        end = question.find("\n", found.end())
        line = question[found.end():end if end >= 0 else len(question)].strip()
        if not line and end >= 0:  # "...the following matrix:" then the input, up to the next blank line
            start = len(question) - len(question[end:].lstrip(" \t\n"))
            stop = _PARAGRAPH_BREAK.search(question, start)
            line = question[start:stop.start() if stop else len(question)].strip()
        out[f"after colon {i}"] = line
    for i, found in enumerate(_QUOTED.finditer(question)):
        if i >= MAX_SEGMENTS:
            break
        out[f"quote {i}"] = next(g for g in found.groups() if g is not None)
    words = question.split()
    if words:
        out["last word"] = words[-1].rstrip(".?!:;,")
    return out


def answer_in_prompt(question: str, answer: Any) -> bool:
    r"""Whether ``answer`` can be copied from ``question``: it equals one of its :func:`prompt_segments`
    (case and runs of white space aside).

    Example:
        >>> from llmgym.envs.math.reasoning import answer_in_prompt
        >>> answer_in_prompt("Rotate by 0 degrees:\n1 2\n3 4", "1 2\n3  4"), answer_in_prompt("Add: 1 2", "3")
        (True, False)
    """
    if answer is None:
        return False
    wanted = _norm(str(answer))
    return bool(wanted) and any(_norm(seg) == wanted for seg in prompt_segments(question).values())


_pilots: dict[tuple, tuple[tuple[str, ...], dict[str, float]]] = {}
_pilot_lock = threading.Lock()


def _acceptance(shares: dict[str, float], cap: float) -> dict[str, float]:
    """Per answer, the probability to keep an item with it so that no answer's share passes ``cap``: keep
    ``min(1, t / p)``, for the largest ``t`` that does it (bisection: the top share ``t / Σ min(p, t)``
    grows with ``t``). ``shares`` lists the frequent answers; the rest of the mass (rarer answers, kept as
    drawn) counts in the sum."""
    if not shares or max(shares.values()) <= cap:
        return {}
    rest = max(0.0, 1.0 - sum(shares.values()))
    top = lambda t: t / (rest + sum(min(p, t) for p in shares.values()))  # noqa: E731
    lo, hi = 0.0, max(shares.values())
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if top(mid) <= cap else (lo, mid)
    return {a: min(1.0, lo / p) for a, p in shares.items() if p > lo}


def _answer_key(task: Task) -> str:
    return _norm(str(task.answer))


def _pilot(dataset: str, config: dict[str, Any], instruction: str | None) -> tuple[tuple[str, ...], dict[str, float]]:
    """``(values, acceptance)`` for a family of :data:`CAPPED_FAMILIES`, from a pilot sample of a fixed seed
    stream: the values to balance over (a small-domain family), or the probability to keep each frequent answer
    (an open one). Measured once per process and configuration."""
    key = (dataset, _config_key(config))
    with _pilot_lock:
        if key in _pilots:
            return _pilots[key]
    rng = np.random.default_rng(_PILOT_SEED)
    counts: collections.Counter[str] = collections.Counter()
    items = SLOW_PILOTS.get(dataset, PILOT_ITEMS)
    for _ in range(items):
        counts[_answer_key(_draw_open(rng, dataset, config, instruction, capped=True))] += 1
    frequent = {a: c / items for a, c in counts.items() if c / items >= PILOT_VALUE_SHARE}
    if len(frequent) >= 2 and sum(frequent.values()) >= SMALL_DOMAIN_COVERAGE:
        plan: tuple[tuple[str, ...], dict[str, float]] = (tuple(sorted(frequent)), {})
    else:
        seen = {a: c / items for a, c in counts.items() if c >= PILOT_CAP_COUNT}
        plan = ((), _acceptance(seen, ANSWER_SHARE_CAP))
    with _pilot_lock:
        _pilots[key] = plan
    return plan


def _quoted_option(question: str, answer: Any) -> bool:
    """Whether ``answer`` is one the question quotes as an option (``write "infeasible"``)."""
    wanted = _norm(str(answer))
    return any(_norm(next(g for g in m.groups() if g is not None)) == wanted for m in _QUOTED.finditer(question))


def _draw_open(rng: np.random.Generator, dataset: str, config: dict[str, Any], instruction: str | None,
               values: tuple[str, ...] = (), accept: dict[str, float] | None = None, capped: bool = False) -> Task:
    """An item whose answer cannot be copied from its question (``capped``: unless it is an option the
    question quotes, such as ``"infeasible"``, whose share the cap then bounds); with ``values``, one whose
    answer is a value drawn uniformly from them; with ``accept``, kept with the probability it gives the
    item's answer."""
    wanted = values[int(rng.integers(len(values)))] if values else None
    for _ in range(MAX_FILTERED_DRAWS):
        task = reasoning_gym_task(dataset, int(rng.integers(2**31 - 1)), config, instruction)
        question = str(task.metadata["entry"].get("question", ""))
        if answer_in_prompt(question, task.answer) and not (capped and _quoted_option(question, task.answer)):
            continue
        answer = _answer_key(task)
        if wanted is not None and answer != wanted:
            continue
        keep = (accept or {}).get(answer, 1.0)
        if keep >= 1.0 or rng.random() < keep:
            return task
    raise ValueError(f"reasoning-gym {dataset!r} gave no item whose answer is not a copy of its question"
                     + (f" and is {wanted!r}" if wanted is not None else "") + f" in {MAX_FILTERED_DRAWS} draws with "
                     f"the configuration {config}: pass content_free_filter=False to sample it as generated")


def answer_values(dataset: str, config: dict[str, Any] | None = None,
                  instruction: str | None = ANSWER_INSTRUCTION) -> tuple[str, ...]:
    """The answers a family is balanced over: its labels (:data:`LABELLED_FAMILIES`), the values a small-domain
    family of :data:`CAPPED_FAMILIES` gives (from its pilot sample), else ``()`` (open answers). Its chance is
    ``content_free_chance(len(values) or None)``.

    Example:
        >>> from llmgym.envs.math.reasoning import answer_values
        >>> answer_values("syllogism"), answer_values("basic_arithmetic")
        (('No', 'Yes'), ())
    """
    if dataset in LABELLED_FAMILIES:
        return LABELLED_FAMILIES[dataset]
    if dataset not in CAPPED_FAMILIES:
        return ()
    return _pilot(dataset, dict(config or {}), instruction)[0]


def _draw_task(rng: np.random.Generator, *, dataset: str, config: dict[str, Any], instruction: str | None,
               labels: tuple[str, ...] = (), content_free_filter: bool = False) -> Task:
    if not labels:
        if not content_free_filter:
            return reasoning_gym_task(dataset, int(rng.integers(2**31 - 1)), config, instruction)
        values, accept = _pilot(dataset, config, instruction) if dataset in CAPPED_FAMILIES else ((), {})
        return _draw_open(rng, dataset, config, instruction, values, accept, capped=dataset in CAPPED_FAMILIES)
    label = labels[int(rng.integers(len(labels)))]
    for _ in range(MAX_BALANCED_DRAWS):
        task = reasoning_gym_task(dataset, int(rng.integers(2**31 - 1)), config, instruction)
        if str(task.answer) == label:
            return task
    raise ValueError(f"reasoning-gym {dataset!r} gave no item with the answer {label!r} in {MAX_BALANCED_DRAWS} "
                     f"draws with the configuration {config}: pass balanced=False to sample it as generated")


def make_env(
    tokenizer: Any = None,
    render_mode: str | None = None,
    *,
    dataset: str,
    instruction: str | None = ANSWER_INSTRUCTION,
    time_limit: float | None = 5.0,
    lenient: bool = False,
    scoring: str = "binary",
    balanced: bool | None = None,
    content_free_filter: bool = True,
    **config: Any,
) -> SequenceEnv:
    """``llmgym/RG-<dataset>-v0``: one lazily generated item per reset, scored by the dataset itself.

    Keywords other than the ones named here are the dataset's configuration (its ``*Config`` fields,
    e.g. ``min_terms=2`` for ``chain_sum``). ``size`` and ``seed`` are not: items come from the env's
    seeded generator, so use ``env.reset(seed=...)``. ``instruction`` is appended to each question
    (``None`` for none). ``lenient=True`` turns on llmgym's extra answer-extraction leniency (off by
    default: extraction is reasoning-gym's own; see :func:`extract_tagged_answer`). ``scoring`` is
    ``"binary"`` (1.0 for a right answer, else 0.0: the RL default) or ``"upstream"`` (reasoning-gym's
    own score, partial credit and all, for evaluation parity); see :mod:`llmgym.envs.math.rg_guards`.
    ``balanced`` samples a family of :data:`LABELLED_FAMILIES` balanced by label (``None``: on for
    those families; ``False``: items as reasoning-gym generates them, skewed base rates and all).
    ``content_free_filter`` (on by default) keeps every other family's content-free answers at chance
    (:data:`CONTENT_FREE_CHANCE`): an item whose answer can be copied from its question
    (:func:`answer_in_prompt`) is redrawn, and in :data:`CAPPED_FAMILIES` no answer takes more than
    :data:`ANSWER_SHARE_CAP` of the items (the first reset draws a pilot sample of :data:`PILOT_ITEMS`
    items to measure the shares). ``False`` samples items as reasoning-gym generates them.

    Example:
        >>> import gymnasium, llmgym
        >>> env = gymnasium.make("llmgym/RG-basic_arithmetic-v0")
        >>> obs, info = env.reset(seed=0)
        >>> env.step("<answer>" + info["task"].answer + "</answer>")[1]
        1.0
    """
    for reserved in ("size", "seed"):
        if reserved in config:
            raise TypeError(
                f"{reserved}= is not a dataset option here: items are drawn one at a time from the env's "
                f"seeded generator; pin them with env.reset(seed=...)"
            )
    _rg()
    from reasoning_gym.factory import DATASETS

    if dataset not in DATASETS:
        import difflib

        close = difflib.get_close_matches(dataset, list(DATASETS), n=3)
        raise ValueError(f"unknown reasoning-gym dataset {dataset!r}" + (f"; did you mean {close}?" if close else ""))
    try:  # check the configuration now (cheap) rather than at the first reset
        DATASETS[dataset][1](**config)
    except TypeError as exc:
        raise TypeError(f"bad configuration for reasoning-gym dataset {dataset!r}: {exc}") from None
    _warn_if_hash_seed_dependent(dataset)

    if balanced and dataset not in LABELLED_FAMILIES:
        raise ValueError(f"balanced=True needs a family whose answers are a few labels ({sorted(LABELLED_FAMILIES)}); "
                         f"{dataset!r} is not one")
    labels = LABELLED_FAMILIES.get(dataset, ()) if balanced is not False else ()
    # a partial of a module-level function, not a closure: the env must pickle (AsyncVectorEnv, multiprocessing)
    filtered = bool(content_free_filter) and not labels and balanced is not False and dataset not in CHOICE_FAMILIES
    draw = functools.partial(_draw_task, dataset=dataset, config=config, instruction=instruction, labels=labels,
                             content_free_filter=filtered)
    return SequenceEnv(draw, ReasoningGymVerifier(time_limit, lenient=lenient, scoring=scoring), tokenizer, render_mode=render_mode)
