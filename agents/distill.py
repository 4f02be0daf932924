"""On-policy distillation: the student samples, a teacher grades every token it wrote.

The student π_S samples completions from the env as any agent does; the teacher π_T scores the
student's own tokens (one teacher-forced pass: its log-probs of the same ids), and each token's
reward is the negative reverse-KL sample ``−(log π_S(x_t) − log π_T(x_t))`` — dense, per token, and
its mean under the student is ``−KL(π_S ‖ π_T)``. The loss is a policy gradient on that reward with
discount 0 (:func:`llmgym.agents.functional.distillation_loss`; GKD, Agarwal et al. 2024; the Thinking
Machines "On-Policy Distillation" post, Lu et al. 2025). ``distill_coef`` α < 1 mixes in the env's
reward: ``A_t = α·r_t + (1 − α)·A_env``, with ``A_env`` the episode's reward centred in its group.

Where the teacher comes from: ``teacher=`` an engine with ``score_tokens`` (an
:class:`~llmgym.engines.HFEngine` forward, a :class:`~llmgym.engines.VLLMEngine`'s prompt log-probs, a
served model that reports them), a ``transformers`` model, or a model path in the config's ``teacher``
(loaded on ``teacher_device``). The teacher never trains: its weights are frozen, it holds no optimiser
state and is not in the checkpoint (the config names it, and a resumed run loads it again).

The teacher must read the student's token ids as the student does: a teacher whose vocabulary differs
(an id mapped to another token, another size, another decoder) is refused by :func:`check_same_vocabulary`.

What a teacher says it scored is not trusted (:mod:`llmgym.agents.teacher_checks`): scores that cannot be
log-probs of one model (not finite, above 0, below ``−(ln V + 300)``, or distinct tokens after one shared prefix
whose probabilities sum above 1) stop the step before it trains; so does a teacher that is the student (the
same object or weights at construction, the same log-probs on the first batch: every reward would be 0). A
served teacher's echo is checked against the ids sent (:func:`llmgym.engines.served_replies.check_echo`).

Multi-turn episodes: the env's turns are context for both models and are not graded (the action mask);
token level: the same batch, token by token. With LoRA on the student only its adapters train.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

import torch

from llmgym.agents import functional as F
from llmgym.agents.base import Agent, AgentConfig, ForwardOutput
from llmgym.agents.teacher_checks import TeacherScoreError, check_not_the_student, check_teacher_scores, same_weights
from llmgym.engines import HFEngine
from llmgym.engines.base import optional_member
from llmgym.errors import LLMGymError
from llmgym.rollout.episodes import Batch

__all__ = ["DistillConfig", "OnPolicyDistillation", "TeacherMismatchError", "TeacherScoreError",
           "check_same_vocabulary", "teacher_logprobs", "sampled_reverse_kl"]


class TeacherMismatchError(LLMGymError, ValueError):
    """The teacher cannot grade the student's tokens (another vocabulary, or no way to score tokens)."""


@dataclasses.dataclass
class DistillConfig(AgentConfig):
    """On-policy distillation settings.

    Attributes:
        teacher: the teacher model to load (a directory saved with ``save_pretrained``, a hub id, or
            ``"tiny"``) when no ``teacher=`` object is given to the agent.
        teacher_device: where the loaded teacher runs (``None``: the student's device).
        distill_coef: α in [0, 1], the weight of the reverse-KL reward; ``1 − α`` weights the env's
            reward (1: pure distillation).
    """

    teacher: str | None = None
    teacher_device: str | None = None
    distill_coef: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.distill_coef <= 1.0:
            raise ValueError(f"distill_coef must be in [0, 1] (1 = pure distillation, 0 = the env's reward only), "
                             f"got {self.distill_coef}")


def _vocab_of(tokenizer) -> dict[str, int]:
    vocab = tokenizer.get_vocab()
    return {str(k): int(v) for k, v in vocab.items()}


def _decoder_of(tokenizer) -> str | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if decoder is None:
        return None
    try:
        return json.dumps(json.loads(backend.to_str())["decoder"], sort_keys=True)
    except Exception:  # a backend that cannot serialise itself: compare the decoder's type
        return type(decoder).__name__


