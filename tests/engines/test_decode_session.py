"""Incremental decoding: a KV cache that follows the episode, equal to recomputing the whole context."""

from __future__ import annotations

import random

import gymnasium as gym
import numpy as np
import pytest
import torch

import llmgym  # noqa: F401
from llmgym.engines import HFEngine, SamplingParams, TokenStepper, open_decode_session
from llmgym.engines.session import HFDecodeSession, RecomputeSession
from llmgym.rollout.episodes import collect_episodes

ATOL = 1e-4


class NoSessionEngine:
    """An engine with next_token_logits but no open_session: the recomputing fallback."""

    def __init__(self, engine):
        self.inner = engine
        self.tokenizer, self.eos_ids, self.pad_id = engine.tokenizer, engine.eos_ids, engine.pad_id

    def generate(self, *args, **kwargs):
        return self.inner.generate(*args, **kwargs)

    def next_token_logits(self, contexts):
        return self.inner.next_token_logits(contexts)

    def sync_weights(self, model):
        self.inner.sync_weights(model)


class RecordingEngine(HFEngine):
    """HFEngine that keeps the sessions it opens (to read their counters)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sessions = []

    def open_session(self, contexts=()):
        session = super().open_session(contexts)
        self.sessions.append(session)
        return session


def recomputed(engine, context):
    return engine.next_token_logits([context])[0]


def test_random_joins_extends_and_drops_match_recomputing(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    rng = random.Random(0)

    def ids(n):
        return [rng.randrange(3, 250) for _ in range(n)]

    contexts = [ids(rng.randrange(1, 12)) for _ in range(5)]
    session = engine.open_session(contexts)
    truth = dict(zip(session.rows, contexts))
    for step in range(25):
        grow = {}
        for row in session.rows:
            u = rng.random()
            if u < 0.6:
                grow[row] = ids(1)  # a sampled token
            elif u < 0.8:
                grow[row] = ids(rng.randrange(2, 7))  # a token and an env reply
        session.extend(grow)
        for row, new in grow.items():
            truth[row] += new
        if step % 4 == 1 and len(session.rows) > 1:
            row = rng.choice(session.rows)
            session.drop([row])
            del truth[row]
        if step % 5 == 2:
            (row,) = session.add([ids(rng.randrange(1, 20))])
            truth[row] = session.context(row)
        rows = session.rows
        assert sorted(rows) == sorted(truth)
        full = torch.stack([recomputed(engine, truth[r]) for r in rows])
        assert (session.logits(rows) - full).abs().max() < ATOL, step
        assert all(session.context(r) == truth[r] for r in rows)
    assert session.prefills == 1 + 5  # the first batch and each joining row; never a recompute


def test_a_long_row_leaving_frees_its_columns(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    session = engine.open_session([list(range(3, 40)), [5, 6]])
    long_row, short_row = session.rows
    session.extend({short_row: [7]})
    session.drop([long_row])
    assert session._mask.shape[1] == 3  # only the short row's columns are left
    session.extend({short_row: [8]})
    assert (session.logits([short_row])[0] - recomputed(engine, [5, 6, 7, 8])).abs().max() < ATOL


def test_session_errors_name_the_problem(tiny_model, tokenizer):
    session = HFEngine(tiny_model, tokenizer).open_session([[5, 6]])
    with pytest.raises(KeyError, match="not live"):
        session.extend({7: [1]})
    with pytest.raises(ValueError, match="at least one token"):
        session.add([[]])


def test_engines_without_a_cache_fall_back_and_vllm_like_engines_are_refused(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    assert isinstance(open_decode_session(engine, [[5, 6]]), HFDecodeSession)
    fallback = open_decode_session(NoSessionEngine(engine), [[5, 6]])
    assert isinstance(fallback, RecomputeSession)
    fallback.extend({0: [7]})
    assert (fallback.logits([0])[0] - recomputed(engine, [5, 6, 7])).abs().max() < ATOL

    class GenerateOnly:  # like VLLMEngine: whole completions only
        def open_session(self, contexts=()):
            raise NotImplementedError("no per-token cache")

        def generate(self, *a, **k): ...

    with pytest.raises(TypeError, match="cannot step one token at a time"):
        open_decode_session(GenerateOnly(), [[5, 6]])
    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer, level="token", max_new_tokens=4)
    with pytest.raises(TypeError, match="cannot drive a token-level env"):
        collect_episodes(env, type("Engine", (), {"tokenizer": tokenizer})(), num_tasks=1, group_size=1, sampling=SamplingParams(max_new_tokens=4), seed=0)


def _same_episodes(a, b, flags=True):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids
        assert x.action_mask == y.action_mask
        assert x.rewards == y.rewards
        assert x.finish_reasons == y.finish_reasons
        if flags:  # (a completion cut at the budget is `truncated` at token level, not at sequence level)
            assert (x.terminated, x.truncated) == (y.terminated, y.truncated)
        assert np.allclose(x.logprobs, y.logprobs, atol=ATOL)


@pytest.mark.parametrize("env_id", ["llmgym/Copy-v0", "llmgym/CopyRetry-v0", "llmgym/GuessNumber-v0"])
def test_token_level_collection_with_the_cache_equals_recomputing_and_sequence_level(env_id, tiny_model, tokenizer):
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0)
    tok_env = gym.make(env_id, tokenizer=tokenizer, level="token", max_new_tokens=6)
    seq_env = gym.make(env_id, tokenizer=tokenizer)
    engine = RecordingEngine(tiny_model, tokenizer, max_batch_size=4)  # 6 rows: two sessions
    kw = dict(num_tasks=3, group_size=2, sampling=sampling, seed=5, max_turns=3)
    cached, _ = collect_episodes(tok_env, engine, **kw)
    plain, _ = collect_episodes(tok_env, NoSessionEngine(HFEngine(tiny_model, tokenizer)), **kw)
    sequence, _ = collect_episodes(seq_env, HFEngine(tiny_model, tokenizer), **kw)
    _same_episodes(cached, plain)
    _same_episodes(cached, sequence, flags=False)
    assert len(engine.sessions) == 2 and all(s.prefills == 1 for s in engine.sessions)
    # every context token (prompts, samples, env replies) went through the model once, up to the
    # episode's last sampled token (which, like a reply after the turn limit, never needs to); a
    # prompt several rows of one session (rows 0-3, 4-5) start with was run once for all of them
    fed = sum(s.tokens_computed for s in engine.sessions)
    prompts = [tuple(e.token_ids[:e.prompt_length]) for e in cached]
    shared_prompts = sum(len(p) for i, p in enumerate(prompts) if p in prompts[(i // 4) * 4:i])
    assert fed == sum(max(j for j, m in enumerate(e.action_mask) if m) for e in cached) - shared_prompts
    if env_id != "llmgym/Copy-v0":
        assert any(e.num_turns > 1 for e in cached)  # the env replied and the cache took the reply


class EveryToken(gym.Wrapper):
    """A user's wrapper that watches every token step (here: counts them, adds a dense reward)."""

    def __init__(self, env):
        super().__init__(env)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward + 0.25, terminated, truncated, {**info, "seen": self.steps}


