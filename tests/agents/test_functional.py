"""Tests of llmgym.agents.functional: hand-worked values from each formula, plus invariants.

Expected numbers are worked by hand in the comments next to them; they are not produced by the code
under test.
"""

import math

import pytest
import torch

import llmgym.agents.functional as F
from llmgym.agents.functional import (
    aggregate_loss,
    baseline_advantages,
    batch_whitened_advantages,
    clip_fraction,
    clipped_surrogate_loss,
    clipped_value_loss,
    discounted_returns,
    entropy_from_logits,
    explained_variance,
    gae_advantages,
    group_advantages,
    kl_estimate,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_penalised_rewards,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    overlong_penalty,
    policy_gradient_loss,
    remax_advantages,
    rloo_advantages,
    sequence_ratio_surrogate_loss,
    token_level_rewards,
)

T_ = torch.tensor


def close(a, b, atol=1e-4):
    a = torch.as_tensor(a, dtype=torch.float32)
    return torch.allclose(a, torch.as_tensor(b, dtype=torch.float32), atol=atol)


# --------------------------------------------------------------------------------------------
# module surface
# --------------------------------------------------------------------------------------------


def test_all_public_functions_exist_and_are_documented_with_examples():
    assert len(F.__all__) == len(set(F.__all__))
    for name in F.__all__:
        obj = getattr(F, name)
        if callable(obj):
            assert obj.__doc__ and "Example:" in obj.__doc__ and ">>>" in obj.__doc__, name


# --------------------------------------------------------------------------------------------
# masked statistics
# --------------------------------------------------------------------------------------------


def test_masked_sum_and_mean_by_hand():
    x = T_([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = T_([[1, 1, 0], [0, 1, 1]])
    # sum of valid = 1 + 2 + 5 + 6 = 14; count 4 -> mean 3.5
    assert close(masked_sum(x, m), 14.0)
    assert close(masked_mean(x, m), 3.5)
    # per row: [1+2, 5+6] = [3, 11]; means [1.5, 5.5]
    assert close(masked_sum(x, m, dim=1), [3.0, 11.0])
    assert close(masked_mean(x, m, dim=1), [1.5, 5.5])
    # bool mask behaves like a 0/1 float mask
    assert close(masked_mean(x, m.bool(), dim=1), [1.5, 5.5])
    assert close(masked_mean(x, m.float(), dim=1), [1.5, 5.5])


def test_masked_mean_all_masked_row_and_nonfinite_padding_give_no_nan():
    x = T_([[1.0, float("nan")], [float("inf"), float("-inf")]])
    m = T_([[1, 0], [0, 0]])
    out = masked_mean(x, m, dim=1)
    assert torch.isfinite(out).all()
    assert close(out, [1.0, 0.0])  # row 1 -> only 1.0 counts; row 2 empty -> 0
    assert close(masked_mean(x, torch.zeros(2, 2)), 0.0)


def test_masked_var_unbiased_and_biased_by_hand():
    x = T_([2.0, 4.0, 6.0, 1000.0])
    m = T_([1, 1, 1, 0])
    # mean 4, squared deviations 4 + 0 + 4 = 8; unbiased 8/2 = 4; biased 8/3
    assert close(masked_var(x, m), 4.0)
    assert close(masked_var(x, m, unbiased=False), 8.0 / 3.0)
    # one valid entry: unbiased variance is undefined -> 0, not NaN / inf
    assert close(masked_var(x, T_([1, 0, 0, 0])), 0.0)
    assert close(masked_var(x, T_([0, 0, 0, 0])), 0.0)


def test_masked_whiten_by_hand():
    x = T_([[2.0, 4.0], [6.0, -50.0]])
    m = T_([[1, 1], [1, 0]])
    # μ = 4, unbiased var = 4, std = 2 -> [-1, 0, 1], masked -> 0
    assert close(masked_whiten(x, m), [[-1.0, 0.0], [1.0, 0.0]])
    # shift_mean=False: (x - μ)/σ + μ = [3, 4, 5]
    assert close(masked_whiten(x, m, shift_mean=False), [[3.0, 4.0], [5.0, 0.0]])
    # constant input -> 0, no NaN
    out = masked_whiten(torch.full((2, 3), 7.0), torch.ones(2, 3))
    assert torch.equal(out, torch.zeros(2, 3))


# --------------------------------------------------------------------------------------------
# discounted returns and GAE
# --------------------------------------------------------------------------------------------


def test_discounted_returns_by_hand_skips_masked_positions():
    r = T_([[1.0, 0.0, 2.0, 0.0], [0.0, 5.0, 0.0, 4.0]])
    m = T_([[1, 1, 1, 0], [1, 0, 0, 1]])  # row 2: positions 1, 2 are env tokens
    # row 1, γ=0.5: G2 = 2, G1 = 0 + 0.5*2 = 1, G0 = 1 + 0.5*1 = 1.5, pad -> 0
    # row 2: G3 = 4; env tokens skipped (reward 5 ignored, no discount step): G0 = 0 + 0.5*4 = 2
    expected = [[1.5, 1.0, 2.0, 0.0], [2.0, 0.0, 0.0, 4.0]]
    assert close(discounted_returns(r, m, gamma=0.5), expected)
    # γ = 1: plain reward-to-go
    assert close(discounted_returns(r, m, gamma=1.0), [[3.0, 2.0, 2.0, 0.0], [4.0, 0.0, 0.0, 4.0]])


def test_discounted_returns_all_masked_row_is_zero():
    out = discounted_returns(T_([[1.0, 2.0]]), T_([[0, 0]]), gamma=0.9)
    assert torch.equal(out, torch.zeros(1, 2))


def test_gae_by_hand_single_turn():
    r = T_([[0.0, 0.0, 1.0]])
    v = T_([[0.5, 0.4, 0.8]])
    m = torch.ones(1, 3)
    # γ = 0.9, λ = 0.5:
    # δ2 = 1 + 0 - 0.8 = 0.2                       A2 = 0.2
    # δ1 = 0 + 0.9*0.8 - 0.4 = 0.32                A1 = 0.32 + 0.45*0.2  = 0.41
    # δ0 = 0 + 0.9*0.4 - 0.5 = -0.14               A0 = -0.14 + 0.45*0.41 = 0.0445
    adv, ret = gae_advantages(r, v, m, gamma=0.9, lam=0.5)
    assert close(adv, [[0.0445, 0.41, 0.2]])
    assert close(ret, [[0.5445, 0.81, 1.0]])  # A + V


def test_gae_by_hand_multi_turn_skips_env_tokens():
    r = T_([[0.0, 9.0, 1.0, 0.0]])
    v = T_([[0.2, 9.0, 0.6, 9.0]])
    m = T_([[1, 0, 1, 0]])  # position 1 is an env token, position 3 padding
    # γ = 0.5, λ = 1, next valid of 0 is 2:
    # δ2 = 1 + 0 - 0.6 = 0.4; A2 = 0.4
    # δ0 = 0 + 0.5*0.6 - 0.2 = 0.1; A0 = 0.1 + 0.5*1*0.4 = 0.3
    adv, ret = gae_advantages(r, v, m, gamma=0.5, lam=1.0)
    assert close(adv, [[0.3, 0.0, 0.4, 0.0]])
    assert close(ret, [[0.5, 0.0, 1.0, 0.0]])


def test_gae_bootstraps_from_last_values():
    # r = 0, V = 0, V_after = 1, γ = 0.5, λ = 1: A1 = 0.5*1 = 0.5, A0 = 0 + 0.5*0.5 = 0.25
    adv, ret = gae_advantages(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), 0.5, 1.0,
                              last_values=T_([1.0]))
    assert close(adv, [[0.25, 0.5]])
    assert close(ret, [[0.25, 0.5]])


def _random_batch(seed=0, B=4, T=7):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, generator=g)
    v = torch.randn(B, T, generator=g)
    m = (torch.rand(B, T, generator=g) > 0.35).float()
    m[0] = 1.0  # a full row
    m[1] = 0.0  # an all-masked row
    return r, v, m