def check_same_vocabulary(student_tokenizer, teacher_tokenizer, *, student_vocab_size: int | None = None,
                          teacher_vocab_size: int | None = None) -> None:
    """Raise :class:`TeacherMismatchError` unless the teacher reads every student token id as the student does.

    Sound for scoring ids, not text: the two tokenizers must map the same token strings to the same ids
    (added and special tokens included) and decode them alike, and the teacher's model must have an
    output for every id the student's can sample (``*_vocab_size``: the models' ``config.vocab_size``).
    How each tokenizer splits *text* does not matter here: the teacher only scores the student's ids.

    Example:
        >>> from llmgym.runtime.models import build_tokenizer
        >>> from llmgym.agents.distill import check_same_vocabulary
        >>> tok = build_tokenizer()
        >>> check_same_vocabulary(tok, build_tokenizer())
        >>> check_same_vocabulary(tok, tok, student_vocab_size=512, teacher_vocab_size=256)
        Traceback (most recent call last):
        ...
        llmgym.agents.distill.TeacherMismatchError: the teacher's model has 256 outputs but the student can sample ids up to 511: on-policy distillation needs a teacher with the student's vocabulary (same tokenizer)
    """
    hint = "on-policy distillation needs a teacher with the student's vocabulary (same tokenizer)"
    if student_tokenizer is not teacher_tokenizer:
        student, teacher = _vocab_of(student_tokenizer), _vocab_of(teacher_tokenizer)
        if student != teacher:
            by_id_s = {v: k for k, v in student.items()}
            by_id_t = {v: k for k, v in teacher.items()}
            ids = sorted(set(by_id_s) | set(by_id_t))
            first = next(i for i in ids if by_id_s.get(i) != by_id_t.get(i))
            raise TeacherMismatchError(
                f"the teacher's tokenizer differs from the student's ({len(teacher)} vs {len(student)} tokens; id "
                f"{first} is {by_id_t.get(first)!r} for the teacher and {by_id_s.get(first)!r} for the student): {hint}")
        if _decoder_of(student_tokenizer) != _decoder_of(teacher_tokenizer):
            raise TeacherMismatchError(f"the teacher's tokenizer decodes the same ids to other text (another decoder): "
                                       f"{hint}")
    if student_vocab_size is not None and teacher_vocab_size is not None and teacher_vocab_size < student_vocab_size:
        raise TeacherMismatchError(f"the teacher's model has {teacher_vocab_size} outputs but the student can sample ids "
                                   f"up to {student_vocab_size - 1}: {hint}")


def _vocab_size(teacher) -> int | None:
    """The teacher's vocabulary size where it says (the floor of :func:`~llmgym.agents.teacher_checks.logprob_floor`)."""
    size = getattr(teacher, "vocab_size", None)
    if size is None:
        size = getattr(getattr(getattr(teacher, "model", None), "config", None), "vocab_size", None)
    if size is None and getattr(teacher, "tokenizer", None) is not None:
        size = len(teacher.tokenizer)
    return int(size) if isinstance(size, int) else None


def _scores(teacher, rows: list[list[int]]) -> list[list[float]]:
    """``teacher.score_tokens(rows)``, refused (:class:`TeacherScoreError`) unless they can be log-probs of rows."""
    scores = teacher.score_tokens(rows)
    check_teacher_scores(rows, scores, vocab_size=_vocab_size(teacher))
    return scores


def teacher_logprobs(teacher, batch: Batch) -> torch.Tensor:
    """``[N, L-1]`` the teacher's log-probs of ``batch``'s tokens (aligned with ``batch.old_logprobs``; 0 on
    padding), from ``teacher.score_tokens`` on each row's real tokens (prompt, sampled and env tokens), checked
    by :func:`~llmgym.agents.teacher_checks.check_teacher_scores` (:class:`TeacherScoreError` if they cannot be
    a model's log-probs).

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.agents import GRPO
        >>> from llmgym.agents.distill import teacher_logprobs
        >>> from llmgym.engines import HFEngine
        >>> model, tok = load_model("tiny")
        >>> batch = GRPO(model, tok, tasks_per_step=2, group_size=2, max_new_tokens=4).collect(
        ...     gymnasium.make("llmgym/Copy-v0", tokenizer=tok))
        >>> scores = teacher_logprobs(HFEngine(model, tok), batch)  # the student as its own teacher
        >>> bool(((scores - batch.old_logprobs).abs() * batch.action_mask).max() < 1e-4)
        True
    """
    lengths = batch.attention_mask.sum(-1).tolist()
    rows = [batch.input_ids[i, :n].tolist() for i, n in enumerate(lengths)]
    scores = _scores(teacher, rows)
    out = torch.zeros(batch.old_logprobs.shape, dtype=torch.float32)
    for i, (n, row) in enumerate(zip(lengths, scores)):
        out[i, :n - 1] = torch.tensor(row, dtype=torch.float32)
    return out.to(batch.old_logprobs.device)


