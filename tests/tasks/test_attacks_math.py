r"""Issue 30's closing attack on the math scorer: echoes with a no-op, forms written as exponents, hedges.

Found by the fresh attacker's pass (each scored 1.0 before the fix):

* the question's own expression with an operation that does nothing -- ``2^{10} \cdot 1``, ``+ 0``,
  ``^{1}``, ``/1``, ``--``, ``2.0^{10}``, ``16^{1/2}`` or ``\sqrt[2]{16}`` for ``\sqrt{16}``: the echo
  guard compared the trees as written, so any no-op made a new tree;
* "in simplest radical form" answered ``12^{1/2}`` (the question itself), ``\sqrt[4]{144}``,
  ``\sqrt{2}\sqrt{6}``, ``\sqrt{3} + \sqrt{3}`` or ``2^{3/2}``: a root written as an exponent was not
  seen as a root, and products of roots and like terms were not looked at.

Then rules that close whole classes (each attack scored 1.0 before): an exact reference wants an exact answer
(``0.666667`` for ``\frac{2}{3}``); a written-out reference wants a written-out answer (``\binom{8}{4} + 1 - 1``,
``\lfloor \binom{8}{4} \rfloor``, ``\frac{8!}{4!4!}`` for 70); scientific notation as a form; ``%`` and units
read one way. False refusals are measured over the shipped MATH sample.

Held (kept here so they stay held): two answers in one (``3 \text{ or } 5``, ``5 = 3``, ``3 \approx 5``)
never pay for both values.
"""

from __future__ import annotations

import pytest

import llmgym  # noqa: F401  (registers the envs)
from llmgym import Task

pytest.importorskip("math_verify")

from llmgym.envs.math import MathVerifier  # noqa: E402


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(time_limit=30) as v:
        yield v


@pytest.mark.parametrize("question, gold, echoes, right", [
    (r"What is $2^{10}$?", "1024",
     [r"\boxed{2^{10} \cdot 1}", r"\boxed{2^{10}+0}", r"\boxed{0+2^{10}}", r"\boxed{2^{10}-0}", r"\boxed{\frac{2^{10}}{1}}",
      r"\boxed{2^{10}/1}", r"\boxed{(2^{10})^{1}}", r"\boxed{1 \times 2^{10}}", r"\boxed{2^{10.0}}", r"\boxed{2.0^{10}}"],
     [r"\boxed{1024}", r"\boxed{1{,}024}"]),
    (r"Compute $\sqrt{16}$.", "4",
     [r"\boxed{16^{1/2}}", r"\boxed{\sqrt[2]{16}}", r"\boxed{16^{0.5}}", r"\boxed{\left(16\right)^{\frac{1}{2}}}",
      r"\boxed{\sqrt{16}\cdot 1}", r"\boxed{--\sqrt{16}}", r"\boxed{\sqrt{16}^{1}}"],
     [r"\boxed{4}", r"\boxed{4.0}"]),
    (r"Compute $\dbinom{8}{4}$.", "70", [r"\boxed{\binom{8}{4}\cdot 1}", r"\boxed{1 \times \binom{8}{4}}"], [r"\boxed{70}"]),
    (r"Simplify $\frac{12}{18}$.", r"\frac{2}{3}",
     [r"\boxed{\frac{12}{18}\cdot 1}", r"\boxed{\frac{12.0}{18}}", r"\boxed{\frac{12}{18}+0}", r"\boxed{\frac{12}{18}^{1}}"],
     [r"\boxed{\frac{2}{3}}", r"\boxed{\frac{2}{3} \cdot 1}"]),
])
def test_an_echo_with_a_no_op_is_still_an_echo(verifier, question, gold, echoes, right):
    task = Task(question, answer=gold)
    for answer in echoes:
        score = verifier(task, answer)
        assert score.reward == 0.0, answer
        assert "own expressions" in score.info["error"] or "written out" in score.info["error"], (answer, score.info)
    for answer in right:  # the value, or the reference as written (no-ops and all), still pays
        assert verifier(task, answer).reward == 1.0, answer


