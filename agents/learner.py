"""The learner's step mechanics, shared by every algorithm: what happens between "here is a batch and a
loss" and "the weights moved".

An algorithm (``grpo.py``, ``ppo.py``, ...) defines advantages and a loss that read like its paper. This
module owns everything else about a step:

* **Chunked log-probs** (:func:`token_logprobs_and_entropy`): the model runs up to its final hidden
  states; the LM head, the log-softmax and the entropy are applied to ``chunk_size`` tokens at a time,
  only at the positions the loss reads (the action mask), by one autograd function with its own
  backward (:mod:`llmgym.agents.fused_head`) that recomputes each chunk's logits. The ``[N, L, V]``
  logits of the batch never exist and nothing of their size outlives the forward: peak memory is
  bounded by ``chunk_size × V``, not ``N × L × V``.
* **Micro-batches with gradient accumulation**: ``minibatch_size`` rows per optimiser step,
  ``micro_batch_size`` examples per forward/backward (an example is one completion, or the
  ``rows_per_example`` rows one loss term reads together: DPO's chosen and rejected pair). Every
  loss aggregation is a sum over examples divided by a batch constant (see
  ``llmgym.agents.functional.aggregate_loss``), so each micro-batch's loss is rescaled by
  ``count(micro) · world_size / count(minibatch, all ranks)`` — the same formula that already made
  data parallel exact — and the accumulated gradient is the minibatch's gradient.
* **Precision**: ``"fp32"``; ``"bf16-mixed"`` (bf16 autocast, float32 master weights and optimiser
  state); ``"bf16"`` (bf16 weights and optimiser state, the explicit low-memory choice).
* **Gradient checkpointing** (``transformers``' own, non-reentrant).
* **LoRA** through ``peft``: the adapters are injected into the model in place; the KL reference is
  the same model with its adapters disabled — no second copy of the weights.
* **Learning-rate schedule** with warm-up (``transformers.get_scheduler``), stepped once per update.
* **Data-parallel loss scaling** and the **importance-weight corrections**: the named off-policy
  corrections against the engine (``AgentConfig.correction``: TIS, MIS, GEO, IcePop; formulas in
  :mod:`llmgym.agents.functional`), and the decoupled correction of stale samples (tokens sampled by
  an older policy version, under :mod:`llmgym.agents.pipeline`; see :mod:`llmgym.agents.corrections`).

Example:
    >>> import torch
    >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
    >>> from llmgym.agents.learner import token_logprobs_and_entropy
    >>> tok = build_tokenizer()
    >>> model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64))
    >>> ids = torch.tensor([tok.encode("12+34=46")])
    >>> lp, ent, _ = token_logprobs_and_entropy(model, ids, torch.ones_like(ids), chunk_size=3)
    >>> full, _, _ = token_logprobs_and_entropy(model, ids, torch.ones_like(ids), chunk_size=0)
    >>> lp.shape, torch.allclose(lp, full, atol=1e-5)
    (torch.Size([1, 8]), True)
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.checkpoint import checkpoint

from llmgym.runtime import distributed
from llmgym.agents import functional as F
from llmgym.agents.corrections import (ImportanceWeightStats, resolve_correction, stale_token_mask,
                                       truncated_importance_weights)
from llmgym.agents.mismatch import MismatchMonitor, MismatchStats
from llmgym.agents.fused_head import TILE_ELEMENTS, head_logprobs_and_entropy, logit_transform
from llmgym.agents.shared_prefix import shared_prefix_hidden, shared_prefixes, supports_shared_prefixes
from llmgym.engines.base import optional_member
from llmgym.rollout.episodes import Batch
from llmgym.runtime.install import install_hint

if TYPE_CHECKING:  # pragma: no cover
    from llmgym.agents.base import Agent

__all__ = [
    "PRECISIONS",
    "LR_SCHEDULES",
    "ForwardOutput",
    "Learner",
    "token_logprobs_and_entropy",
    "resolve_device_defaults",
    "default_chunk_size",
    "CHUNK_ELEMENTS",
    "micro_batches",
    "head_inputs",
]

PRECISIONS = ("fp32", "bf16-mixed", "bf16")
"""``fp32``: float32 everywhere. ``bf16-mixed``: bf16 autocast over float32 weights and optimiser
state (TRL's default on a GPU). ``bf16``: bf16 weights and optimiser state (half the memory, coarser updates)."""

LR_SCHEDULES = ("constant", "linear", "cosine")
"""Learning-rate shapes after the warm-up (``transformers.get_scheduler`` names them
``constant_with_warmup``, ``linear``, ``cosine``); ``linear``/``cosine`` decay to 0 at ``lr_total_steps``."""


@dataclasses.dataclass
class ForwardOutput:
    """The learner's view of a (mini)batch: ``[N, L-1]`` tensors aligned with ``Batch``.

    ``logprobs`` and ``entropy`` are computed at the positions the loss reads (the action mask) and are
    0 elsewhere."""

    logprobs: torch.Tensor
    entropy: torch.Tensor
    values: torch.Tensor | None = None
    hidden: torch.Tensor | None = None  # last hidden states [N, L-1, H], when asked for


def resolve_device_defaults(device: str | None = None, precision: str | None = None,
                            engine_decode: str | None = None) -> dict[str, str]:
    """The settings a user expects on this machine, for the fields they left unset (``None`` / ``"auto"``).

    * ``device``: ``"cuda"`` when a CUDA GPU is visible, else ``"cpu"``;
    * ``precision``: ``"bf16-mixed"`` on a GPU that supports bf16 (autocast, float32 master weights —
      TRL's default), else ``"fp32"``;
    * ``engine_decode``: on a GPU the fastest mode a GPU run has passed, read from the committed record
      (:func:`llmgym.engines.gpu_record.default_gpu_decode`: a GPU-only path that has not passed on a
      GPU is never a default; today ``"static"``); on a CPU ``"static"`` (static KV cache,
      uncompiled: faster than the dynamic cache there, no compilation wait).

    The command line calls this before building the agent; an explicit value always wins.

    Example:
        >>> from llmgym.agents.learner import resolve_device_defaults
        >>> resolve_device_defaults(device="cpu")
        {'device': 'cpu', 'precision': 'fp32', 'engine_decode': 'static'}
        >>> resolve_device_defaults(device="cpu", precision="bf16-mixed")["precision"]
        'bf16-mixed'
    """
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    on_gpu = torch.device(device).type == "cuda"
    if precision in (None, "auto"):
        precision = "bf16-mixed" if on_gpu and torch.cuda.is_bf16_supported() else "fp32"
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS} or 'auto', got {precision!r}")
    if engine_decode in (None, "auto"):
        from llmgym.engines.gpu_record import default_gpu_decode

        engine_decode = default_gpu_decode() if on_gpu else "static"
    return {"device": str(device), "precision": precision, "engine_decode": engine_decode}


