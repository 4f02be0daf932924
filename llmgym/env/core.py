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
import reprlib
import traceback
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, Union

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from llmgym.sandbox.killable import call_in_killable_child
from llmgym.env.spaces import DEFAULT_MAX_CHARS, DEFAULT_MAX_TOKENS, AnyText, as_token_array, token_ids_space
from llmgym.env.types import Score, Task
from llmgym.env.verifiers import Verifier, VerifierLike, as_verifier

__all__ = [
    "DEFAULT_MAX_COMPLETION_CHARS", "TaskSource", "SequenceEnv", "MultiTurnEnv", "Turn", "ChatTurns",
    "render_prompt", "encode_text", "end_of_turn_ids",
]

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
        >>> from llmgym.env.core import TaskSource
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
        >>> from llmgym.env.core import render_prompt
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


def _is_special(tokenizer: Any, token_id: int) -> bool:
    if token_id in set(getattr(tokenizer, "all_special_ids", ()) or ()):
        return True
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return bool(getattr(added.get(token_id), "special", False))


def _id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple, set)):
        return [int(v) for v in value if v is not None]
    return [int(value)]


@dataclasses.dataclass(frozen=True)
class ChatTurns:
    """How a tokenizer's chat template closes an assistant turn and opens the env's next user turn.

    Read off the template by rendering a probe conversation ``[user, assistant]``: ``closing`` is what
    the template writes after the assistant's content (ChatML: ``"<|im_end|>\\n"``); when it starts
    with a special token, that token is ``end_of_turn_id`` and ``after_end_of_turn`` is the rest
    (ChatML: ``"\\n"``).

    Example:
        >>> from llmgym.env.core import ChatTurns
        >>> from llmgym.runtime.models import build_tokenizer
        >>> turns = ChatTurns.of(build_tokenizer())   # its template: <|role|>content\\n, no special tokens
        >>> turns.closing, turns.end_of_turn_id, turns.user_turn("higher")
        ('\\n', None, '<|user|>higher\\n<|assistant|>')
    """

    tokenizer: Any = dataclasses.field(repr=False, compare=False)
    closing: str
    end_of_turn_id: int | None
    after_end_of_turn: str

    @classmethod
    def of(cls, tokenizer: Any) -> "ChatTurns":
        """Analyse ``tokenizer``'s chat template; a clear error when it cannot render the probe."""
        content = "\u2063llmgym-probe\u2063"  # text no template writes itself
        probe = [{"role": "user", "content": "?"}, {"role": "assistant", "content": content}]
        try:
            rendered = tokenizer.apply_chat_template(probe, tokenize=False)
        except Exception as exc:  # a template is user code (Jinja): any failure is a bad template
            raise ValueError(
                f"the tokenizer's chat template cannot render a user turn followed by an assistant turn "
                f"({type(exc).__name__}: {exc}); fix the template or override MultiTurnEnv.format_reply"
            ) from exc
        if content not in rendered:
            raise ValueError(
                "the tokenizer's chat template drops the assistant's content when it renders a finished "
                "conversation, so the env cannot tell how a turn is closed; override MultiTurnEnv.format_reply"
            )
        closing = rendered[rendered.rindex(content) + len(content):]
        end_id, after = None, closing
        ids = list(tokenizer.encode(closing, add_special_tokens=False)) if closing else []
        if ids and _is_special(tokenizer, ids[0]):
            token_text = tokenizer.decode(ids[:1], skip_special_tokens=False)
            if closing.startswith(token_text):
                end_id, after = int(ids[0]), closing[len(token_text):]
        return cls(tokenizer, closing, end_id, after)

    def user_turn(self, content: str) -> str:
        """``content`` as a user turn followed by the assistant's generation prompt (the template's text)."""
        history = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "!"}]
        try:
            return self.appended(history, [{"role": "user", "content": content}])
        except ValueError as exc:
            raise ValueError(f"{exc}; override MultiTurnEnv.format_reply") from None

    def appended(self, history: list[dict[str, Any]], new: list[dict[str, Any]], **template_kwargs: Any) -> str:
        """What the template writes for ``new`` messages and the next generation prompt after ``history``,
        whose last message is the assistant's turn — kept as the model wrote it, never re-rendered.

        The difference of two renderings, with and without ``new``. Many templates re-render earlier turns
        once a turn follows (Qwen 3 and other reasoning models drop a past turn's ``<think>`` block): then
        the new text starts after that assistant turn's closing in the longer rendering, provided the
        re-rendered turn only *lost* a span (its reasoning) and the closings before it are the same; any
        other rewrite of history raises a ``ValueError``.

        Example:
            >>> from llmgym.env.core import ChatTurns
            >>> from llmgym.runtime.models import build_tokenizer
            >>> tok = build_tokenizer()
            >>> turns = ChatTurns.of(tok)
            >>> turns.appended([{"role": "user", "content": "?"}, {"role": "assistant", "content": "!"}],
            ...                [{"role": "user", "content": "more"}])
            '<|user|>more\\n<|assistant|>'
        """
        render = self.tokenizer.apply_chat_template
        before = render(history, tokenize=False, **template_kwargs)
        after = render(history + new, add_generation_prompt=True, tokenize=False, **template_kwargs)
        if after.startswith(before):
            return after[len(before):]
        stable = "the chat template renders earlier turns differently once a new turn follows"
        head = render(history[:-1], tokenize=False, **template_kwargs)  # everything before the assistant's turn
        count = before.count(self.closing) if self.closing else 0
        if not (count and before.endswith(self.closing) and before.startswith(head) and after.startswith(head)):
            raise ValueError(f"{stable}, and not only by dropping part of the last assistant turn")
        end = -1
        for _ in range(count):  # the assistant turn's closing: the count-th closing in the longer rendering
            end = after.find(self.closing, end + 1)
            if end < 0:
                raise ValueError(f"{stable}: the assistant turn's closing is not where it was")
        kept, redone = before[len(head):], after[len(head):end + len(self.closing)]
        common = 0
        while common < len(redone) and kept[common] == redone[common]:
            common += 1
        if len(redone) >= len(kept) or not kept.endswith(redone[common:]):  # redone = kept less one span
            raise ValueError(f"{stable}, and not only by dropping part of the last assistant turn")
        return after[end + len(self.closing):]


