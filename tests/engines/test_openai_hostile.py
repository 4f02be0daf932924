"""``OpenAIEngine`` against a hostile (or broken) server: every field of a reply is checked, and each bad
reply is one :class:`~llmgym.engines.openai_api.ServerError` naming the cause -- never a bare
``IndexError``/``TypeError``/``JSONDecodeError``/``AttributeError``/``openai`` exception, and never a
completion accepted silently. A request has one deadline (``timeout``), however slowly the server drips.

A loopback ``http.server`` plays the server; no vLLM is needed.
"""

from __future__ import annotations

import http.server
import json
import math
import threading
import time

import pytest

pytest.importorskip("openai")

from llmgym.engines import SamplingParams  # noqa: E402
from llmgym.engines.openai_api import OpenAIEngine, ServerError  # noqa: E402

MODELS = {"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "vllm"}]}


def reply(token_ids=(5, 6), logprobs=(-0.1, -0.2), text="ab", finish="length", **extra) -> dict:
    shown = text if isinstance(text, str) else ""
    choice = {"index": 0, "text": text, "finish_reason": finish,
              "token_ids": list(token_ids) if isinstance(token_ids, tuple) else token_ids,
              "logprobs": {"tokens": None if logprobs is None else [shown[:1]] * len(logprobs),  # one per log-prob
                           "token_logprobs": None if logprobs is None else list(logprobs),
                           "top_logprobs": None, "text_offset": None if logprobs is None else [0] * len(logprobs)}}
    choice.update(extra)
    return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "tiny", "choices": [choice]}


def echo_reply(tok, sent, logprobs, generated=9, as_ids=True, model="tiny") -> dict:
    """What vLLM answers to ``echo=True, logprobs=0, max_tokens=1`` for the ids ``sent`` (``logprobs``: one per
    token after the first; the generated token ``generated`` gets -1.0): every field that says what was scored --
    token strings (``token_id:N`` with ``return_tokens_as_token_ids``, else the decoded id), text offsets, the
    scored token among the alternatives, ``prompt_logprobs``, the echoed text -- as vLLM 0.32 writes them."""
    ids = list(sent) + [generated]
    lps = [None, *logprobs, -1.0]
    if as_ids:
        tokens = [f"token_id:{t}" for t in ids]
    else:  # vLLM's display: an unfinished UTF-8 byte shows as "", the byte that finishes it as the character
        tokens = [tok.decode(ids[:i + 1])[len(tok.decode(ids[:i])):] if "\ufffd" not in tok.decode(ids[:i + 1])
                  else "" for i in range(len(ids))]
    offsets = [0]
    for t in tokens[:-1]:
        offsets.append(offsets[-1] + len(t))
    choice = {"index": 0, "text": tok.decode(list(sent)) + tok.decode([generated]), "finish_reason": "length",
              "token_ids": None, "prompt_token_ids": None,
              "logprobs": {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens,
                           "top_logprobs": [None] + [{t: lp} for t, lp in zip(tokens[1:], lps[1:])]},
              "prompt_logprobs": [None] + [{str(t): {"logprob": lp, "rank": 1, "decoded_token": "x"}}
                                           for t, lp in zip(sent[1:], logprobs)]}
    return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": model, "choices": [choice]}


class FakeServer:
    """A loopback server: ``/v1/models`` lists one vLLM model, ``/v1/completions`` answers ``self.answer``:
    ``(status, content type, body bytes, seconds between bytes or None)``, or ``self.respond(request)``'s answer
    to the request's JSON where ``respond`` is set."""

    def __init__(self):
        self.answer = (200, "application/json", json.dumps(reply()).encode(), None)
        self.respond = None
        self.models = (200, "application/json", json.dumps(MODELS).encode(), None)
        self.posts = 0
        self.encoding = None  # a Content-Encoding to claim
        self.accept_encodings = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, status, ctype, body, drip):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                if outer.encoding:
                    self.send_header("Content-Encoding", outer.encoding)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if drip is None:
                    self.wfile.write(body)
                    return
                for i in range(len(body)):
                    try:
                        self.wfile.write(body[i:i + 1])
                        self.wfile.flush()
                    except OSError:
                        return
                    time.sleep(drip)

            def do_GET(self):  # noqa: N802 - the stdlib's handler naming
                self._send(*outer.models)

            def do_POST(self):  # noqa: N802
                request = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.posts += 1
                outer.accept_encodings.append(self.headers.get("Accept-Encoding"))
                self._send(*(outer.respond(json.loads(request)) if outer.respond else outer.answer))

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def server():
    s = FakeServer()
    yield s
    s.close()