# ------------------------------------------------------------------------------------------------
# chunked log-probs
# ------------------------------------------------------------------------------------------------


def _core_model(model: torch.nn.Module) -> torch.nn.Module:
    """The ``transformers`` model under DDP and peft wrappers (the one that owns the LM head)."""
    model = getattr(model, "module", model)  # DistributedDataParallel
    get_base = getattr(model, "get_base_model", None)  # peft.PeftModel
    return get_base() if callable(get_base) else model


CHUNK_ELEMENTS = TILE_ELEMENTS
"""Logits per LM-head tile (64 MiB in float32): ``chunk_size`` tokens × ``CHUNK_ELEMENTS // chunk_size``
vocabulary entries (see :mod:`llmgym.agents.fused_head`)."""


def default_chunk_size(vocab_size: int) -> int:
    """Tokens per LM-head chunk for a vocabulary: tiles of :data:`CHUNK_ELEMENTS` logits that span the
    whole vocabulary up to 8,192 entries (2,048 tokens × 8,192 entries at a 151,936-token vocabulary;
    the whole batch of a small vocabulary in one tile).

    Example:
        >>> default_chunk_size(151_936), default_chunk_size(512)
        (2048, 32768)
    """
    return max(1, CHUNK_ELEMENTS // max(1, min(vocab_size, 8192)))


def _head_chunk(head: torch.nn.Module, temperature: float, scale: float, softcap: float | None,
                hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``[K, 2]``: log π and H for ``[K, H]`` hidden states through any head module (the fallback of
    :func:`~llmgym.agents.fused_head.head_logprobs_and_entropy` for heads that are not a plain
    ``nn.Linear``, e.g. a LoRA-wrapped one).

    One output, not two: checkpointed, a chunk whose entropy the loss never reads would keep the
    entropy's recomputed ``[K, V]`` tensors alive until the graph dies (backward never unpacks them)."""
    logits = head(hidden).float()
    if scale != 1.0:  # the model's logit multiplier (Cohere, Granite, ...)
        logits = logits * scale
    if softcap:  # Gemma-2 style final-logit soft-capping, as the model's own forward applies it
        logits = torch.tanh(logits / softcap) * softcap
    logp = torch.log_softmax(logits / temperature if temperature != 1.0 else logits, dim=-1)
    picked = logp.gather(-1, targets.long()[:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return torch.stack([picked, entropy], dim=-1)


def _backbone(model: torch.nn.Module) -> torch.nn.Module | None:
    """The decoder stack under the LM head (``base_model``: its ``last_hidden_state`` is the head's normed
    input), called without the head so no logits at all are computed in the forward; ``None`` where the
    model must be called whole (under DDP, whose gradient hooks are armed by its own forward)."""
    if hasattr(model, "module"):  # DistributedDataParallel
        return None
    core = _core_model(model)
    base = getattr(core, "base_model", None)
    return base if base is not None and base is not core else None


def _position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Each token's position: ``[1, L]`` (``0 … L-1``, shared by every row) when every row is right-padded
    (the positions of its tokens are then the same in each row), ``[N, L]`` (counted from each row's
    first token) otherwise. One row of positions makes one row of rotary ``cos``/``sin`` that every
    layer saves for backward, not ``N``: 8 MiB less at 32 × 537 tokens of a 64-wide head.

    Example:
        >>> import torch
        >>> _position_ids(torch.tensor([[1, 1, 0], [1, 1, 1]])).tolist()
        [[0, 1, 2]]
        >>> _position_ids(torch.tensor([[0, 1, 1], [1, 1, 1]])).tolist()  # left padding: per row
        [[0, 0, 1], [0, 1, 2]]
    """
    width = attention_mask.shape[-1]
    columns = torch.arange(width, device=attention_mask.device)
    if bool((attention_mask.bool() == (columns < attention_mask.sum(-1, keepdim=True))).all()):
        return columns[None]
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    return "logits_to_keep" in inspect.signature(_core_model(model).forward).parameters


def token_logprobs_and_entropy(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
    chunk_size: int = 1024,
    with_hidden: bool = False,
    share_prefixes: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Teacher-forced ``log π(x_{t+1} | x_≤t)`` and the entropy ``H_t`` of the tempered policy, ``[N, L-1]``.

    Formulas (``z = W_head h_t / T``): ``log π = z[x_{t+1}] − logsumexp(z)``, ``H = logsumexp(z) − Σ_v p_v z_v``.

    With ``chunk_size > 0`` the decoder stack under the head is run (``model.base_model``; under DDP
    the whole model with ``logits_to_keep=1`` and ``output_hidden_states``): its last hidden state
    is the normed input of the LM head. Then the head is applied to the
    selected positions ``chunk_size`` tokens at a time (in vocabulary tiles of
    :data:`CHUNK_ELEMENTS` logits) by :func:`~llmgym.agents.fused_head.head_logprobs_and_entropy`,
    whose backward recomputes each tile's logits: nothing of the ``[K, V]`` logits' size is kept
    between forward and backward (another head module than ``nn.Linear`` gets its own autograd, in
    chunks of at most :data:`CHUNK_ELEMENTS` logits, each checkpointed).
    The model's own transform of the head's output (a logit scale, a soft-cap) is applied as its
    forward applies it (:func:`~llmgym.agents.fused_head.logit_transform`, checked once per model
    against its own logits). ``chunk_size = 0`` (or a model without ``logits_to_keep``, or one whose
    logits the chunked head cannot reproduce) takes the plain path: full ``[N, L-1, V]`` logits.

    Args:
        model: a ``transformers`` causal LM (possibly wrapped in DDP or peft).
        input_ids, attention_mask: ``[N, L]`` (padding on either side).
        temperature: the sampling temperature (``0`` = greedy, scored as ``1``).
        mask: ``[N, L-1]`` positions to compute (default: all); others are 0 in the outputs.
        chunk_size: tokens per LM-head chunk.
        with_hidden: also return the last hidden states ``[N, L-1, H]`` (for a value head).
        share_prefixes: run rows that start alike (a group's prompt) through their common start once
            (:mod:`llmgym.agents.shared_prefix`; the chunked path, without ``with_hidden``, when it
            saves at least an eighth of the batch's tokens). Only for a model
            :func:`~llmgym.agents.shared_prefix.supports_shared_prefixes` accepts.

    Returns:
        ``(logprobs, entropy, hidden_or_None)``.

    Example:
        >>> import torch
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> tok = build_tokenizer()
        >>> model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64))
        >>> ids = torch.tensor([tok.encode("ab"), tok.encode("cd")])
        >>> lp, ent, _ = token_logprobs_and_entropy(model, ids, torch.ones_like(ids), mask=torch.tensor([[0, 1], [0, 0]]))
        >>> lp[0, 0].item(), lp[1].tolist(), bool(lp[0, 1] < 0)
        (0.0, [0.0, 0.0], True)
    """
    t = temperature if temperature > 0 else 1.0
    positions = _position_ids(attention_mask)
    targets = input_ids[:, 1:]
    chunked = chunk_size and chunk_size > 0 and _accepts_logits_to_keep(model)
    transform = logit_transform(_core_model(model)) if chunked else None
    if transform is None:  # full logits (the reference path; also the fallback for exotic models)
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                    output_hidden_states=with_hidden, use_cache=False)
        logits = out.logits[:, :-1].float() / t
        logprobs, entropy = F.logprobs_from_logits(logits, targets), F.entropy_from_logits(logits)
        if mask is not None:
            keep = mask.bool()
            logprobs = torch.where(keep, logprobs, torch.zeros_like(logprobs))
            entropy = torch.where(keep, entropy, torch.zeros_like(entropy))
        return logprobs, entropy, (out.hidden_states[-1][:, :-1] if with_hidden else None)

    select = torch.ones_like(targets, dtype=torch.bool) if mask is None else mask.bool()
    split = shared_prefixes(input_ids, attention_mask, select) if share_prefixes and not with_hidden else None
    hidden = None
    backbone = _backbone(model)
    if split is not None and backbone is not None and 8 * split.saved_tokens >= int(attention_mask.sum()):
        picked_hidden = shared_prefix_hidden(backbone, split, select)  # [K, H]
    else:
        # use_cache=False: a training forward has no use for a KV cache of the whole batch (TRL passes it too)
        if backbone is not None:
            hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                              use_cache=False).last_hidden_state[:, :-1]
        else:  # the whole model: one position's logits, and every layer's hidden states (the last is the head's input)
            out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                        output_hidden_states=True, logits_to_keep=1, use_cache=False)
            hidden = out.hidden_states[-1][:, :-1]
            del out  # its [N, 1, V] logits' graph holds the head's weights (a bf16 copy of them under autocast)
        picked_hidden = hidden[select]  # [K, H]
    picked_targets = targets[select]
    core = _core_model(model)
    head = core.get_output_embeddings()
    scale, softcap = transform
    if type(head) is torch.nn.Linear and type(head.weight) is torch.nn.Parameter:
        lp, ent = head_logprobs_and_entropy(picked_hidden, head.weight, head.bias, picked_targets, temperature=t,
                                            scale=scale, softcap=softcap, chunk_size=chunk_size)
    else:  # another head module (LoRA on the head, ...): its own autograd, chunks of whole-vocabulary
        # rows (no more logits per chunk than a tile has), each checkpointed
        rows = max(1, min(chunk_size, CHUNK_ELEMENTS // max(1, core.config.get_text_config().vocab_size)))
        lp, ent = _module_head_logprobs(head, picked_hidden, picked_targets, t, scale, softcap, rows)
    logprobs = torch.zeros(targets.shape, dtype=torch.float32, device=input_ids.device).index_put((select,), lp)
    entropy = torch.zeros(targets.shape, dtype=torch.float32, device=input_ids.device).index_put((select,), ent)
    return logprobs, entropy, (hidden if with_hidden else None)


@torch.no_grad()
def head_inputs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                select: torch.Tensor) -> tuple[torch.Tensor, torch.nn.Module | None, float, float | None]:
    """``(inputs, head, scale, softcap)`` for a no-grad scoring pass over the positions ``select`` (``[N, L-1]``):
    the LM head's inputs there ``[K, H]`` (the decoder stack's last hidden state) with the head module and the
    model's logit transform (``logits = softcap·tanh(scale·head(inputs) / softcap)``), or — for a model the
    chunked head cannot reproduce — the model's own logits ``[K, V]`` with ``head=None``, ``scale=1``.

    Example:
        >>> import torch
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> model = build_tiny_model(build_tokenizer(), TinyModelConfig(hidden_size=32, num_layers=1))
        >>> ids = torch.tensor([[1, 5, 6, 7]])
        >>> inputs, head, scale, softcap = head_inputs(model, ids, torch.ones_like(ids), torch.tensor([[0, 1, 1]]))
        >>> tuple(inputs.shape), head is model.lm_head, scale, softcap
        ((2, 32), True, 1.0, None)
    """
    positions = _position_ids(attention_mask)
    # FSDP reshards the head after the forward (as in Learner.forward): the model's own logits there
    whole = distributed.is_fsdp_module(model) or not _accepts_logits_to_keep(model)
    backbone = None if whole else _backbone(model)
    core = _core_model(model)
    transform = logit_transform(core) if backbone is not None else None
    if transform is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                       use_cache=False).logits[:, :-1]
        return logits[select.bool()], None, 1.0, None
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                      use_cache=False).last_hidden_state[:, :-1]
    return hidden[select.bool()], core.get_output_embeddings(), transform[0], transform[1]


