"""Environments: prompts + verifiers as ``gymnasium.Env``\\ s, single-turn and multi-turn.

:class:`SequenceEnv` — one action is one whole completion (text or token ids); the verifier scores
it and the episode ends. :class:`MultiTurnEnv` — after a completion the env may reply and the policy
speaks again; override :meth:`MultiTurnEnv.respond` to make a game or a tool. For token-level
control wrap either in :class:`llmgym.TokenLevel`.
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import traceback
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, Union

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from llmgym.spaces import AnyText, as_token_array, token_ids_space
from llmgym.types import Score, Task
from llmgym.verifiers import Verifier, VerifierLike, as_verifier

__all__ = ["TaskSource", "SequenceEnv", "MultiTurnEnv", "Turn", "render_prompt", "encode_text"]

TaskSourceLike = Union[Sequence[Task], Iterable[Task], Callable[[np.random.Generator], Task], "TaskSource"]


class TaskSource:
    """Normalises where tasks come from: a list, an iterable, or a function of a seeded RNG.

    * a sequence (list, tuple, anything with ``__len__`` and ``__getitem__``): ``reset`` draws an index
      with the env's seeded generator, so the same seed gives the same task;
    * a callable ``fn(rng: numpy.random.Generator) -> Task``: a procedural generator, seeded the same way;
    * any other iterable (a generator, a file reader): tasks are taken in order.

    Example:
        >>> import numpy as np
        >>> from llmgym import Task
        >>> from llmgym.core import TaskSource
        >>> src = TaskSource([Task("a", id="1"), Task("b", id="2")])
        >>> src.find("2").prompt, len(src)
        ('b', 2)
        >>> TaskSource(lambda rng: Task(str(rng.integers(10)))).draw(np.random.default_rng(0)).prompt
        '8'
        >>> TaskSource([])
        Traceback (most recent call last):
        ...
        ValueError: the task source is empty: give SequenceEnv at least one Task ...
    """

    def __init__(self, source: TaskSourceLike):
        if isinstance(source, TaskSource):
            self.kind, self.source, self._iter = source.kind, source.source, source._iter
            return
        self._iter: Iterator[Task] | None = None
        if isinstance(source, (str, bytes, Task)):
            raise TypeError(
                f"tasks must be a list of Task objects, an iterable of them, or a function of a "
                f"numpy Generator returning one; got a single {type(source).__name__}"
            )
        if isinstance(source, collections.abc.Sequence) or (
            hasattr(source, "__len__") and hasattr(source, "__getitem__")
        ):
            self.kind, self.source = "sequence", source
            if len(source) == 0:
                raise ValueError(
                    "the task source is empty: give SequenceEnv at least one Task (a non-empty list, "
                    "an iterable, or a function rng -> Task)"
                )
        elif callable(source):
            self.kind, self.source = "function", source
        elif isinstance(source, collections.abc.Iterable):
            self.kind, self.source = "iterable", source
            self._iter = iter(source)
        else:
            raise TypeError(
                f"tasks must be a list of Task objects, an iterable of them, or a function "
                f"rng -> Task; got {type(source).__name__}"
            )

    def __len__(self) -> int:
        if self.kind != "sequence":
            raise TypeError(f"a task source of kind {self.kind!r} has no length")
        return len(self.source)

    def draw(self, rng: np.random.Generator) -> Task:
        """The next task: a seeded index, a seeded generator call, or the iterable's next item."""
        if self.kind == "sequence":
            task = self.source[int(rng.integers(len(self.source)))]
        elif self.kind == "function":
            task = self.source(rng)
        else:
            try:
                task = next(self._iter)
            except StopIteration:
                raise ValueError(
                    "the task source is exhausted (its iterable yielded no more tasks): pass a list, "
                    "or pin tasks with env.reset(options={'task': task})"
                ) from None
        return _check_task(task)

    def find(self, task_id: str) -> Task:
        """The task with ``id == task_id`` (sequence sources only)."""
        if self.kind != "sequence":
            raise KeyError(f"task ids can be looked up only in a list of tasks, not a {self.kind} source")
        for task in self.source:
            if task.id == task_id:
                return _check_task(task)
        raise KeyError(f"no task with id {task_id!r} in this env's {len(self.source)} tasks")

    def __iter__(self) -> Iterator[Task]:
        if self.kind != "sequence":
            raise TypeError(f"only a list of tasks can be iterated again; this source is a {self.kind}")
        return (_check_task(t) for t in self.source)


def _check_task(task: Any) -> Task:
    if not isinstance(task, Task):
        raise TypeError(
            f"the task source yielded {type(task).__name__}, not llmgym.Task: wrap each item, e.g. "
            f"Task(prompt=row['question'], answer=row['answer'])"
        )
    return task