def test_gae_invariant_to_values_and_rewards_at_masked_positions():
    r, v, m = _random_batch()
    adv, ret = gae_advantages(r, v, m, gamma=0.95, lam=0.9)
    junk_r = torch.where(m.bool(), r, torch.full_like(r, 1e6))
    junk_v = torch.where(m.bool(), v, torch.full_like(v, float("nan")))
    adv2, ret2 = gae_advantages(junk_r, junk_v, m, gamma=0.95, lam=0.9)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    assert torch.isfinite(adv2).all() and torch.isfinite(ret2).all()
    # masked positions are 0, the all-masked row is all 0
    assert torch.equal(adv[m == 0], torch.zeros_like(adv[m == 0]))
    assert torch.equal(ret[m == 0], torch.zeros_like(ret[m == 0]))
    # and the test can fail: changing a *valid* value does change the output
    v3 = v.clone()
    v3[0, 3] += 1.0
    assert not torch.allclose(gae_advantages(r, v3, m, 0.95, 0.9)[0], adv)


def test_gae_lambda1_gamma1_zero_values_equals_discounted_returns():
    r, _, m = _random_batch(seed=1)
    adv, ret = gae_advantages(r, torch.zeros_like(r), m, gamma=1.0, lam=1.0)
    G = discounted_returns(r, m, gamma=1.0)
    assert torch.allclose(adv, G, atol=1e-6) and torch.allclose(ret, G, atol=1e-6)


def test_gae_lambda1_is_monte_carlo_return_minus_value_and_lambda0_is_td_error():
    r, v, m = _random_batch(seed=2)
    gamma = 0.9
    adv1, ret1 = gae_advantages(r, v, m, gamma=gamma, lam=1.0)
    G = discounted_returns(r, m, gamma=gamma)
    assert torch.allclose(adv1, (G - v) * m, atol=1e-5)
    assert torch.allclose(ret1, G, atol=1e-5)
    # λ = 0 on a full row: A_t = r_t + γ V_{t+1} - V_t
    full = torch.ones(1, 4)
    r0, v0 = r[:1, :4], v[:1, :4]
    adv0, _ = gae_advantages(r0, v0, full, gamma=gamma, lam=0.0)
    next_v = torch.cat([v0[:, 1:], torch.zeros(1, 1)], dim=1)
    assert torch.allclose(adv0, r0 + gamma * next_v - v0, atol=1e-6)


def test_gae_outputs_are_detached():
    v = torch.zeros(1, 2, requires_grad=True)
    adv, ret = gae_advantages(torch.ones(1, 2), v, torch.ones(1, 2))
    assert not adv.requires_grad and not ret.requires_grad


# --------------------------------------------------------------------------------------------
# outcome advantages
# --------------------------------------------------------------------------------------------


def test_baseline_advantages_by_hand():
    assert close(baseline_advantages(T_([1.0, 0.0, 3.0]), T_(1.0)), [0.0, -1.0, 2.0])
    # [B, T] rewards with a per-sequence baseline [B] broadcasts over T (not over B)
    r = T_([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert close(baseline_advantages(r, T_([1.0, 4.0])), [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]])


def test_group_advantages_grpo_by_hand():
    r = T_([[1.0, 0.0, 1.0, 0.0], [3.0, 1.0, 2.0, 2.0]])
    # group [1,0,1,0]: mean 0.5, std (unbiased) sqrt(4*0.25/3) = 0.57735
    #   -> A = ±0.5/0.57735 = ±0.866
    # group [3,1,2,2]: mean 2, std (unbiased) sqrt((1+1+0+0)/3) = 0.8165
    #   -> A = [1/0.8165, -1/0.8165, 0, 0] = [1.2247, -1.2247, 0, 0]
    expected = [[0.8660, -0.8660, 0.8660, -0.8660], [1.2247, -1.2247, 0.0, 0.0]]
    assert close(group_advantages(r), expected, atol=1e-3)
    # unbiased, not population std: population std of [1,0,1,0] is 0.5 -> would give ±1
    assert not close(group_advantages(r)[0], [1.0, -1.0, 1.0, -1.0], atol=1e-2)


def test_group_advantages_dr_grpo_is_mean_centred_only():
    r = T_([[1.0, 0.0, 0.0, 0.0]])
    # mean 0.25 -> [0.75, -0.25, -0.25, -0.25]
    assert close(group_advantages(r, normalize_std=False), [[0.75, -0.25, -0.25, -0.25]])


@pytest.mark.parametrize("normalize_std", [True, False])
def test_group_advantages_all_equal_group_is_exactly_zero(normalize_std):
    # 0.1 is not representable: the float mean of three 0.1s can differ from 0.1 in the last bit
    r = T_([[0.1, 0.1, 0.1], [0.7, 0.7, 0.7], [1.0, 0.0, 0.0]])
    out = group_advantages(r, normalize_std=normalize_std)
    assert torch.isfinite(out).all()
    assert torch.equal(out[:2], torch.zeros(2, 3))
    assert (out[2] != 0).all()


def test_group_advantages_group_size_one_and_bad_shape():
    out = group_advantages(T_([[1.0], [0.0]]))
    assert torch.equal(out, torch.zeros(2, 1))
    with pytest.raises(ValueError, match="num_groups, group_size"):
        group_advantages(T_([1.0, 0.0]))


def test_rloo_advantages_by_hand():
    r = T_([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 6.0]])
    # row 1: A0 = 1 - (0+0+1)/3 = 0.6667, A1 = 0 - (1+0+1)/3 = -0.6667
    # row 2: A0 = 3 - 9/3 = 0, A1 = 1 - 11/3 = -2.6667, A2 = 2 - 10/3 = -1.3333, A3 = 6 - 6/3 = 4
    expected = [[2 / 3, -2 / 3, -2 / 3, 2 / 3], [0.0, -8 / 3, -4 / 3, 4.0]]
    assert close(rloo_advantages(r), expected)
    # same as k/(k-1) (r - mean)
    assert torch.allclose(rloo_advantages(r), 4 / 3 * (r - r.mean(1, keepdim=True)), atol=1e-6)


