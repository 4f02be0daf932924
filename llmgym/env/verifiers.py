"""Verifiers turn ``(task, completion_text)`` into a :class:`~llmgym.Score`.

Two kinds of failure, never confused. A *completion* that makes a check raise or time out scores 0.0
with the error in ``Score.info["error"]``: the episode goes on. A *verifier* that cannot run at all --
a dependency missing, a worker that does not start, no sandbox (:func:`is_verifier_failure`) --
raises, naming the cause: a silent 0 would train the policy on a lie. Any plain function ``(task, completion) -> float | Score`` is
accepted wherever a verifier is; :func:`as_verifier` does the wrapping.

Combinators build the reward shapes used for reasoning models: :class:`WeightedSum` (format +
correctness), :class:`AllOf` (every verifier must pass: CGPO's judges as constraints), :class:`RegexFormat` (a format
check) and :class:`LengthPenalty` (overlong shaping on text length).
"""

from __future__ import annotations

import abc
import math
import re
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Sequence, Union

from llmgym.errors import LLMGymError
from llmgym.sandbox import SandboxError
from llmgym.sandbox.killable import call_in_killable_child, in_killable_child, start_child_process
from llmgym.sandbox.killable import mark_killable_child as mark_time_limited_child
from llmgym.env.types import Score, Task

__all__ = [
    "VerifierUnavailableError",
    "in_time_limited_child",
    "is_verifier_failure",
    "mark_time_limited_child",
    "start_child_process",
    "Verifier",
    "FunctionVerifier",
    "as_verifier",
    "WeightedSum",
    "AllOf",
    "RegexFormat",
    "LengthPenalty",
    "exact_match",
    "keep_last_tokens",
    "escape_special_tokens",
    "exact_str",
    "RewardFunctionVerifier",
    "from_reward_function",
]

VerifierLike = Union["Verifier", Callable[[Task, str], Union[float, Score]]]


class VerifierUnavailableError(LLMGymError, RuntimeError):
    """The verifier itself cannot run (a dependency, a worker, the sandbox): raised, never scored 0."""


def is_verifier_failure(exc: BaseException) -> bool:
    """True when ``exc`` is the verifier's (or the machine's) failure rather than the completion's.

    These are raised from a verifier call instead of scoring 0: :class:`VerifierUnavailableError`,
    :class:`~llmgym.sandbox.SandboxError` (the sandbox is missing or failed) and :class:`ImportError`
    (a dependency is missing).

    Example:
        >>> from llmgym.env.verifiers import is_verifier_failure
        >>> is_verifier_failure(ModuleNotFoundError("no math_verify")), is_verifier_failure(ValueError("bad answer"))
        (True, False)
    """
    return isinstance(exc, (VerifierUnavailableError, SandboxError, ImportError))


def exact_str(text: Any) -> Any:
    """``text`` as exactly a ``str`` when it is a subclass of one (else unchanged).

    A completion is data: a ``str`` subclass whose ``==`` is always true (or whose ``strip()`` returns
    the answer) would pass every check that compares it.

    Example:
        >>> from llmgym.env.verifiers import exact_str
        >>> class Equal(str):
        ...     def __eq__(self, other): return True
        ...     __hash__ = str.__hash__
        >>> Equal("x") == "y", exact_str(Equal("x")) == "y", type(exact_str(Equal("x"))).__name__
        (True, False, 'str')
    """
    return str.__str__(text) if isinstance(text, str) and type(text) is not str else text


def _to_score(value: Any) -> Score:
    if isinstance(value, Score):
        return value
    if isinstance(value, bool) or isinstance(value, (int, float)):
        return Score(float(value))
    try:  # numpy / torch scalars
        return Score(float(value))
    except (TypeError, ValueError):
        raise TypeError(
            f"a verifier must return a float or a Score, got {type(value).__name__}: {value!r:.80}"
        ) from None


