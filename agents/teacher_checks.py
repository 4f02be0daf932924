"""What a teacher says it scored, checked before a student trains on it.

On-policy distillation trains on the teacher's log-probs of the student's tokens: whatever the teacher answers
becomes the reward of every token. A teacher is an engine (an in-process forward, vLLM, or a served model), and
its scores are data that crossed a boundary: :func:`check_teacher_scores` refuses scores that cannot be
log-probs of one model, and :func:`check_not_the_student` a teacher that is the student (whose reverse KL is 0:
nothing would train). Each raises :class:`TeacherScoreError` on one line, and the batch is not trained on
(dropping a row instead would let the teacher choose which rows train).

The rules, for scores ``s[i][j] = log π_T(x[i][j+1] | x[i][:j+1])``:

* **a log-prob**: finite and ``<= 0`` (+ :data:`LOGPROB_ABOVE_ZERO`);
* **a floor**: ``>= −(ln V + TEACHER_LOGIT_SPREAD)``. A softmax over ``V`` logits gives token ``t``
  ``log p_t = z_t − logsumexp(z) >= −(max z − min z) − ln V``: a lower log-prob means logits spread over more
  than :data:`TEACHER_LOGIT_SPREAD` nats, which no trained model's do (logit soft-capping stops at 2·30; a
  float32 log-softmax of a real LM bottoms out near −100). vLLM's ``-9999`` (a zero probability) and any
  made-up value far below fall out; a teacher that merely dislikes the student's token (−30, −80) does not;
* **one distribution per context**: rows that share a prefix share the teacher's distribution of the next
  token, so across the batch (the student samples a group per prompt) the probabilities of the *distinct*
  tokens that follow one prefix sum to at most 1 (+ :data:`PROBABILITY_SUM_TOL`). Two different tokens each
  at log-prob 0 ("everything is certain") sum to 2.

Example:
    >>> from llmgym.agents.teacher_checks import TeacherScoreError, check_teacher_scores
    >>> rows = [[1, 5, 6], [1, 5, 7]]  # one prefix [1, 5], two different next tokens
    >>> check_teacher_scores(rows, [[-0.1, -1.0], [-0.1, -0.7]], vocab_size=512)
    >>> try:
    ...     check_teacher_scores(rows, [[0.0, 0.0], [0.0, 0.0]], vocab_size=512)
    ... except TeacherScoreError as err:
    ...     print(err)
    the teacher's scores cannot be log-probs of one model (the teacher is hostile or broken; nothing was trained on them): after the same 2 tokens rows 0 and 1 continue with 2 different tokens whose probabilities sum to 2 (at most 1 + 0.05)
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from llmgym.engines.served_replies import PROBABILITY_SUM_TOL
from llmgym.errors import LLMGymError

__all__ = ["LOGPROB_ABOVE_ZERO", "SAME_AS_STUDENT_TOL", "TEACHER_LOGIT_SPREAD", "TeacherScoreError",
           "check_not_the_student", "check_teacher_scores", "logprob_floor", "same_weights"]

#: Nats by which the logits of a trained model may spread (max − min) at one position; see the module text.
TEACHER_LOGIT_SPREAD = 300.0
#: A log-prob above 0 by more than this is not one (float error of a log-softmax is far smaller).
LOGPROB_ABOVE_ZERO = 1e-4
#: The largest |teacher − student| log-prob difference over a batch's graded tokens at which the teacher is
#: taken for the student itself: the same weights in another engine (vLLM against a forward) differ by < 1e-2.
SAME_AS_STUDENT_TOL = 1e-2
_DEFAULT_VOCAB = 1 << 18  # without a vocabulary size: larger than any tokenizer's (the floor moves by ln V only)


class TeacherScoreError(LLMGymError, ValueError):
    """The teacher's scores cannot be what it says (not log-probs of one model), or the teacher is the student."""


def logprob_floor(vocab_size: int | None) -> float:
    """The lowest log-prob a sane teacher gives any token: ``−(ln V + TEACHER_LOGIT_SPREAD)``.

    Example:
        >>> from llmgym.agents.teacher_checks import logprob_floor
        >>> round(logprob_floor(151_936), 1)
        -311.9
    """
    return -(math.log(max(int(vocab_size or _DEFAULT_VOCAB), 2)) + TEACHER_LOGIT_SPREAD)


def _refuse(detail: str) -> TeacherScoreError:
    return TeacherScoreError(f"the teacher's scores cannot be log-probs of one model (the teacher is hostile or broken; "
                             f"nothing was trained on them): {detail}")


