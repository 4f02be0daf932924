"""Tool use (llmgym.tools): the wire formats, tools and their schemas, and ToolEnv's token-exact episodes.

Chat templates with tool roles in the Hermes/Qwen, Llama 3.1 and Mistral styles are built locally
(tests/tool_fixtures.py); the attacks on the tool path are in tests/tools/test_tools_attacks.py.
"""

from __future__ import annotations

import threading
from pathlib import Path

import gymnasium as gym
import pytest

import llmgym
from llmgym import Task, TokenLevel
from llmgym.runtime.models import build_tokenizer
from llmgym.tools import (
    CALL_FORMATS, Tool, ToolCall, ToolEnv, ToolSetupError, detect_call_format, parse_tool_calls, write_tool_calls,
)
from tool_fixtures import TEMPLATES, add, exact, tool_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def shout(text: str) -> str:
    """Upper-case a text.

    Args:
        text: what to shout
    """
    return text.upper()


TASK = Task([{"role": "user", "content": "What is 1234 + 4321?"}], answer="5555", id="add")


def _env(tok=None, **kwargs):
    return ToolEnv([TASK], exact, tok, tools=[add, shout], **kwargs)


def _encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


# -- the wire formats -------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", CALL_FORMATS)
def test_written_calls_parse_back(fmt):
    calls = [ToolCall("add", {"a": 1, "b": [2, {"c": "x"}]}, id="a1b2c3d4e")]
    parsed = parse_tool_calls("Thinking. " * (fmt == "hermes") + write_tool_calls(calls, fmt), fmt)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("add", {"a": 1, "b": [2, {"c": "x"}]})]
    assert parsed.calls[0].ok and parsed.unparsed == 0


def test_hermes_reads_several_calls_and_the_text_around_them():
    text = 'A <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call> B <tool_call>{"name": "shout", "arguments": "{\\"text\\": \\"hi\\"}"}</tool_call> C'
    parsed = parse_tool_calls(text, "hermes")
    assert parsed.content == "A  B  C"
    assert [(c.name, c.arguments) for c in parsed.calls] == [("add", {"a": 1, "b": 2}), ("shout", {"text": "hi"})]


@pytest.mark.parametrize("text, error", [
    ("<tool_call>{\"name\": \"add\"", "never closed"),
    ("<tool_call>not json</tool_call>", "not valid JSON"),
    ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
    ("<tool_call>{\"arguments\": {}}</tool_call>", "no \"name\""),
    ("<tool_call>{\"name\": \"add\", \"arguments\": [1]}</tool_call>", "arguments must be a JSON object"),
    ("<tool_call>{\"name\": \"add\", \"arguments\": \"{oops\"}</tool_call>", "arguments string is not readable"),
])
def test_malformed_hermes_calls_are_calls_with_an_error(text, error):
    (call,) = parse_tool_calls(text, "hermes").calls
    assert not call.ok and error in call.error


def test_llama3_turn_is_a_call_only_when_it_is_json():
    assert parse_tool_calls("The answer is 5555.", "llama3").calls == ()
    assert parse_tool_calls('<|python_tag|>{"name": "add", "arguments": {"a": 1}}', "llama3").calls[0].arguments == {"a": 1}
    (bad,) = parse_tool_calls('{"name": "add", "parameters": ', "llama3").calls
    assert "not valid JSON" in bad.error


def test_mistral_reads_both_generations_of_the_format():
    v3 = parse_tool_calls('ok[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}, {"name": "shout", "arguments": {"text": "x"}}]', "mistral")
    assert v3.content == "ok" and [c.name for c in v3.calls] == ["add", "shout"]
    v11 = parse_tool_calls('[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]shout[ARGS]{"text": "x"}', "mistral")
    assert [(c.name, c.arguments) for c in v11.calls] == [("add", {"a": 1}), ("shout", {"text": "x"})]
    assert "[ARGS]" in parse_tool_calls("[TOOL_CALLS]add{}", "mistral").calls[0].error