@pytest.mark.parametrize("question, gold, right, wrong_form", [
    (r"Write $\sqrt{12}$ in simplest radical form.", r"2\sqrt{3}",
     [r"\boxed{2\sqrt{3}}", r"\boxed{\sqrt{3}\cdot 2}", r"\boxed{2 \cdot 3^{1/2}}"],
     [r"\boxed{12^{1/2}}", r"\boxed{\sqrt[4]{144}}", r"\boxed{\sqrt{2}\sqrt{6}}", r"\boxed{\sqrt{3} + \sqrt{3}}",
      r"\boxed{\sqrt{4}\sqrt{3}}"]),
    (r"Simplify $\sqrt{8}$. Express your answer in simplest radical form.", r"2\sqrt{2}",
     [r"\boxed{2\sqrt{2}}"], [r"\boxed{2^{3/2}}", r"\boxed{2^{\frac{3}{2}}}", r"\boxed{\sqrt{2}+\sqrt{2}}"]),
    (r"Simplify $\sqrt{12} + \sqrt{3}$. Express your answer in simplest radical form.", r"3\sqrt{3}",
     [r"\boxed{3\sqrt{3}}"], [r"\boxed{2\sqrt{3}+\sqrt{3}}", r"\boxed{\sqrt{3}+\sqrt{3}+\sqrt{3}}"]),
])
def test_simplest_radical_form_sees_roots_written_as_exponents_products_and_like_terms(
        verifier, question, gold, right, wrong_form):
    task = Task(question, answer=gold)
    for answer in right:
        assert verifier(task, answer).reward == 1.0, answer
    for answer in wrong_form:
        score = verifier(task, answer)
        assert score.reward == 0.0, answer
        assert "radical" in score.info["error"] or "own expressions" in score.info["error"], (answer, score.info)


@pytest.mark.parametrize("hedge", [
    r"\boxed{3 \text{ or } 5}", r"\boxed{5=3}", r"\boxed{3=5}", r"\boxed{3 \approx 5}", r"\boxed{5 \approx 3}",
    r"\boxed{3 \text{ (or 5)}}", r"\boxed{5 \text{ (or 3)}}", r"\boxed{3, 5}", r"\boxed{\{3, 5\}}", r"\boxed{x = 3, x = 5}",
    "The answer is 3 or 5", "The answer is 5 or 3", r"\boxed{3 \pmod 5}", r"\boxed{3 \sim 5}",
])
def test_two_answers_in_one_never_pay_for_both(verifier, hedge):
    paid = [verifier(Task(q, answer=gold), hedge).reward for q, gold in (("What is 2+1?", "3"), ("What is 2+3?", "5"))]
    assert paid != [1.0, 1.0], hedge


@pytest.mark.parametrize("tower", ["((2**1000)**1000)**1000", "((2**1000 + 1)**1000 + 1)**1000",
                                   "(((y+1)**1000)**1000)", "((((2**999)**999)**999)**999)"])
def test_a_tower_of_small_exponents_never_reaches_sympy(tower):
    """Each exponent passed the grammar's bound (1000), their product did not: the scorer ran until the time
    limit killed it (5 s of a worker per completion; the docs promised such towers never reach SymPy)."""
    pytest.importorskip("reasoning_gym")
    from llmgym.envs.math.answer_grammar import check_answer

    for dataset in ("polynomial_multiplication", "simple_integration", "intermediate_integration"):
        assert "powers of powers" in check_answer(dataset, tower, {})
    for fine in ("(y**2 + 1)**3", "y**1000", "(y**2)**500", "2**y**1000", "-27508*y**8 + 944840*y**6"):
        assert check_answer("polynomial_multiplication", fine, {}) is None, fine
    import gymnasium

    env = gymnasium.make("llmgym/RG-polynomial_multiplication-v0")
    env.reset(seed=0)
    _, reward, *_, info = env.step(f"<answer>{tower}</answer>")
    assert reward == 0.0 and "powers of powers" in info["error"]


@pytest.mark.parametrize("hedge", [
    "{a} or {b}", r"\boxed{{{a} \text{{ or }} {b}}}", r"\boxed{{{a}, {b}}}", "{a}/{b}", r"\boxed{{{a}/{b}}}", "{a} {b}",
    r"\boxed{{{a}}} \boxed{{{b}}}", r"\boxed{{\{{{a}, {b}\}}}}",
])
@pytest.mark.parametrize("pair", [("Monday", "Tuesday"), ("yes", "no"), (r"\text{(A)}", r"\text{(B)}")])
def test_two_word_answers_in_one_never_pay_for_both(verifier, hedge, pair):
    for a, b in (pair, pair[::-1]):
        answer = hedge.format(a=a, b=b)
        paid = [verifier(Task("Which one?", answer=gold), answer).reward for gold in pair]
        assert paid != [1.0, 1.0], answer


