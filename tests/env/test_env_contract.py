"""The env contract: tasks, verifiers, sequence/multi-turn/token levels, errors, determinism."""

from __future__ import annotations

import multiprocessing
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

import llmgym
from llmgym import MultiTurnEnv, Score, SequenceEnv, Task, TokenLevel, Turn, Verifier


def exact(task, text):
    return float(text.strip() == task.answer)


TASKS = [Task("1+1=", answer="2", id="a"), Task("2+2=", answer="4", id="b"), Task("3+3=", answer="6", id="c")]


# -- tasks and verifiers ------------------------------------------------------------------------
def test_task_accepts_chat_messages_and_rejects_garbage():
    t = Task([{"role": "user", "content": "hi"}], answer="x")
    assert t.is_chat and t.prompt[0]["content"] == "hi"
    with pytest.raises(TypeError, match="chat messages"):
        Task([{"text": "no role"}])


def test_plain_function_verifier_returning_float_or_score():
    env = SequenceEnv(TASKS, lambda t, c: Score(0.5, {"why": "half"}))
    env.reset(seed=0)
    _, reward, *_, info = env.step("x")
    assert reward == 0.5 and info["score"] == {"why": "half"}


def test_verifier_exception_becomes_zero_reward_with_error():
    def broken(task, text):
        raise ZeroDivisionError("boom")

    env = SequenceEnv(TASKS, broken)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("2")
    assert reward == 0.0 and terminated
    assert "ZeroDivisionError: boom" in info["error"]


def test_verifier_timeout_becomes_zero_reward_even_off_the_main_thread():
    release = threading.Event()

    class Hung(Verifier):
        def verify(self, task, completion):
            release.wait(300)  # hangs until the test lets it go
            return 1.0

    results = []
    children_before = set(multiprocessing.active_children())  # e.g. another test's worker pool
    threads_before = set(threading.enumerate())  # e.g. tqdm's monitor, started by an earlier test

    def run():
        env = SequenceEnv(TASKS, Hung(time_limit=0.2))
        env.reset(seed=0)
        started = time.perf_counter()
        _, reward, _, _, info = env.step("2")
        results.append((reward, info["error"], time.perf_counter() - started))

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(120)  # a hang guard only: a loaded machine may be slow, never this slow
    release.set()
    reward, error, elapsed = results[0]
    # the step returned while the verifier was still hung (it would have waited 300 s; a hang guard)
    assert reward == 0.0 and "timeout" in error and elapsed < 120
    # ... and the check was stopped: it ran in a child process that was killed, not in a thread that keeps running
    assert set(multiprocessing.active_children()) <= children_before
    assert [t for t in threading.enumerate() if t.is_alive() and t not in threads_before] == []


def test_verifier_returning_wrong_type_is_reported_not_crashing():
    env = SequenceEnv(TASKS, lambda t, c: "yes")
    env.reset(seed=0)
    _, reward, *_, info = env.step("2")
    assert reward == 0.0 and "must return a float or a Score" in info["error"]


# -- sequence level -----------------------------------------------------------------------------
def test_reset_pins_task_by_object_and_by_id():
    env = SequenceEnv(TASKS, exact)
    obs, info = env.reset(options={"task": TASKS[2]})
    assert obs["prompt"] == "3+3=" and info["task"] is TASKS[2]
    obs, info = env.reset(options={"task_id": "b"})
    assert info["task"].answer == "4"


def test_same_seed_same_task_and_function_sources_are_seeded():
    env = SequenceEnv(lambda rng: Task(f"{rng.integers(1000)}?", answer="0"), exact)
    a = env.reset(seed=42)[0]["prompt"]
    env.reset(seed=1)
    assert env.reset(seed=42)[0]["prompt"] == a


def test_iterable_source_is_taken_in_order_and_exhaustion_is_clear():
    env = SequenceEnv(iter(TASKS[:2]), exact)
    assert env.reset()[1]["task"].id == "a"
    assert env.reset()[1]["task"].id == "b"
    with pytest.raises(ValueError, match="exhausted"):
        env.reset()