def _module_head_logprobs(head, hidden, targets, temperature, scale, softcap, chunk_size):
    """log π and H through ``head``'s own forward, ``chunk_size`` tokens at a time, each chunk
    recomputed in backward (unless one chunk holds everything: recomputing would save nothing)."""
    fn = functools.partial(_head_chunk, head, temperature, scale, softcap)
    recompute = torch.is_grad_enabled() and targets.shape[0] > chunk_size
    parts = [checkpoint(fn, hidden[s:s + chunk_size], targets[s:s + chunk_size], use_reentrant=False) if recompute
             else fn(hidden[s:s + chunk_size], targets[s:s + chunk_size]) for s in range(0, targets.shape[0], chunk_size)]
    both = torch.cat(parts) if parts else hidden.new_zeros((0, 2), dtype=torch.float32)
    return both[:, 0], both[:, 1]


def micro_batches(batch: Batch, size: int | None, rows_per_example: int = 1) -> list[Batch]:
    """``batch`` split into consecutive parts of ``size`` examples (one part when ``size`` is ``None`` or large).

    An example is ``rows_per_example`` consecutive rows that one loss term reads together (DPO: a
    chosen and a rejected completion); a part never splits one. Parts keep the batch's full width
    (trailing padding columns), so a loss whose normaliser is the padded length sees the same
    constant in every part.

    Example:
        >>> import torch
        >>> from llmgym.rollout.episodes import Batch, Episode
        >>> from llmgym import Task
        >>> ep = Episode(Task("p"), 0, [1, 5, 6, 2], [0, 0, 1, 1], [0, 0, -0.5, -0.1], [0, 0, 0, 1.0], 2)
        >>> [len(b) for b in micro_batches(Batch.from_episodes([ep] * 5), 2)]
        [2, 2, 1]
        >>> [len(b) for b in micro_batches(Batch.from_episodes([ep] * 6), 1, rows_per_example=2)]  # pairs
        [2, 2, 2]
    """
    if len(batch) % rows_per_example:
        raise ValueError(f"a batch of {len(batch)} rows cannot hold whole examples of {rows_per_example} rows")
    rows = None if size is None else size * rows_per_example
    if rows is None or rows >= len(batch):
        return [batch]
    return [batch.select(range(s, min(s + rows, len(batch)))) for s in range(0, len(batch), rows)]


