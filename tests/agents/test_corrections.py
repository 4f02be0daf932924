"""Truncated importance sampling (``AgentConfig.tis``): the weight's formula and its use in ``Agent.update``."""

from __future__ import annotations

import copy
import math

import gymnasium
import pytest
import torch

import llmgym  # noqa: F401  (registers the envs)
from llmgym.agents import GRPO
from llmgym.agents.corrections import truncated_importance_weights


def test_token_and_sequence_weights():
    learner = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, 0.0]])
    engine = torch.tensor([[-2.0, -1.0, -0.5], [-2.1, -2.1, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    w = truncated_importance_weights(learner, engine, mask, "token", cap=2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, math.exp(-0.5)], [math.exp(0.1), math.exp(0.1), 0.0]]))
    w = truncated_importance_weights(learner, engine, mask, "sequence", cap=2.0)
    assert torch.allclose(w, torch.tensor([[math.exp(0.5)] * 3, [math.exp(0.2), math.exp(0.2), 0.0]]))
    assert not w.requires_grad
    with pytest.raises(ValueError):
        truncated_importance_weights(learner, engine, mask, "batch")
    with pytest.raises(ValueError):
        GRPO.config_class(tis="tokens")


def _agent_and_batch(model, tok, **kw):
    agent = GRPO(model, tok, tasks_per_step=2, group_size=4, max_new_tokens=6, kl_coef=0.0,
                 max_grad_norm=None, **kw)
    agent.optimizer = torch.optim.SGD(agent.parameters(), lr=0.1)  # the step is linear in the gradient
    return agent


def _delta(model, before):
    return {k: v.detach() - before[k] for k, v in model.state_dict().items()}


@pytest.fixture()
def collected(tiny_model, tokenizer):
    env = gymnasium.make("llmgym/Copy-v0", tokenizer=tokenizer)
    batch = _agent_and_batch(copy.deepcopy(tiny_model), tokenizer).collect(env)
    batch.rewards = torch.tensor([0.0, 1.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25])  # a random model earns none
    return batch


