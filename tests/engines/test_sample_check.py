"""The learner checks a rollout server's samples, not only its scores (llmgym.fleet.trust, llmgym.agents.screening).

Found by the attacker's pass: a server that sampled one fixed completion for all 24 rows and reported their true
log-probs passed every check (probe gap 0, batch gap 1.8e-7; under the policy those samples have probability
e^-508); under ``max_staleness >= 1`` a server reporting log-prob 0 for stale tokens set every importance weight
(``is_weight_mean`` 0.004) unchecked; a liar found inside the update was dropped for later batches, but its rows
were trained on in that very step.

The stand-in servers here really join the learner's gloo group and load what it sends, and sample from their
copy of the model (honest), or lie in one way each.
"""

from __future__ import annotations

import contextlib
import copy
import http.server
import json
import threading
import warnings

import gymnasium as gym
import pytest
import torch

pytest.importorskip("openai")

from llmgym.agents import GRPO  # noqa: E402
from test_openai_hostile import MODELS, reply  # noqa: E402


class SamplingServer:
    """A loopback stand-in for ``llmgym serve``: joins the learner's gloo group, loads every weight broadcast,
    answers the probe honestly, and samples each row from its own copy of the model with the request's seed.

    ``lie``: ``None`` (honest); ``"fixed"`` (one fixed completion for every row, with its true log-probs);
    ``"cold"`` (samples at half the requested temperature, reports the log-probs at the requested one);
    ``"stale-zero"`` (honest sampling, reports log-prob 0 once it holds a version >= 1); ``"scores"`` (honest
    sampling, reports log-probs 1 nat above the true ones)."""

    def __init__(self, model, tokenizer, lie: str | None = None):
        from llmgym.engines.hf import sequence_logprobs
        from llmgym.fleet.weight_transfer import open_group, receive_named_tensors

        self.model, self.tokenizer, self.lie = model.eval(), tokenizer, lie
        self.version, self.group, self.rows, self.served = "default", None, 0, set()
        self.lock = threading.Lock()
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
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if path == "/init_weight_transfer_engine":
                    info = body["init_info"]
                    # the rendezvous nonce where the learner sends one (an authenticated rendezvous)
                    nonce = {"nonce": info["nonce"]} if "nonce" in info else {}
                    outer.group, outer._store = open_group(info["master_address"], info["master_port"], 1, 2,
                                                           timeout_s=info["timeout_s"], **nonce)
                    outer.bucket_bytes = info["bucket_bytes"]
                    self._send(200, {})
                elif path == "/update_weights":
                    info = body["update_info"]
                    meta = [(n, getattr(torch, d), tuple(s))
                            for n, d, s in zip(info["names"], info["dtype_names"], info["shapes"])]
                    received = {}
                    for bucket in receive_named_tensors(outer.group, meta, outer.bucket_bytes):
                        received.update((n, t.clone()) for n, t in bucket)
                    with outer.lock:
                        outer.model.load_state_dict(received)
                    self._send(200, {})
                elif path == "/finish_weight_update":
                    outer.version = body.get("weight_version") or outer.version
                    self._send(200, {})
                elif path == "/v1/completions" and body.get("prompt_logprobs") is not None:
                    ids = torch.tensor([body["prompt"]])
                    with outer.lock, torch.no_grad():
                        lp = sequence_logprobs(outer.model, ids, torch.ones_like(ids))[0].tolist()
                    rows = [None] + [{str(t): {"logprob": v, "rank": 1}} for t, v in zip(body["prompt"][1:], lp)]
                    self._send(200, reply(token_ids=(5,), logprobs=(-0.5,), text="a", prompt_logprobs=rows))
                elif path == "/v1/completions":
                    with outer.lock:
                        tokens, logprobs, finish = outer.sample(body)
                    self._send(200, reply(token_ids=tuple(tokens), logprobs=tuple(logprobs),
                                          text=outer.tokenizer.decode(tokens), finish=finish))
                else:
                    self._send(200, {})

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @torch.no_grad()
    def sample(self, body: dict) -> tuple[list[int], list[float], str]:
        prompt, limit = list(body["prompt"]), int(body["max_tokens"])
        temperature = float(body.get("temperature", 1.0))
        stops = set(body.get("stop_token_ids") or []) | {self.tokenizer.eos_token_id}
        generator = torch.Generator().manual_seed(int(body.get("seed") or 0))
        self.rows += 1
        if self.lie == "fixed":
            tokens = [int(t) for t in self.tokenizer.encode("x = 7 + 7")][:limit]
        else:
            tokens = []
            drawn_at = temperature * (0.5 if self.lie == "cold" else 1.0)
            for _ in range(limit):
                logits = self.model(torch.tensor([prompt + tokens])).logits[0, -1].float()
                token = int(torch.multinomial(torch.softmax(logits / drawn_at, -1), 1, generator=generator))
                tokens.append(token)
                if token in stops:
                    break
        logits = self.model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()
        logprobs = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()
        if self.lie == "stale-zero" and self.version not in ("default", "0"):
            logprobs = [0.0] * len(tokens)
        if self.lie == "scores":
            logprobs = [min(0.0, v + 1.0) for v in logprobs]
        self.served.add(tuple(tokens))
        return tokens, logprobs, "stop" if tokens and tokens[-1] in stops else "length"

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        if self.group is not None:
            with contextlib.suppress(Exception):
                self.group.shutdown()


@pytest.fixture(scope="module")
def tok():
    from llmgym.runtime.models import build_tokenizer

    return build_tokenizer()


