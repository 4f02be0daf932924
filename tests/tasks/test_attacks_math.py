r"""Issue 30's closing attack on the math scorer: echoes with a no-op, forms written as exponents, hedges.

Found by the fresh attacker's pass (each scored 1.0 before the fix):

* the question's own expression with an operation that does nothing -- ``2^{10} \cdot 1``, ``+ 0``,
  ``^{1}``, ``/1``, ``--``, ``2.0^{10}``, ``16^{1/2}`` or ``\sqrt[2]{16}`` for ``\sqrt{16}``: the echo
  guard compared the trees as written, so any no-op made a new tree;
* "in simplest radical form" answered ``12^{1/2}`` (the question itself), ``\sqrt[4]{144}``,
  ``\sqrt{2}\sqrt{6}``, ``\sqrt{3} + \sqrt{3}`` or ``2^{3/2}``: a root written as an exponent was not
  seen as a root, and products of roots and like terms were not looked at.

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
