"""The learner's step mechanics (llmgym.agents.learner): chunked log-probs, micro-batch gradient
accumulation, precision, gradient checkpointing, LoRA with the adapter-free reference, lr schedules.

Each mechanic is checked against the plain computation it replaces: same log-probs, same gradient,
same update.
"""

from __future__ import annotations

import pytest
import torch

from llmgym import Task
from llmgym.agents import AGENTS, GRPO
from llmgym.agents.fused_head import head_logprobs_and_entropy
from llmgym.agents.learner import micro_batches, resolve_device_defaults, token_logprobs_and_entropy
from llmgym.rollout.episodes import Batch, Episode
from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer

GROUP = 2
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _tiny(seed: int = 0):
    tok = build_tokenizer()
    torch.manual_seed(seed)
    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    return build_tiny_model(tok, cfg), tok


def _fixed_batch(tok, lengths=(1, 7, 2, 2, 6, 4, 3, 5), truncate=(1, 4)) -> Batch:
    """Groups of 2 with unequal completion lengths, rewards that differ within each group."""
    episodes = []
    for i, n in enumerate(lengths):
        prompt = tok.encode(f"p{i // GROUP}:")
        completion = [40 + (7 * i + 3 * t) % 50 for t in range(n)]
        ids = prompt + completion
        rewards = [0.0] * len(ids)
        rewards[-1] = float((i * 3) % 4) / 3.0
        finish = ["length"] if i in truncate else ["stop"]
        # two reward components, as a WeightedSum verifier reports them (GDPO normalises each)
        score = {"format": {"reward": float(i % 2), "weight": 0.5}, "correct": {"reward": rewards[-1], "weight": 1.0}}
        episodes.append(Episode(Task(f"t{i // GROUP}"), i // GROUP, ids, [0] * len(prompt) + [1] * n,
                                [-1.0] * len(ids), rewards, len(prompt), finish, info={"score": score}))
    return Batch.from_episodes(episodes, tok.pad_token_id)


def _update(agent_name="grpo", seed=0, **config):
    """One SGD update of a fresh tiny model on the fixed batch; returns (new state, metrics, agent)."""
    model, tok = _tiny(seed)
    extra = {"group_size": GROUP} if agent_name in ("grpo", "dapo", "drgrpo", "gspo", "rloo") else {}
    config = {"kl_coef": 0.0, "max_new_tokens": 8, "entropy_coef": 0.01, "max_grad_norm": 1.0, **extra, **config}
    agent = AGENTS[agent_name](model, tok, **config)
    # SGD compares the gradients themselves (Adam's first step is ≈ lr·sign(g))
    agent.optimizer = torch.optim.SGD(agent.parameters(), lr=0.5)
    metrics = agent.update(_fixed_batch(tok))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics, agent


def _assert_same_state(a, b, atol=1e-6):
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), rtol=1e-5, atol=atol), \
            f"{k} differs by {float((a[k].float() - b[k].float()).abs().max()):.3g}"


# ---------------------------------------------------------------------------------------------
# chunked log-probs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 5, 4096])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_and_entropy_equal_full_logits(chunk, temperature):
    model, tok = _tiny()
    batch = _fixed_batch(tok)
    args = (model, batch.input_ids, batch.attention_mask)
    mask = batch.action_mask
    lp_full, ent_full, _ = token_logprobs_and_entropy(*args, temperature=temperature, mask=mask, chunk_size=0)
    (lp_full.sum() + ent_full.sum()).backward()
    grads_full = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    lp, ent, _ = token_logprobs_and_entropy(*args, temperature=temperature, mask=mask, chunk_size=chunk)
    (lp.sum() + ent.sum()).backward()
    assert torch.allclose(lp, lp_full, atol=1e-5) and torch.allclose(ent, ent_full, atol=1e-5)
    assert bool((lp[mask.bool()] < 0).all()) and bool((lp[~mask.bool()] == 0).all())
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, grads_full[n], atol=1e-5), n


def test_chunked_forward_returns_the_value_heads_hidden_states():
    model, tok = _tiny()
    batch = _fixed_batch(tok)
    _, _, hidden = token_logprobs_and_entropy(model, batch.input_ids, batch.attention_mask, chunk_size=4, with_hidden=True)
    _, _, hidden_full = token_logprobs_and_entropy(model, batch.input_ids, batch.attention_mask, chunk_size=0, with_hidden=True)
    assert hidden.shape == (*batch.action_mask.shape, 32) and torch.allclose(hidden, hidden_full, atol=1e-6)


@pytest.mark.parametrize("family,extra", [("Granite", {"logits_scaling": 4.0}), ("Cohere", {"logit_scale": 0.25}),
                                          ("Gemma2", {"final_logit_softcapping": 3.0, "head_dim": 8})])