def render_prompt(task: Task, tokenizer: Any = None) -> str:
    """The prompt as text: chat messages go through the tokenizer's chat template when it has one.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.core import render_prompt
        >>> render_prompt(Task([{"role": "user", "content": "hi"}]))
        'user: hi\\nassistant:'
    """
    if not task.is_chat:
        return task.prompt
    messages = [dict(m) for m in task.prompt]
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def encode_text(tokenizer: Any, text: str, *, first: bool) -> list[int]:
    """Token ids of ``text``; special tokens (BOS) only when it opens the context and is not chat-rendered."""
    return list(tokenizer.encode(text, add_special_tokens=first))


@dataclasses.dataclass
class Turn:
    """What :meth:`MultiTurnEnv.respond` returns after one completion.

    Attributes:
        reward: reward for this completion.
        reply: the env's answer, shown to the policy next; ``None`` when the episode ends.
        done: ``True`` when the episode is over (solved, lost).
        info: details for ``step``'s ``info``.
    """

    reward: float
    reply: str | None = None
    done: bool = False
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class SequenceEnv(gym.Env):
    """A single-turn env: observe a prompt, act with a whole completion, get the verifier's reward.

    Args:
        tasks: a list of :class:`~llmgym.Task`, an iterable of them, or ``fn(rng) -> Task``.
        verifier: a :class:`~llmgym.Verifier` or a function ``(task, completion) -> float | Score``.
        tokenizer: optional; with it the observation carries ``prompt_ids`` and actions may be ids.
        max_prompt_chars / max_completion_chars: bounds of the text spaces.
        render_mode: ``None`` or ``"ansi"`` (the transcript as a string).

    Observation: ``{"prompt": str, "prompt_ids": int64 array}`` (``prompt_ids`` only with a tokenizer):
    what the policy conditions on. Action: completion text, or its token ids (a 1-D int sequence).
    ``reset(options={"task": task})`` pins a task (how a group of samples shares one prompt);
    ``options={"task_id": id}`` looks one up by id. ``info`` carries ``task`` and the verifier's details.

    Example:
        >>> from llmgym import SequenceEnv, Task
        >>> env = SequenceEnv([Task("2+3=", answer="5")], lambda task, text: text.strip() == task.answer)
        >>> obs, info = env.reset(seed=0)
        >>> obs["prompt"]
        '2+3='
        >>> obs, reward, terminated, truncated, info = env.step("5")
        >>> reward, terminated, truncated
        (1.0, True, False)
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        tasks: TaskSourceLike,
        verifier: VerifierLike | None,
        tokenizer: Any = None,
        *,
        max_prompt_chars: int = 1_000_000,
        max_completion_chars: int = 1_000_000,
        render_mode: str | None = None,
    ):
        self.tasks = TaskSource(tasks)
        self.verifier: Verifier | None = as_verifier(verifier) if verifier is not None else None
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode
        self.max_prompt_chars = max_prompt_chars
        self.action_space = AnyText(max_completion_chars)
        self.tokenizer = None
        self.set_tokenizer(tokenizer)
        self.task: Task | None = None
        self._done = True
        self._text = ""
        self._ids: list[int] = []
        self.state: dict[str, Any] = {}

    # -- configuration --------------------------------------------------------------------------
    def set_tokenizer(self, tokenizer: Any) -> None:
        """Attach a tokenizer: observations gain ``prompt_ids`` and token-id actions are accepted."""
        self.tokenizer = tokenizer
        obs = {"prompt": AnyText(self.max_prompt_chars)}
        if tokenizer is not None:
            obs["prompt_ids"] = token_ids_space(self.vocab_size)
        self.observation_space = spaces.Dict(obs)

    @property
    def vocab_size(self) -> int:
        if self.tokenizer is None:
            raise ValueError("this env has no tokenizer: pass tokenizer=... to use token ids")
        return len(self.tokenizer)

    def clone(self) -> "SequenceEnv":
        """A copy sharing tasks, verifier and tokenizer, with its own episode state (for groups)."""
        other = copy.copy(self)
        other.task, other._done, other._text, other._ids, other.state = None, True, "", [], {}
        other._np_random = None
        return other

    # -- Gymnasium API ----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = options or {}
        if "task" in options:
            task = _check_task(options["task"])
        elif "task_id" in options:
            task = self.tasks.find(options["task_id"])
        else:
            task = self.tasks.draw(self.np_random)
        self.task, self._done, self.state = task, False, {}
        self._text = render_prompt(task, self.tokenizer)
        self._ids = encode_text(self.tokenizer, self._text, first=not task.is_chat) if self.tokenizer else []
        self.start(task)
        return self._observation(), {"task": task}

    def step(self, action: Any):
        if self.task is None:
            raise gym.error.ResetNeeded("call env.reset() before env.step()")
        if self._done:
            raise gym.error.ResetNeeded(
                "the episode is over (terminated or truncated): call env.reset() before stepping again"
            )
        text, ids = self._parse_action(action)
        self._text += text
        if self.tokenizer is not None:
            self._ids += ids
        return self._after_completion(text, ids)

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._text
        return None

    # -- hooks ------------------------------------------------------------------------------------
    def start(self, task: Task) -> None:
        """Called at every reset after the task is chosen; set per-episode ``self.state`` here."""

    def score(self, completion: str) -> Score:
        """The verifier's score of ``completion`` for the current task."""
        if self.verifier is None:
            raise ValueError(f"{type(self).__name__} has no verifier: pass one or override respond()/score()")
        return self.verifier(self.task, completion)

    # -- internals --------------------------------------------------------------------------------
    def _after_completion(self, text: str, ids: list[int]):
        score = self.score(text)
        self._done = True
        info = {"task": self.task, "completion": text, "score": dict(score.info)}
        if "error" in score.info:
            info["error"] = score.info["error"]
        return self._observation(), score.reward, True, False, info

    def _observation(self) -> dict[str, Any]:
        obs: dict[str, Any] = {"prompt": self._text}
        if self.tokenizer is not None:
            obs["prompt_ids"] = as_token_array(self._ids)
        return obs

    def _parse_action(self, action: Any) -> tuple[str, list[int]]:
        if isinstance(action, str):
            ids = encode_text(self.tokenizer, action, first=False) if self.tokenizer is not None else []
            return action, ids
        ids = _as_id_list(action)
        if ids is None:
            raise TypeError(
                f"an action must be completion text (str) or a 1-D sequence of token ids, "
                f"got {type(action).__name__}: {action!r:.80}"
            )
        if self.tokenizer is None:
            raise ValueError(
                "token-id actions need a tokenizer: build the env with tokenizer=... "
                "(or gymnasium.make(id, tokenizer=tok)), or step with text"
            )
        vocab = self.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(
                f"token id {bad[0]} is outside the vocabulary [0, {vocab}): was the action produced "
                f"with a different tokenizer or model head?"
            )
        return self.tokenizer.decode(ids, skip_special_tokens=True), ids


