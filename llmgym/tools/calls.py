"""Tool calls on the wire: parse them out of a completion, write them for warm-up data, read the format off a template.

Three formats cover the common chat templates:

* ``"hermes"`` (Hermes, Qwen 2.5/3, the tiny model's template): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  any number per turn, text around them allowed;
* ``"llama3"`` (Llama 3.1/3.2 custom tools): the whole turn is one JSON object
  ``{"name": ..., "parameters": {...}}`` (``"arguments"`` is accepted too), optionally after ``<|python_tag|>``;
* ``"mistral"``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "abc123def"}, ...]`` (v3 tokenizers), or
  ``[TOOL_CALLS]name[ARGS]{...}`` repeated (v11+ tokenizers);
* ``"qwen3_xml"`` (Qwen 3.5 / 3.6, Qwen3-Coder): ``<tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>\n
  </function>\n</tool_call>``, any number per turn. A value is text: a string as written, any other type as JSON,
  read back by the tool's JSON schema (``tools=``), as the template writes them.

vLLM ships a parser for the XML format (``vllm.parser.qwen3``); it is not used here: vLLM is not a dependency
of llmgym, its parser leaves every value a string (an ``int`` argument fails its schema), and its regex
rescans the rest of the text for each unclosed parameter (quadratic). This one reads the format in one
``str.find`` pass, like the others, and converts each value by the schema the template showed the model.

Parsing reads model output, which is hostile input: every scan is ``str.find`` / one pass over text the env has
already bounded (``max_completion_chars``), each call's JSON is at most ``max_call_chars`` characters and
``max_depth`` levels deep (checked by a linear scan before ``json.loads``), and at most ``max_calls`` calls are
parsed (the rest are only counted). A call that cannot be read is kept as a :class:`ToolCall` with its ``error``
set, so the env can answer it with a tool error rather than take the text for a final answer.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

__all__ = [
    "CALL_FORMATS", "ToolCall", "ParsedTurn", "parse_tool_calls", "write_tool_calls", "detect_call_format",
    "DEFAULT_MAX_CALL_CHARS", "DEFAULT_MAX_DEPTH",
]

CALL_FORMATS = ("hermes", "llama3", "mistral", "qwen3_xml")
DEFAULT_MAX_CALL_CHARS = 8192
"""Characters of one call's JSON at most: ample for any argument a tool takes, cheap to parse."""
DEFAULT_MAX_DEPTH = 16
"""Nesting levels of one call's JSON at most (``{"a": {"a": ...}}``): deeper calls are refused unparsed."""