# ------------------------------------------------------------------------------------------------
# the learner
# ------------------------------------------------------------------------------------------------


def _lora_config(config, model):
    try:
        import peft
    except ImportError as err:  # pragma: no cover - peft is in the dev environment
        raise ImportError(f"LoRA (lora_r > 0) needs peft: {install_hint('peft')}") from err
    return peft, peft.LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha if config.lora_alpha is not None else 2 * config.lora_r,
        lora_dropout=config.lora_dropout,
        target_modules=config.lora_target_modules,
        task_type="CAUSAL_LM",
    )


class Learner:
    """Owns the model's training-side state for an :class:`~llmgym.agents.base.Agent`.

    Built by the agent; applies the config's precision, gradient checkpointing and LoRA to ``model``
    (in place: an engine over the same object keeps sampling the current policy), provides the
    reference policy, and runs :meth:`update`'s loop of minibatches and micro-batches.

    Attributes:
        model: the trained model (LoRA layers injected in place when ``lora_r > 0``).
        peft_model: the ``peft`` wrapper (``None`` without LoRA); its ``disable_adapter()`` gives the
            reference policy.
        ref_model: a frozen copy for the KL reference, only when ``kl_coef > 0`` and no LoRA.

    Example:
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.agents import GRPO
        >>> model, tok = load_model("tiny")
        >>> agent = GRPO(model, tok, lora_r=4, kl_coef=0.04)
        >>> agent.ref_model is None and agent.learner.has_reference  # the reference is the base model
        True
        >>> 0 < sum(p.numel() for p in agent.parameters()) < sum(p.numel() for p in model.parameters())
        True
    """

    def __init__(self, model: torch.nn.Module, config, rows_per_example: int = 1):
        self.config = config
        self.rows_per_example = rows_per_example  # rows a micro-batch never splits (DPO: 2, a pair)
        self.device = next(model.parameters()).device
        self.peft_model = None
        if config.precision == "bf16":
            model.to(torch.bfloat16)
        if config.gradient_checkpointing:
            if not getattr(model, "supports_gradient_checkpointing", False):
                raise ValueError(f"{type(model).__name__} does not support gradient checkpointing "
                                 f"(gradient_checkpointing=True); turn it off")
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x's name
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if config.lora_r > 0:
            peft, lora = _lora_config(config, model)
            # get_peft_model injects the adapters into `model` itself (and freezes its weights); their
            # random init is drawn from a generator seeded by the config: same seed, same run
            devices = [self.device] if self.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
                # peft reads transformers' deprecated `is_gradient_checkpointing`: its FutureWarning is not ours
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                torch.manual_seed(config.seed)
                self.peft_model = peft.get_peft_model(model, lora)
        self.model = model
        self.has_reference = config.kl_coef > 0
        self.ref_model = self._frozen_copy(model) if self.has_reference and self.peft_model is None else None
        self.scheduler = None
        self._dp_module = None  # DDP/FSDP view of the model, built at the first data-parallel update
        self._check_logprobs = None  # the engine's check of its reported log-probs (a fleet's), per update
        self.behaviour_weights: dict[int, dict[str, torch.Tensor]] = {}
        """Kept weights of the versions that sampled stale tokens (the pipelined learner fills it for an engine
        with ``screen_batch``): those tokens are scored under them (:mod:`llmgym.agents.screening`)."""
        self.correct_staleness = True
        """Reweight stale tokens (see :meth:`importance_corrected`); off only to measure what the correction does."""
        self.share_prefixes = True
        """Run a group's common prompt through the model once per forward (:mod:`llmgym.agents.shared_prefix`;
        where :func:`~llmgym.agents.shared_prefix.supports_shared_prefixes` allows); off to compare."""
        self._mismatch: MismatchStats | None = None
        self.mismatch_monitor = MismatchMonitor(getattr(config, "mismatch_kl_warn", None),
                                                getattr(config, "mismatch_prob_error_warn", None))
        """Warns when an update's sampler-vs-learner mismatch passes its threshold (:mod:`llmgym.agents.mismatch`)."""

    @staticmethod
    def _frozen_copy(model):
        ref = copy.deepcopy(model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    # -- precision ---------------------------------------------------------------------------------
    def autocast(self):
        """The autocast context of the forward pass (a no-op unless ``precision == "bf16-mixed"``).

        Without autocast's weight cache: the cache keeps the bf16 copy of every weight until the
        outermost autocast block exits, i.e. from the forward through the loss (0.94 GiB for the
        Qwen2-0.5B shape: two thirds of what the checkpointed forward held on the H100). A training
        forward uses each weight once (gradient checkpointing recasts in backward either way), so
        the cache saves no work; what backward needs, autograd saves itself."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.precision == "bf16-mixed",
                              cache_enabled=False)

    # -- optimiser and schedule --------------------------------------------------------------------
    def make_optimizer(self, params) -> torch.optim.Optimizer:
        """AdamW, fused where every parameter allows it (plain CPU/CUDA float tensors).

        The fused kernel is what TRL's trainer uses (``transformers``' ``adamw_torch_fused``): one
        pass over each tensor instead of ~8 elementwise ones (a 10M model's step spent ~3× longer in
        the for-loop AdamW on a CPU), and no parameter-sized temporaries (CUDA's default foreach
        AdamW allocates one, ``sqrt(v)``: +4 bytes per parameter at the optimiser step). Sharded
        (DTensor) parameters keep torch's default implementation."""
        c = self.config
        params = list(params)
        fused = bool(params) and all(
            type(p.data) is torch.Tensor and p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
        return torch.optim.AdamW(params, lr=c.lr, weight_decay=c.weight_decay, **({"fused": True} if fused else {}))

    def make_scheduler(self, optimizer):
        """``transformers.get_scheduler`` for the config's schedule; ``None`` for a constant lr without warm-up."""
        c = self.config
        if c.lr_schedule == "constant" and c.lr_warmup_steps == 0:
            return None
        from transformers import get_scheduler

        name = "constant_with_warmup" if c.lr_schedule == "constant" else c.lr_schedule
        return get_scheduler(name, optimizer, num_warmup_steps=c.lr_warmup_steps,
                             num_training_steps=c.lr_total_steps)

    # -- forward passes ----------------------------------------------------------------------------
    def forward(self, batch: Batch, model=None, with_hidden: bool = False, mask: torch.Tensor | None = None) -> ForwardOutput:
        """Log-probs and entropy of ``batch``'s tokens (chunked; at ``mask``, default the action mask)."""
        c = self.config
        model = model if model is not None else self.model
        if distributed.is_fsdp_module(model):
            chunk = 0  # FSDP2 reshards the head's weights after forward: apply it inside the forward
        else:
            chunk = c.logits_chunk_size
            if chunk is None:
                head = _core_model(model).get_output_embeddings()
                chunk = default_chunk_size(head.weight.shape[0] if head is not None else 1)
        share = self.share_prefixes and supports_shared_prefixes(model)
        with self.autocast():
            logprobs, entropy, hidden = token_logprobs_and_entropy(
                model, batch.input_ids, batch.attention_mask, temperature=c.temperature,
                mask=batch.action_mask if mask is None else mask, chunk_size=chunk, with_hidden=with_hidden,
                share_prefixes=share)
        return ForwardOutput(logprobs, entropy, hidden=hidden)

    @contextlib.contextmanager
    def reference_policy(self):
        """The model to score the KL reference with: the frozen copy, or the base model (adapters off)."""
        if self.ref_model is not None:
            yield self.ref_model
        elif self.peft_model is not None:
            with self.peft_model.disable_adapter():
                yield self.model
        else:
            raise RuntimeError("no reference policy: kl_coef is 0")

    # -- the update loop ---------------------------------------------------------------------------
    def update(self, agent: "Agent", batch: Batch) -> dict[str, float]:
        """``update_epochs`` passes of minibatches; each minibatch is one optimiser step over its
        micro-batches' accumulated gradients. ``batch`` is prepared (advantages filled)."""
        c = self.config
        parallel = distributed.is_distributed()
        size = self.local_minibatch_size(len(batch)) if parallel else (c.minibatch_size or len(batch))
        if agent.uses_values and c.loss_agg != "token-mean" and (
                parallel or (c.micro_batch_size or size) < size):
            raise ValueError("PPO with micro-batches or data parallel needs loss_agg='token-mean' (its value loss "
                             "is token-mean; one loss scale must fit both terms)")
        # one step on the whole batch: the current log-probs detached are π_old exactly (ratio 1)
        on_policy = c.update_epochs == 1 and size >= len(batch)
        learner = self.data_parallel_module(agent) if parallel else None  # None: self.model
        sums: dict[str, float] = {}
        steps = 0
        lr = float(agent.optimizer.param_groups[0]["lr"])  # this update's (the scheduler steps after it)
        self.model.train()
        tis_stats: dict[str, float] = {}
        # tokens tagged with the policy version that sampled them (the pipelined learner): the
        # staleness correction applies to those older than the weights about to be updated
        # (is_weight_clip_frac counts weights at the cap: tis_cap, or the chosen correction's upper bound)
        weight_stats = ImportanceWeightStats(resolve_correction(c)[2]) if batch.policy_versions is not None else None
        version = agent.step_count
        stale = batch.policy_versions is not None and bool(
            stale_token_mask(batch.policy_versions, version, batch.action_mask).any())
        # an engine that cannot be taken at its word (a fleet of rollout servers) checks the log-probs it
        # reported against the learner's, which the update computes anyway (before any optimiser step)
        engine = getattr(agent, "engine", None)  # None: an agent that samples nothing (DPO's pairs)
        screened = engine is not None and optional_member(engine, "screen_batch") is not None  # checked already
        self._check_logprobs = None if engine is None or screened else optional_member(engine, "check_logprobs")
        self._start_mismatch(agent, engine)
        corrected = resolve_correction(c)[0] is not None
        if not on_policy and (corrected or c.precision != "fp32" or weight_stats is not None
                              or self._check_logprobs is not None):
            # π_old (the proximal policy) from the learner itself, once, before the first optimiser step:
            # the engine's log-probs carry its own kernels and precision, and stale weights
            learner_logprobs = self.learner_logprobs(batch)
            self._measure_mismatch(learner_logprobs, batch, version)
            if self._check_logprobs is not None:
                self._check_logprobs(batch, learner_logprobs, version)
            batch, tis_stats = self.importance_corrected(batch, learner_logprobs, version, weight_stats)
        for _ in range(c.update_epochs):
            for mb in (batch.minibatches(size, agent.minibatch_generator) if size < len(batch) else [batch]):
                stats = self._accumulate(agent, mb, learner, on_policy, tis_stats, parallel, version, weight_stats)
                if parallel:
                    distributed.average_gradients(agent.extra_parameters())
                if c.max_grad_norm is not None:
                    stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(agent.parameters(), c.max_grad_norm))
                agent.optimizer.step()
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                steps += 1
        # gradients are dead weight until the next backward: free them now, not at the next update's
        # zero_grad, so the rollout in between does not hold a parameter-sized copy (TRL's trainer
        # does the same)
        agent.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        metrics = {k: v / steps for k, v in sums.items()}
        metrics["lr"] = lr
        if weight_stats is not None:
            metrics.update(weight_stats.result())
            metrics["is_corrected"] = float(corrected or (stale and self.correct_staleness))
        mismatch = self._finish_mismatch(version + 1)
        metrics = distributed.all_reduce_mean(metrics) if parallel else metrics
        metrics.update(mismatch)
        return metrics

    def loss_count(self, agent: "Agent", mb: Batch) -> float:
        """The loss's denominator count of ``mb``: policy tokens for ``token-mean``, rows otherwise."""
        if self.config.loss_agg == "token-mean":
            return float(agent.loss_mask(mb).float().sum())
        return float(len(mb))

    def _accumulate(self, agent, mb: Batch, learner, on_policy: bool, tis_stats, parallel: bool, version: int = 0,
                    weight_stats: ImportanceWeightStats | None = None) -> dict[str, float]:
        """Forward/backward each micro-batch of ``mb``; gradients add up to ``mb``'s gradient.

        A micro-batch's loss is multiplied by ``count(micro) · world / count(mb over all ranks)``: every
        aggregation mode is a sum over rows divided by such a count, so the sum of the scaled losses is
        the loss of the minibatch (and, after DDP's averaging, of the global minibatch).
        """
        c = self.config
        world = distributed.world_size() if parallel else 1
        local_total = self.loss_count(agent, mb)
        total = distributed.all_reduce_sum(local_total) if parallel else local_total
        agent.optimizer.zero_grad(set_to_none=True)
        stats_sum: dict[str, float] = {}
        loss_sum = 0.0
        parts = micro_batches(mb, c.micro_batch_size, self.rows_per_example)
        real = len(parts)
        if parallel:
            # every rank runs as many forward/backward passes as the busiest one (DDP and FSDP
            # communicate in each); a rank with fewer rows repeats one row at loss weight 0
            parts += [mb.select(range(self.rows_per_example))] * (max(distributed.all_gather_ints(real)) - real)
        for i, micro in enumerate(parts):
            padding = i >= real
            count = 0.0 if padding else self.loss_count(agent, micro)
            scale = count * world / total if total > 0 else 0.0
            share = 0.0 if padding else count / local_total if local_total > 0 else len(micro) / len(mb)
            with self.autocast():
                out = agent.forward(micro, model=learner, with_values=agent.uses_values)
            if on_policy:
                if not padding:
                    self._measure_mismatch(out.logprobs, micro, version)
                if self._check_logprobs is not None and not padding:
                    self._check_logprobs(micro, out.logprobs.detach(), version)
                if (resolve_correction(c)[0] is not None or weight_stats is not None) and not padding:
                    micro, tis_stats = self.importance_corrected(micro, out.logprobs.detach(), version, weight_stats)
                micro = dataclasses.replace(micro, old_logprobs=out.logprobs.detach())
            with self.autocast():
                loss, stats = agent.loss(micro, out)
            stats.update(tis_stats)
            loss = loss * scale
            del out, micro  # the forward's [N, L-1] outputs: what backward needs, its graph keeps
            # data parallel: gradients are reduced once, at the last micro-batch
            with _gradient_sync(learner, enabled=i == len(parts) - 1):
                loss.backward()
            loss_sum += float(loss.detach())
            for k, v in stats.items():
                stats_sum[k] = stats_sum.get(k, 0.0) + share * float(v)
        stats_sum["loss"] = loss_sum
        return stats_sum

    # -- the sampler-vs-learner mismatch (llmgym.agents.mismatch): only a batch of the engine's samples has
    # a sampler to compare; counted where the learner has its own log-probs before the first optimiser step
    def _start_mismatch(self, agent: "Agent", engine) -> None:
        self._mismatch = MismatchStats() if engine is not None and getattr(agent, "screens_batches", True) else None

    def _measure_mismatch(self, learner_logprobs: torch.Tensor, batch: Batch, version: int) -> None:
        if self._mismatch is not None:
            self._mismatch.add_batch(learner_logprobs, batch, version)

    def _finish_mismatch(self, step: int) -> dict[str, float]:
        stats, self._mismatch = self._mismatch, None
        return {} if stats is None else self.mismatch_monitor.finish(stats, step)

    # -- data parallel ------------------------------------------------------------------------------
    def data_parallel_module(self, agent: "Agent"):
        """The DDP view of the model (built at the first data-parallel update); an FSDP model as it is."""
        if self._dp_module is None:
            if agent.uses_values and self.config.loss_agg != "token-mean":
                raise ValueError("data-parallel PPO needs loss_agg='token-mean' (its value loss is token-mean; "
                                 "one loss scale must fit both terms)")
            self._dp_module = (self.model if distributed.is_fsdp_module(self.model)
                               else distributed.wrap_ddp(self.model))
            distributed.broadcast_parameters(agent.extra_parameters())
        return self._dp_module

    def local_minibatch_size(self, local_len: int) -> int:
        """This rank's share of the (global) ``minibatch_size``."""
        c = self.config
        if c.minibatch_size is None:
            return local_len
        world = distributed.world_size()
        if c.minibatch_size % world:
            raise ValueError(f"minibatch_size ({c.minibatch_size}) is global under data parallel: make it a "
                             f"multiple of the number of processes ({world})")
        sizes = distributed.all_gather_ints(local_len)
        if len(set(sizes)) > 1 and c.minibatch_size // world < max(sizes):
            raise ValueError(f"minibatches under data parallel need equal per-rank batches (got {sizes}): "
                             f"make tasks_per_step a multiple of the number of processes")
        return c.minibatch_size // world

    # -- truncated importance sampling (engine/learner mismatch) -----------------------------------
    @torch.no_grad()
    def learner_logprobs(self, batch: Batch) -> torch.Tensor:
        """The learner's log-probs of ``batch`` with the current weights, micro-batch by micro-batch."""
        c = self.config
        if c.micro_batch_size is not None:
            parts = micro_batches(batch, c.micro_batch_size, self.rows_per_example)
        else:
            parts = micro_batches(batch, c.minibatch_size)
        return torch.cat([self.forward(part).logprobs for part in parts], dim=0)

    def importance_corrected(self, batch: Batch, learner_logprobs: torch.Tensor, version: int = 0,
                             weight_stats: ImportanceWeightStats | None = None) -> tuple[Batch, dict[str, float]]:
        """``batch`` with its advantages scaled by the importance weights and the learner's log-probs as
        π_old (a new :class:`Batch`; ``batch`` itself is left as it was), and the correction's stats.

        ``batch.old_logprobs`` holds the engine's generation-time log-probs (π_behav) on entry;
        ``learner_logprobs`` are the learner's of the same tokens before the update (π_prox). With a
        correction (``AgentConfig.correction``: ``tis-token``, ``tis-seq``, ``mis``, ``geo``, ``icepop``;
        :func:`~llmgym.agents.functional.correction_weights`) its weight of the ratio π_prox / π_behav
        multiplies the advantage of every token (the engine/learner gap and the staleness are one
        ratio), and its shares truncated and masked are returned as stats. Without one, the stale
        tokens only (sampled by a policy version older than ``version``; see
        :mod:`llmgym.agents.corrections`) get ``min(π_prox / π_behav, tis_cap)``, unless
        ``correct_staleness`` is off. Scaling the advantage by ``w ≥ 0`` multiplies the per-token
        policy-gradient loss by ``w`` in every surrogate (plain, clipped, dual-clip, GSPO; ``w = 0``
        removes the token's policy gradient). π_old becomes π_prox with a correction, reduced
        precision, or stale tokens; otherwise the engine's log-probs stay (the synchronous fp32 update,
        unchanged). ``weight_stats`` receives the weights (applied or not: 1 on tokens the correction
        leaves alone).
        """
        c = self.config
        mask = batch.action_mask
        name, low, high = resolve_correction(c)
        stale = (stale_token_mask(batch.policy_versions, version, mask) if batch.policy_versions is not None
                 else torch.zeros_like(mask, dtype=torch.bool))
        stats: dict[str, float] = {}
        if name is not None:
            log_ratio = F.importance_log_ratio(learner_logprobs, batch.old_logprobs, mask)
            applied, shares = F.correction_weights(name, log_ratio, mask, low, high)
            applied = applied.to(learner_logprobs.dtype)
            stats = {k: float(v) for k, v in shares.items()}
        else:
            weights = truncated_importance_weights(learner_logprobs, batch.old_logprobs, mask, "token", c.tis_cap)
            applied = torch.where(stale, weights, torch.ones_like(weights))
        if weight_stats is not None:
            weight_stats.add(applied, learner_logprobs - batch.old_logprobs, mask)
        advantages, old_logprobs = batch.advantages, batch.old_logprobs
        if name is not None or (self.correct_staleness and bool(stale.any())):
            advantages = (advantages[:, None] if advantages.dim() == 1 else advantages) * applied
        if name is not None or c.precision != "fp32" or bool(stale.any()):
            old_logprobs = learner_logprobs
        return dataclasses.replace(batch, advantages=advantages, old_logprobs=old_logprobs), stats

    # -- checkpoints ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict() if self.scheduler is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])


