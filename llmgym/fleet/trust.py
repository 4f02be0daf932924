"""What the learner checks of a rollout server's answers before it uses them.

A server supplies three things: its weights (it says it holds the learner's), the log-probs of what it
sampled, and the samples themselves. None is taken on its word:

* **Weights** — after every sync, :func:`verify_probe` asks each server the log-probs of a fresh random token
  sequence and compares them with the learner's forward pass.
* **Scores** — :func:`check_logprobs` compares the log-probs a server reported for the tokens it sampled with
  the learner's recomputation. With ``top_p < 1`` a server reports the log-prob under the renormalised nucleus
  it sampled from; the batch's ``old_logprobs`` reach these checks with the learner's own log kept mass added
  (:mod:`llmgym.agents.truncation`), so both sides are of the untruncated policy and no gap is excused.
* **Samples** — :func:`screen_batch` tests that a server's completions are samples of the policy. A server can
  sample what it likes and report the learner's exact log-probs of it (a fixed high-reward completion, a
  sharper temperature, the best of k): its scores pass. Under honest sampling from ``π`` (at the sampling
  temperature), each token's ``s_t = log π(y_t) + H_t`` has conditional mean 0 and conditional variance
  ``v_t = E_π[(log π)²] − H_t²``, both computable from the learner's logits at that position; the sum over a
  server's tokens is a martingale with ``s_t ≤ H_t ≤ log V`` (``V`` the vocabulary). Freedman's inequality
  bounds its upper tail: ``P(Σ s_t ≥ a, Σ v_t ≤ w) ≤ exp(−a² / (2(w + a·log V / 3)))``. A server whose
  ``Σ s_t`` is over the bound at its ``Σ v_t`` (:func:`freedman_threshold`, false-alarm probability
  :data:`SAMPLE_ALPHA` per server and batch) samples completions more likely than the policy's own: it is not
  trusted. Duplicates are the other half: two independent samples are the same completion ``y`` with
  probability ``π(y)``, so among ``m`` completions of one server a repeat whose probability under the policy
  (every copy's) is below ``DUPLICATE_ALPHA / C(m, 2)`` happens by chance with probability under
  :data:`DUPLICATE_ALPHA` (:func:`duplicate_threshold`).

The rule for the batch: every row is attributed to the server(s) that sampled it, every check above runs
before the batch is used, and the rows of a server that is not trusted — found now, or earlier (a probe after
a sync) — leave the batch before the step (:func:`screen_batch` returns which rows stay).

What the sample test can and cannot see: it catches completions that are more likely under the policy than its
own samples (a fixed completion, a lower temperature than claimed, a greedy answer) and repeats; it cannot tell
a sample picked among honest samples by something uncorrelated with their likelihood (the best of k by reward)
from an honest one; a sample *less* likely than the policy's (a higher temperature) is not tested (``s_t`` has
no lower bound, so no test of its lower tail has a known false-alarm rate). With ``top_p < 1`` the sampling
distribution is the renormalised nucleus, whose moments the learner does not compute: the likelihood test
skips those completions (the duplicate test bounds their probability by ``π(y)/top_p`` per token and still runs).

Example:
    >>> from llmgym.fleet.trust import duplicate_threshold, freedman_threshold
    >>> round(freedman_threshold(100.0, 10.0), 1)  # the largest Σ(log π + H) 100 units of variance allow
    150.4
    >>> duplicate_threshold(24) < -19  # log-probability under which a repeat among 24 completions is a lie
    True
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from llmgym.runtime import distributed

if TYPE_CHECKING:  # pragma: no cover
    from llmgym.fleet.fleet_engine import FleetEngine

__all__ = ["DUPLICATE_ALPHA", "SAMPLE_ALPHA", "TokenScores", "check_logprobs", "duplicate_threshold",
           "freedman_threshold", "judge_samples", "SampleTally", "screen_batch", "verify_probe"]

SAMPLE_ALPHA = 1e-6
"""False-alarm probability of the likelihood test, per server and batch, for an honest server."""
DUPLICATE_ALPHA = 1e-6
"""False-alarm probability of the duplicate test, per server and batch, for an honest server."""
_VARIANCE_GRID = 64  # Freedman's bound holds for a fixed variance: a union over a doubling grid of them


def freedman_threshold(variance: float, bound: float, alpha: float = SAMPLE_ALPHA) -> float:
    """The largest ``Σ s_t`` an honest sampler exceeds with probability under ``alpha``, at a summed conditional
    variance ``variance``, for martingale steps ``s_t ≤ bound``.

    Freedman's inequality at a fixed ``w`` gives ``a = b·L/3 + sqrt((b·L/3)² + 2·w·L)``, ``L = log(1/α)``; the
    observed variance is random, so ``w`` is the next point (×2) of a grid of :data:`_VARIANCE_GRID` doubling
    values from 2⁻¹⁶ and ``α`` is shared among them.

    Example:
        >>> from llmgym.fleet.trust import freedman_threshold
        >>> freedman_threshold(0.0, 5.0) < freedman_threshold(10.0, 5.0) < freedman_threshold(10.0, 10.0)
        True
    """
    if not variance >= 0 or not bound >= 0:
        raise ValueError(f"variance and bound must be >= 0, got {variance}, {bound}")
    w = 2.0 ** -16
    while w < variance:
        w *= 2.0
    log_odds = math.log(_VARIANCE_GRID / alpha)
    third = bound * log_odds / 3.0
    return third + math.sqrt(third * third + 2.0 * w * log_odds)


def duplicate_threshold(completions: int, alpha: float = DUPLICATE_ALPHA) -> float:
    """The log-probability under which a completion that ``completions`` independent samples repeat is
    evidence of a lie at level ``alpha``: ``log(alpha / C(m, 2))`` (a union bound over the pairs; a given
    pair repeats a completion of probability under ``τ`` with probability under ``τ``).

    Example:
        >>> from llmgym.fleet.trust import duplicate_threshold
        >>> round(duplicate_threshold(2, alpha=0.01), 3)
        -4.605
    """
    pairs = max(1, completions * (completions - 1) // 2)
    return math.log(alpha) - math.log(pairs)


@dataclasses.dataclass
class TokenScores:
    """The learner's view of a batch's sampled tokens under the weights that sampled them, ``[N, L-1]`` each.

    Attributes:
        logprobs: ``log π(y_t)`` at the sampling temperature.
        entropy: ``H_t`` of the same distribution.
        second_moment: ``E_π[(log π)²]`` at that position (the variance of ``log π(y_t)`` is ``second − H²``).
        checked: the tokens scored under the weights that sampled them (a stale token whose weights the
            learner no longer holds is not; its reported log-prob is then not used either).
        vocab_size: the size of the distribution's support (bounds ``log π + H`` by ``log V``).
        temperature: the temperature of the scores; a completion sampled at another one is not tested.
    """

    logprobs: Any
    entropy: Any
    second_moment: Any
    checked: Any
    vocab_size: int
    temperature: float = 1.0


def _runs(mask) -> list[tuple[int, int]]:
    """``[(start, end)]`` of each run of 1s in ``mask``: one completion each."""
    runs, start = [], None
    for p in range(len(mask) + 1):
        inside = p < len(mask) and mask[p] == 1
        if inside and start is None:
            start = p
        elif not inside and start is not None:
            runs.append((start, p))
            start = None
    return runs


def _origin(fleet: FleetEngine, episode: Any, start: int, end: int) -> tuple[int, float, float] | None:
    """``(server index, top_p, temperature)`` of the completion ``episode.token_ids[start:end]`` as
    :meth:`FleetEngine.generate` recorded it; ``None`` where it has no record."""
    key = hash((tuple(episode.token_ids[start:end]), tuple(episode.logprobs[start:end])))
    found = next((d[key] for d in reversed(fleet._sampled_by) if key in d), None)
    if found is None:
        return None
    index, top_p, *rest = found
    return int(index), float(top_p), float(rest[0]) if rest else 1.0


@dataclasses.dataclass
class SampleTally:
    """What one server's completions of a batch add up to: the log-prob gaps, ``Σ(log π + H)``, its variance,
    and each completion's tokens with an upper bound of its log-probability under the sampling distribution."""

    gap_sum: float = 0.0
    gap_count: int = 0
    gap_worst: float = 0.0
    score: float = 0.0  # Σ (log π + H)
    variance: float = 0.0  # Σ (E[(log π)²] − H²)
    tokens: int = 0
    completions: list = dataclasses.field(default_factory=list)  # (tokens, log π(y) upper bound)

    def add(self, tokens: Any, logprobs: Any, entropy: Any, second_moment: Any, top_p: float = 1.0) -> None:
        """One completion: its token ids and, per token, the learner's ``log π``, ``H`` and ``E[(log π)²]`` at
        the sampling temperature (tensors). With ``top_p < 1`` only its probability bound counts (the
        likelihood test needs the nucleus's moments)."""
        slack = -math.log(top_p) * len(tokens) if top_p < 1 else 0.0
        self.completions.append((tuple(int(t) for t in tokens), float(logprobs.sum()) + slack))
        if top_p >= 1:
            self.score += float((logprobs + entropy).sum())
            self.variance += float((second_moment - entropy * entropy).clamp(min=0).sum())
            self.tokens += len(tokens)