def test_rloo_baseline_excludes_the_sample_itself():
    r = T_([[1.0, 0.0, 2.0, 5.0]])
    baseline = r - rloo_advantages(r)
    r2 = r.clone()
    r2[0, 2] = 100.0
    baseline2 = r2 - rloo_advantages(r2)
    # sample 2's baseline is unchanged; every other sample's baseline moves by (100-2)/3
    assert close(baseline2[0, 2], baseline[0, 2])
    others = [0, 1, 3]
    assert close(baseline2[0, others] - baseline[0, others], [98 / 3] * 3)


def test_rloo_all_equal_group_zero_and_size_one_raises():
    assert torch.equal(rloo_advantages(T_([[0.5, 0.5, 0.5]])), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="at least 2 completions"):
        rloo_advantages(T_([[1.0], [0.0]]))


def test_batch_whitened_advantages_is_global_not_per_row():
    a = T_([[1.0, 1.0], [3.0, 3.0]])
    m = torch.ones(2, 2)
    # μ = 2, unbiased var = 4*1/3 -> std 1.1547 -> (a - 2)/1.1547 = ±0.8660
    out = batch_whitened_advantages(a, m)
    assert close(out, [[-0.8660, -0.8660], [0.8660, 0.8660]], atol=1e-3)
    # per-row whitening would give 0 everywhere; the batch version does not
    assert not torch.allclose(out, torch.zeros(2, 2))
    # masked positions are 0 and ignored by the statistics
    a2 = T_([[1.0, 1.0, 1e6], [3.0, 3.0, -1e6]])
    out2 = batch_whitened_advantages(a2, T_([[1, 1, 0], [1, 1, 0]]))
    assert close(out2[:, :2], out, atol=1e-5) and torch.equal(out2[:, 2], torch.zeros(2))


def test_remax_advantages_by_hand():
    # [1-0.5, 0-0.5, 0.2-0.2]
    assert close(remax_advantages(T_([1.0, 0.0, 0.2]), T_([0.5, 0.5, 0.2])), [0.5, -0.5, 0.0])


# --------------------------------------------------------------------------------------------
# rewards
# --------------------------------------------------------------------------------------------


def test_token_level_rewards_by_hand():
    m = T_([[1, 1, 1, 0], [1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0]])
    out = token_level_rewards(T_([1.0, 2.0, 3.0, 4.0]), m)
    # last valid: row 1 -> 2, row 2 -> 3 (after an env token), row 3 -> none, row 4 -> 0
    expected = [[0, 0, 1, 0], [0, 0, 0, 2], [0, 0, 0, 0], [4, 0, 0, 0]]
    assert torch.equal(out, T_(expected, dtype=torch.float32))


def test_kl_penalised_rewards_by_hand():
    lp = T_([[-1.0, -2.0, -1.0, -3.0]])
    ref = T_([[-1.5, -1.0, -1.0, 0.0]])
    m = T_([[1, 1, 1, 0]])
    # k1 = lp - ref = [0.5, -1, 0, (masked)]; β = 0.1 -> -β k1 = [-0.05, 0.1, 0]
    # R = 2 added at position 2 (the last valid one)
    out = kl_penalised_rewards(T_([2.0]), lp, ref, m, kl_coef=0.1, estimator="k1")
    assert close(out, [[-0.05, 0.1, 2.0, 0.0]])
    # k2 = [0.125, 0.5, 0] -> [-0.0125, -0.05, 2]
    out2 = kl_penalised_rewards(T_([2.0]), lp, ref, m, kl_coef=0.1, estimator="k2")
    assert close(out2, [[-0.0125, -0.05, 2.0, 0.0]])


def test_overlong_penalty_three_regimes():
    # L_max = 20, L_cache = 4: soft zone (16, 20]
    lengths = T_([5, 16, 17, 18, 20, 21, 100])
    # ≤16 -> 0; 17 -> (16-17)/4 = -0.25; 18 -> -0.5; 20 -> -1; >20 -> -1
    expected = [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]
    assert close(overlong_penalty(lengths, max_length=20, cache_length=4), expected)
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(lengths, max_length=20, cache_length=0)
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(lengths, max_length=20, cache_length=21)


# --------------------------------------------------------------------------------------------
# log-probs, entropy, KL
# --------------------------------------------------------------------------------------------


def test_logprobs_from_logits_matches_log_softmax():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g)
    ids = torch.randint(0, 5, (2, 3), generator=g)
    ref = torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(logprobs_from_logits(logits, ids), ref, atol=1e-6)


def test_entropy_from_logits_by_hand_and_stable():
    # p = [0.25, 0.75]: H = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.3466 + 0.2158 = 0.5623
    logits = torch.log(T_([[[0.25, 0.75]]]))
    assert close(entropy_from_logits(logits), [[0.5623]])
    # uniform over 8: ln 8 = 2.0794; shift invariance; huge logits stay finite
    assert close(entropy_from_logits(torch.full((1, 1, 8), 1e4)), [[math.log(8)]])
    assert close(entropy_from_logits(T_([[[1e4, 0.0, -1e4]]])), [[0.0]])
    # banned tokens (-inf) contribute 0: uniform over the 2 remaining = ln 2
    out = entropy_from_logits(T_([[[0.0, 0.0, float("-inf")]]]))
    assert torch.isfinite(out).all() and close(out, [[math.log(2)]])


