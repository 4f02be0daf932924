"""Issue 30's closing attack on ``OpenAIEngine``: what a hostile server could still do after the first pass.

Found by the fresh attacker's pass (each passed silently, or held a call, before the fix):

* a chain of redirects, each hop answered slowly: every hop was a new attempt with a new deadline, so
  21 hops held a call with ``timeout=2`` for 25 s (and ended in an unclear "Connection error.");
* a server that returns text and log-probs but no token ids: the engine tokenised the text itself, and
  the ids it got (24) did not line up with the log-probs (1), or outnumbered ``max_new_tokens`` (5,000
  for 4) -- a completion whose log-probs belong to other tokens, accepted silently;
* model names with newlines, terminal escapes or 100,000 characters, quoted whole in the
  ``ModelNotServedError`` message.
"""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

pytest.importorskip("openai")

from llmgym.engines import SamplingParams  # noqa: E402
from llmgym.engines.openai_api import ModelNotServedError, OpenAIEngine, ServerError  # noqa: E402
from test_openai_hostile import MODELS, FakeServer, _json, reply  # noqa: E402


@pytest.fixture()
def server():
    s = FakeServer()
    yield s
    s.close()


@pytest.fixture(scope="module")
def tok():
    from llmgym.runtime.models import build_tokenizer

    return build_tokenizer()


def _sample(engine, max_new_tokens=4):
    return engine.generate([[3, 4]], SamplingParams(max_new_tokens=max_new_tokens, seed=0))[0][0]


class RedirectingServer:
    """``/v1/models`` answers; every ``POST`` waits ``delay`` s, then redirects (307) to itself."""

    def __init__(self, delay: float):
        self.hops = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802
                body = json.dumps(MODELS).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.hops += 1
                time.sleep(delay)
                self.send_response(307)
                self.send_header("Location", self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_redirect_chain_does_not_buy_a_new_deadline_per_hop():
    slow = RedirectingServer(delay=1.2)
    try:
        engine = OpenAIEngine(slow.url, "tiny", max_retries=0, timeout=2)
        start = time.monotonic()
        with pytest.raises(ServerError, match=r"answered HTTP 307") as info:
            _sample(engine)
        assert time.monotonic() - start < 6.0  # one attempt (1.2 s), not 21 hops of it
        assert slow.hops == 1 and "\n" not in str(info.value)
    finally:
        slow.close()


def test_text_without_token_ids_must_line_up_with_the_log_probs(server, tok):
    engine = OpenAIEngine(server.url, "tiny", tok, max_retries=0, timeout=5)
    server.answer = _json(reply(token_ids=None, logprobs=(-0.1,), text="hello world this is long"))
    with pytest.raises(ServerError, match=r"1 log-probs for a text of \d+ tokens.*cannot be lined up") as info:
        _sample(engine)
    assert "\n" not in str(info.value)
    server.answer = _json(reply(token_ids=None, logprobs=(-0.1,) * 4, text="x" * 50_000))
    with pytest.raises(ServerError, match=r"50000 characters of text, more than 4 tokens"):
        _sample(engine)
    # an honest text-only reply (ids re-made from the text, one log-prob each) is still a completion
    ids = tok.encode("ab", add_special_tokens=False)
    server.answer = _json(reply(token_ids=None, logprobs=(-0.5,) * len(ids), text="ab"))
    c = _sample(engine)
    assert c.token_ids == list(ids) and c.logprobs == [-0.5] * len(ids) and engine.token_ids_from == "text"


def test_hostile_model_names_are_shown_on_one_bounded_line(server, tok):
    evil = "a\nb\x1b[31m" + "z" * 100_000
    server.models = _json({"data": [{"id": evil, "owned_by": "vllm"}] + [{"id": f"m{i}"} for i in range(50)]})
    for model in (None, "q\nr"):
        with pytest.raises(ModelNotServedError) as info:
            OpenAIEngine(server.url, model, tok, max_retries=0, timeout=5)
        message = str(info.value)
        assert "\n" not in message and "\x1b" not in message and len(message) < 2000, message[:300]
        assert "51 in all" in message


class RolloutServer:
    """A loopback stand-in for ``llmgym serve``: the OpenAI routes plus the control routes a FleetEngine reads;
    ``weight_info`` is ``(body, content encoding or None, seconds between bytes or None)``."""

    def __init__(self):
        self.weight_info = (b'{"weight_version": "v1"}', None, None)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, body, encoding=None, drip=None):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if encoding:
                    self.send_header("Content-Encoding", encoding)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    if drip is None:
                        self.wfile.write(body)
                        return
                    for i in range(len(body)):
                        self.wfile.write(body[i:i + 1])
                        self.wfile.flush()
                        time.sleep(drip)
                except OSError:
                    return

            def do_GET(self):  # noqa: N802
                if self.path.startswith("/v1/models"):
                    self._send(json.dumps(MODELS).encode())
                elif self.path.startswith("/weight_info"):
                    self._send(*outer.weight_info)
                else:
                    self._send(b'{"world_size": 1}')

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _gzip_bomb(megabytes: int) -> bytes:
    import zlib

    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing, fed in chunks: the test never holds it inflated
    parts = [packer.compress(b'{"weight_version": "')]
    chunk = b"x" * (1 << 20)
    parts += [packer.compress(chunk) for _ in range(megabytes)]
    return b"".join(parts + [packer.compress(b'"}'), packer.flush()])


def test_a_fleet_s_control_plane_is_bounded_like_sampling(tok, monkeypatch):
    """``FleetEngine`` read its control routes (``/weight_info``, ``/get_world_size``, the sync routes) with a
    plain httpx client: a 300 KB gzip reply inflated to 1.5 GB of the learner's memory in 10 s, and a reply
    dripped one byte every 0.5 s held a call far past its timeout (the timeout was per read)."""
    from llmgym.engines.fleet import FleetEngine, FleetError

    rollout = RolloutServer()
    try:
        rollout.weight_info = (_gzip_bomb(200), "gzip", None)
        with pytest.raises(FleetError, match=r"compressed \(gzip\)"):
            FleetEngine([rollout.url], tok, max_retries=0, timeout=5)
        rollout.weight_info = (b'{"weight_version": "' + b"x" * (8 << 20) + b'"}', None, None)
        with pytest.raises(FleetError, match=r"over \d+ bytes"):
            FleetEngine([rollout.url], tok, max_retries=0, timeout=5)
        rollout.weight_info = (b'{"weight_version": "v1"}', None, None)
        monkeypatch.setattr(FleetEngine, "_connect_all", lambda self: None)  # no weight link: the stand-in has none
        engine = FleetEngine([rollout.url], tok, max_retries=0, timeout=5)
        rollout.weight_info = (b'{"weight_version": "v2"}' + b" " * 400, None, 0.25)  # 100 s at that pace
        start = time.monotonic()
        with pytest.raises(FleetError, match=r"ReadTimeout"):
            engine.servers[0].call("GET", "/weight_info", timeout=2)
        assert time.monotonic() - start < 6.0
    finally:
        rollout.close()