@pytest.mark.parametrize("huge", [r"\boxed{((2^{1000})^{1000})^{1000}}", r"\boxed{(((2^{999})^{999})^{999})^{999}}",
                                  r"\boxed{(10^{100})!}", r"\boxed{\binom{10^{9}}{10^{8}}}", r"\boxed{2^{2^{2^{2^{2}}}}}"])
def test_latex_towers_are_refused_by_size_in_the_sandbox(verifier, huge):
    score = verifier(Task("What is 2+1?", answer="3"), huge)
    assert score.reward == 0.0 and "bits" in score.info["error"], score.info


# -- issue 38: answers in forms the question rules out, judged by rules that close the class -------------------


@pytest.mark.parametrize("question, gold, approximation, exact", [
    (r"Express $0.\overline{6}$ as a fraction.", r"\frac{2}{3}", "0.666667", r"\frac{2}{3}"),
    (r"A circle has radius $2$. Express its area in terms of $\pi$.", r"4\pi", "12.566371", r"4 \pi"),
    (r"Simplify $\sqrt{12}$.", r"2\sqrt{3}", "3.464102", r"2\sqrt3"),
    (r"Give $\cos 45^\circ$ in exact form.", r"\frac{\sqrt{2}}{2}", "0.707107", r"\frac{\sqrt2}{2}"),
    (r"What is $\frac{1}{3} + \frac{1}{3}$?", r"\frac{2}{3}", "0.6666667", "2/3"),
    (r"What is the area of a circle of radius $1$?", r"\pi", "3.14159265", r"\pi"),
    (r"What is $\sqrt{2} \cdot \sqrt{3}$?", r"\sqrt{6}", "2.449490", r"\sqrt{6}"),
    (r"What is $\frac{5}{7}$ of $1$?", r"\frac{5}{7}", "0.714286", r"\dfrac{5}{7}"),
])
def test_an_exact_reference_wants_an_exact_answer(verifier, question, gold, approximation, exact):
    """A decimal approximation of an exact reference paid 1.0 (math-verify rounds to 6 places): it is right only
    where the question asks for a decimal; a decimal that *is* the exact value (0.5 for 1/2) still pays."""
    task = Task(question, answer=gold)
    score = verifier(task, rf"\boxed{{{approximation}}}")
    assert score.reward == 0.0 and "approximation" in score.info["error"], score.info
    assert verifier(task, rf"\boxed{{{exact}}}").reward == 1.0
    rounded = Task(question.rstrip(".?") + ", rounded to six decimal places.", answer=gold)
    if len(approximation.split(".")[1]) == 6:
        assert verifier(rounded, rf"\boxed{{{approximation}}}").reward == 1.0  # asked for: pays


def test_a_decimal_that_is_the_exact_value_or_is_asked_for_pays(verifier):
    assert verifier(Task("What is the probability of heads?", answer=r"\frac{1}{2}"), r"\boxed{0.5}").reward == 1.0
    assert verifier(Task(r"What is $3/8$?", answer=r"\frac{3}{8}"), "0.375").reward == 1.0
    assert verifier(Task(r"Write $\frac{2}{3}$ as a decimal to the nearest thousandth.", answer=r"\frac{2}{3}"),
                    "0.667").reward == 0.0  # the reference is not what was asked: no rounding rule can make it pay
    assert verifier(Task(r"Round $\pi$ to the nearest hundredth.", answer="3.14"), "3.14").reward == 1.0
    assert verifier(Task(r"Estimate $\sqrt{2}$.", answer=r"\sqrt{2}"), "1.414214").reward == 1.0