def test_chunked_logprobs_apply_the_models_own_logit_transform(family, extra):
    """Granite divides its logits by ``logits_scaling``, Cohere multiplies them by ``logit_scale``, Gemma-2
    soft-caps them: the chunked head computes what the model's own forward does (it ignored the scales)."""
    import transformers

    torch.manual_seed(0)
    cfg = getattr(transformers, f"{family}Config")(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                   num_key_value_heads=2, intermediate_size=32, eos_token_id=2, **extra)
    model = getattr(transformers, f"{family}ForCausalLM")(cfg)
    ids = torch.randint(3, 64, (3, 9), generator=torch.Generator().manual_seed(1))
    args = (model, ids, torch.ones_like(ids))
    chunked, full = (token_logprobs_and_entropy(*args, chunk_size=c, temperature=0.7)[:2] for c in (4, 0))
    assert torch.allclose(chunked[0], full[0], atol=1e-5) and torch.allclose(chunked[1], full[1], atol=1e-5)


def test_a_logit_transform_the_head_does_not_know_falls_back_to_full_logits():
    from llmgym.agents.fused_head import logit_transform

    class Tripled(type(_tiny()[0])):
        def forward(self, input_ids=None, logits_to_keep=0, **kw):
            out = super().forward(input_ids=input_ids, logits_to_keep=logits_to_keep, **kw)
            out.logits = out.logits * 3
            return out

    model, tok = _tiny()
    model.__class__ = Tripled
    ids = torch.tensor([tok.encode("12+34=46")])
    with pytest.warns(UserWarning, match="does not reproduce Tripled's logits"):
        lp, _, _ = token_logprobs_and_entropy(model, ids, torch.ones_like(ids), chunk_size=3)
    want = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    assert torch.allclose(lp[0], want, atol=1e-5) and logit_transform(model) is None


