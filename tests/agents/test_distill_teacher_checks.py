"""What a teacher says it scored is checked before the student trains on it: scores that cannot be a model's
log-probs (each 0, −9999, above 0, distinct tokens after one prefix summing above 1) and a teacher that is the
student are refused on one line; honest teachers (another model's forward) pass."""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest
import torch

import llmgym  # noqa: F401
from llmgym.agents import OnPolicyDistillation
from llmgym.agents.distill import TeacherMismatchError, TeacherScoreError
from llmgym.agents.teacher_checks import check_teacher_scores, logprob_floor
from llmgym.engines import HFEngine
from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer, load_model, save_pretrained

SHAPE = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
SMALL = dict(tasks_per_step=2, group_size=4, max_new_tokens=5, seed=3)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _pair(tok):
    return build_tiny_model(tok, SHAPE), build_tiny_model(tok, TinyModelConfig(**{**SHAPE.__dict__, "seed": 7}))


class Forged:
    """A teacher engine (no model to inspect, as a served one) whose scores are ``forge(rows, honest scores)``."""

    def __init__(self, engine, forge):
        self.engine, self.forge, self.tokenizer = engine, forge, engine.tokenizer

    def score_tokens(self, rows):
        return self.forge(rows, self.engine.score_tokens(rows))


def _step(agent, tok):
    return agent.prepare(agent.collect(gym.make("llmgym/Copy-v0", tokenizer=tok)))


FORGERIES = {
    "certain of everything": (lambda rows, s: [[0.0] * len(r) for r in s], r"continue with \d+ different tokens whose "
                              r"probabilities sum to [\d.]+ \(at most 1 \+ 0\.05\)"),
    "vllm's zero probability": (lambda rows, s: [[-9999.0] * len(r) for r in s], r"log-prob -9999, below -30\d\.\d"),
    "above zero": (lambda rows, s: [[*r[:-1], 0.5] for r in s], r"log-prob 0\.5, not a finite number <= 0"),
    "not a number": (lambda rows, s: [[float("nan")] * len(r) for r in s], r"log-prob nan"),
    "a row short": (lambda rows, s: [r[:-1] for r in s], r"returned \d+ log-probs for row 0"),
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_scores_that_cannot_be_log_probs_stop_the_step_in_one_line(name):
    forge, pattern = FORGERIES[name]
    tok = build_tokenizer()
    student, teacher = _pair(tok)
    agent = OnPolicyDistillation(student, tok, teacher=Forged(HFEngine(teacher, tok), forge), **SMALL)
    with pytest.raises(TeacherScoreError, match=r"^the teacher's scores cannot be log-probs of one model \(the teacher "
                                                r"is hostile or broken; nothing was trained on them\): .*" + pattern) as err:
        _step(agent, tok)
    assert "\n" not in str(err.value)


def test_an_honest_teacher_passes_and_its_scores_are_unchanged():
    tok = build_tokenizer()
    student, teacher = _pair(tok)
    agent = OnPolicyDistillation(student, tok, teacher=teacher, **SMALL)
    rows = agent.learn(gym.make("llmgym/Copy-v0", tokenizer=tok), steps=2)
    assert len(rows) == 2 and all(r["reverse_kl"] == r["reverse_kl"] for r in rows)


def test_the_prefix_rule_reads_only_rows_that_share_the_prefix():
    """Distinct tokens after *different* prefixes may each be certain; the same token twice is one token; the sum
    is over distinct next tokens only, at each shared prefix, wherever it is in the row."""
    check_teacher_scores([[1, 5, 6], [2, 5, 7]], [[0.0, 0.0], [0.0, 0.0]], vocab_size=512)
    check_teacher_scores([[1, 5, 6], [1, 5, 6]], [[0.0, 0.0], [0.0, 0.0]], vocab_size=512)
    with pytest.raises(TeacherScoreError, match="after the same 2 tokens rows 0 and 1"):
        check_teacher_scores([[1, 5, 6], [1, 5, 7]], [[0.0, -0.1], [0.0, -0.2]], vocab_size=512)
    with pytest.raises(TeacherScoreError, match="after the same 1 tokens rows 0 and 2"):
        check_teacher_scores([[1, 5], [1, 5], [1, 6]], [[-0.3], [-0.3], [-0.3]], vocab_size=512)
    assert -307 < logprob_floor(512) < -306


def test_the_student_as_its_own_teacher_is_refused():
    """The same weights (a copy, the same directory loaded twice, an engine over the student, the agent's own
    engine) are refused at construction; a teacher that shows no weights but scores as the student does (a
    served copy) is refused on the first batch: every reward would be 0."""
    tok = build_tokenizer()
    student = build_tiny_model(tok, SHAPE)
    with pytest.raises(TeacherMismatchError, match=r"^the teacher has the student's weights"):
        OnPolicyDistillation(student, tok, teacher=copy.deepcopy(student), **SMALL)
    with pytest.raises(TeacherMismatchError, match=r"^the teacher engine runs the student's model"):
        OnPolicyDistillation(student, tok, teacher=HFEngine(student, tok), **SMALL)
    with pytest.raises(TeacherMismatchError, match=r"^the teacher engine runs the student's model"):
        OnPolicyDistillation(student, tok, teacher=HFEngine(copy.deepcopy(student), tok), **SMALL)
    engine = HFEngine(student, tok)
    with pytest.raises(TeacherMismatchError, match=r"^the teacher is the student's own engine"):
        OnPolicyDistillation(student, tok, engine=engine, teacher=engine, **SMALL)
    agent = OnPolicyDistillation(student, tok, teacher=Forged(HFEngine(copy.deepcopy(student), tok),
                                                              lambda rows, s: s), **SMALL)
    with pytest.raises(TeacherScoreError, match=r"^the teacher is the student: it scores all \d+ sampled tokens as the "
                                                r"student does .* nothing would train"):
        _step(agent, tok)


def test_a_teacher_path_holding_the_students_weights_is_refused(tmp_path):
    tok = build_tokenizer()
    directory = save_pretrained(build_tiny_model(tok, SHAPE), tok, tmp_path / "m")
    student, tok = load_model(directory)
    with pytest.raises(TeacherMismatchError, match=r"^the teacher has the student's weights"):
        OnPolicyDistillation(student, tok, teacher=str(directory), **SMALL)