NO_OPS = [  # the question's expression plus an operation that evaluates away (each paid 1.0)
    (r"Compute $\dbinom{8}{4}$.", "70", [
        r"\binom{8}{4}+1-1", r"\left|\binom{8}{4}\right|", r"\lfloor\binom{8}{4}\rfloor", r"\binom{8}{4}\cdot 10^{0}",
        r"\binom{8}{4}\cdot(2-1)", r"\binom{8}{4}\cdot 1!", r"\binom{8}{4}\cdot\frac{2}{2}", r"\frac{8!}{4!4!}",
        r"\binom{8}{8-4}", r"\lceil \binom{8}{4} \rceil", r"\binom{8}{4}^{2-1}", r"\binom{8}{4} + 0 \cdot 5",
        r"\sqrt{\binom{8}{4}^2}", r"70 + 1 - 1", r"\frac{140}{2}"]),
    (r"Compute $\sqrt{16}$.", "4", [r"\sqrt{16}+1-1", r"\sqrt{4^2}", r"\sqrt{\sqrt{256}}", r"|\sqrt{16}|", r"2^2"]),
    (r"Simplify $\frac{12}{18}$.", r"\frac{2}{3}", [r"\frac{12}{18}+1-1", r"\frac{24}{36}", r"\frac{6 \cdot 2}{18}",
                                                   r"\frac{12}{18}\cdot\frac{3}{3}", r"1 - \frac{1}{3}"]),
    (r"Expand $(x+1)^2$.", "x^2 + 2x + 1", [r"(x+1)^2 + 1 - 1", r"(x+1)^2 + x - x", r"x^2 + x + x + 1"]),
]


@pytest.mark.parametrize("question, gold, answers", NO_OPS, ids=["binom", "sqrt", "fraction", "expand"])
def test_a_written_out_reference_wants_a_written_out_answer(verifier, question, gold, answers):
    """Where the reference is written out (SymPy's evaluation leaves its tree as it is), an answer that still
    evaluates to another tree scores 0, whatever the no-op: no list of spellings to outrun."""
    task = Task(question, answer=gold)
    for answer in answers:
        score = verifier(task, rf"\boxed{{{answer}}}")
        assert score.reward == 0.0, (answer, score.info)
        assert any(w in score.info.get("error", "") for w in ("written out", "own expressions")), (answer, score.info)


@pytest.mark.parametrize("gold, right", [
    ("70", ["70", "70.0", "+70", r"\text{70}", "x = 70"]),
    (r"\frac{2}{3}", [r"\dfrac{2}{3}", r"\frac23", "2/3", r"\tfrac{2}{3}", r"\frac{2}{3} \cdot 1"]),
    ("2x + 2", ["2(x+1)", "2 + 2x", "2(1 + x)"]),
    (r"\frac{\pi}{2}", [r"\pi/2", r"\frac{1}{2}\pi", r"\frac12 \pi", r"0.5\pi"]),
    (r"2\sqrt{3}", [r"2\sqrt3", r"\sqrt{3} \cdot 2", r"2 \cdot 3^{1/2}"]),
    (r"-\frac{1}{6}", [r"\frac{-1}{6}", r"-1/6", r"-\dfrac16"]),
    (r"x^2 - 2x - 3", ["x^{2}-2x-3", "-3 - 2x + x^2", "x^2 - 2 x - 3"]),
])
def test_written_out_spellings_of_a_written_out_reference_still_pay(verifier, gold, right):
    task = Task("q", answer=gold)
    for answer in right:
        score = verifier(task, rf"\boxed{{{answer}}}")
        assert score.reward == 1.0, (answer, score.info)


def test_a_reference_that_is_not_written_out_sets_no_form(verifier):
    # the dataset's own unevaluated reference: any equal answer pays (the rule follows the reference)
    assert verifier(Task("q", answer=r"\sqrt{27}"), r"\boxed{3\sqrt{3}}").reward == 1.0
    assert verifier(Task("q", answer=r"3\sqrt{3}"), r"\boxed{\sqrt{27}}").reward == 0.0
    assert verifier(Task("q", answer=r"2^{10}"), r"\boxed{1024}").reward == 1.0
    assert verifier(Task("q", answer="2^{3} \\cdot 18"), r"\boxed{8 \cdot 18}").reward == 1.0