class Verifier(abc.ABC):
    """Base class: override :meth:`verify`; call the verifier itself to get a safe :class:`Score`.

    Args:
        time_limit: seconds one verification may take; past it the reward is 0.0 and
            ``info["error"]`` says "timeout". ``None`` (the default) means no limit and no extra
            process. With a limit, :meth:`verify` runs in a child process forked for the call and
            killed at the limit -- a thread could not stop a runaway check (a C-level regex holds the
            GIL), and an abandoned one would keep burning CPU after the step returned. It works from
            any thread; the :class:`~llmgym.Score` must be picklable, and the check's side effects
            stay in the child. (Forking copies the caller: cheap on Linux, but prefer verifiers that
            bound their own work, as the math and code verifiers do.)

    Example:
        >>> from llmgym import Task, Verifier
        >>> class EndsWithAnswer(Verifier):
        ...     def verify(self, task, completion):
        ...         return float(completion.strip().endswith(str(task.answer)))
        >>> v = EndsWithAnswer()
        >>> v(Task("1+1=", answer=2), "it is 2").reward
        1.0
        >>> class Broken(Verifier):
        ...     def verify(self, task, completion):
        ...         raise RuntimeError("parser exploded")
        >>> score = Broken()(Task("x"), "y")
        >>> score.reward, score.info["error"]
        (0.0, 'RuntimeError: parser exploded')
    """

    time_limit: float | None = None

    def __init__(self, time_limit: float | None = None) -> None:
        if time_limit is not None:
            self.time_limit = time_limit

    @abc.abstractmethod
    def verify(self, task: Task, completion: str) -> float | Score:
        """Score one completion. Override this; return a float or a :class:`Score`."""

    def __call__(self, task: Task, completion: str) -> Score:
        return self._safe(task, completion)

    def _safe(self, task: Task, completion: str) -> Score:
        if self.time_limit is None:
            return self._guarded(task, completion)
        return _check_in_killable_child(self._guarded, task, completion, self.time_limit)

    def _guarded(self, task: Task, completion: str) -> Score:
        completion = exact_str(completion)
        return self._guard(lambda: self.verify(task, completion))

    @staticmethod
    def _guard(check: Callable[[], float | Score]) -> Score:
        """``check()`` as a safe :class:`Score`: a completion's failure scores 0, the verifier's raises."""
        try:
            score = _to_score(check())
            if not math.isfinite(score.reward):  # a NaN reward would poison every advantage in its batch
                return Score(0.0, {**score.info, "error": f"non-finite reward {score.reward} (scored 0)"})
            return score
        except Exception as exc:  # a check's failure is the completion's zero, never a crash ...
            if is_verifier_failure(exc):  # ... unless the verifier itself cannot run: never a silent zero
                raise
            return Score(
                0.0,
                {
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(limit=5),
                },
            )

    def prefetch(self, tasks: Sequence[Task], completions: Sequence[str]) -> None:
        """Score a batch ahead of the one-by-one calls the envs will make (a hook; default: nothing).

        Rollouts call it with every completion of a turn before stepping the envs. A verifier for
        which one batched call is much cheaper than many single ones (a reward model's forward
        pass) overrides it and answers the following calls for the same ``(task, completion)`` from
        what it computed; any other call is scored as usual, so results never depend on it.
        """

    def verify_batch(
        self, tasks: Sequence[Task], completions: Sequence[str], max_workers: int | None = None
    ) -> list[Score]:
        """Score many completions; with ``max_workers`` > 1 they run in a thread pool.

        Subclasses whose checks are CPU-bound Python may override this with a process pool.
        """
        if len(tasks) != len(completions):
            raise ValueError(f"verify_batch got {len(tasks)} tasks but {len(completions)} completions")
        if not max_workers or max_workers <= 1:
            return [self(t, c) for t, c in zip(tasks, completions)]
        with ThreadPoolExecutor(max_workers) as pool:
            return list(pool.map(self, tasks, completions))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def in_time_limited_child() -> bool:
    """True inside a child forked to run a check under a time limit (a ``Verifier(time_limit=...)``
    or a multi-turn ``respond`` with ``respond_time_limit``): the whole child is killed at the limit,
    so starting anything slow here (a sandboxed worker) would eat the check's time.
    (:func:`llmgym.sandbox.killable.in_killable_child`.)

    Example:
        >>> from llmgym.env.verifiers import in_time_limited_child
        >>> in_time_limited_child()
        False
    """
    return in_killable_child()


