"""Secrets never reach what the model drives: a tool's process, a time-limited verifier's child.

The trainer holds ``LLMGYM_SERVE_SECRET``, ``OPENAI_API_KEY``, a user's ``MY_TOKEN``: a shell tool the model
calls with ``env`` (or a verifier that prints its environment) must see none of them -- not in
``os.environ``, not in what a command it starts inherits, not in ``/proc/self/environ`` -- and what a tool
needs is passed by name.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from llmgym import Score, Task
from llmgym.env.verifiers import as_verifier
from llmgym.sandbox.killable import call_in_killable_child
from llmgym.tools import Tool, ToolEnv
from llmgym.tools.helper_process import tool_worker
from tool_fixtures import exact

SECRETS = {"LLMGYM_SERVE_SECRET": "fleet-s3cret-0451", "OPENAI_API_KEY": "sk-test-8d1f2a", "MY_TOKEN": "tok-77c1e9"}


def shell(command: str) -> str:
    """Run a shell command and return what it prints.

    Args:
        command: the command line
    """
    return subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=10).stdout


def everything_visible() -> str:
    """What a process can read of its environment: os.environ, a child's `env`, /proc/self/environ."""
    with open("/proc/self/environ", "rb") as fh:
        block = fh.read().decode("utf-8", "replace")
    return "\n".join([repr(dict(os.environ)), shell("env"), block])


def visible_tool() -> str:
    """Everything the tool's process can read of its environment."""
    return everything_visible()


@pytest.fixture
def secrets_set(monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    tool_worker().close()  # the helper starts afresh, from this environment
    yield SECRETS
    tool_worker().close()


def _leaked(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if name in text or value in text]


def test_a_shell_tool_the_model_calls_sees_no_secret_of_the_trainer(secrets_set):
    env = ToolEnv([Task(prompt="What is 5555?", answer="5555")], exact, tools=[Tool(shell, time_limit=10)])
    env.reset(seed=0)
    call = '<tool_call>\n{"name": "shell", "arguments": {"command": "env; cat /proc/self/environ | tr \'\\\\0\' \'\\\\n\'"}}\n</tool_call>'
    _, reward, terminated, _, info = env.step(call)
    reply = info["reply"][0]["content"]
    assert (reward, terminated) == (0.0, False)
    assert "PATH=" in reply, reply  # the tool ran and printed its environment
    assert _leaked(reply) == [], reply


def test_a_tool_process_sees_neither_the_secrets_in_its_environment_nor_in_its_initial_block(secrets_set):
    text = Tool(visible_tool, time_limit=10).run({}).content
    assert "PATH" in text
    assert _leaked(text) == []


def test_a_variable_a_tool_names_reaches_it_and_nothing_else_does(secrets_set, monkeypatch):
    tool = Tool(shell, time_limit=10, pass_env=["MY_TOKEN"], env={"TOOL_SETTING": "on"})
    out = tool.run({"command": "echo token=$MY_TOKEN setting=$TOOL_SETTING key=$OPENAI_API_KEY"}).content
    assert out.strip() == f"token={SECRETS['MY_TOKEN']} setting=on key="
    # another tool, same helper: the first one's variables are not its
    assert Tool(shell, time_limit=10).run({"command": "echo token=$MY_TOKEN setting=$TOOL_SETTING"}).content.strip() == \
        "token= setting="


def test_llmgym_pass_env_names_variables_every_tool_gets(secrets_set, monkeypatch):
    monkeypatch.setenv("LLMGYM_PASS_ENV", "MY_TOKEN, UNSET_NAME")
    tool_worker().close()
    out = Tool(shell, time_limit=10).run({"command": "echo token=$MY_TOKEN key=$OPENAI_API_KEY"}).content
    assert out.strip() == f"token={SECRETS['MY_TOKEN']} key="


@pytest.mark.parametrize("kwargs, error", [
    ({"env": {"A": "1"}, "isolated": False}, ValueError),
    ({"pass_env": "MY_TOKEN"}, TypeError),
    ({"pass_env": ["A=B"]}, ValueError),
    ({"env": {"": "x"}}, ValueError),
    ({"env": {"A": 1}}, ValueError),
])
def test_a_tool_s_environment_is_checked_when_it_is_built(kwargs, error):
    with pytest.raises(error):
        Tool(shell, **kwargs)


def _verifier_that_looks(task: Task, completion: str) -> Score:
    return Score(0.0, {"seen": everything_visible()})


def test_a_time_limited_verifier_fed_model_text_sees_no_secret(secrets_set):
    score = as_verifier(_verifier_that_looks, time_limit=20)(Task(prompt="p", answer="a"), "echo $OPENAI_API_KEY")
    seen = score.info["seen"]
    assert "PATH" in seen
    assert _leaked(seen) == []


def test_a_killable_child_keeps_the_allowed_variables_and_the_parent_keeps_its_own(secrets_set):
    outcome = call_in_killable_child(lambda: dict(os.environ), limit=30)
    assert outcome.status == "ok"
    assert outcome.value.get("PATH") == os.environ["PATH"]
    assert not set(SECRETS) & set(outcome.value)
    assert all(os.environ[name] == value for name, value in SECRETS.items())  # the scrub is the child's only
