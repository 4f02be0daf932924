"""No reward comes free: every registered env, answered without content, and every multi-turn env, failed on purpose.

1. **Content-free answers** — empty, ``0``, ``1``, ``NaN``, ``no``, ``yes``, ``True``, the prompt
   echoed, the question's own numbers, its last number, the reference answer's shape with every digit
   0 (a zero grid), the puzzle with its blanks filled with 1 — through ``gymnasium.make`` and
   ``env.step``, as an RL run meets them (a multi-turn env gets the same answer every turn). For each
   env and each kind of answer the mean reward must stay below 0.1. A task whose reference answer the
   content-free string happens to be (``yes`` to a yes/no question, ``0`` where the answer is 0) is
   left out of that string's mean: a constant guess earns a two-way question's base rate by
   construction, and the sweep is about what *wrong* answers earn. Envs that pay partial credit by
   design say so in their description and offer binary scoring; the sweep checks them with it.
2. **Tool calls alone** — in every tool env, calling its tool right (and wrongly) every turn, never
   answering, returns nothing: only the final answer is scored.
3. **Failing on purpose** — in every multi-turn env, deliberate near misses followed by the right
   answer never return more than answering right at once (:meth:`llmgym.MultiTurnEnv.progress`); in a
   tool env the near misses are calls (right, malformed, to an unknown tool, with bad arguments).
(Content-free strategies against chance on every reasoning-gym family: ``test_reasoning_gym_chance.py``.)

Cost: reasoning-gym and code envs check each kind of answer once (on one of two tasks, alternating),
since each check there costs a process; the cheap envs check every kind on three tasks. A hole that
pays a kind only on some tasks (coin_flip's ``0`` paid only probabilities below 0.1) can slip past one
check: the attacks known per dataset are replayed on several seeds in ``tests/tasks/test_rg_guards.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium
import pytest

import llmgym

DATA = Path(__file__).resolve().parents[1] / "data"

#: Envs whose task needs a file to make (the repository's samples).
MAKE_KWARGS = {
    "llmgym/GSM8K-v0": {"path": str(DATA / "gsm8k_sample.jsonl")},
    "llmgym/MATH-v0": {"path": str(DATA / "math_sample.jsonl")},
}
#: Exempt by name: the task's answer *is* an echo of the prompt.
EXEMPT = {
    "llmgym/Copy-v0": "the answer is the prompt's digits: echoing the prompt is solving it",
    "llmgym/CopyRetry-v0": "Copy with retries: the answer is the prompt's digits echoed",
}
#: Partial credit by design (a tiny model climbs it from nothing); each description says so and the
#: binary scoring it offers is what the sweep checks.
PARTIAL_CREDIT = {
    "llmgym/Addition-v0": {"scoring": "binary"},
    "llmgym/Reverse-v0": {"scoring": "binary"},
}
#: reasoning-gym's scorer runs in a process per check under the env's time limit (tens of ms each); the
#: sweep is about what answers earn, not about that process, so it scores in the caller (the same
#: extraction, scorer and guard) to keep ~1,400 checks at a few seconds. If scoring moves to a sandbox
#: that ignores this, the sweep stays at one check per kind and env (see COSTLY).
FAMILY_KWARGS = {"reasoning-gym": {"time_limit": None}}
#: How each family reads an answer.
ANSWER_FORMAT = {"reasoning-gym": "<answer>{}</answer>", "math": "\\boxed{{{}}}"}
#: Families where a check costs a process (reasoning-gym's scorer, the code sandbox): each kind once.
COSTLY = {"reasoning-gym", "code"}
#: Envs outside the code family whose steps may run the sandbox (the python tool).
SANDBOXED = {"llmgym/PythonMath-v0"}

ENVS = [info for info in llmgym.registered_envs() if isinstance(info.factory, str)]


def _prompt_text(task) -> str:
    return task.prompt if isinstance(task.prompt, str) else "\n".join(str(m.get("content", "")) for m in task.prompt)


def content_free(task, prompt: str) -> dict[str, str]:
    """The content-free answers to ``task``, by kind (only those that exist for it)."""
    question = str(task.metadata.get("entry", {}).get("question", "")) if isinstance(task.metadata, dict) else ""
    question = question or _prompt_text(task)
    numbers = re.findall(r"-?\d+(?:\.\d+)?", question)
    answers = {"empty": "", "0": "0", "1": "1", "NaN": "NaN", "no": "no", "yes": "yes", "True": "True",
               "echo": prompt}
    if numbers:
        answers["numbers"] = ", ".join(numbers)
        answers["first number"], answers["last number"] = numbers[0], numbers[-1]
    reference = task.answer if isinstance(task.answer, str) else ""
    if re.search(r"\d", reference) and not reference.lstrip().startswith(("def ", "import ", "from ")):
        answers["zero grid"] = re.sub(r"\d", "0", reference)
    blanks = [line for line in question.splitlines() if "_" in line and re.fullmatch(r"[\d_\s|]+", line.strip())]
    if blanks:
        answers["blanks as 1"] = "\n".join(line.replace("_", "1") for line in blanks)
    return answers


def _is_reference(answer: str, task) -> bool:
    """Whether ``answer`` is the task's own reference answer (then it is right, not content-free)."""
    from llmgym.envs.math.rg_guards import parse_number

    if task.answer is None:
        return False
    reference = str(task.answer)

    def norm(text: str) -> str:
        return re.sub(r"\s+", "", text).lower().rstrip(".")

    if norm(answer) == norm(reference):
        return True
    a, b = parse_number(answer.replace(",", "")), parse_number(reference.replace(",", ""))
    return a is not None and a == b


