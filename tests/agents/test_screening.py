"""The learner's scores of a batch from an engine it does not trust (llmgym.agents.screening): what they are, and
that a stale token's reported log-prob never becomes its behaviour log-prob."""

from __future__ import annotations

import copy
import dataclasses

import gymnasium as gym
import pytest
import torch

import llmgym  # noqa: F401
from llmgym.agents import GRPO
from llmgym.agents.screening import screen, token_scores
from llmgym.engines import HFEngine
from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer


class Screening(HFEngine):
    """An engine that asks to have its batches screened, trusts every row, and keeps the scores it was handed."""

    def screen_batch(self, batch, scores):
        self.scores = scores
        return [True] * len(batch)


@pytest.fixture()
def setup():
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64))
    engine = Screening(copy.deepcopy(model), tok)
    agent = GRPO(model, tok, engine=engine, tasks_per_step=2, group_size=2, max_new_tokens=6, kl_coef=0.0)
    batch = agent.collect(gym.make("llmgym/Copy-v0", tokenizer=tok))
    return agent, engine, batch


def test_the_scores_are_the_learner_s_log_probs_entropy_and_second_moment(setup):
    agent, _, batch = setup
    mask = batch.action_mask.bool()
    lp, h, m = token_scores(agent, batch, mask)
    out = agent.forward(batch)
    assert torch.allclose(lp, out.logprobs.detach(), atol=1e-5) and torch.allclose(h, out.entropy.detach(), atol=1e-5)
    with torch.no_grad():
        logp = torch.log_softmax(agent.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
                                 .logits[:, :-1].float(), -1)
    expected = (logp.exp() * logp * logp).sum(-1) * mask
    assert torch.allclose(m, expected, atol=1e-4) and bool((m[mask] - h[mask] ** 2 > 0).all())
    assert torch.allclose(lp, batch.old_logprobs, atol=1e-4)  # the sampler's own log-probs: the same numbers


def test_a_stale_token_s_behaviour_log_prob_is_the_learner_s_score_never_the_engine_s_report(setup):
    agent, engine, batch = setup
    honest = batch.old_logprobs.clone()
    version0 = {k: v.clone() for k, v in agent.model.state_dict().items()}
    with torch.no_grad():  # an update happened: the learner is at version 1, the batch was sampled by version 0
        for p in agent.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    agent.step_count = 1
    mask = batch.action_mask.bool()
    lying = dataclasses.replace(batch, old_logprobs=torch.zeros_like(batch.old_logprobs),  # "certain" of every token
                                policy_versions=torch.where(mask, 0, -1))

    agent.learner.behaviour_weights = {0: version0}  # kept: the stale tokens are scored under version 0's weights
    kept, metrics = screen(agent, lying)
    assert torch.allclose(kept.old_logprobs[mask], honest[mask], atol=1e-4)
    assert bool(engine.scores.checked[mask].all()) and metrics["stale_tokens_unchecked"] == 0

    agent.learner.behaviour_weights = {}  # not kept (a batch sampled before a resume): weight 1, the report unused
    kept, metrics = screen(agent, lying)
    now = agent.forward(batch).logprobs.detach()
    assert torch.allclose(kept.old_logprobs[mask], now[mask], atol=1e-5)
    assert not bool(engine.scores.checked[mask].any()) and metrics["stale_tokens_unchecked"] == int(mask.sum())


def test_without_screen_batch_the_batch_is_untouched():
    tok = build_tokenizer()
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64))
    agent = GRPO(model, tok, tasks_per_step=2, group_size=2, max_new_tokens=4, kl_coef=0.0)
    batch = agent.collect(gym.make("llmgym/Copy-v0", tokenizer=tok))
    assert screen(agent, batch) == (batch, {})


@pytest.mark.parametrize("name", ["rejection", "dapo"])
def test_an_agent_that_keeps_rows_by_reward_has_every_sampled_row_tested(name):
    """Rejection sampling keeps each group's winner, DAPO its informative groups: a choice by reward is not a
    sample of the policy, so the sample tests run on every row the engine sampled, before the choice."""
    from llmgym.agents import DAPO
    from llmgym.agents.rejection_sampling import RejectionSampling

    tok = build_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64))
    engine = Screening(copy.deepcopy(model), tok)
    cls = RejectionSampling if name == "rejection" else DAPO
    agent = cls(model, tok, engine=engine, tasks_per_step=4, group_size=4, max_new_tokens=4, kl_coef=0.0)
    from llmgym import SequenceEnv, Task

    env = SequenceEnv([Task(f"coin {i}:", id=f"coin-{i}") for i in range(8)], _coin, tok)  # rewards that differ
    for _ in range(5):  # until the agent keeps some rows, not all
        batch = agent.collect(env)
        if 0 < len(batch) < len(batch.sampled_from):
            break
        agent.step_count += 1
    assert 0 < len(batch) < len(batch.sampled_from)
    agent.update(batch)
    assert engine.scores.logprobs.shape[0] == len(batch.sampled_from)  # every sampled row was scored


def _coin(task, completion):
    return float(len(completion.encode("utf-8", "replace")) % 2 == 0)
