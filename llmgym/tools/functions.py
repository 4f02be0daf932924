"""A tool: a plain Python callable, its JSON schema, argument validation, and a run under a time limit.

The schema comes from ``transformers.utils.get_json_schema`` (type hints + a Google-style docstring with an
``Args:`` section), the same function ``apply_chat_template(tools=[fn])`` uses, or is given explicitly in
the OpenAI form ``{"type": "function", "function": {"name", "description", "parameters"}}``. Arguments are
validated against it with ``jsonschema`` before the tool sees them; unknown arguments are refused unless the
function takes ``**kwargs``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import inspect
import math
import os
from typing import Any, Callable, Mapping, Sequence

from llmgym.errors import LLMGymError

__all__ = ["Tool", "ToolResult", "ToolSetupError", "as_tool", "DEFAULT_TIME_LIMIT", "ERROR_KINDS"]

DEFAULT_TIME_LIMIT = 10.0
"""Seconds one call of a tool may run (in its killable child) unless the tool says otherwise."""

#: Why a call did not give a result, as counted in ``info["tool_errors"]``.
ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "exception", "timeout", "crashed", "over_limit")


class ToolSetupError(LLMGymError, RuntimeError):
    """A tool env's set-up failed, not the completion: a tool the worker cannot load, a template that cannot
    render tool turns. Raised from ``step`` (never a silent tool error), with what to do."""


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What one call gave back: the text shown to the model and, for a failed call, the kind of error.

    Attributes:
        content: the result as text (or the error message, starting with ``"Error: "``).
        error: one of :data:`ERROR_KINDS`, or ``None`` for a result.
        truncated: characters cut from a result longer than the env's ``max_result_chars``.
    """

    content: str
    error: str | None = None
    truncated: int = 0

    @classmethod
    def failure(cls, kind: str, message: str) -> "ToolResult":
        return cls(f"Error: {message}", kind)


def _explicit_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    schema = copy.deepcopy(dict(schema))
    if schema.get("type") != "function":  # a bare {"name", "description", "parameters"} is accepted too
        schema = {"type": "function", "function": schema}
    fn = schema.get("function")
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ValueError('a tool schema needs {"type": "function", "function": {"name": ..., "parameters": {...}}}')
    fn.setdefault("parameters", {"type": "object", "properties": {}})
    return schema


def _takes_var_keywords(function: Callable) -> bool:
    try:
        return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return True


def _valid_name(name: Any) -> bool:
    return isinstance(name, str) and bool(name) and "=" not in name and "\0" not in name


def _checked_env(env: Mapping[str, str] | None, pass_env: Sequence[str], isolated: bool) -> tuple[dict[str, str], tuple[str, ...]]:
    """``Tool``'s ``env`` and ``pass_env``, checked: names are non-empty strings without ``=`` or NUL, values strings."""
    env = dict(env or {})
    if isinstance(pass_env, str):
        raise TypeError(f"pass_env must be a list of variable names, got the string {pass_env!r}: write pass_env=[{pass_env!r}]")
    pass_env = tuple(pass_env)
    for name in (*env, *pass_env):
        if not _valid_name(name):
            raise ValueError(f"invalid environment variable name {name!r} for a tool: a non-empty string without '=' or NUL")
    for name, value in env.items():
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"tool env value of {name!r} must be a string without NUL, got {type(value).__name__}")
    if (env or pass_env) and not isolated:
        raise ValueError("env= and pass_env= set the environment of an isolated tool's process; a tool with "
                         "isolated=False runs in the env's own process: drop them, or isolate the tool")
    return env, pass_env


