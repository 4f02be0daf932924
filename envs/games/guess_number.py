"""Guess the number: the env thinks of an integer, the policy guesses, the env says higher or lower.

Each completion is one guess: the **last integer** in it counts ("I'll try 50" → 50). A reply with
no integer, or one outside the range, uses up the guess and gets a reply saying what is expected.
A right guess wins (reward 1.0, terminated); running out of guesses loses (reward 0.0, terminated:
the game is over, not cut short). Binary search always wins within ``n.bit_length()`` guesses for a
range of ``n`` integers (``floor(log2(n)) + 1``: 4 for 8 numbers, 7 for 100), which is the default budget.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np

from llmgym import MultiTurnEnv, Task, Turn

__all__ = ["GuessNumberEnv", "guess_number_task", "guess_number_env", "parse_guess"]


def parse_guess(completion: str) -> int | None:
    """The last integer in the completion, or ``None``.

    Example:
        >>> from llmgym.envs.games.guess_number import parse_guess
        >>> parse_guess("Between 1 and 100... I guess 37."), parse_guess("no idea")
        (37, None)
    """
    found = re.findall(r"-?\d+", completion)
    return int(found[-1]) if found else None


def guess_number_task(rng: np.random.Generator, low: int = 1, high: int = 100) -> Task:
    """A secret integer in ``[low, high]``; the prompt explains the game.

    Example:
        >>> import numpy as np
        >>> from llmgym.envs.games.guess_number import guess_number_task
        >>> task = guess_number_task(np.random.default_rng(0))
        >>> 1 <= task.answer <= 100
        True
    """
    target = int(rng.integers(low, high + 1))
    prompt = (
        f"I am thinking of an integer between {low} and {high}. Guess it. After each guess I will say "
        f"'higher' or 'lower'. Reply with one integer."
    )
    return Task(prompt, answer=target, id=f"guess-{low}-{high}-{target}", metadata={"low": low, "high": high})


class GuessNumberEnv(MultiTurnEnv):
    """Higher/lower guessing game; ``max_turns`` is the number of guesses.

    ``self.state``: ``low``/``high`` (the range), ``guesses`` (the parsed guesses so far).
    ``info["outcome"]`` is ``"won"``, ``"lost"`` or ``"playing"``.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.envs.games import GuessNumberEnv
        >>> env = GuessNumberEnv([Task("Guess 1-100", answer=42, metadata={"low": 1, "high": 100})], max_turns=7)
        >>> _ = env.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = env.step("My guess is 50")
        >>> info["reply"], reward, terminated
        ('Lower. 6 guesses left.', 0.0, False)
        >>> obs, reward, terminated, truncated, info = env.step("42")
        >>> info["outcome"], reward, terminated
        ('won', 1.0, True)
    """

    def start(self, task: Task) -> None:
        self.state = {
            "low": int(task.metadata.get("low", 1)),
            "high": int(task.metadata.get("high", 100)),
            "guesses": [],
        }

    def respond(self, completion: str) -> Turn:
        low, high, target = self.state["low"], self.state["high"], int(self.task.answer)
        guess = parse_guess(completion)
        self.state["guesses"].append(guess)
        left = self.max_turns - len(self.state["guesses"])
        info: dict[str, Any] = {"guess": guess, "outcome": "playing"}
        if guess == target:
            return Turn(1.0, None, True, {**info, "outcome": "won", "target": target})
        if left <= 0:  # out of guesses: the game is lost (terminated, not truncated)
            return Turn(0.0, None, True, {**info, "outcome": "lost", "target": target})
        plural = "guess" if left == 1 else "guesses"
        if guess is None:
            reply = f"I found no number in your reply. Answer with one integer between {low} and {high}, e.g. {(low + high) // 2}."
        elif not low <= guess <= high:
            reply = f"{guess} is outside the range: guess an integer between {low} and {high}."
        else:
            reply = "Higher." if guess < target else "Lower."
        return Turn(0.0, f"{reply} {left} {plural} left.", False, info)


def guess_number_env(
    tokenizer: Any = None,
    render_mode: str | None = None,
    *,
    tasks: Any = None,
    low: int = 1,
    high: int = 100,
    max_guesses: int | None = None,
) -> GuessNumberEnv:
    """``llmgym/GuessNumber-v0``: guess an integer in ``[low, high]``; ``max_guesses`` defaults to ``(high - low + 1).bit_length()``.

    Example:
        >>> import gymnasium, llmgym
        >>> env = gymnasium.make("llmgym/GuessNumber-v0", high=10)
        >>> obs, info = env.reset(seed=0)
        >>> env.step(str(info["task"].answer))[1:3]
        (1.0, True)
    """
    if high < low:
        raise ValueError(f"need low <= high, got {low}, {high}")
    if max_guesses is None:
        max_guesses = (high - low + 1).bit_length()  # binary search's worst case: floor(log2(n)) + 1
    if tasks is None:
        tasks = functools.partial(guess_number_task, low=low, high=high)  # picklable, unlike a closure
    return GuessNumberEnv(tasks, None, tokenizer, max_turns=max_guesses, render_mode=render_mode)
