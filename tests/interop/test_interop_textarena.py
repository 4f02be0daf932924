"""The TextArena adapter with the real package: single-player games, two-player games against a fixed
opponent, the game in its own process, content-free answers, training and benchmarking from the command
line. Only games that ship with TextArena and start offline are used.
"""

from __future__ import annotations

import time

import numpy as np
import re

import pytest

from llmgym.runtime.install import install_hint
from gymnasium.utils.env_checker import check_env

from llmgym.cli import main
from llmgym.interop import from_textarena, make_adapted_env
from llmgym.interop.adapters import check_env_spec

ta = pytest.importorskip("textarena", reason="the TextArena adapter tests need textarena (the textarena extra)")
# gymnasium warns that a wrapped env is checked: checking what users get (the wrappers) is the point
pytestmark = pytest.mark.filterwarnings("ignore:.*different from the unwrapped version:UserWarning")

CONTENT_FREE = ["", "0", "1", "yes", "NaN", "[]", "[0]", "[1]"]


# ------------------------------------------------------------------------------------------------
# TextArena in


def test_a_single_player_game_rewards_the_win_and_keeps_the_games_own_value(tokenizer):
    env = from_textarena("GuessTheNumber-v0", tokenizer=tokenizer)
    obs, info = env.reset(seed=1)
    assert "Guess The Number" in obs["prompt"]
    low, high = 1, 20
    for _ in range(10):  # binary search on the game's hints wins within its 10 turns
        guess = (low + high) // 2
        _, reward, terminated, truncated, info = env.step(f"[{guess}]")
        if terminated:
            break
        if "higher" in info["reply"]:
            low = guess + 1
        else:
            high = guess - 1
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["game_reward"] == 1.0 and "Congratulations" in info["outcome"]
    # the same seed is the same game, at either level
    again = from_textarena("GuessTheNumber-v0", tokenizer=tokenizer)
    assert again.reset(seed=1)[0]["prompt"] == obs["prompt"].split("<|assistant|>")[0] + "<|assistant|>"


def test_content_free_answers_win_nothing_and_the_games_own_reward_shows_why():
    for game in ("GuessTheNumber-v0", "TowerOfHanoi-v0", "Mastermind-v0", "TicTacToe-v0", "FrozenLake-v0"):
        env = from_textarena(game, max_turns=12)
        for answer in CONTENT_FREE:
            rewards = []
            for seed in range(2):
                env.reset(seed=seed)
                done = False
                while not done:
                    _, reward, terminated, truncated, _ = env.step(answer)
                    done = terminated or truncated
                rewards.append(reward)
            assert np.mean(rewards) < 0.1, (game, answer)
    # TextArena's own value pays a guess repeated every turn for being close: why "win" is the default
    own = from_textarena("GuessTheNumber-v0", reward="game", max_turns=12)
    paid = []
    for seed in range(8):
        own.reset(seed=seed)
        done = False
        while not done:
            _, reward, terminated, truncated, _ = own.step("[10]")
            done = terminated or truncated
        paid.append(reward)
    assert np.mean(paid) > 0.5


def _highest_move(observation, rng):
    import re

    moves = re.findall(r"'\[(\d)\]'", observation.split("Available Moves:")[-1])
    return f"[{max(moves, key=int)}]"


def test_two_player_games_seat_the_policy_against_a_fixed_opponent(tokenizer, tmp_path):
    env = from_textarena("TicTacToe-v0", tokenizer=tokenizer, opponent=_highest_move)
    env.reset(seed=0)
    steps = [env.step(move) for move in ("[0]", "[1]", "[2]")]  # the opponent takes 8, then 7: the top row wins
    assert "X" in steps[0][4]["reply"] and steps[-1][1:4] == (1.0, True, False)
    assert steps[-1][4]["game_reward"] == 1.0
    # seated second, the opponent's first move is part of the opening observation
    second = from_textarena("TicTacToe-v0", player_id=1, opponent=_highest_move)
    obs, _ = second.reset(seed=0)
    assert "placed their symbol" in obs["prompt"]
    check_env(from_textarena("TicTacToe-v0", tokenizer=tokenizer), skip_render_check=True)
    kuhn = make_adapted_env("textarena:KuhnPoker-v0", tokenizer, level="token", max_new_tokens=4, max_turns=4)
    check_env(kuhn, skip_render_check=True)


