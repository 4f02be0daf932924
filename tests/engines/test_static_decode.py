"""HFEngine's static-KV-cache and compiled decoding paths keep the eager path's keyed sampling:
same keys ⇒ same tokens (float32, CPU), log-probs within the engine contract's tolerance.

The compiled test runs ``torch.compile`` wherever it can: on a GPU, or on a CPU with a C compiler
(inductor needs one; on a 2-core CPU the first compilation takes about a minute, which the suite's
time budget includes: nothing that can run is skipped).
"""

from __future__ import annotations

import shutil

import pytest
import torch

from llmgym.engines import HFEngine, SamplingParams
from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer


@pytest.fixture(scope="module")
def model_and_tok():
    tok = build_tokenizer()
    torch.manual_seed(0)
    return build_tiny_model(tok, TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128)), tok


def _prompts(tok):
    return [tok.encode("7*6="), tok.encode("hello world 12"), tok.encode("a")]  # unequal: left padding


def _same(a, b):
    return [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_static_cache_gives_the_eager_tokens(model_and_tok, temperature, top_p):
    model, tok = model_and_tok
    torch.set_num_threads(1)
    params = SamplingParams(n=3, max_new_tokens=20, seed=5, temperature=temperature, top_p=top_p)
    eager = HFEngine(model, tok).generate(_prompts(tok), params)
    engine = HFEngine(model, tok, decode="static")
    static = engine.generate(_prompts(tok), params)
    assert _same(eager, static)
    gap = max(abs(x - y) for g, h in zip(eager, static) for a, b in zip(g, h) for x, y in zip(a.logprobs, b.logprobs))
    assert gap < 1e-4
    # uncompiled, the cache is released after each call (the learner trains without it) and rebuilt exactly
    assert engine._static._caches == {}
    again = engine.generate(_prompts(tok), params)
    assert _same(again, static)


def test_static_cache_logprobs_match_teacher_forcing(model_and_tok):
    model, tok = model_and_tok
    engine = HFEngine(model, tok, decode="static")
    for c in engine.generate(_prompts(tok), SamplingParams(n=2, max_new_tokens=12, seed=1, temperature=0.7))[1]:
        forced = engine.logprobs(c.prompt_ids, c.token_ids, temperature=0.7)
        assert max(abs(a - b) for a, b in zip(c.logprobs, forced)) < 1e-4


def test_static_cache_stops_at_eos_and_stop_strings(model_and_tok):
    model, tok = model_and_tok
    params = SamplingParams(n=4, max_new_tokens=16, seed=2, stop=("1",))
    eager = HFEngine(model, tok).generate(_prompts(tok), params)
    static = HFEngine(model, tok, decode="static").generate(_prompts(tok), params)
    assert _same(eager, static)
    assert [c.finish_reason for g in eager for c in g] == [c.finish_reason for g in static for c in g]


@pytest.mark.parametrize("decode", ["eager", "static"])
def test_checking_for_done_rows_every_few_steps_keeps_the_tokens(model_and_tok, decode):
    """A GPU asks "all rows done?" only every few steps (each ask is a host sync): the extra steps
    after every row stopped sample padding only, so completions, log-probs and finish reasons stay."""
    model, tok = model_and_tok
    params = SamplingParams(n=4, max_new_tokens=24, seed=0)  # a seed whose rows all stop early (below)
    runs = []
    for every in (None, 5):
        engine = HFEngine(model, tok, decode=decode)
        engine.eos_ids = list(range(3, model.config.vocab_size, 9))  # rows stop early, at different steps
        engine.done_check_every = every
        runs.append(engine.generate(_prompts(tok), params))
    every_step, sparse = runs
    assert _same(every_step, sparse)
    assert [(c.finish_reason, c.logprobs) for g in every_step for c in g] == \
        [(c.finish_reason, c.logprobs) for g in sparse for c in g]
    lengths = {len(c.token_ids) for g in sparse for c in g}
    assert all(c.finish_reason == "stop" for g in sparse for c in g) and len(lengths) > 1 and max(lengths) < 20
    assert max(lengths) % 5 != 0  # the last row stops between two checks: the sparse run samples padding after it


def test_unknown_decode_mode_is_named(model_and_tok):
    model, tok = model_and_tok
    with pytest.raises(ValueError, match="decode must be one of"):
        HFEngine(model, tok, decode="fast")


def _compile_reason() -> str | None:
    if not torch.cuda.is_available() and not (shutil.which("cc") or shutil.which("gcc")):
        return "torch.compile on CPU needs a C compiler (cc/gcc not found)"
    if not torch.cuda.is_available() and torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        # torch 2.13's inductor writes C++ for the generic kernels that does not compile (at::vec undeclared)
        return "torch.compile on CPU cannot build C++ for ATEN_CPU_CAPABILITY=default (torch 2.13 inductor)"
    return None


@pytest.mark.skipif(_compile_reason() is not None, reason=_compile_reason() or "")
def test_compiled_step_gives_the_eager_tokens():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # a fresh recompile budget: past it dynamo would quietly run the step eagerly
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device)
    params = SamplingParams(n=2, max_new_tokens=8, seed=3)
    eager = HFEngine(model, tok).generate(_prompts(tok), params)
    engine = HFEngine(model, tok, decode="compiled")
    compiled = engine.generate(_prompts(tok), params)
    assert _same(eager, compiled)
    gap = max(abs(x - y) for g, h in zip(eager, compiled) for a, b in zip(g, h) for x, y in zip(a.logprobs, b.logprobs))
    assert gap < 1e-4
    other = SamplingParams(n=2, max_new_tokens=8, seed=4)
    assert _same(engine.generate(_prompts(tok), other), HFEngine(model, tok).generate(_prompts(tok), other))
    assert counters["stats"]["unique_graphs"] > 0, "nothing was compiled: the test compared eager with eager"