@pytest.mark.parametrize("question, gold, answer, reward", [
    ("Express $12000$ in scientific notation.", r"1.2 \times 10^{4}", "12000", 0.0),
    ("Express $12000$ in scientific notation.", r"1.2 \times 10^{4}", r"12 \times 10^{3}", 0.0),
    ("Express $12000$ in scientific notation.", r"1.2 \times 10^{4}", r"1.2 \cdot 10^4", 1.0),
    ("Express $0.000045$ in scientific notation.", r"4.5 \times 10^{-5}", "0.000045", 0.0),
    ("Express $0.000045$ in scientific notation.", r"4.5 \times 10^{-5}", r"4.5 \times 10^{-5}", 1.0),
    # a % sign means hundredths, except where the question asks for a percent or the reference is one
    ("What is $1 + 2$?", "3", r"3\%", 0.0),
    ("q", "0.03", r"3\%", 1.0),
    ("What percent of $100$ is $3$?", "3", r"3\%", 1.0),
    ("What percent of $100$ is $3$?", r"3\%", "3", 1.0),
    ("What percent of $100$ is $3$?", r"3\%", "0.03", 0.0),
    ("What percent of $100$ is $3$?", "3", "0.03", 0.0),
    ("q", r"300\%", "3", 0.0),
    # units are compared as written, never converted nor dropped unseen
    ("How long is the rod?", r"5 \text{ m}", r"5 \text{ cm}", 0.0),
    ("How long is the rod?", r"5 \text{ m}", r"500 \text{ cm}", 0.0),
    ("How long is the rod?", r"5 \text{ m}", r"5 \text{ meters}", 1.0),
    ("How long is the rod?", r"5 \text{ m}", "5", 1.0),
    ("How long, in meters, is the rod?", "5", r"5 \text{ cm}", 0.0),
    ("How long, in centimeters, is the rod?", "5", r"5 \text{ cm}", 1.0),
    ("How long, in centimeters, is the rod?", "5", r"5\,\mathrm{cm}", 1.0),
    ("What is the area, in square feet?", "12", r"12 \text{ ft}^2", 1.0),
])
def test_scientific_notation_percent_and_units(verifier, question, gold, answer, reward):
    score = verifier(Task(question, answer=gold), rf"\boxed{{{answer}}}")
    assert score.reward == reward, score.info


def _spellings(gold: str) -> set[str]:
    """The usual equivalent spellings of a reference answer: wrappers and LaTeX variants a model writes."""
    import re

    forms = {gold, gold.replace(r"\frac", r"\dfrac"), gold.replace(" ", ""), re.sub(r"\s*([-+,])\s*", r" \1 ", gold),
             gold.replace(r"\left", "").replace(r"\right", ""), gold.replace(r"\times", r"\cdot"),
             re.sub(r"\\frac\{(\d)\}\{(\d)\}", r"\\frac\1\2", gold), re.sub(r"\\frac\{(\d+)\}\{(\d+)\}", r"\1/\2", gold),
             re.sub(r"\\sqrt\{(\d)\}", r"\\sqrt\1", gold), re.sub(r"\^(\d)", r"^{\1}", gold),
             re.sub(r"\\frac\{\\pi\}\{(\d)\}", r"\\pi/\1", gold)}
    return (forms | {rf"\boxed{{{form}}}" for form in forms} | {f"The final answer is ${gold}$."}
            | {rf"$\boxed{{{gold}}}$", rf"\boxed{{ {gold} }}", f"${gold}$"})