def _classified(fn: Callable[[Task, str], Score], task: Task, completion: str) -> tuple[str, Any]:
    """In the child: ``("ok", score)``, or the failure as text, classified where the exception is
    (``"unavailable"``: the verifier cannot run; ``"error"``: the completion broke the check)."""
    try:
        return "ok", fn(task, completion)
    except BaseException as exc:
        return ("unavailable" if is_verifier_failure(exc) else "error"), f"{type(exc).__name__}: {exc}"


def _check_in_killable_child(fn: Callable[[Task, str], Score], task: Task, completion: str, limit: float) -> Score:
    """``fn(task, completion)`` in a killable child (:func:`llmgym.sandbox.killable.call_in_killable_child`)."""
    outcome = call_in_killable_child(_classified, fn, task, completion, limit=limit)
    if outcome.status == "timeout":
        return Score(0.0, {"error": f"timeout: verification took longer than {limit} s"})
    if outcome.status == "died":
        return Score(0.0, {"error": f"the verification process died: {outcome.value}"})
    if outcome.status == "raised":  # the Score did not pickle, or the like: the completion's 0
        error = outcome.value if isinstance(outcome.value, str) else f"{type(outcome.value).__name__}: {outcome.value}"
        return Score(0.0, {"error": error})
    status, value = outcome.value
    if status == "ok":
        return value
    if status == "unavailable":
        raise VerifierUnavailableError(f"the verifier cannot run: {value}")
    return Score(0.0, {"error": value})


class FunctionVerifier(Verifier):
    """A verifier made from a plain function ``(task, completion) -> float | Score``.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.env.verifiers import FunctionVerifier
        >>> v = FunctionVerifier(lambda task, text: text == task.answer)
        >>> v(Task("say hi", answer="hi"), "hi").reward
        1.0
    """

    def __init__(self, fn: Callable[[Task, str], float | Score], time_limit: float | None = None):
        if not callable(fn):
            raise TypeError(f"a verifier must be callable as fn(task, completion), got {fn!r:.80}")
        super().__init__(time_limit)
        self.fn = fn

    def verify(self, task: Task, completion: str) -> float | Score:
        return self.fn(task, completion)

    def __repr__(self) -> str:
        return f"FunctionVerifier({getattr(self.fn, '__name__', repr(self.fn))})"


def as_verifier(verifier: VerifierLike, time_limit: float | None = None) -> Verifier:
    """Return ``verifier`` itself if it is a :class:`Verifier`, else wrap the function.

    Example:
        >>> from llmgym import Task, as_verifier
        >>> as_verifier(lambda task, text: 0.5)(Task("q"), "a").reward
        0.5
    """
    if isinstance(verifier, Verifier):
        if time_limit is not None:
            verifier.time_limit = time_limit
        return verifier
    return FunctionVerifier(verifier, time_limit=time_limit)


#: Characters read per token allowed before tokenising (a generous 16: English averages ~4): the
#: tokeniser's own work stays bounded whatever the completion's length.
_CHARS_PER_TOKEN_READ = 16


def keep_last_tokens(tokenizer: Any, text: str, max_tokens: int) -> str:
    """The end of ``text`` that ``tokenizer`` encodes (alone, no special tokens) to at most ``max_tokens`` ids.

    For model-facing checkers of a completion (an LLM grader, a reward model): the input is bounded in
    tokens, what a model's cost grows with, not in characters (4,000 four-byte characters are 16,000
    byte-level tokens). The end is kept because that is where a completion's answer sits. Only the
    last ``16 * max_tokens`` characters are tokenised, so the tokeniser's work is bounded too; the
    returned text is re-encoded and cut again until it fits (decoding a cut can shift a seam by a
    token), so the bound is exact.

    Example:
        >>> from llmgym.runtime.models import build_tokenizer
        >>> from llmgym.env.verifiers import keep_last_tokens
        >>> tok = build_tokenizer()
        >>> tail = keep_last_tokens(tok, "\U0001F600" * 10_000 + " the answer is 4", 20)
        >>> len(tok.encode(tail, add_special_tokens=False)) <= 20, tail.endswith(" the answer is 4")
        (True, True)
        >>> keep_last_tokens(tok, "short", 100)
        'short'
    """
    if max_tokens < 1:
        return ""
    text = text[-max_tokens * _CHARS_PER_TOKEN_READ:]
    for _ in range(8):  # each pass drops at least one id; one pass is the rule, a second is rare
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        if len(ids) <= max_tokens:
            return text
        text = tokenizer.decode(ids[len(ids) - max_tokens:], skip_special_tokens=False)
    return ""