def _as_id_list(action: Any) -> list[int] | None:
    if hasattr(action, "detach") and hasattr(action, "tolist"):  # torch tensor
        action = action.detach().cpu().numpy()
    if isinstance(action, np.ndarray):
        if action.ndim != 1 or not np.issubdtype(action.dtype, np.integer):
            return None
        return action.astype(np.int64).tolist()
    if isinstance(action, (list, tuple)):
        if all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in action):
            return [int(t) for t in action]
    return None


def _respond_in_child(env: "MultiTurnEnv", text: str, limit: float) -> tuple[Turn, dict[str, Any]]:
    """``env.respond(text)`` in a forked process, killed after ``limit`` seconds: ``(turn, env.state)``."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)

    def run() -> None:
        try:
            sender.send((env.respond(text), env.state, None))
        except BaseException as exc:  # sent to the parent (as text if it does not pickle)
            try:
                sender.send((None, None, exc))
            except Exception:
                sender.send((None, None, f"{type(exc).__name__}: {exc}"))

    child = context.Process(target=run, daemon=True)
    child.start()
    sender.close()
    try:
        if not receiver.poll(limit):
            raise TimeoutError(f"respond took longer than {limit} s (killed)")
        try:
            turn, state, error = receiver.recv()
        except EOFError:
            raise RuntimeError("respond's process died before answering") from None
    finally:
        child.kill()
        child.join()
        receiver.close()
    if isinstance(error, Exception):
        raise error
    if error is not None:
        raise RuntimeError(error)
    return turn, state


class MultiTurnEnv(SequenceEnv):
    """An episode of several completions: after each one the env replies and the policy speaks again.

    Override :meth:`respond` (one hook) to decide the reward, the reply and whether the episode is
    over; keep per-episode state in ``self.state`` (reset to ``{}`` at every reset; fill it in
    :meth:`start`). The default :meth:`respond` scores with the verifier and, until solved, replies
    "Incorrect, try again." — a retry loop.

    The episode terminates when ``respond`` says ``done`` and is truncated after ``max_turns``
    completions. ``respond`` judges hostile model output: an exception inside it (or, with
    ``respond_time_limit`` set, running past that many seconds) ends the episode with reward 0.0 and
    the error in ``info["error"]``, like a verifier's, never a crash; a failure of the sandbox itself
    (:class:`~llmgym.sandbox.SandboxError`) is the machine's, not the completion's, and is raised. Under a time limit ``respond``
    runs in a forked child process that is killed at the limit; its ``self.state`` changes are
    copied back with its :class:`Turn` (both must pickle). Token ids in, token ids out: the observation's ``prompt_ids`` are the previous
    context + the exact completion ids given to ``step`` + the encoded reply, never a re-tokenised
    transcript, so a policy conditions on exactly what it produced.

    Args:
        max_turns: completions per episode at most.
        solved_reward: with the default ``respond``, a reward at or above it ends the episode.
        (others as :class:`SequenceEnv`)

    Example:
        >>> from llmgym import MultiTurnEnv, Task, Turn
        >>> class Guess(MultiTurnEnv):
        ...     def respond(self, completion):
        ...         guess, target = int(completion), self.task.answer
        ...         if guess == target:
        ...             return Turn(1.0, done=True)
        ...         return Turn(0.0, reply="higher" if guess < target else "lower")
        >>> env = Guess([Task("Guess 1-10:", answer=7)], verifier=None, max_turns=4)
        >>> _ = env.reset(seed=0)
        >>> obs, r, term, trunc, info = env.step("3")
        >>> info["reply"], r, term
        ('higher', 0.0, False)
        >>> obs, r, term, trunc, info = env.step("7")
        >>> r, term
        (1.0, True)
        >>> _ = env.reset(seed=0)
        >>> obs, r, term, trunc, info = env.step("seven")  # respond raised: reward 0, episode over
        >>> r, term, info["error"]
        (0.0, True, "ValueError: invalid literal for int() with base 10: 'seven'")
    """

    def __init__(
        self,
        tasks: TaskSourceLike,
        verifier: VerifierLike | None = None,
        tokenizer: Any = None,
        *,
        max_turns: int = 3,
        solved_reward: float = 1.0,
        **kwargs: Any,
    ):
        super().__init__(tasks, verifier, tokenizer, **kwargs)
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns, self.solved_reward = max_turns, solved_reward
        self.turn = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.turn = 0
        return super().reset(seed=seed, options=options)

    def clone(self) -> "MultiTurnEnv":
        other = super().clone()
        other.turn = 0
        return other

    respond_time_limit: float | None = None
    """Seconds one :meth:`respond` may take; ``None``: no limit (a verifier it calls has its own)."""

    def respond(self, completion: str) -> Turn:
        """Judge ``completion`` and decide the env's reply. Override this for games and tools."""
        score = self.score(completion)
        if score.reward >= self.solved_reward:
            return Turn(score.reward, None, True, score.info)
        return Turn(score.reward, "Incorrect, try again.", False, score.info)

    def format_reply(self, reply: str) -> str:
        """How a reply is appended to the transcript (override for a chat format)."""
        return f"\n{reply}\n"

    def _respond_safely(self, text: str) -> Turn:
        """:meth:`respond`, with an exception, a time-out or a non-Turn result turned into reward 0 and done."""
        try:
            if self.respond_time_limit is None:
                turn = self.respond(text)
            else:
                turn, self.state = _respond_in_child(self, text, self.respond_time_limit)
        except Exception as exc:  # a game's or tool's failure is the completion's zero, never a crash
            from llmgym.sandbox import SandboxError

            if isinstance(exc, SandboxError):  # the machine's failure, not the completion's: never a silent zero
                raise
            return Turn(0.0, None, True, {"error": f"{type(exc).__name__}: {exc}",
                                          "traceback": traceback.format_exc(limit=5)})
        if not isinstance(turn, Turn):
            return Turn(0.0, None, True, {"error": f"respond() must return a Turn, got {type(turn).__name__}"})
        return turn

    def _after_completion(self, text: str, ids: list[int]):
        turn = self._respond_safely(text)
        self.turn += 1
        terminated = bool(turn.done)
        truncated = not terminated and self.turn >= self.max_turns
        info: dict[str, Any] = {"task": self.task, "completion": text, "turn": self.turn, "reply": None}
        info.update(turn.info)
        if not (terminated or truncated) and turn.reply is not None:
            shown = self.format_reply(turn.reply)
            self._text += shown
            if self.tokenizer is not None:
                self._ids += encode_text(self.tokenizer, shown, first=False)
            info["reply"] = turn.reply
        self._done = terminated or truncated
        return self._observation(), float(turn.reward), terminated, truncated, info
