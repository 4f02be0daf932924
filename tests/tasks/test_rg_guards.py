"""reasoning-gym scorers that paid wrong or content-free answers: each attack, through gymnasium.make as an RL run meets it.

Every attack scores 0 under the default ``scoring="binary"``; the right answer still scores 1.0; and
``scoring="upstream"`` keeps reasoning-gym's own number (evaluation parity), hole included, which the
upstream assertions pin so that a fixed reasoning-gym release shows up here.
"""

from __future__ import annotations

import re

import gymnasium
import pytest

import llmgym  # noqa: F401  (registers the envs)

pytest.importorskip("reasoning_gym")

from llmgym.envs.math import rg_guards  # noqa: E402

SEEDS = range(6)


def _rewards(dataset: str, answers_for, scoring: str = "binary", **kwargs) -> list[tuple[float, str, str]]:
    """``(reward, answer, reference)`` for every attack answer of every seed, each a fresh step."""
    env = gymnasium.make(f"llmgym/RG-{dataset}-v0", scoring=scoring, **kwargs)
    out = []
    for seed in SEEDS:
        task = env.reset(seed=seed)[1]["task"]
        for answer in answers_for(task):
            env.reset(seed=seed)
            out.append((env.step(f"<answer>{answer}</answer>")[1], answer, str(task.answer)))
    return out


def _right_scores_one(dataset: str, rights_for) -> None:
    """The own check accepts the right answer in the forms a model writes (the upstream score is ignored)."""
    from llmgym.envs.math.reasoning import reasoning_gym_task

    for seed in range(20):
        task = reasoning_gym_task(dataset, seed)
        for answer in rights_for(task):
            assert rg_guards.guard(dataset, answer, task.metadata["entry"], 0.0)[0] == 1.0, (dataset, answer, task.answer)


def test_game_of_life_halting_pays_only_the_right_label():
    # upstream compares bool(answer): any non-empty string scored 1.0 (20/20)
    attacks = lambda task: ["no", "yes", "0", "maybe", "True" if task.answer == "False" else "False"]
    binary = _rewards("game_of_life_halting", attacks)
    assert [r for r, _, _ in binary] == [0.0] * len(binary)
    upstream = _rewards("game_of_life_halting", attacks, scoring="upstream")
    assert all(r == 1.0 for r, _, _ in upstream)  # reasoning-gym's own score, kept for parity: the hole is real
    _right_scores_one("game_of_life_halting", lambda task: [task.answer, task.answer.lower(), f"{task.answer}."])


def test_coin_flip_zero_is_no_probability():
    # upstream's prefix credit: "0" is a prefix of "0.0625", so it scored 1.0 for every probability below 0.1
    attacks = lambda task: ["0", "0.000", "1", "NaN", "inf", "1e-9", f"{float(task.answer) * 1.01:.12f}"]
    binary = _rewards("coin_flip", attacks, min_trials=8, max_trials=15)
    assert max(r for r, _, _ in binary) == 0.0, [b for b in binary if b[0]]
    assert sum(r == 1.0 for r, a, _ in _rewards("coin_flip", lambda t: ["0"], scoring="upstream", min_trials=8,
                                                max_trials=15)) >= len(SEEDS) // 2

    def rights(task):
        rational = task.metadata["entry"]["metadata"]["rational"]
        fraction = f"{rational['numerator']}/{rational['denominator']}"
        return [task.answer, fraction, f"{100 * rational['numerator'] / rational['denominator']:.6f}%"]

    _right_scores_one("coin_flip", rights)


def test_complex_arithmetic_nan_is_not_a_number():
    attacks = lambda task: ["NaN", "nan+nanj", "-inf - infi", "1e309", "(nan)", "3 + 4i + 5"]
    binary = _rewards("complex_arithmetic", attacks)
    assert max(r for r, _, _ in binary) == 0.0, [b for b in binary if b[0]]
    assert all(r == 1.0 for r, _, _ in _rewards("complex_arithmetic", lambda t: ["NaN"], scoring="upstream"))

    def rights(task):
        real, imag = task.metadata["entry"]["metadata"]["result"]
        sign = "-" if imag < 0 else "+"
        return [task.answer, f"({real}{sign}{abs(imag)}j)", f"{real}.00 {sign} {abs(imag)}.0i"]

    _right_scores_one("complex_arithmetic", rights)