def test_single_turn_terminates_and_step_after_end_needs_reset():
    env = SequenceEnv(TASKS, exact)
    env.reset(options={"task": TASKS[0]})
    _, reward, terminated, truncated, info = env.step("2")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["task"] is TASKS[0]
    with pytest.raises(gym.error.ResetNeeded, match="reset"):
        env.step("2")


def test_step_before_reset_is_an_error():
    with pytest.raises(gym.error.ResetNeeded):
        SequenceEnv(TASKS, exact).step("2")


def test_observation_has_prompt_ids_with_tokenizer_and_actions_may_be_ids(tokenizer):
    env = SequenceEnv(TASKS, exact, tokenizer)
    obs, _ = env.reset(options={"task": TASKS[0]})
    assert obs["prompt_ids"].tolist() == tokenizer.encode("1+1=")
    assert obs in env.observation_space
    ids = tokenizer.encode("2", add_special_tokens=False) + [tokenizer.eos_token_id]
    _, reward, *_ = env.step(np.array(ids))
    assert reward == 1.0


def test_empty_task_source_is_a_clear_error():
    with pytest.raises(ValueError, match="task source is empty"):
        SequenceEnv([], exact)


@pytest.mark.parametrize("action", [3.5, {"text": "2"}, [1.5, 2.0], np.zeros((2, 2), dtype=np.int64)])
def test_wrong_action_type_is_a_type_error(tokenizer, action):
    env = SequenceEnv(TASKS, exact, tokenizer)
    env.reset(seed=0)
    with pytest.raises(TypeError, match="completion text .* or a 1-D sequence of token ids"):
        env.step(action)


def test_token_id_outside_vocabulary_is_a_value_error(tokenizer):
    env = SequenceEnv(TASKS, exact, tokenizer)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"token id 99999 is outside the vocabulary \[0, 259\)"):
        env.step([5, 99999])


def test_token_ids_without_tokenizer_is_a_clear_error():
    env = SequenceEnv(TASKS, exact)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="need a tokenizer"):
        env.step([1, 2])


# -- multi-turn ---------------------------------------------------------------------------------
class Guess(MultiTurnEnv):
    def respond(self, completion):
        self.state.setdefault("guesses", []).append(completion)
        if completion.strip() == self.task.answer:
            return Turn(1.0, done=True)
        return Turn(-0.1, reply="no")


def test_multi_turn_replies_until_solved(tokenizer):
    env = Guess(TASKS, tokenizer=tokenizer, max_turns=5)
    obs, _ = env.reset(options={"task": TASKS[0]})
    before = obs["prompt_ids"].tolist()
    wrong = tokenizer.encode("7", add_special_tokens=False)
    obs, reward, terminated, truncated, info = env.step(wrong)
    assert (reward, terminated, truncated, info["reply"], info["turn"]) == (-0.1, False, False, "no", 1)
    # token ids in, token ids out: context + the exact action ids + the encoded reply
    reply_ids = tokenizer.encode("\nno\n", add_special_tokens=False)
    assert obs["prompt_ids"].tolist() == before + wrong + reply_ids
    obs, reward, terminated, truncated, _ = env.step("2")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert env.state["guesses"] == ["7", "2"]


def test_multi_turn_truncates_after_max_turns():
    env = Guess(TASKS, max_turns=2)
    env.reset(options={"task": TASKS[0]})
    assert env.step("0")[2:4] == (False, False)
    _, _, terminated, truncated, _ = env.step("0")
    assert (terminated, truncated) == (False, True)


def test_default_multi_turn_is_a_verifier_retry_loop():
    env = MultiTurnEnv(TASKS, exact, max_turns=3)
    env.reset(options={"task": TASKS[1]})
    _, r1, t1, _, info = env.step("5")
    _, r2, t2, _, _ = env.step("4")
    assert (r1, t1, info["reply"], r2, t2) == (0.0, False, "Incorrect, try again.", 1.0, True)


# -- token level --------------------------------------------------------------------------------
def _token_actions(tokenizer, text, eos=True):
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids + ([tokenizer.eos_token_id] if eos else [])


