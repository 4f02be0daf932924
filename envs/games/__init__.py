"""Multi-turn text games with feedback every turn: ``llmgym/GuessNumber-v0`` and ``llmgym/Wordle-v0``.

Each game is a :class:`llmgym.MultiTurnEnv` that overrides ``respond``: one completion is one move,
the env replies (higher/lower, per-letter marks) and the policy moves again until it wins (reward
1.0) or runs out of moves (reward 0.0); both end the episode (``terminated``). Every turn before
the last pays 0.0: only the outcome is rewarded, so losing turns on purpose never adds up (the
return rule of ``docs/plug_in_env.md``). A move that cannot be parsed uses up the turn and gets a
reply saying what format is expected.

Example:
    >>> import gymnasium, llmgym
    >>> env = gymnasium.make("llmgym/GuessNumber-v0")
    >>> obs, info = env.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = env.step("50")
    >>> info["reply"] in ("Higher. 6 guesses left.", "Lower. 6 guesses left.") or info["outcome"] == "won"
    True
"""

from llmgym.envs.games.guess_number import GuessNumberEnv, guess_number_env, guess_number_task
from llmgym.envs.games.wordle import WORDS, WordleEnv, letter_feedback, wordle_env, wordle_task

__all__ = [
    "GuessNumberEnv",
    "guess_number_env",
    "guess_number_task",
    "WordleEnv",
    "wordle_env",
    "wordle_task",
    "letter_feedback",
    "WORDS",
]