def test_kl_estimators_by_hand():
    lp = T_([[-1.0, -2.0]])
    ref = T_([[-1.5, -1.0]])
    # k1 = lp - ref = [0.5, -1]
    assert close(kl_k1(lp, ref), [[0.5, -1.0]])
    # k2 = ½ (lp - ref)² = [0.125, 0.5]
    assert close(kl_k2(lp, ref), [[0.125, 0.5]])
    # k3: ρ = ref - lp = [-0.5, 1]; e^-0.5 + 0.5 - 1 = 0.10653; e^1 - 1 - 1 = 0.71828
    assert close(kl_k3(lp, ref), [[0.10653, 0.71828]])
    assert torch.equal(kl_estimate(lp, ref, "k1"), kl_k1(lp, ref))
    assert torch.equal(kl_estimate(lp, ref, "k2"), kl_k2(lp, ref))
    assert torch.equal(kl_estimate(lp, ref), kl_k3(lp, ref))  # default k3


def test_kl_estimators_nonnegative_and_zero_when_equal():
    g = torch.Generator().manual_seed(0)
    lp, ref = -torch.rand(8, 16, generator=g) * 5, -torch.rand(8, 16, generator=g) * 5
    assert (kl_k2(lp, ref) >= 0).all() and (kl_k3(lp, ref) >= 0).all()
    assert (kl_k1(lp, ref) < 0).any()  # k1 can be negative per token
    for name in ("k1", "k2", "k3"):
        assert torch.equal(kl_estimate(lp, lp, name), torch.zeros_like(lp))


def test_kl_k1_k3_unbiased_monte_carlo():
    # samples from π, true KL(π‖π_ref) = Σ p log(p/q)
    p = T_([0.5, 0.3, 0.2])
    q = T_([0.2, 0.3, 0.5])
    true_kl = (p * (p / q).log()).sum()  # 0.5 ln 2.5 + 0 + 0.2 ln 0.4 = 0.27488
    g = torch.Generator().manual_seed(0)
    x = torch.multinomial(p, 200_000, replacement=True, generator=g)
    lp, ref = p.log()[x], q.log()[x]
    assert abs(kl_k1(lp, ref).mean() - true_kl) < 0.01
    assert abs(kl_k3(lp, ref).mean() - true_kl) < 0.01
    assert abs(kl_k2(lp, ref).mean() - true_kl) > 0.01  # k2 is biased here (≈ 0.3223)


def test_kl_estimate_unknown_name_raises():
    with pytest.raises(ValueError, match="k1.*k2.*k3"):
        kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "k4")


# --------------------------------------------------------------------------------------------
# policy losses
# --------------------------------------------------------------------------------------------


