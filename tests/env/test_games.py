"""Games: play GuessNumber and Wordle to a win and to a loss, by text and token by token."""

from __future__ import annotations

import gymnasium
import pytest

from llmgym.envs.games import WORDS, letter_feedback
from llmgym.envs.games.guess_number import parse_guess
from llmgym.envs.games.wordle import parse_word
from llmgym.runtime.models import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


# -- guess the number ------------------------------------------------------------------------------


def test_guess_number_binary_search_wins():
    env = gymnasium.make("llmgym/GuessNumber-v0")
    for seed in range(5):
        obs, info = env.reset(seed=seed)
        low, high = 1, 100
        assert "between 1 and 100" in obs["prompt"]
        for turn in range(1, 8):
            guess = (low + high) // 2
            obs, reward, terminated, truncated, info = env.step(f"Let me think. My guess is {guess}.")
            assert info["guess"] == guess and info["turn"] == turn
            if terminated:
                break
            assert (reward, truncated) == (0.0, False)
            assert info["reply"] in obs["prompt"]
            if info["reply"].startswith("Higher"):
                low = guess + 1
            else:
                assert info["reply"].startswith("Lower")
                high = guess - 1
        assert (reward, terminated, truncated, info["outcome"]) == (1.0, True, False, "won")
        assert info["target"] == guess


@pytest.mark.parametrize("n", [2, 8, 100])
def test_guess_number_default_budget_lets_binary_search_win_every_target(n):
    from llmgym import Task

    for target in range(1, n + 1):
        task = Task("guess", answer=target, metadata={"low": 1, "high": n})
        env = gymnasium.make("llmgym/GuessNumber-v0", low=1, high=n, tasks=[task])
        env.reset(seed=0)
        low, high, outcome = 1, n, "playing"
        while outcome == "playing":
            guess = (low + high) // 2
            _, reward, terminated, _, info = env.step(str(guess))
            outcome = info["outcome"]
            if not terminated:
                low, high = (guess + 1, high) if info["reply"].startswith("Higher") else (low, guess - 1)
        assert (outcome, reward) == ("won", 1.0), (n, target, info)


def test_guess_number_runs_out_of_guesses_and_loses():
    env = gymnasium.make("llmgym/GuessNumber-v0", low=1, high=10, max_guesses=3)
    obs, info = env.reset(seed=3)
    wrong = 1 if info["task"].answer != 1 else 2
    for _ in range(2):
        obs, reward, terminated, truncated, info = env.step(str(wrong))
        assert (reward, terminated, info["outcome"]) == (0.0, False, "playing")
    obs, reward, terminated, truncated, info = env.step(str(wrong))
    assert (reward, terminated, truncated, info["outcome"]) == (0.0, True, False, "lost")
    with pytest.raises(gymnasium.error.ResetNeeded):
        env.step("5")


def test_guess_number_explains_bad_moves():
    env = gymnasium.make("llmgym/GuessNumber-v0")
    env.reset(seed=0)
    info = env.step("hmm, I am not sure")[4]
    assert "no number" in info["reply"] and "one integer between 1 and 100" in info["reply"]
    assert info["guess"] is None and info["outcome"] == "playing"
    info = env.step("How about 500?")[4]
    assert "outside the range" in info["reply"]
    assert parse_guess("first 3, then 40 and finally 17") == 17 and parse_guess("-5") == -5


# -- wordle ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "guess, secret, marks",
    [
        ("crane", "crane", "GGGGG"),
        ("trace", "crane", ".GGYG"),
        ("speed", "abide", "..Y.Y"),  # two e's guessed, one in the secret: only the first is marked
        ("eerie", "there", "Y.Y.G"),  # the green e is counted first; one e is left for a Y
        ("geese", "eagle", "YY..G"),
        ("llama", "hello", "YY..."),
        ("hello", "llama", "..YY."),
        ("abcde", "fghij", "....."),
    ],
)
def test_letter_feedback(guess, secret, marks):
    assert letter_feedback(guess, secret) == marks


def test_wordle_win():
    env = gymnasium.make("llmgym/Wordle-v0")
    obs, info = env.reset(seed=4)
    secret = info["task"].answer
    assert secret in WORDS and "5-letter" in obs["prompt"]
    opener = "crane" if secret != "crane" else "slate"
    obs, reward, terminated, truncated, info = env.step(f"I will open with {opener.upper()}")
    assert (reward, terminated) == (0.0, False)
    assert info["reply"] == f"{opener.upper()} {letter_feedback(opener, secret)} (5 guesses left)"
    assert info["reply"] in obs["prompt"]
    obs, reward, terminated, truncated, info = env.step(f"Then it must be {secret}.")
    assert (reward, terminated, truncated, info["outcome"], info["turn"]) == (1.0, True, False, "won", 2)


def test_wordle_loss_and_bad_moves():
    env = gymnasium.make("llmgym/Wordle-v0", max_guesses=3)
    obs, info = env.reset(seed=1)
    secret = info["task"].answer
    wrong = "zzzzz" if secret != "zzzzz" else "yyyyy"
    info = env.step("I have no idea, 12345")[4]
    assert "no 5-letter word" in info["reply"] and info["guess"] is None and info["outcome"] == "playing"
    obs, reward, terminated, truncated, info = env.step(wrong)
    assert (reward, terminated, info["feedback"]) == (0.0, False, letter_feedback(wrong, secret))
    obs, reward, terminated, truncated, info = env.step(wrong)
    assert (reward, terminated, truncated, info["outcome"], info["secret"]) == (0.0, True, False, "lost", secret)
    assert parse_word("first CRANE, then slate") == "slate" and parse_word("abcdefgh") is None


# -- token level -----------------------------------------------------------------------------------


def _say(env, tokenizer, text):
    """Step ``text`` token by token, then EOS; return the last step's result."""
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    for i, token in enumerate(ids):
        result = env.step(token)
        if i < len(ids) - 1:
            assert result[1:4] == (0.0, False, False)
    return result


@pytest.mark.parametrize("env_id", ["llmgym/GuessNumber-v0", "llmgym/Wordle-v0"])
def test_token_level_win(env_id, tokenizer):
    env = gymnasium.make(env_id, level="token", tokenizer=tokenizer, max_new_tokens=16)
    obs, info = env.reset(seed=2)
    answer = str(info["task"].answer)
    if env_id.endswith("GuessNumber-v0"):
        wrong = "3" if answer != "3" else "4"
    else:
        wrong = "zzzzz"
    obs, reward, terminated, truncated, info = _say(env, tokenizer, wrong)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["reply"] and obs["prompt"].endswith(info["reply"] + "\n")
    obs, reward, terminated, truncated, info = _say(env, tokenizer, answer)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["outcome"] == "won" and info["finish_reason"] == "stop"


def test_token_level_same_episode_as_sequence_level(tokenizer):
    seq = gymnasium.make("llmgym/GuessNumber-v0", tokenizer=tokenizer)
    tok = gymnasium.make("llmgym/GuessNumber-v0", level="token", tokenizer=tokenizer, max_new_tokens=16)
    _, info_seq = seq.reset(seed=9)
    _, info_tok = tok.reset(seed=9)
    assert info_seq["task"] == info_tok["task"]
    text_step = seq.step(tokenizer.encode("50", add_special_tokens=False) + [tokenizer.eos_token_id])
    token_step = _say(tok, tokenizer, "50")
    assert text_step[0]["prompt"] == token_step[0]["prompt"]
    assert list(text_step[0]["prompt_ids"]) == list(token_step[0]["prompt_ids"])
    assert text_step[1:4] == token_step[1:4]