def _needs(info) -> None:
    for module in info.requires:
        pytest.importorskip(module)
    if info.family == "code" or info.id in SANDBOXED:
        from llmgym.sandbox import check_sandbox

        missing = check_sandbox()["missing"]
        if missing:
            pytest.skip(f"sandbox mechanisms missing: {missing}")


def _episode_return(env, seed: int, answer_for) -> float:
    """Reset to ``seed`` and answer ``answer_for(task, turn)`` every turn; the sum of the rewards."""
    obs, info = env.reset(seed=seed)
    task, total, turn = info["task"], 0.0, 0
    while True:
        obs, reward, terminated, truncated, _ = env.step(answer_for(task, turn))
        total += reward
        turn += 1
        if terminated or truncated:
            return total


@pytest.mark.filterwarnings("ignore:reasoning-gym .* hash randomisation")
@pytest.mark.parametrize("info", ENVS, ids=[info.id for info in ENVS])
def test_content_free_answers_earn_nothing(info):
    if info.id in EXEMPT:
        pytest.skip(f"exempt: {EXEMPT[info.id]}")
    _needs(info)
    kwargs = {**FAMILY_KWARGS.get(info.family, {}), **MAKE_KWARGS.get(info.id, {})}
    if info.id in PARTIAL_CREDIT:
        assert "partial credit" in info.description and "scoring='binary'" in info.description, info
        kwargs.update(PARTIAL_CREDIT[info.id])
    env = gymnasium.make(info.id, **kwargs)
    form = ANSWER_FORMAT.get(info.family, "{}")
    seeds = (0, 1) if info.family in COSTLY else (0, 1, 2)
    rewards: dict[str, list[float]] = {}
    for seed in seeds:
        obs, reset_info = env.reset(seed=seed)
        task = reset_info["task"]
        answers = sorted(content_free(task, obs["prompt"]).items())
        if info.family in COSTLY:  # each kind once, alternating between the two tasks
            answers = answers[seed::len(seeds)]
        for kind, answer in answers:
            if _is_reference(answer, task):
                continue
            completion = form.format(answer)
            rewards.setdefault(kind, []).append(_episode_return(env, seed, lambda task, turn: completion))
    means = {kind: sum(r) / len(r) for kind, r in rewards.items()}
    assert means and all(m < 0.1 for m in means.values()), {k: round(m, 3) for k, m in means.items() if m >= 0.1}


# -- tool calls alone ----------------------------------------------------------------------------------------
def _hermes_call(name: str, arguments) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


#: For every tool env: its tool and ``task -> the arguments of a right call`` (one that computes the
#: answer). Calls are written in the Hermes format: the registry's envs have no tokenizer, so
#: ``call_format="auto"`` reads Hermes. A new tool env must add its own here.
TOOL_CALLS = {
    "llmgym/Calculator-v0": ("calculator", lambda task: {"expression": " * ".join(task.id.split("-")[1:])}),
    "llmgym/PythonMath-v0": ("python", lambda task: {"code": f"print({int(task.answer)})"}),
}
TOOL_ENVS = [info for info in ENVS if info.family == "tools"]


def _right_call(env_id: str):
    name, arguments = TOOL_CALLS[env_id]
    return lambda task, turn: _hermes_call(name, arguments(task))


def _tool_detour(env_id: str):
    """Turn by turn: a right tool with bad arguments, a malformed call, a call to an unknown tool, a right call."""
    name, arguments = TOOL_CALLS[env_id]

    def detour(task, turn: int) -> str:
        bad = {key: 12 for key in arguments(task)}  # every argument of the wrong type
        kinds = (_hermes_call(name, bad), "<tool_call>{not json</tool_call>", _hermes_call("no_such_tool", {}),
                 _hermes_call(name, arguments(task)))
        return kinds[turn % len(kinds)]

    return detour


def test_every_tool_env_has_a_call_below():
    missing = sorted(info.id for info in TOOL_ENVS if info.id not in TOOL_CALLS)
    assert TOOL_ENVS and not missing, f"add a right call for {missing} to TOOL_CALLS in this file"


