"""``OpenAIEngine`` against a real ``vllm serve`` started on 127.0.0.1 by this module (CPU build in the
test environment), and ``llmgym bench --engine openai`` / ``LLMGrader`` on top of it.

One server for the module (start-up bounded by ``tests/served.py``, shut down by its pid). The
served model is a tiny Llama (head size 64) saved to a temporary directory; the same weights, loaded
with ``transformers``, give the expected log-probs.
"""

from __future__ import annotations

import http.server
import json
import math
import threading
import types

import pytest
import torch

from conftest import vllm_missing_reason

reason = vllm_missing_reason()
pytestmark = pytest.mark.skipif(reason is not None, reason=reason or "")

LOGPROB_TOL = 1e-2  # float32, the server's kernels vs transformers' (the contract test's vLLM tolerance)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from served import vllm_server

    from llmgym.engines import HFEngine
    from llmgym.engines.openai_api import OpenAIEngine
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer, load_model, save_pretrained

    tok = build_tokenizer()
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=256,
                                                  seed=3))
    directory = save_pretrained(model, tok, tmp_path_factory.mktemp("served") / "tiny-served")
    model, tok = load_model(directory)  # what the server loads, read back the same way
    with vllm_server(directory, "tiny-served") as base_url:
        engine = OpenAIEngine(base_url, tokenizer=tok)
        yield types.SimpleNamespace(base_url=base_url, engine=engine, model=model.eval(), tok=tok, dir=directory,
                                    hf=HFEngine(model, tok))
        engine.close()


def _prompts(tok):
    return [tok.encode("12+3="), tok.encode("hello"), tok.encode("a much longer prompt, to pad:")]


def _teacher_forced(model, c, temperature: float) -> torch.Tensor:
    from llmgym.engines import sequence_logprobs

    ids = torch.tensor([c.prompt_ids + c.token_ids])
    with torch.no_grad():
        return sequence_logprobs(model, ids, torch.ones_like(ids), temperature)[0, len(c.prompt_ids) - 1:]


def test_token_id_prompts_n_samples_and_logprobs_of_the_served_model(served):
    from llmgym.engines import Engine, SamplingParams

    engine, tok = served.engine, served.tok
    assert isinstance(engine, Engine) and engine.model == "tiny-served" and engine.server_is_vllm
    prompts = _prompts(tok)
    groups = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=8, temperature=0.7, seed=0))
    assert engine.prompts_sent_as == "token_ids" and engine.token_ids_from == "server"
    assert [len(g) for g in groups] == [3, 3, 3]
    worst = 0.0
    for prompt, group in zip(prompts, groups):
        for c in group:
            assert c.prompt_ids == prompt and 1 <= len(c.token_ids) == len(c.logprobs) <= 8
            assert c.finish_reason in ("stop", "length")
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
            worst = max(worst, float((torch.tensor(c.logprobs) - _teacher_forced(served.model, c, 0.7)).abs().max()))
    # the server runs with --logprobs-mode processed_logprobs: log softmax(logits / T), the learner's convention
    assert worst < LOGPROB_TOL, worst
    assert len({tuple(c.token_ids) for c in groups[0]}) > 1  # the n samples are distinct draws


def test_seeds_reproduce_and_a_rows_key_fixes_its_sample(served):
    from llmgym.engines import SamplingParams

    engine, prompts = served.engine, _prompts(served.tok)
    sampling = SamplingParams(n=2, max_new_tokens=8, seed=11)
    a = [c for g in engine.generate(prompts, sampling) for c in g]
    b = [c for g in engine.generate(prompts, sampling) for c in g]
    assert sum(x.token_ids == y.token_ids for x, y in zip(a, b)) >= 0.75 * len(a)
    c = [c for g in engine.generate(prompts, SamplingParams(n=2, max_new_tokens=8, seed=12)) for c in g]
    assert sum(x.token_ids != y.token_ids for x, y in zip(a, c)) >= len(a) // 2
    alone = engine.generate([prompts[1]], SamplingParams(max_new_tokens=8), keys=[a[2].key])[0][0]
    assert alone.token_ids == a[2].token_ids


@pytest.mark.parametrize("stops", [tuple("ae1 "), tuple("aeiou0123456789 ")], ids=["server-side", "over-4-cut-here"])
def test_stop_strings_end_the_completion_and_are_kept(served, stops):
    """Up to 4 stop strings go to the server (the API's limit); more are applied to the tokens after."""
    from llmgym.engines import SamplingParams

    tok = served.tok
    completions = [c for g in served.engine.generate(_prompts(tok)[:2], SamplingParams(n=6, max_new_tokens=16, seed=5,
                                                                                        stop=stops)) for c in g]
    on_string = 0
    for c in completions:
        before = tok.decode(c.token_ids[:-1], skip_special_tokens=True)
        assert not any(s in before for s in stops), c.text
        if c.finish_reason == "stop" and c.token_ids[-1] != tok.eos_token_id:
            assert any(s in c.text for s in stops)
            on_string += 1
    assert on_string > 0


