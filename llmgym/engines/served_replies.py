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
from collections.abc import Sequence
from typing import Any, NamedTuple

from llmgym.errors import LLMGymError

__all__ = ["LOGPROB_MIN", "PROBABILITY_SUM_TOL", "MalformedResponseError", "ServedChoice", "ServerError", "check_echo",
           "one_line", "token_renderings", "validate_completions_response", "validate_models_response"]


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
#: Alternatives at one position are distinct tokens of one distribution: their probabilities sum to at most 1.
#: This much above 1 is tolerated (rounding of each log-prob, bf16 logits); a reply that names two tokens
#: each at probability ~1 sums to ~2.
PROBABILITY_SUM_TOL = 0.05
#: The same float sent twice in one reply (a token's log-prob and its entry among the alternatives).
_SAME_LOGPROB_TOL = 1e-4


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
    sent: Sequence[int] | None = None,
    tokenizer: Any = None,
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

    Alternatives (``logprobs.top_logprobs``, vLLM's ``prompt_logprobs``) are log-probs of *distinct* tokens at
    one position: each is checked as a log-prob, and their probabilities (with the scored token's) must not sum
    above 1 (+ :data:`PROBABILITY_SUM_TOL`). With ``sent`` (the prompt ids of an ``echo=True`` request) every
    field that says what the server scored is compared with what was sent, position by position
    (:func:`check_echo`): the ids, the token strings, the text offsets, the alternatives, the prompt's text.

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
        _check_alternatives(lp_block.get("top_logprobs") if isinstance(lp_block, dict) else None, lps, listed, where)
        if sent is not None:
            check_echo(choice, lps, sent, tokenizer, where)
        out.append(ServedChoice(text, ids, lps, "length" if finish == "length" else "stop"))
    return out


def _is_logprob(lp: Any) -> bool:
    return type(lp) in (int, float) and math.isfinite(lp) and LOGPROB_MIN <= lp <= LOGPROB_MAX


def _check_alternatives(raw: Any, lps: list[float | None], listed: Any, where: str) -> None:
    """``logprobs.top_logprobs``: per position ``None`` or ``{token string: log-prob}``; each a log-prob, and the
    probabilities of the distinct tokens named at one position (the scored one included) summing to at most 1."""
    if raw is None:
        return
    if not isinstance(raw, list) or len(raw) != len(lps):
        raise ServerError(f"{where}: logprobs.top_logprobs lists "
                          + (f"{len(raw)} positions" if isinstance(raw, list) else one_line(repr(raw), 40))
                          + f" for {len(lps)} log-probs")
    for i, alternatives in enumerate(raw):
        if alternatives is None:
            continue
        if not isinstance(alternatives, dict) or not all(_is_logprob(v) for v in alternatives.values()):
            raise ServerError(f"{where}: top_logprobs at position {i} is not a map of token to log-prob "
                              f"({one_line(repr(alternatives), 60)})")
        total = sum(math.exp(v) for v in alternatives.values())
        token = listed[i] if isinstance(listed, list) and isinstance(listed[i], str) else None
        if lps[i] is not None and token not in alternatives:
            total += math.exp(lps[i])
        if total > 1.0 + PROBABILITY_SUM_TOL:
            raise ServerError(f"{where}: the tokens named at position {i} have probabilities summing to {total:.3g} "
                              f"(distinct tokens of one distribution sum to at most 1): not log-probs of one model")


def token_renderings(tokenizer: Any, token_id: int) -> set[str]:
    """Every string a server may show for ``token_id``: vLLM's ``token_id:N`` (``return_tokens_as_token_ids``),
    the id decoded alone (special tokens kept or skipped, leading spaces a sentencepiece marker stood for
    restored), the raw vocabulary entry and its string form. A string outside this set names another token.

    Example:
        >>> from llmgym.runtime.models import build_tokenizer
        >>> from llmgym.engines.served_replies import token_renderings
        >>> sorted(token_renderings(build_tokenizer(), 223))
        [' ', 'token_id:223', 'Ġ']
    """
    shown = {f"token_id:{token_id}"}
    if tokenizer is None:
        return shown
    decoded = tokenizer.decode([token_id], skip_special_tokens=False)
    shown |= {decoded, tokenizer.decode([token_id], skip_special_tokens=True)}
    raw = tokenizer.convert_ids_to_tokens(token_id)
    if isinstance(raw, str):
        shown.add(raw)
        try:
            shown.add(tokenizer.convert_tokens_to_string([raw]))
        except Exception:  # a tokenizer without a string form of raw entries: the decodes above stand
            pass
        markers = len(raw) - len(raw.lstrip("\u2581"))  # sentencepiece's word marker, dropped by decode
        if markers:
            shown.add(" " * markers + decoded.lstrip(" "))
    return shown


def _shows(shown: Any, sent: Sequence[int], i: int, tokenizer: Any) -> bool:
    """Whether the string ``shown`` may stand for ``sent[i]``: one of its renderings; where the id alone decodes to
    an unfinished UTF-8 sequence (U+FFFD), the display depends on its neighbours: then also ``""`` or the end of
    the text of the (up to 4) ids that finish with it."""
    if not isinstance(shown, str):
        return False
    if shown.startswith("token_id:"):
        return shown == f"token_id:{sent[i]}"
    if tokenizer is None:
        raise ServerError("the server names the scored tokens by their text, and no tokenizer was given to check it "
                          "against the ids sent: pass the model's tokenizer to the engine")
    if shown in token_renderings(tokenizer, sent[i]):
        return True
    if "\ufffd" not in tokenizer.decode([sent[i]], skip_special_tokens=False):
        return False
    return shown == "" or any(tokenizer.decode(list(sent[j:i + 1])).endswith(shown) for j in range(max(0, i - 4), i))


def check_echo(choice: dict, lps: list[float | None], sent: Sequence[int], tokenizer: Any, where: str) -> None:
    """Raise :class:`ServerError` unless every field of an ``echo=True`` reply that says what the server scored
    names the ids that were sent, position by position: ``token_ids`` (its first ``len(sent)``), vLLM's
    ``prompt_token_ids`` and ``prompt_logprobs`` (its keys, and the same log-probs), ``logprobs.tokens`` (each one
    of the sent id's renderings, :func:`token_renderings`), ``logprobs.text_offset`` (each token's offset the
    previous one's plus its length), the scored token's entry among ``top_logprobs`` (the same log-prob), and the
    reply's text (it starts with the sent ids' text). A field the server leaves out is not checked; one it
    gives is. A length-only check lets a server score other tokens than the ones sent.

    Example:
        >>> from llmgym.runtime.models import build_tokenizer
        >>> from llmgym.engines.served_replies import ServerError, check_echo
        >>> tok = build_tokenizer()
        >>> sent = tok.encode("ab")
        >>> reply = {"text": tok.decode(sent) + "c", "logprobs": {"tokens": ["<s>", "a", "x", "c"]}}
        >>> try:
        ...     check_echo(reply, [None, -1.0, -2.0, -3.0], sent, tok, "http://h/v1")
        ... except ServerError as err:
        ...     print(err)
        http://h/v1: the echo names token 'x' at position 2 where id 68 ('b') was sent: the server scored other tokens than the ones sent
    """
    n = len(sent)
    hint = "the server scored other tokens than the ones sent"

    def mismatch(field: str, i: int, named: Any) -> ServerError:
        text = ("" if tokenizer is None else f" ({tokenizer.decode([sent[i]], skip_special_tokens=False)!r})")
        return ServerError(f"{where}: the echo names {field} {one_line(repr(named), 40)} at position {i} where id "
                           f"{sent[i]}{text} was sent: {hint}")

    if len(lps) < n:
        raise ServerError(f"{where}: {len(lps)} log-probs for the {n} tokens sent: {hint}")
    ids = choice.get("token_ids")
    if ids is not None:
        for i in range(n):
            if ids[i] != sent[i]:
                raise mismatch("token id", i, ids[i])
    prompt_ids = choice.get("prompt_token_ids")
    if prompt_ids is not None:
        if not isinstance(prompt_ids, list) or len(prompt_ids) != n:
            raise ServerError(f"{where}: prompt_token_ids is not the {n} ids sent ({one_line(repr(prompt_ids), 60)}): "
                              f"{hint}")
        for i in range(n):
            if prompt_ids[i] != sent[i]:
                raise mismatch("prompt token id", i, prompt_ids[i])
    block = choice.get("logprobs") if isinstance(choice.get("logprobs"), dict) else {}
    tokens = block.get("tokens")
    if tokens is not None:
        for i in range(n):
            if not _shows(tokens[i], sent, i, tokenizer):
                raise mismatch("token", i, tokens[i])
    offsets = block.get("text_offset")
    if offsets is not None:
        if (not isinstance(offsets, list) or len(offsets) != len(lps) or any(type(o) is not int for o in offsets)
                or offsets[0] < 0):
            raise ServerError(f"{where}: logprobs.text_offset is not one offset per token ({one_line(repr(offsets), 60)})")
        if tokens is not None:
            for i in range(n - 1 if n == len(lps) else n):
                if offsets[i + 1] - offsets[i] != len(tokens[i]):
                    raise ServerError(f"{where}: logprobs.text_offset at position {i + 1} is {offsets[i + 1]}, not the "
                                      f"previous offset plus the length of token {one_line(repr(tokens[i]), 40)}: {hint}")
    top = block.get("top_logprobs")
    if isinstance(top, list) and tokens is not None:
        for i in range(1, n):
            alternatives = top[i]
            if isinstance(alternatives, dict) and tokens[i] in alternatives and lps[i] is not None \
                    and abs(alternatives[tokens[i]] - lps[i]) > _SAME_LOGPROB_TOL:
                raise ServerError(f"{where}: top_logprobs gives the scored token at position {i} log-prob "
                                  f"{alternatives[tokens[i]]!r}, token_logprobs {lps[i]!r}: {hint}")
    _check_prompt_logprobs(choice.get("prompt_logprobs"), lps, sent, where, hint)
    text = choice.get("text")
    if tokenizer is not None and isinstance(text, str) and text:
        prefixes = {tokenizer.decode(list(sent), skip_special_tokens=False), tokenizer.decode(list(sent),
                                                                                             skip_special_tokens=True)}
        if not any(text.startswith(p) for p in prefixes):
            raise ServerError(f"{where}: the echoed text {one_line(repr(text), 60)} does not start with the text of the "
                              f"ids sent: {hint}")


def _check_prompt_logprobs(raw: Any, lps: list[float | None], sent: Sequence[int], where: str, hint: str) -> None:
    """vLLM's ``prompt_logprobs``: ``None``, then per prompt position ``{"id": {"logprob": x, ...}, ...}`` naming the
    sent id with the log-prob ``token_logprobs`` gives it, alternatives summing to at most 1."""
    if raw is None:
        return
    n = len(sent)
    if not isinstance(raw, list) or len(raw) != n:
        raise ServerError(f"{where}: prompt_logprobs is not one entry per token sent ({one_line(repr(raw), 60)}): {hint}")
    for i in range(1, n):
        entry = raw[i]
        if not isinstance(entry, dict) or str(sent[i]) not in entry:
            raise ServerError(f"{where}: prompt_logprobs at position {i} does not name id {sent[i]}, which was sent "
                              f"({one_line(repr(entry), 60)}): {hint}")
        values = [v.get("logprob") if isinstance(v, dict) else v for v in entry.values()]
        if not all(_is_logprob(v) for v in values):
            raise ServerError(f"{where}: prompt_logprobs at position {i} holds a value that is not a log-prob "
                              f"({one_line(repr(entry), 60)})")
        mine = entry[str(sent[i])]
        mine = mine.get("logprob") if isinstance(mine, dict) else mine
        if lps[i] is not None and abs(mine - lps[i]) > _SAME_LOGPROB_TOL:
            raise ServerError(f"{where}: prompt_logprobs gives id {sent[i]} at position {i} log-prob {mine!r}, "
                              f"token_logprobs {lps[i]!r}: {hint}")
        total = sum(math.exp(v) for v in values)
        if total > 1.0 + PROBABILITY_SUM_TOL:
            raise ServerError(f"{where}: the tokens named at position {i} of prompt_logprobs have probabilities summing "
                              f"to {total:.3g} (distinct tokens of one distribution sum to at most 1): not log-probs of "
                              f"one model")


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