def escape_special_tokens(tokenizer: Any, text: str) -> str:
    """``text`` with every special token's text broken by an invisible separator (U+2063).

    Tokenisers turn the *text* of a special token into the token itself (``"</s>"`` becomes EOS,
    ``"<|im_end|>"`` ends a chat turn), so a completion could close the grader's user turn and open an
    assistant turn of its own. Escaped, it reads the same to a person and tokenises as plain text.

    Example:
        >>> from llmgym.runtime.models import build_tokenizer
        >>> from llmgym.env.verifiers import escape_special_tokens
        >>> tok = build_tokenizer()
        >>> tok.eos_token_id in tok.encode("yes</s>", add_special_tokens=False)
        True
        >>> tok.eos_token_id in tok.encode(escape_special_tokens(tok, "yes</s>"), add_special_tokens=False)
        False
    """
    specials = set(getattr(tokenizer, "all_special_tokens", None) or ())
    for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            specials.add(str(getattr(added, "content", "")))
    for special in sorted((t for t in specials if len(t) > 1), key=len, reverse=True):
        if special in text:
            text = text.replace(special, special[0] + "\u2063" + special[1:])
    return text


def exact_match(task: Task, completion: str) -> float:
    """1.0 when the stripped completion equals ``str(task.answer)``, else 0.0.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.env.verifiers import exact_match
        >>> exact_match(Task("1+1=", answer=2), " 2 ")
        1.0
    """
    return float(completion.strip() == str(task.answer).strip())


class WeightedSum(Verifier):
    """``reward = Σ w_i · reward_i`` over named parts; each part's score lands in ``info[name]``.

    ``info[name]`` is ``{"reward": reward_i, "weight": w_i, ...the part's own info}``: multi-reward
    learners (``llmgym.agents.GDPO``) read the components from it.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.env.verifiers import WeightedSum, RegexFormat, exact_match
        >>> v = WeightedSum({"format": (0.2, RegexFormat(r"\\d+")), "correct": (0.8, exact_match)})
        >>> v(Task("1+1=", answer=2), "2").reward
        1.0
        >>> round(v(Task("1+1=", answer=2), "3").reward, 3)
        0.2
    """

    def __init__(self, parts: dict[str, tuple[float, VerifierLike]], time_limit: float | None = None):
        super().__init__(time_limit)
        if not parts:
            raise ValueError("WeightedSum needs at least one part: {'name': (weight, verifier)}")
        self.parts = {name: (float(w), as_verifier(v)) for name, (w, v) in parts.items()}

    def verify(self, task: Task, completion: str) -> Score:
        total, info = 0.0, {}
        for name, (weight, verifier) in self.parts.items():
            score = verifier(task, completion)
            total += weight * score.reward
            info[name] = {"reward": score.reward, "weight": weight, **score.info}  # GDPO reads both
        return Score(total, info)


class AllOf(Verifier):
    """Every verifier must pass (reward ≥ ``threshold``): then ``reward`` is ``reward_if_all``, else 0.

    This is the "judges as constraints" combination (CGPO): a correct answer that breaks a format
    rule earns nothing.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.env.verifiers import AllOf, RegexFormat, exact_match
        >>> v = AllOf([RegexFormat(r"^\\d+$"), exact_match])
        >>> v(Task("q", answer="7"), "7").reward, v(Task("q", answer="7"), "8").reward
        (1.0, 0.0)
    """

    def __init__(
        self,
        verifiers: Iterable[VerifierLike],
        threshold: float = 1.0,
        reward_if_all: float = 1.0,
        time_limit: float | None = None,
    ):
        super().__init__(time_limit)
        self.verifiers = [as_verifier(v) for v in verifiers]
        if not self.verifiers:
            raise ValueError("AllOf needs at least one verifier")
        self.threshold, self.reward_if_all = threshold, reward_if_all

    def verify(self, task: Task, completion: str) -> Score:
        scores = [v(task, completion) for v in self.verifiers]
        info = {f"verifier_{i}": {"reward": s.reward, **s.info} for i, s in enumerate(scores)}
        passed = all(s.reward >= self.threshold for s in scores)
        return Score(self.reward_if_all if passed else 0.0, info)


