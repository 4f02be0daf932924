"""Truncated sampling: the sampler's log-probs brought to the learner's policy before anything compares them.

**What a log-prob means.** Every engine reports, for each sampled token, its log-prob under the distribution it
was drawn from (:attr:`llmgym.engines.Completion.logprobs`): with ``top_p < 1`` the tempered softmax ``p``
truncated to the nucleus and renormalised, ``q(y) = p(y) / S`` (``S`` the mass the nucleus keeps;
vLLM's ``processed_logprobs`` are the same). The policy the learner trains is the untruncated ``p``.

**The rule.** Before a batch is used (screened, reweighted, taken as π_old), the learner adds **its own**
``log S'`` — the kept mass of its nucleus at that position, under the weights that sampled the token where it
keeps them (:attr:`~llmgym.agents.learner.Learner.behaviour_weights`), its current ones otherwise — to each
reported log-prob (:func:`to_model_space`). Every later comparison of ``log π_learner`` with the batch's
``old_logprobs`` is then of like with like, and the importance ratio is

    ρ(y) = p'(y) / (q(y) · S') = q'(y) / q(y)

the learner's nucleus-renormalised probability over the sampler's: ``E_q[ρ] = 1`` when the two agree, where
the full-softmax ratio ``p'(y) / q(y)`` has mean ``E_q[S'] < 1`` (≈ 0.9 at top-p 0.8: the log S offset). With
no correction configured and one update per batch, π_old is ``p'`` itself, as before.

**The bias that remains** (documented, not corrected): the gradient is ``E_q[ρ · ∇log p · A]``, an expectation
over the nucleus only; tokens outside it (mass ``1 − S``) are never sampled, so the estimate of the untruncated
policy's gradient misses their term. That is the price of sampling with top-p at all — every trainer that does
so pays it; sample at ``top_p = 1`` to train on the policy's full support. A token that the sampler kept but the
learner's own nucleus does not (the two disagree at its edge) keeps ``ρ = p'(y) / (q(y) S')`` rather than 0.

Cost: with ``top_p < 1`` one no-grad pass of the decoder and the LM head over the batch's policy tokens (a sort
of each position's vocabulary), in tiles of at most :data:`~llmgym.agents.learner.CHUNK_ELEMENTS` logits.

Example:
    >>> import torch
    >>> from llmgym.engines.sampling import nucleus_log_mass, sample_next_token
    >>> p = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    >>> token, q = sample_next_token(p, torch.tensor([1]), torch.tensor([0]), top_p=0.75)  # what an engine reports
    >>> model_space = q + nucleus_log_mass(p, 0.75)  # what to_model_space makes of it
    >>> torch.allclose(model_space, p[0, token])
    True
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from llmgym.agents.learner import micro_batches
from llmgym.agents.screening import kept_weights, selected_logit_tiles
from llmgym.engines.base import optional_member
from llmgym.engines.sampling import nucleus_log_mass, tempered_logprobs
from llmgym.rollout.episodes import Batch

if TYPE_CHECKING:  # pragma: no cover
    from llmgym.agents.base import Agent

__all__ = ["kept_log_mass", "to_model_space", "truncates"]


def truncates(agent: Agent) -> bool:
    """Whether ``agent``'s engine reports truncated (nucleus-renormalised) log-probs that :func:`to_model_space`
    must bring back: sampling at ``top_p < 1`` and ``temperature > 0`` by an engine that says so
    (``top_p_renormalised_logprobs``)."""
    engine = getattr(agent, "engine", None)
    c = agent.learner.config
    return (engine is not None and c.top_p < 1 and c.temperature > 0
            and bool(optional_member(engine, "top_p_renormalised_logprobs")))


@torch.no_grad()
def kept_log_mass(agent: Agent, batch: Batch, select: torch.Tensor) -> torch.Tensor:
    """``log S'`` ``[N, L-1]`` at ``select`` (0 elsewhere): the log of the tempered mass the learner's top-p nucleus
    keeps at each position, under the model's current weights (:func:`~llmgym.engines.sampling.nucleus_log_mass`,
    the sampler's own rule)."""
    learner = agent.learner
    model, c = learner.model, learner.config
    out = torch.zeros(batch.action_mask.shape, dtype=torch.float32, device=batch.action_mask.device)
    was_training = model.training
    model.eval()
    try:
        start = 0
        for part in micro_batches(batch, c.micro_batch_size or c.minibatch_size):
            rows = slice(start, start + len(part))
            start += len(part)
            chosen = select[rows].bool()
            if not bool(chosen.any()):
                continue
            mass = torch.cat([nucleus_log_mass(tempered_logprobs(logits, c.temperature), c.top_p)
                              for _, logits in selected_logit_tiles(learner, part, chosen)])
            out[rows] = out[rows].index_put((chosen.to(out.device),), mass.to(out.device))
    finally:
        model.train(was_training)
    return out


def to_model_space(agent: Agent, batch: Batch | None) -> Batch | None:
    """``batch`` with its sampler's log-probs brought to the learner's untruncated policy (see the module doc):
    ``old_logprobs + log S'`` on the policy tokens; ``batch`` itself where nothing truncates (:func:`truncates`).

    A stale token (sampled by an older policy version whose weights the learner keeps) takes the ``log S'`` of
    those weights; every other token, the current weights'. A new :class:`~llmgym.rollout.episodes.Batch` (the
    same episodes); ``batch`` is left as it was.
    """
    if batch is None or not batch.episodes or not truncates(agent):
        return batch
    learner = agent.learner
    mask = batch.action_mask.bool()
    versions = batch.policy_versions
    kept = getattr(learner, "behaviour_weights", None) or {}
    by_version: dict[int, torch.Tensor] = {}
    if versions is not None and kept:
        stale = mask & (versions >= 0) & (versions < agent.step_count)
        for v in sorted({int(x) for x in versions[stale].tolist()} & set(kept)):
            by_version[v] = stale & (versions == v)
    current = mask.clone()
    for select in by_version.values():
        current &= ~select
    offsets = kept_log_mass(agent, batch, current)
    for v, select in by_version.items():
        with kept_weights(learner.model, kept[v]):
            offsets = torch.where(select, kept_log_mass(agent, batch, select), offsets)
    old = torch.where(mask, batch.old_logprobs + offsets.to(batch.old_logprobs.device), batch.old_logprobs)
    return dataclasses.replace(batch, old_logprobs=old)
