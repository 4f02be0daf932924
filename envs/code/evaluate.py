"""pass@k over sampled programs: run every sample in the sandbox, count passes per task.

The estimator is :func:`llmgym.runtime.metrics.pass_at_k` (unbiased, Chen et al. 2021) averaged over
tasks; samples run concurrently through :meth:`CodeVerifier.verify_batch` (``Sandbox.run_many``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from llmgym.envs.code.code_verifier import CodeVerifier
from llmgym import Task
from llmgym.runtime.metrics import pass_at_k

__all__ = ["PassAtKResult", "evaluate_pass_at_k"]


@dataclasses.dataclass
class PassAtKResult:
    """pass@k of a set of samples.

    Attributes:
        pass_at: ``{k: mean over tasks of pass@k}``.
        num_samples / num_correct: per task id, samples drawn and samples that passed.
    """

    pass_at: dict[int, float]
    num_samples: dict[str, int]
    num_correct: dict[str, int]

    def __str__(self) -> str:
        scores = ", ".join(f"pass@{k} = {v:.3f}" for k, v in self.pass_at.items())
        return f"{scores} over {len(self.num_samples)} tasks ({sum(self.num_samples.values())} samples)"


def evaluate_pass_at_k(
    tasks: Sequence[Task],
    samples: Sequence[Sequence[str]],
    ks: Sequence[int] = (1,),
    *,
    verifier: CodeVerifier | None = None,
    max_workers: int | None = None,
) -> PassAtKResult:
    """pass@k for ``samples[i]`` (the completions drawn for ``tasks[i]``); every ``k`` must be ≤ each task's n.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.envs.code import evaluate_pass_at_k
        >>> task = Task("Write neg(x).", tests="assert neg(3) == -3", metadata={"entry_point": "neg"}, id="neg")
        >>> good, bad = "def neg(x): return -x", "def neg(x): return x"
        >>> result = evaluate_pass_at_k([task], [[good, bad, bad, bad]], ks=(1, 2))
        >>> result.pass_at, result.num_correct
        ({1: 0.25, 2: 0.5}, {'neg': 1})
    """
    if len(tasks) != len(samples):
        raise ValueError(f"got {len(tasks)} tasks but samples for {len(samples)}")
    for task, drawn in zip(tasks, samples):
        too_big = [k for k in ks if k > len(drawn)]
        if too_big:
            raise ValueError(f"pass@{too_big[0]} needs at least {too_big[0]} samples; task {task.id!r} has {len(drawn)}")
    verifier = verifier or CodeVerifier()
    flat_tasks = [task for task, drawn in zip(tasks, samples) for _ in drawn]
    flat_samples = [completion for drawn in samples for completion in drawn]
    scores = verifier.verify_batch(flat_tasks, flat_samples, max_workers=max_workers)
    num_samples: dict[str, int] = {}
    num_correct: dict[str, int] = {}
    position = 0
    for i, (task, drawn) in enumerate(zip(tasks, samples)):
        key = task.id or f"task-{i}"
        passed = sum(s.reward >= 1.0 for s in scores[position:position + len(drawn)])
        position += len(drawn)
        num_samples[key], num_correct[key] = len(drawn), passed
    pass_at = {
        k: sum(pass_at_k(num_samples[key], num_correct[key], k) for key in num_samples) / len(num_samples)
        for k in ks
    }
    return PassAtKResult(pass_at, num_samples, num_correct)
