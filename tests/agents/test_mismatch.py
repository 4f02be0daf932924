"""The sampler-vs-learner mismatch (``mismatch_kl``, ``mismatch_prob_error``, per version lag): the
formulas, what an update logs when the engine's log-probs carry a known error, the warning, and that an
update which measures nothing logs nothing."""

from __future__ import annotations

import copy
import math
import warnings

import gymnasium
import pytest
import torch

import llmgym  # noqa: F401  (registers the envs)
from llmgym.agents import GRPO
from llmgym.agents import functional as F
from llmgym.agents.mismatch import MismatchMonitor, MismatchStats, MismatchWarning


def test_functions_exact_values():
    learner = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, 0.0, 0.0]])
    sampler = torch.tensor([[-1.2, -1.7, -0.5], [-2.0, float("nan"), float("-inf")]])  # padding may be NaN/-inf
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    deltas = [0.2, -0.3, 0.0, -1.0]  # log π − log q on the four policy tokens
    k3 = sum(math.exp(d) - 1 - d for d in deltas) / 4
    assert float(F.mismatch_kl(learner, sampler, mask)) == pytest.approx(k3, rel=1e-6)
    assert float(F.mismatch_kl(learner, sampler, mask, "k1")) == pytest.approx(-sum(deltas) / 4, rel=1e-6)
    assert float(F.token_prob_error(learner, sampler, mask)) == pytest.approx(
        sum(math.exp(abs(d)) for d in deltas) / 4, rel=1e-6)
    terms = F.mismatch_terms(learner, sampler, mask)
    assert all(bool(torch.isfinite(t).all()) for t in terms.values())
    assert float(F.mismatch_kl(learner, learner, mask)) == 0.0
    assert float(F.token_prob_error(learner, learner, mask)) == 1.0
    with pytest.raises(ValueError):
        F.mismatch_kl(learner, sampler, mask, "k2")


def test_stats_split_by_lag_and_accumulate_over_micro_batches():
    stats = MismatchStats()
    learner = torch.zeros(2, 2)
    stats.add(learner, torch.tensor([[-0.1, -0.1], [0.0, 0.0]]), torch.ones(2, 2), torch.tensor([[0, 0], [2, -1]]))
    stats.add(learner[:1], torch.tensor([[-0.4, 0.0]]), torch.tensor([[1, 0]]), torch.tensor([[2, 2]]))
    r = stats.result()
    k3 = lambda d: math.exp(d) - 1 - d  # noqa: E731
    assert r["mismatch_kl"] == pytest.approx((2 * k3(0.1) + k3(0.4)) / 5, rel=1e-6)
    assert r["mismatch_kl/lag0"] == pytest.approx(k3(0.1), rel=1e-6)
    assert r["mismatch_kl/lag2"] == pytest.approx(k3(0.4) / 2, rel=1e-6)  # a lag-2 token of 0 and one of 0.4
    assert r["mismatch_prob_error/lag2"] == pytest.approx((1 + math.exp(0.4)) / 2, rel=1e-6)
    assert "mismatch_kl/lag1" not in r  # only the lags present
    with pytest.raises(ValueError):
        stats.add(learner, torch.zeros(2, 3), torch.ones(2, 2))


def _agent(model, tok, **kw):
    return GRPO(model, tok, tasks_per_step=2, group_size=4, max_new_tokens=6, kl_coef=0.0, **kw)


@pytest.fixture()
def collected(tiny_model, tokenizer):
    env = gymnasium.make("llmgym/Copy-v0", tokenizer=tokenizer)
    batch = _agent(copy.deepcopy(tiny_model), tokenizer).collect(env)
    batch.rewards = torch.tensor([0.0, 1.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25])
    return batch


def _shifted(batch, shift: torch.Tensor):
    """``batch`` whose engine log-probs are ``shift`` (per row) nats below what the engine computed: the
    learner's log-prob of every policy token is then ``δ = shift`` above the sampler's."""
    batch = copy.deepcopy(batch)
    batch.old_logprobs = batch.old_logprobs - shift[:, None] * batch.action_mask
    return batch


def _expected(shift: torch.Tensor, mask: torch.Tensor, rows=None) -> tuple[float, float]:
    counts = mask.sum(dim=1).double()
    if rows is not None:
        counts = counts * rows
    d = shift.double()
    k3 = float(((torch.expm1(d) - d) * counts).sum() / counts.sum())
    prob = float((torch.exp(d.abs()) * counts).sum() / counts.sum())
    return k3, prob


@pytest.mark.parametrize("settings", [{}, {"update_epochs": 2, "tis": "token"}],
                         ids=["on-policy forward", "learner recomputation"])
