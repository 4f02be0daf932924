"""Chat done right: a multi-turn env's reply is a user turn of the chat template, and every level
stops on every end-of-turn id. A ChatML tokenizer is built locally (no hub access)."""

from __future__ import annotations

import gymnasium as gym
import pytest
from transformers import GenerationConfig

from llmgym import MultiTurnEnv, Task, TokenLevel
from llmgym.env.core import ChatTurns, end_of_turn_ids

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QUESTION = [{"role": "user", "content": "2+2="}]
TASK = Task(QUESTION, answer="4")
RETRY = "Incorrect, try again."


@pytest.fixture(scope="module")
def chatml():
    from llmgym.runtime.models import build_tokenizer

    tok = build_tokenizer()  # EOS stays </s>; the template's end of turn is <|im_end|>, as in many chat models
    tok.add_tokens(["<|im_start|>", "<|im_end|>", "<|endoftext|>"], special_tokens=True)
    tok.chat_template = CHATML
    return tok


def _id(tok, token):
    return tok.convert_tokens_to_ids(token)


def _exact(task, completion):
    return float(completion.strip() == task.answer)


def _env(tok, tasks=(TASK,), max_turns=3):
    return MultiTurnEnv(list(tasks), _exact, tok, max_turns=max_turns)


def _encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_chat_turns_are_read_off_the_template(chatml):
    turns = ChatTurns.of(chatml)
    assert (turns.closing, turns.end_of_turn_id, turns.after_end_of_turn) == ("<|im_end|>\n", _id(chatml, "<|im_end|>"), "\n")
    assert turns.user_turn("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_end_of_turn_ids_gather_eos_template_and_generation_config(chatml):
    im_end, eot = _id(chatml, "<|im_end|>"), _id(chatml, "<|endoftext|>")
    assert end_of_turn_ids(chatml) == sorted([chatml.eos_token_id, im_end])
    config = GenerationConfig(eos_token_id=[im_end, eot])  # Qwen's generation config lists both
    assert end_of_turn_ids(chatml, config) == sorted([chatml.eos_token_id, im_end, eot])


def test_reply_is_a_user_turn_after_the_turn_the_model_closed(chatml):
    env = _env(chatml)
    obs, _ = env.reset(seed=0)
    assert obs["prompt"] == chatml.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    context = obs["prompt_ids"].tolist()
    completion = _encode(chatml, "5") + [_id(chatml, "<|im_end|>")]
    obs, reward, terminated, truncated, info = env.step(completion)
    assert (reward, terminated, info["reply"]) == (0.0, False, RETRY)
    # the whole conversation, as the template renders it: the reply is the user's, not inside the assistant turn
    conversation = QUESTION + [{"role": "assistant", "content": "5"}, {"role": "user", "content": RETRY}]
    assert obs["prompt"] == chatml.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    assert "5<|im_end|>\n<|im_start|>user\nIncorrect" in obs["prompt"]
    # token ids in, token ids out: the exact completion ids, then the reply turn's ids
    reply_turn = "\n<|im_start|>user\n" + RETRY + "<|im_end|>\n<|im_start|>assistant\n"
    assert obs["prompt_ids"].tolist() == context + completion + _encode(chatml, reply_turn)
    obs, reward, terminated, _, _ = env.step(_encode(chatml, "4") + [_id(chatml, "<|im_end|>")])
    assert (reward, terminated) == (1.0, True)


def test_a_turn_the_model_did_not_close_is_closed_by_the_template(chatml):
    env = _env(chatml)
    context = env.reset(seed=0)[0]["prompt_ids"].tolist()
    completion = _encode(chatml, "55")  # cut at the token limit: no end-of-turn id
    obs, *_ = env.step(completion)
    reply_turn = "<|im_end|>\n<|im_start|>user\n" + RETRY + "<|im_end|>\n<|im_start|>assistant\n"
    assert obs["prompt_ids"].tolist() == context + completion + _encode(chatml, reply_turn)
    env.reset(seed=0)
    obs_text, *_ = env.step("55")  # a text action: the same transcript
    assert obs_text["prompt"] == obs["prompt"]


def test_a_turn_closed_by_another_end_of_turn_id_is_kept_as_the_model_closed_it(chatml):
    eot = _id(chatml, "<|endoftext|>")
    config = GenerationConfig(eos_token_id=[_id(chatml, "<|im_end|>"), eot])
    env = gym.make("llmgym/CopyRetry-v0", tokenizer=chatml, generation_config=config, tasks=[Task(QUESTION, answer="4")])
    context = env.reset(seed=0)[0]["prompt_ids"].tolist()
    completion = _encode(chatml, "5") + [eot]
    obs, *_ = env.step(completion)
    reply_turn = "\n<|im_start|>user\n" + RETRY + "<|im_end|>\n<|im_start|>assistant\n"
    assert obs["prompt_ids"].tolist() == context + completion + _encode(chatml, reply_turn)
    assert "5<|endoftext|>\n<|im_start|>user" in obs["prompt"]


def test_without_a_chat_task_or_template_the_reply_stays_plain_text(chatml, tokenizer):
    env = _env(chatml, tasks=[Task("2+2=", answer="4")])  # a text prompt is not a conversation
    env.reset(seed=0)
    assert env.step("5")[0]["prompt"] == "2+2=5\n" + RETRY + "\n"
    plain = _env(None)  # no tokenizer, so no template
    plain.reset(seed=0)
    assert plain.step("5")[0]["prompt"].endswith("assistant:5\n" + RETRY + "\n")


@pytest.mark.parametrize("stop", ["<|im_end|>", "</s>", "<|endoftext|>"])
def test_token_level_ends_a_turn_on_every_end_of_turn_id(chatml, stop):
    config = GenerationConfig(eos_token_id=[_id(chatml, "<|im_end|>"), _id(chatml, "<|endoftext|>")])
    env = gym.make("llmgym/CopyRetry-v0", tokenizer=chatml, level="token", max_new_tokens=8,
                   generation_config=config, tasks=[TASK])
    env.reset(seed=0)
    env.step(_id(chatml, "4"))
    obs, reward, terminated, truncated, info = env.step(_id(chatml, stop))
    assert (reward, terminated, truncated, info["finish_reason"]) == (1.0, True, False, "stop")
    # without the generation config, <|endoftext|> is an ordinary token: the turn goes on
    bare = TokenLevel(_env(chatml), chatml, max_new_tokens=8)
    assert _id(chatml, "<|endoftext|>") not in bare.stop_token_ids
    assert {_id(chatml, "<|im_end|>"), chatml.eos_token_id} <= bare.stop_token_ids


def test_same_tokens_same_chat_episode_at_both_levels(chatml):
    im_end, budget = _id(chatml, "<|im_end|>"), 5
    digits = lambda text: [_id(chatml, d) for d in text]  # noqa: E731
    # closed and wrong, cut at the budget (unclosed), closed and right
    script = [digits("12") + [im_end], digits("55555"), digits("4") + [im_end]]
    seq = _env(chatml, max_turns=4)
    tok = TokenLevel(_env(chatml, max_turns=4), chatml, max_new_tokens=budget)
    seq.reset(seed=1)
    tok.reset(seed=1)
    outcomes_s, outcomes_t = [], []
    for completion in script:
        obs_s, *rest = seq.step(completion)
        outcomes_s.append(tuple(rest[:3]))
        for t in completion:
            obs_t, *rest = tok.step(t)
        outcomes_t.append((*rest[:3], rest[3]["finish_reason"]))
        assert obs_t["prompt_ids"].tolist() == obs_s["prompt_ids"].tolist()
        assert obs_t["prompt"] == obs_s["prompt"]
    assert outcomes_s == [(0.0, False, False), (0.0, False, False), (1.0, True, False)]
    assert outcomes_t == [(0.0, False, False, "stop"), (0.0, False, False, "length"), (1.0, True, False, "stop")]


def test_hf_engine_stops_on_the_template_end_of_turn(chatml, tiny_config):
    from llmgym.engines import HFEngine
    from llmgym.runtime.models import build_tiny_model

    engine = HFEngine(build_tiny_model(chatml, tiny_config), chatml)
    assert _id(chatml, "<|im_end|>") in engine.eos_ids and chatml.eos_token_id in engine.eos_ids
