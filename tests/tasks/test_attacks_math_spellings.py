r"""Old classes in new spellings: a unit, a percent or a type the rules knew, written another way.

Found by an attacker's pass on the unit, percent and form rules (each scored 1.0 before the fix):

* a wrong unit in any text, font or spacing command the unit rule did not list -- ``5 \textbf{cm}``,
  ``5 \mathbf{cm}``, ``5\;cm``, ``5~cm``, ``5 \text{ c m}`` -- for "How long, in meters, ...?" (gold 5); math-verify
  drops them all (``5 cm`` parses as 5). Rule: every text/font/spacing command, Unicode variant and split word is
  folded to one form (``llmgym.envs.math.answer_text.fold_answer``) before units are judged, and letters outside
  text that are not the reference's symbols are a unit at the answer's end (judged) or refused anywhere else;
* ``3 \text{ percent}``, "per cent", "pct" where ``3\%`` is refused: percent words are the sign;
* the set ``\{-1, 1\}`` (or the list ``-1, 1``) for the open interval ``(-1, 1)``, and back: math-verify finds them
  equal. Rule: the answer's parsed type must be one the reference can be read as.

Then the attacker's pass on those rules (``\hbox``, ``\textsf``, ``{\rm cm}``, full-width letters, combining marks,
``\phantom``, ``\text{%}``, ``٪``, ``\left\{ \right\}``, ...) is played here too. False refusals are measured on
every gold of the shipped samples (``test_attacks_math.py`` and below).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import llmgym  # noqa: F401  (registers the envs)
from llmgym import Task

pytest.importorskip("math_verify")

from llmgym.envs.math import MathVerifier  # noqa: E402

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(time_limit=30) as v:
        yield v


# -- units: one form for every text, font and spacing command -------------------------------------------------------

CENTIMETERS = [
    # the attacker's report
    r"5 \textrm{cm}", r"5 \textbf{cm}", r"5 \mathbf{cm}", r"5\;cm", r"5~cm", r"5 \text{ c m}",
    # the attacker's pass on the fold
    r"5\,cm", r"5\:cm", r"5\quad cm", r"5 cm", r"5 \textsf{cm}", r"5 \texttt{cm}", r"5 \textit{cm}", r"5 \mathit{cm}",
    r"5 \hbox{cm}", r"5 \textnormal{cm}", r"5 \mathrm{~cm}", r"5 {\rm cm}", r"5 \rm cm", r"5 {\bf cm}",
    r"5 \operatorname{cm}", r"5 \mbox{cm}", r"5\ \mathrm{c}\mathrm{m}", r"5 \text{c}\,\text{m}", r"5 \text{c}m",
    r"5\phantom{x} cm", r"5\hspace{1em}cm", r"5 \textbf{\textit{cm}}", r"5 \text{\textbf{c}m}", r"5 \cm",
    "5 \uff43\uff4d", "5\u00a0cm", "5\u2009cm", "5 c\u0301m", "5 c\u200bm", r"5 \text{c{m}}",
    r"5 \text{cm}", r"5 \mathrm{cm}",
    # a second pass, on the fold itself
    r"5 c\text{m}", r"5\text{ }cm", r"5 \text{c}\hspace{0pt}\text{m}", r"5 \text{c\kern0pt m}", r"5 \color{red} cm",
    "5 \U0001d450\U0001d45a", "5 c\u200dm", r"5 \ensuremath{cm}", r"5 \textup{cm}", r"5 \emph{cm}", r"5 \textsc{cm}",
    r"5 \mathsf{cm}", r"5 \mathtt{cm}", r"5 \pmb{cm}", r"5 \boldsymbol{cm}", r"5 \mathnormal{cm}",
    r"5 \text{centi}\text{meters}",
]
#: Spellings refused whatever the question asks (deny by default): a unit that is not one, or not where units go.
NOT_A_UNIT = [r"5_{cm}", r"5 \text{c} \cdot \text{m}", r"5 \textcolor{red}{cm}", "5 \u0441m", r"5 \bar{cm}",
              r"5 \overset{}{cm}", r"5 \mathcal{cm}", r"5 \mathbb{cm}", r"5 \text{ cent imeters}",
              r"\text{cm } 5", r"5^{cm}"]


@pytest.mark.parametrize("spelling", CENTIMETERS)
def test_a_unit_in_any_spelling_is_that_unit(verifier, spelling):
    score = verifier(Task("How long, in meters, is the rod?", answer="5"), rf"\boxed{{{spelling}}}")
    assert score.reward == 0.0 and "unit" in (score.info.get("error") or ""), score.info
    # the same spelling answers the question that asks for centimeters: folded, not refused
    assert verifier(Task("How long, in centimeters, is the rod?", answer="5"), rf"\boxed{{{spelling}}}").reward == 1.0


@pytest.mark.parametrize("spelling", NOT_A_UNIT)
def test_a_unit_out_of_place_is_refused_whatever_the_question(verifier, spelling):
    for question in ("How long, in meters, is the rod?", "How long, in centimeters, is the rod?"):
        assert verifier(Task(question, answer="5"), rf"\boxed{{{spelling}}}").reward == 0.0, question


@pytest.mark.parametrize("question, gold, answer, reward", [
    # letters outside text that are not the reference's symbols: a unit at the end, refused elsewhere
    ("How long, in centimeters, is the rod?", "5", r"5 m", 0.0),  # a one-letter unit is a unit (it was read as 5)
    ("How long, in meters, is the rod?", "5", r"5 m", 1.0),
    ("How long, in meters, is the rod?", "5", r"5 \text{ см}", 0.0),  # any script's letters
    ("What is $2 + 3$?", "5", r"5 c", 0.0),  # a letter that is no unit symbol: a symbol the reference does not have
    ("What is $2 + 3$?", "5", r"5 cm + 0", 0.0),
    ("What is $2 + 3$?", "5", "3\u2030", 0.0),  # a sign the verifier does not read (math-verify drops it)
    # where the question names no unit: a unit or the question's own words, never a word that scales the number
    ("What is $1 + 2$?", "3", r"3 \text{ thousand}", 0.0),
    ("What is $1 + 2$?", "3", r"3 \text{ hundredths}", 0.0),
    ("What is $1 + 2$?", "3", "The answer is 3 thousand.", 0.0),
    ("What is $1 + 2$?", "3", r"3 \text{ prct}", 0.0),
    ("How many rolls are left?", "18", r"18 \text{ rolls}", 1.0),
    # deny by default, measured: a count noun in the box that the question does not use ("ways" for "Compute
    # $\dbinom{8}{4}$.") is refused; the same words in prose are not read as the answer
    (r"Compute $\dbinom{8}{4}$.", "70", r"70 \text{ ways}", 0.0),
    ("How long did he walk?", "45", r"45 \text{ min}", 1.0),
    ("How much money is left?", "11", r"11 \text{ dollars}", 1.0),
    ("Solve $2x = 6$.", "3", "x = 3", 1.0),  # a variable named by a relation
    ("What is $e^2$?", "e^{2}", r"\mathrm{e}^{2}", 1.0),
    ("What is the angle?", r"2\theta", "2\u03b8", 1.0),  # a Greek letter in Unicode is its command, not a stray letter
    ("What is half of one?", r"\frac{1}{2}", "\u00bd", 1.0),
    ("How long, in meters, is the rod?", "5", "5 \u03bcm", 0.0),
    ("What is the area, in square feet?", "12", r"12 \text{ft}^2", 1.0),
    ("What is the area, in square feet?", "12", r"12 \mathrm{f}\mathrm{t}^{2}", 1.0),
    ("What is the area, in square feet?", "12", "12 ft\u00b2", 1.0),
])
def test_letters_outside_text_are_a_unit_or_the_references_symbols(verifier, question, gold, answer, reward):
    score = verifier(Task(question, answer=gold), rf"\boxed{{{answer}}}")
    assert score.reward == reward, score.info


def test_a_count_noun_in_prose_is_not_read_as_the_answer(verifier):
    assert verifier(Task(r"Compute $\dbinom{8}{4}$.", answer="70"), "There are 70 ways.").reward == 1.0


# -- percent: words are the sign --------------------------------------------------------------------------------

PERCENTS = [r"3\%", r"3 \text{ percent}", r"3 \text{ per cent}", r"3 \text{ pct}", r"3 \textrm{percent}", "3 percent",
            "3 per cent", "3 Percent", r"3\text{%}", r"3 \text{\%}", "3\u066a", "3\uff05", r"3 \mathrm{\%}",
            # a second pass, on the fold itself
            r"3\,\%", r"3 \textrm{\%}", r"3 \mathrm{pct}", r"3 \text{p}\text{ct}", "3 \ufe6a", r"3\percent", r"3 \pct",
            r"3 \text{per}\,\text{cent}", r"3 \text{ PERCENT}"]


@pytest.mark.parametrize("spelling", PERCENTS)
def test_a_percent_in_any_spelling_is_the_sign(verifier, spelling):
    # refused where the question asks for no percent (3% is 0.03 there), paid where it asks for one
    refused = verifier(Task("What is $1 + 2$?", answer="3"), rf"\boxed{{{spelling}}}")
    assert refused.reward == 0.0, refused.info
    assert verifier(Task("What percent of $100$ is $3$?", answer="3"), rf"\boxed{{{spelling}}}").reward == 1.0
    assert verifier(Task("q", answer="0.03"), rf"\boxed{{{spelling}}}").reward == 1.0


@pytest.mark.parametrize("completion", ["The answer is 3 percent.", "The answer is 3%.", "So it is 3 per cent",
                                        "The answer is $3$ percent."])
def test_a_percent_in_prose_is_kept(verifier, completion):
    assert verifier(Task("What is $1 + 2$?", answer="3"), completion).reward == 0.0
    assert verifier(Task("What percent of $100$ is $3$?", answer="3"), completion).reward == 1.0


# -- types: a set is not an interval ------------------------------------------------------------------------------

@pytest.mark.parametrize("gold, wrong, right", [
    ("(-1, 1)", [r"\{-1, 1\}", r"\left\{ -1, 1 \right\}", r"\lbrace -1, 1 \rbrace", "-1, 1", "x = -1, x = 1",
                 r"\{-1\} \cup \{1\}", "[-1, 1]", "]-1, 1[", r"\left\lbrace -1,1\right\rbrace", r"\set{-1, 1}",
                 r"\{-1,1\} \cup \emptyset", r"\textstyle\{-1, 1\}", r"[-1, 1] \setminus \{-1, 1\}"],
     ["(-1, 1)", r"\left( -1, 1 \right)", r"(-1,1)"]),
    (r"\{-1, 1\}", ["(-1, 1)", r"\left( -1, 1 \right)", "[-1, 1]"],
     [r"\{-1, 1\}", r"\{1, -1\}", "-1, 1", r"\left\{ -1, 1 \right\}", r"\lbrace -1, 1 \rbrace", "x = -1, x = 1"]),
    ("1, 2", ["(1, 2)", "[1, 2]", "(2, 1)"], [r"\{1, 2\}", "2, 1"]),
    ("(1, 2)", [r"\{1, 2\}", "1, 2"], ["(1, 2)"]),
    (r"(-\infty, -1) \cup (1, \infty)", [r"\{-1\} \cup \{1\}", r"\{-1, 1\}"], [r"(-\infty, -1) \cup (1, \infty)"]),
    ("[0, 1)", ["[0, 1]", "(0, 1)", r"\{0, 1\}"], ["[0, 1)"]),
])
def test_an_answer_is_of_a_type_the_reference_can_be_read_as(verifier, gold, wrong, right):
    task = Task("q", answer=gold)
    for answer in wrong:
        assert verifier(task, rf"\boxed{{{answer}}}").reward == 0.0, answer
    for answer in right:
        assert verifier(task, rf"\boxed{{{answer}}}").reward == 1.0, answer


def test_a_number_is_also_the_list_of_one_solution(verifier):
    assert verifier(Task("Find all $x$ with $x - 5 = 0$.", answer="5"), r"\boxed{\{5\}}").reward == 1.0


# -- false refusals: every gold of the shipped GSM8K sample, in the spellings a model writes ----------------------

def _gsm8k_spellings(question: str, gold: str) -> list[str]:
    import re

    plain = gold.replace(",", "")
    asked = re.search(r"How many (\w+)", question)
    noun = asked[1] if asked else "dollars"
    return [gold, plain, f"The answer is {gold}.", f"#### {plain}", rf"\boxed{{{plain}}}", rf"$\boxed{{{gold}}}$",
            f"So the total is {plain}.", f"The answer is ${plain}$.", rf"\boxed{{{plain} \text{{ {noun}}}}}",
            f"The answer is {plain} {noun}.",
            f"The answer is {plain} dollars.", rf"\boxed{{\${plain}}}", f"<answer>{plain}</answer>",
            f"\\boxed{{ {plain} }}", rf"\boxed{{{plain}\,\text{{units}}}}"]


def test_every_gold_of_the_gsm8k_sample_pays_against_its_usual_spellings(verifier):
    from llmgym.envs.math import load_gsm8k

    tasks = load_gsm8k(DATA / "gsm8k_sample.jsonl")
    refused, checked = [], 0
    for task in tasks:
        for completion in _gsm8k_spellings(task.prompt, task.answer):
            checked += 1
            score = verifier(task, completion)
            if score.reward != 1.0:
                refused.append((task.answer, completion, score.info.get("error")))
    assert refused == [], f"{len(refused)} of {checked} refused: {refused}"
    assert len(tasks) >= 4 and checked >= 50


# -- a unit is its words in order, and its power is part of it (round two) ---------------------------------------------
# Each paid 1.0 before: the unit was a set of words and a power other than 2 or 3 was dropped, so a unit
# multiplied by itself, raised to any other power or turned upside down was the reference's unit.

@pytest.mark.parametrize("question, gold, answer", [
    ("How long is the rod?", r"5 \text{ m}", r"5 \text{ m}^{-1}"),
    ("How long is the rod?", r"5 \text{ m}", r"5 \mathrm{m}^{1/2}"),
    ("How long is the rod?", r"5 \text{ m}", r"5 \text{ m}^4"),
    ("How long is the rod?", r"5 \text{ m}", r"5 \text{ meter meter}"),
    ("How long, in meters, is the rod?", "5", r"5 \text{ meter meter}"),
    ("How long, in meters, is the rod?", "5", r"5 \text{ m}^{-1}"),
    ("How fast is it?", r"5 \text{ m/s}", r"5 \text{ s/m}"),
    ("How fast is it?", r"5 \text{ m/s}", r"5 \text{ second per meter}"),
    ("What is the area?", r"36 \text{ units}^2", r"36 \text{ units}^{-2}"),
    ("How fast is it, in meters per second?", "5", r"5 \text{ s/m}"),  # the question's words, in another order
])
def test_a_units_power_and_order_are_part_of_it(verifier, question, gold, answer):
    score = verifier(Task(question, answer=gold), rf"\boxed{{{answer}}}")
    assert score.reward == 0.0 and "unit" in (score.info.get("error") or ""), score.info


@pytest.mark.parametrize("gold, answer", [
    (r"5 \text{ m/s}", r"5 \text{ meters per second}"), (r"5 \text{ m/s}", r"5 \text{ m/s}"),
    (r"36 \text{ units}^2", "36 square units"), (r"5 \text{ cm}^2", r"5\,\mathrm{cm}^{2}"),
    (r"5 \text{ cm}^2", r"5 \text{ square centimeters}"), (r"5 \text{ m}", "5 meters"),
    (r"5 \text{ m/s}", r"5 \frac{\text{m}}{\text{s}}"), (r"5 \text{ m/s}", r"5 \text{ m}/\text{s}"),
])
def test_a_unit_in_its_usual_spellings_still_pays(verifier, gold, answer):
    assert verifier(Task("What is it?", answer=gold), rf"\boxed{{{answer}}}").reward == 1.0