def test_update_logs_the_injected_mismatch_by_lag(tiny_model, tokenizer, collected, settings):
    """The engine's log-probs perturbed by a known δ per row; half the rows sampled two versions ago: the
    update logs ``E[exp(δ) − 1 − δ]`` and ``E[exp|δ|]`` overall and per lag (the HF engine's own gap ~1e-6)."""
    shift = torch.tensor([0.05, 0.1, 0.2, 0.3, 0.0, 0.4, 0.5, 0.6])
    batch = _shifted(collected, shift)
    agent = _agent(copy.deepcopy(tiny_model), tokenizer, **settings)
    agent.step_count = 2
    versions = torch.where(batch.action_mask.bool(), 2, -1)
    versions[4:] = torch.where(batch.action_mask[4:].bool(), 0, -1)  # rows 4-7: lag 2
    batch.policy_versions = versions
    mask = batch.action_mask
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MismatchWarning)
        metrics = agent.update(batch)
    k3, prob = _expected(shift, mask)
    assert metrics["mismatch_kl"] == pytest.approx(k3, abs=1e-4)
    assert metrics["mismatch_prob_error"] == pytest.approx(prob, abs=1e-4)
    assert metrics["mismatch_kl_k1"] < 0  # δ > 0: the learner finds the tokens likelier than the sampler said
    lag0 = torch.tensor([1.0] * 4 + [0.0] * 4).double()
    for lag, rows in ((0, lag0), (2, 1 - lag0)):
        k3, prob = _expected(shift, mask, rows)
        assert metrics[f"mismatch_kl/lag{lag}"] == pytest.approx(k3, abs=1e-4)
        assert metrics[f"mismatch_prob_error/lag{lag}"] == pytest.approx(prob, abs=1e-4)
    assert not any(k.startswith("mismatch_kl/lag1") for k in metrics)


def test_not_measured_means_absent(tiny_model, tokenizer, collected):
    """Several optimiser steps on the engine's log-probs, fp32, no correction: the learner has no log-probs
    of its own before the first step, so no mismatch field (never a 0 it did not measure)."""
    metrics = _agent(copy.deepcopy(tiny_model), tokenizer, update_epochs=2).update(_shifted(collected, torch.ones(8)))
    assert not any(k.startswith("mismatch") for k in metrics)
    untagged = _agent(copy.deepcopy(tiny_model), tokenizer).update(copy.deepcopy(collected))
    assert untagged["mismatch_kl"] < 1e-6 and not any("/lag" in k for k in untagged)  # untagged: no split


def test_warning_above_the_threshold_once_per_crossing(tiny_model, tokenizer, collected):
    # lr 0: the weights stay those that sampled the batch, so each update sees exactly the injected δ
    agent = _agent(copy.deepcopy(tiny_model), tokenizer, lr=0.0, mismatch_kl_warn=1e-2, mismatch_prob_error_warn=None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        agent.update(_shifted(collected, torch.full((8,), 0.01)))  # k3 ≈ 5e-5: under
        agent.update(_shifted(collected, torch.full((8,), 0.5)))  # k3 ≈ 0.149: over
        agent.update(_shifted(collected, torch.full((8,), 0.5)))  # still over: said already
    said = [w for w in seen if issubclass(w.category, MismatchWarning)]
    assert len(said) == 1
    text = str(said[0].message)
    assert text.startswith("step 2: mismatch_kl = 0.14") and "tis" in text and "bf16" in text
    agent = _agent(copy.deepcopy(tiny_model), tokenizer, mismatch_kl_warn=None, mismatch_prob_error_warn=1.1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        agent.update(_shifted(collected, torch.full((8,), 0.2)))  # exp(0.2) = 1.22 > 1.1
    assert [str(w.message).split(" =")[0] for w in seen if issubclass(w.category, MismatchWarning)] == \
        ["step 1: mismatch_prob_error"]


def test_monitor_rearms_and_thresholds_are_validated():
    monitor = MismatchMonitor(kl_warn=0.01, prob_error_warn=1.1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for step, kl in enumerate([0.02, 0.005, 0.03], start=1):
            monitor.observe({"mismatch_kl": kl, "mismatch_kl/lag3": 0.5}, step)
        monitor.observe({}, 4)  # not measured: nothing said
    assert [str(w.message)[:6] for w in seen] == ["step 1", "step 3"]
    assert "lag3 0.5" in str(seen[0].message)
    for bad in ({"mismatch_kl_warn": 0.0}, {"mismatch_kl_warn": float("nan")}, {"mismatch_prob_error_warn": 1.0},
                {"mismatch_prob_error_warn": "1.2"}, {"mismatch_kl_warn": True}):
        with pytest.raises(ValueError, match="mismatch_"):
            GRPO.config_class(**bad)