def _run(tiny_model, tokenizer, batch, shift: float = 0.0, **kw):
    model = copy.deepcopy(tiny_model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = copy.deepcopy(batch)
    batch.old_logprobs = batch.old_logprobs - shift * batch.action_mask  # the "engine's" log-probs
    metrics = _agent_and_batch(model, tokenizer, **kw).update(batch)
    return _delta(model, before), metrics


def test_hf_engine_weights_are_one(tiny_model, tokenizer, collected):
    plain, _ = _run(tiny_model, tokenizer, collected)
    for level in ("token", "sequence"):
        corrected, metrics = _run(tiny_model, tokenizer, collected, tis=level)
        assert abs(metrics["correction_weight_mean"] - 1.0) < 1e-3 and metrics["correction_truncated_share"] == 0.0
        for k in plain:
            assert torch.allclose(corrected[k], plain[k], atol=1e-6, rtol=1e-3)


def test_truncated_weight_scales_the_policy_gradient(tiny_model, tokenizer, collected):
    """The engine claims every token 1 nat less likely: ratio e ≈ 2.72, truncated to C = 2 — the step
    (SGD, on-policy, no KL/entropy/clipping) is exactly twice the uncorrected one."""
    plain, _ = _run(tiny_model, tokenizer, collected)
    corrected, metrics = _run(tiny_model, tokenizer, collected, shift=1.0, tis="token", tis_cap=2.0)
    assert metrics["correction_truncated_share"] == 1.0 and abs(metrics["correction_weight_mean"] - 2.0) < 1e-4
    for k in plain:
        assert torch.allclose(corrected[k], 2 * plain[k], atol=1e-6, rtol=1e-3)
    off, _ = _run(tiny_model, tokenizer, collected, shift=1.0)  # without TIS the engine's numbers are unused
    for k in plain:
        assert torch.allclose(off[k], plain[k], atol=1e-7)


def test_off_policy_updates_use_the_learner_as_pi_old(tiny_model, tokenizer, collected):
    """With several epochs π_old is the learner's recomputed log-probs (not the engine's): an engine
    offset then only enters through the truncated weight."""
    metrics = _run(tiny_model, tokenizer, collected, shift=0.3, tis="sequence", tis_cap=1.5, update_epochs=2)[1]
    assert metrics["correction_truncated_share"] == 1.0  # every sequence: exp(0.3 · n) > 1.5
    assert metrics["approx_kl_old_k1"] < 0.05  # measured against the learner's π_old, not the shifted one


def test_correction_names_are_checked_once_with_the_names_listed():
    with pytest.raises(ValueError, match="one of tis-token, tis-seq, mis, geo, icepop, got 'seq-mis'"):
        GRPO.config_class(correction="seq-mis")
    with pytest.raises(ValueError, match="contradicts correction='mis'"):
        GRPO.config_class(tis="token", correction="mis")
    with pytest.raises(ValueError, match="set correction too"):
        GRPO.config_class(correction_high=1.5)
    with pytest.raises(ValueError, match="truncates from above only"):
        GRPO.config_class(correction="tis-seq", correction_low=0.5)
    with pytest.raises(ValueError, match="low <= high"):
        GRPO.config_class(correction="icepop", correction_low=2.0, correction_high=1.0)
    GRPO.config_class(tis="sequence", correction="tis-seq")  # the older spelling, agreeing: accepted


def _zero(delta):
    return all(float(v.abs().max()) == 0.0 for v in delta.values() if v.numel())


def test_tis_is_the_older_spelling_of_the_tis_presets(tiny_model, tokenizer, collected):
    old, old_metrics = _run(tiny_model, tokenizer, collected, shift=0.4, tis="token", tis_cap=1.3)
    new, new_metrics = _run(tiny_model, tokenizer, collected, shift=0.4, correction="tis-token", correction_high=1.3)
    assert old_metrics["correction_truncated_share"] == new_metrics["correction_truncated_share"] == 1.0
    for k in old:
        assert torch.equal(old[k], new[k])


def test_masks_remove_the_policy_gradient_and_log_the_masked_share(tiny_model, tokenizer, collected):
    """The engine claims every token 1 nat less likely (ρ_t = e): MIS masks every row (ρ_seq ≥ e > 2),
    IcePop every token (e > β = 2), GEO every row (geometric mean e > 1.01) — no step at all, and the
    shares say so. A smaller gap inside each band keeps the step: IcePop and MIS scale it by ρ,
    GEO keeps it at weight 1."""
    plain, _ = _run(tiny_model, tokenizer, collected)
    for name in ("mis", "icepop", "geo"):
        delta, metrics = _run(tiny_model, tokenizer, collected, shift=1.0, correction=name)
        assert _zero(delta), name
        assert metrics["correction_masked_share"] == 1.0 and metrics["correction_rows_masked_share"] == 1.0
        assert metrics["correction_weight_mean"] == 0.0 and metrics["correction_truncated_share"] == 0.0
    delta, metrics = _run(tiny_model, tokenizer, collected, shift=0.3, correction="icepop")
    assert metrics["correction_masked_share"] == 0.0
    for k in plain:
        assert torch.allclose(delta[k], math.exp(0.3) * plain[k], atol=1e-6, rtol=1e-3)
    delta, metrics = _run(tiny_model, tokenizer, collected, shift=0.005, correction="geo")
    assert metrics["correction_masked_share"] == 0.0 and abs(metrics["correction_weight_mean"] - 1.0) < 1e-9
    for k in plain:
        assert torch.allclose(delta[k], plain[k], atol=1e-6, rtol=1e-3)


def test_a_correction_weights_every_token_fresh_or_stale(tiny_model, tokenizer):
    """Under the pipelined learner a chosen correction replaces the stale-only TIS weight: the engine gap
    and the staleness are one ratio, so fresh tokens (version 5) are weighted too. IcePop's band [0.5, 2]:
    ratios e^0.5, e^-0.5, e^0.1 kept at their value, e^-0.9 ≈ 0.41 masked."""
    from llmgym import Task
    from llmgym.rollout.episodes import Batch, Episode

    agent = GRPO(tiny_model, tokenizer, kl_coef=0.0, correction="icepop", tasks_per_step=2, group_size=4,
                 max_new_tokens=5)
    ep = Episode(Task("p"), 0, [1, 5, 6, 7, 2], [0, 1, 1, 1, 1], [0, -1.0, -2.0, -0.5, -0.1], [0, 0, 0, 0, 1.0], 1,
                 policy_versions=[-1, 4, 4, 5, 5])
    batch = Batch.from_episodes([ep])
    batch.advantages = torch.ones_like(batch.action_mask)
    proximal = torch.tensor([[-0.5, -2.5, -0.4, -1.0]])
    new, stats = agent.learner.importance_corrected(batch, proximal.clone(), version=5)
    expected = torch.tensor([[math.exp(0.5), math.exp(-0.5), math.exp(0.1), 0.0]])
    assert torch.allclose(new.advantages, expected) and torch.equal(new.old_logprobs, proximal)
    assert stats["correction_masked_share"] == 0.25 and stats["correction_rows_masked_share"] == 0.0