def _gaps(fleet: FleetEngine, batch: Any, learner_logprobs: Any, checked: Any) -> tuple[dict, list]:
    """Per server index, its tally of |reported − learner| over ``checked`` tokens; each row's servers."""
    import torch

    signed = batch.old_logprobs.detach().float().cpu() - learner_logprobs.detach().float().cpu()
    tallies: dict[int, SampleTally] = {}
    rows: list[set | None] = []
    for row, episode in enumerate(getattr(batch, "episodes", None) or []):
        servers: set | None = set()
        for start, end in _runs(episode.action_mask):
            found = _origin(fleet, episode, start, end)
            if found is None:
                servers = None  # sampled by no server the fleet recorded: not attributable, not trusted
                continue
            index, top_p, _ = found
            if servers is not None:
                servers.add(index)
            if start < 1:
                continue
            columns = torch.arange(start - 1, end - 1)
            # server - learner, like with like: with top-p < 1 the learner has added its own log kept mass to the
            # server's nucleus-renormalised report (llmgym.agents.truncation), so no excess is the sampler's right
            gap = signed[row, columns].abs()[checked[row, columns]]
            tally = tallies.setdefault(index, SampleTally())
            tally.gap_sum += float(gap.sum())
            tally.gap_count += int(gap.numel())
            tally.gap_worst = max(tally.gap_worst, float(gap.max()) if gap.numel() else 0.0)
        rows.append(servers)
    return tallies, rows


