"""The bias of each off-policy correction against the exact expectation, with known mismatch injected.

A target policy ``p`` (the learner) and a sampler ``q`` over sequences of ``L ≤ 3`` tokens from a
vocabulary of 5: small enough to enumerate every sequence, so ``E_p[f]`` and ``E_q[w · f]`` are exact
sums, not estimates. The sampler differs from the target as a real one does: bf16-rounded logits
(an engine's precision), the weights of 1–8 updates ago (staleness, a known drift per version), or
top-p truncation (the renormalised nucleus). The weights are the library's own
(:func:`llmgym.agents.functional.correction_weights`) and each bias must be the one theory gives:

* plain importance sampling is unbiased on the sampler's support;
* ``tis``: ``bias = −E_q[(ρ − C)_+ f]`` (at most the truncated mass);
* ``mis``: ``bias = −E_p[1[ρ_seq ∉ band] f]`` (at most the target's mass on the masked rows);
* ``icepop``: ``bias = −E_p[1[ρ_t ∉ [α, β]] f]`` (one token: at most the masked mass);
* ``geo``: ``|bias| ≤ |f|_max (ε · P_q(kept) + P_p(masked))``, ``ε = max(hi^L − 1, 1 − lo^L)``;
* a truncated sampler's lost mass ``1 − S`` is out of every correction's reach: ``−E_p[f; q = 0]``
  (on its support ``ρ = S``);
* with no mismatch every weight is 1 and every bias 0.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from llmgym.agents import functional as F

V = 5
TOL = 1e-10


def _prefix_logits(length: int, seed: int) -> dict[tuple[int, ...], torch.Tensor]:
    """The target's next-token logits after every prefix shorter than ``length`` (autoregressive)."""
    g = torch.Generator().manual_seed(seed)
    prefixes = [p for n in range(length) for p in itertools.product(range(V), repeat=n)]
    return {p: 1.5 * torch.randn(V, generator=g, dtype=torch.float64) for p in prefixes}