def test_parsing_is_bounded_in_calls_size_and_depth():
    many = parse_tool_calls('<tool_call>{"name": "add", "arguments": {}}</tool_call>' * 10_000, "hermes", max_calls=3)
    assert len(many.calls) == 3 and many.unparsed == 9_997
    huge = parse_tool_calls('<tool_call>{"name": "shout", "arguments": {"text": "' + "x" * 20_000 + '"}}</tool_call>')
    assert "over the limit of 8,192" in huge.calls[0].error
    deep = parse_tool_calls('<tool_call>{"name": "add", "arguments": ' + '[' * 1_000 + ']' * 1_000 + '}' + "</tool_call>")
    assert "nests deeper than 16 levels" in deep.calls[0].error
    # brackets inside strings do not count as nesting
    assert parse_tool_calls('<tool_call>{"name": "shout", "arguments": {"text": "' + "[{" * 100 + '"}}</tool_call>').calls[0].ok
    with pytest.raises(ValueError, match="unknown tool-call format 'json'"):
        parse_tool_calls("x", "json")


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
def test_the_format_is_read_off_the_template(kind):
    assert detect_call_format(tool_tokenizer(kind)) == kind


def test_templates_without_tool_calls_default_to_hermes_and_unknown_renderings_are_refused():
    tok = build_tokenizer()
    assert detect_call_format(tok) == detect_call_format(None) == "hermes"  # the tiny template writes <tool_call>
    tok.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"  # ignores tool_calls altogether
    assert detect_call_format(tok) == "hermes"
    tok.chat_template = "{% for m in messages %}{% for c in m.tool_calls or [] %}CALL {{ c.function.name }}{% endfor %}{% endfor %}"
    with pytest.raises(ValueError, match="pass call_format="):
        detect_call_format(tok)


# -- tools ------------------------------------------------------------------------------------------
def test_tool_schema_comes_from_transformers_and_arguments_are_validated():
    from transformers.utils import get_json_schema

    tool = Tool(add)
    assert tool.schema == get_json_schema(add)
    assert tool.validate({"a": 1, "b": 2}) is None
    assert tool.validate({"a": 1}) == "'b' is a required property"
    assert tool.validate({"a": 1, "b": 2, "c": 3}) == "Additional properties are not allowed ('c' was unexpected)"
    assert tool.validate({"a": 1.5, "b": 2}) == "argument 'a': 1.5 is not of type 'integer'"
    assert tool.validate([1, 2]) == "the arguments must be a JSON object, got list"


def test_a_tool_without_a_usable_docstring_or_schema_is_refused_with_what_to_do():
    def undocumented(x: int):
        return x

    with pytest.raises(ValueError, match="docstring with an 'Args:' section"):
        Tool(undocumented)
    with pytest.raises(ValueError, match="invalid parameters schema"):
        Tool(add, schema={"name": "add", "parameters": {"type": "nonsense"}})
    lock = threading.Lock()

    def locked(x: int) -> int:
        """Hold a lock.

        Args:
            x: anything
        """
        with lock:
            return x

    with pytest.raises(ValueError, match="cannot be sent to the tool worker process"):
        Tool(locked)
    assert Tool(locked, isolated=False).run({"x": 3}).content == "3"  # in-process: no pickling needed
    with pytest.raises(ValueError, match="tool names must be unique"):
        ToolEnv([TASK], exact, tools=[add, add])
    with pytest.raises(ValueError, match="a cost, never a bonus"):
        ToolEnv([TASK], exact, tools=[add], call_cost=-0.1)


def test_a_tool_defined_in_a_function_runs_in_the_worker():
    offset = 100

    def plus_offset(x: int) -> int:
        """Add the offset.

        Args:
            x: a number
        """
        return x + offset

    assert Tool(plus_offset).run({"x": 1}).content == "101"