def _judge_gaps(fleet: FleetEngine, tallies: dict[int, SampleTally]) -> dict[str, float]:
    result = {}
    for index, tally in tallies.items():
        if tally.gap_count == 0:
            continue
        server = fleet.servers[index]
        gap = tally.gap_sum / tally.gap_count
        result[server.root] = gap
        if server.lost is None and not gap <= fleet.logprob_tolerance:
            fleet._lose(server, f"the log-probs it reported for {tally.gap_count} tokens of a batch differ from the "
                                f"learner's recomputation by {gap:.3g} nats per token (tolerance "
                                f"{fleet.logprob_tolerance:g}): it does not sample the learner's policy",
                        untrusted=True)
        elif server.lost is None and not tally.gap_worst <= fleet.token_tolerance:
            fleet._lose(server, f"the log-prob it reported for a token of a batch differs from the learner's "
                                f"recomputation by {tally.gap_worst:.3g} nats (token tolerance "
                                f"{fleet.token_tolerance:g}): it does not sample the learner's policy", untrusted=True)
    return result


def check_logprobs(fleet: FleetEngine, batch: Any, learner_logprobs: Any,
                   version: int | None = None) -> dict[str, float]:
    """:meth:`FleetEngine.check_logprobs`: the servers' reported log-probs against ``learner_logprobs`` on the
    tokens ``version`` sampled (default: every token); returns ``{url: mean gap}`` and drops a server over the
    tolerances."""
    checked = batch.action_mask.bool().cpu()
    versions = getattr(batch, "policy_versions", None)
    if versions is not None and version is not None:
        checked = checked & (versions.cpu() == int(version))
    tallies, _ = _gaps(fleet, batch, learner_logprobs, checked)
    fleet.batch_gaps = _judge_gaps(fleet, tallies)
    fleet._live_servers()  # report; none left: FleetError
    return fleet.batch_gaps