def test_number_sorting_nan_and_near_misses_score_zero():
    def attacks(task):
        numbers = [float(x) for x in task.metadata["entry"]["metadata"]["sorted_numbers"]]
        off = [round(x + 0.9, 4) for x in numbers]  # each value off by 0.9: upstream's tolerance was 1
        return ["[" + ", ".join(["NaN"] * len(numbers)) + "]", str([str(x) for x in off]), str(off),
                "[" + ", ".join(["Infinity"] * len(numbers)) + "]", "[]"]

    binary = _rewards("number_sorting", attacks)
    assert max(r for r, _, _ in binary) == 0.0, [b for b in binary if b[0]]
    assert all(r == 1.0 for r, a, _ in _rewards("number_sorting", lambda t: attacks(t)[:2], scoring="upstream"))

    def rights(task):
        numbers = task.metadata["entry"]["metadata"]["sorted_numbers"]
        return [task.answer, "[" + ", ".join(numbers) + "]", str([float(x) for x in numbers])]

    _right_scores_one("number_sorting", rights)


def _zero_grid(task):
    return [re.sub(r"\d", "0", task.answer)]


def _blanks_as(digit):
    def answers(task):
        grid = [line for line in task.metadata["entry"]["question"].splitlines() if re.fullmatch(r"[\d_ ]+", line.strip())]
        return ["\n".join(line.replace("_", digit) for line in grid)]
    return answers


def _every_assignment(task):
    meta = task.metadata["entry"]["metadata"]
    names, terms = [str(n) for n in meta["names"]], meta["knight_knave_terms"]
    example = ", and ".join(f"{name} is a {terms['knight']}/{terms['knave']}" for name in names)
    return [example] + [", and ".join(f"{name} is {terms[role]}" for name in names) + "."
                        for role in ("a_knight", "a_knave")]


def _durations(task):
    return ["00:00:00", "00:00", "0 days", "12:00:00", "0 days, 00:00"]


@pytest.mark.parametrize("dataset, attacks", [
    ("game_of_life", _zero_grid),
    ("prime_factorization", lambda task: [re.search(r"factorization of (\d+)", task.prompt).group(1)]),
    ("sudoku", _blanks_as("1")),
    ("mini_sudoku", _blanks_as("1")),
    ("knights_knaves", _every_assignment),
    ("time_intervals", _durations),
])
def test_content_free_answers_earn_nothing_by_default(dataset, attacks):
    def wrong(rows):  # an all-knight assignment is right where everyone is a knight: not content-free there
        return [r for r, answer, reference in rows if answer.strip(".") != reference.strip(".")]

    binary = wrong(_rewards(dataset, attacks))
    assert binary and max(binary) == 0.0
    upstream = wrong(_rewards(dataset, attacks, scoring="upstream"))
    assert max(upstream) >= 0.5  # what reasoning-gym's own score pays them (kept for evaluation parity)


def test_propositional_logic_refuses_the_premises_restated():
    # any valid conclusion scores 1.0 upstream, and a premise follows from the premises: echoing one
    # scored 1.0 on 177 of 200 tasks
    def echoes(task):
        premises = task.metadata["entry"]["metadata"]["premises"]
        return [max(premises, key=len), f"(({premises[0]}))", " ∧ ".join(premises), f"¬¬{premises[-1]}",
                f"{premises[0]} ∨ {premises[0]}"]

    binary = _rewards("propositional_logic", echoes)
    assert max(r for r, _, _ in binary) == 0.0, [b for b in binary if b[0]]
    assert max(r for r, _, _ in _rewards("propositional_logic", lambda t: echoes(t)[:1], scoring="upstream")) == 1.0
    entry = {"metadata": {"premises": ["(P ∨ Q)", "¬P"]}}
    assert rg_guards.guard("propositional_logic", "Q", entry, 0.25)[0] == 0.0  # trivial upstream: still 0
    assert rg_guards.guard("propositional_logic", "(Q ∨ R)", entry, 1.0)[0] == 1.0  # a conclusion of its own


@pytest.mark.parametrize("dataset", ["simple_integration", "intermediate_integration"])
def test_integration_refuses_the_integral_echoed(dataset):
    # SymPy differentiates an unevaluated Integral(f, x) back to f: the question echoed scored 1.0 upstream
    def echoes(task):
        integrand = task.prompt.split("∫", 1)[1].split(" dx", 1)[0].strip()
        return [f"Integral({integrand}, x)", f"integral({integrand}, x) + C", f"2*Integral({integrand}, x)/2 + C"]

    assert max(r for r, _, _ in _rewards(dataset, echoes)) == 0.0
    assert max(r for r, _, _ in _rewards(dataset, lambda t: echoes(t)[:1], scoring="upstream")) == 1.0
    # a real antiderivative still scores (the dataset's own answer, with no integral left in it)
    rights = [r for r, _, ref in _rewards(dataset, lambda t: [t.answer]) if "Integral" not in ref]
    assert rights and min(rights) == 1.0