def _reference_head(h, W, b, x, temperature, softcap):
    """log π and H through autograd's own ops on the full ``[K, V]`` logits (what the fused head replaces)."""
    z = h @ W.T + (b if b is not None else 0)
    if softcap:
        z = torch.tanh(z / softcap) * softcap
    logp = torch.log_softmax(z / temperature, -1)
    return logp.gather(-1, x[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("temperature,softcap,bias", [(1.0, None, False), (0.7, None, True), (1.3, 5.0, True)])
@pytest.mark.parametrize("reads_entropy", [True, False])
@pytest.mark.parametrize("vocab_tile", [None, 3], ids=["one-tile", "tiles-of-3"])
def test_fused_head_gradient_is_the_full_logits_gradient(temperature, softcap, bias, reads_entropy, vocab_tile):
    """float64, so the only difference left is summation order: log π, H and every gradient agree to ~1e-12
    (one vocabulary tile, and tiles of 3 entries: the online softmax and the per-tile backward)."""
    g = torch.Generator().manual_seed(3)
    k, hidden, vocab = 13, 6, 11
    leaves = [torch.randn(k, hidden, generator=g, dtype=torch.float64) * 2, torch.randn(vocab, hidden, generator=g,
              dtype=torch.float64), torch.randn(vocab, generator=g, dtype=torch.float64) if bias else None]
    x = torch.randint(0, vocab, (k,), generator=g)
    u, v = torch.randn(k, generator=g, dtype=torch.float64), torch.randn(k, generator=g, dtype=torch.float64)
    results = []
    for fused in (True, False):
        h, W, b = [t.clone().requires_grad_() if t is not None else None for t in leaves]
        lp, ent = (head_logprobs_and_entropy(h, W, b, x, temperature=temperature, softcap=softcap, chunk_size=4,
                                             vocab_tile=vocab_tile) if fused else _reference_head(h, W, b, x, temperature, softcap))
        ((u * lp).sum() + ((v * ent).sum() if reads_entropy else 0)).backward()
        results.append([lp.detach(), ent.detach(), *[t.grad for t in (h, W, b) if t is not None]])
    for got, want in zip(*results):
        assert torch.allclose(got.double(), want, rtol=1e-10, atol=1e-12), float((got.double() - want).abs().max())


def test_fused_head_passes_gradcheck():
    g = torch.Generator().manual_seed(4)
    h, W, b = (torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True) for shape in ((7, 3), (5, 3), (5,)))
    x = torch.randint(0, 5, (7,), generator=g)
    fn = lambda h, W, b: head_logprobs_and_entropy(h, W, b, x, temperature=0.8, softcap=2.0, chunk_size=3,  # noqa: E731
                                                   vocab_tile=2)
    assert torch.autograd.gradcheck(fn, (h, W, b))
    assert torch.autograd.gradcheck(lambda h, W, b: fn(h, W, b)[0], (h, W, b))  # the entropy unread


def test_fused_head_under_bf16_autocast_is_the_autocast_computation():
    """Same bf16 products as ``nn.Linear`` under autocast, float32 softmax and accumulation."""
    g = torch.Generator().manual_seed(5)
    h0, W0 = torch.randn(40, 16, generator=g), torch.randn(300, 16, generator=g) / 4
    x = torch.randint(0, 300, (40,), generator=g)
    outs = []
    for fused in (True, False):
        h, W = h0.clone().requires_grad_(), W0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if fused:
                lp, ent = head_logprobs_and_entropy(h, W, None, x, chunk_size=16, vocab_tile=128)
            else:
                logp = torch.log_softmax(torch.nn.functional.linear(h, W).float(), -1)
                lp, ent = logp.gather(-1, x[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)
        (lp.sum() + 0.1 * ent.sum()).backward()
        outs.append((lp.detach(), ent.detach(), h.grad, W.grad))
    for got, want in zip(*outs):
        assert got.dtype == torch.float32
        assert torch.allclose(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))
    assert torch.allclose(outs[0][0], outs[1][0], atol=1e-5)  # the same bf16 logits: log-probs to float32 rounding


def _multi_turn_batch(tok) -> Batch:
    """Groups of 3 sharing a prompt (prompt lengths differ between groups); one group's episodes have an
    env reply between two sampled turns (action-mask gaps), one row of another group is the longest."""
    episodes = []
    for i in range(9):
        prompt = tok.encode(f"q{i // 3}{'xyz' * (i // 3)}:")
        turn = [40 + (5 * i + 3 * t) % 50 for t in range(2 + i % 4)]
        ids, act = prompt + turn, [0] * len(prompt) + [1] * len(turn)
        if i // 3 == 1:  # an env reply, then a second turn
            reply, second = tok.encode("ok"), [60 + t for t in range(1 + i % 2)]
            ids, act = ids + reply + second, act + [0] * len(reply) + [1] * len(second)
        rewards = [0.0] * len(ids)
        rewards[-1] = float(i % 3)
        episodes.append(Episode(Task(f"t{i // 3}"), i // 3, ids, act, [-1.0] * len(ids), rewards, len(prompt), ["stop"]))
    return Batch.from_episodes(episodes, tok.pad_token_id)


@pytest.mark.parametrize("arch", ["llama", "llama-eager", "qwen2"])
def test_shared_prefixes_give_the_one_pass_logprobs_and_gradients(arch):
    """A group's prompt run once (prefix pass + suffix pass over a KV cache) is the same function as one
    pass over the padded batch: log-probs, entropy and every gradient agree to float32 rounding."""
    if arch == "qwen2":  # biased q/k/v projections, grouped-query attention
        from transformers import Qwen2Config, Qwen2ForCausalLM

        tok = build_tokenizer()
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, intermediate_size=64))
    else:
        model, tok = _tiny()
        if arch == "llama-eager":
            model.config._attn_implementation = "eager"
    batch = _multi_turn_batch(tok)
    results = []
    for share in (True, False):
        model.zero_grad()
        lp, ent, _ = token_logprobs_and_entropy(model, batch.input_ids, batch.attention_mask, mask=batch.action_mask,
                                                chunk_size=5, share_prefixes=share)
        ((lp * torch.linspace(-1, 1, lp.shape[1])).sum() + 0.1 * ent.sum()).backward()
        results.append((lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp_s, ent_s, g_s), (lp_p, ent_p, g_p) = results
    assert torch.allclose(lp_s, lp_p, atol=1e-5) and torch.allclose(ent_s, ent_p, atol=1e-5)
    assert bool((lp_s[batch.action_mask.bool()] < 0).all()) and bool((lp_s[~batch.action_mask.bool()] == 0).all())
    for n in g_p:
        assert torch.allclose(g_s[n], g_p[n], rtol=1e-4, atol=1e-5), n


def test_shared_prefixes_never_hand_attention_a_fully_masked_query():
    """Some attention kernels (CUDA's among them) return NaN for a query whose every key is masked; a
    masked key's NaN value still poisons ``0 · NaN``. The one-pass batch (right-padded) never has such a
    query, and neither may the prefix pass: under an attention that NaNs them, both paths agree."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def strict_sdpa(module, query, key, value, attention_mask, **kw):
        out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kw)
        if attention_mask is not None:  # [B, 1, Q, K]; out is [B, Q, heads, D]
            allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask > -1e30
            dead = ~allowed.any(-1)  # [B, 1, Q]
            out = out.masked_fill(dead.transpose(1, 2)[..., None], float("nan"))
        return out, weights

    AttentionInterface.register("llmgym_strict_sdpa", strict_sdpa)
    AttentionMaskInterface.register("llmgym_strict_sdpa", sdpa_mask)
    model, tok = _tiny()
    model.config._attn_implementation = "llmgym_strict_sdpa"
    batch = _multi_turn_batch(tok)  # prompts of unequal lengths: the prefix pass pads
    lp_s, _, _ = token_logprobs_and_entropy(model, batch.input_ids, batch.attention_mask, mask=batch.action_mask,
                                            chunk_size=5, share_prefixes=True)
    lp_p, _, _ = token_logprobs_and_entropy(model, batch.input_ids, batch.attention_mask, mask=batch.action_mask,
                                            chunk_size=5, share_prefixes=False)
    assert bool(torch.isfinite(lp_p).all()) and torch.allclose(lp_s, lp_p, atol=1e-5)
    from llmgym.agents.shared_prefix import supports_shared_prefixes

    assert not supports_shared_prefixes(model)  # an attention implementation the split was not tested with
    model.config._attn_implementation = "sdpa"
    assert supports_shared_prefixes(model)


def test_the_learner_runs_each_groups_prompt_once():
    """The tokens the model embeds: with prefix sharing each group's prompt once, not once per sample;
    the same update either way. Off under gradient checkpointing (its layers drop the KV cache) and for a
    value head's hidden states (PPO)."""
    from llmgym.agents.shared_prefix import shared_prefixes

    model, tok = _tiny()
    batch = _multi_turn_batch(tok)
    seen = []
    agent = GRPO(model, tok, group_size=3, kl_coef=0.0)
    agent.forward(batch)  # the first forward also checks the head's logit transform once (a 5-token probe)
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(i[0].numel()))
    agent.forward(batch)
    split = shared_prefixes(batch.input_ids, batch.attention_mask, batch.action_mask.bool())
    assert len(seen) == 2 and split.prefix_ids.shape[0] == 3  # a prefix pass over 3 prompts, then the suffixes
    assert sum(seen) < batch.input_ids.numel() - split.saved_tokens // 2
    seen.clear()
    agent.learner.share_prefixes = False
    agent.forward(batch)
    assert seen == [batch.input_ids.numel()]
    seen.clear()
    agent.learner.share_prefixes = True
    agent.forward(batch, with_values=True)  # hidden states of every position: one pass
    assert len(seen) == 1
    hook.remove()
    shared, _, _ = _update(group_size=2)
    model_p, tok_p = _tiny()
    plain = GRPO(model_p, tok_p, group_size=GROUP, kl_coef=0.0, max_new_tokens=8, entropy_coef=0.01)
    plain.learner.share_prefixes = False
    plain.optimizer = torch.optim.SGD(plain.parameters(), lr=0.5)
    plain.update(_fixed_batch(tok_p))
    _assert_same_state(shared, {k: v.detach() for k, v in model_p.state_dict().items()})


@pytest.mark.parametrize("lora", [False, True])
def test_shared_prefixes_under_autocast_cast_each_weight_once_and_keep_the_gradients_bit_for_bit(lora, monkeypatch):
    """Under bf16 autocast the prefix and suffix passes share one bf16 cast of each linear weight: backward
    keeps one copy of them, as the one-pass forward does, not two; and the log-probs and every gradient
    are the same bits as with a cast per pass (each pass's gradient reaches the weight in float32)."""
    import llmgym.agents.shared_prefix as sp

    model, tok = _tiny()
    if lora:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM",
                                                           init_lora_weights=False))
    batch = _multi_turn_batch(tok)
    linear = {(tuple(m.weight.shape)) for m in model.modules() if type(m) is torch.nn.Linear}
    head = tuple(model.get_output_embeddings().weight.shape)

    def run(share, cast_once):
        monkeypatch.setattr(sp, "cast_linear_weights_once", sp.cast_linear_weights_once if cast_once else lambda m: m)
        model.zero_grad()
        copies = {}

        def pack(t):  # the bf16 weight-shaped tensors backward keeps (the head's tiles are recomputed)
            if t.dtype == torch.bfloat16 and tuple(t.shape) in linear | {head[::-1]} and tuple(t.shape) != head:
                copies[id(t.untyped_storage())] = t.untyped_storage()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            lp, ent, _ = token_logprobs_and_entropy(model, batch.input_ids, batch.attention_mask,
                                                    mask=batch.action_mask, chunk_size=5, share_prefixes=share)
        ((lp * torch.linspace(-1, 1, lp.shape[1])).sum() + 0.1 * ent.sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return lp.detach(), grads, sum(st.nbytes() for st in copies.values())

    once, per_pass, one_pass = run(True, True), run(True, False), run(False, True)
    assert torch.equal(once[0], per_pass[0])
    assert once[1].keys() == per_pass[1].keys() and all(torch.equal(once[1][n], per_pass[1][n]) for n in once[1])
    assert 0 < once[2] == one_pass[2] and per_pass[2] > 1.5 * once[2]  # one bf16 copy of the weights, not two


def test_cast_linear_weights_once_sums_a_tied_weights_uses_in_float32():
    """A weight two linear layers share gets one cast but a gradient node per use: the uses' gradients
    add up in float32 at the weight, as autocast's per-use casts' do (not in bf16 first)."""
    from llmgym.agents.shared_prefix import cast_linear_weights_once

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))

    grads = []
    for once in (False, True):
        torch.manual_seed(0)
        m, x = Tied(), torch.randn(5, 8)
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            f = cast_linear_weights_once(m) if once else m
            y = f(x) + f(x)
        (y.float() * torch.linspace(-1, 1, 8)).sum().backward()
        grads.append(m.a.weight.grad)
    assert torch.equal(grads[0], grads[1])
    m = torch.nn.Linear(2, 2).double()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert cast_linear_weights_once(m) is m  # float64: autocast leaves it alone, so does this


