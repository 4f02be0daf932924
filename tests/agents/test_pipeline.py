"""The pipelined learner (``llmgym.agents.pipeline``): its schedule, weight sync by version, the
staleness correction, the overlap of its stages, exact resume, and its errors.

Its learning tests (``max_staleness`` 1 and 2, and the correction's effect over a whole run) are in
``tests/learning/test_learning.py``; on vLLM in ``tests/engines/test_vllm.py``; the command line's ``--async`` in
``tests/cli/test_cli_scale.py``. Runs here are a few steps of a tiny model: seconds each.
"""

from __future__ import annotations

import copy
import math
import threading

import gymnasium as gym
import pytest
import torch

import llmgym  # noqa: F401
from llmgym import SequenceEnv, Task
from llmgym.agents import DAPO, DPO, GRPO, PPO, REINFORCE
from llmgym.agents.pipeline import Pipeline, behaviour_version
from llmgym.rollout.episodes import Batch, Episode
from llmgym.engines import HFEngine
from llmgym.runtime.logging import TIMING_FIELDS
from llmgym.runtime.models import build_tiny_model
from llmgym.env.verifiers import VerifierUnavailableError

SMALL = dict(tasks_per_step=2, group_size=4, max_new_tokens=5, seed=3)
WAIT_S = 60  # how long an overlap test waits for the other stage: only a broken pipeline waits that long


def copy_env(tokenizer, **kwargs):
    return gym.make("llmgym/Copy-v0", tokenizer=tokenizer, **kwargs)


def length_env(tokenizer):
    """Copy's prompts, rewarded by the completion's length: a random model's samples differ in it, so
    every group has advantages and every update moves the policy (its Copy rewards are mostly 0)."""
    from llmgym.envs.toy import copy_task

    return SequenceEnv(copy_task, lambda task, completion: len(completion) / 16, tokenizer)


def comparable(rows, keys=None):
    """Rows without the fields that measure time (NaN made comparable), restricted to ``keys``."""
    def value(v):
        return "nan" if isinstance(v, float) and math.isnan(v) else v
    return [{k: value(v) for k, v in row.items() if k not in TIMING_FIELDS and (keys is None or k in keys)}
            for row in rows]