def test_token_level_rewards_at_eos_and_truncates_at_limit(tokenizer):
    env = TokenLevel(SequenceEnv(TASKS, exact), tokenizer, max_new_tokens=3)
    assert env.action_space == gym.spaces.Discrete(len(tokenizer))
    env.reset(options={"task": TASKS[0]})
    _, r, term, trunc, _ = env.step(tokenizer.convert_tokens_to_ids("2"))
    assert (r, term, trunc) == (0.0, False, False)
    obs, r, term, trunc, info = env.step(tokenizer.eos_token_id)
    assert (r, term, trunc, info["finish_reason"]) == (1.0, True, False, "stop")
    env.reset(options={"task": TASKS[0]})
    for tok in _token_actions(tokenizer, "222", eos=False):
        obs, r, term, trunc, info = env.step(tok)
    assert (term, trunc, info["finish_reason"]) == (False, True, "length")
    with pytest.raises(gym.error.ResetNeeded):
        env.step(5)


def test_token_level_observation_holds_ids_so_far(tokenizer):
    env = TokenLevel(SequenceEnv(TASKS, exact, tokenizer), max_new_tokens=8)
    obs, _ = env.reset(options={"task": TASKS[0]})
    prompt = obs["prompt_ids"].tolist()
    obs, *_ = env.step(50)
    obs, *_ = env.step(51)
    assert obs["prompt_ids"].tolist() == prompt + [50, 51]
    assert obs in env.observation_space


@pytest.mark.parametrize("env_id", ["llmgym/Copy-v0", "llmgym/CopyRetry-v0"])
def test_same_seed_same_tokens_same_episode_at_both_levels(tokenizer, env_id):
    rng = np.random.default_rng(0)
    seq = gym.make(env_id, tokenizer=tokenizer)
    tok = gym.make(env_id, tokenizer=tokenizer, level="token", max_new_tokens=6)
    obs_s, info_s = seq.reset(seed=123)
    obs_t, info_t = tok.reset(seed=123)
    assert info_s["task"] == info_t["task"]
    assert obs_s["prompt_ids"].tolist() == obs_t["prompt_ids"].tolist()
    done_s = done_t = False
    rewards_s, rewards_t = [], []
    while not done_s:
        completion = [int(x) for x in rng.integers(3, 259, size=int(rng.integers(1, 5)))] + [tokenizer.eos_token_id]
        if rng.random() < 0.3:  # sometimes the right answer, so rewards differ from 0
            completion = _token_actions(tokenizer, info_s["task"].answer)
        obs_s, r, term, trunc, _ = seq.step(completion)
        rewards_s.append(r)
        done_s = term or trunc
        for t in completion:
            obs_t, r_t, term_t, trunc_t, info = tok.step(t)
            done_t = term_t or trunc_t
        rewards_t.append(r_t)
        assert obs_t["prompt_ids"].tolist() == obs_s["prompt_ids"].tolist()
    assert done_t and rewards_s == rewards_t


@pytest.mark.parametrize("action", ["a", 2.0, True, np.array([1, 2])])
def test_token_level_wrong_action_type(tokenizer, action):
    env = TokenLevel(SequenceEnv(TASKS, exact), tokenizer)
    env.reset(seed=0)
    with pytest.raises(TypeError, match="one token id"):
        env.step(action)


def test_token_level_out_of_vocabulary(tokenizer):
    env = TokenLevel(SequenceEnv(TASKS, exact), tokenizer)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        env.step(len(tokenizer))


def test_token_level_needs_eos(tokenizer):
    import copy

    no_eos = copy.deepcopy(tokenizer)
    no_eos.eos_token = None
    with pytest.raises(ValueError, match="EOS"):
        TokenLevel(SequenceEnv(TASKS, exact), no_eos)