def test_right_padded_rows_share_one_row_of_positions():
    """Right-padded rows get one ``[1, L]`` row of positions (one row of rotary cos/sin saved for
    backward, not N), with the same log-probs as per-row positions; left padding keeps per-row ones."""
    from llmgym.agents import learner as L

    model, tok = _tiny()
    batch = _multi_turn_batch(tok)  # right-padded, rows of unequal lengths
    assert tuple(L._position_ids(batch.attention_mask).shape) == (1, batch.input_ids.shape[1])
    per_row = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    got, _, _ = token_logprobs_and_entropy(model, batch.input_ids, batch.attention_mask, mask=batch.action_mask)
    want = model(batch.input_ids, attention_mask=batch.attention_mask, position_ids=per_row).logits[:, :-1]
    want = torch.log_softmax(want.float(), -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0] * batch.action_mask
    assert torch.allclose(got, want, atol=1e-5)
    left = torch.tensor([[0, 1, 1], [1, 1, 1]])
    assert L._position_ids(left).tolist() == [[0, 0, 1], [0, 1, 2]]


def test_the_forward_outputs_are_released_before_backward():
    """The forward's ``[N, L-1]`` log-probs and entropy are not held through backward (its graph keeps
    what backward needs): TRL's step holds none at its backward either."""
    import weakref

    model, tok = _tiny()
    agent = GRPO(model, tok, group_size=GROUP, kl_coef=0.0, max_new_tokens=8)  # entropy_coef 0: the loss ignores H
    outputs, alive = [], []
    forward = agent.forward

    def recording(*args, **kwargs):
        out = forward(*args, **kwargs)
        outputs.append(weakref.ref(out.entropy))
        return out

    agent.forward = recording
    next(iter(model.parameters())).register_hook(lambda g: alive.append(outputs[-1]() is not None))
    agent.update(_fixed_batch(tok))
    assert alive == [False]