@pytest.mark.parametrize("info", TOOL_ENVS, ids=[info.id for info in TOOL_ENVS])
def test_tool_calls_alone_earn_nothing(info):
    _needs(info)
    env = gymnasium.make(info.id)
    for seed in (0, 1):
        for answer_for in (_right_call(info.id), _tool_detour(info.id)):
            assert _episode_return(env, seed, answer_for) == 0.0, (info.id, seed)
            assert env.unwrapped.state["tool_calls"] == env.unwrapped.max_turns  # every turn called, none answered
    errors = env.unwrapped.state["tool_errors"]  # the detour's wrong calls were refused, each for its reason
    assert {"malformed", "unknown_tool", "bad_arguments"} <= set(errors), errors


# -- failing on purpose ------------------------------------------------------------------------------------
def _digits_near_miss(task, turn):  # one digit off: the most partial credit short of the answer
    answer = str(task.answer)
    return answer[:-1] + str((int(answer[-1]) + 1 + turn) % 10)


def _code_near_miss(task, turn):  # passes the prompt's shown assert by a lookup, fails the hidden ones
    import ast

    entry = task.metadata["entry_point"]
    shown = [line.strip() for line in _prompt_text(task).splitlines() if line.strip().startswith(f"assert {entry}(")]
    table = {}
    for line in shown:
        test = ast.parse(line).body[0].test
        if isinstance(test, ast.Compare):
            table[repr(tuple(ast.literal_eval(a) for a in test.left.args))] = ast.literal_eval(test.comparators[0])
    return f"```python\nTABLE = {table!r}\ndef {entry}(*args):\n    return TABLE.get(repr(args))\n```"


def _word_near_miss(task, turn):  # four letters of five in place
    secret = str(task.answer)
    return secret[:-1] + ("z" if secret[-1] != "z" else "y")


def _number_near_miss(task, turn):
    return str(int(task.answer) + 1 + turn)


#: For every multi-turn env: ``(right answer, near miss)`` as functions of ``(task, turn)``. A new
#: multi-turn env must add its own here (the test below fails until it does).
STRATEGIES = {
    "llmgym/CopyRetry-v0": (lambda task, turn: str(task.answer), _digits_near_miss),
    "llmgym/CodeRetry-v0": (lambda task, turn: f"```python\n{task.answer}\n```", _code_near_miss),
    "llmgym/GuessNumber-v0": (lambda task, turn: str(task.answer), _number_near_miss),
    "llmgym/Wordle-v0": (lambda task, turn: str(task.answer), _word_near_miss),
    **{env_id: (lambda task, turn: str(task.answer), _tool_detour(env_id)) for env_id in TOOL_CALLS},
}
MULTI_TURN = [info for info in ENVS if info.multi_turn]


def test_every_multi_turn_env_has_a_strategy_below():
    missing = sorted(info.id for info in MULTI_TURN if info.id not in STRATEGIES)
    assert not missing, f"add a right answer and a near miss for {missing} to STRATEGIES in this file"


@pytest.mark.parametrize("info", MULTI_TURN, ids=[info.id for info in MULTI_TURN])
def test_failing_on_purpose_never_beats_answering_at_once(info):
    if info.id not in STRATEGIES:
        pytest.skip("no strategy yet: see test_every_multi_turn_env_has_a_strategy_below")
    _needs(info)
    right, near = STRATEGIES[info.id]
    env = gymnasium.make(info.id, **MAKE_KWARGS.get(info.id, {}))
    max_turns = env.unwrapped.max_turns
    for seed in (0, 1):
        at_once = _episode_return(env, seed, right)
        assert at_once > 0, (info.id, seed)  # the right answer is right
        for misses in range(1, max_turns + 1):  # misses == max_turns: never answers at all
            late = _episode_return(env, seed, lambda task, turn: near(task, turn) if turn < misses else right(task, turn))
            assert late <= at_once + 1e-9, (info.id, seed, misses, late, at_once)


def test_an_attempt_that_breaks_the_checker_scores_zero_under_progress_shaping():
    from llmgym import MultiTurnEnv, Task

    def share(task, text):  # partial credit that raises on a hostile attempt
        if "boom" in text:
            raise ValueError("the checker broke")
        return sum(a == b for a, b in zip(text, task.answer)) / len(task.answer)

    class Retry(MultiTurnEnv):
        def respond(self, completion):
            if "boom" in completion:
                raise ValueError("the checker broke")
            return super().respond(completion)

    env = Retry([Task("copy:1234=", answer="1234")], share, max_turns=4)
    env.reset(seed=0)
    rewards = [env.step("1239")[1]]  # a near miss: 0.75
    obs, reward, terminated, truncated, info = env.step("boom")
    rewards.append(reward)
    assert terminated and "error" in info and sum(rewards) == 0.0  # the episode's last attempt scored 0