def end_of_turn_ids(tokenizer: Any, generation_config: Any = None) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS (an id or a list), the chat template's
    end-of-turn token (ChatML's ``<|im_end|>``), and ``generation_config.eos_token_id`` (an id or a list).

    Engines stop generating on these, :class:`~llmgym.TokenLevel` ends a turn on them, and
    :class:`MultiTurnEnv` treats a completion ending in one as a turn the model closed itself.

    Example:
        >>> from llmgym.env.core import end_of_turn_ids
        >>> from llmgym.runtime.models import build_tokenizer
        >>> tok = build_tokenizer()
        >>> end_of_turn_ids(tok) == [tok.eos_token_id], end_of_turn_ids(tok, type("G", (), {"eos_token_id": [7, 2]})())
        (True, [2, 7])
    """
    ids = set(_id_list(getattr(tokenizer, "eos_token_id", None)))
    ids.update(_id_list(getattr(generation_config, "eos_token_id", None)))
    if getattr(tokenizer, "chat_template", None):
        try:
            end_id = ChatTurns.of(tokenizer).end_of_turn_id
        except ValueError:  # a template that cannot render the probe declares no end-of-turn token
            end_id = None
        if end_id is not None:
            ids.add(end_id)
    return sorted(ids)


@dataclasses.dataclass
class Turn:
    """What :meth:`MultiTurnEnv.respond` returns after one completion.

    Attributes:
        reward: reward for this completion.
        reply: the env's answer, shown to the policy next (a user turn); ``None`` when the episode ends.
            :class:`~llmgym.tools.ToolEnv` replies with chat messages instead (its tool turns).
        done: ``True`` when the episode is over (solved, lost).
        info: details for ``step``'s ``info``.
    """

    reward: float
    reply: str | Sequence[Mapping[str, Any]] | None = None
    done: bool = False
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


#: Default bound on a completion's length at ``step`` (characters): generous for any answer or program,
#: small enough that every host-side parser of model output runs in milliseconds.
DEFAULT_MAX_COMPLETION_CHARS = 65_536


class SequenceEnv(gym.Env):
    """A single-turn env: observe a prompt, act with a whole completion, get the verifier's reward.

    Args:
        tasks: a list of :class:`~llmgym.Task`, an iterable of them, or ``fn(rng) -> Task``.
        verifier: a :class:`~llmgym.Verifier` or a function ``(task, completion) -> float | Score``.
        tokenizer: optional; with it the observation carries ``prompt_ids`` and actions may be ids.
        max_prompt_chars: bound of the observation's text space, default 65,536 characters
            (:data:`llmgym.env.spaces.DEFAULT_MAX_CHARS`); it covers the whole transcript of a
            multi-turn episode. An observation that outgrows it raises a ``ValueError``.
        max_completion_chars: the most characters of a completion that reach the verifier (default
            :data:`DEFAULT_MAX_COMPLETION_CHARS`, 64k): ``step`` cuts a longer text to this length, and
            an id sequence to this many ids, *before* anything reads it (tokenising, decoding,
            checking ids), and says so in ``info["truncated_completion"]`` (the action's original
            length, in characters or ids), so no work grows with an oversized action and host-side
            parsing of model output always sees bounded input.
        max_prompt_tokens: bound of ``prompt_ids``, default 65,536 ids.
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
        max_prompt_chars: int = DEFAULT_MAX_CHARS,
        max_completion_chars: int = DEFAULT_MAX_COMPLETION_CHARS,
        max_prompt_tokens: int = DEFAULT_MAX_TOKENS,
        render_mode: str | None = None,
    ):
        if isinstance(max_completion_chars, bool) or not isinstance(max_completion_chars, int) or max_completion_chars < 1:
            raise ValueError(f"max_completion_chars must be a positive int, got {max_completion_chars!r}")
        self.max_completion_chars = max_completion_chars
        self.tasks = TaskSource(tasks)
        self.verifier: Verifier | None = as_verifier(verifier) if verifier is not None else None
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode
        self.max_prompt_chars, self.max_prompt_tokens = max_prompt_chars, max_prompt_tokens
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
        # ids that end a completion (EOS, a chat template's end of turn); engines may add theirs
        self.stop_token_ids: set[int] = set(end_of_turn_ids(tokenizer)) if tokenizer is not None else set()
        self._chat_turns: ChatTurns | None = None
        obs = {"prompt": AnyText(self.max_prompt_chars)}
        if tokenizer is not None:
            obs["prompt_ids"] = token_ids_space(self.vocab_size, max_length=self.max_prompt_tokens)
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
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(
                f"reset(options=...) takes a dict such as {{'task': task}} or {{'task_id': id}}, "
                f"got {type(options).__name__}: {options!r:.80}"
            )
        options = options or {}
        if "task" in options:
            task = _check_task(options["task"])
        elif "task_id" in options:
            task = self.tasks.find(options["task_id"])
        else:
            task = self.tasks.draw(self.np_random)
        self.task, self._done, self.state = task, False, {}
        self._text, self._ids = self._render_prompt(task)
        self.start(task)
        return self._observation(), {"task": task}

    def step(self, action: Any):
        if self.task is None:
            raise gym.error.ResetNeeded("call env.reset() before env.step()")
        if self._done:
            raise gym.error.ResetNeeded(
                "the episode is over (terminated or truncated): call env.reset() before stepping again"
            )
        text, ids, original = self._parse_action(action)  # cut first: bounded input for every parser downstream
        self._text += text
        if self.tokenizer is not None:
            self._ids += ids
        result = self._after_completion(text, ids)
        if original is not None:
            result[4]["truncated_completion"] = original
        return result

    def completion_text(self, action: Any) -> str:
        """The text :meth:`step` would hand the verifier for ``action`` (cut, decoded, cut to ``max_completion_chars``)."""
        return self._parse_action(action)[0]

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
    def _render_prompt(self, task: Task) -> tuple[str, list[int]]:
        """The first observation's text and ids (chat prompts through the template, BOS only for plain text)."""
        text = render_prompt(task, self.tokenizer)
        return text, (encode_text(self.tokenizer, text, first=not task.is_chat) if self.tokenizer is not None else [])

    def _after_completion(self, text: str, ids: list[int]):
        score = self.score(text)
        self._done = True
        info = {"task": self.task, "completion": text, "score": dict(score.info)}
        if "error" in score.info:
            info["error"] = score.info["error"]
        return self._observation(), score.reward, True, False, info

    def _over_bounds(self) -> bool:
        return len(self._text) > self.max_prompt_chars or (
            self.tokenizer is not None and len(self._ids) > self.max_prompt_tokens
        )

    def _observation(self) -> dict[str, Any]:
        # an observation must lie in observation_space (vector envs size their buffers from it)
        text, ids = self._text, self._ids
        if self._over_bounds():
            if not self._done:  # a prompt too long for the space: a configuration error, said at reset
                raise ValueError(
                    f"the prompt has {len(text):,} characters / {len(ids):,} token ids, over this env's bounds "
                    f"max_prompt_chars={self.max_prompt_chars:,} / max_prompt_tokens={self.max_prompt_tokens:,}: "
                    f"pass larger bounds to the env (gymnasium.make(id, max_prompt_chars=..., max_prompt_tokens=...) "
                    f"where its factory accepts them)"
                )
            # a finished episode whose transcript outgrew the space (multi-turn): its last observation is
            # never acted on, so show the tail that fits rather than crash a training run
            text, ids = text[-self.max_prompt_chars:], ids[-self.max_prompt_tokens:]
        obs: dict[str, Any] = {"prompt": text}
        if self.tokenizer is not None:
            obs["prompt_ids"] = as_token_array(ids)
        return obs

    def _parse_action(self, action: Any) -> tuple[str, list[int], int | None]:
        """``(text, ids, original length if it was cut)``: an oversized action is cut to
        ``max_completion_chars`` characters (or ids) before it is tokenised, decoded or checked."""
        limit = self.max_completion_chars
        if isinstance(action, str):
            # exactly a str (a subclass could redefine ==, strip(), `in` ... for every checker downstream),
            # through str's own methods, cut before any work that grows with it
            n = str.__len__(action)
            text = str.__getitem__(action, slice(0, limit)) if n > limit else str.__str__(action)
            ids = encode_text(self.tokenizer, text, first=False) if self.tokenizer is not None else []
            return text, ids, (n if n > limit else None)
        ids, n = _as_id_list(action, limit)
        if ids is None:
            raise TypeError(
                f"an action must be completion text (str) or a 1-D sequence of token ids, "
                f"got {type(action).__name__}: {reprlib.repr(action)}"  # bounded, whatever its size
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
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = n > len(ids) or len(text) > limit  # ids of several characters each can outgrow it too
        return text[:limit], ids, (n if cut else None)


def _as_id_list(action: Any, limit: int) -> tuple[list[int] | None, int]:
    """``(the first limit ids as ints, the action's length)``; ``(None, 0)`` for anything but a 1-D int sequence.
    Only the kept ids are read: an action of a billion ids costs what one of ``limit`` does."""
    if hasattr(action, "detach") and hasattr(action, "tolist"):  # torch tensor
        if getattr(action, "ndim", None) != 1:
            return None, 0
        n = int(action.shape[0])
        action = action.detach()[:limit].cpu().numpy()
        return (action.astype(np.int64).tolist() if np.issubdtype(action.dtype, np.integer) else None), n
    if isinstance(action, np.ndarray):
        if action.ndim != 1 or not np.issubdtype(action.dtype, np.integer):
            return None, 0
        return action[:limit].astype(np.int64).tolist(), int(action.shape[0])
    if isinstance(action, (list, tuple)):
        n = len(action)
        kept = list.__getitem__(action, slice(0, limit)) if isinstance(action, list) else tuple.__getitem__(
            action, slice(0, limit))
        if all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in kept):
            return [int(t) for t in kept], n
    return None, 0


