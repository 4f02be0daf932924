"""On-policy distillation: the loss against its closed form, the teacher's scores against a direct forward,
a teacher that never trains, env turns that are not graded, LoRA, and a teacher with another vocabulary."""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest
import torch

import llmgym  # noqa: F401
from llmgym.agents import OnPolicyDistillation
from llmgym.agents import functional as F
from llmgym.agents.distill import TeacherMismatchError, check_same_vocabulary, teacher_logprobs
from llmgym.engines import HFEngine, sequence_logprobs
from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer

SHAPE = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
SMALL = dict(tasks_per_step=2, group_size=2, max_new_tokens=5, seed=3)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _pair(tok):
    """A student and a different teacher (another seed) of the same shape and tokenizer."""
    return (build_tiny_model(tok, SHAPE), build_tiny_model(tok, TinyModelConfig(**{**SHAPE.__dict__, "seed": 7})))


# -- the formula -----------------------------------------------------------------------------------


def test_the_expected_loss_gradient_is_the_gradient_of_the_reverse_kl_closed_form():
    """Over one position of a 6-token vocabulary, the loss's exact expectation under the student (each token
    weighted by its probability, as sampling weighs it) has the gradient of KL(π_S ‖ π_T) = Σ π_S (log π_S − log π_T),
    and the reward's expectation is −KL."""
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(6, generator=gen, dtype=torch.float64).requires_grad_()
    teacher = torch.log_softmax(torch.randn(6, generator=gen, dtype=torch.float64), -1)
    logp = torch.log_softmax(theta, -1)
    tokens = logp[None, :]  # every token of the vocabulary as one sampled position
    mask = torch.ones_like(tokens)
    loss, _ = F.distillation_loss(tokens, tokens.detach(), teacher[None, :], mask)
    expected_loss = (logp.exp().detach() * loss[0]).sum()
    (grad,) = torch.autograd.grad(expected_loss, theta)

    theta_kl = theta.detach().clone().requires_grad_()
    p = torch.softmax(theta_kl, -1)
    kl = (p * (torch.log_softmax(theta_kl, -1) - teacher)).sum()  # closed form
    (grad_kl,) = torch.autograd.grad(kl, theta_kl)
    assert torch.allclose(grad, grad_kl, atol=1e-12), (grad, grad_kl)
    reward = F.reverse_kl_rewards(tokens.detach(), teacher[None, :], mask)
    assert float((logp.detach().exp() * reward[0]).sum()) == pytest.approx(-float(kl.detach()), abs=1e-12)
    # with α: the distillation gradient scales by α, the env's advantage enters with 1 − α
    loss_half, _ = F.distillation_loss(tokens, tokens.detach(), teacher[None, :], mask, distill_coef=0.5,
                                       env_advantages=torch.tensor([2.0], dtype=torch.float64))
    assert torch.allclose(loss_half.detach(), 0.5 * loss.detach() - 0.5 * 2.0)


def test_distill_coef_out_of_range_is_refused():
    with pytest.raises(ValueError, match="distill_coef must be in"):
        F.distillation_advantages(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), distill_coef=1.5)
    tok = build_tokenizer()
    with pytest.raises(ValueError, match="distill_coef"):
        OnPolicyDistillation(build_tiny_model(tok, SHAPE), tok, teacher="tiny", distill_coef=-0.1)


# -- the teacher --------------------------------------------------------------------------------------


def test_teacher_scores_of_a_multi_turn_batch_equal_a_direct_teacher_forward_and_env_turns_are_not_graded():
    tok = build_tokenizer()
    student, teacher = _pair(tok)
    agent = OnPolicyDistillation(student, tok, teacher=teacher, **SMALL)
    batch = agent.collect(gym.make("llmgym/CopyRetry-v0", tokenizer=tok))
    after_first_turn = batch.action_mask.cumsum(-1) > 0
    env_tokens = (batch.action_mask == 0) & (batch.attention_mask[:, 1:] == 1) & after_first_turn
    assert bool(env_tokens.any()), "the episodes should have env replies between turns"
    scores = teacher_logprobs(agent.teacher, batch)
    with torch.no_grad():
        direct = sequence_logprobs(teacher, batch.input_ids, batch.attention_mask)
    real = batch.attention_mask[:, 1:].bool()
    assert float((scores - direct).abs()[real].max()) < 1e-5
    agent.prepare(batch)
    assert bool((batch.advantages[batch.action_mask == 0] == 0).all())  # env turns and prompts are context only
    graded = batch.action_mask.bool()
    assert torch.allclose(batch.advantages[graded], (direct - batch.old_logprobs)[graded], atol=1e-4)