def test_text_prompts_where_asked_and_said_so(served):
    from llmgym.engines import SamplingParams
    from llmgym.engines.openai_api import OpenAIEngine

    engine = OpenAIEngine(served.base_url, "tiny-served", served.tok, prompt_format="text")
    try:
        (c,) = engine.generate([served.tok.encode("hello")], SamplingParams(max_new_tokens=4, seed=1))[0]
        assert engine.prompts_sent_as == "text" and len(c.token_ids) == len(c.logprobs) >= 1
    finally:
        engine.close()


def test_a_served_engine_cannot_take_the_learners_weights(served):
    with pytest.raises(NotImplementedError, match="train with VLLMEngine"):
        served.engine.sync_weights(served.model)


def test_a_model_that_is_not_served_and_a_dead_server_are_one_clear_error(served):
    from served import free_port

    from llmgym.engines.openai_api import ModelNotServedError, OpenAIEngine, ServerError

    with pytest.raises(ModelNotServedError, match=r"does not serve model 'gpt-x'; it serves: tiny-served"):
        OpenAIEngine(served.base_url, "gpt-x", served.tok)
    with pytest.raises(ServerError, match=r"no OpenAI-compatible server answers at http://127.0.0.1:\d+/v1 \(2 tries"):
        OpenAIEngine(f"http://127.0.0.1:{free_port()}/v1", "tiny", max_retries=1, timeout=5)


def test_failed_requests_are_retried_with_back_off_then_named(tmp_path):
    """A loopback server that answers 503 to everything: the client tries 1 + max_retries times."""
    from llmgym.engines.openai_api import OpenAIEngine, ServerError

    hits = []

    class Unavailable(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's handler naming
            hits.append(self.path)
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps({"error": {"message": "overloaded"}}).encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(ServerError, match=r"answered HTTP 503"):
            OpenAIEngine(f"http://127.0.0.1:{server.server_address[1]}/v1", "tiny", max_retries=2, timeout=5)
    finally:
        server.shutdown()
        server.server_close()
    assert hits == ["/v1/models"] * 3


def test_a_judge_can_ask_the_served_model(served):
    """``LLMGrader`` over the server: P(yes) equals the same model's in process, and binary
    verdicts are the greedy answers the in-process judge gives."""
    from llmgym import Task
    from llmgym.rlhf.llm_graders import LLMGrader

    tasks, answers = [Task("2+2="), Task("Name a colour.")], ["4", "blue"]
    served_prob = LLMGrader(served.engine, "Is the response correct?", mode="prob").verify_batch(tasks, answers)
    local_prob = LLMGrader(served.hf, "Is the response correct?", mode="prob").verify_batch(tasks, answers)
    for s, h in zip(served_prob, local_prob):
        assert abs(s.info["logprob_yes"] - h.info["logprob_yes"]) < LOGPROB_TOL
        assert abs(s.reward - h.reward) < LOGPROB_TOL and 0.0 < s.reward < 1.0
    served_bin = LLMGrader(served.engine, "Is the response correct?").verify_batch(tasks, answers)
    local_bin = LLMGrader(served.hf, "Is the response correct?").verify_batch(tasks, answers)
    assert [s.info["grader_output"] for s in served_bin] == [h.info["grader_output"] for h in local_bin]


def test_bench_scores_a_served_model(served, tmp_path):
    from llmgym.cli import main

    out = tmp_path / "bench.json"
    assert main(["bench", "--env", "llmgym/Copy-v0", "--engine", "openai", "--base-url", served.base_url,
                 "--model", str(served.dir), "--tasks", "4", "--samples", "2", "--max-new-tokens", "6",
                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["engine"] == "openai" and report["served_model"] == "tiny-served"
    assert report["base_url"] == served.base_url and report["prompts_sent_as"] == "token_ids"
    assert report["tasks"] == 4 and len(report["per_task"]) == 4
    assert all(0.0 <= r <= 1.0 for t in report["per_task"] for r in t["rewards"]) and math.isfinite(report["reward_mean"])
    assert report["tokens_sampled"] > 0


def test_check_engine_passes_on_a_served_model(served):
    """The shipped contract checker holds the OpenAI-compatible engine to what it holds every engine to
    (its weights are the server's: compared with the same model's, not synced)."""
    from llmgym.engines import check_engine

    check_engine(served.engine, model=served.model, sync=False)


def test_a_served_teacher_scores_tokens_as_a_direct_forward_of_its_model(served):
    """What on-policy distillation reads from a served teacher: per-token log-probs of given ids (prompt and
    sampled tokens alike) equal to a direct forward of the same weights; none where prompts go as text."""
    import torch

    from llmgym.engines import SamplingParams, sequence_logprobs
    from llmgym.engines.openai_api import OpenAIEngine

    prompts = [served.tok.encode("copy:42="), served.tok.encode("a longer prompt")]
    done = [c for g in served.engine.generate(prompts, SamplingParams(n=2, max_new_tokens=4, seed=3)) for c in g]
    sequences = [c.prompt_ids + c.token_ids for c in done]
    for seq, row in zip(sequences, served.engine.score_tokens(sequences)):
        ids = torch.tensor([seq])
        with torch.no_grad():
            direct = sequence_logprobs(served.model, ids, torch.ones_like(ids))[0]
        assert len(row) == len(seq) - 1 and float((torch.tensor(row) - direct).abs().max()) < LOGPROB_TOL
    assert OpenAIEngine(served.base_url, "tiny-served", served.tok, prompt_format="text").score_tokens is None
