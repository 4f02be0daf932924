r"""Red-team pass on the math verifier (attacks not listed in issue 17), through ``gymnasium.make`` / ``env.step``.

* The question's own expression echoed: math-verify evaluates it, so "What is $\frac{3}{6}$ in lowest
  terms?" answered ``\frac{3}{6}`` (or ``3/6``), "Factor $x^2-1$" answered ``x^2-1``, "Compute
  $\dbinom{8}{4}$" answered ``\dbinom{8}{4}`` each scored 1.0 on MATH-format tasks.
* ``Arithmetic`` (``literal_answer=True``) took ``20/4`` as a number written out: "Compute 20 / 4."
  answered with the question itself scored 1.0 (every task with ``ops="/", max_ops=1``).
* ``1\,000`` (LaTeX's thin space between thousands) parsed as ``1 \cdot 000``: it scored 0 against a
  gold of 1000 and 1.0 against a gold of 0.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium
import pytest

import llmgym  # noqa: F401  (registers the envs)
from llmgym import Task

pytest.importorskip("math_verify")

from llmgym.envs.math import MathVerifier  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(time_limit=10) as v:
        yield v


def test_math_env_question_expression_echoed_scores_zero():
    env = gymnasium.make("llmgym/MATH-v0", path=str(DATA / "math_sample.jsonl"))
    task_id = "sample/prealgebra/1.json"  # "What is $\frac{3}{6}$ in lowest terms?", answer \frac{1}{2}
    rewards = {}
    for completion in (r"\boxed{\frac{3}{6}}", r"The answer is $\dfrac{3}{6}$.", "3/6", r"\boxed{\frac12}", "0.5"):
        env.reset(options={"task_id": task_id})
        rewards[completion] = env.step(completion)[1]
    # "in lowest terms" asks for a fraction (issue 30): the decimal is the right value in another form
    assert rewards == {r"\boxed{\frac{3}{6}}": 0.0, r"The answer is $\dfrac{3}{6}$.": 0.0, "3/6": 0.0,
                       r"\boxed{\frac12}": 1.0, "0.5": 0.0}


@pytest.mark.parametrize("question, gold, echo, right", [
    (r"Compute $\dbinom{8}{4}$.", "70", r"\boxed{\binom{8}{4}}", r"\boxed{70}"),
    (r"Factor $x^2-1$.", "(x-1)(x+1)", r"\boxed{x^{2} - 1}", r"\boxed{(x+1)(x-1)}"),
    (r"Simplify $\sqrt{245}$.", r"7\sqrt{5}", r"\boxed{\sqrt{245}}", r"\boxed{7\sqrt{5}}"),
    (r"If $y = 2^3 \cdot 3$, what is $y$?", "24", r"\boxed{2^{3}\cdot3}", r"\boxed{24}"),
])
def test_question_expression_echoed_scores_zero(verifier, question, gold, echo, right):
    task = Task(question, answer=gold)
    echoed = verifier(task, echo)
    assert echoed.reward == 0.0 and "question's own expressions" in echoed.info["error"]
    assert verifier(task, right).reward == 1.0
    assert MathVerifier(refuse_echo=False, check_form=False)(task, echo).reward == 1.0  # math-verify alone agrees


@pytest.mark.parametrize("question, gold, echo, right", [
    (r"Express $\frac{3}{4}$ as a decimal.", "0.75", r"\boxed{\frac{3}{4}}", r"\boxed{0.75}"),
    (r"Express $0.75$ as a common fraction.", r"\frac{3}{4}", r"\boxed{0.75}", r"\boxed{\frac34}"),
])
def test_a_conversion_question_echoed_scores_zero(verifier, question, gold, echo, right):
    task = Task(question, answer=gold)
    assert verifier(task, echo).reward == 0.0
    assert verifier(task, right).reward == 1.0


def test_an_answer_that_appears_in_the_question_still_scores(verifier):
    task = Task(r"Which is larger, $\frac{1}{2}$ or $\frac{1}{3}$?", answer=r"\frac{1}{2}")
    assert verifier(task, r"\boxed{\dfrac12}").reward == 1.0  # the reference, as written
    assert verifier(Task(r"Which is larger, $7$ or $2 + 4$?", answer="7"), r"\boxed{7}").reward == 1.0
    assert verifier(Task(r"If $x = 5$, what is $x$?", answer="5"), r"\boxed{5}").reward == 1.0


@pytest.mark.parametrize("gold, completion, reward", [
    ("1000", r"\boxed{1\,000}", 1.0),
    ("0", r"\boxed{1\,000}", 0.0),
    ("1234567", r"\boxed{1\,234\,567}", 1.0),
    (r"1\,000", "1000", 1.0),
])
def test_thin_space_thousands(verifier, gold, completion, reward):
    assert verifier(Task("q", answer=gold), completion).reward == reward


def test_arithmetic_division_echoed_scores_zero():
    import re

    env = gymnasium.make("llmgym/Arithmetic-v0", ops="/", min_ops=1, max_ops=1, max_value=12)
    divisions = 0
    for seed in range(40):
        obs, info = env.reset(seed=seed)
        question = re.match(r"Compute (.*)\. Put", obs["prompt"]).group(1)
        if " / " not in question:
            continue  # not divisible: the generator fell back to +
        divisions += 1
        assert env.step(question)[1] == 0.0, question
        for written in (rf"\boxed{{{question.replace(' / ', '/')}}}", rf"\boxed{{\frac{{{question.split(' / ')[0]}}}{{{question.split(' / ')[1]}}}}}"):
            env.reset(seed=seed)
            assert env.step(written)[1] == 0.0, written
        env.reset(seed=seed)
        assert env.step(rf"\boxed{{{info['task'].answer}}}")[1] == 1.0
    assert divisions >= 4


def test_a_rewritten_echo_of_the_question_scores_zero(verifier):
    task = Task(r"What is $\frac{3}{6}$ in lowest terms?", answer=r"\frac{1}{2}")
    assert verifier(task, r"\boxed{\frac{6}{12}}").reward == 0.0
    task = Task(r"If $y = 2^3 \cdot 3$, what is $y$?", answer="24")
    assert verifier(task, r"\boxed{3 \times 2^3}").reward == 0.0


# issue 30: the echo guard compared regex-normalised text, so a spelling it did not know passed; now the
# answer is parsed as written (math-verify's own normaliser and parser, no evaluation) and compared as a tree
@pytest.mark.parametrize("echo", [
    r"\boxed{\frac{\,3}{6}}", r"\boxed{\frac{ 3 }{ 6 }}", r"\boxed{\tfrac{3}{\,6}}", r"\boxed{\left(\frac{3}{6}\right)}",
    r"\boxed{\text{3/6}}", r"\boxed{3 \div 6}", r"\boxed{\frac{6}{12}}", r"\boxed{0.5}",
])
def test_an_echo_or_an_unreduced_fraction_in_any_spelling_scores_zero(verifier, echo):
    task = Task(r"What is $\frac{3}{6}$ in lowest terms?", answer=r"\frac{1}{2}")
    score = verifier(task, echo)
    assert score.reward == 0.0 and ("own expressions" in score.info["error"] or "lowest terms" in score.info["error"])
    assert verifier(task, r"\boxed{\dfrac{1}{2}}").reward == 1.0


@pytest.mark.parametrize("question, gold, right, wrong_form", [
    (r"Simplify $\sqrt{48}$. Express your answer in simplest radical form.", r"4\sqrt{3}",
     [r"\boxed{4\sqrt{3}}", r"\boxed{\sqrt{3} \cdot 4}"], [r"\boxed{2\sqrt{12}}", r"\boxed{\frac{8\sqrt{3}}{2}}"]),
    (r"Rationalize the denominator of $\frac{2}{\sqrt{6}}$. Express your answer in simplest radical form.",
     r"\frac{\sqrt{6}}{3}", [r"\boxed{\frac{\sqrt{6}}{3}}", r"\boxed{\frac{1}{3}\sqrt{6}}"],
     [r"\boxed{\frac{2}{\sqrt{6}}}", r"\boxed{\frac{2\sqrt{6}}{6}}", r"\boxed{\sqrt{\frac{2}{3}}}"]),
    (r"Express $\frac{7}{8}$ as a decimal.", "0.875", [r"\boxed{0.875}"], [r"\boxed{\frac{14}{16}}"]),
    (r"Express $0.\overline{6}$ as a common fraction.", r"\frac{2}{3}", [r"\boxed{\frac{2}{3}}", "2/3"],
     [r"\boxed{\frac{4}{6}}", r"\boxed{0.6666666667}"]),
    (r"Solve $x^2 - 4 < 0$. Express your answer in interval notation.", "(-2, 2)", [r"\boxed{(-2, 2)}"],
     [r"\boxed{-2 < x < 2}"]),
])
def test_a_question_that_asks_for_a_form_gets_it(verifier, question, gold, right, wrong_form):
    task = Task(question, answer=gold)
    for answer in right:
        assert verifier(task, answer).reward == 1.0, answer
    for answer in wrong_form:
        assert verifier(task, answer).reward == 0.0, answer