class RegexFormat(Verifier):
    """1.0 when the completion matches ``pattern`` (``re.search``, DOTALL), else 0.0.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.env.verifiers import RegexFormat
        >>> fmt = RegexFormat(r"^<think>.*</think>\\s*<answer>.*</answer>$")
        >>> fmt(Task("q"), "<think>hm</think><answer>4</answer>").reward
        1.0
    """

    def __init__(self, pattern: str, flags: int = re.DOTALL, time_limit: float | None = None):
        # The pattern runs on the host over model output: write it without nested or overlapping
        # quantifiers (linear time), or give a time_limit (a killed child process enforces it).
        super().__init__(time_limit)
        self.pattern = re.compile(pattern, flags)

    def verify(self, task: Task, completion: str) -> Score:
        return Score(float(bool(self.pattern.search(completion))), {"pattern": self.pattern.pattern})


class LengthPenalty(Verifier):
    """Wrap a verifier and subtract a soft overlong penalty on the completion's length.

    With ``L`` the length (characters, or tokens when ``tokenizer`` is given), ``Lmax`` = ``max_length``
    and ``Lc`` = ``cache_length``: penalty 0 for ``L ≤ Lmax − Lc``, ``(L − (Lmax − Lc)) / Lc`` inside
    the cache band, 1 beyond ``Lmax`` (DAPO's soft overlong punishment, applied to any verifier).

    Example:
        >>> from llmgym import Task
        >>> from llmgym.env.verifiers import LengthPenalty
        >>> v = LengthPenalty(lambda t, c: 1.0, max_length=10, cache_length=4)
        >>> [v(Task("q"), "x" * n).reward for n in (6, 8, 12)]
        [1.0, 0.5, 0.0]
    """

    def __init__(
        self,
        inner: VerifierLike,
        max_length: int,
        cache_length: int,
        tokenizer: Any = None,
        time_limit: float | None = None,
    ):
        super().__init__(time_limit)
        if not 0 < cache_length <= max_length:
            raise ValueError(f"need 0 < cache_length <= max_length, got {cache_length}, {max_length}")
        self.inner, self.max_length, self.cache_length = as_verifier(inner), max_length, cache_length
        self.tokenizer = tokenizer

    def verify(self, task: Task, completion: str) -> Score:
        score = self.inner(task, completion)
        if self.tokenizer is not None:
            length = len(self.tokenizer.encode(completion, add_special_tokens=False))
        else:
            length = len(completion)
        free = self.max_length - self.cache_length
        penalty = min(1.0, max(0.0, (length - free) / self.cache_length))
        return Score(score.reward - penalty, {**score.info, "length": length, "length_penalty": penalty})


