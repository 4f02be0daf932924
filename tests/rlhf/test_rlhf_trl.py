"""Preference losses against TRL's own trainers, on the same models and the same token ids.

TRL (1.16) keeps its losses inside its trainers' ``compute_loss``: the tests build a real
``DPOTrainer`` / ``RewardTrainer`` around the same tiny models and call that method on inputs made
by TRL's own collators from llmgym's token ids. Both sides run their own forward passes (TRL right-
pads and lets the model pool; llmgym left-pads with position ids), so a match checks the
tokenisation layout, the log-ratios, the per-token averaging of IPO and the reward model's pooling,
not only the formula. Measured (float32, one thread): the losses agree to ≤ 2e-6 (relative ≤ 1.2e-6),
the gradients to ≤ 1.3e-5 where their largest entry is ≈ 1; the tolerances leave room for other
CPUs' kernels.

TRL 1.16's ``"sigmoid"`` loss no longer reads ``label_smoothing`` (conservative DPO is gone from
it); its ``"robust"`` loss (rDPO) is linear in the same two terms, so cDPO is checked as TRL's
weighted sum ``2(1−ε)·sigmoid − (1−2ε)·robust`` = ``−(1−ε)·log σ(βh) − ε·log σ(−βh)``.
"""

from __future__ import annotations

import copy

import pytest
import torch

trl = pytest.importorskip("trl")
# TRL's trainer arguments still touch transformers' deprecated gradient-checkpointing names
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated and will be removed in v6:FutureWarning")

from llmgym.agents import DPO  # noqa: E402
from llmgym.agents.dpo import pair_batch  # noqa: E402
from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer  # noqa: E402
from llmgym.rlhf.preferences import PreferencePair, encode_pair  # noqa: E402
from llmgym.rlhf.reward_models import bradley_terry_loss, reward_model_from_causal_lm, reward_scores  # noqa: E402

# unequal lengths on both sides, so IPO's per-token averaging matters
PAIRS = [PreferencePair("copy:12=", "12", "abcdef"), PreferencePair("copy:3456=", "3456", "x"),
         PreferencePair("say:", "hello there", "no"), PreferencePair("q", "7", "zz9")]
TOLERANCE = 1e-5  # relative; measured ≤ 1.2e-6, the rest is room for other machines' kernels


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    import datasets

    datasets.disable_progress_bars()


def _tiny(seed):
    tok = build_tokenizer()
    return build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                                                 seed=seed)), tok


def _trl_preference_inputs(tok):
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    rows = []
    for pair in PAIRS:
        prompt_ids, chosen_ids = encode_pair(tok, pair.prompt, pair.chosen)
        _, rejected_ids = encode_pair(tok, pair.prompt, pair.rejected)
        rows.append({"prompt_ids": prompt_ids, "chosen_ids": chosen_ids, "rejected_ids": rejected_ids})
    return DataCollatorForPreference(pad_token_id=tok.pad_token_id)(rows)


def _dpo_trainer(policy, ref, tok, tmp_path, beta):
    from datasets import Dataset

    args = trl.DPOConfig(output_dir=str(tmp_path), beta=beta, use_cpu=True, bf16=False, report_to=[],
                         per_device_train_batch_size=len(PAIRS))
    data = Dataset.from_list([p.to_dict() for p in PAIRS])
    return trl.DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=data, processing_class=tok)


