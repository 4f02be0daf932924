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

The game runs in a forked process for the whole episode
(:class:`~llmgym.interop.worker.EpisodeWorker`): model text never reaches TextArena's parsers in
the trainer's process, a game that hangs is killed after ``time_limit`` seconds, and only plain
data comes back. (TextArena's parsers are regular expressions and, in Tak, ``ast.literal_eval``;
nothing there calls ``eval``.) Games that need NLTK corpora (Wordle, Hangman, WordLadder...) or an
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
import random
import re
import threading
from typing import Any, Callable

import numpy as np

from llmgym.interop.adapters import import_package
from llmgym.interop.episode_env import WorkerEpisodeEnv
from llmgym.interop.worker import Channel
from llmgym.types import Task

__all__ = ["REWARD_MODES", "from_textarena", "random_move_opponent", "TextArenaEnv"]

REWARD_MODES = ("win", "game")
Opponent = Callable[[str, random.Random], str]

_LINE_PREFIX = re.compile(r"^\[[^\[\]\n]{1,40}\] ?")  # a line's speaker tag, "[GAME] " / "[Player 1] "
_MOVE = re.compile(r"\[[^\[\]\n]{1,40}\]")  # a bracketed move; no nesting, bounded: linear time
_MAX_OBSERVATION_CHARS = 200_000  # what the default opponent scans of its history at most


def import_textarena() -> Any:
    """``textarena``, or a ``ModuleNotFoundError`` saying how to install it."""
    return import_package("textarena")


def random_move_opponent(observation: str, rng: random.Random) -> str:
    """A uniformly random bracketed move from the latest message of ``observation`` that lists any.

    Speaker tags at the start of a line (``[GAME]``, ``[Player 0]``) are not moves. With no move
    listed anywhere it answers ``"[]"`` (an invalid move: TextArena then applies its rules).

    Example:
        >>> import random
        >>> from llmgym.interop.textarena_in import random_move_opponent
        >>> seen = "[GAME] Your card is K\\n[GAME] Your available actions are: '[check]', '[bet]'"
        >>> random_move_opponent(seen, random.Random(0)) in ("[check]", "[bet]")
        True
        >>> random_move_opponent("[GAME] no moves listed", random.Random(0))
        '[]'
    """
    for message in reversed(observation[-_MAX_OBSERVATION_CHARS:].split("\n[")):
        moves = []
        for line in message.splitlines():
            moves += [m for m in _MOVE.findall(_LINE_PREFIX.sub("", line)) if m not in moves]
        if moves:
            return rng.choice(moves)
    return "[]"


class _Game:
    """One seeded TextArena game, with the opponent playing every seat but the policy's."""

    def __init__(self, ta: Any, env_id: str, seed: int, num_players: int, player_id: int,
                 opponent: Opponent) -> None:
        self.ta, self.player_id, self.opponent = ta, player_id, opponent
        random.seed(seed)  # TextArena draws from the global generator (reset and some steps)
        self.env = ta.make(env_id)
        self.env.reset(num_players=num_players, seed=seed)
        self.inner = self.env
        while isinstance(self.inner, ta.Wrapper):  # observations are read raw and formatted here
            self.inner = self.inner.env
        self.rng = random.Random(seed)
        self.seen: dict[int, list[str]] = collections.defaultdict(list)

    @property
    def done(self) -> bool:
        return bool(self.inner.state.done)

    def _format(self, messages: list) -> str:
        roles = getattr(self.inner.state, "role_mapping", {}) or {}
        lines = []
        for sender, message, kind in messages:
            if sender == self.player_id and kind == self.ta.ObservationType.PLAYER_ACTION:
                continue  # the policy's own move: its transcript already holds it
            name = "GAME" if sender == self.ta.GAME_ID else roles.get(sender, f"Player {sender}")
            lines.append(f"[{name}] {message}")
        return "\n".join(lines)

    def advance(self) -> str | None:
        """Opponent moves until the policy's turn; then what the policy sees next (``None``: the game ended)."""
        while not self.done:
            seat, messages = self.inner.get_observation()
            text = self._format(messages) if seat == self.player_id else None
            if seat == self.player_id:
                return text
            self.seen[seat].append("\n".join(f"[{s if s != self.ta.GAME_ID else 'GAME'}] {m}" for s, m, _ in messages))
            self.env.step(str(self.opponent("\n".join(self.seen[seat]), self.rng)))
        return None

    def outcome(self) -> tuple[float, dict[str, Any]]:
        rewards = self.inner.state.rewards or {}
        info = (getattr(self.inner.state, "game_info", {}) or {}).get(self.player_id, {})
        return float(rewards.get(self.player_id, 0.0)), {
            "outcome": str(info.get("reason", "")), "invalid_move": bool(info.get("invalid_move", False))}


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