@pytest.fixture()
def learner(tok):
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model

    torch.manual_seed(0)
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=64, num_layers=2, intermediate_size=128))
    with torch.no_grad():  # a peaked policy, as a trained one is (a random head is almost uniform)
        model.lm_head.weight.mul_(4.0)
    return model


@contextlib.contextmanager
def fleet_of(learner, tok, *lies):
    from llmgym.fleet.fleet_engine import FleetEngine

    servers = [SamplingServer(copy.deepcopy(learner), tok, lie) for lie in lies]
    try:
        with FleetEngine([s.url for s in servers], tok, learner, max_retries=0, timeout=30, sync_timeout_s=30,
                         max_concurrency=2) as fleet:
            yield fleet, servers
    finally:
        for s in servers:
            s.close()


def _env(tok):
    return gym.make("llmgym/Copy-v0", tokenizer=tok)


@pytest.mark.parametrize("lie, reason", [
    ("fixed", r"more likely under the policy than its own samples|sampled one completion more than once"),
    ("cold", r"more likely under the policy than its own samples"),
    ("scores", r"differ from the learner's recomputation"),
])
def test_a_lying_server_is_distrusted_and_its_rows_are_absent_from_the_step_that_found_it(tok, learner, lie, reason):
    """One honest server and one liar: the liar is dropped by the check before the step, and the step trains on
    none of its rows (the batch the optimiser saw holds only the honest server's completions)."""
    from llmgym.fleet.fleet_engine import UntrustedServerWarning

    with fleet_of(learner, tok, None, lie) as (fleet, (honest, liar)):
        agent = GRPO(learner, tok, engine=fleet, tasks_per_step=4, group_size=4, max_new_tokens=12, kl_coef=0.0)
        trained = []
        agent.batch_observer = trained.append
        with pytest.warns(UntrustedServerWarning, match=reason):
            rows = agent.learn(_env(tok), steps=1)
        assert fleet.live == [honest.url] and liar.rows > 0
        trained_on = {tuple(c) for c in _completions(trained[0])}
        assert trained_on and not trained_on & liar.served and trained_on <= honest.served
        assert len(trained[0]) % 4 == 0 and rows[0]["rows_dropped"] == 16 - len(trained[0])  # whole groups left


def _completions(batch):
    for episode in batch.episodes:
        yield [t for t, m in zip(episode.token_ids, episode.action_mask) if m]


def test_a_lone_server_that_samples_one_fixed_completion_stops_the_run_before_any_step(tok, learner):
    from llmgym.fleet.fleet_engine import FleetError, UntrustedServerWarning

    with fleet_of(learner, tok, "fixed") as (fleet, _):
        before = copy.deepcopy(learner.state_dict())
        agent = GRPO(learner, tok, engine=fleet, tasks_per_step=3, group_size=8, max_new_tokens=12, kl_coef=0.0)
        with pytest.warns(UntrustedServerWarning), pytest.raises(FleetError, match="every rollout server is lost"):
            agent.learn(_env(tok), steps=1)
        assert all(torch.equal(before[k], v) for k, v in learner.state_dict().items())  # no step taken


def test_honest_servers_raise_no_alarm_over_many_batches(tok, learner):
    """Two honest servers, 8 batches of 16 completions (fixed seeds): every row stays, no server is dropped,
    and no server's likelihood statistic comes near its bound (the measured false-alarm rate over thousands of
    batches is in benchmarks/results/notes_sample_check.md)."""
    from llmgym.agents.screening import screen
    from llmgym.rollout.episodes import collect_episodes, Batch

    with fleet_of(learner, tok, None, None) as (fleet, servers):
        agent = GRPO(learner, tok, engine=fleet, tasks_per_step=4, group_size=4, max_new_tokens=12, kl_coef=0.0)
        worst = 0.0
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for step in range(8):
                episodes, _ = collect_episodes(_env(tok), fleet, num_tasks=4, group_size=4, sampling=agent.sampling(),
                                               seed=1_000 + step)
                batch = Batch.from_episodes(episodes, fleet.pad_id)
                kept, metrics = screen(agent, batch)
                assert kept is batch and metrics["rows_dropped"] == 0
                worst = max(worst, *fleet.sample_scores.values())
        assert fleet.live == [s.url for s in servers] and all(s.rows > 0 for s in servers)
        assert worst < 0.8, worst  # Σ(log π + H) over its Freedman bound, per server and batch


def test_under_async_a_server_reporting_log_prob_0_for_stale_tokens_cannot_move_the_importance_weights(tok, learner):
    """``max_staleness=1``: from the second batch on every token is one update stale, and the liar reports
    log-prob 0 for them. The learner scores stale tokens under the weights that sampled them (kept for the
    purpose): the liar's report is off by nats, it is dropped before the step, and the weights come from the
    learner's own scores (near 1: one small update apart), not from the report (e^{log π} ≈ 0.004)."""
    from llmgym.fleet.fleet_engine import UntrustedServerWarning

    with fleet_of(learner, tok, None, "stale-zero") as (fleet, (honest, liar)):
        agent = GRPO(learner, tok, engine=fleet, tasks_per_step=4, group_size=4, max_new_tokens=12, kl_coef=0.0,
                     lr=1e-3)
        with pytest.warns(UntrustedServerWarning, match="differ from the learner's recomputation"):
            rows = agent.learn(_env(tok), steps=3, max_staleness=1)
        assert fleet.live == [honest.url]
        stale = [r for r in rows if r["staleness_max"] >= 1]
        assert stale and all(0.9 < r["is_weight_mean"] < 1.1 and r["is_weight_min"] > 0.5 for r in stale), stale
        assert agent.learner.behaviour_weights == {}  # the kept weights are released with the run