# (llmgym loss_type, label_smoothing) -> (TRL loss types, their weights, TRL label_smoothing)
CASES = {
    "dpo": (("sigmoid", 0.0), (["sigmoid"], [1.0], 0.0)),
    "ipo": (("ipo", 0.0), (["ipo"], [1.0], 0.0)),
    "hinge": (("hinge", 0.0), (["hinge"], [1.0], 0.0)),
    "cdpo": (("sigmoid", 0.2), (["sigmoid", "robust"], [2 * (1 - 0.2), -(1 - 2 * 0.2)], 0.2)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("beta", [0.1, 2.0])
def test_dpo_family_losses_and_gradients_match_trl(case, beta, tmp_path):
    (loss_type, smoothing), (trl_types, trl_weights, trl_smoothing) = CASES[case]
    policy, tok = _tiny(seed=0)
    ref, _ = _tiny(seed=1)  # π ≠ π_ref: the log-ratios are far from 0
    trainer = _dpo_trainer(copy.deepcopy(policy), ref, tok, tmp_path, beta)
    trainer.loss_types, trainer.loss_weights, trainer.label_smoothing = trl_types, trl_weights, trl_smoothing
    trainer.model.train()
    trl_loss = trainer.compute_loss(trainer.model, _trl_preference_inputs(tok))
    trl_loss.backward()
    trl_grads = {n: p.grad for n, p in trainer.model.named_parameters()}

    agent = DPO(policy, tok, preferences=PAIRS, kl_coef=beta, loss_type=loss_type, label_smoothing=smoothing)
    batch = pair_batch(PAIRS, tok)
    batch.ref_logprobs = agent.learner.forward(batch, model=ref).logprobs.detach()
    agent.compute_advantages(batch)
    ours, stats = agent.loss(batch, agent.forward(batch))
    ours.backward()

    trl_loss, ours = float(trl_loss.detach()), float(ours.detach())
    assert abs(trl_loss - ours) <= TOLERANCE * max(1.0, abs(ours)), (trl_loss, ours)
    grads = dict(policy.named_parameters())
    for name, grad in trl_grads.items():  # measured ≤ 1.3e-5 where the largest entry is ≈ 1
        gap = float((grads[name].grad - grad).abs().max())
        assert gap <= 1e-4 * max(1.0, float(grad.abs().max())), (name, gap)
    assert stats["reward_margin"] != 0.0  # the comparison is away from the tie π = π_ref


@pytest.mark.parametrize("pad", ["own", "eos"])
@pytest.mark.parametrize("margin,center", [(False, None), (True, 0.01)])
def test_bradley_terry_loss_and_reward_pooling_match_trls_reward_trainer(pad, margin, center, tmp_path):
    """TRL right-pads and the model pools the last non-pad token; llmgym left-pads: same rewards, same loss."""
    from datasets import Dataset
    from trl.trainer.reward_trainer import DataCollatorForPreference

    lm, tok = _tiny(seed=0)
    if pad == "eos":  # a tokenizer without a pad token, as the loader leaves it
        tok.pad_token = tok.eos_token
    rm = reward_model_from_causal_lm(lm, tok)
    torch.manual_seed(0)
    torch.nn.init.normal_(rm.score.weight, std=1.0)  # a head that tells completions apart
    margins = [0.5, -1.0, 2.0, 0.0]
    pairs = [PreferencePair(p.prompt, p.chosen, p.rejected, m if margin else None) for p, m in zip(PAIRS, margins)]
    args = trl.RewardConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[],
                            center_rewards_coefficient=center)
    trainer = trl.RewardTrainer(model=copy.deepcopy(rm), args=args, processing_class=tok,
                                train_dataset=Dataset.from_list([p.to_dict() for p in pairs]))
    rows = []
    for p in pairs:
        prompt_ids, chosen_ids = encode_pair(tok, p.prompt, p.chosen)
        _, rejected_ids = encode_pair(tok, p.prompt, p.rejected)
        row = {"chosen_ids": prompt_ids + chosen_ids, "rejected_ids": prompt_ids + rejected_ids}
        rows.append({**row, "margin": p.margin} if margin else row)
    inputs = DataCollatorForPreference(pad_token_id=tok.pad_token_id)(rows)
    assert (inputs["input_ids"][:, -1] == tok.pad_token_id).any()  # right padding is exercised
    trainer.model.train()
    trl_loss = float(trainer.compute_loss(trainer.model, dict(inputs)).detach())

    prompts = [p.prompt for p in pairs]
    rewards = reward_scores(rm.train(), tok, prompts + prompts, [p.chosen for p in pairs] + [p.rejected for p in pairs])
    chosen, rejected = rewards[:len(pairs)], rewards[len(pairs):]
    margin_t = torch.tensor([p.margin for p in pairs]) if margin else None
    ours = float(bradley_terry_loss(chosen, rejected, margin_t, center or 0.0).detach())
    assert float(chosen.detach().std()) > 0.1  # the head tells rows apart: the pooled position matters
    assert abs(trl_loss - ours) <= TOLERANCE * max(1.0, abs(ours)), (trl_loss, ours)