class Tool:
    """A function the policy may call.

    Args:
        function: the callable; called with keyword arguments that passed validation.
        schema: the OpenAI-style schema; default ``transformers.utils.get_json_schema(function)``.
        time_limit: seconds one call may take. Calls run in a child of a clean helper process
            (:mod:`llmgym.tools.helper_process`) that is killed at the limit.
        isolated: ``False`` runs the function in the env's own process, without a time limit: for a
            function that bounds its own time (the sandboxed :func:`~llmgym.tools.python_tool`) or
            must keep state between calls. Its exceptions still become tool errors, except
            :class:`~llmgym.sandbox.SandboxError` (the machine's failure), which is raised.
        env: variables set in the environment of each call (an isolated tool only). A tool's process
            does not get the trainer's environment, only an allow-list of it (the search path, the locale,
            the interpreter's settings: :mod:`llmgym.sandbox.child_env`): no API key or secret reaches
            what the model drives unless it is named here or in ``pass_env``.
        pass_env: names of the trainer's environment variables each call gets too, read at the call
            (one the trainer lacks is left unset).

    Example:
        >>> from llmgym.tools import Tool
        >>> def add(a: int, b: int) -> int:
        ...     '''Add two integers.
        ...
        ...     Args:
        ...         a: the first number
        ...         b: the second number
        ...     '''
        ...     return a + b
        >>> tool = Tool(add)
        >>> tool.name, tool.schema["function"]["parameters"]["required"]
        ('add', ['a', 'b'])
        >>> tool.validate({"a": 1, "b": "two"})
        "argument 'b': 'two' is not of type 'integer'"
        >>> tool.run({"a": 1, "b": 2}).content
        '3'
        >>> import os
        >>> os.environ["MY_TOKEN"] = "not for the model"
        >>> Tool(os.getenv, schema={"name": "getenv"}).run({"key": "MY_TOKEN"}).content
        'null'
        >>> Tool(os.getenv, schema={"name": "getenv"}, pass_env=["MY_TOKEN"]).run({"key": "MY_TOKEN"}).content
        'not for the model'
        >>> del os.environ["MY_TOKEN"]
    """

    def __init__(self, function: Callable[..., Any], *, schema: Mapping[str, Any] | None = None,
                 time_limit: float = DEFAULT_TIME_LIMIT, isolated: bool = True,
                 env: Mapping[str, str] | None = None, pass_env: Sequence[str] = ()):
        if not callable(function):
            raise TypeError(f"a tool must be a callable, got {type(function).__name__}")
        if not (isinstance(time_limit, (int, float)) and math.isfinite(time_limit) and time_limit > 0):
            raise ValueError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
        self.function, self.time_limit, self.isolated = function, float(time_limit), bool(isolated)
        self.env, self.pass_env = _checked_env(env, pass_env, self.isolated)
        if schema is None:
            from transformers.utils import get_json_schema

            try:
                schema = get_json_schema(function)
            except Exception as exc:  # transformers' DocstringParsingException / TypeHintParsingException
                raise ValueError(
                    f"cannot build a JSON schema for tool {getattr(function, '__name__', function)!r}: {exc}. "
                    f"Give it type hints and a docstring with an 'Args:' section describing every argument, "
                    f"or pass Tool(fn, schema={{...}})"
                ) from exc
        self.schema = _explicit_schema(schema)
        self.name: str = self.schema["function"]["name"]
        self.parameters: dict[str, Any] = self.schema["function"]["parameters"]
        import jsonschema

        strict = dict(self.parameters)
        if not _takes_var_keywords(function) and "additionalProperties" not in strict:
            strict["additionalProperties"] = False  # an unknown argument is the model's error, not a TypeError later
        validator_cls = jsonschema.validators.validator_for(strict, default=jsonschema.Draft202012Validator)
        try:
            validator_cls.check_schema(strict)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"tool {self.name!r} has an invalid parameters schema: {exc.message}") from exc
        self._strict = strict
        self._validator: Any = None
        self._blob: bytes | None = None
        if self.isolated:
            self._pickled()  # refuse an unpicklable tool now, not at its first call

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_validator"] = None  # rebuilt on demand
        return state

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, time_limit={self.time_limit}, isolated={self.isolated})"

    @property
    def key(self) -> str:
        """Identifies the pickled function in the helper's cache."""
        return f"{self.name}-{hashlib.sha1(self._pickled()).hexdigest()[:16]}"

    def _pickled(self) -> bytes:
        if self._blob is None:
            import cloudpickle

            try:
                self._blob = cloudpickle.dumps(self.function)
            except Exception as exc:
                raise ValueError(
                    f"tool {self.name!r} cannot be sent to the tool worker process ({type(exc).__name__}: {exc}): "
                    f"make it a module-level function of plain data, or pass isolated=False to run it in the env's "
                    f"process (then without a time limit)"
                ) from exc
        return self._blob

    def validate(self, arguments: Any) -> str | None:
        """Why ``arguments`` do not fit the schema (one bounded sentence), or ``None`` when they do."""
        if not isinstance(arguments, dict):
            return f"the arguments must be a JSON object, got {type(arguments).__name__}"
        if self._validator is None:
            import jsonschema

            cls = jsonschema.validators.validator_for(self._strict, default=jsonschema.Draft202012Validator)
            self._validator = cls(self._strict)
        error = next(iter(self._validator.iter_errors(arguments)), None)
        if error is None:
            return None
        where = ".".join(str(p) for p in error.absolute_path)
        message = error.message if len(error.message) <= 200 else error.message[:200] + "..."
        return f"argument {where!r}: {message}" if where else message

    episode_method = False  # True for a method of ToolEnv's per-episode environment_factory instance

    def run(self, arguments: dict[str, Any], max_chars: int = 10_000, *, function: Callable[..., Any] | None = None) -> ToolResult:
        """Call the tool on validated ``arguments``: its result as text, or a :class:`ToolResult` error.

        ``function`` replaces the tool's own callable for this call (an in-process tool only): the same
        method of this episode's object, for a ``ToolEnv(environment_factory=...)``.
        """
        if function is not None and self.isolated:
            raise ValueError(f"tool {self.name!r} runs isolated; a per-call function needs Tool(..., isolated=False)")
        if not self.isolated:
            return self._run_here(function or self.function, arguments, max_chars)
        from llmgym.tools.helper_process import HELPER_ENV, tool_worker

        if os.environ.get(HELPER_ENV):
            raise ToolSetupError(
                f"tool {self.name!r} was called inside the tool worker process, while it imported a tool's module: "
                f"that module runs an episode at import; put that code under `if __name__ == \"__main__\":`")
        env = {**{n: os.environ[n] for n in self.pass_env if n in os.environ}, **self.env}
        outcome = tool_worker().call(self.key, self._pickled(), arguments, time_limit=self.time_limit, max_chars=max_chars,
                                     env=env)
        status = outcome[0]
        if status == "ok":
            return ToolResult(outcome[1], None, max(0, outcome[2] - len(outcome[1])))
        if status == "exception":
            return ToolResult.failure("exception", f"the tool raised {outcome[1]}")
        if status == "timeout":
            return ToolResult.failure("timeout", f"the tool ran past its time limit of {self.time_limit:g} s and was stopped")
        if status == "load_error":  # the user's setup, not the model's call: never a silent tool error
            raise ToolSetupError(f"tool {self.name!r} could not be loaded in the tool worker process ({outcome[1]}): "
                                 f"define it in an importable module, or pass isolated=False to run it in the env's process")
        return ToolResult.failure("crashed", f"the tool's process died ({outcome[1] if len(outcome) > 1 else status})")

    @staticmethod
    def _run_here(function: Callable[..., Any], arguments: dict[str, Any], max_chars: int) -> ToolResult:
        from llmgym.sandbox import SandboxError
        from llmgym.tools.tool_helper import as_text

        try:
            text = as_text(function(**arguments))
        except SandboxError:
            raise
        except Exception as exc:
            return ToolResult.failure("exception", f"the tool raised {type(exc).__name__}: {str(exc)[:max_chars]}")
        return ToolResult(text[:max_chars], None, max(0, len(text) - max_chars))


def as_tool(value: Tool | Callable[..., Any]) -> Tool:
    """``value`` itself if it is a :class:`Tool`, else ``Tool(value)``.

    Example:
        >>> from llmgym.tools import as_tool
        >>> as_tool(print)
        Traceback (most recent call last):
        ...
        ValueError: cannot build a JSON schema for tool 'print': ...
    """
    return value if isinstance(value, Tool) else Tool(value)