EXTRA_SPELLINGS = {  # what a model writes for some of the sample's questions beyond LaTeX variants
    "25": [r"\boxed{25\%}", r"25 \%", r"\boxed{25 \text{ percent}}", "The answer is 25 percent.", "The answer is 25%.",
           r"\boxed{25\text{%}}", r"\boxed{25 \, \%}"],
    "5": [r"\boxed{5 \text{ cm}}", r"\boxed{5\text{ centimeters}}", "The diagonal is 5 cm.", "The answer is $5$ centimeters.",
          r"\boxed{5 cm}", r"\boxed{5\,\text{cm}}", r"\boxed{5~\mathrm{cm}}", r"\boxed{5 \textrm{ cm}}", r"\boxed{5\;cm}",
          r"\boxed{5 \mathrm{~cm}}", "The answer is $5\\text{ cm}$.", "\\boxed{5\u00a0cm}"],
    "36": [r"\boxed{36 \text{ units}^2}", r"\boxed{36 \text{ square units}}", r"\boxed{36 \text{ sq units}}",
           "The area is 36 square units."],
    "\\begin{pmatrix} 4 & 6 \\end{pmatrix}": [r"\boxed{\begin{bmatrix} 4 & 6 \end{bmatrix}}",
                                             r"\boxed{\left(\begin{matrix} 4 & 6 \end{matrix}\right)}"],
    "\\left( 3, \\frac{\\pi}{2} \\right)": [r"\boxed{(3, \pi/2)}", r"\boxed{\left(3, \tfrac{\pi}{2}\right)}"],
    "1, 2": [r"\boxed{2, 1}", r"\boxed{\{1, 2\}}", r"\boxed{x = 1, x = 2}", r"\boxed{\left\{ 1, 2 \right\}}",
             r"\boxed{\lbrace 1, 2 \rbrace}"],
    "(3, \\infty)": [r"\boxed{(3, +\infty)}", r"\boxed{(3,\infty)}", r"\boxed{\left(3, \infty\right)}", "\\boxed{(3, \u221e)}",
                     r"\boxed{(3, \infty )}"],
    "4\\pi": ["\\boxed{4\u03c0}", r"\boxed{4 \pi}", r"\boxed{4\pi \text{ square units}}"],
    "x^2 - 2x - 3": ["\\boxed{x\u00b2 \u2212 2x \u2212 3}", r"\boxed{x^2-2x-3}"],
    "2\\sqrt{3}": [r"\boxed{2\,\sqrt{3}}", r"\boxed{2 \sqrt 3}"],
    "70": ["There are 70 ways.", r"\boxed{\mathbf{70}}", r"\boxed{\textbf{70}}"],
    "10": [r"\boxed{10.0}", "\\boxed{\uff11\uff10}"],
}


def test_every_gold_of_the_math_sample_pays_against_its_usual_spellings(verifier):
    """False refusals: each reference of the shipped MATH sample, against itself and its usual spellings."""
    from llmgym.envs.math import load_math

    from pathlib import Path

    tasks = load_math(Path(__file__).parents[1] / "data" / "math_sample.jsonl")
    refused, checked = [], 0
    for task in tasks:
        for completion in sorted(_spellings(task.answer)) + EXTRA_SPELLINGS.get(task.answer, []):
            checked += 1
            score = verifier(task, completion)
            if score.reward != 1.0:
                refused.append((task.answer, completion, score.info.get("error")))
    assert refused == [], f"{len(refused)} of {checked} refused: {refused}"
    assert len(tasks) >= 15 and checked >= 90


# -- the gaps of the rules above, closed ---------------------------------------------------------------------


@pytest.mark.parametrize("question, gold, completion, reward", [
    # a unit in plain words after the answer is a unit, judged like one in \text{} (each paid 1.0: only the number
    # was read)
    ("How long is the rod?", r"5 \text{ m}", "The rod is 5 cm long.", 0.0),
    ("How long is the rod?", r"5 \text{ m}", "The answer is 5 cm.", 0.0),
    ("How long is the rod?", r"5 \text{ m}", r"The answer is $5$ centimeters.", 0.0),
    ("How long is the rod?", r"5 \text{ m}", r"\boxed{5 cm}", 0.0),
    ("How long, in meters, is the rod?", "5", "The answer is 5 cm.", 0.0),
    ("How long, in meters, is the rod?", "5", "The answer is 5 meters.", 1.0),
    ("How long, in meters, is the rod?", "5", "So the rod is 5 in total.", 1.0),  # "in" the preposition
    # "in" (the preposition) and a symbol letter of the question name no unit
    ("How long, in meters, is the rod?", "5", r"\boxed{5 \text{ in}}", 0.0),
    # a power after a unit is part of it: \text{units}^2 is square units, cm^2 is not cm
    ("What is the area?", r"25 \text{ square units}", r"\boxed{25 \text{ units}^2}", 1.0),
    ("What is the area?", r"25 \text{ cm}^2", r"\boxed{25 \text{ cm}}", 0.0),
    # a plain-number reference to a question naming no unit: the answer's unit is its own words (GSM8K-style
    # "45 minutes" must not be a false refusal)
    ("How long did he walk?", "45", "The answer is 45 minutes.", 1.0),
    ("How long did he walk?", "45", r"\boxed{45 \text{ minutes}}", 1.0),
    ("How long did he walk?", "45", "The answer is 46 minutes.", 0.0),
])
def test_a_unit_in_words_or_with_a_power_is_judged(verifier, question, gold, completion, reward):
    score = verifier(Task(question, answer=gold), completion)
    assert score.reward == reward, score.info