def test_the_game_and_its_opponent_run_in_the_sandbox_and_a_hanging_one_is_killed(tmp_path):
    host_file = tmp_path / "opponent-was-here"

    def writing(observation, rng):  # sees the policy's text: it runs where the host's files are out of reach
        try:
            host_file.write_text(observation)
        except OSError:
            pass
        if "[HANG]" in observation:
            time.sleep(60)
        return _highest_move(observation, rng)

    env = from_textarena("TicTacToe-v0", opponent=writing, time_limit=1.0)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("[4] and some text")  # the opponent answers the policy's move ...
    assert not terminated and "[Player 1] [8]" in info["reply"]  # ... with its highest free cell ...
    assert not host_file.exists()  # ... in the sandbox, where the host's files do not exist
    started = time.perf_counter()
    _, reward, terminated, _, info = env.step("[0] [HANG]")
    assert (reward, terminated) == (0.0, True) and "timeout: " in info["error"]
    assert time.perf_counter() - started < 20


def test_games_that_cannot_start_here_say_so_at_construction(monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(ValueError, match="cannot start here"):
        from_textarena("TwentyQuestions-v0")
    with pytest.raises(ValueError, match="did you mean"):
        from_textarena("TicTacToe-v9")
    with pytest.raises(ValueError, match="reward must be one of"):
        from_textarena("TicTacToe-v0", reward="score")


# ------------------------------------------------------------------------------------------------
# llmgym's own agents and command line on TextArena games


def test_grpo_trains_on_a_game_at_token_level(tiny_model, tokenizer):
    from llmgym.agents import GRPO

    env = make_adapted_env("textarena:GuessTheNumber-v0", tokenizer, level="token", max_new_tokens=4, max_turns=2)
    agent = GRPO(tiny_model, tokenizer, group_size=2, tasks_per_step=2, max_new_tokens=4, lr=1e-3, seed=0)
    history = agent.learn(env, steps=2)
    assert len(history) == 2 and all(np.isfinite(row["loss"]) for row in history)


def test_bench_from_the_command_line(tmp_path):
    bench = tmp_path / "bench.json"
    assert main(["bench", "--env", "textarena:GuessTheNumber-v0", "--samples", "2", "--tasks", "2",
                 "--max-new-tokens", "4", "--env-arg", "max_turns=2", "--out", str(bench)]) == 0
    assert '"env": "textarena:GuessTheNumber-v0"' in bench.read_text()


@pytest.mark.parametrize("spec, message", [
    ("textarena:TicTacToe-v9", "TextArena has no game 'TicTacToe-v9'. Did you mean"),
    ("textarena:", "names no game id"),
    ("textarena:TwentyQuestions-v0", "cannot start here"),
])
def test_bad_textarena_specs_are_one_line_before_any_work(spec, message, capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    capsys.readouterr()
    assert main(["train", "--env", spec, "--agent", "grpo", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("llmgym: error: ") and message in err[0], err
    assert not (tmp_path / "x" / "config.json").exists()


def test_the_command_line_checks_an_adapter_spec_once_per_env_it_makes(tokenizer, monkeypatch):
    import llmgym.interop.adapters as adapters
    from llmgym.cli.resolve import make_run_env, require_env

    checks = []
    real = adapters.check_env_spec
    monkeypatch.setattr(adapters, "check_env_spec", lambda spec: checks.append(spec) or real(spec))
    env_spec = require_env("textarena:GuessTheNumber-v0")  # the checked spec: gymnasium makes the env from it
    assert env_spec.id == "textarena:GuessTheNumber-v0" and len(checks) == 1
    env = make_run_env("textarena:GuessTheNumber-v0", tokenizer, env_args={"max_turns": 2})
    assert type(env.unwrapped).__name__ == "TextArenaEnv" and len(checks) == 2  # not twice (check, then make)


def test_a_missing_adapter_package_names_the_extra(monkeypatch):
    import llmgym.interop.adapters as adapters

    real = adapters.importlib.util.find_spec
    monkeypatch.setattr(adapters.importlib.util, "find_spec",
                        lambda name, *a: None if name == "textarena" else real(name, *a))
    with pytest.raises(ValueError, match=re.escape(install_hint("textarena"))):
        check_env_spec("textarena:TicTacToe-v0")