# -- grouped / vectorised use -------------------------------------------------------------------
def test_group_of_envs_samples_one_task_g_times(tokenizer):
    group = llmgym.make_group(gym.make("llmgym/Copy-v0", tokenizer=tokenizer), 4)
    _, info = group.reset(seed=0)
    task = info["task"][0]
    obs, info = group.reset(options={"task": task})
    assert len(set(obs["prompt"])) == 1 and all(t == task for t in info["task"])
    _, rewards, terminated, _, _ = group.step([task.answer, "0", task.answer, ""])
    assert rewards.tolist() == [1.0, rewards[1], 1.0, 0.0] and terminated.all()


def test_render_ansi_shows_the_transcript():
    env = SequenceEnv(TASKS, exact, render_mode="ansi")
    env.reset(options={"task": TASKS[0]})
    env.step("2")
    assert env.render() == "1+1=2"


def test_non_finite_reward_becomes_zero_with_error():
    env = SequenceEnv(TASKS, lambda t, c: float("nan"))
    env.reset(seed=0)
    _, reward, *_, info = env.step("2")
    assert reward == 0.0 and "non-finite" in info["error"]


def test_render_mode_reaches_user_factories_that_do_not_take_it():
    llmgym.register_env("RenderProbe", lambda tokenizer=None: SequenceEnv(TASKS, exact, tokenizer))
    env = gym.make("llmgym/RenderProbe-v0", render_mode="ansi")
    env.reset(options={"task": TASKS[0]})
    env.step("2")
    assert env.render() == "1+1=2"


def test_a_verifier_or_agent_missing_its_hook_fails_at_construction(tiny_model, tokenizer):
    from llmgym.agents import Agent

    class NoVerify(Verifier):
        pass

    class NoLoss(Agent):
        def compute_advantages(self, batch):
            pass

    with pytest.raises(TypeError, match="abstract method.*verify"):
        NoVerify()
    with pytest.raises(TypeError, match="abstract method.*loss"):
        NoLoss(tiny_model, tokenizer)


def test_a_transcript_that_outgrows_the_observation_space_ends_the_episode_instead_of_crashing(tokenizer):
    # the policy controls the completion's length: a long one must not crash a training run
    env = MultiTurnEnv([Task("say hi", answer="hi")], lambda t, c: c == t.answer, tokenizer,
                       max_turns=5, max_prompt_chars=64, max_prompt_tokens=64)
    obs, _ = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("x" * 30)  # still fits: the episode goes on
    assert not (terminated or truncated) and env.observation_space.contains(obs)
    obs, reward, terminated, truncated, info = env.step("y" * 100)
    assert truncated and not terminated and reward == 0.0
    assert "max_prompt_chars=64" in info["error"]
    assert env.observation_space.contains(obs)  # the tail that fits
    with pytest.raises(ValueError, match="max_prompt_chars"):  # a prompt that never fits is a set-up error
        SequenceEnv([Task("p" * 100)], None, max_prompt_chars=64).reset(seed=0)


def test_token_level_text_is_the_tokenizers_decode_on_the_fast_path_and_off_it(tokenizer):
    # the per-token decode skips transformers' wrapper only where it adds nothing: a tokenizer that
    # cleans up spaces (or overrides decode) keeps its own decode, and both give decode()'s text
    import copy

    from llmgym.env.token_level import text_decoder

    ids = tokenizer.encode("a ,b 12 .") + [tokenizer.eos_token_id]
    fast = text_decoder(tokenizer)
    assert "tokenizer" not in fast.__code__.co_freevars  # the backend's decode, not the wrapper
    assert fast(ids) == tokenizer.decode(ids, skip_special_tokens=True)
    cleaning = copy.deepcopy(tokenizer)
    cleaning.clean_up_tokenization_spaces = True
    slow = text_decoder(cleaning)
    assert "tokenizer" in slow.__code__.co_freevars
    assert slow(ids) == cleaning.decode(ids, skip_special_tokens=True)
    env = TokenLevel(SequenceEnv([Task("q")], lambda t, c: 0.0), tokenizer, max_new_tokens=8)
    env.reset(seed=0)
    for t in ids[:3]:
        obs, *_ = env.step(t)
    assert obs["prompt"].endswith(tokenizer.decode(ids[:3], skip_special_tokens=True))
