"""The keyed sampler (llmgym.engines.sampling): draws follow the tempered (and top-p) distribution,
a row's draw depends only on its logits, key and position, and no integer hashing runs over the
vocabulary — nor inside any graph the compiled decoder hands to ``torch.compile`` (issue 28: Triton
refused the 64-bit hash constants of the compiled Gumbel noise on a GPU).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from llmgym.engines.sampling import keyed_uniforms, row_keys, sample_next_token, tempered_logprobs

DRAWS = 40_000


def _frequencies(logits_row: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """Empirical token frequencies over DRAWS keys (one row per key, all at position 3)."""
    keys = torch.tensor(row_keys(11, DRAWS))
    tokens, _ = sample_next_token(logits_row.expand(DRAWS, -1), keys, torch.full((DRAWS,), 3), temperature, top_p)
    return torch.bincount(tokens, minlength=logits_row.shape[-1]).double() / DRAWS


def _within_sampling_error(freq: torch.Tensor, expected: torch.Tensor) -> bool:
    # 5 binomial standard deviations (plus a hair for float round-off): a correct sampler fails this
    # once in millions of seeds, a sampler off by a share of a probability fails it at once
    sd = (expected * (1 - expected) / DRAWS).sqrt()
    return bool(((freq - expected).abs() <= 5 * sd + 1e-9).all())


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_draws_follow_the_tempered_distribution(temperature):
    logits = torch.tensor([1.0, 0.0, -1.0, 2.5, -3.0, 0.5, -30.0, 1.5])
    expected = tempered_logprobs(logits[None], temperature)[0].double().exp()
    freq = _frequencies(logits, temperature)
    assert _within_sampling_error(freq, expected), (freq, expected)
    # the check has teeth: the distribution at another temperature is rejected
    other = tempered_logprobs(logits[None], temperature * 1.3)[0].double().exp()
    assert not _within_sampling_error(freq, other)


@pytest.mark.parametrize("top_p", [0.5, 0.8, 0.95])
def test_top_p_draws_follow_the_renormalised_nucleus(top_p):
    logits = torch.tensor([1.0, 0.0, -1.0, 2.5, -3.0, 0.5, -30.0, 1.5])
    p = torch.softmax(logits.double(), -1)
    order = p.argsort(descending=True)
    mass_before = p[order].cumsum(0) - p[order]
    nucleus = torch.zeros_like(p, dtype=torch.bool)
    nucleus[order[mass_before < top_p]] = True
    expected = torch.where(nucleus, p, 0.0) / p[nucleus].sum()
    freq = _frequencies(logits, top_p=top_p)
    assert (freq[~nucleus] == 0).all()
    assert _within_sampling_error(freq, expected), (freq, expected)


def test_top_p_keeps_at_least_the_most_likely_token_and_ties_in_token_order():
    logits = torch.tensor([[0.0, 9.0, 0.0, 0.0]])
    for k in range(20):
        tok, _ = sample_next_token(logits, torch.tensor([k]), torch.tensor([0]), top_p=0.01)
        assert tok.item() == 1
    tied = torch.zeros(1, 4)  # four equal tokens, top_p 0.5: the nucleus is the first two ids
    drawn = {sample_next_token(tied, torch.tensor([k]), torch.tensor([0]), top_p=0.5)[0].item() for k in range(64)}
    assert drawn == {0, 1}


def test_tokens_of_zero_probability_are_never_drawn():
    logits = torch.full((1, 64), float("-inf"))
    logits[0, [5, 40]] = torch.tensor([0.0, -25.0])  # one token with nearly all mass, one with e^-25
    tokens, lps = sample_next_token(logits.expand(DRAWS, -1), torch.tensor(row_keys(3, DRAWS)), torch.zeros(DRAWS))
    assert set(tokens.tolist()) <= {5, 40} and torch.isfinite(lps).all()
    for top_p in (0.5, 1.0):  # all mass on the last id: the searchsorted edge
        last = torch.full((1, 9), float("-inf"))
        last[0, -1] = 0.0
        assert sample_next_token(last, torch.tensor([7]), torch.tensor([0]), top_p=top_p)[0].item() == 8


def test_a_rows_draw_depends_on_its_key_position_and_logits_only():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 500, generator=g) * 2
    keys, positions = torch.tensor(row_keys(5, 6)), torch.arange(6) * 7
    for top_p in (1.0, 0.9):
        together, lp_together = sample_next_token(logits, keys, positions, 0.8, top_p)
        alone = [sample_next_token(logits[i:i + 1], keys[i:i + 1], positions[i:i + 1], 0.8, top_p) for i in range(6)]
        assert together.tolist() == [t.item() for t, _ in alone]
        assert torch.allclose(lp_together, torch.cat([lp for _, lp in alone]))
        perm = torch.tensor([3, 0, 5, 1, 4, 2])
        shuffled, _ = sample_next_token(logits[perm], keys[perm], positions[perm], 0.8, top_p)
        assert shuffled.tolist() == together[perm].tolist()
    # precomputed uniforms are the same draw
    u = keyed_uniforms(keys, positions)
    assert sample_next_token(logits, None, None, 0.8, uniforms=u)[0].tolist() == \
        sample_next_token(logits, keys, positions, 0.8)[0].tolist()
    with pytest.raises(ValueError, match="needs keys and positions, or uniforms"):
        sample_next_token(logits, None, None, 0.8)


def test_keyed_uniforms_are_open_interval_uniform_and_differ_by_key_and_position():
    keys = torch.tensor(row_keys(0, 4000))
    u = keyed_uniforms(keys[:, None], torch.arange(16)[None, :])
    assert u.shape == (4000, 16) and u.dtype == torch.float64
    assert bool(((u > 0) & (u < 1)).all())
    assert torch.equal(u, keyed_uniforms(keys[:, None], torch.arange(16)[None, :]))
    assert u.flatten().unique().numel() == u.numel()  # no two (key, position) pairs share a draw
    counts = torch.histc(u.flatten().float(), bins=16, min=0, max=1)
    expected = u.numel() / 16
    assert (counts - expected).abs().max() <= 5 * (expected * 15 / 16) ** 0.5
    assert abs(torch.corrcoef(torch.stack([u[:, 0], u[:, 1]]))[0, 1].item()) < 0.05  # positions independent
    extreme = torch.tensor([0, -1, 2**63 - 1, -(2**63)])
    assert bool(((keyed_uniforms(extreme, torch.zeros(4)) > 0) & (keyed_uniforms(extreme, torch.zeros(4)) < 1)).all())


class _IntegerArithmetic(TorchDispatchMode):
    """Records integer multiplications, xors and shifts on tensors with at least ``min_numel`` elements."""

    HASH_OPS = ("mul", "bitwise_xor", "bitwise_and", "bitwise_right_shift", "rshift", "__rshift__", "bitwise_left_shift")

    def __init__(self, min_numel: int):
        super().__init__()
        self.min_numel = min_numel
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name.rstrip("_") in self.HASH_OPS and isinstance(out, torch.Tensor) and not out.is_floating_point() \
                and out.dtype != torch.bool and out.numel() >= self.min_numel:
            self.seen.append(f"{name}{tuple(out.shape)}")
        return out


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_the_sampler_hashes_per_row_not_per_vocabulary_entry(top_p):
    """The integer hash runs over [B] values: nothing of the vocabulary's size is integer-hashed (the
    old Gumbel sampler hashed [B, V] int64 tensors: 1.7-2.2 s for 64 x 151,936 on this CPU, and its
    compiled form did not compile on Triton)."""
    logits = torch.randn(4, 3000)
    with _IntegerArithmetic(min_numel=3000) as seen:
        sample_next_token(logits, torch.tensor(row_keys(1, 4)), torch.arange(4), 1.0, top_p)
    assert seen.seen == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compares the sampler on CUDA with CPU: needs a CUDA GPU")
def test_the_same_keys_draw_the_same_tokens_on_cuda_and_cpu():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 151_936, generator=g) * 3
    keys, positions = torch.tensor(row_keys(9, 64)), torch.arange(64)
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.9), (0.0, 1.0)):
        cpu, lp_cpu = sample_next_token(logits, keys, positions, temperature, top_p)
        gpu, lp_gpu = sample_next_token(logits.cuda(), keys.cuda(), positions.cuda(), temperature, top_p)
        assert gpu.device.type == "cuda" and gpu.tolist() == cpu.tolist()
        assert torch.allclose(lp_gpu.cpu(), lp_cpu, atol=1e-4)


# -- compiled graphs -------------------------------------------------------------------------------

_INT32 = (-(2**31), 2**31 - 1)


def _flat_ints(x):
    if isinstance(x, bool):
        return []
    if isinstance(x, int):
        return [x]
    if isinstance(x, (tuple, list)):
        return [v for item in x for v in _flat_ints(item)]
    if isinstance(x, dict):
        return [v for item in x.values() for v in _flat_ints(item)]
    return []


def _bad_constants(gm: torch.fx.GraphModule) -> list[str]:
    return [node.format_node() for node in gm.graph.nodes
            if any(not _INT32[0] <= v <= _INT32[1] for v in _flat_ints((node.args, node.kwargs)))]


class _RecordingBackend:
    """A ``torch.compile`` backend that keeps every graph dynamo hands it and runs it uncompiled (no
    C compiler, seconds on a CPU)."""

    def __init__(self):
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def test_the_graph_check_catches_the_hash_triton_refused():
    """The check below is not vacuous: the old compiled noise (splitmix64 over token ids) is caught."""
    golden = -7046029254386353131

    def old_noise(keys, vocab_size: int):
        x = keys[:, None] + torch.arange(vocab_size, device=keys.device)[None, :] * golden
        x = (x ^ ((x >> 30) & ((1 << 34) - 1))) * -4658895280553007687
        return x

    torch._dynamo.reset()
    backend = _RecordingBackend()
    torch.compile(old_noise, backend=backend, dynamic=False)(torch.tensor([1, 2]), 8)
    assert backend.graphs and any(_bad_constants(gm) for gm in backend.graphs)


def test_the_compiled_decoder_compiles_no_integer_hashing(monkeypatch):
    """Every graph the compiled decoder hands to ``torch.compile`` — on CPU here, the same functions
    as on a GPU (only the compile mode differs there) — has no integer constant outside int32 and
    none of the sampler's code; and the tokens are the eager engine's."""
    from llmgym.engines import HFEngine, SamplingParams
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer

    backend = _RecordingBackend()
    compiled_functions = []
    real_compile = torch.compile

    def recording_compile(fn, **kwargs):
        compiled_functions.append(fn)
        kwargs.pop("mode", None)
        return real_compile(fn, **{**kwargs, "backend": backend})

    monkeypatch.setattr(torch, "compile", recording_compile)
    torch._dynamo.reset()
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
    params = SamplingParams(n=2, max_new_tokens=6, seed=3, temperature=0.8, top_p=0.9)
    prompts = [tok.encode("7*6="), tok.encode("hello")]
    compiled = HFEngine(model, tok, decode="compiled").generate(prompts, params)
    eager = HFEngine(model, tok).generate(prompts, params)
    torch._dynamo.reset()
    assert [c.token_ids for g in compiled for c in g] == [c.token_ids for g in eager for c in g]
    from llmgym.engines import static_decode

    assert compiled_functions == [static_decode._step]  # the model's step, nothing of the sampler
    assert backend.graphs, "the compiled decoder compiled nothing"
    for gm in backend.graphs:
        assert _bad_constants(gm) == []
        assert not any("sampling" in str(node.meta.get("stack_trace", "")) for node in gm.graph.nodes)