def test_direct_token_level_is_llmgyms_own_env_under_gymnasiums_pass_through_wrappers_only(tokenizer):
    from llmgym import TokenLevel
    from llmgym.env.vector import clone_envs
    from llmgym.rollout.episodes import _direct_token_level

    made = gym.make("llmgym/Copy-v0", tokenizer=tokenizer, level="token", max_new_tokens=4)
    assert all(isinstance(_direct_token_level(e), TokenLevel) for e in [made, *clone_envs(made, 2)])
    limited = gym.make("llmgym/Copy-v0", tokenizer=tokenizer, level="token", max_new_tokens=4, max_episode_steps=50)
    patched = clone_envs(made, 1)[0]
    patched.step = lambda action: made.step(action)
    subclass = type("Sub", (TokenLevel,), {})(gym.make("llmgym/Copy-v0", tokenizer=tokenizer))
    for env in [EveryToken(made), limited, patched, subclass]:  # something above (or in) it sees every token
        assert _direct_token_level(env) is None


def test_token_level_rows_take_a_step_per_turn_unless_a_wrapper_watches_every_token(tiny_model, tokenizer,
                                                                                    monkeypatch):
    from llmgym import TokenLevel
    from llmgym.rollout import episodes as episodes_module

    steps = {"n": 0}
    real_step, real_direct = TokenLevel.step, episodes_module._direct_token_level

    def counted(self, action):
        steps["n"] += 1
        return real_step(self, action)

    monkeypatch.setattr(TokenLevel, "step", counted)
    engine = HFEngine(tiny_model, tokenizer)
    kw = dict(num_tasks=2, group_size=2, sampling=SamplingParams(max_new_tokens=5, temperature=1.0), seed=3,
              max_turns=3)
    for env_id in ["llmgym/Copy-v0", "llmgym/CopyRetry-v0"]:
        env = gym.make(env_id, tokenizer=tokenizer, level="token", max_new_tokens=5)
        steps["n"] = 0
        fast, _ = collect_episodes(env, engine, **kw)  # the turn's last token steps, the others are buffered
        assert steps["n"] == sum(e.num_turns for e in fast) < sum(sum(e.action_mask) for e in fast)
        monkeypatch.setattr(episodes_module, "_direct_token_level", lambda e: None)
        steps["n"] = 0
        every, _ = collect_episodes(env, engine, **kw)  # every token through env.step
        monkeypatch.setattr(episodes_module, "_direct_token_level", real_direct)
        assert steps["n"] == sum(sum(e.action_mask) for e in every)
        _same_episodes(fast, every)
        assert [e.info for e in fast] == [e.info for e in every]
        if env_id != "llmgym/Copy-v0":
            assert any(e.num_turns > 1 for e in fast)
        watched = EveryToken(env)
        wrapped, _ = collect_episodes(watched, engine, **kw)
        # the user's wrapper saw every token (its dense reward is on each); the same tokens were drawn
        assert [e.token_ids for e in wrapped] == [e.token_ids for e in fast]
        for e, f in zip(wrapped, fast):
            assert e.total_reward == pytest.approx(f.total_reward + 0.25 * sum(f.action_mask))
            assert e.info["seen"] == sum(e.action_mask)