def screen_batch(fleet: FleetEngine, batch: Any, scores: TokenScores) -> list[bool]:
    """:meth:`FleetEngine.screen_batch`: check every server's scores and samples in ``batch`` against the
    learner's ``scores`` (see the module doc); drop the servers that fail; return, per row, whether it stays
    (``False``: sampled, in any of its completions, by a server not trusted now, or by no server the fleet
    recorded)."""
    checked = scores.checked.bool().cpu()
    logprobs, entropy = scores.logprobs.detach().float().cpu(), scores.entropy.detach().float().cpu()
    second = scores.second_moment.detach().float().cpu()
    tallies, rows = _gaps(fleet, batch, logprobs, checked)
    fleet.batch_gaps = _judge_gaps(fleet, tallies)
    for row, episode in enumerate(batch.episodes):
        for start, end in _runs(episode.action_mask):
            found = _origin(fleet, episode, start, end)
            if found is None or start < 1:
                continue
            index, top_p, temperature = found
            cols = slice(start - 1, end - 1)
            if not bool(checked[row, cols].all()) or temperature <= 0 or abs(temperature - scores.temperature) > 1e-6:
                continue  # not scored under its sampling weights or temperature, or greedy (not a sample)
            tallies.setdefault(index, SampleTally()).add(episode.token_ids[start:end], logprobs[row, cols],
                                                         entropy[row, cols], second[row, cols], top_p)
    fleet.sample_scores = {}
    for index, tally in tallies.items():
        server = fleet.servers[index]
        ratio, why = judge_samples(tally, int(scores.vocab_size))
        fleet.sample_scores[server.root] = ratio
        if server.lost is None and why is not None:
            fleet._lose(server, why + ": it does not sample the learner's policy", untrusted=True)
    fleet._live_servers()  # report; none left: FleetError
    return [servers is not None and not any(fleet.servers[i].untrusted for i in servers) for servers in rows]


def judge_samples(tally: SampleTally, vocab_size: int) -> tuple[float, str | None]:
    """``(Σ(log π + H) / its bound, why or None)`` for one server's completions of a batch: the likelihood test,
    then the duplicate test (see the module doc)."""
    limit = freedman_threshold(tally.variance, math.log(max(2, vocab_size)))
    ratio = tally.score / limit if limit > 0 else 0.0
    if tally.tokens and tally.score > limit:
        return ratio, (f"its {len(tally.completions)} completions of a batch are more likely under the policy than "
                       f"its own samples (Σ(log π + H) = {tally.score:.4g} over {tally.tokens} tokens, over the "
                       f"{limit:.4g} an honest sampler exceeds with probability {SAMPLE_ALPHA:g})")
    seen: dict[tuple, float] = {}
    worst = None
    for tokens, logp in tally.completions:
        if tokens in seen:  # a repeat: every copy's probability bounds how likely it was by chance
            both = max(seen[tokens], logp)
            worst = both if worst is None else min(worst, both)
        seen[tokens] = max(seen.get(tokens, -math.inf), logp)
    limit = duplicate_threshold(len(tally.completions))
    if worst is not None and worst < limit:
        return ratio, (f"it sampled one completion more than once in a batch, and its probability under the policy "
                       f"is e^{worst:.4g} (a repeat among {len(tally.completions)} samples below e^{limit:.4g} has "
                       f"probability {DUPLICATE_ALPHA:g})")
    return ratio, None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


