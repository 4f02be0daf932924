"""Content-free strategies against chance on every reasoning-gym family, as its env samples it.

Each constant, the commonest answer learned on the other items, and a copy of the prompt and of each segment of
its question, *including* the items whose answer the strategy happens to be: none may earn more than chance
(``llmgym.envs.math.reasoning.content_free_chance``) by more than three standard errors. The families that used
to pay are checked in the default run; the whole registry in the slow sweep. (Its own file, apart from
``test_reward_integrity.py``, so that the test workers share the sweep's minutes.)
"""
from __future__ import annotations

import re

import pytest

import llmgym

ENVS = [info for info in llmgym.registered_envs() if isinstance(info.factory, str)]


#: Constants a policy can say to any question.
CONSTANTS = ("", "0", "1", "2", "-1", "yes", "no", "Yes", "No", "True", "False", "infeasible", "None", "[]", "none")


def _rg_strategies(task, learned: str | None) -> dict[str, str]:
    """Every content-free answer to a reasoning-gym task, by strategy: constants, the commonest answer learned on
    other items, a copy of the prompt, of the question, and of each of its segments -- each line and paragraph,
    what follows each colon (the rest of the line, or the next paragraph), each quoted segment, the first and
    last word of each line, the first and last number. Cut here, independently of the library's own filter."""
    question = str(task.metadata["entry"]["question"])
    out = {f"constant {c!r}": c for c in CONSTANTS}
    if learned is not None:
        out["commonest answer"] = learned
    out["prompt"], out["question"] = task.prompt, question.strip()
    for name, parts in (("line", question.splitlines()), ("paragraph", re.split(r"\n\s*\n", question))):
        parts = [p.strip() for p in parts if p.strip()]
        out.update({f"{name} {i}": p for i, p in enumerate(parts)})
        out.update({f"{name} {i - len(parts)}": p for i, p in enumerate(parts)})
    for i, found in enumerate(re.finditer(r":[ \t]*([^\n]*)\n?((?:[^\n]+\n?)*)", question)):
        out[f"after colon {i}"] = found.group(1).strip() or found.group(2).strip()
    for i, found in enumerate(re.finditer(r"\"([^\"\n]+)\"|'([^'\n]+)'|`([^`]+)`", question)):
        out[f"quote {i}"] = next(g for g in found.groups() if g is not None)
    lines = [line.split() for line in question.splitlines() if line.split()]
    for i, words in enumerate(lines[:3] + lines[-3:]):
        out[f"first word of line {i}"], out[f"last word of line {i}"] = words[0], words[-1]
    numbers = re.findall(r"-?\d+(?:\.\d+)?", question)
    if numbers:
        out["first number"], out["last number"] = numbers[0], numbers[-1]
    if lines:
        out["last word"] = lines[-1][-1].rstrip(".?!:;,")
    return out


def _score_in_process(monkeypatch):
    """reasoning-gym's scorer called here rather than in the sandbox (~6 ms a call there; the sweep makes
    thousands): the answers are this file's own content-free strings cut from reasoning-gym's questions, and
    they still pass the answer grammar and the guard first, as in the env."""
    import math

    from llmgym.envs.math import reasoning

    def score(dataset, config, seed, entry, answer, *, time_limit=None):
        value = reasoning._scorer(dataset, config, seed).score_answer(answer, entry)
        value = float(value or 0.0)
        return (value, None) if math.isfinite(value) and 0.0 <= value <= 1.0 else (0.0, "out of range")

    monkeypatch.setattr(reasoning, "reasoning_gym_score", score)