@pytest.mark.parametrize("gold, wrong, right", [
    # a pair the as-written parser read as an empty interval, and matrices, were not looked at entry by entry
    (r"\left( 3, \frac{\pi}{2} \right)", [r"(1+2, \frac{\pi}{2})", r"(3, 1.570796)"], [r"(3, \frac{\pi}{2})", r"(3, \pi/2)"]),
    (r"\begin{pmatrix} 2 & 0 \end{pmatrix}", [r"\begin{pmatrix} 1+1 & 0 \end{pmatrix}",
                                              r"\begin{pmatrix} 2 & \binom{3}{0} - 1 \end{pmatrix}"],
     [r"\begin{pmatrix} 2 & 0 \end{pmatrix}"]),
    (r"\begin{pmatrix} \frac{1}{2} \\ \sqrt{2} \end{pmatrix}", [r"\begin{pmatrix} 0.5 \\ 1.414214 \end{pmatrix}"],
     [r"\begin{pmatrix} 0.5 \\ \sqrt{2} \end{pmatrix}"]),
])
def test_tuples_and_matrices_are_checked_entry_by_entry(verifier, gold, wrong, right):
    task = Task("q", answer=gold)
    for answer in wrong:
        score = verifier(task, rf"\boxed{{{answer}}}")
        error = score.info.get("error") or ""
        assert score.reward == 0.0 and ("written out" in error or "approximation" in error), (answer, score.info)
    for answer in right:
        assert verifier(task, rf"\boxed{{{answer}}}").reward == 1.0, answer


@pytest.mark.parametrize("question, gold, answer, reward", [
    # "percent" as a quantity of the question asks for no percent: 10\% is 0.1 there (it paid for 10)
    ("What is 20 percent of $50$?", "10", r"10\%", 0.0),
    ("What is twenty percent of $50$?", "10", r"10\%", 0.0),
    ("What percentage of $50$ is $10$?", "20", r"20\%", 1.0),
    ("A price of $50$ drops to $40$. What is the percent decrease?", "20", r"20\%", 1.0),
    # "round" and "nearest" allow a decimal only as a request for one (each approximation paid)
    (r"A round table has radius $\frac{2}{3}$ m. What is its radius?", r"\frac{2}{3}", "0.666667", 0.0),
    (r"A unit square has a point $P$ at its center. How far is $P$ from the nearest vertex?", r"\frac{\sqrt{2}}{2}",
     "0.707107", 0.0),
    (r"Write the repeating decimal $0.\overline{6}$ as a fraction.", r"\frac{2}{3}", "0.666667", 0.0),
    (r"What is $\sqrt{2}$ to the nearest millionth?", r"\sqrt{2}", "1.414214", 1.0),
    (r"What is $\frac{2}{3}$, rounded to six decimal places?", r"\frac{2}{3}", "0.666667", 1.0),
])
def test_percent_and_decimals_only_where_the_question_asks_for_them(verifier, question, gold, answer, reward):
    score = verifier(Task(question, answer=gold), rf"\boxed{{{answer}}}")
    assert score.reward == reward, score.info


def test_a_form_the_question_asks_for_holds_for_each_entry(verifier):
    # a tuple's or matrix's entries were not looked at: a fraction paid for "as a decimal", and a right matrix was
    # refused for "simplest radical form" (the as-written parser read no matrix)
    point = Task("Give each coordinate as a decimal.", answer="(0.5, 3)")
    assert verifier(point, r"\boxed{(\frac{1}{2}, 3)}").reward == 0.0
    assert verifier(point, r"\boxed{(0.5, 3)}").reward == 1.0
    matrix = Task("Write each entry in simplest radical form.", answer=r"\begin{pmatrix} 2\sqrt{3} & 1 \end{pmatrix}")
    assert verifier(matrix, r"\boxed{\begin{pmatrix} \sqrt{12} & 1 \end{pmatrix}}").reward == 0.0
    assert verifier(matrix, r"\boxed{\begin{pmatrix} 2\sqrt{3} & 1 \end{pmatrix}}").reward == 1.0