_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_LLAMA_TAG = "<|python_tag|>"
_MISTRAL_OPEN, _MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
_XML_FUNCTION, _XML_FUNCTION_END, _XML_PARAM, _XML_PARAM_END = "<function=", "</function>", "<parameter=", "</parameter>"
_EXCERPT = 120  # characters of a bad call quoted back in its error


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call as the model wrote it.

    Attributes:
        name: the function's name (``None`` when the call could not be read that far).
        arguments: the arguments as a dict (``None`` when they could not be read).
        id: the call id the model wrote (Mistral's 9-character ids), if any.
        error: why the call could not be parsed, or ``None`` for a well-formed call.

    Example:
        >>> from llmgym.tools import ToolCall
        >>> ToolCall("add", {"a": 1}).ok, ToolCall(None, None, error="unclosed <tool_call>").ok
        (True, False)
    """

    name: str | None
    arguments: dict[str, Any] | None
    id: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    """A completion split into its text and its calls.

    Attributes:
        content: the text outside the calls.
        calls: at most ``max_calls`` calls, in order (malformed ones included, with ``error`` set).
        unparsed: further calls seen but not parsed (over ``max_calls``).
    """

    content: str
    calls: tuple[ToolCall, ...]
    unparsed: int = 0


def _depth_ok(text: str, max_depth: int) -> bool:
    """Whether ``text``'s brackets nest at most ``max_depth`` deep (one pass; strings and escapes skipped)."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def _excerpt(text: str) -> str:
    text = text.strip()
    return json.dumps(text if len(text) <= _EXCERPT else text[:_EXCERPT] + "...", ensure_ascii=False)


def _load_json(text: str, max_chars: int, max_depth: int) -> tuple[Any, str | None]:
    """``(value, None)`` or ``(None, why)`` for bounded JSON."""
    if len(text) > max_chars:
        return None, f"the call is {len(text):,} characters long, over the limit of {max_chars:,}"
    if not _depth_ok(text, max_depth):
        return None, f"the call's JSON nests deeper than {max_depth} levels"
    try:
        return json.loads(text), None
    except (ValueError, RecursionError) as exc:
        return None, f"the call is not valid JSON ({str(exc)[:80]}): {_excerpt(text)}"


def _call_from_object(obj: Any, argument_keys: Sequence[str], max_chars: int, max_depth: int) -> ToolCall:
    """A :class:`ToolCall` from a decoded ``{"name": ..., "arguments": ...}`` object."""
    if not isinstance(obj, dict):
        return ToolCall(None, None, error=f"a call must be a JSON object with a \"name\", got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(None, None, error="the call has no \"name\" string")
    call_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    key = next((k for k in argument_keys if k in obj), None)
    arguments: Any = {} if key is None else obj[key]
    if isinstance(arguments, str):  # OpenAI-style: the arguments as a JSON string
        arguments, why = _load_json(arguments, max_chars, max_depth)
        if why is not None:
            return ToolCall(name, None, call_id, f"the arguments string is not readable: {why}")
    if not isinstance(arguments, dict):
        return ToolCall(name, None, call_id, f"the arguments must be a JSON object, got {type(arguments).__name__}")
    return ToolCall(name, arguments, call_id)


def _parse_hermes(text: str, max_calls: int, max_chars: int, max_depth: int) -> ParsedTurn:
    content, calls, pos, unparsed = [], [], 0, 0
    while True:
        start = text.find(_HERMES_OPEN, pos)
        if start < 0:
            content.append(text[pos:])
            break
        content.append(text[pos:start])
        body_start = start + len(_HERMES_OPEN)
        end = text.find(_HERMES_CLOSE, body_start)
        if len(calls) >= max_calls:  # count the rest without parsing them
            unparsed = text.count(_HERMES_OPEN, start)
            break
        if end < 0:
            calls.append(ToolCall(None, None, error=f"{_HERMES_OPEN} is never closed by {_HERMES_CLOSE}"))
            break
        obj, why = _load_json(text[body_start:end].strip(), max_chars, max_depth)
        calls.append(ToolCall(None, None, error=why) if why else _call_from_object(obj, ("arguments", "parameters"), max_chars, max_depth))
        pos = end + len(_HERMES_CLOSE)
    return ParsedTurn("".join(content).strip(), tuple(calls), unparsed)


def _parse_llama3(text: str, max_calls: int, max_chars: int, max_depth: int) -> ParsedTurn:
    body = text.strip()
    tagged = body.startswith(_LLAMA_TAG)
    if tagged:
        body = body[len(_LLAMA_TAG):].strip()
    if not (tagged or body.startswith("{")):  # plain text: the final answer
        return ParsedTurn(text.strip(), ())
    if max_calls < 1:
        return ParsedTurn("", (), 1)
    obj, why = _load_json(body, max_chars, max_depth)
    call = ToolCall(None, None, error=why) if why else _call_from_object(obj, ("parameters", "arguments"), max_chars, max_depth)
    return ParsedTurn("", (call,))


def _parse_mistral(text: str, max_calls: int, max_chars: int, max_depth: int) -> ParsedTurn:
    start = text.find(_MISTRAL_OPEN)
    if start < 0:
        return ParsedTurn(text.strip(), ())
    content, rest = text[:start].strip(), text[start + len(_MISTRAL_OPEN):]
    if rest.lstrip().startswith("["):  # v3: one JSON list of calls
        body = rest.strip()
        if len(body) > max_chars * max(1, max_calls):
            return ParsedTurn(content, (ToolCall(None, None, error=f"the call list is {len(body):,} characters long, "
                                                                  f"over the limit of {max_chars * max(1, max_calls):,}"),))
        if not _depth_ok(body, max_depth + 1):
            return ParsedTurn(content, (ToolCall(None, None, error=f"the call's JSON nests deeper than {max_depth} levels"),))
        try:
            items, _ = json.JSONDecoder().raw_decode(body)
        except (ValueError, RecursionError) as exc:
            return ParsedTurn(content, (ToolCall(None, None, error=f"the call list is not valid JSON ({str(exc)[:80]}): {_excerpt(body)}"),))
        if not isinstance(items, list):
            return ParsedTurn(content, (ToolCall(None, None, error="[TOOL_CALLS] must be followed by a JSON list of calls"),))
        calls = tuple(_call_from_object(o, ("arguments", "parameters"), max_chars, max_depth) for o in items[:max_calls])
        return ParsedTurn(content, calls, max(0, len(items) - max_calls))
    calls, unparsed = [], 0  # v11+: name[ARGS]{...}, each after its own [TOOL_CALLS]
    for segment in rest.split(_MISTRAL_OPEN):
        if len(calls) >= max_calls:
            unparsed += 1
            continue
        name, found, args = segment.partition(_MISTRAL_ARGS)
        if not found:
            calls.append(ToolCall(None, None, error=f"a call must read [TOOL_CALLS]name[ARGS]{{...}}: {_excerpt(segment)}"))
            continue
        value, why = _load_json(args.strip(), max_chars, max_depth)
        calls.append(ToolCall(name.strip() or None, None, error=why) if why
                     else _call_from_object({"name": name.strip(), "arguments": value}, ("arguments",), max_chars, max_depth))
    return ParsedTurn(content, tuple(calls), unparsed)


def _xml_value(text: str, json_type: Any, max_chars: int, max_depth: int) -> tuple[Any, str | None]:
    """A parameter's text as the template wrote it (a string raw, anything else as JSON) read back by its type."""
    if text.startswith("\n"):  # the template's own line breaks around the value
        text = text[1:]
    if text.endswith("\n"):
        text = text[:-1]
    types = set(json_type) if isinstance(json_type, (list, tuple)) else {json_type} if json_type else set()
    if "string" in types or (types and not types & {"integer", "number", "boolean", "array", "object", "null"}):
        return text, None
    value, why = _load_json(text, max_chars, max_depth)
    if why is None:
        return value, None
    return (None, why) if types else (text, None)  # no schema: text that is not JSON is a string


def _parse_xml_call(body: str, param_types: Mapping[str, Mapping[str, Any]], max_chars: int,
                    max_depth: int) -> ToolCall:
    if len(body) > max_chars:
        return ToolCall(None, None, error=f"the call is {len(body):,} characters long, over the limit of {max_chars:,}")
    body = body.strip()
    if not body.startswith(_XML_FUNCTION):
        return ToolCall(None, None, error=f"a call must read <function=name>...</function>: {_excerpt(body)}")
    close = body.find(">", len(_XML_FUNCTION))
    end = body.rfind(_XML_FUNCTION_END)
    if close < 0 or end < close:
        return ToolCall(None, None, error=f"<function=...> is never closed by {_XML_FUNCTION_END}: {_excerpt(body)}")
    name = body[len(_XML_FUNCTION):close].strip()
    if not name:
        return ToolCall(None, None, error="the call has no function name")
    if body[end + len(_XML_FUNCTION_END):].strip():
        return ToolCall(name, None, error=f"text after </function>: {_excerpt(body[end:])}")
    types = (param_types.get(name) or {}).get("properties", {})
    arguments: dict[str, Any] = {}
    pos, inner = close + 1, body[:end]
    while True:
        start = inner.find(_XML_PARAM, pos)
        if start < 0:
            if inner[pos:].strip():
                return ToolCall(name, None, error=f"text between parameters: {_excerpt(inner[pos:])}")
            return ToolCall(name, arguments)
        if inner[pos:start].strip():
            return ToolCall(name, None, error=f"text between parameters: {_excerpt(inner[pos:start])}")
        key_end = inner.find(">", start + len(_XML_PARAM))
        value_end = inner.find(_XML_PARAM_END, key_end + 1) if key_end >= 0 else -1
        if value_end < 0:
            return ToolCall(name, None, error=f"<parameter=...> is never closed by {_XML_PARAM_END}")
        key = inner[start + len(_XML_PARAM):key_end].strip()
        value, why = _xml_value(inner[key_end + 1:value_end], (types.get(key) or {}).get("type"), max_chars, max_depth)
        if why is not None:
            return ToolCall(name, None, error=f"parameter {key!r}: {why}")
        if not key or key in arguments:
            return ToolCall(name, None, error=f"parameter name {key!r} is empty or repeated")
        arguments[key] = value
        pos = value_end + len(_XML_PARAM_END)


def _parse_qwen3_xml(text: str, max_calls: int, max_chars: int, max_depth: int,
                     param_types: Mapping[str, Mapping[str, Any]] | None = None) -> ParsedTurn:
    content, calls, pos, unparsed = [], [], 0, 0
    while True:
        start = text.find(_HERMES_OPEN, pos)
        if start < 0:
            content.append(text[pos:])
            break
        content.append(text[pos:start])
        if len(calls) >= max_calls:
            unparsed = text.count(_HERMES_OPEN, start)
            break
        end = text.find(_HERMES_CLOSE, start + len(_HERMES_OPEN))
        if end < 0:
            calls.append(ToolCall(None, None, error=f"{_HERMES_OPEN} is never closed by {_HERMES_CLOSE}"))
            break
        calls.append(_parse_xml_call(text[start + len(_HERMES_OPEN):end], param_types or {}, max_chars, max_depth))
        pos = end + len(_HERMES_CLOSE)
    return ParsedTurn("".join(content).strip(), tuple(calls), unparsed)


_PARSERS = {"hermes": _parse_hermes, "llama3": _parse_llama3, "mistral": _parse_mistral, "qwen3_xml": _parse_qwen3_xml}


def _check_format(call_format: str) -> str:
    if call_format not in CALL_FORMATS:
        raise ValueError(f"unknown tool-call format {call_format!r}: use one of {', '.join(CALL_FORMATS)} "
                         f"(or 'auto' in ToolEnv, to read it off the chat template)")
    return call_format


def parse_tool_calls(
    text: str,
    call_format: str = "hermes",
    *,
    max_calls: int = 8,
    max_call_chars: int = DEFAULT_MAX_CALL_CHARS,
    max_depth: int = DEFAULT_MAX_DEPTH,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> ParsedTurn:
    """Split a completion into text and tool calls, in linear time on bounded input.

    A completion with no call is a final answer (``calls == ()``). For ``"llama3"`` a turn that starts with
    ``{`` or ``<|python_tag|>`` is a call: a JSON object as a final answer reads as a (malformed) call.
    ``tools``: the tools' JSON schemas (OpenAI style, as ``apply_chat_template(tools=...)`` takes them); the
    ``"qwen3_xml"`` format needs them to read a parameter's value by its type (``"7"`` is 7 for an integer,
    the text ``7`` for a string).

    Example:
        >>> from llmgym.tools import parse_tool_calls
        >>> turn = parse_tool_calls('Let me add. <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
        >>> turn.content, turn.calls[0].name, turn.calls[0].arguments
        ('Let me add.', 'add', {'a': 1, 'b': 2})
        >>> parse_tool_calls('{"name": "add", "parameters": {"a": 1}}', "llama3").calls[0].arguments
        {'a': 1}
        >>> parse_tool_calls('[TOOL_CALLS][{"name": "add", "arguments": {}, "id": "a1b2c3d4e"}]', "mistral").calls[0].id
        'a1b2c3d4e'
        >>> parse_tool_calls("<tool_call>{oops</tool_call>").calls[0].error
        'the call is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)): "{oops"'
        >>> parse_tool_calls("The answer is 3.").calls
        ()
        >>> xml = "<tool_call>\\n<function=add>\\n<parameter=a>\\n1\\n</parameter>\\n</function>\\n</tool_call>"
        >>> schema = {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
        ...           "properties": {"a": {"type": "integer"}}}}}
        >>> parse_tool_calls(xml, "qwen3_xml", tools=[schema]).calls[0].arguments
        {'a': 1}
    """
    parse = _PARSERS[_check_format(call_format)]
    if call_format == "qwen3_xml":
        types = {t.get("function", t).get("name"): t.get("function", t).get("parameters") or {} for t in tools or ()}
        return parse(text, max(0, int(max_calls)), max_call_chars, max_depth, types)
    return parse(text, max(0, int(max_calls)), max_call_chars, max_depth)


def _wire_call(call: ToolCall | Mapping[str, Any]) -> tuple[str, dict[str, Any], str | None]:
    if isinstance(call, ToolCall):
        return call.name or "", dict(call.arguments or {}), call.id
    fn = call.get("function", call)
    return fn["name"], dict(fn.get("arguments") or {}), call.get("id")


def write_tool_calls(calls: Sequence[ToolCall | Mapping[str, Any]], call_format: str = "hermes") -> str:
    """The text a model writes to make ``calls`` (for warm-up data and the docs); :func:`parse_tool_calls` reads it back.

    Example:
        >>> from llmgym.tools import ToolCall, write_tool_calls
        >>> write_tool_calls([ToolCall("add", {"a": 1})])
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        >>> write_tool_calls([ToolCall("add", {"a": 1})], "llama3")
        '{"name": "add", "parameters": {"a": 1}}'
        >>> write_tool_calls([ToolCall("add", {"a": 1}, id="a1b2c3d4e")], "mistral")
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}, "id": "a1b2c3d4e"}]'
        >>> write_tool_calls([ToolCall("add", {"a": 1})], "qwen3_xml")
        '<tool_call>\\n<function=add>\\n<parameter=a>\\n1\\n</parameter>\\n</function>\\n</tool_call>'
    """
    call_format = _check_format(call_format)
    wire = [_wire_call(c) for c in calls]
    if call_format == "hermes":
        return "".join(_HERMES_OPEN + json.dumps({"name": n, "arguments": a}, ensure_ascii=False) + _HERMES_CLOSE
                       for n, a, _ in wire)
    if call_format == "llama3":
        if len(wire) != 1:
            raise ValueError(f"the llama3 format carries exactly one call per turn, got {len(wire)}")
        name, arguments, _ = wire[0]
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)
    if call_format == "qwen3_xml":  # as the Qwen 3.6 template writes them: strings raw, the rest as JSON
        return "\n".join(
            f"{_HERMES_OPEN}\n{_XML_FUNCTION}{n}>\n" + "".join(
                f"{_XML_PARAM}{k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n{_XML_PARAM_END}\n"
                for k, v in a.items()) + f"{_XML_FUNCTION_END}\n{_HERMES_CLOSE}" for n, a, _ in wire)
    items = [{"name": n, "arguments": a, **({"id": i} if i else {})} for n, a, i in wire]
    return _MISTRAL_OPEN + json.dumps(items, ensure_ascii=False)


_PROBE_NAME = "llmgym_probe_tool"


def detect_call_format(tokenizer: Any) -> str:
    """The tool-call format of ``tokenizer``'s chat template, read off how it renders a probe call.

    The template renders an assistant turn holding one call to a probe tool; the markers it writes
    (``<function=``, ``<tool_call>``, ``[TOOL_CALLS]``, ``"parameters"``) name the format, and the format's
    parser must read the probe call back from the template's own rendering. A tokenizer without a template,
    or a template that does not render tool calls at all, gets ``"hermes"`` (:class:`~llmgym.tools.ToolEnv`
    then describes the tools and the format in a system message). A template that renders calls some
    other way, or one whose call the parser cannot read back, raises a ``ValueError`` asking for
    ``call_format=`` explicitly.

    Example:
        >>> from llmgym.runtime.models import build_tokenizer
        >>> from llmgym.tools import detect_call_format
        >>> detect_call_format(build_tokenizer())
        'hermes'
    """
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return "hermes"
    call = {"id": "a1b2c3d4e", "type": "function", "function": {"name": _PROBE_NAME, "arguments": {"x": 1}}}
    probe = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    try:
        rendered = tokenizer.apply_chat_template(probe, tokenize=False)
    except Exception:  # a template that refuses tool calls renders none
        rendered = ""
    if _PROBE_NAME not in rendered:
        return "hermes"
    unknown = ("the chat template renders tool calls in a format llmgym does not recognise (none of <tool_call>, "
               "<function=...>, [TOOL_CALLS], a Llama {\"name\", \"parameters\"} object)")
    if _MISTRAL_OPEN in rendered:
        fmt = "mistral"
    elif _XML_FUNCTION + _PROBE_NAME in rendered:
        fmt = "qwen3_xml"
    elif _HERMES_OPEN in rendered:
        fmt = "hermes"
    elif '"parameters"' in rendered or _LLAMA_TAG in rendered:
        fmt = "llama3"
    else:
        raise ValueError(f"{unknown}: pass call_format= one of {', '.join(CALL_FORMATS)} to ToolEnv, whichever "
                         f"your model was trained to emit")
    turn = _probe_turn(tokenizer, probe, rendered)
    if turn is not None:
        read = parse_tool_calls(turn, fmt).calls
        if not (len(read) == 1 and read[0].name == _PROBE_NAME and read[0].arguments == {"x": 1}):
            raise ValueError(f"the chat template writes tool calls that the {fmt!r} parser cannot read back "
                             f"({_excerpt(turn)}): {unknown[len('the chat template renders tool calls '):]}; pass "
                             f"call_format= one of {', '.join(CALL_FORMATS)} if your model writes one of them")
    return fmt


def _probe_turn(tokenizer: Any, probe: list[dict[str, Any]], rendered: str) -> str | None:
    """The assistant's turn of the probe as the template wrote it (its closing cut), or ``None`` when the
    rendering does not split that way."""
    try:
        opening = tokenizer.apply_chat_template(probe[:1], add_generation_prompt=True, tokenize=False)
        from llmgym.env.core import ChatTurns

        closing = ChatTurns.of(tokenizer).closing
    except Exception:
        return None
    if not rendered.startswith(opening):
        return None
    turn = rendered[len(opening):]
    return turn[: len(turn) - len(closing)] if closing and turn.endswith(closing) else turn