def test_token_stepper_reuses_the_cache_along_an_episode_and_rebuilds_on_reset(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    stepper = TokenStepper(engine)
    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer, level="token", max_new_tokens=8)
    for episode in range(2):
        obs, _ = env.reset(seed=episode)
        steps, done = 0, False
        while not done:
            logits = stepper.next_token_logits([obs["prompt_ids"]])
            assert (logits[0] - recomputed(engine, obs["prompt_ids"].tolist())).abs().max() < ATOL
            obs, _, terminated, truncated, _ = env.step(int(logits[0].argmax()))
            steps, done = steps + 1, terminated or truncated
        assert stepper.rebuilds == episode + 1  # one per episode: the reset
    assert stepper.reuses > 0


def test_token_stepper_is_correct_under_interleaved_episodes(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    sampling = dict(temperature=1.0, top_p=1.0)
    from llmgym.engines import sample_next_token

    def run(interleaved: bool, stepper_factory):
        envs = [gym.make("llmgym/CopyRetry-v0", tokenizer=tokenizer, level="token", max_new_tokens=5)
                for _ in range(3)]
        obs = [e.reset(seed=10 + i)[0] for i, e in enumerate(envs)]
        trace = [[] for _ in envs]
        live = [0, 1, 2]
        stepper = stepper_factory()
        order = (lambda: list(live)) if interleaved else (lambda: live[:1])
        while live:
            for i in order():
                logits = stepper.next_token_logits([obs[i]["prompt_ids"]])
                key = torch.tensor([1000 * i + len(trace[i])])
                tok, _ = sample_next_token(logits, key, torch.zeros(1, dtype=torch.long), **sampling)
                obs[i], reward, terminated, truncated, _ = envs[i].step(int(tok[0]))
                trace[i].append((int(tok[0]), reward))
                if terminated or truncated:
                    live.remove(i)
        return trace, stepper

    one_at_a_time, _ = run(False, lambda: NoSessionEngine(engine))
    interleaved, stepper = run(True, lambda: TokenStepper(engine, max_contexts=4))
    assert interleaved == one_at_a_time
    assert stepper.rebuilds == 3  # one cache per episode, kept across the others' steps and the env's replies
    assert stepper.reuses == sum(len(t) for t in interleaved) - 3
    squeezed, small = run(True, lambda: TokenStepper(engine, max_contexts=1))  # evictions: still correct
    assert squeezed == one_at_a_time and small.rebuilds > 3


def test_token_stepper_drops_its_cache_when_the_weights_change(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    stepper = TokenStepper(engine)
    before = stepper.next_token_logits([[5, 6, 7]])
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.add_(0.05)
    after = stepper.next_token_logits([[5, 6, 7]])
    assert not torch.allclose(before, after)
    assert (after[0] - recomputed(engine, [5, 6, 7])).abs().max() < ATOL


def test_agent_act_at_token_level_reuses_the_cache_and_keeps_its_tokens(tiny_model, tokenizer):
    from llmgym.agents import GRPO

    def play(engine):
        agent = GRPO(tiny_model, tokenizer, seed=1, max_new_tokens=6, engine=engine)
        env = gym.make("llmgym/CopyRetry-v0", tokenizer=tokenizer, level="token", max_new_tokens=6)
        tokens = []
        for episode in range(2):
            obs, _ = env.reset(seed=episode)
            done = False
            while not done:
                token = agent.act(obs, level="token")
                tokens.append(token)
                obs, _, terminated, truncated, _ = env.step(token)
                done = terminated or truncated
        return tokens, agent

    cached, agent = play(HFEngine(tiny_model, tokenizer))
    plain, _ = play(NoSessionEngine(HFEngine(tiny_model, tokenizer)))
    assert cached == plain
    assert agent._token_stepper.rebuilds == 2 and agent._token_stepper.reuses == len(cached) - 2


def test_a_rollout_leaves_a_training_model_in_training_mode(tiny_model, tokenizer):
    env = gym.make("llmgym/CopyRetry-v0", tokenizer=tokenizer, level="token", max_new_tokens=4)
    kw = dict(num_tasks=2, group_size=2, sampling=SamplingParams(max_new_tokens=4), seed=1, max_turns=2)
    engine = HFEngine(tiny_model, tokenizer)
    tiny_model.eval()
    expected, _ = collect_episodes(env, engine, **kw)
    tiny_model.train()
    got, _ = collect_episodes(env, engine, **kw)
    assert tiny_model.training
    _same_episodes(got, expected)


def test_a_rollout_reads_the_engines_optional_members_once_and_the_version_per_call(tiny_model, tokenizer):
    from llmgym.engines.base import OPTIONAL_MEMBERS, EngineView

    class Counting:
        """An engine whose reads of optional members are counted; its version moves at every generate."""

        def __init__(self, engine):
            self.inner, self.reads, self.version = engine, {}, 0
            self.tokenizer, self.pad_id, self.max_batch_size = engine.tokenizer, engine.pad_id, 2

        def __getattribute__(self, name):
            if name in OPTIONAL_MEMBERS:
                reads = object.__getattribute__(self, "reads")
                reads[name] = reads.get(name, 0) + 1
            return object.__getattribute__(self, name)

        @property
        def policy_version(self):
            return self.version

        def generate(self, *args, **kwargs):
            self.version += 1
            return self.inner.generate(*args, **kwargs)

        def sync_weights(self, model):
            self.inner.sync_weights(model)

    engine = Counting(HFEngine(tiny_model, tokenizer))
    env = gym.make("llmgym/Copy-v0", tokenizer=tokenizer)
    episodes, _ = collect_episodes(env, engine, num_tasks=2, group_size=2, sampling=SamplingParams(max_new_tokens=3),
                                   seed=0)
    assert {n: c for n, c in engine.reads.items() if n != "policy_version"} == {
        n: 1 for n in ("eos_ids", "max_batch_size", "generation_done", "open_session", "next_token_logits")}
    assert engine.reads["policy_version"] == 2  # once per engine batch: 4 rows, 2 at a time
    assert [ep.policy_versions[-1] for ep in episodes] == [1, 1, 2, 2]
    view = EngineView.of(engine)
    assert (view.max_batch_size, view.eos_ids, view.steps_tokens) == (2, (), False)
