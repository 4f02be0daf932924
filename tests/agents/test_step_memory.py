"""What one GRPO step keeps in memory, and where it peaks (issue 23: lighter than TRL).

The timeline itself is ``benchmarks/memory_timeline.py`` (smoke-tested here on the tiny model on
CPU); these tests pin the terms it found that TRL's trainer does not pay."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llmgym import SequenceEnv, Task
from llmgym.agents import GRPO
from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer

ROOT = Path(__file__).resolve().parents[2]
SMALL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def _env(tok):
    return SequenceEnv(lambda rng: Task(f"{int(rng.integers(10))}+1="),
                       lambda task, text: sum(c.isdigit() for c in text) / max(1, len(text)), tok)


def _agent(**kw):
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tok, SMALL)
    return GRPO(model, tok, tasks_per_step=2, group_size=2, max_new_tokens=4, lr=1e-2, **kw), tok


def test_gradients_are_released_after_the_update():
    agent, tok = _agent(micro_batch_size=1)
    agent.update(agent.collect(_env(tok)))
    assert all(p.grad is None for p in agent.model.parameters())  # the next rollout does not carry them
    assert agent.optimizer.state  # the step did happen


def test_optimizer_is_fused_adamw_and_optimises_what_the_for_loop_does():
    agent, tok = _agent()
    assert agent.optimizer.defaults["fused"] is True
    twin, _ = _agent()
    twin.optimizer = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.0, foreach=False, fused=False)
    env = _env(tok)
    for _ in range(2):  # the second step reads the first step's moments
        batch = agent.collect(env)
        twin_batch = twin.collect(env)
        assert torch.equal(batch.input_ids, twin_batch.input_ids)
        agent.update(batch)
        twin.update(twin_batch)
    moved = [(a - b).abs().max().item() for a, b in zip(agent.model.parameters(), twin.model.parameters())]
    assert max(moved) < 1e-5
    start, _ = _agent()
    assert any(not torch.equal(a, b) for a, b in zip(agent.model.parameters(), start.model.parameters()))


def test_sharded_or_odd_parameters_keep_the_default_adamw():
    agent, _ = _agent()
    opt = agent.learner.make_optimizer([torch.nn.Parameter(torch.zeros(2, dtype=torch.float64)),
                                        torch.nn.Parameter(torch.zeros(2, device="meta"))])
    assert not opt.defaults.get("fused")


def test_static_decoding_frees_its_kv_cache_between_calls():
    """Uncompiled static decoding keeps no KV cache once ``generate`` returns (the update runs
    without it); the compiled step keeps its cache (its graph is specialised to those tensors)."""
    from llmgym.engines import HFEngine, SamplingParams

    tok = build_tokenizer()
    model = build_tiny_model(tok, SMALL)
    engine = HFEngine(model, tok, decode="static")
    params = SamplingParams(n=2, max_new_tokens=5, seed=1)
    first = engine.generate([tok.encode("12+3=")], params)
    assert engine._static._caches == {} and engine._static._mask is None
    again = engine.generate([tok.encode("12+3=")], params)
    assert [c.token_ids for c in first[0]] == [c.token_ids for c in again[0]]


def test_memory_timeline_reports_every_phase_on_cpu(tmp_path):
    # In a fresh process, as the benchmark runs: the CPU trace is replayed from the allocator's events, and after
    # other tests in the same process (tests/interop/test_interop_verifiers.py, seen in one pytest-xdist worker)
    # the model's weights were missing from it (start at 8.26 MiB = the Adam moments alone).
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "memory_timeline.py"), "--model", "tiny",
                           "--tasks", "2", "--group", "2", "--new-tokens", "4", "--micro-batch-size", "2",
                           "--threads", "1", "--time-steps", "2", "--json", str(tmp_path / "t.json")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "t.json").read_text())
    phases = [r["phase"] for r in report["phases"]]
    assert phases == ["start", "rollout", "prepare", "zero_grad", "forward[0]", "loss[0]", "backward[0]",
                      "between[1]", "forward[1]", "loss[1]", "backward[1]", "clip_grad", "optimizer_step",
                      "sync_weights"]
    by = {r["phase"]: r for r in report["phases"]}
    kept = report["kept"]
    weights = report["weights_mib"]
    # steady state: weights and both Adam moments live; no gradients, no KV cache carried into the step
    assert kept["start"]["weights"] == pytest.approx(weights, rel=1e-3)
    assert kept["start"]["optimizer_state"] == pytest.approx(2 * weights, rel=1e-2)
    assert kept["start"]["grads"] == 0 and kept["start"]["engine_cache"] == 0 and kept["end"]["grads"] == 0
    # the CPU allocation trace agrees with the live tensors it starts from ("other" also holds tensors
    # that earlier tests in the same process left alive: not part of this step)
    step_kinds = sum(v for kind, v in kept["start"].items() if kind != "other")
    assert by["start"]["allocated_mib"] == pytest.approx(step_kinds, abs=0.05)
    # a forward holds activations, its backward releases them and leaves the gradients
    for i in (0, 1):
        assert by[f"forward[{i}]"]["delta_mib"] > 0
        assert by[f"backward[{i}]"]["peak_mib"] >= by[f"forward[{i}]"]["allocated_mib"]
    assert by["backward[1]"]["allocated_mib"] == pytest.approx(by["start"]["allocated_mib"] + weights, abs=0.05)
    # gradients released after the step: the step ends where it started
    assert report["terms"]["kept_after_step_mib"] == pytest.approx(0, abs=0.05)
    assert report["terms"]["step_peak_mib"] == max(r["peak_mib"] for r in report["phases"])
    assert report["micro_batches"] == 2 and (tmp_path / "t.json").exists()
    # --time-steps: more whole steps after the measured one, timed (the GPU preset's step ratio)
    timed = report["timed_steps"]
    assert len(timed["step_s"]) == len(timed["rollout_s"]) == 2 and timed["steps_run"] == 2
    assert all(0 < r < s for r, s in zip(timed["rollout_s"], timed["step_s"]))


def test_memory_timeline_measures_trl_with_the_same_instrument(tmp_path):
    pytest.importorskip("trl", reason="TRL is the benchmark-only extra: the bench extra")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import memory_timeline

    report = memory_timeline.main(["--side", "trl", "--model", "tiny", "--tasks", "2", "--group", "2",
                                   "--new-tokens", "4", "--micro-batch-size", "2", "--threads", "1"])
    phases = [r["phase"] for r in report["phases"]]
    assert phases == ["start", "rollout", "forward+loss[0]", "backward[0]", "between[1]", "forward+loss[1]",
                      "backward[1]", "clip_grad", "optimizer_step", "zero_grad"]
    weights = report["weights_mib"]
    # TRL's steady state is llmgym's: weights and both Adam moments, nothing else
    assert report["kept"]["start"]["optimizer_state"] == pytest.approx(2 * weights, rel=1e-2)
    assert report["kept"]["start"]["grads"] == 0 and report["kept"]["end"]["grads"] == 0


# ---------------------------------------------------------------------------------------------
# the log-prob head: nothing of the logits' size outlives the backward (issue 28)
# ---------------------------------------------------------------------------------------------

VOCAB, ROWS, COMPLETION, CHUNK = 8192, 8, 32, 16


class _WrappedHead(torch.nn.Linear):
    """A head that is not a plain ``nn.Linear`` (as a LoRA-wrapped one): the module fallback path."""


def _big_vocab_model(wrapped_head: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, intermediate_size=32, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    if wrapped_head:
        head = _WrappedHead(16, VOCAB, bias=False)
        head.weight = model.model.embed_tokens.weight
        model.lm_head = head
    return model


def _traced_forward_backward(model, reads_entropy: bool, chunk: int = CHUNK):
    """(MiB at the marks relative to "start", peak MiB per phase, gradient MiB) of one forward/backward
    of the chunked head, ``out`` (the log-probs and their graph) still alive after the backward."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from memory_timeline import PhaseRecorder

    from llmgym.agents.learner import token_logprobs_and_entropy

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (ROWS, 1 + COMPLETION), generator=g)
    attention = torch.ones_like(ids)
    mask = torch.ones(ROWS, COMPLETION, dtype=torch.long)
    weights = torch.randn(ROWS, COMPLETION, generator=g)
    with PhaseRecorder("cpu") as rec:
        rec.mark("start")
        lp, ent, _ = token_logprobs_and_entropy(model, ids, attention, mask=mask, chunk_size=chunk)
        rec.mark("forward")
        loss = (weights * lp).sum() + (0.01 * ent.sum() if reads_entropy else 0)
        loss.backward()
        rec.mark("backward")
    rows = {r["phase"]: r for r in rec.rows()}
    start = rows["start"]["allocated_mib"]
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None) / 2**20
    return ({k: r["allocated_mib"] - start for k, r in rows.items()},
            {k: r["peak_mib"] - start for k, r in rows.items()}, grads, (lp, ent, loss))


