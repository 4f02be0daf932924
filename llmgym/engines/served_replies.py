"""What an OpenAI-compatible server may answer: its replies checked field by field, before any is used.

A server is not trusted. :func:`validate_completions_response` and :func:`validate_models_response` take the
raw status, content type and bytes of a ``POST /completions`` or ``GET /models`` reply and return plain,
checked data (:class:`ServedChoice`, ``(id, owned_by)`` pairs), or raise :class:`ServerError` naming the
server and the cause on one line; whatever of the server's text an error quotes goes through
:func:`one_line` first. :class:`~llmgym.engines.openai_api.OpenAIEngine` checks every reply with them; another
engine over OpenAI-compatible servers can too.

Example:
    >>> from llmgym.engines.served_replies import ServerError, validate_models_response
    >>> try:
    ...     validate_models_response(200, "text/html", b"<html>login</html>", server="http://h/v1")
    ... except ServerError as err:
    ...     print(err)
    http://h/v1/models answered an HTML page, not JSON: is the URL the API root (it ends in /v1)?
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from llmgym.errors import LLMGymError

__all__ = ["LOGPROB_MIN", "MalformedResponseError", "ServedChoice", "ServerError", "one_line",
           "validate_completions_response", "validate_models_response"]


class ServerError(LLMGymError, ConnectionError):
    """The server did not answer (after the retries), or answered with an error the engine cannot use."""


class MalformedResponseError(ServerError):
    """The server answered, but not in HTTP: a bad chunk size, an oversized header section, no status line, a
    body cut short. Not the same as a server that stopped answering: something is listening, and it is broken
    (or not the server meant)."""


#: A log-prob above this is not a log-prob (0 is the most; this much float error is tolerated).
LOGPROB_MAX = 1e-6
#: A log-prob below this is not one a server reports: vLLM writes -9999.0 for a probability of zero (an
#: ``-inf`` JSON cannot carry), and a sampled or scored token of a real model lies far above it (a float32
#: log-softmax bottoms out near -104 per unit of logit spread divided by the temperature). ``-1e300`` is a lie.
LOGPROB_MIN = -1e4
_TOKEN_ID_LIMIT = 1 << 31  # without a vocabulary: what no tokenizer reaches


class ServedChoice(NamedTuple):
    """One checked choice of a completions reply: ``token_ids`` is ``None`` where the server sent none."""

    text: str
    token_ids: list[int] | None
    logprobs: list[float | None]
    finish_reason: str


def one_line(value: Any, limit: int = 200) -> str:
    """Server text made safe for a one-line error: printable, one line, bounded.

    Example:
        >>> from llmgym.engines.served_replies import one_line
        >>> one_line("a\\nb\\x1b[31m c" + "d" * 300, limit=10)
        'a b [31m c...'
    """
    text = value if isinstance(value, str) else repr(value)
    text = " ".join("".join(c if c.isprintable() else " " for c in text[: 4 * limit]).split())
    return text[:limit] + ("..." if len(text) > limit else "")


def _json_reply(status: int, content_type: str | None, body: bytes, server: str) -> dict:
    """The reply's JSON object, or :class:`ServerError` for an HTTP error, an HTML page, invalid JSON or an
    error body (whatever its status)."""
    data: Any = None
    try:
        data = json.loads(body)
        parsed = True
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        parsed = False
    error = None
    if isinstance(data, dict):
        error = data.get("error") or (data.get("message") if data.get("object") == "error" else None)
        if isinstance(error, dict):
            error = error.get("message") or error
    if not 200 <= status < 300:
        detail = one_line(error) if error else one_line(body.decode("utf-8", "replace")) or "no message"
        raise ServerError(f"{server} answered HTTP {status} ({detail})")
    if error:
        raise ServerError(f"{server} answered an error: {one_line(error)}")
    if not parsed:
        head = body[:512].lstrip().lower()
        if "html" in (content_type or "").lower() or head.startswith((b"<!doctype", b"<html", b"<")):
            raise ServerError(f"{server} answered an HTML page, not JSON: is the URL the API root (it ends in /v1)?")
        raise ServerError(f"{server} answered invalid JSON ({one_line(body[:100].decode('utf-8', 'replace'))})")
    if not isinstance(data, dict):
        raise ServerError(f"{server} answered {type(data).__name__}, not a JSON object")
    return data


def _token_ids(raw: Any, where: str, vocab_size: int | None) -> list[int]:
    if not isinstance(raw, list):
        raise ServerError(f"{where}: token_ids is not a list ({one_line(raw, 60)})")
    limit = vocab_size if vocab_size is not None else _TOKEN_ID_LIMIT
    for t in raw:
        if type(t) is not int:  # bool and float are not token ids; 6.0 is not either (JSON has integers)
            raise ServerError(f"{where}: a token id is not an integer: {one_line(repr(t), 40)}")
        if not 0 <= t < limit:
            raise ServerError(f"{where}: token id {t} is outside the vocabulary of {limit}"
                              + ("" if vocab_size is not None else " (no tokenizer given: the bound is 2^31)"))
    return raw


def _logprobs(raw: Any, where: str, echoed: int) -> list[float | None]:
    if not isinstance(raw, list):
        raise ServerError(f"{where}: no log-probs (logprobs.token_logprobs is {one_line(raw, 60)}; "
                          f"does the server support logprobs=1?)")
    out: list[float | None] = []
    for i, lp in enumerate(raw):
        if lp is None and i == 0 and echoed:  # an echoed prompt's first token has no log-prob
            out.append(None)
            continue
        if type(lp) not in (int, float) or not math.isfinite(lp) or lp > LOGPROB_MAX:
            raise ServerError(f"{where}: log-prob {one_line(repr(lp), 40)} at position {i} is not a finite number <= 0")
        if lp < LOGPROB_MIN:
            raise ServerError(f"{where}: log-prob {one_line(repr(lp), 40)} at position {i} is below {LOGPROB_MIN:g} "
                              f"(LOGPROB_MIN): no server reports one (vLLM writes -9999.0 for a zero probability)")
        out.append(float(lp))
    return out


def validate_completions_response(
    status: int,
    content_type: str | None,
    body: bytes,
    *,
    server: str,
    max_tokens: int,
    vocab_size: int | None = None,
    n: int = 1,
    echoed: int = 0,
    model: str | None = None,
) -> list[ServedChoice]:
    """Check a ``POST /completions`` reply, field by field; return its ``n`` choices as plain data.

    The server is not trusted: an HTTP error status, an HTML page, invalid JSON, an error body (also with
    status 200), missing or malformed choices, token ids that are not integers or lie outside the
    vocabulary (``vocab_size``; without it, outside ``[0, 2^31)``), log-probs that are not finite numbers
    ``<= 0``, more than ``max_tokens`` tokens (plus the ``echoed`` prompt tokens of an ``echo=True``
    request, whose first log-prob may be ``None``), log-probs below :data:`LOGPROB_MIN`, log-probs and ids (or
    the ``logprobs.tokens`` the server lists) of different lengths, a choice ``index`` out of order, or -- with
    ``model`` given -- a reply that does not name ``model`` as the model that answered, each raise
    :class:`ServerError` naming ``server`` and the cause, on one line. Another engine over OpenAI-compatible
    servers can call it on the raw bytes of any reply.

    Example:
        >>> body = b'{"choices": [{"text": "hi", "finish_reason": "stop", "token_ids": [7, 8],'
        >>> body += b' "logprobs": {"token_logprobs": [-0.5, -0.25]}}]}'
        >>> validate_completions_response(200, "application/json", body, server="http://h/v1", max_tokens=8)
        [ServedChoice(text='hi', token_ids=[7, 8], logprobs=[-0.5, -0.25], finish_reason='stop')]
        >>> try:
        ...     validate_completions_response(200, "application/json", body.replace(b"-0.25", b"NaN"),
        ...                                   server="http://h/v1", max_tokens=8)
        ... except ServerError as err:
        ...     print(err)
        http://h/v1 choice 0: log-prob nan at position 1 is not a finite number <= 0
    """
    data = _json_reply(status, content_type, body, server)
    if model is not None and data.get("model") != model:
        named = data.get("model")
        raise ServerError(f"{server} answered as model {one_line(repr(named), 80)}, not the requested {one_line(repr(model), 80)}"
                          + (": the reply names no model" if named is None else
                             ": another model (or a proxy routing elsewhere) answered; its tokens and log-probs are "
                             "not the requested model's"))
    choices = data.get("choices")
    if not isinstance(choices, list):
        raise ServerError(f"{server}: the reply's choices is not a list ({one_line(choices, 60)})")
    if not choices:
        raise ServerError(f"{server} answered no choices")
    if len(choices) != n:
        raise ServerError(f"{server} answered {len(choices)} choices to a request for {n}")
    out = []
    for k, choice in enumerate(choices):
        where = f"{server} choice {k}"
        if not isinstance(choice, dict):
            raise ServerError(f"{where} is not an object ({one_line(choice, 60)})")
        if "index" in choice and (type(choice["index"]) is not int or choice["index"] != k):
            raise ServerError(f"{where}: its index is {one_line(repr(choice['index']), 40)}, not {k}")
        text = choice.get("text")
        if not isinstance(text, str):
            raise ServerError(f"{where}: text is not a string ({one_line(text, 60)})")
        finish = choice.get("finish_reason")
        if finish is not None and not isinstance(finish, str):
            raise ServerError(f"{where}: finish_reason is not a string ({one_line(finish, 60)})")
        raw_ids = choice.get("token_ids")  # vLLM's return_token_ids; null or absent where not asked for
        ids = _token_ids(raw_ids, where, vocab_size) if raw_ids is not None else None
        lp_block = choice.get("logprobs")
        lps = _logprobs(lp_block.get("token_logprobs") if isinstance(lp_block, dict) else None, where, echoed)
        count = len(ids) if ids is not None else len(lps)
        if count > max_tokens + echoed:
            raise ServerError(f"{where}: {count} tokens, over the {max_tokens + echoed} asked for "
                              f"(max_new_tokens={max_tokens}" + (f" + {echoed} echoed)" if echoed else ")"))
        if ids is not None and len(lps) != len(ids):
            raise ServerError(f"{where}: {len(lps)} log-probs for {len(ids)} tokens")
        listed = lp_block.get("tokens") if isinstance(lp_block, dict) else None
        if listed is not None and (not isinstance(listed, list) or len(listed) != len(lps)):
            raise ServerError(f"{where}: logprobs.tokens lists "
                              + (f"{len(listed)} tokens" if isinstance(listed, list) else one_line(repr(listed), 40))
                              + f" for {len(lps)} log-probs")
        out.append(ServedChoice(text, ids, lps, "length" if finish == "length" else "stop"))
    return out


def validate_models_response(status: int, content_type: str | None, body: bytes, *, server: str) -> list[tuple[str, str]]:
    """Check a ``GET /models`` reply; return ``(id, owned_by)`` per model, or raise :class:`ServerError`.

    Example:
        >>> validate_models_response(200, "application/json", b'{"data": [{"id": "m", "owned_by": "vllm"}]}',
        ...                          server="http://h/v1")
        [('m', 'vllm')]
    """
    data = _json_reply(status, content_type, body, server + "/models")
    models = data.get("data")
    if not isinstance(models, list):
        raise ServerError(f"{server}/models: data is not a list ({one_line(models, 60)}): is it an OpenAI-compatible API?")
    out = []
    for k, m in enumerate(models):
        if not isinstance(m, dict) or not isinstance(m.get("id"), str) or not m["id"]:
            raise ServerError(f"{server}/models: model {k} has no id ({one_line(m, 80)})")
        owner = m.get("owned_by")
        out.append((m["id"], owner if isinstance(owner, str) else ""))
    return out