@pytest.fixture(scope="module")
def tok():
    from llmgym.runtime.models import build_tokenizer

    return build_tokenizer()


def _engine(server, tok=None, **kw):
    kw.setdefault("max_retries", 0)
    kw.setdefault("timeout", 5)
    return OpenAIEngine(server.url, "tiny", tok, **kw)


def _sample(engine, max_new_tokens=4):
    return engine.generate([[3, 4]], SamplingParams(max_new_tokens=max_new_tokens, seed=0))[0][0]


def test_a_well_formed_reply_is_a_completion(server, tok):
    engine = _engine(server, tok)
    c = _sample(engine)
    assert c.token_ids == [5, 6] and c.logprobs == [-0.1, -0.2] and c.finish_reason == "length"
    assert c.text == tok.decode([5, 6], skip_special_tokens=True)


def _json(body) -> tuple:
    return (200, "application/json", json.dumps(body).encode(), None)


HOSTILE = {
    "token id out of the vocabulary": (_json(reply(token_ids=(5, 10 ** 9))), r"token id 1000000000 .*vocabulary of \d+"),
    "negative token id": (_json(reply(token_ids=(5, -1))), r"token id -1 .*vocabulary"),
    "non-integer token id": (_json(reply(token_ids=(5, 6.5))), r"token ids? .*not an integer: 6\.5"),
    "boolean token id": (_json(reply(token_ids=(5, True))), r"not an integer: True"),
    "token ids not a list": (_json(reply(token_ids="56")), r"token_ids is not a list"),
    "NaN log-prob": ((200, "application/json", json.dumps(reply(logprobs=(-0.1, math.nan))).encode(), None),
                     r"log-prob nan .*not a finite number <= 0"),
    "infinite log-prob": ((200, "application/json", json.dumps(reply(logprobs=(-math.inf, -0.1))).encode(), None),
                          r"log-prob -inf .*not a finite number <= 0"),
    "positive log-prob": (_json(reply(logprobs=(-0.1, 0.5))), r"log-prob 0\.5 .*not a finite number <= 0"),
    "string log-prob": (_json(reply(logprobs=(-0.1, "-0.2"))), r"log-prob '-0\.2' .*not a finite number"),
    "no log-probs": (_json(reply(logprobs=None)), r"no log-probs"),
    "more tokens than asked": (_json(reply(token_ids=(5, 6, 7, 8, 9), logprobs=(-0.1,) * 5, text="abcde")),
                               r"5 tokens.*max_new_tokens=4"),
    "log-probs and ids of different lengths": (_json(reply(logprobs=(-0.1,))), r"1 log-probs? for 2 tokens"),
    "empty choices": (_json({**reply(), "choices": []}), r"no choices"),
    "choices not a list": (_json({**reply(), "choices": {"0": 1}}), r"choices is not a list"),
    "choice not an object": (_json({**reply(), "choices": ["ab"]}), r"choice 0 is not an object"),
    "text not a string": (_json(reply(text=None)), r"text is not a string"),
    "error body with status 200": (_json({"error": {"message": "CUDA out of memory", "code": 500}}),
                                   r"answered an error: CUDA out of memory"),
    "vLLM error object with status 200": (_json({"object": "error", "message": "engine dead"}),
                                          r"answered an error: engine dead"),
    "invalid JSON": ((200, "application/json", b'{"choices": [', None), r"invalid JSON"),
    "an HTML page": ((200, "text/html", b"<html><body>Welcome to nginx!</body></html>", None),
                     r"an HTML page, not JSON.*ends in /v1"),
    "a JSON list": (_json([1, 2]), r"not a JSON object"),
    "HTTP 500": ((500, "application/json", json.dumps({"error": {"message": "boom"}}).encode(), None),
                 r"answered HTTP 500 .*boom"),
    "HTTP 502 HTML": ((502, "text/html", b"<html>Bad Gateway</html>", None), r"answered HTTP 502"),
    "another model answers": (_json({**reply(), "model": "big-model"}),
                              r"answered as model 'big-model', not the requested 'tiny': another model"),
    "a reply naming no model": (_json({k: v for k, v in reply().items() if k != "model"}),
                                r"answered as model None, not the requested 'tiny': the reply names no model"),
    "log-prob -1e300": (_json(reply(logprobs=(-0.1, -1e300))), r"log-prob -1e\+300 at position 1 is below -10000"),
    "log-prob just under the floor": (_json(reply(logprobs=(-10000.5, -0.1))), r"log-prob -10000\.5 at position 0 is below"),
    "listed tokens and log-probs of different lengths": (
        _json({**reply(), "choices": [{**reply()["choices"][0], "logprobs": {"tokens": ["a", "b", "c"],
                                                                           "token_logprobs": [-0.1, -0.2]}}]}),
        r"logprobs.tokens lists 3 tokens for 2 log-probs"),
    "choice index out of order": (_json(reply(index=3)), r"choice 0: its index is 3, not 0"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_bad_reply_is_one_server_error_naming_the_cause(server, tok, case):
    server.answer, pattern = HOSTILE[case]
    engine = _engine(server, tok)
    with pytest.raises(ServerError, match=pattern) as info:
        _sample(engine)
    message = str(info.value)
    assert "\n" not in message and len(message) < 600 and server.url in message, message


def test_a_reply_is_checked_without_a_tokenizer_too(server):
    server.answer = _json(reply(token_ids=(5, 2 ** 40)))  # no vocabulary known: still not a token id
    with pytest.raises(ServerError, match=r"token id 1099511627776"):
        _sample(_engine(server))


def test_one_deadline_per_request_however_slowly_the_server_drips(server, tok):
    body = json.dumps(reply()).encode()
    server.answer = (200, "application/json", body, 0.25)  # one byte every 0.25 s: each read is quick
    engine = _engine(server, tok, timeout=2)
    start = time.monotonic()
    with pytest.raises(ServerError, match=r"did not answer within 2 s"):
        _sample(engine)
    assert time.monotonic() - start < 4.0  # the deadline plus slack, not len(body) * 0.25 s
    assert len(body) * 0.25 > 20


def test_an_oversized_reply_is_cut_off(server, tok):
    server.answer = (200, "application/json", b'{"pad": "' + b"x" * (64 << 20) + b'"}', None)
    with pytest.raises(ServerError, match=r"over \d+ bytes"):
        _sample(_engine(server, tok))


def test_a_hostile_model_list_is_a_server_error(server):
    for models, pattern in [
        ((200, "text/html", b"<html>hi</html>", None), "an HTML page"),
        (_json({"data": "tiny"}), "data is not a list"),
        (_json({"data": [{"name": "tiny"}]}), "model 0 has no id"),
        ((500, "application/json", b"{}", None), "answered HTTP 500"),
    ]:
        server.models = models
        with pytest.raises(ServerError, match=pattern):
            OpenAIEngine(server.url, "tiny", max_retries=0, timeout=5)


def test_the_echo_scores_are_checked(server, tok):
    """``logprobs()`` (a served judge's P(yes)) reads the prompt's log-probs: they are checked the same way."""
    engine = _engine(server, tok)
    server.answer = _json(echo_reply(tok, (3, 4, 5), (-0.5, -0.25)))
    assert engine.logprobs([3, 4], [5]) == [-0.25]
    server.answer = _json(echo_reply(tok, (3, 4, 5), (-0.5, 7.0)))
    with pytest.raises(ServerError, match=r"log-prob 7\.0"):
        engine.logprobs([3, 4], [5])


def test_the_validator_is_usable_alone():
    """What another engine (a fleet of servers) reuses: bytes in, checked choices out, or ``ServerError``."""
    from llmgym.engines.openai_api import ServedChoice, validate_completions_response

    (choice,) = validate_completions_response(200, "application/json", json.dumps(reply()).encode(),
                                              server="http://x/v1", max_tokens=4, vocab_size=512)
    assert choice == ServedChoice(text="ab", token_ids=[5, 6], logprobs=[-0.1, -0.2], finish_reason="length")
    with pytest.raises(ServerError, match=r"http://x/v1 answered HTTP 503"):
        validate_completions_response(503, "text/plain", b"busy", server="http://x/v1", max_tokens=4)


def test_a_compressed_reply_is_refused_before_it_is_inflated(server, tok):
    """The size cap counts bytes on the wire: 200 KB of gzip would inflate to 200 MB in httpx's decoder."""
    import gzip

    engine = _engine(server, tok)
    server.encoding = "gzip"
    server.answer = (200, "application/json", gzip.compress(b'{"pad": "' + b"x" * (200 << 20) + b'"}'), None)
    with pytest.raises(ServerError, match=r"compressed \(gzip\) though identity was asked for"):
        _sample(engine)
    assert server.accept_encodings[-1] == "identity"


def test_vllms_zero_probability_is_still_a_log_prob(server, tok):
    """vLLM writes -9999.0 where a probability is zero (JSON has no -inf): above the floor, accepted as sent."""
    server.answer = _json(reply(logprobs=(-9999.0, -0.2)))
    assert _sample(_engine(server, tok)).logprobs == [-9999.0, -0.2]


# -- replies that are not HTTP: a raw socket plays the server ------------------------------------------------------
_BODY = json.dumps(reply()).encode()


def _http(body: bytes, *headers: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"".join(h + b"\r\n" for h in headers) + \
        b"Content-Length: %d\r\n\r\n" % len(body) + body


RAW = {  # what the server sends to POST /v1/completions, and the error it must give
    "bad chunk size": (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"zz\r\n" + _BODY + b"\r\n0\r\n\r\n", r"malformed HTTP response from \S+: bad chunk size"),
    "a 200 kB header": (_http(_BODY, b"X-Pad: " + b"a" * 200_000), r"malformed HTTP response from \S+: a header section"),
    "no status line": (b"Content-Type: application/json\r\n\r\n" + _BODY,
                       r"malformed HTTP response from \S+: no status line"),
    "not HTTP at all": (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", r"malformed HTTP response from \S+: no status line"),
    "a truncated body": (_http(_BODY)[:-40], r"malformed HTTP response from \S+: truncated body \(.*received \d+ bytes, "
                                             r"expected \d+"),
}


class RawServer:
    """A socket that answers GET with the model list and POST with ``self.answer``, byte for byte, then closes."""

    def __init__(self, answer: bytes):
        import socket

        self.answer, self.sock = answer, socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                head, _, rest = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(rest) < length:
                    rest += conn.recv(65536)
                try:
                    # Connection: close, so the client does not race this socket's close with its next request
                    models = _http(json.dumps(MODELS).encode(), b"Connection: close")
                    conn.sendall(models if head.startswith(b"GET") else self.answer)
                except OSError:  # the client hung up on a reply it refused
                    pass

    def close(self):
        import socket

        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
        except OSError:
            pass
        self.sock.close()
        self.thread.join(timeout=5)
        assert not self.thread.is_alive()


@pytest.mark.parametrize("case", sorted(RAW))
def test_malformed_http_is_named_not_reported_as_a_silent_server(tok, case):
    from llmgym.engines.openai_api import MalformedResponseError

    answer, pattern = RAW[case]
    raw = RawServer(answer)
    try:
        engine = OpenAIEngine(raw.url, "tiny", tok, max_retries=0, timeout=5)
        with pytest.raises(MalformedResponseError, match=pattern) as info:
            _sample(engine)
        engine.close()
    finally:
        raw.close()
    message = str(info.value)
    assert "stopped answering" not in message and "\n" not in message and raw.url in message, message


def test_a_server_that_closes_without_answering_stopped_answering(tok):
    from llmgym.engines.openai_api import MalformedResponseError

    raw = RawServer(b"")
    try:
        engine = OpenAIEngine(raw.url, "tiny", tok, max_retries=0, timeout=5)
        with pytest.raises(ServerError, match=r"stopped answering \(1 tries: Server disconnected") as info:
            _sample(engine)
        engine.close()
    finally:
        raw.close()
    assert not isinstance(info.value, MalformedResponseError)
