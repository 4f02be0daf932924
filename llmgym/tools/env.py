"""``ToolEnv``: a multi-turn env in which the policy calls functions before it answers.

Each completion either calls tools or answers. Calls are parsed in the chat template's format
(:mod:`llmgym.tools.calls`), validated against each tool's schema, run under a time limit, and their
results come back as ``tool``-role turns rendered by the chat template; a completion without a call is
the final answer, and only it is scored. Every error the completion causes (a malformed call, an unknown
tool, bad arguments, an exception, a time-out, too many calls) goes back to the model as a tool error
and is counted in ``info``; it never ends the run.
"""

from __future__ import annotations

import collections
import json
import math
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

from llmgym.env.core import MultiTurnEnv, TaskSourceLike, Turn
from llmgym.env.types import Task
from llmgym.env.verifiers import VerifierLike
from llmgym.tools.calls import (
    CALL_FORMATS, DEFAULT_MAX_CALL_CHARS, ParsedTurn, ToolCall, detect_call_format, parse_tool_calls, write_tool_calls,
)
from llmgym.tools.functions import Tool, ToolResult, ToolSetupError, as_tool

__all__ = ["ToolEnv", "tool_turn_text", "DEFAULT_MAX_RESULT_CHARS"]

DEFAULT_MAX_RESULT_CHARS = 2000
"""Characters of one tool result shown to the model; the rest is cut, with a note saying how much."""

_WORD_JOINER = "\u2060"  # an invisible character that breaks a special token's text apart
_CALL_ID = re.compile(r"[A-Za-z0-9]{9}")