def test_the_teacher_never_trains_and_is_not_in_the_optimiser_or_the_checkpoint():
    tok = build_tokenizer()
    student, teacher = _pair(tok)
    before = copy.deepcopy(teacher.state_dict())
    student_before = copy.deepcopy(student.state_dict())
    agent = OnPolicyDistillation(student, tok, teacher=teacher, **SMALL)
    rows = agent.learn(gym.make("llmgym/Copy-v0", tokenizer=tok), steps=2)
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    assert not all(torch.equal(student_before[k], v) for k, v in student.state_dict().items())
    optimised = {id(p) for g in agent.optimizer.param_groups for p in g["params"]}
    assert not optimised & {id(p) for p in teacher.parameters()}
    assert not any(p.requires_grad for p in teacher.parameters())
    assert set(agent.state_dict()["model"]) == set(student.state_dict())
    assert all(r["reverse_kl"] == r["reverse_kl"] and r["teacher_logprob"] < 0 for r in rows)


def test_the_agents_loss_is_the_distillation_loss_on_policy():
    tok = build_tokenizer()
    student, teacher = _pair(tok)
    agent = OnPolicyDistillation(student, tok, teacher=teacher, distill_coef=0.7, **SMALL)
    batch = agent.prepare(agent.collect(gym.make("llmgym/Copy-v0", tokenizer=tok)))
    out = agent.forward(batch)
    loss, stats = agent.loss(batch, out)
    env = F.group_advantages(batch.rewards.view(-1, 2), normalize_std=False).view(-1)
    by_hand, _ = F.distillation_loss(out.logprobs, batch.old_logprobs, batch.teacher_logprobs, batch.action_mask,
                                     env_advantages=env, distill_coef=0.7)
    assert float(loss) == pytest.approx(float(F.aggregate_loss(by_hand, batch.action_mask, "token-mean")), abs=1e-6)
    kl = F.masked_mean(batch.old_logprobs - batch.teacher_logprobs, batch.action_mask)
    assert stats["reverse_kl"] == pytest.approx(float(kl), abs=1e-6)


def test_token_level_and_lora_student():
    tok = build_tokenizer()
    student, teacher = _pair(tok)
    agent = OnPolicyDistillation(student, tok, teacher=HFEngine(teacher, tok), lora_r=4, **SMALL)
    env = gym.make("llmgym/Copy-v0", tokenizer=tok, level="token", max_new_tokens=5)
    base = {k: v.clone() for k, v in student.state_dict().items() if "lora" not in k}
    adapters = {k: v.clone() for k, v in student.state_dict().items() if "lora_B" in k}
    rows = agent.learn(env, steps=2)
    assert agent.level == "token" and len(rows) == 2
    state = student.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in base.items())  # only the adapters train
    assert any(not torch.equal(v, state[k]) for k, v in adapters.items())


# -- refusals -------------------------------------------------------------------------------------------


def test_a_teacher_with_another_vocabulary_is_refused_in_one_line():
    tok = build_tokenizer()
    other = build_tokenizer()
    other.add_tokens(["<extra>"])
    with pytest.raises(TeacherMismatchError, match=r"^the teacher's tokenizer differs from the student's \(260 vs 259 "
                                                   r"tokens; id 259 is '<extra>' for the teacher and None"):
        check_same_vocabulary(tok, other)
    swapped = build_tokenizer()
    from tokenizers import Tokenizer, models

    core = swapped.backend_tokenizer
    pieces = sorted(core.get_vocab().items(), key=lambda kv: kv[1])
    mapping = {k: v for k, v in pieces}
    a, b = pieces[10][0], pieces[11][0]
    mapping[a], mapping[b] = mapping[b], mapping[a]  # two ids trade places: same size, other meaning
    core.model = models.BPE(vocab=mapping, merges=[], unk_token=None)
    assert isinstance(core, Tokenizer)
    with pytest.raises(TeacherMismatchError, match=r"id 10 is .* for the teacher and .* for the student"):
        check_same_vocabulary(tok, swapped)
    student, teacher = _pair(tok)
    with pytest.raises(TeacherMismatchError, match="differs from the student's"):
        OnPolicyDistillation(student, tok, teacher=teacher, teacher_tokenizer=other, **SMALL)
    message = None
    try:
        OnPolicyDistillation(student, tok, teacher=teacher, teacher_tokenizer=other, **SMALL)
    except TeacherMismatchError as exc:
        message = str(exc)
    assert message is not None and "\n" not in message


def test_no_teacher_an_engine_that_cannot_score_and_a_shared_model_are_refused():
    tok = build_tokenizer()
    student, teacher = _pair(tok)
    with pytest.raises(TeacherMismatchError, match="needs a teacher"):
        OnPolicyDistillation(student, tok, **SMALL)

    class NoScores:
        tokenizer, pad_id = tok, 0

    with pytest.raises(TeacherMismatchError, match="cannot score tokens"):
        OnPolicyDistillation(student, tok, teacher=NoScores(), **SMALL)
    with pytest.raises(TeacherMismatchError, match="shares weights"):
        OnPolicyDistillation(student, tok, teacher=student, **SMALL)