@pytest.mark.parametrize("wrapped_head", [False, True], ids=["fused", "module-head"])
@pytest.mark.parametrize("reads_entropy", [False, True], ids=["no-entropy", "entropy"])
def test_nothing_of_the_logits_size_outlives_the_backward(wrapped_head, reads_entropy):
    """After ``backward`` (the loss and its graph still referenced, as in the learner until the
    optimiser step) what remains is the gradients: no ``[tokens, V]`` tensor. The checkpointed head
    kept two of them (the entropy's recomputed softmax and log-softmax, never unpacked when the loss
    did not read the entropy) until the graph died — 4.7 GB on the H100 run."""
    model = _big_vocab_model(wrapped_head)
    kept, peak, grads, alive = _traced_forward_backward(model, reads_entropy)
    logits_mib = ROWS * COMPLETION * VOCAB * 4 / 2**20  # one float32 [tokens, V] tensor: 8 MiB
    chunk_mib = CHUNK * VOCAB * 4 / 2**20  # 0.5 MiB
    assert kept["backward"] - grads < chunk_mib / 4, (kept, grads)
    # and no phase ever holds the batch's logits: a few chunks at most
    assert max(peak["forward"], peak["backward"] - grads) < logits_mib / 2, peak
    assert alive[2].grad_fn is not None  # the graph was alive when measured