def check_teacher_scores(rows: Sequence[Sequence[int]], scores: Sequence[Sequence[float]], *,
                         vocab_size: int | None = None) -> None:
    """Raise :class:`TeacherScoreError` unless ``scores`` (``score_tokens(rows)``'s answer) can be a teacher's
    log-probs of ``rows``: one per token after the first, each finite, ``<= 0`` and above
    :func:`logprob_floor`, and, wherever rows share a prefix, the distinct next tokens' probabilities summing to
    at most ``1 + PROBABILITY_SUM_TOL`` (the module text gives the reasons). Example: the module's.
    """
    if len(scores) != len(rows):
        raise _refuse(f"it scored {len(scores)} of {len(rows)} sequences")
    floor = logprob_floor(vocab_size)
    # a trie over the rows: node = {next token: [child node, the smallest probability any row gave it]}
    root: dict = {}
    for i, (row, row_scores) in enumerate(zip(rows, scores)):
        if len(row_scores) != len(row) - 1:
            raise _refuse(f"it returned {len(row_scores)} log-probs for row {i} of {len(row)} tokens "
                          f"(one per token after the first)")
        node = root.setdefault(int(row[0]), [{}, 1.0, i])[0]
        for j, (token, lp) in enumerate(zip(row[1:], row_scores)):
            if not isinstance(lp, (int, float)) or not math.isfinite(lp) or lp > LOGPROB_ABOVE_ZERO:
                raise _refuse(f"row {i} position {j + 1} has log-prob {lp!r}, not a finite number <= 0")
            if lp < floor:
                raise _refuse(f"row {i} position {j + 1} has log-prob {lp:g}, below {floor:.1f} = −(ln V + "
                              f"{TEACHER_LOGIT_SPREAD:g}): no softmax of a trained model's logits gives that "
                              f"(vLLM writes -9999 for a probability of zero)")
            p = math.exp(min(lp, 0.0))
            entry = node.get(int(token))
            if entry is None:
                node[int(token)] = entry = [{}, p, i]
                if len(node) > 1:
                    total = sum(e[1] for e in node.values())
                    if total > 1.0 + PROBABILITY_SUM_TOL:
                        other = next(e[2] for t, e in node.items() if t != int(token))
                        raise _refuse(f"after the same {j + 1} tokens rows {other} and {i} continue with {len(node)} "
                                      f"different tokens whose probabilities sum to {total:.3g} (at most 1 + "
                                      f"{PROBABILITY_SUM_TOL:g})")
            elif p < entry[1]:
                entry[1] = p
            node = entry[0]


def check_not_the_student(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor) -> None:
    """Raise :class:`TeacherScoreError` when the teacher scores every graded token (``mask``) as the student did
    when it sampled, within :data:`SAME_AS_STUDENT_TOL`: the teacher is the student, every token's reward
    ``log π_T − log π_S`` is 0, and nothing would train.

    Example:
        >>> import torch
        >>> from llmgym.agents.teacher_checks import TeacherScoreError, check_not_the_student
        >>> s = torch.tensor([[-1.0, -2.0]])
        >>> check_not_the_student(s, s - 0.5, torch.ones(1, 2))
        >>> try:
        ...     check_not_the_student(s, s + 1e-6, torch.ones(1, 2))
        ... except TeacherScoreError as err:
        ...     print(err)
        the teacher is the student: it scores all 2 sampled tokens as the student does (largest difference 1e-06 <= 0.01), so every token's reverse-KL reward is 0 and nothing would train from it; give another model as --teacher
    """
    graded = mask.bool()
    count = int(graded.sum())
    if count == 0:
        return
    gap = float((teacher_logprobs.float() - student_logprobs.float()).abs()[graded].max())
    if gap <= SAME_AS_STUDENT_TOL:
        raise TeacherScoreError(f"the teacher is the student: it scores all {count} sampled tokens as the student does "
                                f"(largest difference {gap:.2g} <= {SAME_AS_STUDENT_TOL:g}), so every token's reverse-KL "
                                f"reward is 0 and nothing would train from it; give another model as --teacher")


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Whether two models hold the same weights: the same tensors by name, shape and value (another object
    loaded from the same directory is the same model).

    Example:
        >>> import copy, torch
        >>> from llmgym.agents.teacher_checks import same_weights
        >>> m = torch.nn.Linear(2, 2)
        >>> same_weights(m, copy.deepcopy(m)), same_weights(m, torch.nn.Linear(2, 2))
        (True, False)
    """
    if a is b:
        return True
    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys() or any(sa[k].shape != sb[k].shape or sa[k].dtype != sb[k].dtype for k in sa):
        return False
    with torch.no_grad():
        return all(torch.equal(sa[k], sb[k].to(sa[k].device)) for k in sa)