class RewardFunctionVerifier(Verifier):
    """A verifier over a TRL-style reward function ``fn(prompts, completions, **columns) -> list[float]``.

    :meth:`verify_batch` calls ``fn`` once for the whole batch, as TRL does; a single completion is
    a batch of one. ``prompts`` holds each task's prompt (text, or its chat messages), ``completions``
    the completion text (for a chat task: ``[{"role": "assistant", "content": text}]``, TRL's
    conversational form), and every key of the tasks' ``metadata`` arrives as a keyword argument with
    one value per completion (:func:`llmgym.env.sources.tasks_from_dataset` puts a dataset's columns
    there). A ``None`` in the returned list (TRL: "this function does not apply") scores 0.0 with a
    note in ``info["error"]``; an exception, a wrong-length result, a non-finite value or a time-out
    scores the whole batch 0.0 with the error, never a crash.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.env.verifiers import from_reward_function
        >>> def reward_len(prompts, completions, target, **kwargs):  # TRL's list form
        ...     return [-abs(t - len(c)) for c, t in zip(completions, target)]
        >>> verifier = from_reward_function(reward_len)
        >>> tasks = [Task("a", metadata={"target": 3}), Task("b", metadata={"target": 1})]
        >>> [s.reward for s in verifier.verify_batch(tasks, ["abc", "abc"])]
        [0.0, -2.0]
        >>> verifier(tasks[0], "abcd").reward
        -1.0
    """

    def __init__(self, fn: Callable[..., Sequence[float | None]], time_limit: float | None = None) -> None:
        super().__init__(time_limit)
        if not callable(fn):
            raise TypeError(f"a reward function must be callable, got {type(fn).__name__}")
        self.fn = fn

    def verify(self, task: Task, completion: str) -> Score:
        return self._scores([task], [completion])[0]

    def __call__(self, task: Task, completion: str) -> Score:
        return self.verify_batch([task], [completion])[0]

    def verify_batch(
        self, tasks: Sequence[Task], completions: Sequence[str], max_workers: int | None = None
    ) -> list[Score]:
        """One call of the reward function for all ``completions`` (``max_workers`` is not used)."""
        if len(tasks) != len(completions):
            raise ValueError(f"verify_batch got {len(tasks)} tasks but {len(completions)} completions")
        if not tasks:
            return []
        if self.time_limit is None:
            return self._guarded_batch(tasks, completions)
        # in a forked child killed at the limit, like Verifier: a thread could not stop the function
        outcome = _check_in_killable_child(lambda _t, _c: self._guarded_batch(tasks, completions), None, None,
                                           self.time_limit)
        if isinstance(outcome, Score):  # the child timed out or died: every completion scores 0
            error = outcome.info.get("error", "the reward function failed")
            if error.startswith("timeout"):
                error = f"timeout: the reward function took longer than {self.time_limit} s"
            return [Score(0.0, {"error": error}) for _ in tasks]
        return outcome

    def _guarded_batch(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[Score]:
        try:
            return self._scores(tasks, completions)
        except Exception as exc:  # the function's failure is the batch's zero, never a crash ...
            if is_verifier_failure(exc):  # ... unless it cannot run at all
                raise
            info = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=5)}
            return [Score(0.0, dict(info)) for _ in tasks]

    def _scores(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[Score]:
        prompts = [list(t.prompt) if t.is_chat else t.prompt for t in tasks]
        completions = [exact_str(c) for c in completions]
        shown = [[{"role": "assistant", "content": c}] if t.is_chat else c for t, c in zip(tasks, completions)]
        keys = sorted({k for t in tasks for k in t.metadata} - {"prompts", "completions"})
        columns = {k: [t.metadata.get(k) for t in tasks] for k in keys}
        values = self.fn(prompts=prompts, completions=shown, **columns)
        values = list(values) if values is not None else []
        if len(values) != len(tasks):
            raise ValueError(f"the reward function returned {len(values)} values for {len(tasks)} completions")
        scores = []
        for value in values:
            if value is None:
                scores.append(Score(0.0, {"error": "the reward function returned None (does not apply): scored 0"}))
                continue
            reward = _to_score(value).reward
            if not math.isfinite(reward):
                scores.append(Score(0.0, {"error": f"non-finite reward {reward} (scored 0)"}))
            else:
                scores.append(Score(reward))
        return scores

    def __repr__(self) -> str:
        return f"RewardFunctionVerifier({getattr(self.fn, '__name__', repr(self.fn))})"


def from_reward_function(fn: Callable[..., Sequence[float | None]], time_limit: float | None = None
                         ) -> RewardFunctionVerifier:
    """A batched llmgym verifier from a TRL-style list reward function (see :class:`RewardFunctionVerifier`).

    Example:
        >>> from llmgym import SequenceEnv, Task
        >>> from llmgym.env.verifiers import from_reward_function
        >>> def exact(prompts, completions, answer, **kwargs):
        ...     return [float(c.strip() == a) for c, a in zip(completions, answer)]
        >>> env = SequenceEnv([Task("1+1=", metadata={"answer": "2"})], from_reward_function(exact))
        >>> _ = env.reset(seed=0)
        >>> env.step(" 2")[1]
        1.0
    """
    return RewardFunctionVerifier(fn, time_limit)
