"""A batch from an engine that cannot be taken at its word is checked before it is used.

An engine with a ``screen_batch`` member (a fleet of rollout servers, :mod:`llmgym.fleet.trust`) supplies
the samples and their log-probs; the learner computes its own scores of the same tokens — ``log π``, the
entropy ``H`` and the second moment ``E[(log π)²]`` at every sampled position, in one no-grad forward —
under **the weights that sampled them**, hands them to the engine, and keeps only the rows the engine
still trusts (:func:`screen`, called by :meth:`~llmgym.agents.base.Agent.update` before anything else).

**The rule for rows.** A distrusted server's rows leave the batch before the step. An algorithm whose
advantages are relative to a group (GRPO, RLOO, ...) loses the whole group of such a row (its baseline
would include the distrusted reward); a batch with no row left takes no optimiser step. The step's row
reports ``rows_dropped``.

**The rule for stale tokens** (the pipelined learner, ``max_staleness ≥ 1``): a server's reported log-prob
never sets an importance weight. The pipeline keeps the weights of every version that samples a batch
trained on after a newer one (:attr:`~llmgym.agents.learner.Learner.behaviour_weights`; one copy of the
trained parameters per version, at most ``K`` at once — the LoRA adapters only, with LoRA); the learner
scores those tokens under them, the server's log-probs are checked against that score, and the score,
not the report, becomes the behaviour log-prob ``π_behav`` of the correction. A stale token whose weights
are not kept (a batch sampled before a resume) takes the learner's current log-prob as ``π_behav``: its
weight is 1, and the server's report is not used.

Example:
    >>> import torch
    >>> from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer
    >>> from llmgym.agents.screening import kept_weights
    >>> tok = build_tokenizer()
    >>> model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1))
    >>> old = {k: v.clone() for k, v in model.state_dict().items()}
    >>> with torch.no_grad():
    ...     _ = model.lm_head.weight.add_(1.0)
    >>> with kept_weights(model, old):
    ...     torch.equal(model.lm_head.weight, old["lm_head.weight"])
    True
    >>> torch.equal(model.lm_head.weight, old["lm_head.weight"])  # the current weights are back
    False
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from llmgym.agents.learner import CHUNK_ELEMENTS, head_inputs, micro_batches
from llmgym.engines.base import optional_member
from llmgym.fleet.trust import TokenScores
from llmgym.rollout.episodes import Batch
from llmgym.runtime import distributed

if TYPE_CHECKING:  # pragma: no cover
    from llmgym.agents.base import Agent

__all__ = ["kept_weights", "screen", "token_scores"]


@contextlib.contextmanager
def kept_weights(model: torch.nn.Module, state: dict[str, torch.Tensor]):
    """``model`` computing with the tensors of ``state`` (a state dict of the same model, as
    :meth:`~torch.nn.Module.state_dict` names them) in place of its parameters, without copying them; its own
    parameters are back on exit. Only for no-grad forwards."""
    params = dict(model.named_parameters(remove_duplicate=False))
    saved: dict[int, tuple[torch.nn.Parameter, torch.Tensor]] = {}
    try:
        for name, tensor in state.items():
            p = params.get(name)
            if p is None or id(p) in saved:
                continue  # a buffer, or a weight tied to one already swapped
            if p.shape != tensor.shape:
                raise ValueError(f"kept weight {name} has shape {tuple(tensor.shape)}, the model's {tuple(p.shape)}")
            saved[id(p)] = (p, p.data)
            p.data = tensor.to(device=p.device, dtype=p.dtype)
        yield model
    finally:
        for p, data in saved.values():
            p.data = data


def selected_logit_tiles(learner: Any, part: Batch, chosen: torch.Tensor):
    """Yield ``(offset, logits)``: the float32 logits (the head's scale and soft-cap applied) of ``part``'s
    positions at ``chosen`` (``[rows, L-1]``), in order, tiles of at most
    :data:`~llmgym.agents.learner.CHUNK_ELEMENTS` logits, ``offset`` the tile's first selected position; the
    decoder stack runs once, under the learner's autocast. The one pass the screen's scores and the kept
    nucleus mass (:mod:`llmgym.agents.truncation`) share."""
    with learner.autocast():
        inputs, head, scale, softcap = head_inputs(learner.model, part.input_ids, part.attention_mask, chosen)
        vocab = int(head.weight.shape[0]) if head is not None else inputs.shape[-1]
        step = max(1, CHUNK_ELEMENTS // max(1, vocab))
        for s in range(0, inputs.shape[0], step):
            logits = (head(inputs[s:s + step]) if head is not None else inputs[s:s + step]).float()
            if scale != 1.0:
                logits = logits * scale
            if softcap:
                logits = torch.tanh(logits / softcap) * softcap
            yield s, logits


@torch.no_grad()
def token_scores(agent: Agent, batch: Batch, select: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(log π, H, E[(log π)²])`` of ``batch``'s tokens at ``select`` (``[N, L-1]`` each, 0 elsewhere) under the
    model's current weights at the sampling temperature: the decoder stack once, then the LM head over the
    selected positions in tiles of at most :data:`~llmgym.agents.learner.CHUNK_ELEMENTS` logits."""
    learner = agent.learner
    model, c = learner.model, learner.config
    t = c.temperature if c.temperature > 0 else 1.0
    out = [torch.zeros(batch.action_mask.shape, dtype=torch.float32, device=batch.action_mask.device)
           for _ in range(3)]
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
            targets = part.input_ids[:, 1:][chosen]
            parts = []
            for s, logits in selected_logit_tiles(learner, part, chosen):
                logp = torch.log_softmax(logits / t, dim=-1)
                p = logp.exp()
                plogp = torch.where(p > 0, p * logp, torch.zeros_like(p))
                picked = logp.gather(-1, targets[s:s + logits.shape[0], None]).squeeze(-1)
                parts.append(torch.stack([picked, -plogp.sum(-1), (plogp * logp).nan_to_num(0.0).sum(-1)], -1))
            both = torch.cat(parts)
            for k in range(3):
                out[k][rows] = out[k][rows].index_put((chosen,), both[:, k].to(out[k].device))
    finally:
        model.train(was_training)
    return tuple(out)


def screen(agent: Agent, batch: Batch, sampled: Batch | None = None) -> tuple[Batch | None, dict[str, float]]:
    """``batch`` as the step may use it, and the screen's metrics; ``None`` when no row is left.

    ``sampled``: every row the engine sampled for ``batch`` when the agent kept only some of them by their
    rewards (rejection sampling's winners, online DPO's pairs, DAPO's informative groups: the
    ``sampled_from`` its ``collect`` leaves on the batch). The samples are tested there, where they are still
    samples of the policy (a choice by reward is not); the kept rows are judged by their servers. A no-op
    (``batch`` itself, no metrics) for an engine without ``screen_batch`` (the learner's own engine, in this
    process, is trusted). See the module doc for the rules."""
    check = optional_member(getattr(agent, "engine", None), "screen_batch")
    if check is None or not batch.episodes or not getattr(agent, "screens_batches", True):
        return batch, {}
    full = sampled if sampled is not None and sampled.episodes else batch
    learner, version = agent.learner, agent.step_count
    mask = full.action_mask.bool()
    versions = full.policy_versions
    stale = (mask & (versions >= 0) & (versions < version) if versions is not None else torch.zeros_like(mask))
    kept = getattr(learner, "behaviour_weights", None) or {}
    unkept = stale & ~torch.isin(versions, torch.tensor(sorted(kept), dtype=torch.long, device=versions.device)) \
        if bool(stale.any()) else stale
    logprobs, entropy, second = token_scores(agent, full, (mask & ~stale) | unkept)
    checked = mask & ~stale
    for v in sorted({int(x) for x in versions[stale & ~unkept].tolist()}) if bool(stale.any()) else []:
        select = stale & (versions == v)
        with kept_weights(learner.model, kept[v]):
            scored = token_scores(agent, full, select)
        for mine, theirs in zip((logprobs, entropy, second), scored):
            mine.copy_(torch.where(select, theirs, mine))
        checked |= select
    head = learner.model.get_output_embeddings()
    vocab = int(head.weight.shape[0]) if head is not None else int(learner.model.config.get_text_config().vocab_size)
    temperature = learner.config.temperature if learner.config.temperature > 0 else 1.0
    trusted = check(full, TokenScores(logprobs, entropy, second, checked, vocab, temperature))
    # the rows of `batch` in `full` (the same episode objects; a row of `batch` that is not there is not trusted)
    where = {id(e): i for i, e in enumerate(full.episodes)}
    index = [where.get(id(e)) for e in batch.episodes]
    keep = [i is not None and bool(trusted[i]) for i in index]
    if bool(stale.any()):  # the learner's scores, never the server's report, are the stale tokens' π_behav
        rows, width = torch.tensor([i or 0 for i in index], device=mask.device), batch.action_mask.shape[1]
        ours = torch.where(stale, logprobs, full.old_logprobs)[rows][:, :width]
        batch = dataclasses.replace(batch, old_logprobs=ours)
    distrusted = {int(g) for g, ok in zip(batch.groups.tolist(), keep) if not ok}
    rows = [i for i, g in enumerate(batch.groups.tolist()) if int(g) not in distrusted]
    metrics = {"rows_dropped": float(len(batch) - len(rows)), "stale_tokens_unchecked": float(unkept.sum())}
    left = min(distributed.all_gather_ints(len(rows))) if distributed.is_distributed() else len(rows)
    if left == 0:  # every rank steps or none does (their collectives must match)
        return None, metrics
    return (batch if len(rows) == len(batch) else batch.select(rows)), metrics