def sampled_reverse_kl(completions: Sequence[Any], teacher) -> float:
    """Mean over the sampled tokens of ``log π_S − log π_T``: the reverse KL ``KL(π_S ‖ π_T)`` per token,
    estimated on the student's completions (their ``logprobs`` are π_S's at sampling time); the teacher's
    scores checked as :func:`teacher_logprobs` checks them.

    Example:
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.engines import HFEngine, SamplingParams
        >>> from llmgym.agents.distill import sampled_reverse_kl
        >>> model, tok = load_model("tiny")
        >>> engine = HFEngine(model, tok)
        >>> done = engine.generate([tok.encode("copy:12=")], SamplingParams(n=4, max_new_tokens=4, seed=0))[0]
        >>> abs(sampled_reverse_kl(done, engine)) < 1e-4  # a model is its own perfect teacher
        True
    """
    rows = [list(c.prompt_ids) + list(c.token_ids) for c in completions]
    scores = _scores(teacher, rows)
    total, count = 0.0, 0
    for c, row in zip(completions, scores):
        graded = row[len(c.prompt_ids) - 1:]
        total += sum(s - t for s, t in zip(c.logprobs, graded))
        count += len(graded)
    return total / max(count, 1)


def _load_teacher(config: DistillConfig, student_device: torch.device):
    from llmgym.runtime.models import load_model

    device = config.teacher_device or (None if student_device.type == "cpu" else str(student_device))
    model, tokenizer = load_model(config.teacher, device=device)
    return model, tokenizer