# -- after a sync: does the server hold the learner's weights? -------------------------------------------
def _probe_ids(fleet: FleetEngine, model: Any, length: int) -> list[int]:
    vocab = len(fleet.tokenizer) if fleet.tokenizer is not None else None
    config_vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    sizes = [v for v in (vocab, config_vocab) if isinstance(v, int) and v > 1]
    if not sizes:
        raise ValueError("FleetEngine cannot verify the servers: neither the tokenizer nor the model says its "
                         "vocabulary size")
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))  # unknown to a server until it is asked
    return [rng.randrange(min(sizes)) for _ in range(length)]


def verify_probe(fleet: FleetEngine, live: list, model: Any, version: int, length: int) -> None:
    """Ask every server for the log-probs of a fresh random sequence of ``length`` tokens and compare them with
    ``model``'s own: a server whose mean gap is over ``fleet.logprob_tolerance`` (or one token's over
    ``fleet.token_tolerance``) does not hold the weights just pushed (it discarded them, or samples another
    model) and is dropped."""
    import torch

    from llmgym.engines.hf import sequence_logprobs
    from llmgym.fleet.fleet_engine import FleetError

    if distributed.is_fsdp_module(model):
        return  # its forward is a collective of every rank, and only this one pushes: no probe (docs/scale.md)
    module = getattr(model, "module", model)
    ids = _probe_ids(fleet, module, length)

    def ask(server: Any) -> list[float] | str:
        try:
            reply = server.call("POST", "/v1/completions", timeout=fleet.sync_timeout_s,
                                json={"model": server.client.model, "prompt": ids, "max_tokens": 1,
                                      "temperature": 1.0, "prompt_logprobs": 0})
            rows = reply["choices"][0]["prompt_logprobs"]
            if not isinstance(rows, list) or len(rows) != len(ids):
                raise ValueError(f"{len(rows) if isinstance(rows, list) else 'no'} prompt log-probs for "
                                 f"{len(ids)} tokens")
            out = []
            for token, entry in zip(ids[1:], rows[1:]):
                value = float(entry[str(token)]["logprob"])
                if value != value or value > 0:  # NaN, or not a log-probability
                    raise ValueError(f"log-prob {value!r}")
                out.append(value)
            return out
        except FleetError as exc:
            return _one_line(exc)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            return f"{server.root}/v1/completions answered no usable prompt log-probs ({_one_line(exc)})"

    with ThreadPoolExecutor(len(live)) as pool:  # the servers compute theirs while the learner computes its own
        asked = [pool.submit(ask, server) for server in live]
        device = next(iter(module.parameters())).device
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad():
                tensor = torch.tensor([ids], device=device)
                learner = sequence_logprobs(module, tensor, torch.ones_like(tensor))[0].float().cpu().tolist()
        finally:
            module.train(was_training)
        answers = [future.result() for future in asked]
    fleet.probe_gaps = {}
    for server, answer in zip(live, answers):
        if isinstance(answer, str):  # up but no usable answer to the probe: not to be trusted either
            alive = server.alive()
            fleet._lose(server, f"it could not be checked after the sync of version {version}: {answer}"
                        if alive else answer, untrusted=alive)
            continue
        gaps = [abs(a - b) for a, b in zip(answer, learner)]
        gap, worst = sum(gaps) / len(learner), max(gaps, default=0.0)
        fleet.probe_gaps[server.root] = gap
        if not gap <= fleet.logprob_tolerance:
            fleet._lose(server, f"after the sync of version {version} its log-probs differ from the learner's by "
                                f"{gap:.3g} nats per token (tolerance {fleet.logprob_tolerance:g}): it does not "
                                f"hold the learner's weights", untrusted=True)
        elif not worst <= fleet.token_tolerance:
            fleet._lose(server, f"after the sync of version {version} one of its probe log-probs differs from the "
                                f"learner's by {worst:.3g} nats (token tolerance {fleet.token_tolerance:g}): it does "
                                f"not hold the learner's weights", untrusted=True)
