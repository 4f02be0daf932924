"""Shared by the tool tests: chat templates with tool roles in the three wire formats, on the tiny
byte-level tokenizer (no hub access), a tool and a verifier.

Each is written for these tests after the structure of a model family's template (not copied): how it lists
the tools, writes an assistant's calls and shows a tool's result.

* ``hermes`` (Qwen 2.5 family): ChatML; tools in a system turn; calls as ``<tool_call>\\n{json}\\n</tool_call>``;
  consecutive tool results grouped in one ``user`` turn of ``<tool_response>`` blocks.
* ``llama3`` (Llama 3.1 family): header tokens; a call is the whole assistant turn, ``{"name", "parameters"}``;
  a result is an ``ipython`` turn.
* ``mistral`` (v3 tokenizers): ``[INST]``; tools before the last user turn; calls as ``[TOOL_CALLS][...]``
  with 9-character ids (refused otherwise, as the real template does); results as ``[TOOL_RESULTS]``.
"""

from __future__ import annotations

from llmgym.runtime.models import build_tokenizer

HERMES = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>"
    "{%- for t in tools %}{{ '\\n' }}{{ t | tojson }}{%- endfor %}"
    "{{ '\\n' }}</tools>\nCall a tool with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>.<|im_end|>{{ '\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{%- endif %}"
    "{{ '\\n' }}<tool_response>{{ '\\n' }}{{ m.content }}{{ '\\n' }}</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>{{ '\\n' }}{%- endif %}"
    "{%- elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant{{ '\\n' }}{{ m.content or '' }}"
    "{%- for c in m.tool_calls %}<tool_call>{{ '\\n' }}{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
    "{{ '\\n' }}</tool_call>{%- endfor %}<|im_end|>{{ '\\n' }}"
    "{%- else %}<|im_start|>{{ m.role }}{{ '\\n' }}{{ m.content }}<|im_end|>{{ '\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}{%- endif %}"
)

LLAMA3 = (
    "<|begin_of_text|>"
    "{%- if tools %}<|start_header_id|>system<|end_header_id|>{{ '\\n\\n' }}Answer a function call as JSON "
    "{\"name\": name, \"parameters\": {...}}. Functions:{%- for t in tools %}{{ '\\n' }}{{ t | tojson }}{%- endfor %}"
    "<|eot_id|>{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.tool_calls %}"
    "{%- if m.tool_calls | length != 1 %}{{ raise_exception('This model only supports single tool-calls at once!') }}{%- endif %}"
    "<|start_header_id|>assistant<|end_header_id|>{{ '\\n\\n' }}"
    "{{ '{\"name\": \"' + m.tool_calls[0].function.name + '\", \"parameters\": ' }}"
    "{{ m.tool_calls[0].function.arguments | tojson }}{{ '}' }}<|eot_id|>"
    "{%- elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>{{ '\\n\\n' }}{{ m.content }}<|eot_id|>"
    "{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>{{ '\\n\\n' }}{{ m.content }}<|eot_id|>{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>{{ '\\n\\n' }}{%- endif %}"
)

MISTRAL = (
    "{%- set users = messages | selectattr('role', 'equalto', 'user') | list %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}"
    "{%- if tools and m == users[-1] %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif %}"
    "[INST]{{ m.content }}[/INST]"
    "{%- elif m.tool_calls %}[TOOL_CALLS][{%- for c in m.tool_calls %}"
    "{%- if c.id is not defined or c.id | length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments, 'id': c.id} | tojson }}"
    "{%- if not loop.last %}, {% endif %}{%- endfor %}]</s>"
    "{%- elif m.role == 'tool' %}"
    "{%- if m.tool_call_id is not defined or m.tool_call_id | length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}"
    "[TOOL_RESULTS]{{ {'content': m.content, 'call_id': m.tool_call_id} | tojson }}[/TOOL_RESULTS]"
    "{%- elif m.role == 'assistant' %}{{ m.content }}</s>"
    "{%- endif %}"
    "{%- endfor %}"
)

TEMPLATES = {"hermes": HERMES, "llama3": LLAMA3, "mistral": MISTRAL}
SPECIALS = {
    "hermes": ["<|im_start|>", "<|im_end|>"],
    "llama3": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"],
    "mistral": ["[INST]", "[/INST]", "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[AVAILABLE_TOOLS]",
                "[/AVAILABLE_TOOLS]"],
}
ADDED = {"hermes": ["<tool_call>", "</tool_call>"]}  # Qwen's call tags are added tokens, not special ones


def tool_tokenizer(kind: str):
    """The tiny tokenizer with the ``kind`` template and its special tokens."""
    tok = build_tokenizer()
    tok.add_tokens(SPECIALS[kind], special_tokens=True)
    if ADDED.get(kind):
        tok.add_tokens(ADDED[kind], special_tokens=False)
    tok.chat_template = TEMPLATES[kind]
    return tok


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def exact(task, completion):
    """1.0 for exactly the task's answer (the verifier of the tool tests' tasks)."""
    return float(completion.strip() == str(task.answer))


QWEN_SPECIALS = ["<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>"]


def official_template_tokenizer(name: str):
    """The tiny tokenizer with an official chat template as TRL ships it (``trl/chat_templates/<name>.jinja``:
    the template of the model's Hub repo, byte for byte, which TRL compares against the Hub weekly), and Qwen's
    special and added tokens. Skips the calling test where TRL is not installed."""
    from pathlib import Path

    import pytest

    trl = pytest.importorskip("trl", reason="the official chat templates come from TRL's chat_templates/")
    tok = build_tokenizer()
    tok.add_tokens(QWEN_SPECIALS, special_tokens=True)
    tok.add_tokens(QWEN_ADDED, special_tokens=False)
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text()
    return tok
