"""TextArena games (``textarena`` 0.7) as llmgym multi-turn envs: :func:`from_textarena`.

One episode is one game, seeded: the env's generator draws the seed, TextArena's engine is reset
with it (``random.seed(seed)``, as TextArena's own seeding does), and the policy's first
observation — the game's rules and board, after any opponent moves that come first — is the
task's prompt. Each completion is the policy's move, stepped through the game's registered
wrappers (``ActionFormattingWrapper`` puts a bare move in brackets); the env's reply is what the
game shows the policy next (its messages since the policy's last move, ``[GAME] ...`` /
``[Player 1] ...``, without the policy's own move echoed back).

**Reward**, at the game's end (earlier steps earn 0): with ``reward="win"`` (the default) 1.0 when
the policy won or solved the game (TextArena's reward ≥ 1), else 0.0; with ``reward="game"``
TextArena's own value (±1 in two-player games, 0 for a draw; in many single-player games the share
of the puzzle done, also after an invalid or repeated move — so a content-free answer can earn
about half: GuessTheNumber's ``[10]`` every turn scores ~0.7, hence the binary default for RL).
TextArena's value is in ``info["game_reward"]`` either way, its reason in ``info["outcome"]``.

**Opponents.** In a game for several players the policy takes seat ``player_id`` (default 0) and
``opponent`` plays every other seat: ``opponent(observation, rng) -> move``, where ``observation``
is everything that seat has been shown this episode (formatted as the policy's is) and ``rng`` a
``random.Random`` seeded from the episode's seed. The default, :func:`random_move_opponent`, picks
uniformly among the bracketed moves (``'[4]'``, ``'[check]'``) in the latest message that lists
any: a legal random player in games that list their moves (TicTacToe, KuhnPoker, ConnectFour's
examples...), a weak or invalid one where they do not (Nim lists only an example). Pass your own
for anything serious.

The game runs in the sandbox (:mod:`llmgym.interop.adapter_pools`): every turn replays it from its seed
with the policy's moves so far, in a fresh sandboxed process killed after ``time_limit`` seconds, so
model text never reaches TextArena's parsers -- nor the opponent, which sees the policy's moves -- in
the trainer's process, and only plain data comes back. (TextArena's parsers are regular expressions
and, in Tak, ``ast.literal_eval``; nothing there calls ``eval``. The opening, before any move of the
policy, is computed here: it is the task's prompt.) An opponent defined in ``__main__`` or a notebook
travels to the sandbox by value; one imported from a module is loaded there from that module's
directory, bound read-only. Games that need NLTK corpora (Wordle, Hangman, WordLadder...) or an
API key (TwentyQuestions, Debate...) raise a clear error at construction where those are missing.

Example:
    >>> from llmgym.interop import from_textarena
    >>> env = from_textarena("GuessTheNumber-v0", max_turns=12)
    >>> obs, info = env.reset(seed=0)
    >>> "Guess The Number" in obs["prompt"], info["task"].id
    (True, 'GuessTheNumber-v0#1826701614')
    >>> obs, reward, terminated, truncated, info = env.step("[10]")
    >>> info["reply"], reward, terminated
    ('[GAME] The target number is higher.', 0.0, False)
"""

from __future__ import annotations

import collections
import math
import random
import threading
from typing import Any, Callable

import numpy as np

from llmgym.interop import adapter_pools
from llmgym.interop.episode_env import ReplayEpisodeEnv
from llmgym.interop.in_sandbox import Game, random_move_opponent
from llmgym.env.types import Task
from llmgym.runtime.install import import_optional

__all__ = ["REWARD_MODES", "from_textarena", "random_move_opponent", "TextArenaEnv"]

REWARD_MODES = ("win", "game")
Opponent = Callable[[str, random.Random], str]


def import_textarena() -> Any:
    """``textarena``, or a ``ModuleNotFoundError`` saying how to install it."""
    return import_optional("textarena", extra="textarena", distribution="textarena", needed_by="the textarena adapter")


def count_players(env_id: str) -> int:
    """How many players ``env_id`` starts with (1, else 2); a ``ValueError`` for a game that cannot start here."""
    ta = import_textarena()
    for players in (1, 2):
        state = random.getstate()
        try:
            random.seed(0)
            game = ta.make(env_id)
            game.reset(num_players=players, seed=0)
            return players
        except Exception as exc:
            message = " ".join(str(exc).replace("*", " ").split())
            if players == 1 and "player" in message.lower():  # TextArena's "the number of players has to be ..."
                continue
            raise ValueError(f"TextArena game {env_id!r} cannot start here with {players} player(s): "
                             f"{type(exc).__name__}: {message[:240]}") from None
        finally:
            random.setstate(state)
    raise AssertionError("unreachable")