class TextArenaEnv(WorkerEpisodeEnv):
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

    # -- tasks: the game's first observation for the policy, computed from the seed (no model text involved)
    def task_for_seed(self, seed: int) -> Task:
        """The task of the game seeded ``seed``: its opening observation as the prompt."""
        opening = self._opening(seed)
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        messages.append({"role": "user", "content": opening})
        return Task(messages, id=f"{self.env_id}#{seed}", metadata={"textarena": {"game": self.env_id, "seed": seed}})

    def _draw(self, rng: np.random.Generator) -> Task:
        return self.task_for_seed(int(rng.integers(2**31 - 1)))

    def _new_game(self, seed: int) -> _Game:
        return _Game(self._ta, self.env_id, seed, self.num_players, self.player_id, self.opponent)

    def _opening(self, seed: int) -> str:
        with self._lock:
            if seed in self._openings:
                self._openings.move_to_end(seed)
                return self._openings[seed]
            state = random.getstate()  # the trainer's global generator is not ours to move
            try:
                opening = self._new_game(seed).advance()
            finally:
                random.setstate(state)
            if opening is None:
                raise ValueError(f"{self.env_id} (seed {seed}) ended before the policy's first move")
            self._openings[seed] = opening
            while len(self._openings) > 4096:
                self._openings.popitem(last=False)
            return opening

    # -- the episode, in its own process
    def episode(self, task: Task) -> Callable[[Channel], None]:
        spec = task.metadata.get("textarena")
        if not spec or spec.get("game") != self.env_id:
            raise ValueError(f"this task is not a {self.env_id} game (metadata['textarena'] is {spec!r}): make it "
                             f"with env.task_for_seed(seed)")
        seed = int(spec["seed"])
        opening = self._opening(seed)

        def play(channel: Channel) -> None:
            game = self._new_game(seed)
            if game.advance() != opening:
                raise RuntimeError(f"{self.env_id} is not reproducible from its seed: its opening differs")
            reply: str | None = None
            while True:
                completion = channel.ask(reply)
                game.env.step(completion)
                reply = game.advance()
                if reply is None:  # the game is over
                    value, info = game.outcome()
                    won = float(value >= 1.0)
                    channel.finish(won if self.reward_mode == "win" else value, {"game_reward": value, **info})
                    return
                if channel.last:
                    channel.finish(0.0, {"game_reward": None, "outcome": "unfinished at max_turns",
                                         "stop_condition": "max_turns"})
                    return

        return play

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
        time_limit: seconds the game may take to answer one move (its process is killed past it).
        system_prompt: an optional system message before the game's opening observation.
        env_kwargs: passed to :class:`~llmgym.MultiTurnEnv` (``max_prompt_chars=``, ``render_mode=``...).
    """
    return TextArenaEnv(env_id, tokenizer, opponent=opponent, player_id=player_id, num_players=num_players,
                        reward=reward, max_turns=max_turns, time_limit=time_limit, system_prompt=system_prompt,
                        **env_kwargs)