def tool_turn_text(tokenizer: Any, assistant_message: Mapping[str, Any], tool_messages: Sequence[Mapping[str, Any]],
                   tools: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The text the chat template writes after an assistant turn that made calls: the tool turns, then the
    assistant's generation prompt.

    Rendered the standard way that never re-tokenises history: the template renders a short conversation
    (a user turn, the assistant's calls) with and without the tool messages, and the difference is the
    text to append (:meth:`llmgym.env.core.ChatTurns.appended`). A template that re-renders the assistant's
    turn once tool turns follow — Qwen 3's drops its ``<think>`` block — gets the text after that turn's
    closing: the model's own tokens stay as they were, the new turns are the template's. Any other rewrite
    of earlier turns raises a ``ValueError``.

    Example:
        >>> from llmgym.runtime.models import build_tokenizer
        >>> from llmgym.tools import tool_turn_text
        >>> call = {"id": "c00010001", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}
        >>> tool_turn_text(build_tokenizer(), {"role": "assistant", "content": "", "tool_calls": [call]},
        ...                [{"role": "tool", "tool_call_id": "c00010001", "name": "add", "content": "1"}])
        '<|tool|>1\\n<|assistant|>'
    """
    from llmgym.env.core import ChatTurns

    history = [{"role": "user", "content": "?"}, dict(assistant_message)]
    kwargs = {"tools": list(tools)} if tools else {}
    try:
        return ChatTurns.of(tokenizer).appended(history, [dict(m) for m in tool_messages], **kwargs)
    except ValueError as exc:
        raise ValueError(f"{exc} (the template is not prefix-stable), so tool turns cannot be appended to the "
                         f"model's own tokens") from None


def _episode_tools(factory: Callable[[], Any]) -> list[Tool]:
    """The public methods of one ``factory()`` instance as tools (schemas from a probe instance); each call
    goes to the current episode's own instance, in the env's process (the instance keeps state)."""
    import inspect

    probe = factory()
    found = []
    for name, method in inspect.getmembers(probe, predicate=inspect.ismethod):
        if name.startswith("_") or name in ("reset", "get_reward"):
            continue
        tool = Tool(method, isolated=False)
        tool.episode_method = True
        found.append(tool)
    if not found:
        raise ValueError(f"environment_factory {getattr(factory, '__name__', factory)!r} made an object with no public "
                         f"methods to offer as tools")
    return found


def _reset_instance(instance: Any, task: Task) -> Any:
    """``instance.reset(...)`` with the task's fields as keywords, as TRL passes a dataset row's columns:
    ``prompt``, ``answer``, ``id`` and every ``Task.metadata`` key, each only where ``reset`` takes it."""
    import inspect

    reset = getattr(instance, "reset", None)
    if not callable(reset):
        return None
    fields = {"prompt": task.prompt, "answer": task.answer, "id": task.id, **dict(task.metadata)}
    try:
        params = inspect.signature(reset).parameters
    except (TypeError, ValueError):
        return reset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return reset(**fields)
    return reset(**{k: v for k, v in fields.items() if k in params})


class ToolEnv(MultiTurnEnv):
    """Tasks solved with function calls: the policy calls tools, reads their results, then answers.

    Args:
        tasks: a list of :class:`~llmgym.Task`, an iterable, or ``fn(rng) -> Task``; a text prompt becomes a
            user message (tools need a conversation).
        verifier: scores the final answer only (the completion without a call), as in any env.
        tokenizer: optional; with a chat template, tools, calls and results are rendered by it.
        tools: callables with type hints and a docstring (``Args:``), or :class:`~llmgym.tools.Tool` objects.
        environment_factory: TRL's ``environment_factory``: a class (or zero-argument callable) whose public
            methods are tools. Each episode gets its own instance (in ``self.state["environment"]``); its
            ``reset(**fields)``, if any, starts the episode with the task's ``prompt``, ``answer``, ``id`` and
            metadata as keywords (as TRL passes a dataset row), and a string it returns is appended to the last
            user message. Its methods keep state, so they run in the env's process, without a killable time limit.
        max_turns: completions per episode at most (calls and the answer together); an episode still
            calling tools at the last turn is truncated with nothing scored.
        call_format: ``"auto"`` (read off the chat template), ``"hermes"``, ``"llama3"``, ``"mistral"`` or
            ``"qwen3_xml"`` (:data:`~llmgym.tools.CALL_FORMATS`).
        max_calls_per_turn: calls run per completion; further calls are answered with an error.
        max_result_chars: characters of each result shown to the model (:data:`DEFAULT_MAX_RESULT_CHARS`).
        max_call_chars: characters of one call's JSON at most (a longer call is a malformed one).
        call_cost: reward subtracted per call (≥ 0; default 0): tools never earn reward, and with a cost
            an answer found without them is worth more.
        system_prompt: a system message put before the task's messages.

    How tools reach the model: the template's own ``tools=`` rendering when it has one; otherwise (no
    template, or one that ignores ``tools``) a system message lists the tools' schemas and shows how to
    call one in ``call_format``. Token ids in, token ids out: the observation is the previous context,
    the completion's exact ids, and the encoded tool turns (:func:`tool_turn_text`), never a re-tokenised
    transcript. A tool result's text cannot forge a turn boundary: any special token's text in it (say
    ``<|im_end|>``) is broken with an invisible U+2060 before it is encoded.

    ``info`` of a turn with calls: ``tool_calls`` (name, arguments, error kind of each), ``tool_errors``
    (counts by kind, :data:`~llmgym.tools.ERROR_KINDS`), ``assistant_message`` (the calls as chat
    messages), ``reply`` (the tool messages). The episode's totals are in ``self.state``
    (``"tool_calls"``, ``"tool_errors"``) and in the final step's ``info``.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.tools import ToolEnv
        >>> def add(a: int, b: int) -> int:
        ...     '''Add two integers.
        ...
        ...     Args:
        ...         a: the first number
        ...         b: the second number
        ...     '''
        ...     return a + b
        >>> env = ToolEnv([Task("What is 1234 + 4321?", answer="5555")],
        ...               lambda task, text: float(text.strip() == task.answer), tools=[add])
        >>> _ = env.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = env.step(
        ...     '<tool_call>{"name": "add", "arguments": {"a": 1234, "b": 4321}}</tool_call>')
        >>> reward, terminated, info["reply"][0]["content"]
        (0.0, False, '5555')
        >>> obs["prompt"].endswith("tool: 5555\\nassistant:")
        True
        >>> env.step("5555")[1:3]
        (1.0, True)
    """

    setup_errors = (ToolSetupError,)

    def __init__(
        self,
        tasks: TaskSourceLike,
        verifier: VerifierLike | None,
        tokenizer: Any = None,
        *,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        environment_factory: Callable[[], Any] | None = None,
        max_turns: int = 4,
        call_format: str = "auto",
        max_calls_per_turn: int = 4,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
        max_call_chars: int = DEFAULT_MAX_CALL_CHARS,
        call_cost: float = 0.0,
        system_prompt: str | None = None,
        **kwargs: Any,
    ):
        tool_list = [as_tool(t) for t in tools]
        self.environment_factory = environment_factory
        if environment_factory is not None:
            tool_list += _episode_tools(environment_factory)
        if not tool_list:
            raise ValueError("a ToolEnv needs at least one tool: tools=[fn, ...] or environment_factory=Class")
        names = [t.name for t in tool_list]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        if call_format != "auto" and call_format not in CALL_FORMATS:
            raise ValueError(f"call_format must be 'auto' or one of {', '.join(CALL_FORMATS)}, got {call_format!r}")
        for name, value in (("max_calls_per_turn", max_calls_per_turn), ("max_result_chars", max_result_chars),
                            ("max_call_chars", max_call_chars)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not (isinstance(call_cost, (int, float)) and math.isfinite(call_cost) and call_cost >= 0):
            raise ValueError(f"call_cost must be a finite number >= 0 (a cost, never a bonus), got {call_cost!r}")
        self.tools: dict[str, Tool] = {t.name: t for t in tool_list}
        self.tool_schemas: list[dict[str, Any]] = [t.schema for t in tool_list]
        self._call_format_arg = call_format
        self.max_calls_per_turn, self.max_result_chars, self.max_call_chars = max_calls_per_turn, max_result_chars, max_call_chars
        self.call_cost, self.system_prompt = float(call_cost), system_prompt
        super().__init__(tasks, verifier, tokenizer, max_turns=max_turns, **kwargs)

    # -- configuration ----------------------------------------------------------------------------
    def set_tokenizer(self, tokenizer: Any) -> None:
        super().set_tokenizer(tokenizer)
        self._call_format: str | None = None
        self._renders_tools: bool | None = None
        self._special_texts: list[str] | None = None
        self._raw_completion = ""

    @property
    def call_format(self) -> str:
        """The tool-call format in use: the one given, or the chat template's (:func:`detect_call_format`)."""
        if self._call_format is None:
            fmt = self._call_format_arg
            self._call_format = detect_call_format(self.tokenizer) if fmt == "auto" else fmt
        return self._call_format

    def _has_template(self) -> bool:
        return self.tokenizer is not None and bool(getattr(self.tokenizer, "chat_template", None))

    def _uses_chat_template(self) -> bool:  # every task is a conversation here
        return self._has_template()

    def _template_renders_tools(self) -> bool:
        if self._renders_tools is None:
            probe = [{"role": "user", "content": "?"}]
            try:
                with_tools = self.tokenizer.apply_chat_template(probe, tools=self.tool_schemas, tokenize=False)
            except Exception as exc:
                raise ToolSetupError(f"the chat template cannot render this env's tools ({type(exc).__name__}: "
                                     f"{exc}): check the tool schemas, or pass a tokenizer whose template takes tools=") from exc
            self._renders_tools = with_tools != self.tokenizer.apply_chat_template(probe, tokenize=False)
            self._check_tool_turns()
        return self._renders_tools

    def _check_tool_turns(self) -> None:
        """Render a probe tool turn once per tokenizer, so a template that cannot is reported at reset."""
        name = next(iter(self.tools))
        assistant, results = self._messages([ToolCall(name, {})], [ToolResult("0")])
        try:
            tool_turn_text(self.tokenizer, assistant, results, self._tools_kwarg())
        except Exception as exc:
            raise ToolSetupError(
                f"this tokenizer's chat template cannot append tool results to a conversation "
                f"({type(exc).__name__}: {exc}); use a template with a tool role, or subclass ToolEnv and "
                f"override _tool_turn(turn, ids) to write the tool turns yourself"
            ) from exc

    def _tools_kwarg(self) -> list[dict[str, Any]] | None:
        return self.tool_schemas if self._renders_tools else None

    def tool_guide(self) -> str:
        """The system text that introduces the tools where the chat template does not render them."""
        example = {k: f"<{k}>" for k in list(next(iter(self.tools.values())).parameters.get("properties", {}))[:2]}
        lines = [json.dumps(schema["function"], ensure_ascii=False) for schema in self.tool_schemas]
        call = write_tool_calls([ToolCall(next(iter(self.tools)), example, id="a1b2c3d4e")], self.call_format)
        return ("You can call these tools:\n" + "\n".join(lines) + f"\nTo call one, write {call} and wait for the "
                "result. When you know the answer, reply with it and no tool call.")

    # -- rendering ----------------------------------------------------------------------------------
    def _conversation(self, task: Task) -> list[dict[str, Any]]:
        messages = [dict(m) for m in task.prompt] if task.is_chat else [{"role": "user", "content": task.prompt}]
        if self.environment_factory is not None:  # this episode's own instance, as TRL's environment_factory
            instance = self.environment_factory()
            self.state["environment"] = instance
            opening = _reset_instance(instance, task)
            if isinstance(opening, str) and opening:
                last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
                if last_user is None:
                    messages.append({"role": "user", "content": opening})
                else:
                    messages[last_user] = {**messages[last_user], "content": f"{messages[last_user].get('content', '')}{opening}"}
        system = [self.system_prompt] if self.system_prompt else []
        if not (self._has_template() and self._template_renders_tools()):
            system.append(self.tool_guide())
        if system:
            if messages and messages[0].get("role") == "system":
                system.append(str(messages.pop(0).get("content", "")))
            messages.insert(0, {"role": "system", "content": "\n\n".join(system)})
        return messages

    def _render_prompt(self, task: Task) -> tuple[str, list[int]]:
        messages = self._conversation(task)
        if self._has_template():
            text = self.tokenizer.apply_chat_template(messages, tools=self._tools_kwarg(), add_generation_prompt=True,
                                                      tokenize=False)
        else:  # the plain transcript of render_prompt
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        ids = list(self.tokenizer.encode(text, add_special_tokens=False)) if self.tokenizer is not None else []
        return text, ids

    def _defuse(self, text: str) -> str:
        """``text`` with every special token's text broken by U+2060, so encoding it never yields that token."""
        if self.tokenizer is None:
            return text
        if self._special_texts is None:
            found = set(getattr(self.tokenizer, "all_special_tokens", None) or ())
            found.update(str(getattr(t, "content", t)) for t in (getattr(self.tokenizer, "added_tokens_decoder", None) or {}).values())
            self._special_texts = sorted((s for s in found if len(s) > 1), key=len, reverse=True)
        for special in self._special_texts:
            if special in text:
                text = text.replace(special, special[0] + _WORD_JOINER + special[1:])
        return text

    def _reply_text(self, turn: Turn, ids: list[int]) -> str:
        if isinstance(turn.reply, str):  # a plain reply (a subclass's): a user turn, as in MultiTurnEnv
            return super()._reply_text(turn, ids)
        return self._tool_turn(turn, ids)

    def _tool_turn(self, turn: Turn, ids: list[int]) -> str:
        """The text appended after a completion that made calls: its closing, the tool turns, the next prompt."""
        results = list(turn.reply or [])
        if not self._has_template():
            return "\n" + "".join(f"tool: {m['content']}\n" for m in results) + "assistant:"
        closing = self._close_turn(ids)
        assistant = turn.info["assistant_message"]
        try:
            return closing + tool_turn_text(self.tokenizer, assistant, results, self._tools_kwarg())
        except Exception:  # the model's arguments upset the template: render the same turns without them
            neutral = {**assistant, "tool_calls": [{**c, "function": {**c["function"], "arguments": {}}}
                                                   for c in assistant["tool_calls"]]}
            try:
                return closing + tool_turn_text(self.tokenizer, neutral, results, self._tools_kwarg())
            except Exception as exc:
                raise ToolSetupError(f"the chat template cannot render this tool turn ({type(exc).__name__}: {exc})") from exc

    def _messages(self, calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The calls as an assistant message and the results as tool messages (ids paired, Mistral-style)."""
        wire, tool_messages = [], []
        for k, (call, result) in enumerate(zip(calls, results)):
            call_id = call.id if call.id and _CALL_ID.fullmatch(call.id) else f"c{self.turn % 10_000:04d}{k % 10_000:04d}"
            name = call.name if call.name in self.tools else (call.name or "invalid_call")
            wire.append({"id": call_id, "type": "function",
                         "function": {"name": name[:64], "arguments": dict(call.arguments or {})}})
            tool_messages.append({"role": "tool", "tool_call_id": call_id, "name": name[:64], "content": result.content})
        return {"role": "assistant", "content": "", "tool_calls": wire}, tool_messages

    # -- the episode --------------------------------------------------------------------------------
    def _after_completion(self, text: str, ids: list[int]):
        self._raw_completion = self._raw_text(text, ids)
        if self.tokenizer is not None and ids:  # the transcript shows the special tokens the ids hold ([TOOL_CALLS])
            shown = self.tokenizer.decode(ids, skip_special_tokens=False)[: self.max_completion_chars]
            self._text = self._text[: len(self._text) - len(text)] + shown
        return super()._after_completion(text, ids)

    def _raw_text(self, text: str, ids: list[int]) -> str:
        """The completion with special tokens kept (Mistral's ``[TOOL_CALLS]`` is one), without its end-of-turn id."""
        if self.tokenizer is None or not ids:
            return text
        while ids and ids[-1] in self.stop_token_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)[: self.max_completion_chars]

    def respond(self, completion: str) -> Turn:
        """Run the completion's calls and reply with their results; a completion without calls is the answer."""
        parsed = parse_tool_calls(self._raw_completion or completion, self.call_format, max_calls=self.max_calls_per_turn,
                                  max_call_chars=self.max_call_chars, tools=self.tool_schemas)
        self._raw_completion = ""
        if not parsed.calls and not parsed.unparsed:
            return self._final(completion)
        return self._run_calls(parsed)

    def _episode_tool_names(self) -> set[str]:
        return {t.name for t in self.tools.values() if getattr(t, "episode_method", False)}

    def _totals(self) -> tuple[int, collections.Counter]:
        """The episode's calls and errors so far, kept in ``self.state`` (so a subclass's ``start`` need not)."""
        return self.state.setdefault("tool_calls", 0), self.state.setdefault("tool_errors", collections.Counter())

    def _final(self, completion: str) -> Turn:
        score = self.score(completion)
        calls, errors = self._totals()
        info: dict[str, Any] = {"score": dict(score.info), "tool_calls_total": calls, "tool_errors_total": dict(errors)}
        if "error" in score.info:
            info["error"] = score.info["error"]
        return Turn(score.reward, None, True, info)

    def _run_calls(self, parsed: ParsedTurn) -> Turn:
        calls = list(parsed.calls)
        if not calls:  # only calls over the limit (max_calls_per_turn = 0 cannot happen; kept for safety)
            calls = [ToolCall(None, None, error="no call could be read")]
        results = [self._run_one(call) for call in calls]
        if parsed.unparsed:
            last = results[-1]
            results[-1] = ToolResult(f"{last.content}\nError: only {self.max_calls_per_turn} calls are run per turn; "
                                     f"{parsed.unparsed} more were not run.", last.error, last.truncated)
        errors = collections.Counter(r.error for r in results if r.error)
        if parsed.unparsed:
            errors["over_limit"] += parsed.unparsed
        self._totals()
        self.state["tool_calls"] += len(calls) + parsed.unparsed
        self.state["tool_errors"].update(errors)
        assistant, tool_messages = self._messages(calls, results)
        info = {
            "tool_calls": [{"name": c.name, "arguments": c.arguments, "error": r.error} for c, r in zip(calls, results)],
            "tool_errors": dict(errors), "assistant_message": assistant,
            "tool_calls_total": self.state["tool_calls"], "tool_errors_total": dict(self.state["tool_errors"]),
        }
        cost = self.call_cost * (len(calls) + parsed.unparsed)
        return Turn(-cost if cost else 0.0, tool_messages, False, info)

    def _run_one(self, call: ToolCall) -> ToolResult:
        """One call's result, or the error the model gets back; the text is cut and defused."""
        if not call.ok:
            result = ToolResult.failure("malformed", f"the tool call could not be read: {call.error}")
        elif call.name not in self.tools:
            shown = json.dumps(call.name[:64], ensure_ascii=False)
            result = ToolResult.failure("unknown_tool", f"there is no tool named {shown}; the tools are {', '.join(self.tools)}")
        else:
            tool = self.tools[call.name]
            why = tool.validate(call.arguments)
            if why is not None:
                result = ToolResult.failure("bad_arguments", f"bad arguments for {call.name}: {why}")
            else:
                instance = self.state.get("environment")
                method = getattr(instance, call.name) if tool.name in self._episode_tool_names() else None
                result = tool.run(call.arguments, self.max_result_chars, function=method)
        content, cut = result.content, result.truncated
        if len(content) > self.max_result_chars:
            content, cut = content[: self.max_result_chars], cut + len(content) - self.max_result_chars
        if cut:
            content += f"\n[... {cut:,} more characters cut]"
        return ToolResult(self._defuse(content), result.error, cut)