class TextArenaEnv(ReplayEpisodeEnv):
    """A TextArena game as a :class:`~llmgym.MultiTurnEnv`; see the module docstring and :func:`from_textarena`."""

    def __init__(self, env_id: str, tokenizer: Any = None, *, opponent: Opponent | None = None, player_id: int = 0,
                 num_players: int | None = None, reward: str = "win", max_turns: int = 32,
                 time_limit: float | None = 30.0, system_prompt: str | None = None, **kwargs: Any) -> None:
        self._ta = import_textarena()
        from textarena.envs.registration import ENV_REGISTRY

        if env_id not in ENV_REGISTRY:
            import difflib

            close = difflib.get_close_matches(env_id, list(ENV_REGISTRY), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else " (textarena.envs.registration.ENV_REGISTRY)"
            raise ValueError(f"TextArena has no game {env_id!r}{hint}")
        if reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {REWARD_MODES}, got {reward!r}")
        self.env_id, self.reward_mode, self.system_prompt = env_id, reward, system_prompt
        self.num_players = num_players or count_players(env_id)
        if not 0 <= player_id < self.num_players:
            raise ValueError(f"player_id must be in 0..{self.num_players - 1} for {env_id}, got {player_id}")
        if self.num_players > 1 and opponent is not None and not callable(opponent):
            raise TypeError(f"opponent must be a function (observation, rng) -> move, got {type(opponent).__name__}")
        self.player_id, self.opponent = player_id, opponent or random_move_opponent
        self.time_limit = time_limit
        self._openings: collections.OrderedDict[int, str] = collections.OrderedDict()
        self._lock = threading.Lock()
        super().__init__(self._draw, None, tokenizer, max_turns=max_turns, **kwargs)
        # the game and its opponent, for the sandbox (the default opponent is the sandbox's own copy)
        self.payload = adapter_pools.make_payload("textarena", {
            "op": "textarena", "env_id": env_id, "num_players": self.num_players, "player_id": player_id,
            "opponent": None if self.opponent is random_move_opponent else self.opponent})
        adapter_pools.check_available(self.payload)  # no sandbox here: said now, not at the first step

    # -- tasks: the game's first observation for the policy, computed from the seed (no model text involved)
    def task_for_seed(self, seed: int) -> Task:
        """The task of the game seeded ``seed``: its opening observation as the prompt."""
        opening = self._opening(seed)
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        messages.append({"role": "user", "content": opening})
        return Task(messages, id=f"{self.env_id}#{seed}", metadata={"textarena": {"game": self.env_id, "seed": seed}})

    def _draw(self, rng: np.random.Generator) -> Task:
        return self.task_for_seed(int(rng.integers(2**31 - 1)))

    def _opening(self, seed: int) -> str:
        with self._lock:
            if seed in self._openings:
                self._openings.move_to_end(seed)
                return self._openings[seed]
            state = random.getstate()  # the trainer's global generator is not ours to move
            try:
                opening = Game(self._ta, self.env_id, seed, self.num_players, self.player_id, self.opponent).advance()
            finally:
                random.setstate(state)
            if opening is None:
                raise ValueError(f"{self.env_id} (seed {seed}) ended before the policy's first move")
            self._openings[seed] = opening
            while len(self._openings) > 4096:
                self._openings.popitem(last=False)
            return opening

    # -- the episode, replayed in the sandbox every turn
    def play(self, task: Task, completions: list[str], replies: list[str | None]) -> dict[str, Any]:
        spec = task.metadata.get("textarena")
        if not spec or spec.get("game") != self.env_id:
            raise ValueError(f"this task is not a {self.env_id} game (metadata['textarena'] is {spec!r}): make it "
                             f"with env.task_for_seed(seed)")
        seed = int(spec["seed"])
        return self.run_sandboxed(self.payload, {"seed": seed, "opening": self._opening(seed), "completions": completions,
                                                 "replies": replies, "max_turns": self.max_turns})

    def finished(self, reward: float, info: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        if info.get("stop_condition") == "max_turns":
            return 0.0, {"game_reward": None, "outcome": "unfinished at max_turns", "stop_condition": "max_turns"}
        value = info.get("game_reward")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"the game's reward is not a finite number: {str(value)[:40]}")
        kept = {"game_reward": float(value), "outcome": str(info.get("outcome", ""))[:2000],
                "invalid_move": info.get("invalid_move") is True}
        return (float(value >= 1.0) if self.reward_mode == "win" else float(value)), kept

    def clone(self) -> "TextArenaEnv":
        other = super().clone()
        other._lock = threading.Lock()
        return other

    def describe(self) -> str:
        return f"TextArena game {self.env_id}"


def from_textarena(env_id: str, tokenizer: Any = None, *, opponent: Opponent | None = None, player_id: int = 0,
                   num_players: int | None = None, reward: str = "win", max_turns: int = 32,
                   time_limit: float | None = 30.0, system_prompt: str | None = None,
                   **env_kwargs: Any) -> TextArenaEnv:
    """A TextArena game as an llmgym multi-turn env (see the module docstring).

    Args:
        env_id: a registered TextArena id (``"GuessTheNumber-v0"``, ``"TicTacToe-v0"``).
        tokenizer: as for any llmgym env.
        opponent: ``(observation, rng) -> move`` for every seat but the policy's (default
            :func:`random_move_opponent`).
        player_id: the policy's seat.
        num_players: players of the game (default: 1 if the game starts with one, else 2).
        reward: ``"win"`` (1.0 for a win or a solved puzzle, else 0) or ``"game"`` (TextArena's own value).
        max_turns: the policy's moves per episode at most (the episode is ``truncated`` there, reward 0).
        time_limit: seconds one turn's replay of the game may take in the sandbox (its process is killed past it).
        system_prompt: an optional system message before the game's opening observation.
        env_kwargs: passed to :class:`~llmgym.MultiTurnEnv` (``max_prompt_chars=``, ``render_mode=``...).
    """
    return TextArenaEnv(env_id, tokenizer, opponent=opponent, player_id=player_id, num_players=num_players,
                        reward=reward, max_turns=max_turns, time_limit=time_limit, system_prompt=system_prompt,
                        **env_kwargs)