def _respond_and_state(env: "MultiTurnEnv", text: str) -> tuple[Turn, dict[str, Any]]:
    return env.respond(text), env.state


def _respond_in_child(env: "MultiTurnEnv", text: str, limit: float) -> tuple[Turn, dict[str, Any]]:
    """``env.respond(text)`` in a killable child (:func:`llmgym.sandbox.killable.call_in_killable_child`),
    killed after ``limit`` seconds: ``(turn, env.state)``; its exception is raised here."""
    outcome = call_in_killable_child(_respond_and_state, env, text, limit=limit)
    if outcome.status == "timeout":
        raise TimeoutError(f"respond took longer than {limit} s (killed)")
    if outcome.status == "died":
        raise RuntimeError(f"respond's process died before answering ({outcome.value})")
    if outcome.status == "raised":
        if isinstance(outcome.value, Exception):
            raise outcome.value
        raise RuntimeError(str(outcome.value))
    return outcome.value


class MultiTurnEnv(SequenceEnv):
    """An episode of several completions: after each one the env replies and the policy speaks again.

    Override :meth:`respond` (one hook) to decide the reward, the reply and whether the episode is
    over; keep per-episode state in ``self.state`` (reset to ``{}`` at every reset; fill it in
    :meth:`start`). The default :meth:`respond` scores with the verifier and, until solved, replies
    "Incorrect, try again." — a retry loop.

    **The return rule.** An episode must never return more than solving the task at once: the
    rewards of failing turns cannot add up. Either reward only the outcome (0 for every turn but the
    last: the games) or pay :meth:`progress` of a per-attempt score, potential-based shaping whose
    sum telescopes to the last attempt's score (the default :meth:`respond`, ``CodeRetry``). A
    ``respond`` that pays each attempt its own score would let two near misses and a right answer
    return 2.5 where answering at once returns 1.0.

    The episode terminates when ``respond`` says ``done`` and is truncated after ``max_turns``
    completions. ``respond`` judges hostile model output: an exception inside it (or, with
    ``respond_time_limit`` set, running past that many seconds) ends the episode with reward 0.0 (under
    :meth:`progress` shaping: minus the potential so far, so the episode returns 0) and the error in
    ``info["error"]``, like a verifier's, never a crash; a failure of the sandbox itself
    (:class:`~llmgym.sandbox.SandboxError`) is the machine's, not the completion's, and is raised. Under a time limit ``respond``
    runs in a forked child process that is killed at the limit; its ``self.state`` changes are
    copied back with its :class:`Turn` (both must pickle). Token ids in, token ids out: the observation's ``prompt_ids`` are the previous
    context + the exact completion ids given to ``step`` + the encoded reply, never a re-tokenised
    transcript, so a policy conditions on exactly what it produced.

    How the reply is shown: for a chat task (messages) and a tokenizer with a chat template, the reply
    is a new *user* turn rendered through the template (:class:`ChatTurns`). The assistant's turn is
    kept as the model closed it: a completion that ends in an end-of-turn id (``stop_token_ids``:
    EOS, ChatML's ``<|im_end|>``, …) is followed only by what the template writes after that token
    (ChatML: a newline); one that does not (cut at the token limit, or text without the token) is
    closed with the template's closing first. Otherwise the reply is plain text, ``"\\n{reply}\\n"``
    (:meth:`format_reply`).

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

    setup_errors: tuple[type[Exception], ...] = ()
    """Exceptions that mean the env's set-up failed, not the completion: raised from ``step``, never a silent
    zero (as a verifier failure always is: :func:`~llmgym.env.verifiers.is_verifier_failure`)."""

    def respond(self, completion: str) -> Turn:
        """Judge ``completion`` and decide the env's reply. Override this for games and tools.

        The default: score the attempt with the verifier and pay its :meth:`progress` (the change in
        score since the previous attempt), so an episode returns its last attempt's score; until the
        score reaches ``solved_reward``, reply "Incorrect, try again.".
        """
        score = self.score(completion)
        reward = self.progress(score.reward)
        if score.reward >= self.solved_reward:
            return Turn(reward, None, True, score.info)
        return Turn(reward, "Incorrect, try again.", False, score.info)

    def progress(self, value: float) -> float:
        """Potential-based shaping: ``value`` minus the value this episode had before (0 at the start).

        Pay each turn ``progress(score of this attempt)`` and the turn rewards telescope: their sum
        is the last attempt's score, so failing on purpose and then answering can never return more
        than answering right at once (a near miss earns its partial credit once, and loses it again if
        the next attempt is worse). The value is kept in ``self.state["potential"]``.

        Example:
            >>> from llmgym import MultiTurnEnv, Task
            >>> env = MultiTurnEnv([Task("copy:12=", answer="12")], lambda t, c: 0.5 if c != t.answer else 1.0)
            >>> _ = env.reset(seed=0)
            >>> [env.progress(v) for v in (0.5, 0.5, 0.25, 1.0)]  # sums to the last value, 1.0
            [0.5, 0.0, -0.25, 0.75]
        """
        previous = float(self.state.get("potential", 0.0))
        self.state["potential"] = float(value)
        return float(value) - previous

    def format_reply(self, reply: str) -> str:
        """How a reply is appended to a plain-text transcript (chat tasks use the chat template instead)."""
        return f"\n{reply}\n"

    def _close_turn(self, ids: list[int]) -> str:
        """What follows the model's completion to end its turn: the template's text after the end-of-turn
        token when the model wrote one (kept as it closed it), else the template's whole closing."""
        if self._chat_turns is None:
            self._chat_turns = ChatTurns.of(self.tokenizer)
        turns = self._chat_turns
        if ids and ids[-1] in self.stop_token_ids:  # the model closed its turn: keep its token
            end_text = self.tokenizer.decode(ids[-1:], skip_special_tokens=False)
            if not self._text.endswith(end_text):  # the transcript text shows it, as the ids do
                self._text += end_text
            return turns.after_end_of_turn
        return turns.closing

    def _chat_reply(self, reply: str, ids: list[int]) -> str:
        """Close the assistant turn where the model did not, then the reply as a user turn."""
        closing = self._close_turn(ids)
        return closing + self._chat_turns.user_turn(reply)

    def _reply_text(self, turn: Turn, ids: list[int]) -> str:
        """The text appended after the completion to show ``turn.reply`` (a chat user turn, or plain text)."""
        return self._chat_reply(turn.reply, ids) if self._uses_chat_template() else self.format_reply(turn.reply)

    def _uses_chat_template(self) -> bool:
        return bool(self.task.is_chat and self.tokenizer is not None and getattr(self.tokenizer, "chat_template", None))

    def _respond_safely(self, text: str) -> Turn:
        """:meth:`respond`, with an exception, a time-out or a non-Turn result turned into a score of 0 and done.

        Under :meth:`progress` shaping the failed attempt's score is 0, so its turn pays minus the
        potential the episode had: the episode returns 0, as a completion that breaks a checker scores.
        """
        before = self.state.get("potential") if isinstance(self.state, dict) else None
        try:
            if self.respond_time_limit is None:
                turn = self.respond(text)
            else:
                turn, self.state = _respond_in_child(self, text, self.respond_time_limit)
        except Exception as exc:  # a game's or tool's failure is the completion's zero, never a crash
            from llmgym.env.verifiers import is_verifier_failure

            if is_verifier_failure(exc) or isinstance(exc, self.setup_errors):  # the machine's failure: never a silent zero
                raise
            return Turn(self._zero_score(before), None, True, {"error": f"{type(exc).__name__}: {exc}",
                                                               "traceback": traceback.format_exc(limit=5)})
        if not isinstance(turn, Turn):
            return Turn(self._zero_score(before), None, True,
                        {"error": f"respond() must return a Turn, got {type(turn).__name__}"})
        return turn

    def _zero_score(self, potential_before: float | None) -> float:
        """The reward of a failed attempt: 0, or under :meth:`progress` shaping minus the potential so far."""
        if potential_before is None:
            return 0.0
        self.state["potential"] = 0.0
        return -float(potential_before)

    def _after_completion(self, text: str, ids: list[int]):
        turn = self._respond_safely(text)
        self.turn += 1
        terminated = bool(turn.done)
        truncated = not terminated and self.turn >= self.max_turns
        info: dict[str, Any] = {"task": self.task, "completion": text, "turn": self.turn, "reply": None}
        info.update(turn.info)
        if not (terminated or truncated) and turn.reply is not None:
            shown = self._reply_text(turn, ids)
            self._text += shown
            if self.tokenizer is not None:
                self._ids += encode_text(self.tokenizer, shown, first=False)
            info["reply"] = turn.reply
            if self._over_bounds():  # the model's output may grow the transcript past the space: end here
                truncated = True
                info["error"] = (
                    f"the transcript outgrew the observation bounds (max_prompt_chars={self.max_prompt_chars:,}, "
                    f"max_prompt_tokens={self.max_prompt_tokens:,}): episode truncated; pass larger bounds to the env"
                )
        self._done = terminated or truncated
        return self._observation(), float(turn.reward), terminated, truncated, info