def test_shared_prefixes_decline_batches_they_cannot_split():
    from llmgym.agents.shared_prefix import shared_prefixes, supports_shared_prefixes

    ids = torch.tensor([[1, 5, 6, 7], [1, 5, 6, 8]])
    attn = torch.ones_like(ids)
    select = torch.tensor([[0, 1, 1], [0, 1, 1]]).bool()
    assert shared_prefixes(ids, attn, select).saved_tokens == 1  # the prefix [1], run once instead of twice
    assert shared_prefixes(ids, torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]), select) is None  # left padding
    assert shared_prefixes(ids, attn, torch.tensor([[0, 1, 1], [0, 0, 0]]).bool()) is None  # a row reads nothing
    assert shared_prefixes(ids, attn, torch.tensor([[1, 1, 1], [0, 1, 1]]).bool()) is None  # nothing before
    model, _ = _tiny()
    assert supports_shared_prefixes(model)
    from transformers import MistralConfig, MistralForCausalLM

    sliding = MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                               num_key_value_heads=2, intermediate_size=32, sliding_window=8))
    assert not supports_shared_prefixes(sliding)  # a sliding-window cache: one pass


# ---------------------------------------------------------------------------------------------
# micro-batches with gradient accumulation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("micro", [1, 3])
def test_micro_batches_accumulate_the_full_batch_gradient(mode, micro):
    full, full_metrics, _ = _update(loss_agg=mode)
    acc, acc_metrics, _ = _update(loss_agg=mode, micro_batch_size=micro)
    initial = _tiny()[0].state_dict()
    assert max(float((full[k] - initial[k]).abs().max()) for k in full) > 1e-3, "the update should move"
    _assert_same_state(acc, full)
    assert abs(acc_metrics["loss"] - full_metrics["loss"]) < 1e-5
    assert abs(acc_metrics["grad_norm"] - full_metrics["grad_norm"]) < 1e-4


@pytest.mark.parametrize("name,mode", [("dapo", "token-mean"), ("ppo", "token-mean"), ("rloo", "seq-mean-token-sum"),
                                       ("reinforce++", "token-mean")])
def test_micro_batches_match_for_other_agents(name, mode):
    """DAPO masks truncated completions out of the token count; PPO adds a value loss."""
    full, _, _ = _update(name, loss_agg=mode, minibatch_size=None, update_epochs=1)
    acc, _, _ = _update(name, loss_agg=mode, minibatch_size=None, update_epochs=1, micro_batch_size=3)
    _assert_same_state(acc, full)


def _off_policy_update(name, seed=0, **config):
    """Two epochs of minibatches (four optimiser steps; one for DPO, which takes no minibatches), KL on,
    π_old = the starting policy's log-probs plus seeded noise (an engine whose kernels differ): ratios
    move away from 1 on both sides of the clip range, and π moves away from π_ref after the first step."""
    model, tok = _tiny(seed)
    batch = _fixed_batch(tok)
    with torch.no_grad():
        start, _, _ = token_logprobs_and_entropy(model, batch.input_ids, batch.attention_mask, mask=batch.action_mask)
    noise = 0.3 * torch.randn(start.shape, generator=torch.Generator().manual_seed(7))
    batch.old_logprobs = (start + noise) * batch.action_mask
    batch.baseline_rewards = torch.full((len(batch),), 0.25)  # ReMax's greedy-sample reward
    minibatch = None if name == "dpo" else 4
    config = {"kl_coef": 0.05, "max_new_tokens": 8, "group_size": GROUP, "max_grad_norm": 1.0, "update_epochs": 2,
              "minibatch_size": minibatch, **config}
    if name != "dpo":
        config["entropy_coef"] = 0.01
    if name == "distill":
        config["teacher"] = "tiny"  # a frozen teacher with the same tokenizer grades the fixed batch
    agent = AGENTS[name](model, tok, **config)
    agent.optimizer = torch.optim.SGD(agent.parameters(), lr=0.1)
    metrics = agent.update(batch)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics


@pytest.mark.parametrize("micro", [1, 3])
@pytest.mark.parametrize("name", sorted(AGENTS))
def test_every_agent_accumulates_micro_batches_exactly_off_policy(name, micro):
    """Micro-batches (completions; pairs for DPO) give the minibatch's update for every registered agent,
    with ratios away from 1, clipping, and the KL term live."""
    full, full_metrics = _off_policy_update(name)
    acc, acc_metrics = _off_policy_update(name, micro_batch_size=micro)
    initial = _tiny()[0].state_dict()
    assert max(float((full[k] - initial[k]).abs().max()) for k in full) > 1e-3, "the update should move"
    assert abs(full_metrics["kl"]) > 1e-4, "the KL term should be live (π moved away from π_ref)"
    if name != "dpo":  # DPO reads no π_old
        assert full_metrics["approx_kl_old_k3"] > 1e-3, "π_old should differ from π"
    _assert_same_state(acc, full, atol=2e-6)
    assert acc_metrics["loss"] == pytest.approx(full_metrics["loss"], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("loss_type,smoothing", [("ipo", 0.0), ("hinge", 0.0), ("sigmoid", 0.2)])
def test_dpo_micro_batches_are_exact_for_every_preference_loss(loss_type, smoothing):
    full, _ = _off_policy_update("dpo", loss_type=loss_type, label_smoothing=smoothing)
    acc, _ = _off_policy_update("dpo", loss_type=loss_type, label_smoothing=smoothing, micro_batch_size=3)
    _assert_same_state(acc, full, atol=2e-6)


def test_dpo_micro_batches_hold_whole_pairs():
    _, tok = _tiny()
    batch = _fixed_batch(tok)
    assert [len(p) for p in micro_batches(batch, 3, rows_per_example=2)] == [6, 2]
    assert [len(p) for p in micro_batches(batch, 1, rows_per_example=2)] == [2, 2, 2, 2]
    with pytest.raises(ValueError, match="whole examples of 2 rows"):
        micro_batches(batch.select(range(7)), 1, rows_per_example=2)


def test_micro_batches_inside_minibatches():
    """minibatch_size = rows per optimiser step; micro_batch_size = rows per backward."""
    two_steps, _, _ = _update(minibatch_size=4)
    accumulated, _, _ = _update(minibatch_size=4, micro_batch_size=1)
    _assert_same_state(accumulated, two_steps)
    one_step, _, _ = _update()
    assert any(not torch.allclose(two_steps[k], one_step[k], atol=1e-5) for k in one_step)


def test_ppo_micro_batches_need_token_mean():
    with pytest.raises(ValueError, match="token-mean"):
        _update("ppo", loss_agg="seq-mean-token-mean", micro_batch_size=2, minibatch_size=None)


def test_micro_batches_split_in_order():
    _, tok = _tiny()
    batch = _fixed_batch(tok)
    parts = micro_batches(batch, 3)
    assert [len(p) for p in parts] == [3, 3, 2]
    assert torch.equal(torch.cat([p.input_ids for p in parts]), batch.input_ids)


# ---------------------------------------------------------------------------------------------
# precision, gradient checkpointing
# ---------------------------------------------------------------------------------------------


def test_bf16_mixed_autocasts_over_float32_master_weights():
    fp32, _, _ = _update()
    mixed, metrics, agent = _update(precision="bf16-mixed")
    assert all(p.dtype == torch.float32 for p in agent.model.parameters())
    assert all(v.dtype == torch.float32 for v in mixed.values() if v.is_floating_point())
    # the forward ran in bf16: close to float32, not equal
    batch = _fixed_batch(agent.tokenizer)
    out_mixed = agent.forward(batch)
    agent.config.precision = "fp32"
    out_fp32 = agent.forward(batch)
    diff = float((out_mixed.logprobs - out_fp32.logprobs).detach().abs().max())
    assert 0 < diff < 0.1
    assert metrics["loss"] == metrics["loss"]  # finite
    initial = _tiny()[0].state_dict()
    moved = {k: (mixed[k] - initial[k]).abs().max() for k in initial}
    assert max(float(v) for v in moved.values()) > 1e-3


def test_bf16_weights_are_an_explicit_choice():
    state, metrics, agent = _update(precision="bf16")
    assert all(p.dtype == torch.bfloat16 for p in agent.model.parameters())
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    fp32, _, _ = _update()
    # a bf16 step lands near the float32 step
    for k in fp32:
        assert torch.allclose(state[k].float(), fp32[k], atol=0.05), k


def test_gradient_checkpointing_gives_the_same_update():
    plain, _, _ = _update(micro_batch_size=3)
    ckpt, _, agent = _update(micro_batch_size=3, gradient_checkpointing=True)
    assert getattr(agent.model, "is_activation_checkpointing", None) or agent.model.is_gradient_checkpointing
    _assert_same_state(ckpt, plain)


# ---------------------------------------------------------------------------------------------
# LoRA: the reference is the base model with the adapters disabled
# ---------------------------------------------------------------------------------------------


def test_lora_trains_adapters_and_scores_the_reference_without_a_copy():
    pytest.importorskip("peft")
    model, tok = _tiny()
    batch = _fixed_batch(tok)
    with torch.no_grad():
        base_lp, _, _ = token_logprobs_and_entropy(model, batch.input_ids, batch.attention_mask, mask=batch.action_mask)
    base_weights = {k: v.clone() for k, v in model.state_dict().items()}
    agent = GRPO(model, tok, group_size=GROUP, kl_coef=0.1, lora_r=4, lr=0.05, max_new_tokens=8)
    assert agent.ref_model is None and agent.has_reference
    trained = agent.parameters()
    assert trained and all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    assert sum(p.numel() for p in trained) < 0.5 * sum(p.numel() for p in model.parameters())
    for _ in range(3):
        metrics = agent.update(_fixed_batch(tok))
    # the policy moved ...
    with torch.no_grad():
        policy_lp = agent.forward(batch.to(agent.device)).logprobs
        ref_lp = agent.reference_logprobs(batch)
    assert float((policy_lp - base_lp).abs().max()) > 1e-3
    assert metrics["kl"] > 0
    # ... the reference is still the base model, and the base weights are untouched
    assert torch.allclose(ref_lp, base_lp, atol=1e-6)
    for k, v in model.state_dict().items():
        name = k.replace(".base_layer", "").replace("base_model.model.", "")
        if "lora_" not in k and name in base_weights:
            assert torch.equal(v, base_weights[name]), k


def test_every_lora_option_is_the_one_peft_uses():
    pytest.importorskip("peft")
    model, tok = _tiny()
    agent = GRPO(model, tok, group_size=GROUP, kl_coef=0.1, lora_r=4, lora_alpha=12, lora_dropout=0.1,
                 lora_target_modules=("q_proj", "v_proj"))
    lora = agent.learner.peft_model.peft_config["default"]
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (4, 12, 0.1)
    assert set(lora.target_modules) == {"q_proj", "v_proj"}
    adapted = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if hasattr(m, "lora_A")}
    assert adapted == {"q_proj", "v_proj"}
    dropouts = [m.lora_dropout["default"] for m in model.modules() if hasattr(m, "lora_dropout")]
    assert dropouts and all(isinstance(d, torch.nn.Dropout) and d.p == 0.1 for d in dropouts)
    assert all(m.scaling["default"] == 12 / 4 for m in model.modules() if hasattr(m, "lora_A"))
    # the dropout acts in training forwards only (the engine samples in eval mode, without it)
    for m in model.modules():  # make the adapters non-zero, so that dropping their input shows
        if hasattr(m, "lora_B"):
            torch.nn.init.normal_(m.lora_B["default"].weight, std=1.0)
    batch = _fixed_batch(tok)
    model.train()
    assert not torch.equal(agent.forward(batch).logprobs, agent.forward(batch).logprobs)
    model.eval()
    assert torch.equal(agent.forward(batch).logprobs, agent.forward(batch).logprobs)
    # defaults: alpha = 2·r, every linear layer, no dropout
    default = GRPO(_tiny()[0], tok, group_size=GROUP, lora_r=2).learner.peft_model.peft_config["default"]
    assert (default.r, default.lora_alpha, default.lora_dropout) == (2, 4, 0.0)


