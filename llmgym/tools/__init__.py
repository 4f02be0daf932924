"""Tool use: multi-turn envs in which the policy calls functions, token-exact, sandboxed, trainable.

* :class:`ToolEnv` — tasks + a verifier + tools; calls in the chat template's format, results as tool turns.
* :class:`Tool` — a callable with its JSON schema (``transformers.utils.get_json_schema``), argument
  validation (``jsonschema``) and a time limit enforced by killing its process (:mod:`llmgym.tools.helper_process`).
* :func:`python_tool` — ``python(code) -> stdout`` in :mod:`llmgym.sandbox`.
* :func:`parse_tool_calls` / :func:`write_tool_calls` / :func:`detect_call_format` — the Hermes/Qwen,
  Llama 3.1 and Mistral wire formats.

See ``docs/tools.md``.

Example:
    >>> from llmgym import Task
    >>> from llmgym.tools import ToolEnv
    >>> def shout(text: str) -> str:
    ...     '''Upper-case a text.
    ...
    ...     Args:
    ...         text: what to shout
    ...     '''
    ...     return text.upper()
    >>> env = ToolEnv([Task("Shout 'hi'.", answer="HI")], lambda t, c: float(c.strip() == t.answer), tools=[shout])
    >>> _ = env.reset(seed=0)
    >>> env.step('<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>')[4]["reply"][0]["content"]
    'HI'
"""

from llmgym.tools.calls import (
    CALL_FORMATS, ParsedTurn, ToolCall, detect_call_format, parse_tool_calls, write_tool_calls,
)
from llmgym.tools.env import DEFAULT_MAX_RESULT_CHARS, ToolEnv, tool_turn_text
from llmgym.tools.functions import ERROR_KINDS, Tool, ToolResult, ToolSetupError, as_tool
from llmgym.tools.python import python_tool

__all__ = [
    "ToolEnv", "Tool", "ToolResult", "ToolCall", "ParsedTurn", "ToolSetupError", "as_tool", "python_tool",
    "parse_tool_calls", "write_tool_calls", "detect_call_format", "tool_turn_text",
    "CALL_FORMATS", "ERROR_KINDS", "DEFAULT_MAX_RESULT_CHARS",
]