def test_knights_knaves_wants_an_assignment_not_a_quoted_statement():
    # upstream keeps every "<name> ... <role>" pair of any text: echoing one of the inhabitants'
    # statements ("if Amelia is a hero then Elizabeth is a hero") scored 1.0 on 29 of 100 tasks
    def statements(task):
        quoted = re.findall(r'"([^"\n]{1,200})"', task.metadata["entry"]["question"])
        return [q for q in quoted if re.search(r"\b(if|or|not|then|only)\b", q)]  # not a bare assignment

    global SEEDS
    seeds, SEEDS = SEEDS, range(12)
    try:
        binary = _rewards("knights_knaves", statements)
        upstream = _rewards("knights_knaves", statements, scoring="upstream")
    finally:
        SEEDS = seeds
    assert binary and max(r for r, _, _ in binary) == 0.0, [b for b in binary if b[0]]
    assert max(r for r, _, _ in upstream) == 1.0
    _right_scores_one("knights_knaves", lambda task: [task.answer, task.answer.replace(", and", " and").rstrip(".")])


def test_gsm_symbolic_reads_the_sign():
    # upstream's first-number regex starts with "\b", which cannot precede "-": "-288" scored as 288
    attacks = lambda task: [f"-{task.answer}", f"-{task.answer}.0"]
    assert max(r for r, _, _ in _rewards("gsm_symbolic", attacks)) == 0.0
    assert all(r == 1.0 for r, _, _ in _rewards("gsm_symbolic", attacks, scoring="upstream"))
    _right_scores_one("gsm_symbolic", lambda task: [task.answer, f"{float(task.answer):,}", f"{task.answer} apples"])


def test_scoring_is_checked_and_reported():
    env = gymnasium.make("llmgym/RG-coin_flip-v0")
    task = env.reset(seed=0)[1]["task"]
    info = env.step(f"<answer>{task.answer}</answer>")[4]["score"]
    assert info["scoring"] == "binary" and info["correct"] is True and info["upstream_score"] == 1.0
    assert info["checked_by"] == "llmgym"
    with pytest.raises(ValueError, match="scoring must be one of"):
        gymnasium.make("llmgym/RG-coin_flip-v0", scoring="partial")
    with pytest.raises(ValueError, match="scoring must be one of"):
        rg_guards.guard("coin_flip", "1", {}, 1.0, scoring="lenient")


def test_own_checks_parse_without_evaluating_and_in_bounded_time():
    entry = {"answer": "['1', '2']", "metadata": {"sorted_numbers": ["1", "2"], "result": (1, 2),
                                                  "rational": {"numerator": 1, "denominator": 2},
                                                  "names": ["Ann", "Bo"], "solution": (True, False),
                                                  "knight_knave_terms": {"knight": "knight", "knave": "knave"},
                                                  "numbers": [1, 2, 3, 4]}}
    payloads = ["__import__('os').system('touch /tmp/pwned')", "[__import__('os')]", "1e99999999", "9" * 5000,
                "[" + "1," * 50_000 + "1]", "(" * 10_000 + "1" + ")" * 10_000, "1/0", "0x1p3"]
    for dataset, check in rg_guards.OWN_CHECKS.items():
        for payload in payloads:
            assert rg_guards.guard(dataset, payload, entry, 1.0)[0] == 0.0, (dataset, payload[:40])
    assert rg_guards.guard("number_sorting", "['1', \"2\"]", entry, 0.0)[0] == 1.0  # decided here, not upstream
    assert rg_guards.guard("number_sorting", "[1, 2]", entry, 0.0)[0] == 1.0
    assert rg_guards.guard("complex_arithmetic", "1+2i", entry, 0.0)[0] == 1.0
    assert rg_guards.guard("coin_flip", "50%", entry, 0.0)[0] == 1.0
    assert rg_guards.guard("knights_knaves", "Ann is a knight, and Bo is a knave.", entry, 0.0)[0] == 1.0
    assert rg_guards.guard("knights_knaves", "Ann is a knight and Ann is a knight and Bo is a knave", entry, 1.0)[0] == 0.0
    # a non-finite or missing upstream score counts as 0 in either mode
    assert rg_guards.guard("chain_sum", "5", {}, float("nan"), scoring="upstream")[0] == 0.0
    assert rg_guards.guard("chain_sum", "5", {}, None)[0] == 0.0


# -- issue 30: skewed two-way (and few-way) families paid a constant answer ---------------------------------