def test_lora_agent_learns_through_its_engine():
    pytest.importorskip("peft")
    import gymnasium

    import llmgym  # noqa: F401  (registers the envs)

    model, tok = _tiny()
    agent = GRPO(model, tok, tasks_per_step=2, group_size=GROUP, max_new_tokens=4, kl_coef=0.05, lora_r=2)
    row = agent.learn(gymnasium.make("llmgym/Copy-v0", tokenizer=tok), steps=1)[0]
    assert row["step"] == 1 and row["kl"] == row["kl"]


# ---------------------------------------------------------------------------------------------
# learning-rate schedule
# ---------------------------------------------------------------------------------------------


def test_warmup_then_cosine_decay():
    model, tok = _tiny()
    agent = GRPO(model, tok, group_size=GROUP, kl_coef=0.0, lr=1e-2, lr_warmup_steps=2,
                 lr_schedule="cosine", lr_total_steps=6)
    lrs = [agent.update(_fixed_batch(tok))["lr"] for _ in range(6)]
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(5e-3) and lrs[2] == pytest.approx(1e-2)
    assert lrs[2] > lrs[3] > lrs[4] > lrs[5] > 0
    # the schedule resumes from a checkpoint
    state = agent.state_dict()
    other = GRPO(_tiny()[0], tok, group_size=GROUP, kl_coef=0.0, lr=1e-2, lr_warmup_steps=2,
                 lr_schedule="cosine", lr_total_steps=6)
    other.load_state_dict(state)
    assert other.optimizer.param_groups[0]["lr"] == pytest.approx(agent.optimizer.param_groups[0]["lr"])