# -- ToolEnv: episodes, token-exact at both levels ----------------------------------------------------
def test_plain_text_episode_without_a_tokenizer():
    env = _env()
    obs, _ = env.reset(seed=0)
    assert obs["prompt"].startswith("system: You can call these tools:\n{\"name\": \"add\"")
    assert '<tool_call>{"name": "add", "arguments": {"a": "<a>", "b": "<b>"}}</tool_call>' in obs["prompt"]
    obs, reward, terminated, truncated, info = env.step('<tool_call>{"name": "add", "arguments": {"a": 1234, "b": 4321}}</tool_call>')
    assert (reward, terminated, truncated, info["tool_errors"]) == (0.0, False, False, {})
    assert obs["prompt"].endswith("</tool_call>\ntool: 5555\nassistant:")
    obs, reward, terminated, truncated, info = env.step("5555")
    assert (reward, terminated, info["tool_calls_total"]) == (1.0, True, 1)


def _expert_completion(tok, calls):
    """What a model trained on the template writes: the template's own rendering of the calls, then its end of turn."""
    history = [{"role": "user", "content": "?"}]
    assistant = {"role": "assistant", "content": "", "tool_calls": calls}
    before = tok.apply_chat_template(history, add_generation_prompt=True, tokenize=False)
    after = tok.apply_chat_template(history + [assistant], tokenize=False)
    text = after[len(before):]
    from llmgym.env.core import ChatTurns

    turns = ChatTurns.of(tok)
    text = text[: len(text) - len(turns.closing)]
    return _encode(tok, text) + ([turns.end_of_turn_id] if turns.end_of_turn_id is not None else [tok.eos_token_id])


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
def test_tool_turns_are_the_templates_and_ids_in_are_ids_out(kind):
    tok = tool_tokenizer(kind)
    env = _env(tok)
    obs, _ = env.reset(seed=0)
    assert obs["prompt"] == tok.apply_chat_template(list(TASK.prompt), tools=env.tool_schemas, add_generation_prompt=True,
                                                    tokenize=False)
    context = obs["prompt_ids"].tolist()
    calls = [{"id": "a1b2c3d4e", "type": "function", "function": {"name": "add", "arguments": {"a": 1234, "b": 4321}}}]
    completion = _expert_completion(tok, calls)
    obs, reward, terminated, truncated, info = env.step(completion)
    assert (reward, terminated, info["tool_errors"], info["reply"][0]["content"]) == (0.0, False, {}, "5555")
    ids = obs["prompt_ids"].tolist()
    assert ids[: len(context) + len(completion)] == context + completion  # the model's exact ids, untouched
    # the whole transcript is what the template renders for the conversation, tool turn included
    conversation = list(TASK.prompt) + [{"role": "assistant", "content": "", "tool_calls": calls},
                                        {"role": "tool", "tool_call_id": "a1b2c3d4e", "name": "add", "content": "5555"}]
    assert obs["prompt"] == tok.apply_chat_template(conversation, tools=env.tool_schemas, add_generation_prompt=True,
                                                    tokenize=False)
    assert ids[len(context) + len(completion):] == _encode(tok, obs["prompt"][len(tok.decode(context + completion, skip_special_tokens=False)):])
    obs, reward, terminated, _, info = env.step(_encode(tok, "5555") + completion[-1:])
    assert (reward, terminated, info["tool_calls_total"]) == (1.0, True, 1)


@pytest.mark.parametrize("kind", ["hermes", "llama3"])
def test_same_tokens_same_tool_episode_at_both_levels(kind):
    tok = tool_tokenizer(kind)
    call = [{"id": "a1b2c3d4e", "type": "function", "function": {"name": "add", "arguments": {"a": 1234, "b": 4321}}}]
    script = [_expert_completion(tok, call), _encode(tok, "5555") + [_end_of_turn(tok)]]
    seq, level = _env(tok), TokenLevel(_env(tok), tok, max_new_tokens=200)
    seq.reset(seed=0)
    level.reset(seed=0)
    for completion in script:
        obs_s, *rest_s = seq.step(completion)
        for token in completion:
            obs_t, *rest_t = level.step(token)
        assert obs_t["prompt_ids"].tolist() == obs_s["prompt_ids"].tolist() and obs_t["prompt"] == obs_s["prompt"]
        assert rest_t[:3] == rest_s[:3]
    assert rest_s[:2] == [1.0, True]


