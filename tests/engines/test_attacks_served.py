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

import contextlib
import http.server
import json
import threading
import time

import pytest
import torch

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
    from llmgym.fleet.fleet_engine import FleetEngine, FleetError

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


# -- issue 38: a rollout server's word is not taken ----------------------------------------------------------


class WeightServer:
    """A loopback stand-in for ``llmgym serve`` that really joins the learner's gloo group and receives every
    weight broadcast. ``keep`` loads what it receives into its own copy of the model (an honest server) or
    discards it (the attacker's: it reports the version it was given and samples its own model); ``refuse``
    answers ``/update_weights`` with HTTP 500 at once; sampling answers ``sample_logprob`` per token (a liar
    claims near-certainty). Records the ``Authorization`` header of every request."""

    def __init__(self, model, *, keep=True, refuse=False, sample_logprob=None, probe_lie=0.0):
        from llmgym.engines.hf import sequence_logprobs
        from llmgym.fleet.weight_transfer import open_group, receive_named_tensors

        self.model, self.keep, self.refuse, self.sample_logprob = model, keep, refuse, sample_logprob
        self.probe_lie = probe_lie  # added to one token's probe log-prob: a lie a mean over the probe would hide
        self.version, self.group, self.auth, self.updates = "default", None, [], 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                outer.auth.append((self.path.split("?")[0], self.headers.get("Authorization")))
                path = self.path.split("?")[0]
                if path == "/v1/models":
                    self._send(200, MODELS)
                elif path == "/weight_info":
                    self._send(200, {"weight_version": outer.version})
                elif path == "/get_world_size":
                    self._send(200, {"world_size": 1})
                else:
                    self._send(200 if path == "/health" else 404, {})

            def do_POST(self):  # noqa: N802
                path = self.path.split("?")[0]
                outer.auth.append((path, self.headers.get("Authorization")))
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if path == "/init_weight_transfer_engine":
                    info = body["init_info"]
                    outer.group, outer._store = open_group(info["master_address"], info["master_port"], 1, 2,
                                                           timeout_s=info["timeout_s"], nonce=info["nonce"])
                    outer.bucket_bytes = info["bucket_bytes"]
                    self._send(200, {})
                elif path == "/update_weights":
                    if outer.refuse:
                        self._send(500, {"error": "size mismatch for model.embed_tokens.weight: copying a param "
                                                  "with shape [512, 64]"})
                        return
                    info = body["update_info"]
                    meta = [(n, getattr(torch, d), tuple(s))
                            for n, d, s in zip(info["names"], info["dtype_names"], info["shapes"])]
                    received = {}
                    for bucket in receive_named_tensors(outer.group, meta, outer.bucket_bytes):
                        received.update((n, t.clone()) for n, t in bucket)
                    if outer.keep:
                        outer.model.load_state_dict(received)
                    outer.updates += 1
                    self._send(200, {})
                elif path == "/finish_weight_update":
                    outer.version = body.get("weight_version") or outer.version
                    self._send(200, {})
                elif path == "/v1/completions" and body.get("prompt_logprobs") is not None:
                    ids = torch.tensor([body["prompt"]])
                    with torch.no_grad():
                        lp = sequence_logprobs(outer.model, ids, torch.ones_like(ids))[0].tolist()
                    lp[len(lp) // 2] -= outer.probe_lie
                    rows = [None] + [{str(t): {"logprob": v, "rank": 1}} for t, v in zip(body["prompt"][1:], lp)]
                    self._send(200, reply(token_ids=(5,), logprobs=(-0.5,), text="a", prompt_logprobs=rows))
                elif path == "/v1/completions":
                    n = min(int(body.get("max_tokens", 2)), 2)
                    self._send(200, reply(token_ids=(5, 6)[:n], logprobs=(outer.sample_logprob,) * n, text="ab"[:n]))
                else:
                    self._send(200, {})

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        if self.group is not None:
            with contextlib.suppress(Exception):
                self.group.shutdown()


@pytest.fixture()
def learner(tok):
    import torch

    from llmgym.runtime.models import build_tiny_model

    torch.manual_seed(0)
    return build_tiny_model(tok)


def test_a_server_that_discards_every_sync_and_reports_the_version_is_dropped_and_the_run_stops(tok, learner):
    """The attacker's server joins the weight group, takes every broadcast, throws it away and answers
    ``/weight_info`` with the version it was given: before, the fleet trained on its completions (5.68 nats
    off the learner's). Now the probe after the sync sees its log-probs are not the learner's."""
    import copy

    from llmgym.fleet.fleet_engine import FleetEngine, FleetError, UntrustedServerWarning

    liar = WeightServer(copy.deepcopy(learner), keep=False)
    liar.model.model.embed_tokens.weight.data.normal_()  # its own model: another set of weights
    try:
        with pytest.warns(UntrustedServerWarning, match=r"is not trusted \(after the sync of version 0 its log-probs "
                                                         r"differ from the learner's by [\d.]+ nats per token"), \
                pytest.raises(FleetError, match="every rollout server is lost"):
            FleetEngine([liar.url], tok, learner, max_retries=0, timeout=10, sync_timeout_s=30)
        assert liar.updates == 1 and liar.version == "0"  # it did take the broadcast, and reported the version
    finally:
        liar.close()


def test_an_honest_server_passes_the_probe_and_every_control_request_carries_the_secret(tok, learner):
    from llmgym.fleet.fleet_engine import FleetEngine

    honest = WeightServer(__import__("copy").deepcopy(learner))
    secret = "s3cret-0123456789abcdef"
    try:
        with FleetEngine([honest.url], tok, learner, max_retries=0, timeout=10, sync_timeout_s=30,
                         secret=secret) as fleet:
            assert fleet.probe_gaps[honest.url] < 1e-5 and fleet.live == [honest.url]
        control = [(p, a) for p, a in honest.auth if not p.startswith("/v1/") and p != "/health"]
        assert {p for p, _ in control} >= {"/init_weight_transfer_engine", "/update_weights", "/finish_weight_update"}
        assert all(a != f"Bearer {secret}" and secret not in str(a) for _, a in honest.auth), honest.auth
    finally:
        honest.close()


def test_a_server_whose_batches_carry_other_log_probs_is_dropped_by_the_learner_s_check(tok, learner):
    """The server holds the learner's weights (it passes the probe) but reports log-probs of its own making
    for what it samples: the update's recomputation disagrees, the server is dropped, and with none left
    the run stops before the poisoned batch's step."""
    import copy

    import gymnasium as gym

    from llmgym.agents import GRPO
    from llmgym.fleet.fleet_engine import FleetEngine, FleetError, UntrustedServerWarning

    liar = WeightServer(copy.deepcopy(learner), sample_logprob=-0.01)
    try:
        with FleetEngine([liar.url], tok, learner, max_retries=0, timeout=10, sync_timeout_s=30) as fleet:
            before = copy.deepcopy(learner.state_dict())
            agent = GRPO(learner, tok, engine=fleet, tasks_per_step=2, group_size=2, max_new_tokens=2, kl_coef=0.0)
            with pytest.warns(UntrustedServerWarning, match=r"reported for \d+ tokens of a batch differ from the "
                                                             r"learner's recomputation by [\d.]+ nats"), \
                    pytest.raises(FleetError, match="every rollout server is lost"):
                agent.learn(gym.make("llmgym/Copy-v0", tokenizer=tok), steps=1)
            assert all(torch.equal(before[k], v) for k, v in learner.state_dict().items())  # no step taken
    finally:
        liar.close()


def test_a_lie_on_one_probe_token_is_caught_though_the_mean_gap_would_pass(tok, learner):
    """12 nats off on one of the probe's tokens is under the mean tolerance (0.5 nats per token over 31
    tokens) but over the per-token one: the server is dropped, and with none left the fleet stops."""
    import copy

    from llmgym.fleet.fleet_engine import PROBE_TOKENS, FleetEngine, FleetError, UntrustedServerWarning

    assert 12.0 / (PROBE_TOKENS - 1) < 0.5
    liar = WeightServer(copy.deepcopy(learner), probe_lie=12.0)
    try:
        with pytest.warns(UntrustedServerWarning, match=r"one of its probe log-probs differs from the learner's by "
                                                         r"1[12](\.\d+)? nats \(token tolerance 5\)"), \
                pytest.raises(FleetError, match="every rollout server is lost"):
            FleetEngine([liar.url], tok, learner, max_retries=0, timeout=10, sync_timeout_s=30)
    finally:
        liar.close()


def test_a_server_that_refuses_the_weights_fails_the_sync_at_once_quoting_its_reason(tok, learner):
    """Before, a server answering ``/update_weights`` with HTTP 500 at once left the learner's broadcast
    waiting out the whole sync time-out, and the error quoted gloo."""
    from llmgym.fleet.fleet_engine import FleetEngine, FleetError

    refuser = WeightServer(learner, refuse=True)
    try:
        start = time.monotonic()
        with pytest.raises(FleetError, match=r"refused the weights of version 0: .*HTTP 500.*size mismatch") as info:
            FleetEngine([refuser.url], tok, learner, max_retries=0, timeout=10, sync_timeout_s=30)
        assert time.monotonic() - start < 10.0 and "gloo" not in str(info.value)
    finally:
        refuser.close()


def test_the_guard_answers_only_the_fleet_s_routes_and_its_control_routes_need_the_secret():
    """vLLM's development routes (``/collective_rpc`` wrote a file of the caller's choosing outside its folder,
    ``/weight_checker`` zeroed the weights, ``/update_weight_version`` forged the version) are behind no key;
    the guard's allow-list answers 404 for them, and 401 for a control route without the secret."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from llmgym.fleet import guard as serve_guard

    def guarded_client():
        app = FastAPI()
        for method, path in [("POST", "/collective_rpc"), ("POST", "/weight_checker"),
                             ("POST", "/update_weight_version"), ("POST", "/sleep"), ("GET", "/metrics"),
                             ("POST", "/pause"), ("POST", "/update_weights"), ("GET", "/weight_info"),
                             ("GET", "/health"), ("POST", "/v1/completions")]:
            app.add_api_route(path, lambda: {"reached": True}, methods=[method])
        app.add_middleware(serve_guard.ControlPlaneGuard)  # as vLLM's --middleware adds it
        return TestClient(app)

    secret = "0123456789abcdef-guard"
    serve_guard.configure(secret)

    try:
        client = guarded_client()
        here = client.get("/health").headers[serve_guard.INSTANCE_HEADER]

        def good(method, path):  # a request signed afresh, for this server process (a signature is good once)
            return {serve_guard.SIGNATURE_HEADER: serve_guard.sign(serve_guard.control_key(secret), method, path,
                                                                   instance=here)}

        for path in ("/collective_rpc", "/weight_checker", "/update_weight_version", "/sleep"):
            assert client.post(path, headers=good("POST", path)).status_code == 404, path  # closed even signed
        assert client.get("/metrics").status_code == 404
        assert client.get("/pause").status_code == 404  # a listed path with another method
        for path in ("/pause", "/update_weights"):
            assert client.post(path).status_code == 401
            assert client.post(path, headers={"Authorization": f"Bearer {secret}"}).status_code == 401  # no bearer
            other_key = serve_guard.control_key(secret + "X")
            wrong = {serve_guard.SIGNATURE_HEADER: serve_guard.sign(other_key, "POST", path)}
            assert client.post(path, headers=wrong).status_code == 401
            assert client.post(path, headers=good("POST", path)).json() == {"reached": True}
        assert client.get("/weight_info").status_code == 401 and client.get("/health").json() == {"reached": True}
    finally:
        serve_guard._state.clear()
    for missing in ("short", None):  # no guard without a secret: there is no open mode
        with pytest.raises(ValueError, match="at least 16"):
            serve_guard.configure(missing)


def test_the_batch_check_under_top_p_compares_like_with_like(tok, learner):
    """With top-p < 1 a server reports the log-prob under the renormalised nucleus it drew from, above the
    learner's full-softmax one by -log S (S the kept mass). The learner adds its own log S back before the check
    (llmgym.agents.truncation): an honest server's gap is then ~0 at top-p 0.8 under a tolerance (0.1) far below
    that offset (no false alarm), and an excess the old -log(top_p) slack excused (0.6 nats at top-p 0.5, over the
    0.5 tolerance) is caught."""
    import copy

    from llmgym import Task
    from llmgym.agents import GRPO
    from llmgym.agents.truncation import to_model_space
    from llmgym.rollout.episodes import Batch, Episode
    from llmgym.fleet.fleet_engine import FleetEngine, FleetError, UntrustedServerWarning

    prompt, tokens = [1, 5], [6, 7]
    with torch.no_grad():
        logits = learner(input_ids=torch.tensor([prompt + tokens])).logits[0, 1:3].double()
    logp = torch.log_softmax(logits, dim=-1)
    sorted_p = logp.exp().sort(dim=-1, descending=True).values

    def check(fleet, agent, excess: float, top_p: float) -> dict:
        kept = torch.where(sorted_p.cumsum(-1) - sorted_p < top_p, sorted_p, torch.zeros_like(sorted_p)).sum(-1)
        # what an honest server says of tokens 6, 7: log q = log p − log S, plus the lie
        reported = (logp[[0, 1], tokens] - kept.log() + excess).float().tolist()
        episode = Episode(Task("p"), 0, prompt + tokens, [0, 0, 1, 1], [0.0, 0.0, *reported], [0, 0, 0, 1.0], 2)
        fleet._sampled_by.append({hash((tuple(tokens), tuple(reported))): (0, top_p)})  # as generate records it
        batch = to_model_space(agent, Batch.from_episodes([episode]))
        return fleet.check_logprobs(batch, agent.learner.learner_logprobs(batch))

    honest = WeightServer(copy.deepcopy(learner))
    try:
        for excess, top_p, tolerance, dropped in [(0.0, 0.8, 0.1, False), (0.0, 0.5, 0.5, False),
                                                   (0.6, 0.5, 0.5, True), (-0.6, 0.5, 0.5, True)]:
            with FleetEngine([honest.url], tok, learner, max_retries=0, timeout=10, sync_timeout_s=30,
                             logprob_tolerance=tolerance) as fleet:
                agent = GRPO(copy.deepcopy(learner), tok, top_p=top_p, kl_coef=0.0, engine=fleet)
                if not dropped:
                    assert check(fleet, agent, excess, top_p)[honest.url] == pytest.approx(0.0, abs=1e-4)
                    continue
                with pytest.warns(UntrustedServerWarning), pytest.raises(FleetError, match="every rollout server"):
                    check(fleet, agent, excess, top_p)
                assert fleet.batch_gaps[honest.url] > 0.5 and fleet.live == [], (excess, top_p, fleet.batch_gaps)
    finally:
        honest.close()


def test_a_server_that_answers_the_probe_with_garbage_is_not_trusted(tok, learner, monkeypatch):
    import copy

    from llmgym.fleet.fleet_engine import FleetEngine, FleetError, UntrustedServerWarning

    garbled = WeightServer(copy.deepcopy(learner))
    real = garbled.server.RequestHandlerClass.do_POST

    def do_post(handler):
        if handler.path.startswith("/v1/completions"):
            handler.rfile.read(int(handler.headers.get("Content-Length", 0)))
            handler._send(200, reply(prompt_logprobs=[None, {"1": {"logprob": 0.5}}]))  # wrong token, positive
            return
        real(handler)

    monkeypatch.setattr(garbled.server.RequestHandlerClass, "do_POST", do_post)
    try:
        with pytest.warns(UntrustedServerWarning, match=r"could not be checked after the sync of version 0: .*no "
                                                         r"usable prompt log-probs"), \
                pytest.raises(FleetError, match="every rollout server is lost"):
            FleetEngine([garbled.url], tok, learner, max_retries=0, timeout=10, sync_timeout_s=30)
    finally:
        garbled.close()


def test_the_adapter_routes_need_the_secret_and_vllm_s_key_check_then_gets_the_generation_key(monkeypatch):
    """``/v1/load_lora_adapter`` loads what the server will sample: a control route. Without the secret 401; with
    it the request reaches vLLM carrying the generation key (``VLLM_API_KEY``), which vLLM's own ``/v1`` check
    wants, and never the secret; ``/v1/completions`` keeps the caller's header."""
    from fastapi import FastAPI, Request
    from fastapi.testclient import TestClient

    from llmgym.fleet import guard as serve_guard

    app = FastAPI()

    async def seen(request):
        return {"authorization": request.headers.get("authorization")}

    seen.__annotations__ = {"request": Request}  # (this module's annotations are strings: FastAPI needs the class)

    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/completions"):
        app.add_api_route(path, seen, methods=["POST"])
    app.add_middleware(serve_guard.ControlPlaneGuard)
    secret = "0123456789abcdef-guard"
    monkeypatch.setenv("VLLM_API_KEY", "generation-key-0123")
    serve_guard.configure(secret)
    try:
        client = TestClient(app)
        here = client.get("/v1/models").headers[serve_guard.INSTANCE_HEADER]
        for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            good = {serve_guard.SIGNATURE_HEADER: serve_guard.sign(serve_guard.control_key(secret), "POST", path,
                                                                   instance=here)}
            assert client.post(path).status_code == 401
            assert client.post(path, headers={"Authorization": "Bearer generation-key-0123"}).status_code == 401
            assert client.post(path, headers=good).json() == {"authorization": "Bearer generation-key-0123"}
        mine = {"Authorization": "Bearer caller-0123"}
        assert client.post("/v1/completions", headers=mine).json() == {"authorization": "Bearer caller-0123"}
    finally:
        serve_guard._state.clear()


def test_a_rollout_server_loads_only_the_adapters_its_learner_sent_never_a_path_on_disk(monkeypatch):
    """With the secret, ``/v1/load_lora_adapter`` could name any ``lora_path``: a folder on the server's disk, or
    a hub id vLLM would fetch. The rollout server's worker loads only the adapters its learner sent (in memory,
    ``ADAPTER_PATH_PREFIX<name>``); anything else is refused before vLLM reads it."""
    pytest.importorskip("vllm")
    from vllm.exceptions import LoRAAdapterNotFoundError
    from vllm.lora.request import LoRARequest
    from vllm.lora.worker_manager import WorkerLoRAManager

    from llmgym.fleet import vllm_plugin

    # the loader is installed in a rollout server's worker only: here, for this test alone
    monkeypatch.setattr(WorkerLoRAManager, "_load_adapter", WorkerLoRAManager._load_adapter)
    vllm_plugin._install_adapter_loader()
    load = WorkerLoRAManager._load_adapter
    for path in ("/etc", "/tmp/some-adapter", "Qwen/Qwen2-0.5B-lora", f"/x/{vllm_plugin.ADAPTER_PATH_PREFIX}v1"):
        with pytest.raises(LoRAAdapterNotFoundError, match="loads only the adapters its learner sends"):
            load(object(), LoRARequest("attack", 7, path))  # refused before the manager (self) is touched
    with pytest.raises(LoRAAdapterNotFoundError):  # one it was never sent: not found, never the base model
        load(object(), LoRARequest("missing", 8, vllm_plugin.ADAPTER_PATH_PREFIX + "never-sent"))