@pytest.mark.parametrize("decode", ["eager", "static"])
def test_a_prompt_shared_by_a_group_is_prefilled_once_with_the_same_tokens(model_and_tok, decode, monkeypatch):
    # n samples of a prompt are n rows with the same ids: the prefill runs on the distinct prompts and
    # copies their KV cache, and the samples are those of a prefill over every row
    model, tok = model_and_tok
    params = SamplingParams(n=4, max_new_tokens=10, seed=2)
    prompts = _prompts(tok) + [_prompts(tok)[0]]  # a prompt given twice shares too
    widths = []
    hook = model.register_forward_pre_hook(lambda mod, args, kw: widths.append(kw["input_ids"].shape),
                                           with_kwargs=True)
    try:
        shared = HFEngine(model, tok, decode=decode).generate(prompts, params)
        prefill = widths[0]
        monkeypatch.setattr("llmgym.engines.hf.shared_rows", lambda rows: None)
        every = HFEngine(model, tok, decode=decode).generate(prompts, params)
    finally:
        hook.remove()
    assert prefill[0] == 3 and widths[-1][0] == 16  # 3 distinct prompts prefilled, 16 rows decoded
    assert _same(shared, every)
    gap = max(abs(x - y) for g, h in zip(shared, every) for a, b in zip(g, h) for x, y in zip(a.logprobs, b.logprobs))
    assert gap < 1e-5



def test_a_static_cache_the_copy_does_not_know_prefills_every_row(model_and_tok, monkeypatch):
    # a transformers whose StaticLayer internals differ (here: its lazy initialisation refuses the
    # copy's call): the copy gives up, every row is prefilled, and the tokens are the same
    from transformers.cache_utils import StaticLayer

    model, tok = model_and_tok
    params = SamplingParams(n=3, max_new_tokens=6, seed=4)
    expected = HFEngine(model, tok, decode="static").generate(_prompts(tok), params)
    original = StaticLayer.lazy_initialization

    def other_layout(self, key_states, value_states):
        if key_states.shape[2] == self.max_cache_len:  # the copy's call (a prefill's keys are narrower)
            raise TypeError("lazy_initialization() takes 2 positional arguments but 3 were given")
        return original(self, key_states, value_states)

    monkeypatch.setattr(StaticLayer, "lazy_initialization", other_layout)
    widths = []
    hook = model.register_forward_pre_hook(lambda mod, args, kw: widths.append(kw["input_ids"].shape[0]),
                                           with_kwargs=True)
    try:
        fallback = HFEngine(model, tok, decode="static").generate(_prompts(tok), params)
    finally:
        hook.remove()
    assert widths[:2] == [3, 9]  # the distinct prompts, then (the copy refused) all 9 rows
    assert _same(fallback, expected)