def _end_of_turn(tok):
    from llmgym.env.core import ChatTurns

    end = ChatTurns.of(tok).end_of_turn_id
    return tok.eos_token_id if end is None else end


def test_an_unclosed_call_turn_is_closed_by_the_template_before_the_tool_turn():
    tok = tool_tokenizer("hermes")
    env = _env(tok)
    context = env.reset(seed=0)[0]["prompt_ids"].tolist()
    completion = _encode(tok, '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')  # cut: no <|im_end|>
    obs, *_ = env.step(completion)
    suffix = "<|im_end|>\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert obs["prompt_ids"].tolist() == context + completion + _encode(tok, suffix)


def test_registered_tool_envs_are_listed(capsys):  # check_env at both levels: tests/env/test_registry.py, for every id
    from llmgym.cli import main

    tools = {e.id for e in llmgym.registered_envs("tools")}
    assert tools == {"llmgym/Calculator-v0", "llmgym/PythonMath-v0"}
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    assert "Calculator-v0" in listing and "PythonMath-v0" in listing


def test_calculator_benches_and_trains_from_the_command_line(tmp_path):
    import json

    from llmgym.cli import main

    assert main(["bench", "--env", "llmgym/Calculator-v0", "--samples", "2", "--tasks", "3", "--max-new-tokens", "16",
                 "--out", str(tmp_path / "bench.json")]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["tasks"] == 3 and report["samples"] == 2 and report["reward_mean"] == 0.0  # random tiny model
    assert main(["train", "--env", "llmgym/Calculator-v0", "--agent", "grpo", "--steps", "2", "--out", str(tmp_path / "run"),
                 "--set", "tasks_per_step=2", "--set", "group_size=2", "--set", "max_new_tokens=16"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "step" in row][-1] == 2


def test_the_tool_env_pickles_for_async_vector_envs(tokenizer):
    envs = gym.make_vec("llmgym/Calculator-v0", num_envs=2, vectorization_mode="async", tokenizer=tokenizer)
    try:
        obs, info = envs.reset(seed=0)
        task = info["task"][0]
        a, b = task.id.split("-")[1:]
        call = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s * %s"}}</tool_call>' % (a, b)
        obs, reward, terminated, truncated, info = envs.step([call, "0"])
        assert info["reply"][0][0]["content"] == task.answer  # the tool ran in the worker process's own helper
        assert list(terminated) == [False, True]
    finally:
        envs.close()


def _docs_tool_env() -> str:
    import re

    text = (ROOT / "docs" / "tools.md").read_text()
    return re.search(r"<!-- tool-env-example -->\n```python\n(.*?)```", text, re.S).group(1)


def test_docs_tool_env_runs_and_is_under_20_lines():
    block = _docs_tool_env()
    lines = [line for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(lines) < 20, len(lines)
    namespace: dict = {"__name__": "__main__"}
    exec(compile(block, "docs/tools.md", "exec"), namespace)  # noqa: S102 (our own docs)
    assert namespace["reward"] == 1.0


def test_the_docs_tool_env_trains_and_benches_from_the_command_line(tmp_path):
    """docs/tools.md's commands, as a user runs them: the block saved as capitals.py, then --import capitals."""
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "capitals.py").write_text(_docs_tool_env())
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("LLMGYM_TEST_THREADS", "1")}

    def llmgym_cli(*args: str) -> None:
        proc = subprocess.run([sys.executable, "-m", "llmgym", *args, "--import", "capitals"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]

    llmgym_cli("bench", "--env", "llmgym/Capitals-v0", "--samples", "2", "--max-new-tokens", "16",
               "--out", "bench.json")
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["tasks"] == 1 and report["samples"] == 2 and 0.0 <= report["reward_mean"] <= 1.0
    llmgym_cli("train", "--env", "llmgym/Capitals-v0", "--agent", "grpo", "--steps", "2", "--out", "run",
               "--set", "tasks_per_step=1", "--set", "group_size=2", "--set", "max_new_tokens=16")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "step" in row][-1] == 2 and (tmp_path / "run" / "checkpoints" / "last").exists()
    # config.json records the import, but a run folder never loads code by itself: --resume without --import
    # says what to pass, and with it (from the module's folder) continues
    assert json.loads((tmp_path / "run" / "config.json").read_text())["imports"] == ["capitals"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run([sys.executable, "-m", "llmgym", "train", "--resume", str(tmp_path / "run"), "--steps", "3"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "pass --import capitals to load it again" in proc.stderr, proc.stderr[-3000:]
    llmgym_cli("train", "--resume", str(tmp_path / "run"), "--steps", "3")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "step" in row] == [1, 2, 3]


def test_a_template_that_is_not_prefix_stable_is_reported_at_reset():
    tok = build_tokenizer()
    # renders the last message differently ("(last)") from earlier ones: appending turns rewrites history
    tok.chat_template = ("{% if tools %}<|tools|>{% endif %}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
                         "{% if loop.last %}(last){% endif %}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    env = _env(tok)
    with pytest.raises(ToolSetupError, match="not prefix-stable"):
        env.reset(seed=0)


def test_a_tool_the_worker_cannot_load_raises_a_setup_error_naming_it():
    env = ToolEnv([TASK], exact, tools=[Tool(_unloadable_add(), schema=Tool(add).schema)])
    env.reset(seed=0)
    with pytest.raises(ToolSetupError, match="could not be loaded in the tool worker"):
        env.step('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')


class _FailsToUnpickle:
    def __call__(self, **kwargs):
        return 0

    def __reduce__(self):
        return (_refuse, ())


def _refuse():
    raise ImportError("this tool's module is not importable here")


def _unloadable_add():
    return _FailsToUnpickle()


class Counter:
    """A TRL-style environment_factory class: public methods are tools, reset() starts an episode."""

    def __init__(self):
        self.count = 0

    def reset(self, start=0, **row):
        self.count = start  # the task's metadata arrive as keywords, as TRL passes a dataset row's columns
        return f" Start from {start}."

    def increment(self, by: int) -> int:
        """Add to the counter and return it.

        Args:
            by: how much to add
        """
        self.count += by
        return self.count


def test_trl_environment_factory_classes_get_one_instance_per_episode():
    from llmgym.env.vector import clone_env

    env = ToolEnv([Task("Count to 5.", answer="5")], exact, environment_factory=Counter)
    assert list(env.tools) == ["increment"]
    obs, _ = env.reset(seed=0)
    assert "user: Count to 5. Start from 0.\n" in obs["prompt"]  # reset()'s text joins the last user message
    twin = clone_env(env)
    twin.reset(seed=0)
    results = [env.step(CALL_INCREMENT % by)[4]["reply"][0]["content"] for by in (2, 3)]
    assert results == ["2", "5"]  # state kept across this episode's calls
    assert twin.step(CALL_INCREMENT % 1)[4]["reply"][0]["content"] == "1"  # the twin's own instance
    assert env.step("5")[1:3] == (1.0, True)
    env.reset(seed=0)
    assert env.step(CALL_INCREMENT % 1)[4]["reply"][0]["content"] == "1"  # a new episode, a new instance
    env.reset(options={"task": Task("Count to 12.", answer="12", metadata={"start": 10})})
    assert env.step(CALL_INCREMENT % 2)[4]["reply"][0]["content"] == "12"


CALL_INCREMENT = '<tool_call>{"name": "increment", "arguments": {"by": %d}}</tool_call>'
