"""Agents: one interface, level-agnostic rollouts, no redundant passes, algorithm specifics."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from llmgym.agents import AGENTS, DAPO, GRPO, PPO, REINFORCE, RLOO
from llmgym import SequenceEnv, Task
from llmgym.engines import sequence_logprobs

FIVE = [REINFORCE, RLOO, PPO, GRPO, DAPO]
SMALL = dict(tasks_per_step=2, group_size=2, max_new_tokens=5, seed=3)


def small(cls, model, tok, **kw):
    args = {**SMALL, **kw}
    if cls is PPO:
        args.setdefault("minibatch_size", 2)
    if cls.name == "distill":
        args.setdefault("teacher", "tiny")  # the default tiny model, same tokenizer: a teacher to grade the tokens
    return cls(model, tok, **args)


def test_import_names():
    from llmgym.agents import DAPO, GRPO, PPO, REINFORCE, RLOO  # noqa: F401

    assert {"reinforce", "rloo", "ppo", "grpo", "dapo", "drgrpo", "gspo", "reinforce++", "remax"} <= set(AGENTS)


@pytest.mark.parametrize("cls", list(AGENTS.values()), ids=list(AGENTS))
def test_learn_returns_the_documented_metrics(cls, tiny_model, tokenizer):
    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    history = small(cls, tiny_model, tokenizer).learn(env, steps=2)
    assert [row["step"] for row in history] == [1, 2]
    for key in ("step", "reward_mean", "reward_std", "loss", "kl", "entropy", "clip_frac", "tokens_per_s", "wall_s"):
        assert key in history[0], key
    assert all(math.isfinite(row["loss"]) and math.isfinite(row["entropy"]) for row in history)


@pytest.mark.parametrize("cls", FIVE, ids=lambda c: c.name)
def test_same_first_batch_at_sequence_and_token_level(cls, tiny_model, tokenizer):
    seq_env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    tok_env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer, level="token", max_new_tokens=5)
    a = small(cls, tiny_model, tokenizer).collect(seq_env)
    b = small(cls, tiny_model, tokenizer).collect(tok_env)
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.rewards, b.rewards)
    assert torch.equal(a.action_mask, b.action_mask)
    assert torch.allclose(a.old_logprobs, b.old_logprobs, atol=1e-4)


def test_same_seed_same_batch_and_other_seed_differs(tiny_model, tokenizer):
    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    a = small(GRPO, tiny_model, tokenizer).collect(env)
    b = small(GRPO, tiny_model, tokenizer).collect(env)
    c = small(GRPO, tiny_model, tokenizer, seed=4).collect(env)
    assert torch.equal(a.input_ids, b.input_ids)
    assert not torch.equal(a.input_ids, c.input_ids) if a.input_ids.shape == c.input_ids.shape else True


def test_collect_builds_the_batch_on_the_learners_device(tiny_model, tokenizer):
    agent = small(AGENTS["remax"], tiny_model, tokenizer)
    agent.device = torch.device("meta")  # stands in for an accelerator: a tensor left on the CPU shows
    batch = agent.collect(gym.make("llmgym/Copy-v0", tokenizer=tokenizer))
    assert batch.baseline_rewards is not None  # ReMax's greedy baseline, indexed by the batch's groups
    assert {name: t.device.type for name, t in batch._tensors().items()} == dict.fromkeys(batch._tensors(), "meta")


def test_act_gives_an_action_at_each_level(tiny_model, tokenizer):
    agent = small(GRPO, tiny_model, tokenizer)
    seq = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    obs, _ = seq.reset(seed=0)
    action = agent.act(obs)
    assert isinstance(action, np.ndarray) and 1 <= len(action) <= 5
    seq.step(action)
    tok = gym.make("llmgym/Copy-v0", tokenizer=tokenizer, level="token", max_new_tokens=5)
    obs, _ = tok.reset(seed=0)
    token = agent.act(obs, level="token")
    assert isinstance(token, int) and token in tok.action_space


def test_generation_logprobs_are_pi_old_and_first_ratio_is_one(tiny_model, tokenizer):
    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    agent = small(GRPO, tiny_model, tokenizer, kl_coef=0.0)
    batch = agent.collect(env)
    with torch.no_grad():
        learner = sequence_logprobs(tiny_model, batch.input_ids, batch.attention_mask)
    mask = batch.action_mask.bool()
    assert (learner[mask] - batch.old_logprobs[mask]).abs().max() < 1e-4
    metrics = agent.update(batch)
    assert metrics["clip_frac"] == 0.0 and abs(metrics["approx_kl_old_k3"]) < 1e-8


def test_reference_model_only_where_kl_is_used(tiny_model, tokenizer):
    assert small(GRPO, tiny_model, tokenizer, kl_coef=0.0).ref_model is None
    assert small(DAPO, tiny_model, tokenizer).ref_model is None
    ref = small(GRPO, tiny_model, tokenizer, kl_coef=0.04).ref_model
    assert ref is not None and ref is not tiny_model and not any(p.requires_grad for p in ref.parameters())


def test_kl_placement_and_estimator_are_configuration(tiny_model, tokenizer):
    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    for placement in ("loss", "reward"):
        for estimator in ("k1", "k2", "k3"):
            row = small(GRPO, tiny_model, tokenizer, kl_coef=0.1, kl_placement=placement,
                        kl_estimator=estimator).learn(env, steps=1)[0]
            assert row["kl"] == pytest.approx(0.0, abs=1e-6)  # first step: policy == reference
    with pytest.raises(ValueError, match="kl_estimator"):
        GRPO(tiny_model, tokenizer, kl_estimator="k4")
    with pytest.raises(TypeError, match="unknown GRPOConfig field"):
        GRPO(tiny_model, tokenizer, not_a_field=1)


def test_multi_turn_episodes_mask_the_env_replies(tiny_model, tokenizer):
    env = gym.make("llmgym/CopyRetry-v0", tokenizer=tokenizer)
    batch = small(GRPO, tiny_model, tokenizer).collect(env)
    episode = batch.episodes[0]
    assert episode.num_turns == 3  # a random model does not solve Copy
    reply = tokenizer.encode("\nIncorrect, try again.\n", add_special_tokens=False)
    ids, mask = episode.token_ids, episode.action_mask
    starts = [i for i in range(len(ids)) if ids[i:i + len(reply)] == reply]
    assert len(starts) == 2
    assert all(mask[s + j] == 0 for s in starts for j in range(len(reply)))


def _constant_for_some_tasks_env(tokenizer):
    tasks = [Task(f"copy:{i}{i}=", answer=f"{i}{i}", id=str(i)) for i in range(10)]

    def reward(task, completion):  # tasks 0-4 always score 0.5: their groups carry no signal
        if int(task.id) < 5:
            return 0.5
        return float(len(completion) % 2)

    return SequenceEnv(tasks, reward, tokenizer)


def test_dapo_dynamic_sampling_keeps_only_informative_groups(tiny_model, tokenizer):
    agent = DAPO(tiny_model, tokenizer, tasks_per_step=3, group_size=4, max_new_tokens=5, max_extra_draws=6, seed=1)
    batch = agent.collect(_constant_for_some_tasks_env(tokenizer))
    groups = batch.rewards.view(-1, 4)
    assert len(groups) <= 3 and batch.stats["extra_draws"] <= 6
    assert all(len(set(g.tolist())) > 1 for g in groups)


def test_dapo_masks_truncated_completions(tiny_model, tokenizer):
    agent = DAPO(tiny_model, tokenizer, tasks_per_step=2, group_size=2, max_new_tokens=2, dynamic_sampling=False)
    batch = agent.collect(gym.make("llmgym/Copy-v0", tokenizer=tokenizer))
    mask = agent.loss_mask(batch)
    assert torch.equal(mask.sum(-1) == 0, batch.truncated | (batch.lengths == 0))


def test_state_dict_round_trip_resumes_exactly(tokenizer, tiny_config):
    from llmgym.runtime.models import build_tiny_model

    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    straight = small(PPO, build_tiny_model(tokenizer, tiny_config), tokenizer).learn(env, steps=3)
    first = small(PPO, build_tiny_model(tokenizer, tiny_config), tokenizer)
    part = first.learn(env, steps=2)
    state = first.state_dict()
    resumed = small(PPO, build_tiny_model(tokenizer, tiny_config), tokenizer)
    resumed.load_state_dict(state)
    rest = resumed.learn(env, steps=1)
    for a, b in zip(straight, part + rest):
        assert a["step"] == b["step"] and a["reward_mean"] == b["reward_mean"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)


def test_token_level_rollouts_follow_the_agents_budget(tiny_model, tokenizer):
    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer, level="token", max_new_tokens=64)
    batch = small(GRPO, tiny_model, tokenizer, max_new_tokens=4).collect(env)
    assert int(batch.lengths.max()) <= 4


@pytest.mark.parametrize("cls", [GRPO, DAPO, RLOO], ids=lambda c: c.name)
def test_kl_in_the_reward_changes_the_advantages(cls, tiny_model, tokenizer):
    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    agent = small(cls, tiny_model, tokenizer, kl_coef=1.0, kl_placement="reward", kl_estimator="k1",
                  dynamic_sampling=False) if cls is DAPO else small(cls, tiny_model, tokenizer, kl_coef=1.0,
                                                                   kl_placement="reward", kl_estimator="k1")
    with torch.no_grad():
        for p in agent.ref_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = agent.prepare(agent.collect(env))
    scores = agent.sequence_scores(batch)
    kl = ((batch.old_logprobs - batch.ref_logprobs) * batch.action_mask).sum(-1)
    assert torch.allclose(scores, batch.rewards - kl, atol=1e-5)
    assert not torch.allclose(scores, batch.rewards)


def test_dense_token_rewards_are_kept_at_token_level(tiny_model, tokenizer):
    from llmgym import TokenLevel
    from llmgym.engines import HFEngine, SamplingParams
    from llmgym.rollout.episodes import collect_episodes

    class Dense(TokenLevel):
        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            return obs, reward + 0.1, terminated, truncated, info

    env = Dense(SequenceEnv([Task("x", answer="y")], lambda t, c: 1.0, tokenizer), max_new_tokens=5)
    episodes, _ = collect_episodes(env, HFEngine(tiny_model, tokenizer), num_tasks=1, group_size=2,
                                   sampling=SamplingParams(max_new_tokens=5), seed=0)
    for e in episodes:
        n = sum(e.action_mask)
        assert e.total_reward == pytest.approx(1.0 + 0.1 * n)


def test_dapo_overlong_penalty_is_per_turn_in_multi_turn_envs(tiny_model, tokenizer):
    agent = DAPO(tiny_model, tokenizer, tasks_per_step=2, group_size=2, max_new_tokens=8, dynamic_sampling=False)
    batch = agent.collect(gym.make("llmgym/CopyRetry-v0", tokenizer=tokenizer))
    assert (batch.longest_turn <= 8).all() and (batch.lengths > 8).any()


def test_dapo_draw_counters_reach_the_history_rows(tiny_model, tokenizer):
    # DAPO's dynamic sampling counters must reach the per-step rows (the CLI writes them to metrics.jsonl)
    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    agent = small(DAPO, tiny_model, tokenizer, max_extra_draws=1)
    row = agent.learn(env, steps=1)[0]
    assert row["extra_draws"] in (0.0, 1.0)
    assert 1.0 <= row["kept_groups"] <= SMALL["tasks_per_step"]
    assert row["tokens_sampled"] > 0 and row["rollout_s"] >= 0


def test_ppo_reports_a_non_negative_kl_and_both_estimators(tiny_model, tokenizer):
    # PPO samples from π_old and takes several optimiser steps per batch: the k1 mean over π_old's
    # tokens drifts negative (−0.05 was reported at step 1); the headline `kl` is k3, ≥ 0 per token
    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    agent = small(PPO, tiny_model, tokenizer, tasks_per_step=4, kl_coef=0.1, lr=5e-3, update_epochs=3)
    rows = agent.learn(env, steps=2)
    for row in rows:
        assert row["kl"] == row["kl_k3"] and row["kl"] >= 0.0
        assert math.isfinite(row["kl_k1"])
    assert rows[-1]["kl_k3"] > 0.0  # the policy moved away from the reference


def test_ppo_explained_variance_is_sane_when_every_reward_is_zero(tiny_model, tokenizer):
    env = SequenceEnv([Task("copy: ab", answer="ab")], lambda task, text: 0.0, tokenizer)
    agent = small(PPO, tiny_model, tokenizer, tasks_per_step=4, kl_coef=0.05, update_epochs=2)
    for row in agent.learn(env, steps=2):
        assert row["reward_mean"] == 0.0
        assert -1.0 <= row["explained_variance"] <= 1.0, row["explained_variance"]


def test_new_loss_presets_are_registered():
    from llmgym.agents import CISPO, GDPO, SAPO

    assert AGENTS["cispo"] is CISPO and AGENTS["sapo"] is SAPO and AGENTS["gdpo"] is GDPO
    assert (CISPO.config_class().clip_low, CISPO.config_class().loss_agg) == (1.0, "token-mean")
    assert (SAPO.config_class().tau_pos, SAPO.config_class().tau_neg) == (1.0, 1.05)


def _two_part_env(tokenizer):
    from llmgym.envs.toy import positional_match, sample_tasks
    from llmgym.env.verifiers import WeightedSum, exact_match

    verifier = WeightedSum({"match": (0.5, positional_match), "exact": (2.0, exact_match)})
    return SequenceEnv(sample_tasks("copy", 16, seed=5), verifier, tokenizer)


def test_gdpo_reads_the_verifiers_components_and_weights(tiny_model, tokenizer):
    from llmgym.agents import GDPO
    from llmgym.agents import functional as F

    agent = small(GDPO, tiny_model, tokenizer, group_size=4)
    batch = agent.collect(_two_part_env(tokenizer))
    parts = [e.info["score"] for e in batch.episodes]
    match = torch.tensor([p["match"]["reward"] for p in parts])
    exact = torch.tensor([p["exact"]["reward"] for p in parts])
    agent.prepare(batch)
    # the advantage is GDPO's formula on the components, weighted by the verifier's weights (0.5, 2)
    expected = F.gdpo_advantages(torch.stack([match, exact], -1).view(-1, 4, 2), torch.tensor([0.5, 2.0]))
    got = batch.advantages.sum(-1) / batch.action_mask.sum(-1)
    assert torch.allclose(got, expected.view(-1), atol=1e-5)
    assert agent._component_stats["reward_components"] == 2.0


def test_gdpo_single_reward_falls_back_and_named_components_are_checked(tiny_model, tokenizer):
    from llmgym.agents import GDPO
    from llmgym.agents import functional as F

    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)  # one reward, no components in its info
    agent = small(GDPO, tiny_model, tokenizer, group_size=4)
    batch = agent.prepare(agent.collect(env))
    expected = F.gdpo_advantages(batch.rewards.view(-1, 4, 1))
    assert torch.allclose(batch.advantages.sum(-1) / batch.action_mask.sum(-1), expected.view(-1), atol=1e-5)
    with pytest.raises(ValueError, match="none of the reward components"):
        small(GDPO, tiny_model, tokenizer, reward_components=("nope",)).prepare(
            small(GDPO, tiny_model, tokenizer).collect(_two_part_env(tokenizer)))
    with pytest.raises(ValueError, match="kl_placement='loss'"):
        GDPO(tiny_model, tokenizer, kl_coef=0.1, kl_placement="reward")
