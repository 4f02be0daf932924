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
from llmgym.env.verifiers import exact_match


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
    from llmgym.env.core import DEFAULT_MAX_COMPLETION_CHARS
    from llmgym.interop import trl_reward_funcs

    lengths = []
    (reward,) = trl_reward_funcs(lambda task, text: lengths.append(len(text)) or 0.0)
    reward(prompts=["q"], completions=["y" * (DEFAULT_MAX_COMPLETION_CHARS + 10)])
    assert lengths == [DEFAULT_MAX_COMPLETION_CHARS]


# -- issue 30: an oversized action is cut before any work proportional to it ---------------------------------

class MeasuringTokenizer:
    """A real tokenizer that records the longest text it was asked to encode and the most ids to decode."""

    def __init__(self, tok):
        self._tok, self.longest_text, self.most_ids = tok, 0, 0

    def encode(self, text, *args, **kwargs):
        self.longest_text = max(self.longest_text, len(text))
        return self._tok.encode(text, *args, **kwargs)

    def decode(self, ids, *args, **kwargs):
        self.most_ids = max(self.most_ids, len(ids))
        return self._tok.decode(ids, *args, **kwargs)

    def __len__(self):
        return len(self._tok)

    def __getattr__(self, name):
        return getattr(self._tok, name)


@pytest.fixture()
def measuring():
    from llmgym.runtime.models import build_tokenizer

    return MeasuringTokenizer(build_tokenizer())


HUGE = 2 ** 21  # 2 MiB of text, or 2M ids: 32x the default bound


def _env(kind, tok, limit):
    from llmgym import MultiTurnEnv, Turn

    seen = []

    def verifier(task, text):
        seen.append(len(text))
        return 0.0

    if kind == "sequence":
        return SequenceEnv([Task("q", answer="a")], verifier, tok, max_completion_chars=limit), seen

    class Echo(MultiTurnEnv):
        def respond(self, completion):
            seen.append(len(completion))
            return Turn(0.0, "again", False)

    return Echo([Task("q")], None, tok, max_turns=3, max_completion_chars=limit), seen


@pytest.mark.parametrize("kind", ["sequence", "multi-turn"])
def test_an_oversized_text_is_cut_before_it_is_tokenised(kind, measuring):
    import numpy as np
    import torch

    limit = 4096
    for action in ("9" * HUGE, list(np.arange(HUGE) % 200 + 3), np.arange(HUGE) % 200 + 3,
                   torch.arange(HUGE) % 200 + 3):
        env, seen = _env(kind, measuring, limit)
        env.reset(seed=0)
        measuring.longest_text = measuring.most_ids = 0
        info = env.step(action)[4]
        assert info["truncated_completion"] == HUGE and seen == [min(seen[0], limit)], type(action)
        # the tokenizer never saw more than the bound (the prompt and the reply are a few characters)
        assert measuring.longest_text <= limit and measuring.most_ids <= limit + 16, (
            type(action), measuring.longest_text, measuring.most_ids)


def test_ids_past_the_bound_are_never_read():
    from llmgym.runtime.models import build_tokenizer

    env = SequenceEnv([Task("q")], lambda task, text: 0.0, build_tokenizer(), max_completion_chars=8)
    env.reset(seed=0)
    info = env.step([5] * 8 + ["not an id"] * HUGE)[4]  # the tail is cut unread, not validated for seconds
    assert info["truncated_completion"] == 8 + HUGE


def test_a_token_level_env_refuses_a_whole_sequence_with_a_bounded_message(measuring):
    from llmgym.env.token_level import TokenLevel

    env = TokenLevel(SequenceEnv([Task("q")], lambda task, text: 0.0, measuring), measuring, max_new_tokens=4)
    env.reset(seed=0)
    for action in ([7] * HUGE, "7" * HUGE):
        with pytest.raises(TypeError, match="one token id") as info:
            env.step(action)
        assert len(str(info.value)) < 400


def test_trl_reward_function_reads_no_message_past_the_bound():
    from llmgym.interop import trl_reward_funcs

    read = []

    class Messages(list):
        def __iter__(self):
            for k, m in enumerate(list.__iter__(self)):
                read.append(k)
                yield m

    lengths = []
    (reward,) = trl_reward_funcs(lambda task, text: lengths.append(len(text)) or 0.0)
    chat = Messages([{"role": "assistant", "content": "y" * 1000}] * 1000)
    reward(prompts=["q"], completions=[chat])
    from llmgym.env.core import DEFAULT_MAX_COMPLETION_CHARS

    assert lengths == [DEFAULT_MAX_COMPLETION_CHARS] and len(read) <= DEFAULT_MAX_COMPLETION_CHARS // 1000 + 2
