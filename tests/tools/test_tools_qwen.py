"""Tools on Qwen 3 and Qwen 3.6's official chat templates (as TRL ships them): token-exact episodes.

Qwen 3's template re-renders an earlier assistant turn once a turn follows it (its ``<think>`` block is
dropped), so it is not prefix-stable; the env keeps the model's sampled tokens as they were and appends the
template's own rendering of the new turns (what vLLM's, verifiers' and TRL's multi-turn loops do). Qwen 3.6
calls tools in an XML format (``<function=...>``), read with each parameter's type from the tool's schema.
"""

from __future__ import annotations

import pytest

from llmgym import Task, TokenLevel
from llmgym.env.core import ChatTurns
from llmgym.tools import ToolCall, ToolEnv, detect_call_format, parse_tool_calls, write_tool_calls
from tool_fixtures import add, official_template_tokenizer

TASK = Task([{"role": "user", "content": "What is 1234 + 4321?"}], answer="5555", id="add")
CALL = [{"id": "c00010000", "type": "function", "function": {"name": "add", "arguments": {"a": 1234, "b": 4321}}}]


def answers(task, completion):  # a reasoning model's answer follows its </think>
    return float(completion.split("</think>")[-1].strip() == task.answer)


def _encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


def _assistant_turn(tok, conversation, message, tools):
    """The model's ids for ``message``: what the template writes for it as the conversation's last turn, then <|im_end|>."""
    before = tok.apply_chat_template(conversation, tools=tools, add_generation_prompt=True, tokenize=False)
    after = tok.apply_chat_template(conversation + [message], tools=tools, tokenize=False)
    assert after.startswith(before) and after.endswith("<|im_end|>\n")
    return _encode(tok, after[len(before):-len("<|im_end|>\n")]) + [tok.convert_tokens_to_ids("<|im_end|>")]


@pytest.mark.parametrize("name, fmt", [("qwen3", "hermes"), ("qwen3_6", "qwen3_xml")])
def test_a_tool_episode_keeps_the_models_tokens_and_appends_the_templates_turns(name, fmt):
    tok = official_template_tokenizer(name)
    env = ToolEnv([TASK], answers, tok, tools=[add])
    obs, _ = env.reset(seed=0)
    tools = env.tool_schemas
    conversation = list(TASK.prompt)
    assert env.call_format == fmt
    assert obs["prompt"] == tok.apply_chat_template(conversation, tools=tools, add_generation_prompt=True, tokenize=False)
    context = obs["prompt_ids"].tolist()
    thinking = {"role": "assistant", "content": "", "reasoning_content": "Add them with the tool.", "tool_calls": CALL}
    completion = _assistant_turn(tok, conversation, thinking, tools)
    assert "Add them with the tool.\n</think>" in tok.decode(completion)  # the model reasoned before it called

    obs, reward, terminated, truncated, info = env.step(completion)
    assert (reward, terminated, info["tool_errors"], info["reply"][0]["content"]) == (0.0, False, {}, "5555")
    assert info["tool_calls"][0]["arguments"] == {"a": 1234, "b": 4321}  # ints, also from the XML format
    ids = obs["prompt_ids"].tolist()
    assert ids[: len(context) + len(completion)] == context + completion  # the sampled tokens, untouched
    # what follows is the template's own rendering of the tool turn and the next generation prompt
    tool = {"role": "tool", "tool_call_id": "c00010000", "name": "add", "content": "5555"}
    full = tok.apply_chat_template(conversation + [thinking, tool], tools=tools, add_generation_prompt=True,
                                   tokenize=False)
    tool_turn = full[full.index("<|im_start|>user\n<tool_response>"):]
    assert ids[len(context) + len(completion):] == _encode(tok, "\n" + tool_turn)
    assert obs["prompt"] == tok.decode(context + completion) + "\n" + tool_turn
    if name == "qwen3":  # not prefix-stable: a call turn without reasoning loses its empty <think> block once a
        # tool turn follows (the plain difference of renderings fails); the env keeps the model's block
        bare = {"role": "assistant", "content": "", "tool_calls": CALL}
        alone = tok.apply_chat_template(conversation + [bare], tools=tools, tokenize=False)
        followed = tok.apply_chat_template(conversation + [bare, tool], tools=tools, tokenize=False)
        assert "<think>\n\n</think>" in alone and not followed.startswith(alone)

    final = {"role": "assistant", "content": "5555", "reasoning_content": "The tool said 5555."}
    answer = _assistant_turn(tok, conversation + [thinking, tool], final, tools)
    obs, reward, terminated, _, info = env.step(answer)
    assert (reward, terminated, info["tool_calls_total"]) == (1.0, True, 1)

    # the token level gives the same ids, token by token
    level = TokenLevel(ToolEnv([TASK], answers, tok, tools=[add]), tok, max_new_tokens=400)
    level.reset(seed=0)
    for token in completion + answer:
        obs_t, reward_t, *_ = level.step(token)
    assert reward_t == 1.0 and obs_t["prompt_ids"].tolist() == obs["prompt_ids"].tolist()


def test_a_user_turn_after_a_reasoning_turn_is_the_templates():
    """Any chat MultiTurnEnv's reply (not only tools) on Qwen 3: the reply's user turn, as the template writes it."""
    tok = official_template_tokenizer("qwen3")
    assert ChatTurns.of(tok).user_turn("higher") == "<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"


def test_qwen36_xml_calls_read_back_by_type_and_a_malformed_one_is_the_models_error():
    tok = official_template_tokenizer("qwen3_6")
    assert detect_call_format(tok) == "qwen3_xml"
    env = ToolEnv([TASK], answers, tok, tools=[add, _echo])
    env.reset(seed=0)
    written = write_tool_calls([ToolCall("add", {"a": 1, "b": 2}), ToolCall("_echo", {"text": "007"})], "qwen3_xml")
    calls = parse_tool_calls(written, "qwen3_xml", tools=env.tool_schemas).calls
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 1, "b": 2}), ("_echo", {"text": "007"})]
    for broken, why in [("<tool_call>\n<function=add>\n<parameter=a>\n1\n</function>\n</tool_call>", "never closed"),
                        ("<tool_call>\n<function=add>\n<parameter=a>\nx\n</parameter>\n</function>\n</tool_call>",
                         "parameter 'a'"),
                        ("<tool_call>\nadd(a=1)\n</tool_call>", "<function=name>")]:
        _, reward, terminated, _, info = env.step(_encode(tok, broken) + [tok.convert_tokens_to_ids("<|im_end|>")])
        assert (reward, terminated, info["tool_errors"]) == (0.0, False, {"malformed": 1}), info
        assert why in info["reply"][0]["content"], info["reply"][0]["content"]
        env.reset(seed=0)


def _echo(text: str) -> str:
    """Echo a text.

    Args:
        text: what to echo
    """
    return text


def test_a_template_whose_calls_no_parser_reads_back_is_refused():
    from llmgym.runtime.models import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% for c in m.tool_calls or [] %}"
                         "<tool_call>CALL {{ c.function.name }}({{ c.function.arguments }})</tool_call>{% endfor %}\n"
                         "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    with pytest.raises(ValueError, match="cannot read back"):
        detect_call_format(tok)