def _drift(logits: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {p: 0.08 * torch.randn(V, generator=g, dtype=torch.float64) for p in logits}


def _token_logprobs(logits: dict, seqs: torch.Tensor, top_p: float | None = None) -> torch.Tensor:
    """``[N, L]`` ``log π(y_t | y_<t)`` of every sequence; with ``top_p`` the sampler's: the smallest set
    of most likely tokens whose mass reaches ``top_p``, renormalised (``−inf`` outside it)."""
    out = torch.empty(seqs.shape, dtype=torch.float64)
    for i, row in enumerate(seqs.tolist()):
        for t, token in enumerate(row):
            logp = torch.log_softmax(logits[tuple(row[:t])], dim=-1)
            if top_p is not None:
                order = torch.argsort(logp, descending=True)
                before = torch.cumsum(logp[order].exp(), 0) - logp[order].exp()
                kept = torch.zeros(V, dtype=torch.bool)
                kept[order[before < top_p]] = True
                logp = torch.where(kept, logp - torch.logsumexp(logp[kept], 0), torch.full_like(logp, -math.inf))
            out[i, t] = logp[token]
    return out


def _sampler(kind: str, logits: dict, seqs: torch.Tensor, seed: int) -> torch.Tensor:
    if kind == "exact":
        return _token_logprobs(logits, seqs)
    if kind == "bf16":  # the engine's copy of the weights in bf16: its logits rounded
        return _token_logprobs({p: z.to(torch.bfloat16).double() for p, z in logits.items()}, seqs)
    if kind.startswith("stale"):  # the learner is k versions ahead: each version moved the logits by δ
        k, delta = int(kind[len("stale"):]), _drift(logits, seed + 1)
        return _token_logprobs({p: z - k * delta[p] for p, z in logits.items()}, seqs)
    assert kind == "top_p"
    return _token_logprobs(logits, seqs, top_p=0.8)


def _case(kind: str, length: int, seed: int = 0):
    """``(p, q, log_ratio, f)``: sequence probabilities, the per-token log-ratio ``log p − log q`` on the
    sampler's support, and a function of the sequence in ``[-1, 1]``."""
    logits = _prefix_logits(length, seed)
    seqs = torch.tensor(list(itertools.product(range(V), repeat=length)))
    target = _token_logprobs(logits, seqs)
    sampler = _sampler(kind, logits, seqs, seed)
    p, q = target.sum(-1).exp(), sampler.sum(-1).exp()
    support = q > 0
    log_ratio = torch.where(support[:, None], target - sampler, torch.zeros_like(target))
    f = 2 * torch.rand(len(seqs), generator=torch.Generator().manual_seed(seed + 2), dtype=torch.float64) - 1
    return p, q, log_ratio, f, support


def _estimate(name, q, log_ratio, f, support, low=None, high=None):
    """``E_q[w f]``: each sequence's weight (its first token's; every token of a sequence preset has it)."""
    w, stats = F.correction_weights(name, log_ratio, torch.ones_like(log_ratio), low, high)
    w = torch.where(support, w[:, 0], torch.zeros_like(q))
    return float((q * w * f).sum()), w, stats


MISMATCH = ["bf16", "stale1", "stale2", "stale4", "stale8", "top_p"]


def _lost(p, f, support):
    """The target's expectation on what the sampler never draws: no weight reaches it."""
    return float((p * f * ~support).sum())


@pytest.mark.parametrize("name", F.CORRECTIONS)
@pytest.mark.parametrize("length", [1, 3])
def test_no_mismatch_every_weight_is_one_and_no_bias(name, length):
    p, q, log_ratio, f, support = _case("exact", length)
    est, w, stats = _estimate(name, q, log_ratio, f, support)
    assert torch.allclose(w, torch.ones_like(w), atol=1e-12)
    assert abs(est - float((p * f).sum())) < TOL
    assert float(stats["correction_truncated_share"]) == 0 and float(stats["correction_masked_share"]) == 0


@pytest.mark.parametrize("kind", MISMATCH)
@pytest.mark.parametrize("length", [1, 2, 3])
def test_importance_sampling_is_unbiased_on_the_support_and_the_uncorrected_is_not(kind, length):
    p, q, log_ratio, f, support = _case(kind, length)
    truth = float((p * f).sum())
    plain, _, _ = _estimate("tis-seq", q, log_ratio, f, support, high=1e6)  # C never reached: plain IS
    assert abs(plain - (truth - _lost(p, f, support))) < TOL
    uncorrected = float((q * f).sum())
    assert abs(uncorrected - truth) > 1e-4, "the injected mismatch must matter for the test to mean anything"


@pytest.mark.parametrize("kind", MISMATCH)
@pytest.mark.parametrize("name,length", [("tis-token", 1), ("tis-seq", 1), ("tis-seq", 2), ("tis-seq", 3)])
def test_tis_bias_is_minus_the_truncated_mass(kind, name, length):
    p, q, log_ratio, f, support = _case(kind, length)
    for cap in (1.05, 1.2, 2.0):
        est, _, stats = _estimate(name, q, log_ratio, f, support, high=cap)
        rho = torch.where(support, log_ratio.sum(-1).exp(), torch.zeros_like(q))
        excess = q * (rho - cap).clamp(min=0)
        bias = est - float((p * f).sum())
        assert abs(bias - (-float((excess * f).sum()) - _lost(p, f, support))) < TOL
        assert abs(bias + _lost(p, f, support)) <= float(excess.sum()) + TOL  # |f| ≤ 1
        # the shares count the rows given (here every sequence; off the support the log-ratio is 0)
        assert float(stats["correction_truncated_share"]) == pytest.approx(
            float((log_ratio.sum(-1) > math.log(cap)).double().mean()), abs=1e-12)


@pytest.mark.parametrize("kind", MISMATCH)
@pytest.mark.parametrize("length", [1, 2, 3])
def test_mis_bias_is_minus_the_masked_target_mass(kind, length):
    p, q, log_ratio, f, support = _case(kind, length)
    for low, cap in ((0.0, 1.1), (0.0, 2.0), (0.9, 1.1)):
        est, w, stats = _estimate("mis", q, log_ratio, f, support, low=low, high=cap)
        rho = log_ratio.sum(-1).exp()
        masked = support & ((rho > cap) | (rho < low))
        bias = est - float((p * f).sum())
        assert abs(bias - (-float((p * f * masked).sum()) - _lost(p, f, support))) < TOL
        assert abs(bias + _lost(p, f, support)) <= float((p * masked).sum()) + TOL
        assert bool((w[masked] == 0).all()) and bool((w[support & ~masked] <= cap).all())
        assert float(stats["correction_rows_masked_share"]) == pytest.approx(float(masked.double().mean()))


@pytest.mark.parametrize("kind", MISMATCH)
def test_icepop_bias_is_minus_the_masked_target_mass(kind):
    p, q, log_ratio, f, support = _case(kind, 1)
    for low, high in ((0.5, 2.0), (0.95, 1.05), (0.99, 1.01)):
        est, _, stats = _estimate("icepop", q, log_ratio, f, support, low=low, high=high)
        rho = log_ratio[:, 0].exp()
        masked = support & ((rho > high) | (rho < low))
        bias = est - float((p * f).sum())
        assert abs(bias - (-float((p * f * masked).sum()) - _lost(p, f, support))) < TOL
        assert float(stats["correction_masked_share"]) == pytest.approx(float(masked.double().mean()))


@pytest.mark.parametrize("kind", MISMATCH)
@pytest.mark.parametrize("length", [1, 2, 3])
def test_geo_bias_is_bounded_by_the_band_and_the_masked_mass(kind, length):
    p, q, log_ratio, f, support = _case(kind, length)
    for low, high in ((0.99, 1.01), (0.9, 1.1)):
        est, w, _ = _estimate("geo", q, log_ratio, f, support, low=low, high=high)
        geo = log_ratio.mean(-1).exp()
        kept = support & (geo >= low) & (geo <= high)
        assert torch.equal(w.bool(), kept)
        eps = max(high ** length - 1, 1 - low ** length)
        bound = eps * float(q[kept].sum()) + float(p[support & ~kept].sum())
        bias = est - float((p * f).sum())
        assert abs(bias + _lost(p, f, support)) <= bound + TOL


def test_the_injected_mismatch_grows_with_staleness_and_the_masks_act():
    """Sanity of the setup itself: the drift of k versions moves the sampler further from the target
    (the truncated and masked mass grow with k), so the tests above are not vacuous."""
    truncated, masked = [], []
    for k in (1, 2, 4, 8):
        p, q, log_ratio, f, support = _case(f"stale{k}", 3)
        rho = log_ratio.sum(-1).exp()
        truncated.append(float((q * (rho - 1.2).clamp(min=0)).sum()))
        masked.append(float(p[~((log_ratio.mean(-1).exp() - 1).abs() <= 0.01)].sum()))
    assert truncated == sorted(truncated) and truncated[0] < truncated[-1] and truncated[-1] > 1e-3
    assert masked[-1] > 0.5  # at 8 versions most of the target's mass leaves SkyRL's band


def test_top_p_ratio_on_the_support_is_the_kept_mass():
    """A renormalised nucleus ``q = p / S`` on its support: there ``ρ_t = p / q = S < 1`` — the ``log S``
    offset that a sampler reporting the model's log-probs (not the nucleus's) would hide."""
    p, q, log_ratio, f, support = _case("top_p", 1)
    kept_mass = float(p[support].sum())
    assert 0.8 <= kept_mass < 1
    expected = torch.full((int(support.sum()),), math.log(kept_mass), dtype=torch.float64)
    assert torch.allclose(log_ratio[support, 0], expected)


def test_token_level_weights_correct_the_last_token_only():
    """At two tokens the token-level weight of position 2 corrects the token, not its prefix:
    ``E_q[ρ_2 g] = E_{y_1 ~ q, y_2 ~ p}[g]`` exactly (nothing truncated); the sequence weight is unbiased."""
    p, q, log_ratio, f, support = _case("stale2", 2)
    w, _ = F.correction_weights("tis-token", log_ratio, torch.ones_like(log_ratio), high=1e6)
    token_est = float((q * w[:, 1] * f).sum())
    # the mixed distribution: the sampler's first token, the target's second
    mixed = p * torch.exp(-log_ratio[:, 0])
    assert abs(token_est - float((mixed * f).sum())) < TOL and abs(float(mixed.sum()) - 1) < TOL
    assert abs(token_est - float((p * f).sum())) > 1e-4
    seq_est, _, _ = _estimate("tis-seq", q, log_ratio, f, support, high=1e6)
    assert abs(seq_est - float((p * f).sum())) < TOL


def test_padding_never_enters_a_weight():
    """Rows of 1–3 tokens padded to 3, padding holding inf/nan: each row's weights are those of the row alone."""
    lr = torch.tensor([[0.3, float("nan"), float("inf")], [0.1, -0.2, float("-inf")], [0.01, -0.02, 0.005]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    for name in F.CORRECTIONS:
        w, stats = F.correction_weights(name, lr, mask)
        assert torch.isfinite(w).all() and bool((w[mask == 0] == 0).all())
        for i, n in enumerate((1, 2, 3)):
            alone, _ = F.correction_weights(name, lr[i:i + 1, :n], torch.ones(1, n))
            assert torch.allclose(w[i, :n], alone[0])
        assert all(math.isfinite(float(v)) for v in stats.values())
