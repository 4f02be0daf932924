"""Gymnasium's conventions kept: bounded text spaces that vector envs batch, picklable envs, JSON specs.

The registry walk covers every registered id for pickling and ``spec.to_json()`` (reasoning-gym and
data envs on the same cheap path as tests/env/test_registry.py: make, reset once); async vector envs
spawn processes, so they run for a few representative ids only.
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces.utils import flatdim, flatten, flatten_space, unflatten
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

import llmgym
from llmgym import SequenceEnv, Task, register_env
from llmgym.env.spaces import DEFAULT_MAX_CHARS, DEFAULT_MAX_TOKENS, AnyText, TokenIds
from test_registry import DATA_KWARGS

UNICODE = "naïve ∑ x² — 🙂\x00\n\t\ud800"  # non-ASCII, astral, NUL and a lone surrogate: all valid str


def _ids():
    return [e.id for e in llmgym.registered_envs()]


def _make(env_id, **kwargs):
    for module in llmgym.env_info(env_id).requires:
        pytest.importorskip(module)
    return gym.make(env_id, **DATA_KWARGS.get(env_id, {}), **kwargs)


# -- spaces --------------------------------------------------------------------------------------
def test_text_spaces_have_a_documented_default_bound(tokenizer):
    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer).unwrapped
    assert env.observation_space["prompt"] == AnyText(DEFAULT_MAX_CHARS) == AnyText()
    assert env.action_space.max_length == DEFAULT_MAX_CHARS == 65_536
    assert env.observation_space["prompt_ids"] == TokenIds(len(tokenizer), DEFAULT_MAX_TOKENS)


def test_flatten_round_trips_any_unicode_the_space_contains():
    space = AnyText(max_length=32)
    assert UNICODE in space
    flat = flatten(space, UNICODE)
    assert flat.shape == (32,) == (flatdim(space),) and flat in flatten_space(space)
    assert unflatten(space, flat) == UNICODE
    assert unflatten(space, flatten(space, "")) == ""


def test_flatten_of_text_over_the_bound_says_which_bound():
    space = AnyText(max_length=4)
    assert "abcde" not in space
    with pytest.raises(ValueError, match="5 characters does not fit AnyText.*max_length"):
        flatten(space, "abcde")


def test_batch_space_and_concatenate_keep_unicode():
    space = gym.spaces.Dict({"prompt": AnyText(64), "prompt_ids": TokenIds(10, 8)})
    batched = batch_space(space, 2)
    items = [{"prompt": UNICODE, "prompt_ids": np.array([1, 2])}, {"prompt": "b", "prompt_ids": np.array([3])}]
    out = concatenate(space, items, create_empty_array(space, 2))
    assert out["prompt"] == (UNICODE, "b") and out in batched
    assert [x["prompt"] for x in iterate(batched, out)] == [UNICODE, "b"]


def test_env_rejects_an_observation_over_its_bound_with_the_knob_to_turn():
    env = SequenceEnv([Task("x" * 20)], lambda t, c: 1.0, max_prompt_chars=10)
    with pytest.raises(ValueError, match="max_prompt_chars=10"):
        env.reset(seed=0)


# -- async vector envs ---------------------------------------------------------------------------
# one of each kind: toy, multi-turn toy, math (math-verify), reasoning-gym, a game, code
ASYNC_SAMPLE = ["llmgym/Copy-v0", "llmgym/CopyRetry-v0", "llmgym/Arithmetic-v0", "llmgym/RG-basic_arithmetic-v0",
                "llmgym/GuessNumber-v0", "llmgym/MBPP-v0"]


def _vector_step(env_id, mode, **kwargs):
    envs = gym.make_vec(env_id, num_envs=2, vectorization_mode=mode, **kwargs)
    try:
        first, _ = envs.reset(seed=7)
        after, rewards, *_ = envs.step(("12", "34"))
        return first, after, rewards
    finally:
        envs.close()


@pytest.mark.parametrize("with_tokenizer", [False, True], ids=["text", "tokenizer"])
@pytest.mark.parametrize("env_id", ASYNC_SAMPLE)
def test_async_vector_env_returns_the_real_observations(env_id, with_tokenizer, tokenizer):
    for module in llmgym.env_info(env_id).requires:
        pytest.importorskip(module)
    kwargs = {"tokenizer": tokenizer} if with_tokenizer else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a_first, a_after, a_rewards = _vector_step(env_id, "async", **kwargs)
        s_first, s_after, s_rewards = _vector_step(env_id, "sync", **kwargs)
    assert a_first["prompt"] == s_first["prompt"] and a_after["prompt"] == s_after["prompt"]
    assert all(isinstance(p, str) and 0 < len(p) < 10_000 for p in a_first["prompt"])  # not 65,536 padding chars
    assert a_rewards.tolist() == s_rewards.tolist()
    if with_tokenizer:
        for a, s in zip(a_after["prompt_ids"], s_after["prompt_ids"]):
            assert a.dtype == np.int64 and a.tolist() == s.tolist()
        assert [tokenizer.decode(ids, skip_special_tokens=True) for ids in a_first["prompt_ids"]] == list(
            a_first["prompt"])


def test_async_token_level_and_unshared_memory(tokenizer):
    envs = gym.make_vec("llmgym/Copy-v0", num_envs=2, vectorization_mode="async", tokenizer=tokenizer,
                        level="token", max_new_tokens=2)
    obs, _ = envs.reset(seed=0)
    prompts = obs["prompt"]
    digit = tokenizer.convert_tokens_to_ids("5")
    obs, *_ = envs.step(np.array([digit, digit]))
    assert [ids[-1] for ids in obs["prompt_ids"]] == [digit, digit]
    assert all(p.endswith("5") for p in obs["prompt"])
    envs.close()
    unshared = gym.make_vec("llmgym/Copy-v0", num_envs=2, vectorization_mode="async", tokenizer=tokenizer,
                            vector_kwargs={"shared_memory": False})
    assert unshared.reset(seed=0)[0]["prompt"] == prompts
    unshared.close()


def test_shared_memory_view_without_copy_follows_the_workers():
    envs = gym.make_vec("llmgym/Copy-v0", num_envs=2, vectorization_mode="async",
                        vector_kwargs={"copy": False})
    obs, _ = envs.reset(seed=0)
    before = tuple(obs["prompt"])
    envs.step(("1", "2"))
    assert tuple(obs["prompt"]) == (before[0] + "1", before[1] + "2")  # a live view, like a Box batch
    assert copy.deepcopy(obs["prompt"]) == tuple(obs["prompt"]) and pickle.loads(pickle.dumps(obs["prompt"])) == tuple(obs["prompt"])
    envs.close()


def _run_episode_in_a_worker(env):
    obs, info = env.reset(seed=3)
    return obs["prompt"], env.step(info["task"].answer)[1]


def test_an_env_crosses_a_process_boundary():
    env = gym.make("llmgym/Copy-v0")
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        prompt, reward = pool.apply(_run_episode_in_a_worker, (env,))
    assert prompt == env.reset(seed=3)[0]["prompt"] and reward == 1.0


# -- the registry walk: pickling and JSON specs for every id -----------------------------------
@pytest.mark.parametrize("env_id", _ids())
def test_every_registered_env_pickles_and_its_spec_is_json(env_id, tokenizer):
    spec = gym.spec(env_id)
    assert isinstance(spec.entry_point, str) and isinstance(spec.kwargs["factory"], str)
    restored = gym.envs.registration.EnvSpec.from_json(spec.to_json())
    assert restored == spec
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = _make(env_id)
        clone = pickle.loads(pickle.dumps(env))
        assert clone.reset(seed=0)[0] == env.reset(seed=0)[0]
        if llmgym.env_info(env_id).family != "reasoning-gym":  # 105 of them: one tokenizer pickle suffices
            with_tok = _make(env_id, tokenizer=tokenizer)
            obs = pickle.loads(pickle.dumps(with_tok)).reset(seed=0)[0]
            assert obs["prompt_ids"].tolist() == with_tok.reset(seed=0)[0]["prompt_ids"].tolist()


def make_echo(tokenizer=None):
    return SequenceEnv([Task("say hi", answer="hi")], exact_match, tokenizer)


def exact_match(task, completion):
    return completion == task.answer


def test_register_env_stores_an_importable_callable_as_a_string():
    env_id = register_env("ConventionsEcho", make_echo, family="example")
    spec = gym.spec(env_id)
    assert spec.kwargs["factory"] == f"{__name__}:make_echo"
    assert json.loads(spec.to_json())["entry_point"] == "llmgym.env.registry:make_env"
    assert pickle.loads(pickle.dumps(gym.make(env_id))).reset(seed=0)[0]["prompt"] == "say hi"


def test_register_env_keeps_a_lambda_which_makes_and_vectorises_but_cannot_serialise():
    env_id = register_env("ConventionsLambda", lambda tokenizer=None: SequenceEnv([Task("q")], lambda t, c: 1.0, tokenizer),
                          family="example")
    assert gym.make(env_id).reset(seed=0)[0]["prompt"] == "q"
    for mode in ("sync", "async"):  # Gymnasium cloudpickles what it sends async workers
        envs = gym.make_vec(env_id, num_envs=2, vectorization_mode=mode)
        assert envs.reset(seed=0)[0]["prompt"] == ("q", "q")
        envs.close()
    with pytest.raises((TypeError, ValueError), match="not JSON serializable|Callable found"):
        gym.spec(env_id).to_json()
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        pickle.dumps(gym.make(env_id))


# -- the passive checker, once per rollout ---------------------------------------------------------


@pytest.mark.parametrize("level", ["sequence", "token"])
def test_a_rollout_runs_gymnasiums_passive_checks_once_not_once_per_row(level, monkeypatch):
    """The rows of a rollout are clones of one env: Gymnasium's PassiveEnvChecker checks the first
    clone's reset and step (as it checks a user's env once), not each of the 64 rows of every step."""
    import gymnasium.wrappers.common as common

    from llmgym.engines import HFEngine, SamplingParams
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer
    from llmgym.rollout.episodes import collect_episodes

    calls = {"reset": 0, "step": 0}
    real_reset, real_step = common.env_reset_passive_checker, common.env_step_passive_checker

    def counting(kind, real):
        def check(*args, **kwargs):
            calls[kind] += 1
            return real(*args, **kwargs)
        return check

    monkeypatch.setattr(common, "env_reset_passive_checker", counting("reset", real_reset))
    monkeypatch.setattr(common, "env_step_passive_checker", counting("step", real_step))
    tok = build_tokenizer()
    engine = HFEngine(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)), tok)
    env = gym.make("llmgym/Copy-v0", tokenizer=tok, **({"level": "token", "max_new_tokens": 4} if level == "token" else {}))
    for _ in range(2):
        episodes, _ = collect_episodes(env, engine, num_tasks=2, group_size=4, sampling=SamplingParams(max_new_tokens=4),
                                       seed=0)
        assert len(episodes) == 8 and all(e.completion_ids for e in episodes)
    assert calls["step"] == 2 and calls["reset"] <= 3  # one check per rollout (+ the draw's first reset)
