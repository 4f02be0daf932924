"""Truncated sampling (top-p): a log-prob is of the distribution the sampler drew from, and the learner's
importance ratio compares like with like (``llmgym.agents.truncation``).

The reference here is computed independently of the code under test: teacher-forced logits in float64, the
nucleus by a plain sort (the smallest set of most likely tokens whose mass reaches top-p).
"""

from __future__ import annotations

import copy
import dataclasses
import math

import gymnasium
import pytest
import torch

import llmgym  # noqa: F401  (registers the envs)
from llmgym.agents import GRPO
from llmgym.engines import HFEngine
from llmgym.engines.sampling import sample_next_token

TOP_P = 0.8


def _reference(model, prompt_ids, token_ids, temperature: float, top_p: float):
    """``(log p(y), log S)`` per completion token: the tempered full softmax and the nucleus's kept mass."""
    ids = torch.tensor([list(prompt_ids) + list(token_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].double()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    chosen = logp.gather(-1, torch.tensor(token_ids)[:, None]).squeeze(-1)
    sorted_p = logp.exp().sort(dim=-1, descending=True).values
    before = sorted_p.cumsum(-1) - sorted_p
    kept_mass = torch.where(before < top_p, sorted_p, torch.zeros_like(sorted_p)).sum(-1)
    return chosen, kept_mass.log()


class TruncatingSampler:
    """A sampler that reports what vLLM's ``processed_logprobs`` report: the log-prob under the renormalised
    nucleus it drew from, here computed by :func:`_reference` from its own model (so the engine under test is
    not what makes the report right)."""

    top_p_renormalised_logprobs = True

    def __init__(self, model, tok):
        self.model, self.inner = model, HFEngine(model, tok)
        self.tokenizer, self.pad_id, self.eos_ids = tok, self.inner.pad_id, self.inner.eos_ids

    def generate(self, prompts, sampling=None, *, keys=None):
        groups = self.inner.generate(prompts, sampling, keys=keys)
        for group in groups:
            for c in group:
                logp, log_mass = _reference(self.model, c.prompt_ids, c.token_ids, sampling.temperature, sampling.top_p)
                c.logprobs = (logp - log_mass).float().tolist()
        return groups

    def sync_weights(self, model) -> None:  # the sampler keeps its own (rounded) weights
        pass


def _bf16_rounded(model):
    sampler = copy.deepcopy(model)
    with torch.no_grad():
        for p in sampler.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return sampler


def test_the_hf_engine_reports_the_log_prob_of_the_renormalised_nucleus(tiny_model, tokenizer):
    from llmgym.engines import SamplingParams

    engine = HFEngine(tiny_model, tokenizer)
    sampling = SamplingParams(n=4, temperature=0.9, top_p=TOP_P, max_new_tokens=8, seed=3)
    worst, offsets = 0.0, []
    for group in engine.generate([tokenizer.encode("12+3="), tokenizer.encode("abc")], sampling):
        for c in group:
            logp, log_mass = _reference(tiny_model, c.prompt_ids, c.token_ids, 0.9, TOP_P)
            worst = max(worst, float((torch.tensor(c.logprobs).double() - (logp - log_mass)).abs().max()))
            offsets.append(float(-log_mass.mean()))
    assert worst < 1e-4, f"reported log-probs differ from log q = log p - log S by {worst:.3g}"
    assert min(offsets) > 0.05  # the truncation is real: the full softmax's would be off by this much


def test_sample_next_token_reports_q_exactly_on_a_small_vocabulary():
    logits = torch.log(torch.tensor([[0.45, 0.25, 0.2, 0.1]]))
    for key in range(16):  # 0.45 + 0.25 + 0.2 reach 0.8: the nucleus keeps three tokens, S = 0.9
        tok, lp = sample_next_token(logits, torch.tensor([key]), torch.tensor([0]), top_p=TOP_P)
        assert tok.item() != 3
        assert lp.exp().item() == pytest.approx(logits.exp()[0, tok].item() / 0.9, rel=1e-6)


def _update_weight_mean(tiny_model, tokenizer, sampler_model):
    """The learner's mean TIS weight over one batch sampled at top-p 0.8 by ``sampler_model`` (reporting q), and
    the per-token ratio q'(y)/q(y) by the reference (its sampling error)."""
    model = copy.deepcopy(tiny_model)
    agent = GRPO(model, tokenizer, tasks_per_step=8, group_size=8, max_new_tokens=12, kl_coef=0.0, top_p=TOP_P,
                 tis="token", tis_cap=10.0, engine=TruncatingSampler(sampler_model, tokenizer), seed=1)
    env = gymnasium.make("llmgym/Copy-v0", tokenizer=tokenizer)
    batch = agent.collect(env)
    ratios = []
    for episode in batch.episodes:
        start = episode.action_mask.index(1)
        prompt, tokens = episode.token_ids[:start], episode.token_ids[start:]
        logp, log_mass = _reference(model, prompt, tokens, 1.0, TOP_P)
        reported = torch.tensor(episode.logprobs[start:], dtype=torch.float64)
        ratios.append((logp - log_mass - reported).exp())
    ratios = torch.cat(ratios)
    metrics = agent.update(batch)
    return metrics["correction_weight_mean"], ratios


def test_the_importance_ratio_has_mean_one_at_top_p_0_8(tiny_model, tokenizer):
    """Sampler: the learner's weights rounded to bf16, truncating at top-p 0.8 and reporting log q. The learner's
    ratio must be q'(y)/q(y) (mean 1 within sampling error), not p'(y)/q(y) (mean E_q[S] ≈ the kept mass)."""
    mean, ratios = _update_weight_mean(tiny_model, tokenizer, _bf16_rounded(tiny_model))
    se = float(ratios.std() / math.sqrt(len(ratios)))
    assert len(ratios) > 500 and float(ratios.std()) > 0  # many tokens, and the bf16 sampler is not the learner
    assert abs(float(ratios.mean()) - 1.0) <= 3 * se + 5e-3  # the reference ratio: q' = q up to bf16
    assert abs(mean - 1.0) <= 3 * se + 5e-3, f"the learner's importance ratio mean is {mean:.4f}, not 1 ± {3 * se:.2g}"
    assert mean == pytest.approx(float(ratios.mean()), abs=2e-3)


def test_greedy_and_untruncated_sampling_are_left_alone(tiny_model, tokenizer):
    from llmgym.agents.truncation import to_model_space, truncates

    for kw in ({"top_p": 1.0}, {"top_p": TOP_P, "temperature": 0.0}):
        agent = GRPO(copy.deepcopy(tiny_model), tokenizer, tasks_per_step=1, group_size=2, max_new_tokens=4, **kw)
        assert not truncates(agent)
        batch = agent.collect(gymnasium.make("llmgym/Copy-v0", tokenizer=tokenizer))
        assert to_model_space(agent, batch) is batch
    agent = GRPO(copy.deepcopy(tiny_model), tokenizer, top_p=TOP_P)
    assert truncates(agent)
    agent.engine = TruncatingSampler(tiny_model, tokenizer)
    TruncatingSampler.top_p_renormalised_logprobs = False  # an engine that reports the full softmax
    try:
        assert not truncates(agent)
    finally:
        TruncatingSampler.top_p_renormalised_logprobs = True


def test_a_stale_token_takes_the_kept_mass_of_the_weights_that_sampled_it(tiny_model, tokenizer):
    """The pipelined learner keeps the weights of older versions: a token they sampled is brought back with their
    nucleus's kept mass; a fresh token with the current weights'."""
    from llmgym.agents.truncation import to_model_space

    old = copy.deepcopy(tiny_model)
    with torch.no_grad():
        old.lm_head.weight.mul_(3.0)  # a sharper older policy: its nucleus keeps other mass than today's
    agent = GRPO(copy.deepcopy(tiny_model), tokenizer, tasks_per_step=1, group_size=2, max_new_tokens=6, top_p=TOP_P,
                 engine=TruncatingSampler(old, tokenizer))
    batch = agent.collect(gymnasium.make("llmgym/Copy-v0", tokenizer=tokenizer))
    agent.step_count = 1
    agent.learner.behaviour_weights = {0: {k: v.clone() for k, v in old.state_dict().items()}}
    versions = torch.where(batch.action_mask.bool(), torch.zeros_like(batch.action_mask, dtype=torch.long), -1)
    versions[1] = torch.where(batch.action_mask[1].bool(), 1, -1)  # row 1: sampled by the current version
    batch = dataclasses.replace(batch, policy_versions=versions)
    converted = to_model_space(agent, batch)
    for row, model in ((0, old), (1, agent.model)):
        episode = batch.episodes[row]
        start = episode.action_mask.index(1)
        _, log_mass = _reference(model, episode.token_ids[:start], episode.token_ids[start:], 1.0, TOP_P)
        cols = batch.action_mask[row].bool()
        added = (converted.old_logprobs[row] - batch.old_logprobs[row])[cols].double()
        assert torch.allclose(added, log_mass, atol=1e-4), (row, added, log_mass)
    assert torch.equal(converted.old_logprobs[~batch.action_mask.bool()], batch.old_logprobs[~batch.action_mask.bool()])
