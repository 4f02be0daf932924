"""Red-team pass on reasoning-gym's binary rewards (attacks not listed in issue 17), through ``gymnasium.make``.

``propositional_logic`` pays any valid, non-tautological conclusion. The guard refused a premise
restated (and conjunctions / disjunctions made only of premises), but a premise *weakened* is just
as content-free and still scored 1.0: ``(p ∨ X)``, ``(X → p)``, ``(p ∧ (X ∨ ¬X))``, ``¬(¬p ∧ X)``,
``((p ∧ q) ∨ X)`` for premises ``p``, ``q`` and any variable ``X`` -- a mean reward of 0.375 to 0.75 over
eight seeds under the default ``scoring="binary"``.
"""

from __future__ import annotations

import gymnasium
import pytest

import llmgym  # noqa: F401  (registers the envs)

pytest.importorskip("reasoning_gym")

from llmgym.envs.math import rg_guards  # noqa: E402


def _weakenings(meta: dict) -> dict[str, str]:
    p, q = meta["premises"][0], meta["premises"][-1]
    x = meta["variables"][-1]
    return {
        "p or X": f"({p} ∨ {x})",
        "X implies p": f"({x} → {p})",
        "p and a tautology": f"({p} ∧ ({x} ∨ ¬{x}))",
        "de Morgan of p or not X": f"¬(¬{p} ∧ {x})",
        "two premises or X": f"(({p} ∧ {q}) ∨ {x})",
        "contrapositive": f"(¬{x} ∨ {p})",
    }


def test_propositional_logic_refuses_a_premise_weakened():
    env = gymnasium.make("llmgym/RG-propositional_logic-v0")
    upstream = gymnasium.make("llmgym/RG-propositional_logic-v0", scoring="upstream")
    paid_upstream, paid = [], []
    for seed in range(8):
        meta = env.reset(seed=seed)[1]["task"].metadata["entry"]["metadata"]
        for kind, answer in _weakenings(meta).items():
            env.reset(seed=seed)
            paid.append((env.step(f"<answer>{answer}</answer>")[1], kind, answer))
            upstream.reset(seed=seed)
            paid_upstream.append(upstream.step(f"<answer>{answer}</answer>")[1])
    assert max(r for r, _, _ in paid) == 0.0, [p for p in paid if p[0]]
    assert max(paid_upstream) == 1.0  # reasoning-gym's own score pays them (kept for evaluation parity)


def test_propositional_logic_still_pays_an_inference_that_combines_premises():
    entry = {"metadata": {"premises": ["Q", "(Q → P)"], "variables": ["P", "Q"]}}
    assert rg_guards.guard("propositional_logic", "(P ∧ Q)", entry, 1.0)[0] == 1.0  # quotes Q, needs (Q → P) too
    assert rg_guards.guard("propositional_logic", "(Q ∨ P)", entry, 1.0)[0] == 0.0  # Q alone gives it
    entry = {"metadata": {"premises": ["(P ∨ Q)", "¬Q"], "variables": ["P", "Q", "R"]}}
    assert rg_guards.guard("propositional_logic", "(P ∨ R)", entry, 1.0)[0] == 1.0  # disjunctive syllogism, weakened
    assert rg_guards.guard("propositional_logic", "(¬P → Q)", entry, 1.0)[0] == 0.0  # (P ∨ Q) rewritten


def test_propositional_formula_parser_groups_as_reasoning_gym_does():
    from reasoning_gym.logic.propositional_logic import Expression

    def table(formula, variables):
        out = []
        for i in range(1 << len(variables)):
            out.append(Expression.from_string(formula).evaluate({v: bool(i >> k & 1) for k, v in enumerate(variables)}))
        return out

    variables = ["P", "Q", "R"]
    full = (1 << 8) - 1
    bits = {v: sum(1 << i for i in range(8) if i >> k & 1) for k, v in enumerate(variables)}
    for formula in ["P → Q → R", "P ↔ Q → R", "¬P ∧ Q ∨ R", "¬(P ∨ ¬Q) ↔ ¬¬R", "P ∧ Q → R ∨ P", "((P))"]:
        mine = rg_guards._prop_table(rg_guards._prop_parse(formula), bits, full)
        assert [bool(mine >> i & 1) for i in range(8)] == table(formula, variables), formula
    assert rg_guards._prop_parse("(P") is None and rg_guards._prop_parse("P Q") is None


def test_puzzle24_pays_only_the_puzzles_own_numbers():
    # upstream checks that int(value) == 24 and that four numbers of the value range appear -- not that
    # they are the puzzle's: one constant answer scored 1.0 on every puzzle, and int() let 24.5 pass
    constants = ["6*4*1*1", "8+8+4+4", "(1+1+1)*8", "7/2*7*1"]
    env = gymnasium.make("llmgym/RG-puzzle24-v0")
    upstream = gymnasium.make("llmgym/RG-puzzle24-v0", scoring="upstream")
    paid, paid_upstream = [], []
    for seed in range(6):
        numbers = env.reset(seed=seed)[1]["task"].metadata["entry"]["metadata"]["numbers"]
        for answer in constants:
            if sorted(int(n) for n in answer.replace("(", " ").replace(")", " ").replace("*", " ").replace("+", " ")
                      .replace("/", " ").split()) == sorted(numbers):
                continue  # these happen to be the puzzle's numbers
            env.reset(seed=seed)
            paid.append((env.step(f"<answer>{answer}</answer>")[1], seed, answer))
            upstream.reset(seed=seed)
            paid_upstream.append(upstream.step(f"<answer>{answer}</answer>")[1])
    assert paid and max(r for r, _, _ in paid) == 0.0, [p for p in paid if p[0]]
    assert min(paid_upstream) == 1.0  # reasoning-gym's own score pays every one (kept for evaluation parity)


def test_puzzle24_right_answers_still_score():
    from llmgym.envs.math.reasoning import reasoning_gym_task

    for seed in range(20):
        task = reasoning_gym_task("puzzle24", seed)
        entry = task.metadata["entry"]
        assert rg_guards.guard("puzzle24", task.answer, entry, 1.0)[0] == 1.0, task.answer
        assert rg_guards.guard("puzzle24", f"({task.answer})", entry, 1.0)[0] == 1.0
    entry = {"metadata": {"numbers": [7, 2, 7, 1]}}
    assert rg_guards.guard("puzzle24", "7/2*7*1", entry, 1.0)[0] == 0.0  # 24.5: upstream's int() made it 24
    for payload in ["-" * 990 + "(7*2+7+1)", "'7'*2*7*1", "(7*2+7+1)/0", "__import__('os')"]:
        assert rg_guards.guard("puzzle24", payload, entry, 1.0)[0] == 0.0, payload