def same_weights(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


# -- K = 0 is the synchronous loop ------------------------------------------------------------------

@pytest.mark.parametrize("cls, config", [
    (GRPO, dict(kl_coef=0.04)),  # on-policy step with a KL reference
    (PPO, dict(minibatch_size=4)),  # several optimiser steps per batch: π_old from the engine
    (DAPO, dict()),  # extra draws: the engine is held for the whole batch
], ids=lambda x: getattr(x, "name", ""))
def test_max_staleness_0_repeats_the_synchronous_loop_bitwise(cls, config, tokenizer, tiny_model):
    base = copy.deepcopy(tiny_model)
    sync_model, piped_model = copy.deepcopy(base), copy.deepcopy(base)
    sync = cls(sync_model, tokenizer, **SMALL, **config).learn(copy_env(tokenizer), 3)
    piped = cls(piped_model, tokenizer, **SMALL, **config).learn(copy_env(tokenizer), 3, max_staleness=0)
    assert comparable(piped, keys=sync[0]) == comparable(sync)
    assert same_weights(sync_model, piped_model)
    for row in piped:  # nothing is stale: the correction is the identity, exactly
        assert row["staleness_0"] == 1.0 and row["staleness_max"] == 0.0
        assert row["is_weight_min"] == row["is_weight_max"] == row["is_weight_mean"] == 1.0
        assert row["is_corrected"] == 0.0


def test_versions_copied_into_a_separate_engine_are_the_learners_exactly(tokenizer, tiny_model):
    """A user's HFEngine over its own copy of the model: the sync loop loads it after every update, the
    pipeline's weight channel loads each version into it; both train identically."""
    histories, models = [], []
    for k in (None, 0):
        model = copy.deepcopy(tiny_model)
        engine = HFEngine(copy.deepcopy(model), tokenizer)
        agent = GRPO(model, tokenizer, engine=engine, lr=1e-2, kl_coef=0.0, **SMALL)
        histories.append(agent.learn(copy_env(tokenizer), 3, **({} if k is None else {"max_staleness": k})))
        models.append(model)
        assert same_weights(engine.model, model)  # the engine holds the last version
    assert comparable(histories[1], keys=histories[0][0]) == comparable(histories[0])
    assert same_weights(*models)


# -- the schedule -------------------------------------------------------------------------------------

def test_every_batch_is_sampled_by_exactly_the_weights_k_updates_old(tokenizer, tiny_model):
    k, steps = 2, 5
    base = copy.deepcopy(tiny_model)
    agent = GRPO(copy.deepcopy(base), tokenizer, lr=1e-2, kl_coef=0.0, **SMALL)
    versions = [copy.deepcopy(agent.model.state_dict())]  # versions[v]: the weights after v updates
    batches = []
    update = agent.update

    def recording_update(batch):
        batches.append((batch.input_ids.clone(), batch.old_logprobs.clone(), batch.policy_versions.clone()))
        return update(batch)

    agent.update = recording_update
    agent.learn(copy_env(tokenizer), steps, max_staleness=k,
                callback=lambda row: versions.append(copy.deepcopy(agent.model.state_dict())))
    assert any(not torch.equal(versions[1][n], versions[3][n]) for n in versions[1]), "the updates changed nothing"
    replay = GRPO(copy.deepcopy(base), tokenizer, lr=1e-2, kl_coef=0.0, **SMALL)
    for step, (ids, logprobs, tags) in enumerate(batches):
        version = behaviour_version(step, k)
        assert version == max(0, step - k)
        sampler = copy.deepcopy(base)
        sampler.load_state_dict(versions[version])
        again = replay.collect(copy_env(tokenizer), engine=HFEngine(sampler, tokenizer), step=step)
        assert torch.equal(again.input_ids, ids) and torch.equal(again.old_logprobs, logprobs), f"step {step}"
        sampled = tags[again.action_mask.bool()]
        assert sampled.numel() and bool((sampled == version).all())  # every token tagged with its version


def test_a_pipelined_run_repeats_exactly_and_reports_its_staleness_and_stages(tokenizer, tiny_model):
    runs = []
    for _ in range(2):
        model = copy.deepcopy(tiny_model)
        rows = GRPO(model, tokenizer, lr=3e-3, kl_coef=0.0, **SMALL).learn(copy_env(tokenizer), 4, max_staleness=2)
        runs.append((rows, model))
    (rows, model), (again, model_again) = runs
    assert comparable(rows) == comparable(again) and same_weights(model, model_again)
    for i, row in enumerate(rows):
        age = min(i, 2)  # batches 0-2 are sampled by version 0, then each is 2 updates old
        assert row["behaviour_version"] == max(0, i - 2)
        assert row["staleness_max"] == row["staleness_mean"] == age and row[f"staleness_{age}"] == 1.0
        for stage in ("generate", "verify", "learn"):
            assert row[f"{stage}_busy_s"] >= 0 and row[f"{stage}_idle_s"] >= 0
            assert abs(row[f"{stage}_busy_s"] + row[f"{stage}_idle_s"] - row["wall_s"]) < 1e-9


# -- the correction -----------------------------------------------------------------------------------

def test_only_stale_tokens_are_reweighted_by_the_proximal_over_behaviour_ratio(tokenizer, tiny_model):
    agent = GRPO(tiny_model, tokenizer, kl_coef=0.0, tis_cap=2.0, **SMALL)
    ep = Episode(Task("p"), 0, [1, 5, 6, 7, 2], [0, 1, 1, 1, 1], [0, -1.0, -2.0, -0.5, -0.1], [0, 0, 0, 0, 1.0], 1,
                 policy_versions=[-1, 4, 4, 5, 5])
    behaviour = torch.tensor([[-1.0, -2.0, -0.5, -0.1]])
    proximal = torch.tensor([[-0.5, -2.5, -0.4, -0.3]])

    def corrected(correct: bool):
        batch = Batch.from_episodes([ep])
        batch.advantages = torch.ones_like(batch.action_mask)
        before = (batch.advantages.clone(), batch.old_logprobs.clone())
        agent.learner.correct_staleness = correct
        new, _ = agent.learner.importance_corrected(batch, proximal.clone(), version=5)
        # a new batch: the one passed in keeps its advantages and π_old (nothing rescaled in place)
        assert new is not batch
        assert torch.equal(batch.advantages, before[0]) and torch.equal(batch.old_logprobs, before[1])
        return new

    batch = corrected(True)
    # tokens of version 4 are one update old: min(exp(prox − behav), 2); version-5 tokens are fresh: 1
    expected = torch.tensor([[min(math.exp(0.5), 2.0), math.exp(-0.5), 1.0, 1.0]])
    assert torch.allclose(batch.advantages, expected)
    assert torch.equal(batch.old_logprobs, proximal)  # PPO's clip is centred on the proximal policy
    off = corrected(False)
    assert torch.equal(off.advantages, torch.ones_like(off.advantages)) and torch.equal(off.old_logprobs, proximal)


# Measured for this test's run (GRPO, lr 3e-3, 2 prompts × 4, 8 steps of length_env) over agent and
# model seeds 0-3 × torch threads 1 and 2 (identical at this size), the mean over steps 3-8 of the mean
# |log π_prox − log π_behav|: K=0 6.0e-8..7.4e-8 (the engine's KV-cache kernels vs the learner's
# forward), K=1 0.053..0.075, K=2 0.121..0.139; K=2 / K=1 = 1.64..2.63; every K≥1 step's weights
# straddle 1. Margins: K=0 under 1e-4, K=1 over 100× that floor, K=2 over 1.2× K=1.
DRIFT_K0_MAX = 1e-4
DRIFT_GROWTH = 1.2


def test_the_importance_weights_drift_with_staleness_and_are_exactly_one_without_it(tokenizer, tiny_model):
    drift, weights = {}, {}
    for k in (0, 1, 2):
        agent = GRPO(copy.deepcopy(tiny_model), tokenizer, lr=3e-3, kl_coef=0.0, **SMALL)
        rows = agent.learn(length_env(tokenizer), 8, max_staleness=k)[2:]  # from step 3 every batch is K stale
        drift[k] = sum(r["behaviour_log_ratio_abs"] for r in rows) / len(rows)
        weights[k] = [(r["is_weight_min"], r["is_weight_max"]) for r in rows]
    assert all(low == high == 1.0 for low, high in weights[0]) and drift[0] < DRIFT_K0_MAX
    assert drift[2] > DRIFT_GROWTH * drift[1] > DRIFT_GROWTH * 100 * drift[0], drift
    assert all(low < 1.0 < high for low, high in weights[1] + weights[2]), weights


def test_without_the_correction_the_same_stale_batches_train_differently(tokenizer, tiny_model):
    runs = []
    for correct in (True, False):
        agent = GRPO(copy.deepcopy(tiny_model), tokenizer, lr=3e-3, kl_coef=0.0, **SMALL)
        agent.learner.correct_staleness = correct
        runs.append((Pipeline(agent, length_env(tokenizer), max_staleness=2).run(4), agent.model))
    (on, model_on), (off, model_off) = runs
    assert comparable(on[:1]) == comparable(off[:1])  # step 1 is fresh: nothing to correct
    assert [r["is_corrected"] for r in on] == [0.0, 1.0, 1.0, 1.0] and [r["is_corrected"] for r in off] == [0.0] * 4
    # step 2 updates on the same stale batch from the same weights: the same weights are measured, and
    # applying them changes the loss and the update
    assert on[1]["is_weight_mean"] == off[1]["is_weight_mean"] and on[1]["is_weight_min"] < 1 < on[1]["is_weight_max"]
    assert on[1]["loss"] != off[1]["loss"] and not same_weights(model_on, model_off)


# -- where the work runs --------------------------------------------------------------------------

class GatedCheck:
    """A verifier whose first check waits until ``gate`` is set (or :data:`WAIT_S` passes)."""

    def __init__(self, gate: threading.Event):
        self.gate, self.calls, self.overlapped = gate, 0, None
        self.lock = threading.Lock()

    def __call__(self, task, completion):
        with self.lock:
            self.calls += 1
            first = self.calls == 1
        if first:
            self.overlapped = self.gate.wait(WAIT_S)
        return float(completion.strip() == str(task.answer))


def counting_generate(monkeypatch, target: int) -> threading.Event:
    """An event set once ``HFEngine.generate`` has been called ``target`` times."""
    reached, calls = threading.Event(), []
    original = HFEngine.generate

    def generate(self, *args, **kwargs):
        calls.append(1)
        if len(calls) >= target:
            reached.set()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(HFEngine, "generate", generate)
    return reached


def test_the_next_batch_is_generated_while_this_one_is_verified(tokenizer, tiny_model, monkeypatch):
    second_batch_generated = counting_generate(monkeypatch, 2)
    check = GatedCheck(second_batch_generated)  # batch 0's first check waits for batch 1's generation
    env = SequenceEnv(lambda rng: Task("copy:12=", answer="12"), check, tokenizer)
    GRPO(tiny_model, tokenizer, kl_coef=0.0, **SMALL).learn(env, 2, max_staleness=1, verify_workers=2)
    assert check.overlapped is True, "batch 1 was generated only after batch 0's verification ended"


def test_the_learner_updates_while_the_next_batch_is_generated(tokenizer, tiny_model, monkeypatch):
    second_batch_generated = counting_generate(monkeypatch, 2)
    agent = GRPO(tiny_model, tokenizer, kl_coef=0.0, **SMALL)
    update, overlapped = agent.update, []

    def gated_update(batch):  # the update on batch 0 finishes only once batch 1 has been generated
        if not overlapped:
            overlapped.append(second_batch_generated.wait(WAIT_S))
        return update(batch)

    agent.update = gated_update
    agent.learn(copy_env(tokenizer), 2, max_staleness=1)
    assert overlapped == [True], "batch 1 was generated only after the update on batch 0"


@pytest.mark.parametrize("env_id, kwargs", [("llmgym/CopyRetry-v0", {}), ("llmgym/Copy-v0", {"level": "token"})],
                         ids=["multi-turn", "token-level"])
def test_multi_turn_and_token_level_envs_run_pipelined(env_id, kwargs, tokenizer, tiny_model):
    agent = REINFORCE(tiny_model, tokenizer, tasks_per_step=4, max_new_tokens=4, seed=1)
    rows = agent.learn(gym.make(env_id, tokenizer=tokenizer, **kwargs), 3, max_staleness=1)
    assert [r["staleness_max"] for r in rows] == [0.0, 1.0, 1.0]


# -- checkpoints --------------------------------------------------------------------------------------

def test_a_checkpoint_at_a_drain_step_resumes_exactly(tokenizer, tiny_model):
    options = dict(max_staleness=1, drain_every=2)
    straight_model = copy.deepcopy(tiny_model)
    straight = GRPO(straight_model, tokenizer, lr=1e-2, **SMALL).learn(copy_env(tokenizer), 4, **options)
    first = GRPO(copy.deepcopy(tiny_model), tokenizer, lr=1e-2, **SMALL)
    head = first.learn(copy_env(tokenizer), 2, **options)
    resumed_model = copy.deepcopy(tiny_model)
    resumed = GRPO(resumed_model, tokenizer, lr=1e-2, **SMALL)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    tail = resumed.learn(copy_env(tokenizer), 2, **options)
    assert comparable(head + tail) == comparable(straight) and same_weights(resumed_model, straight_model)
    assert [r["behaviour_version"] for r in straight] == [0, 0, 2, 2]  # the schedule restarts at step 2


# -- errors -------------------------------------------------------------------------------------------

def test_bad_settings_are_refused_before_any_work(tokenizer, tiny_model):
    agent = GRPO(tiny_model, tokenizer, **SMALL)
    env = copy_env(tokenizer)
    for kwargs, message in ((dict(max_staleness=-1), "max_staleness must be an int >= 0"),
                            (dict(max_staleness=1, verify_workers=0), "verify_workers must be an int >= 1"),
                            (dict(max_staleness=1, drain_every=0), "drain_every must be an int >= 1")):
        with pytest.raises(ValueError, match=message):
            agent.learn(env, 1, **kwargs)
    with pytest.raises(ValueError, match="pass max_staleness=K too"):
        agent.learn(env, 1, verify_workers=4)
    dpo = DPO(tiny_model, tokenizer, tasks_per_step=2, group_size=2, max_new_tokens=3)
    with pytest.raises(ValueError, match="DPO cannot train on stale samples"):
        dpo.learn(env, 1, max_staleness=1)
    assert agent.step_count == 0 and dpo.step_count == 0


def test_a_verifier_that_cannot_run_stops_the_run_and_every_thread(tokenizer, tiny_model):
    def unavailable(task, completion):
        raise VerifierUnavailableError("the judge is down")

    env = SequenceEnv(lambda rng: Task("copy:12=", answer="12"), unavailable, tokenizer)
    agent = GRPO(tiny_model, tokenizer, **SMALL)
    with pytest.raises(VerifierUnavailableError, match="the judge is down"):
        agent.learn(env, 3, max_staleness=1)
    assert agent.step_count == 0
    assert not [t for t in threading.enumerate() if t.name.startswith(("llmgym-rollout", "llmgym-verify"))]
    assert agent.engine.generate  # the agent's own engine is back in place (generating raised while it ran)
    assert isinstance(agent.engine, HFEngine)