def measure_content_free(dataset: str, n_measure: int) -> tuple[dict[str, float], float, int]:
    """``(mean reward per strategy, chance, items measured)`` for one reasoning-gym family as its env samples it.

    Every strategy is measured on ``n_measure`` items (seeds 0 on); the commonest answer for each item is learned
    on the other ``n_measure - 1`` (leave one out: no item is generated only to learn from, and the strategy never
    sees its own item's answer). Chance is :func:`~llmgym.envs.math.reasoning.content_free_chance` of the number
    of distinct answers in the sample (what the family, as sampled, can answer).
    """
    import collections

    from llmgym.envs.math.reasoning import CHOICE_FAMILIES, content_free_chance, item_chance, make_env

    env = make_env(dataset=dataset)
    tasks = [env.reset(seed=i)[1]["task"] for i in range(n_measure)]
    answers = collections.Counter(str(t.answer) for t in tasks if t.answer is not None)
    k = len(answers) or None  # the values a few-valued family gives (labels, counts ...); many for open answers
    totals: dict[str, float] = collections.defaultdict(float)
    for task in tasks:
        others = answers.copy()
        if task.answer is not None:
            others[str(task.answer)] -= 1
        common = [a for a, c in others.most_common(1) if c > 0]
        by_answer: dict[str, list[str]] = collections.defaultdict(list)
        for kind, answer in _rg_strategies(task, common[0] if common else None).items():
            by_answer[answer].append(kind)
        for answer, kinds in by_answer.items():  # each distinct answer scored once
            reward = env.verifier(task, f"<answer>{answer}</answer>").reward
            for kind in kinds:
                totals[kind] += reward
    chance = content_free_chance(k)
    if dataset in CHOICE_FAMILIES:  # pick one of the listed options: chance is one over the options, item by item
        chance = sum(item_chance(dataset, t.metadata["entry"]) for t in tasks) / n_measure
    return {kind: total / n_measure for kind, total in totals.items()}, chance, n_measure


def _over_chance(means: dict[str, float], chance: float, n: int) -> dict[str, float]:
    """The strategies whose mean passes chance by more than three standard errors of a mean at chance."""
    import math

    bound = chance + 3 * math.sqrt(chance * (1 - chance) / n)
    return {kind: round(m, 3) for kind, m in means.items() if m > bound}


#: The families where reasoning-gym's items pay a content-free strategy, as generated (reasoning-gym 0.1.25, binary
#: scoring, 100 items): a copy of the input string 0.95 on string_insertion, of the matrix on rotate_matrix and
#: pool_matrix, of the string on string_manipulation; infeasible 0.53 on shortest_path, 2 on gcd and self_reference.
KNOWN_CONTENT_FREE = ("string_insertion", "rotate_matrix", "pool_matrix", "string_manipulation", "shortest_path",
                      "gcd", "self_reference")


@pytest.mark.filterwarnings("ignore:reasoning-gym .* hash randomisation")
@pytest.mark.parametrize("dataset", KNOWN_CONTENT_FREE)
def test_content_free_strategies_do_not_beat_chance_where_they_used_to(dataset, monkeypatch):
    pytest.importorskip("reasoning_gym")
    _score_in_process(monkeypatch)
    means, chance, n = measure_content_free(dataset, n_measure=80)
    assert not _over_chance(means, chance, n), (dataset, chance, _over_chance(means, chance, n))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:reasoning-gym .* hash randomisation")
@pytest.mark.parametrize("dataset", REASONING_GYM_DATASETS := [info.id[len("llmgym/RG-"):-len("-v0")] for info in ENVS
                                                               if info.family == "reasoning-gym"])
def test_no_content_free_strategy_beats_chance_on_any_reasoning_gym_family(dataset, monkeypatch):
    """Every registered reasoning-gym family, as its env samples it: each constant, the commonest answer learned on
    other items, a copy of the prompt and of each segment of its question -- none earns more than chance."""
    pytest.importorskip("reasoning_gym")
    _score_in_process(monkeypatch)
    means, chance, n = measure_content_free(dataset, n_measure=60)
    over = _over_chance(means, chance, n)
    assert not over, (f"{dataset}: content-free answers beat chance ({chance:.2f}): {over}; filter or balance it "
                      f"(llmgym.envs.math.reasoning.CAPPED_FAMILIES caps the share of any one answer)")