class OnPolicyDistillation(Agent):
    """On-policy distillation from a frozen teacher (reverse KL per token as the reward).

    Args:
        model, tokenizer, config, engine, overrides: as :class:`~llmgym.agents.base.Agent`.
        teacher: an engine with ``score_tokens``, a ``transformers`` causal LM, or ``None`` to load
            ``config.teacher``.
        teacher_tokenizer: the teacher model's tokenizer (default: the student's; checked either way).

    A teacher that is the student (the same engine or model, or the same weights) is refused here, and one whose
    scores on the first batch are the student's own log-probs at :meth:`prepare`: every reward would be 0.

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym.runtime.models import TinyModelConfig, build_tiny_model, load_model
        >>> from llmgym.agents import OnPolicyDistillation
        >>> student, tok = load_model("tiny")
        >>> teacher = build_tiny_model(tok, TinyModelConfig(seed=1))  # other weights, the same tokenizer
        >>> agent = OnPolicyDistillation(student, tok, teacher=teacher, tasks_per_step=2, group_size=2, max_new_tokens=4)
        >>> row = agent.learn(gymnasium.make("llmgym/Copy-v0", tokenizer=tok), steps=1)[0]
        >>> row["reverse_kl"] == row["reverse_kl"], any(p.requires_grad for p in agent.teacher.model.parameters())
        (True, False)
    """

    config_class = DistillConfig
    name = "distill"

    def __init__(self, model, tokenizer, config: DistillConfig | None = None, *, engine=None, teacher=None,
                 teacher_tokenizer=None, **overrides: Any):
        super().__init__(model, tokenizer, config, engine=engine, **overrides)
        c = self.config
        teacher_model = None
        if teacher is None:
            if not c.teacher:
                raise TeacherMismatchError("on-policy distillation needs a teacher: pass teacher= (an engine or a model) "
                                           "or set the config's teacher to a model path (--teacher PATH)")
            teacher_model, teacher_tokenizer = _load_teacher(c, self.device)
        elif isinstance(teacher, (str, bytes)) or hasattr(teacher, "__fspath__"):
            teacher_model, teacher_tokenizer = _load_teacher(dataclasses.replace(c, teacher=str(teacher)), self.device)
        elif isinstance(teacher, torch.nn.Module):
            teacher_model, teacher_tokenizer = teacher, teacher_tokenizer or tokenizer
        idle = "every reverse-KL reward would be 0 and nothing would train from it; give another model as the teacher"
        if teacher is not None and teacher is self.engine:
            raise TeacherMismatchError(f"the teacher is the student's own engine: {idle}")
        if teacher_model is None and isinstance(getattr(teacher, "model", None), torch.nn.Module):
            if teacher.model is model or same_weights(teacher.model, model):
                raise TeacherMismatchError(f"the teacher engine runs the student's model (the same weights): {idle}")
        if teacher_model is not None:
            student_ids = {id(p) for p in model.parameters()}
            if any(id(p) in student_ids for p in teacher_model.parameters()):
                raise TeacherMismatchError("the teacher shares weights with the student; give a separate model "
                                           "(the teacher must not train)")
            if same_weights(teacher_model, model):
                raise TeacherMismatchError(f"the teacher has the student's weights (the same model loaded twice): {idle}")
            teacher_model.requires_grad_(False)
            teacher_model.eval()
            teacher = HFEngine(teacher_model, teacher_tokenizer)
        if optional_member(teacher, "score_tokens") is None:
            raise TeacherMismatchError(f"the teacher engine {type(teacher).__name__} cannot score tokens (no score_tokens): "
                                       f"use an HFEngine or VLLMEngine over the teacher model")
        model_of = getattr(teacher, "model", None)
        check_same_vocabulary(
            tokenizer, getattr(teacher, "tokenizer", None) or tokenizer,
            student_vocab_size=getattr(getattr(model, "config", None), "vocab_size", None),
            teacher_vocab_size=getattr(getattr(model_of, "config", None), "vocab_size", None)
            if isinstance(model_of, torch.nn.Module) else None)
        self.teacher = teacher
        self._teacher_seen = False  # the first batch also checks that the teacher is not the student

    def prepare(self, batch: Batch) -> Batch:
        with torch.no_grad():
            batch.teacher_logprobs = teacher_logprobs(self.teacher, batch)
        if not self._teacher_seen:
            check_not_the_student(batch.old_logprobs, batch.teacher_logprobs, batch.action_mask)
            self._teacher_seen = True
        return super().prepare(batch)

    def compute_advantages(self, batch: Batch) -> None:
        c = self.config
        env = None
        if c.distill_coef < 1.0:
            scores = self.sequence_scores(batch)
            env = (F.group_advantages(scores.view(-1, c.group_size), normalize_std=False).view(-1)
                   if c.group_size > 1 else scores)
        batch.advantages = F.distillation_advantages(batch.old_logprobs, batch.teacher_logprobs, batch.action_mask,
                                                     env, c.distill_coef)

    def loss(self, batch: Batch, out: ForwardOutput):
        c = self.config
        # the advantage is distillation_advantages' (filled in prepare, where the learner's corrections may
        # reweight it); on-policy this is exactly F.distillation_loss
        pg_loss, is_clipped = F.clipped_surrogate_loss(out.logprobs, batch.old_logprobs, batch.advantages,
                                                       c.clip_low, c.clip_high, c.dual_clip, mask=batch.action_mask)
        kl = self.reference_kl(batch, out)
        loss = F.policy_objective(pg_loss, self.loss_mask(batch), c.loss_agg, kl=kl, kl_coef=self.kl_coef_in_loss,
                                  entropy=out.entropy, entropy_coef=c.entropy_coef, normalizer=c.max_new_tokens)
        stats = self.policy_stats(batch, out, is_clipped, kl)
        mask = batch.action_mask
        # the reverse KL per token, k1 on the student's samples: log π_S − log π_T (π_S when it sampled)
        stats["reverse_kl"] = float(F.masked_mean(batch.old_logprobs - batch.teacher_logprobs, mask))
        stats["teacher_logprob"] = float(F.masked_mean(batch.teacher_logprobs, mask))
        return loss, stats