@contextlib.contextmanager
def _gradient_sync(module, enabled: bool):
    """Skip DDP's/FSDP's gradient reduction in this backward unless ``enabled`` (a no-op otherwise)."""
    if module is None or enabled:
        yield
    elif hasattr(module, "set_requires_gradient_sync"):  # FSDP2
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)
    elif hasattr(module, "no_sync"):  # DDP, FSDP1
        with module.no_sync():
            yield
    else:
        yield


def check_learner_config(config) -> None:
    """Validate the learner fields of an ``AgentConfig`` (called from its ``__post_init__``)."""
    if config.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {config.precision!r}")
    if config.micro_batch_size is not None and config.micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1 or None, got {config.micro_batch_size}")
    if config.minibatch_size is not None and config.minibatch_size < 1:
        raise ValueError(f"minibatch_size must be >= 1 or None, got {config.minibatch_size}")
    if config.logits_chunk_size is not None and config.logits_chunk_size < 0:
        raise ValueError(f"logits_chunk_size must be >= 0 (0 = full logits), got {config.logits_chunk_size}")
    if config.lora_r < 0:
        raise ValueError(f"lora_r must be >= 0 (0 = no LoRA), got {config.lora_r}")
    if config.lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {config.lr_schedule!r}")
    if config.lr_warmup_steps < 0:
        raise ValueError(f"lr_warmup_steps must be >= 0, got {config.lr_warmup_steps}")
    if config.lr_schedule != "constant" and not (config.lr_total_steps and config.lr_total_steps > 0):
        raise ValueError(f"lr_schedule={config.lr_schedule!r} decays to 0 at lr_total_steps: set lr_total_steps "
                         f"(the number of updates, e.g. the run's --steps)")


__all__ += ["check_learner_config"]
