"""Red-team pass on what reaches a checker: the completion's type and length (attacks not listed in issue 17).

* A ``str`` subclass whose ``==`` is always true (and whose ``strip()`` returns itself) scored 1.0
  through ``env.step`` on every env scored by exact match (``Reverse``/``Addition`` binary,
  ``CopyRetry`` binary).
* ``llmgym.interop.trl_reward_funcs`` handed TRL's completions to the verifier uncut: host-side
  parsing read any length (``env.step`` cuts at ``max_completion_chars``), and a completion whose
  answer sits past that cut scored 1.0 there and 0.0 through ``env.step``.
"""

from __future__ import annotations

import gymnasium
import pytest

import llmgym  # noqa: F401  (registers the envs)
from llmgym import SequenceEnv, Task
from llmgym.verifiers import exact_match


class AlwaysEqual(str):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = str.__hash__

    def strip(self, *chars):
        return self

    def __contains__(self, item):
        return True


@pytest.mark.parametrize("env_id, kwargs", [
    ("llmgym/Reverse-v0", {"scoring": "binary"}),
    ("llmgym/Addition-v0", {"scoring": "binary"}),
    ("llmgym/CopyRetry-v0", {"scoring": "binary"}),
])
def test_a_str_subclass_equal_to_everything_scores_zero(env_id, kwargs):
    env = gymnasium.make(env_id, **kwargs)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(AlwaysEqual("no answer"))
    assert reward == 0.0
    assert type(info["completion"]) is str


def test_a_verifier_called_directly_sees_exactly_a_str():
    seen = []
    env = SequenceEnv([Task("q", answer="a")], lambda task, text: seen.append(type(text)) or exact_match(task, text))
    assert env.verifier(Task("q", answer="a"), AlwaysEqual("b")).reward == 0.0
    assert seen == [str]


def test_trl_reward_function_cuts_completions_as_env_step_does():
    pytest.importorskip("math_verify")
    from llmgym.interop import trl_reward_funcs

    env = gymnasium.make("llmgym/Arithmetic-v0")
    obs, info = env.reset(seed=3)
    task = info["task"]
    limit = env.unwrapped.max_completion_chars
    completion = "x" * limit + rf"\boxed{{{task.answer}}}"  # the answer lies past the cut
    stepped = env.step(completion)
    assert stepped[1] == 0.0 and stepped[4]["truncated_completion"] == len(completion)
    (reward,) = trl_reward_funcs(env)
    row = {"task_id": [task.id] * 2, "task_seed": [3] * 2}
    assert reward(prompts=[obs["prompt"]] * 2, completions=[completion, rf"\boxed{{{task.answer}}}"], **row) == [0.0, 1.0]


def test_trl_reward_function_over_a_bare_verifier_cuts_at_the_default():
    from llmgym.core import DEFAULT_MAX_COMPLETION_CHARS
    from llmgym.interop import trl_reward_funcs

    lengths = []
    (reward,) = trl_reward_funcs(lambda task, text: lengths.append(len(text)) or 0.0)
    reward(prompts=["q"], completions=["y" * (DEFAULT_MAX_COMPLETION_CHARS + 10)])
    assert lengths == [DEFAULT_MAX_COMPLETION_CHARS]