@pytest.mark.parametrize("dataset", sorted(__import__("llmgym.envs.math.reasoning", fromlist=["x"]).LABELLED_FAMILIES))
def test_no_constant_answer_beats_chance_on_a_labelled_family(dataset):
    """Sampled balanced by label by default: over 300 seeds no label -- the reward of always answering
    it -- is drawn more often than chance (1/k) by more than four standard deviations. Unbalanced,
    syllogism's "Yes" is 0.69 of the items."""
    import collections

    from llmgym.envs.math.reasoning import LABELLED_FAMILIES

    labels, n = LABELLED_FAMILIES[dataset], 300
    env = gymnasium.make(f"llmgym/RG-{dataset}-v0")
    counts = collections.Counter(str(env.reset(seed=seed)[1]["task"].answer) for seed in range(n))
    assert set(counts) <= set(labels), counts
    chance = 1 / len(labels)
    bound = chance + 4 * (chance * (1 - chance) / n) ** 0.5
    assert max(counts.values()) / n <= bound, (counts, bound)
    assert min(counts.values()) / n >= chance - 4 * (chance * (1 - chance) / n) ** 0.5, counts


def test_a_constant_answer_scores_only_its_own_label():
    env = gymnasium.make("llmgym/RG-syllogism-v0")
    task = env.reset(seed=0)[1]["task"]
    other = "No" if task.answer == "Yes" else "Yes"
    assert env.step(f"<answer>{task.answer}</answer>")[1] == 1.0
    env.reset(seed=0)
    assert env.step(f"<answer>{other}</answer>")[1] == 0.0
    with pytest.raises(ValueError, match="balanced=True needs a family whose answers are a few labels"):
        gymnasium.make("llmgym/RG-basic_arithmetic-v0", balanced=True)
    skewed = gymnasium.make("llmgym/RG-syllogism-v0", balanced=False)  # as reasoning-gym generates them
    assert sum(skewed.reset(seed=s)[1]["task"].answer == "Yes" for s in range(200)) > 120


# -- content-free answers: copies of the question redrawn, concentrated answers balanced or capped -------------------

def test_an_answer_copied_from_the_question_is_found_in_any_segment():
    from llmgym.envs.math.reasoning import answer_in_prompt

    question = ("Rotate the matrix below by 0 degrees clockwise:\n1 2\n3 4\n\nThe string is: ABCD\n"
                "Say 'infeasible' if there is none.")
    for copied in ("1 2\n3 4", "1.0 2.0\n3.0 4.0", "1  2 3 4", "ABCD", "abcd", "infeasible", question):
        assert answer_in_prompt(question, copied), copied
    for answer in ("3 1\n4 2", "ABCDA", "2", "", None):
        assert not answer_in_prompt(question, answer), answer


def test_acceptance_caps_every_frequent_answer_or_balances_a_small_domain():
    from llmgym.envs.math.reasoning import _acceptance

    shares = {"infeasible": 0.4, "a": 0.06}  # the remaining 0.54: answers each rarer than 5 %, kept as drawn
    keep = _acceptance(shares, 0.05)
    kept = {a: p * keep.get(a, 1.0) for a, p in shares.items()}
    total = sum(kept.values()) + 0.54
    assert max(kept.values()) / total <= 0.05 + 1e-9 and keep["infeasible"] < keep["a"] < 1
    assert _acceptance({"a": 0.04}, 0.05) == {}  # nothing over the cap: nothing dropped


@pytest.mark.parametrize("dataset", ["string_insertion", "rotate_matrix"])
def test_the_filter_keeps_items_reproducible_and_can_be_turned_off(dataset):
    from llmgym.envs.math.reasoning import answer_in_prompt

    def items(**kwargs):
        env = gymnasium.make(f"llmgym/RG-{dataset}-v0", **kwargs)
        return [env.reset(seed=s)[1]["task"] for s in range(30)]

    first, again, raw = items(), items(), items(content_free_filter=False)
    assert [t.id for t in first] == [t.id for t in again]  # same seed, same item
    assert not any(answer_in_prompt(t.metadata["entry"]["question"], t.answer) for t in first)
    assert sum(answer_in_prompt(t.metadata["entry"]["question"], t.answer) for t in raw) >= 5  # as generated


def test_a_small_domain_family_is_balanced_over_its_values():
    import collections

    from llmgym.envs.math.reasoning import answer_values

    values = answer_values("self_reference")
    assert 3 <= len(values) <= 10, values
    env = gymnasium.make("llmgym/RG-self_reference-v0")
    n = 200
    counts = collections.Counter(str(env.reset(seed=s)[1]["task"].answer) for s in range(n))
    assert set(counts) <= set(values), counts
    chance = 1 / len(values)
    assert max(counts.values()) / n <= chance + 4 * (chance * (1 - chance) / n) ** 0.5, (counts, values)