def test_the_fused_head_keeps_no_logits_for_backward():
    """What the forward saves for backward is the head's input and a few floats per token, not logits."""
    from llmgym.agents.learner import token_logprobs_and_entropy

    model = _big_vocab_model()
    ids = torch.randint(3, VOCAB, (ROWS, 1 + COMPLETION), generator=torch.Generator().manual_seed(2))
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs_and_entropy(model, ids, torch.ones_like(ids), chunk_size=CHUNK)
    largest = max(n for ptr, n in saved.items() if ptr not in params)
    assert largest < CHUNK * VOCAB * 4 / 4, largest  # the biggest activation is far below one chunk's logits


def test_checkpointed_forward_keeps_what_the_backbone_keeps():
    """Gradient checkpointing + bf16 autocast, as the learner's micro-batch loop runs it (the forward
    inside the learner's autocast block): what stays allocated until backward is what the
    checkpointed backbone alone keeps plus the head's input ``[K, H]`` — no bf16 copies of the weights
    (autocast's weight cache held them until the block exited: 0.94 GiB of the Qwen2-0.5B shape's
    1.4 GiB "activations" on the H100, against TRL's 0.45), no logits."""
    from types import SimpleNamespace

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from memory_timeline import PhaseRecorder

    from llmgym.agents.base import AgentConfig
    from llmgym.agents.learner import Learner

    model = _big_vocab_model()
    learner = Learner(model, AgentConfig(precision="bf16-mixed", gradient_checkpointing=True))
    model.train()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, VOCAB, (ROWS, 1 + COMPLETION), generator=g)
    mask = torch.ones(ROWS, COMPLETION, dtype=torch.long)
    batch = SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids), action_mask=mask)
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    with PhaseRecorder("cpu") as rec:
        rec.mark("start")
        with learner.autocast():
            backbone = model.model(input_ids=ids, attention_mask=batch.attention_mask, position_ids=positions,
                                   use_cache=False).last_hidden_state
            rec.mark("backbone")
        del backbone
        rec.mark("released")
        with learner.autocast():  # the learner's loop: forward, then loss, inside one autocast block
            out = learner.forward(batch)
            rec.mark("learner")
    rows = {r["phase"]: r["allocated_mib"] for r in rec.rows()}
    backbone_kept = rows["backbone"] - rows["start"]
    learner_kept = rows["learner"] - rows["released"]
    head_input = ROWS * COMPLETION * 16 * 4 / 2**20
    outputs = 2 * ROWS * COMPLETION * 4 / 2**20  # log-probs and entropy, float32
    bf16_weights = sum(p.numel() for p in model.parameters()) * 2 / 2**20
    assert backbone_kept > 0 and out.logprobs.grad_fn is not None
    assert learner_kept <= backbone_kept + head_input + outputs + 0.02, (learner_kept, backbone_kept, bf16_weights)


def test_the_training_forward_computes_no_logits_outside_the_fused_head():
    """The learner runs the decoder stack under the head (``base_model``): the head module itself is never
    called (it computed one position's ``[N, V]`` logits and, under autocast, a bf16 copy of its weights)."""
    from llmgym.agents.learner import token_logprobs_and_entropy

    model = _big_vocab_model()
    calls = []
    ids = torch.randint(3, VOCAB, (ROWS, 1 + COMPLETION), generator=torch.Generator().manual_seed(4))
    token_logprobs_and_entropy(model, ids, torch.ones_like(ids), chunk_size=CHUNK)  # + the once-per-model head probe
    model.lm_head.register_forward_hook(lambda *_: calls.append(1))
    lp, _, _ = token_logprobs_and_entropy(model, ids, torch.ones_like(ids), chunk_size=CHUNK)
    lp.sum().backward()
    assert calls == [] and model.lm_head.weight.grad is not None