def test_policy_gradient_loss_value_and_gradient():
    lp = T_([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    adv = T_([2.0, -1.0])  # per sequence, broadcast over tokens
    loss = policy_gradient_loss(lp, adv)
    # -A·logπ = [[2, 4], [-0.5, -0.1]]
    assert close(loss, [[2.0, 4.0], [-0.5, -0.1]])
    loss.sum().backward()
    assert close(lp.grad, [[-2.0, -2.0], [1.0, 1.0]])  # d/dlogπ = -A


def test_clipped_surrogate_by_hand():
    ratio = T_([[1.5, 0.5, 1.1, 0.5, 1.5]])
    adv = T_([[1.0, 1.0, 1.0, -1.0, -1.0]])
    loss, clipped = clipped_surrogate_loss(ratio.log(), torch.zeros(1, 5), adv, 0.2, 0.2)
    # A>0, r=1.5: max(-1.5, -1.2) = -1.2 (clipped)   A>0, r=0.5: max(-0.5, -0.8) = -0.5
    # A>0, r=1.1: -1.1                                A<0, r=0.5: max(0.5, 0.8) = 0.8 (clipped)
    # A<0, r=1.5: max(1.5, 1.2) = 1.5
    assert close(loss, [[-1.2, -0.5, -1.1, 0.8, 1.5]])
    assert clipped.tolist() == [[True, False, False, True, False]]


def test_clipped_surrogate_clip_higher_is_asymmetric():
    lp = T_([[math.log(1.25), math.log(0.75)]], requires_grad=True)
    adv = T_([[1.0, -1.0]])
    # symmetric ε = 0.2: r=1.25, A>0 -> clipped at 1.2 (-1.2); r=0.75, A<0 -> clipped at 0.8 (0.8)
    sym, sym_clipped = clipped_surrogate_loss(lp, torch.zeros(1, 2), adv, 0.2, 0.2)
    assert close(sym, [[-1.2, 0.8]]) and sym_clipped.tolist() == [[True, True]]
    # clip-higher (ε_low 0.2, ε_high 0.28): the upper bound 1.28 no longer clips r=1.25 ...
    high, high_clipped = clipped_surrogate_loss(lp, torch.zeros(1, 2), adv, 0.2, 0.28)
    assert close(high, [[-1.25, 0.8]]) and high_clipped.tolist() == [[False, True]]
    # ... while the lower bound still does; the clipped token gets no gradient
    high.sum().backward()
    assert close(lp.grad, [[-1.25, 0.0]])  # d(-A r)/dlogπ = -A r for the unclipped token


def test_clipped_surrogate_dual_clip_caps_negative_advantage_loss():
    ratio = T_([[5.0, 5.0, 2.0]])
    adv = T_([[-1.0, 1.0, -1.0]])
    lp = ratio.log().requires_grad_()
    plain, _ = clipped_surrogate_loss(lp, torch.zeros(1, 3), adv, 0.2, 0.2)
    # A<0, r=5: max(5, 1.2) = 5 (unbounded in r); A>0, r=5: -1.2; A<0, r=2: 2
    assert close(plain, [[5.0, -1.2, 2.0]])
    loss, clipped = clipped_surrogate_loss(lp, torch.zeros(1, 3), adv, 0.2, 0.2, dual_clip=3.0)
    # dual clip c=3: A<0 -> min(5, 3) = 3; A>0 untouched; A<0 with r=2 < c untouched
    assert close(loss, [[3.0, -1.2, 2.0]])
    assert clipped.tolist() == [[True, True, False]]
    loss.sum().backward()
    assert close(lp.grad, [[0.0, 0.0, 2.0]])  # capped token has no gradient; -A r = 2
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_surrogate_loss(lp, torch.zeros(1, 3), adv, dual_clip=1.0)


def test_clipped_surrogate_at_ratio_one_matches_policy_gradient():
    g = torch.Generator().manual_seed(0)
    lp_data = -torch.rand(3, 5, generator=g) * 3
    adv = torch.randn(3, 5, generator=g)
    lp1 = lp_data.clone().requires_grad_()
    lp2 = lp_data.clone().requires_grad_()
    surrogate, clipped = clipped_surrogate_loss(lp1, lp_data.clone(), adv, 0.2, 0.28)
    pg = policy_gradient_loss(lp2, adv)
    # value: ratio 1 -> -A·1 = -A (the surrogate's value; -A·logπ differs by a constant in θ)
    assert torch.allclose(surrogate, -adv) and not clipped.any()
    surrogate.sum().backward()
    pg.sum().backward()
    assert torch.allclose(lp1.grad, lp2.grad)  # both -A
    # and the per-token surrogate equals the PG loss up to a term with zero gradient
    assert torch.allclose(surrogate - pg, -adv * (1 - lp_data))


def test_clipped_surrogate_accepts_sequence_advantages():
    lp = torch.zeros(2, 3)
    loss_seq, _ = clipped_surrogate_loss(lp, lp, T_([1.0, -2.0]))
    loss_tok, _ = clipped_surrogate_loss(lp, lp, T_([[1.0] * 3, [-2.0] * 3]))
    assert torch.equal(loss_seq, loss_tok)


def _gspo_reference_objective(lp, old, adv, m, eps_low, eps_high):
    """GSPO written at sequence level: -(1/G) Σ_i min(s_i A_i, clip(s_i) A_i)."""
    s = torch.exp(((lp - old) * m).sum(1) / m.sum(1))
    return -torch.minimum(s * adv, s.clamp(1 - eps_low, 1 + eps_high) * adv).mean()


def test_sequence_ratio_surrogate_value_and_gradient_equal_gspo():
    g = torch.Generator().manual_seed(0)
    B, T = 4, 6
    old = -torch.rand(B, T, generator=g) * 2
    lp_data = old + 0.1 * torch.randn(B, T, generator=g)
    lp_data[0] = old[0] + 0.5  # far off-policy sequence: gets clipped
    m = torch.ones(B, T)
    m[1, 4:] = 0  # shorter sequences
    m[2, 2:] = 0
    adv = T_([1.0, -0.5, 2.0, -1.0])
    eps_low, eps_high = 0.05, 0.1

    lp1 = lp_data.clone().requires_grad_()
    loss, clipped = sequence_ratio_surrogate_loss(lp1, old, adv, m, eps_low, eps_high)
    aggregate_loss(loss, m, "seq-mean-token-mean").backward()

    lp2 = lp_data.clone().requires_grad_()
    _gspo_reference_objective(lp2, old, adv, m, eps_low, eps_high).backward()

    assert torch.allclose(lp1.grad, lp2.grad, atol=1e-6)
    # every token of sequence i carries the value of s_i (row 0: s = e^0.5 -> clipped at 1.1)
    s = torch.exp(((lp_data - old) * m).sum(1) / m.sum(1))
    assert close(loss[0], [-1.1] * T)
    assert torch.allclose(loss[1:], -(adv[1:] * s[1:]).unsqueeze(1).expand(3, T), atol=1e-6)
    # clipping is per sequence: whole rows
    assert clipped[0].all() and not clipped[1:].any()
    assert torch.equal(lp1.grad[0], torch.zeros(T))  # clipped sequence: no gradient
    assert torch.equal(lp1.grad[m == 0], torch.zeros(int((m == 0).sum())))  # padding: no gradient


def test_sequence_ratio_surrogate_token_form_gradient_with_per_token_advantages():
    # GSPO-token: s_{i,t} = sg[s_i] π_t / sg[π_t]
    #   -> ∂loss_{i,t}/∂logπ_{i,t'} = -A_{i,t} s_i [t = t']
    # With seq-mean-token-mean over G = 2 rows: grad[i, t] = -A_{i,t} s_i / (n_i G)
    old = torch.zeros(2, 3)
    lp = T_([[0.02, 0.04, 0.0], [0.0, 0.0, 0.0]], requires_grad=True)
    m = T_([[1, 1, 0], [1, 1, 1]])
    adv = T_([[1.0, -2.0, 5.0], [0.5, 1.0, -1.0]])
    loss, _ = sequence_ratio_surrogate_loss(lp, old, adv, m, 0.2, 0.2)
    aggregate_loss(loss, m, "seq-mean-token-mean").backward()
    s0 = math.exp(0.03)  # mean log-ratio of row 0 = (0.02 + 0.04)/2
    expected = [[-1.0 * s0 / 4, 2.0 * s0 / 4, 0.0], [-0.5 / 6, -1.0 / 6, 1.0 / 6]]
    assert close(lp.grad, expected, atol=1e-6)


def test_sequence_ratio_surrogate_ignores_padding_logprobs():
    old = torch.zeros(1, 3)
    m = T_([[1, 1, 0]])
    lp_a = T_([[0.1, 0.1, -50.0]])
    lp_b = T_([[0.1, 0.1, float("nan")]])
    la, _ = sequence_ratio_surrogate_loss(lp_a, old, T_([1.0]), m, 0.2, 0.2)
    lb, _ = sequence_ratio_surrogate_loss(lp_b, old, T_([1.0]), m, 0.2, 0.2)
    # s = exp(0.1) = 1.10517 at valid tokens regardless of the padding value
    assert close(la[:, :2], [[-1.10517, -1.10517]]) and torch.equal(la[:, :2], lb[:, :2])


def test_clipped_value_loss_by_hand():
    v = T_([[1.0, 0.5, 0.1]])
    v_old = T_([[0.0, 0.0, 0.0]])
    R = T_([[2.0, -1.0, 0.3]])
    # pos 0: (1-2)² = 1, clipped V = 0.2 -> (0.2-2)² = 3.24 -> 0.5*3.24 = 1.62
    # pos 1: (0.5+1)² = 2.25, clipped V = 0.2 -> (0.2+1)² = 1.44 -> 0.5*2.25 = 1.125
    # pos 2: inside the clip range: (0.1-0.3)² = 0.04 -> 0.02
    assert close(clipped_value_loss(v, v_old, R, clip=0.2), [[1.62, 1.125, 0.02]])
    # unclipped: 0.5 (V - R)²
    assert close(clipped_value_loss(v, v_old, R, clip=None), [[0.5, 1.125, 0.02]])


# --------------------------------------------------------------------------------------------
# aggregation
# --------------------------------------------------------------------------------------------


MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def test_aggregate_loss_by_hand():
    loss = T_([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
    m = T_([[1, 1, 1, 0], [1, 0, 0, 0]])
    # valid tokens: row 1 sum 6 (3 tokens), row 2 sum 4 (1 token); total 10 over 4 tokens
    assert close(aggregate_loss(loss, m, "token-mean"), 10 / 4)
    assert close(aggregate_loss(loss, m, "seq-mean-token-mean"), (6 / 3 + 4 / 1) / 2)  # 3
    assert close(aggregate_loss(loss, m, "seq-mean-token-sum"), (6 + 4) / 2)  # 5
    assert close(aggregate_loss(loss, m, "seq-mean-token-sum-norm"), 10 / (2 * 4))  # T = 4
    assert close(aggregate_loss(loss, m, "seq-mean-token-sum-norm", normalizer=10), 10 / 20)
    assert close(aggregate_loss(loss, m, "token-mean", num_tokens=20), 10 / 20)
    assert close(aggregate_loss(loss, m, "seq-mean-token-sum", num_sequences=5), 10 / 5)


def test_token_mean_and_seq_mean_differ_with_unequal_lengths_and_agree_with_equal():
    loss = T_([[1.0, 1.0, 1.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
    ragged = T_([[1, 1, 1, 1], [1, 0, 0, 0]])
    # token-mean: 9/5 = 1.8; seq-mean-token-mean: (1 + 5)/2 = 3
    assert close(aggregate_loss(loss, ragged, "token-mean"), 1.8)
    assert close(aggregate_loss(loss, ragged, "seq-mean-token-mean"), 3.0)
    equal = T_([[1, 1, 0, 0], [1, 1, 0, 0]])
    # equal lengths: (1+1+5+0)/4 = 1.75 both ways
    assert close(aggregate_loss(loss, equal, "token-mean"), 1.75)
    assert close(aggregate_loss(loss, equal, "seq-mean-token-mean"), 1.75)


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_loss_all_masked_gives_zero_not_nan(mode):
    out = aggregate_loss(torch.full((2, 3), float("nan")), torch.zeros(2, 3), mode)
    assert torch.equal(out, T_(0.0))


def test_aggregate_loss_unknown_mode_names_valid_modes():
    with pytest.raises(ValueError, match="token-mean.*seq-mean-token-mean"):
        aggregate_loss(torch.zeros(1, 1), torch.ones(1, 1), "sum")


def _microbatch_problem():
    g = torch.Generator().manual_seed(0)
    B, T = 6, 8
    old = -torch.rand(B, T, generator=g) * 2
    lp = old + 0.3 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    lengths = T_([8, 2, 5, 3, 1, 4])  # halves have different token counts (18 vs 8)
    m = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
    return lp, old, adv, m


def _grad(lp_data, old, adv, m, mode, **kw):
    lp = lp_data.clone().requires_grad_()
    loss, _ = clipped_surrogate_loss(lp, old, adv, 0.2, 0.28)
    aggregate_loss(loss, m, mode, **kw).backward()
    return lp.grad


@pytest.mark.parametrize("mode", MODES)
def test_microbatch_gradient_accumulation_matches_full_batch(mode):
    lp, old, adv, m = _microbatch_problem()
    B, T = m.shape
    full = _grad(lp, old, adv, m, mode, normalizer=T)
    # documented scaling: each part gets the full batch's denominators
    kw = {"num_tokens": m.sum(), "num_sequences": B, "normalizer": T}
    accumulated = torch.zeros_like(lp)
    for rows in (slice(0, 3), slice(3, 6)):
        part_mask = m[rows]
        width = int(part_mask.sum(1).max())  # each micro-batch padded only to its own length
        cols = slice(0, width)
        accumulated[rows, cols] += _grad(lp[rows, cols], old[rows, cols], adv[rows],
                                         part_mask[:, cols], mode, **kw)
    assert torch.allclose(accumulated, full, atol=1e-6)
    assert full.abs().sum() > 0


@pytest.mark.parametrize("mode", MODES)
def test_microbatches_without_global_denominators_do_not_match(mode):
    # the overrides are needed: per-part defaults give a different gradient (halves of
    # different token counts / widths), so the test above would fail without them
    lp, old, adv, m = _microbatch_problem()
    B, T = m.shape
    full = _grad(lp, old, adv, m, mode)
    accumulated = torch.zeros_like(lp)
    for rows in (slice(0, 3), slice(3, 6)):
        width = int(m[rows].sum(1).max())
        cols = slice(0, width)
        accumulated[rows, cols] += _grad(lp[rows, cols], old[rows, cols], adv[rows],
                                         m[rows, cols], mode)
    assert not torch.allclose(accumulated, full, atol=1e-6)


# --------------------------------------------------------------------------------------------
# diagnostics
# --------------------------------------------------------------------------------------------


def test_explained_variance_by_hand():
    R = T_([[1.0, 2.0, 3.0, 4.0, 100.0]])
    m = T_([[1, 1, 1, 1, 0]])
    assert close(explained_variance(R, R, m), 1.0)
    # V = R - [1, -1, 1, -1]: Var(residual) = 4/3 (unbiased), Var(R) = 5/3 -> 1 - 0.8 = 0.2
    V = R - T_([[1.0, -1.0, 1.0, -1.0, 0.0]])
    assert close(explained_variance(V, R, m), 0.2)
    # constant target: undefined -> 0, not NaN
    assert torch.equal(explained_variance(torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3)),
                       T_(0.0))


def test_clip_fraction_by_hand():
    clipped = T_([[True, False, True], [True, True, False]])
    m = T_([[1, 1, 0], [1, 1, 1]])
    # valid: [T, F] + [T, T, F] -> 3 of 5 = 0.6
    assert close(clip_fraction(clipped, m), 0.6)
    assert close(clip_fraction(clipped, torch.zeros(2, 3)), 0.0)


# --------------------------------------------------------------------------------------------
# no NaN on degenerate batches
# --------------------------------------------------------------------------------------------


def test_all_masked_batch_with_nan_padding_produces_no_nan_anywhere():
    nan = torch.full((2, 3), float("nan"))
    m = torch.zeros(2, 3)
    outs = [
        masked_mean(nan, m, dim=1),
        masked_whiten(nan, m),
        discounted_returns(nan, m),
        *gae_advantages(nan, nan, m, 0.9, 0.9),
        batch_whitened_advantages(nan, m),
        token_level_rewards(T_([1.0, 2.0]), m),
        kl_penalised_rewards(T_([1.0, 2.0]), nan, nan, m),
        sequence_ratio_surrogate_loss(torch.zeros(2, 3), torch.zeros(2, 3), T_([1.0, 1.0]), m)[0],
        explained_variance(nan, nan, m),
        clip_fraction(torch.zeros(2, 3, dtype=torch.bool), m),
    ]
    for out in outs:
        assert torch.isfinite(out).all()


# --------------------------------------------------------------------------------------------
# padding that is ±inf / NaN: values *and gradients* stay finite at masked positions
# --------------------------------------------------------------------------------------------


def _poisoned_logprobs():
    """Valid tokens in column 0..1; the masked column holds the worst padding values."""
    lp = T_([[-1.0, -2.0, -math.inf], [-0.5, -1.5, math.nan], [-1.0, -1.0, math.inf]], requires_grad=True)
    other = T_([[-1.5, -1.0, 0.0], [-0.5, -2.0, -math.inf], [-2.0, -1.0, math.nan]])
    mask = T_([[1, 1, 0], [1, 1, 0], [1, 1, 0]])
    return lp, other, mask


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_masked_kl_estimators_have_finite_gradients_on_inf_nan_padding(name):
    lp, ref, mask = _poisoned_logprobs()
    kl = kl_estimate(lp, ref, name, mask)
    assert torch.isfinite(kl).all() and (kl[:, 2] == 0).all()
    aggregate_loss(kl, mask).backward()
    assert torch.isfinite(lp.grad).all(), lp.grad
    assert (lp.grad[:, 2] == 0).all()
    # the valid positions get the same gradient as with clean padding
    clean = lp.detach()[:, :2].clone().requires_grad_(True)
    aggregate_loss(kl_estimate(clean, ref[:, :2], name), mask[:, :2], num_tokens=6).backward()
    assert torch.allclose(lp.grad[:, :2], clean.grad)


def test_unmasked_kl_on_inf_padding_would_poison_the_gradient():
    # why the mask argument exists: masking the *output* keeps the value, not the gradient
    lp, ref, mask = _poisoned_logprobs()
    aggregate_loss(kl_k3(lp, ref), mask).backward()
    assert not torch.isfinite(lp.grad).all()


@pytest.mark.parametrize("surrogate", ["token", "sequence"])
def test_masked_ratios_have_finite_gradients_on_inf_nan_padding(surrogate):
    lp, old, mask = _poisoned_logprobs()
    adv = T_([1.0, -1.0, 0.5])
    if surrogate == "sequence":
        loss, clipped = sequence_ratio_surrogate_loss(lp, old, adv, mask, 0.2, 0.2)
    else:
        loss, clipped = clipped_surrogate_loss(lp, old, adv, 0.2, 0.2, mask=mask)
    aggregate_loss(loss, mask, "seq-mean-token-mean").backward()
    assert torch.isfinite(lp.grad).all(), lp.grad
    assert (lp.grad[:, 2] == 0).all() and (lp.grad[:, :2] != 0).any()


def test_kl_penalised_rewards_finite_on_inf_padding():
    lp, ref, mask = _poisoned_logprobs()
    r = kl_penalised_rewards(T_([1.0, 0.0, 1.0]), lp, ref, mask, kl_coef=0.1, estimator="k3")
    assert torch.isfinite(r).all() and (r[:, 2] == 0).all()


def test_reinforce_plus_plus_puts_k1_in_the_reward():
    # Hu (2025): r_t = −β·(log π_old − log π_ref) per token (+ R at the last token).
    # β = 0.01, δ = log π_old − log π_ref = −0.5 at both tokens, R = 0: r = −0.01·(−0.5) = +0.005
    from llmgym.agents import REINFORCEPlusPlusConfig

    cfg = REINFORCEPlusPlusConfig()
    assert (cfg.kl_estimator, cfg.kl_placement, cfg.kl_coef) == ("k1", "reward", 0.01)
    r = kl_penalised_rewards(T_([0.0]), T_([[-1.5, -2.5]]), T_([[-1.0, -2.0]]), T_([[1, 1]]),
                             kl_coef=cfg.kl_coef, estimator=cfg.kl_estimator)
    assert close(r, [[0.005, 0.005]], atol=1e-7)


def test_explained_variance_is_zero_not_huge_when_returns_barely_vary():
    # all rewards 0: the returns hold only a tiny KL penalty (variance ~1e-12), the value head's
    # random outputs vary by ~1e-2; 1 − Var[R−V]/Var[R] would be ≈ −1e8 — report 0 instead
    R = T_([[1e-6, -1e-6, 2e-6, 0.0]])
    V = T_([[0.01, -0.02, 0.015, 0.0]])
    m = torch.ones(1, 4)
    assert 1 - masked_var(R - V, m) / masked_var(R, m) < -1e6  # the raw ratio is nonsense
    assert explained_variance(V, R, m).item() == 0.0
    # a real spread of returns is still measured (eps is far below any reward scale)
    R2 = T_([[0.0, 1.0, 0.0, 1.0]])
    assert close(explained_variance(R2, R2, m), 1.0)
    assert explained_variance(torch.zeros(1, 4), R2, m).item() == pytest.approx(0.0, abs=1e-6)


# --------------------------------------------------------------------------------------------
# newer group-policy losses: CISPO, SAPO, GDPO (hand-worked against the papers' formulas)
# --------------------------------------------------------------------------------------------


def test_cispo_value_and_gradient_by_hand():
    # MiniMax-M1: J = Σ sg(clip(r, 1-ε_low, 1+ε_high)) · A · log π;  loss = −J per token
    # old log-probs 0 (π_old = 1 for the arithmetic): r = π. ε_low = 1 (no lower bound), ε_high = 0.28
    p = T_([[2.0, 0.5, 1.1]])
    lp = p.log().requires_grad_(True)
    adv = T_([[1.0, 1.0, -2.0]])
    loss, capped = F.cispo_loss(lp, torch.zeros(1, 3), adv, clip_low=1.0, clip_high=0.28)
    # weights: min(2, 1.28) = 1.28; 0.5 (no lower clip); 1.1
    # loss = -w·A·log p = -1.28·ln2 = -0.88723; -0.5·ln0.5 = 0.34657; +2·1.1·ln1.1 = 0.20968
    assert close(loss, [[-0.88723, 0.34657, 0.20968]])
    assert capped.tolist() == [[True, False, False]]
    loss.sum().backward()
    # ∂/∂log π = -w·A: the capped token KEEPS its gradient (PPO's clip would give it 0)
    assert close(lp.grad, [[-1.28, -0.5, 2.2]])
    # a lower bound where asked: ε_low = 0.2 lifts the 0.5 weight to 0.8
    loss2, _ = F.cispo_loss(lp.detach(), torch.zeros(1, 3), adv, clip_low=0.2, clip_high=0.28)
    assert close(loss2[0, 1], -0.8 * math.log(0.5))


def test_cispo_differs_from_ppo_clip_exactly_where_ppo_drops_the_gradient():
    lp = torch.log(T_([[2.0]])).requires_grad_(True)
    ppo, _ = clipped_surrogate_loss(lp, torch.zeros(1, 1), T_([[1.0]]), 0.2, 0.28)
    ppo.sum().backward()
    assert lp.grad.item() == 0.0  # PPO: ratio 2 > 1.28 with A > 0 -> clipped, no gradient
    lp.grad = None
    F.cispo_loss(lp, torch.zeros(1, 1), T_([[1.0]]), 1.0, 0.28)[0].sum().backward()
    assert close(lp.grad, [[-1.28]])


def test_sapo_value_gradient_and_temperatures_by_hand():
    # Gao et al.: f(r) = σ(τ(r−1))·4/τ, τ = τ_pos if A > 0 else τ_neg; loss = −f(r)·A
    r = T_([[1.0, 1.5, 1.5, 0.5]])
    lp = r.log().requires_grad_(True)
    adv = T_([[1.0, 1.0, -1.0, 0.0]])
    loss, w = F.sapo_loss(lp, torch.zeros(1, 4), adv, tau_pos=1.0, tau_neg=2.0)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    # token 0: -σ(0)·4 = -2;  token 1: -σ(0.5)·4 = -2.48750;  token 2 (τ=2): +σ(1)·2 = 1.46212
    # token 3: A = 0 -> τ_neg, loss 0
    assert close(loss, [[-2.0, -4 * sig(0.5), 2 * sig(1.0), 0.0]])
    loss.sum().backward()
    # d/dlogπ (−f(r)A) = −A · w · r with the gate weight w = 4σ(1−σ)
    # (σ' = σ(1−σ), the 4/τ cancels τ, dr/dlogπ = r)
    expect_w = [4 * sig(0) * (1 - sig(0)), 4 * sig(0.5) * (1 - sig(0.5)),
                4 * sig(1.0) * (1 - sig(1.0)), 4 * sig(-1.0) * (1 - sig(-1.0))]
    assert close(w, [expect_w])
    assert close(lp.grad, [[-expect_w[0] * 1.0, -expect_w[1] * 1.5, expect_w[2] * 1.5, 0.0]])
    assert w[0, 0].item() == pytest.approx(1.0)  # on policy: the plain policy gradient


def test_sapo_gate_decays_smoothly_and_faster_for_negative_advantages():
    r = torch.linspace(0.5, 3.0, 26)
    lp = r.log()[None]
    _, w_pos = F.sapo_loss(lp, torch.zeros_like(lp), torch.ones_like(lp), 1.0, 1.05)
    _, w_neg = F.sapo_loss(lp, torch.zeros_like(lp), -torch.ones_like(lp), 1.0, 1.05)
    # peak 1 at r = 1, decreasing on both sides, never a cliff to exactly 0 (PPO's hard clip)
    peak = int((r - 1).abs().argmin())
    assert w_pos[0, peak].item() == pytest.approx(1.0) and (w_pos > 0).all()
    assert (w_pos[0, 1:peak + 1] > w_pos[0, :peak]).all() and (w_pos[0, peak + 1:] < w_pos[0, peak:-1]).all()
    # τ_neg > τ_pos: away from r = 1 the negative-advantage gate is the tighter one
    off = (r - 1).abs() > 0.05
    assert (w_neg[0, off] < w_pos[0, off]).all()
    with pytest.raises(ValueError, match="tau"):
        F.sapo_loss(lp, lp, lp, 0.0, 1.0)


def test_gdpo_decouples_what_grpo_collapses_by_hand():
    # the paper's collapse: 2 binary rewards, 2 rollouts per prompt.
    # prompt 1: rollouts (1, 0) and (0, 0); prompt 2: rollouts (1, 1) and (0, 0)
    r = T_([[[1.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [0.0, 0.0]]])
    grpo = group_advantages(r.sum(-1))
    # GRPO on the sums [1, 0] and [2, 0]: (x − mean)/std with unbiased std = |a−b|/√2 -> ±0.70711 for both
    assert close(grpo, [[0.70711, -0.70711], [0.70711, -0.70711]])
    summed = F.decoupled_group_advantages(r)
    # GDPO: component 1 gives ±0.70711 in both groups; component 2 is constant in group 1 (0) and ±0.70711
    # in group 2 -> sums ±0.70711 and ±1.41421
    assert close(summed, [[0.70711, -0.70711], [1.41421, -1.41421]])
    # batch normalisation: mean 0, unbiased var = (0.5 + 0.5 + 2 + 2)/3 = 5/3 -> divide by 1.29099
    assert close(F.gdpo_advantages(r), [[0.54772, -0.54772], [1.09545, -1.09545]])
    # weights multiply each component's normalised advantage: w = (1, 3)
    assert close(F.decoupled_group_advantages(r, T_([1.0, 3.0])), [[0.70711, -0.70711], [2.82843, -2.82843]])


def test_gdpo_edge_cases():
    flat = torch.ones(3, 4, 2)  # every component constant in every group: no signal, exactly 0
    assert torch.equal(F.gdpo_advantages(flat), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="num_groups, group_size, K"):
        F.decoupled_group_advantages(torch.ones(4, 2))
    with pytest.raises(ValueError, match="one entry per reward component"):
        F.decoupled_group_advantages(torch.ones(1, 2, 3), T_([1.0, 2.0]))


@pytest.mark.parametrize("loss_name", ["cispo", "sapo"])
def test_new_losses_have_finite_gradients_on_inf_nan_padding(loss_name):
    lp, old, mask = _poisoned_logprobs()
    fn = F.cispo_loss if loss_name == "cispo" else F.sapo_loss
    loss, _ = fn(lp, old, T_([1.0, -1.0, 0.5]), mask=mask)
    aggregate_loss(loss, mask).backward()
    assert torch.isfinite(lp.grad).all() and (lp.grad[:, 2] == 0).all()