def test_constant_lr_has_no_scheduler():
    _, metrics, agent = _update()
    assert agent.learner.scheduler is None and metrics["lr"] == 0.5


@pytest.mark.parametrize("bad,match", [
    ({"precision": "fp16"}, "precision"), ({"micro_batch_size": 0}, "micro_batch_size"),
    ({"lr_schedule": "cosine"}, "lr_total_steps"), ({"lr_schedule": "step"}, "lr_schedule"),
    ({"lora_r": -1}, "lora_r"), ({"logits_chunk_size": -1}, "logits_chunk_size"),
])
def test_bad_learner_settings_are_named(bad, match):
    model, tok = _tiny()
    with pytest.raises(ValueError, match=match):
        GRPO(model, tok, **bad)


def test_device_defaults_on_this_machine():
    d = resolve_device_defaults()
    assert d["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        assert d == {"device": "cpu", "precision": "fp32", "engine_decode": "static"}
    assert resolve_device_defaults("cuda", "fp32", "static") == {"device": "cuda", "precision": "fp32",
                                                                 "engine_decode": "static"}


# ---------------------------------------------------------------------------------------------
# the objective in one place; the learner on the agent's public interface
# ---------------------------------------------------------------------------------------------


def test_the_learner_reads_no_private_name_of_the_agent():
    """``Learner`` drives any agent through its public methods (a subclass need not know the learner)."""
    import ast
    from pathlib import Path

    import llmgym.agents.learner as learner_module

    tree = ast.parse(Path(learner_module.__file__).read_text())
    private = sorted({f"agent.{n.attr}" for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                      and isinstance(n.value, ast.Name) and n.value.id == "agent" and n.attr.startswith("_")})
    assert private == []


@pytest.mark.parametrize("name", ["grpo", "dapo", "rloo", "reinforce", "reinforce++", "sapo"])
def test_each_agents_loss_is_its_formula_composed_by_hand(name):
    """The whole objective of the agent, rebuilt from functional.py's pieces: agg(ℓ_pg + β·KL − c_H·H)."""
    from llmgym.agents import functional as F

    model, tok = _tiny()
    extra = {"group_size": GROUP} if name in ("grpo", "dapo", "rloo", "sapo") else {}
    agent = AGENTS[name](model, tok, max_new_tokens=8, kl_coef=0.05, kl_placement="loss", entropy_coef=0.01, **extra)
    batch = agent.prepare(_fixed_batch(tok))
    torch.manual_seed(1)
    batch.old_logprobs = agent.forward(batch).logprobs.detach() + 0.1 * torch.randn_like(batch.old_logprobs)
    out = agent.forward(batch)
    loss, _ = agent.loss(batch, out)
    c, mask = agent.config, agent.loss_mask(batch)
    if name in ("rloo", "reinforce"):
        pg = -batch.advantages * out.logprobs
    elif name == "sapo":
        pg, _ = F.sapo_loss(out.logprobs, batch.old_logprobs, batch.advantages, c.tau_pos, c.tau_neg, mask=batch.action_mask)
    else:
        ratio = torch.exp(out.logprobs - batch.old_logprobs)
        pg = -torch.minimum(ratio * batch.advantages, ratio.clamp(1 - c.clip_low, 1 + c.clip_high) * batch.advantages)
    kl = F.kl_estimate(out.logprobs, batch.ref_logprobs, c.kl_estimator, batch.action_mask)
    expected = F.aggregate_loss(pg + 0.05 * kl - 0.01 * out.entropy, mask, c.loss_agg,
                                **({"normalizer": c.loss_normalizer or c.max_new_tokens} if hasattr(c, "loss_normalizer") else {}))
    assert torch.allclose(loss, expected, rtol=1e-5, atol=1e-7)


def test_a_checkpoint_round_trips_in_the_library_and_a_damaged_one_is_a_typed_error(tmp_path):
    """Checkpoints are the library's (``llmgym.train.checkpoint``), not the command line's."""
    from llmgym.train.checkpoint import CheckpointError, checkpoint_step, load_checkpoint, save_checkpoint

    model, tok = _tiny()
    agent = GRPO(model, tok, group_size=GROUP, max_new_tokens=8, kl_coef=0.0)
    agent.update(_fixed_batch(tok))
    folder = save_checkpoint(agent, tok, tmp_path / "last")
    other = GRPO(_tiny(seed=1)[0], tok, group_size=GROUP, max_new_tokens=8, kl_coef=0.0)
    load_checkpoint(other, folder)
    assert checkpoint_step(folder) == other.step_count == 1
    for (name, a), b in zip(agent.model.state_dict().items(), other.model.state_dict().values()):
        assert torch.equal(a, b), name
    (folder / "agent.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read the checkpoint"):
        load_checkpoint(other, folder)
