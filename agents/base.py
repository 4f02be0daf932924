"""What every agent shares: acting, collecting rollouts, the training loop, checkpoints. An algorithm
subclasses :class:`Agent` and writes two things that read like its paper:
:meth:`Agent.compute_advantages` and :meth:`Agent.loss`. The step mechanics (chunked log-probs,
micro-batches, precision, checkpointing, LoRA, data-parallel loss scaling, TIS) live in
:mod:`llmgym.agents.learner`.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import math
import time
from typing import Any, Callable, Iterable

import gymnasium as gym
import numpy as np
import torch

from llmgym.agents import functional as F
from llmgym.agents.corrections import resolve_correction
from llmgym.agents.mismatch import MISMATCH_KL_WARN, MISMATCH_PROB_ERROR_WARN, check_mismatch_config
from llmgym.agents.learner import ForwardOutput, Learner, check_learner_config, micro_batches
from llmgym.agents.screening import screen
from llmgym.agents.truncation import to_model_space
from llmgym.runtime import distributed
from llmgym.engines import HFEngine, SamplingParams
from llmgym.engines.base import sync_engine_weights
from llmgym.engines.session import token_stepper
from llmgym.engines.sampling import row_keys, sample_next_token
from llmgym.runtime.models import flush_denormals
from llmgym.rollout.episodes import Batch, collect_episodes, draw_tasks, is_token_level

__all__ = ["AgentConfig", "Agent", "ForwardOutput"]


@dataclasses.dataclass
class AgentConfig:
    """Settings every agent understands. Algorithms subclass this with their own defaults.

    Attributes:
        seed: fixes task draws and every sampled token (with the same model, same batches).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        tasks_per_step: distinct tasks (prompts) per batch.
        group_size: completions sampled per task (G); 1 for non-group methods.
        max_new_tokens: token budget per completion (per turn).
        temperature, top_p: sampling; an engine's log-probs are of what it drew from (with top-p the renormalised
            nucleus), the learner's of the untruncated tempered policy (see :mod:`llmgym.agents.truncation`).
        update_epochs: passes over each batch (PPO-style reuse); 1 = on-policy.
        minibatch_size: episodes per optimiser step; ``None`` = the whole batch.
        max_grad_norm: gradient clipping (``None`` = off).
        kl_coef: β of the KL to a frozen reference policy; 0 loads no reference model.
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (Schulman's estimators).
        kl_placement: ``"loss"`` (β·KL added to the per-token loss, as GRPO) or ``"reward"``
            (−β·KL added to the per-token reward, as PPO-RLHF/RLOO).
        entropy_coef: weight of an entropy bonus in the loss.
        loss_agg: how per-token losses become a scalar (see ``llmgym.agents.functional.aggregate_loss``).
        clip_low, clip_high: PPO ratio clipping ε (clip-higher when ``clip_high > clip_low``).
        dual_clip: dual-clip bound c > 1 for negative advantages (``None`` = off).
        correction: the off-policy correction of the sampler/learner gap (engine kernels and precision,
            stale weights): ``None`` (off; stale tokens of the pipelined learner still get the
            token-level TIS weight), ``"tis-token"``, ``"tis-seq"``, ``"mis"``, ``"geo"`` or ``"icepop"``
            (formulas in ``llmgym.agents.functional``, ``correction_weights``; docs/scale.md, "Off-policy
            corrections"). The engine's generation-time log-probs are compared with the learner's
            log-probs of the same tokens before the update; the weight multiplies the per-token
            policy-gradient loss of every token.
        correction_low, correction_high: the preset's band, replacing its default
            (``functional.CORRECTION_BOUNDS``): the cap ``C = correction_high`` of ``tis-*``/``mis``
            (default ``tis_cap``), the kept band of ``mis``, ``geo`` and ``icepop``.
        tis_cap: the truncation C of the TIS weight ``min(ratio, C)`` of stale tokens, and the default
            cap of the ``tis-*`` and ``mis`` corrections.
        tis: the older spelling of ``correction``: ``"token"`` = ``"tis-token"``, ``"sequence"`` = ``"tis-seq"``.
        mismatch_kl_warn, mismatch_prob_error_warn: a :class:`~llmgym.agents.mismatch.MismatchWarning`
            when a step's ``mismatch_kl`` (the k3 estimate of KL(sampler ‖ learner) on the sampled
            tokens) passes the first (default 1e-2) or its ``mismatch_prob_error`` (mean
            ``exp|log π − log q|``) the second (default 1.1); ``None`` = no warning. See
            :mod:`llmgym.agents.mismatch`.

    Learner settings (see :mod:`llmgym.agents.learner`; none changes what is optimised):
        micro_batch_size: examples per forward/backward — completions, or preference pairs for DPO
            (gradients accumulate over a minibatch's micro-batches; per process under data
            parallel); ``None`` = the whole minibatch.
        logits_chunk_size: tokens per LM-head chunk when computing log-probs and entropy (the
            ``[N, L, V]`` logits never exist; each chunk runs in vocabulary tiles of 2^24 logits); ``None`` =
            ``default_chunk_size`` (2,048 tokens at a 151,936-token vocabulary); 0 = full logits.
        precision: ``"fp32"``, ``"bf16-mixed"`` (bf16 autocast over float32 weights and optimiser
            state) or ``"bf16"`` (bf16 weights). ``resolve_device_defaults`` picks bf16-mixed on a GPU.
        gradient_checkpointing: recompute each layer's activations in backward (``transformers``').
        lora_r: LoRA rank through ``peft`` (0 = train all weights); the KL reference is then the base
            model with the adapters disabled. lora_alpha (default 2·r), lora_dropout (applied to
            the adapters' input in training forwards, as ``peft`` does; the engine samples without
            it), lora_target_modules (default ``"all-linear"``).
        lr_schedule: ``"constant"``, ``"linear"`` or ``"cosine"`` after ``lr_warmup_steps`` of linear
            warm-up; decays reach 0 at ``lr_total_steps``. Counted in updates (agent steps).
        engine_decode: the default ``HFEngine``'s decoding: ``"eager"`` (dynamic KV cache),
            ``"static"`` (static KV cache) or ``"compiled"`` (static cache + ``torch.compile``).
    """

    seed: int = 0
    lr: float = 1e-3
    weight_decay: float = 0.0
    tasks_per_step: int = 8
    group_size: int = 4
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    update_epochs: int = 1
    minibatch_size: int | None = None
    max_grad_norm: float | None = 1.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_placement: str = "loss"
    entropy_coef: float = 0.0
    loss_agg: str = "token-mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    tis: str | None = None
    tis_cap: float = 2.0
    correction: str | None = None
    correction_low: float | None = None
    correction_high: float | None = None
    mismatch_kl_warn: float | None = MISMATCH_KL_WARN
    mismatch_prob_error_warn: float | None = MISMATCH_PROB_ERROR_WARN
    micro_batch_size: int | None = None
    logits_chunk_size: int | None = None
    precision: str = "fp32"
    gradient_checkpointing: bool = False
    lora_r: int = 0
    lora_alpha: float | None = None
    lora_dropout: float = 0.0
    lora_target_modules: str | tuple[str, ...] = "all-linear"
    lr_schedule: str = "constant"
    lr_warmup_steps: int = 0
    lr_total_steps: int | None = None
    engine_decode: str = "eager"

    def __post_init__(self) -> None:
        check_learner_config(self)
        resolve_correction(self)  # the name and its band, checked once
        check_mismatch_config(self)
        if self.kl_placement not in ("loss", "reward"):
            raise ValueError(f"kl_placement must be 'loss' or 'reward', got {self.kl_placement!r}")
        if self.kl_estimator not in F.KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {sorted(F.KL_ESTIMATORS)}, got {self.kl_estimator!r}")
        if self.loss_agg not in F.LOSS_AGG_MODES:
            raise ValueError(f"loss_agg must be one of {F.LOSS_AGG_MODES}, got {self.loss_agg!r}")
        for name in ("tasks_per_step", "group_size", "max_new_tokens", "update_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def _disable_dropout(model: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


class Agent(abc.ABC):
    """Base class of all agents: ``act``, ``collect``, ``update``, ``learn``.

    Args:
        model: a ``transformers`` causal LM (the policy; trained in place).
        tokenizer: its tokenizer.
        config: the algorithm's config dataclass; keyword ``overrides`` replace its fields.
        engine: a rollout engine; defaults to :class:`llmgym.engines.HFEngine` over ``model``.

    Subclasses implement :meth:`compute_advantages` (fill ``batch.advantages``) and :meth:`loss`.
    """

    config_class: type[AgentConfig] = AgentConfig
    name = "agent"
    rows_per_example = 1
    """Consecutive batch rows one loss term reads together (DPO: 2, a chosen and a rejected
    completion); micro-batches never split them."""
    collects_once = True
    """:meth:`collect` samples its batch in one rollout, so the engine is free once that rollout's
    last completions are out (the pipelined learner starts the next batch then); ``False`` when it
    samples again after scoring (DAPO's extra draws, ReMax's greedy baseline)."""
    pipelined = True
    """Whether :class:`llmgym.agents.pipeline.Pipeline` may train this agent on stale samples (DPO
    may not: its pairs carry no policy-gradient correction)."""
    uses_values = False
    """Whether the loss reads a value head (PPO): the learner then asks :meth:`forward` for values."""
    pipeline_state: Any = None
    """What continues a pipelined :meth:`learn` that its callback stopped (see there); ``None`` otherwise."""
    screens_batches = True
    """Whether :meth:`update` has an untrusted engine's batch checked first (:mod:`llmgym.agents.screening`):
    ``False`` where the batch is not the engine's samples (offline DPO's pairs)."""
    batch_observer: Callable[[Batch], Any] | None = None
    """Called by :meth:`update` with the batch it trained on (advantages filled in), before the step's row is
    reported: how a run records sampled episodes (:mod:`llmgym.train.rollouts`) without keeping the batch."""

    def __init__(self, model, tokenizer, config: AgentConfig | None = None, *, engine=None, **overrides: Any):
        config = config if config is not None else self.config_class()
        if overrides:
            unknown = set(overrides) - {f.name for f in dataclasses.fields(config)}
            if unknown:
                raise TypeError(
                    f"unknown {type(config).__name__} field(s) {sorted(unknown)}; valid fields: "
                    f"{sorted(f.name for f in dataclasses.fields(config))}"
                )
            config = dataclasses.replace(config, **overrides)
        self.config = config
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        if self.device.type == "cpu":
            flush_denormals()  # Adam on a small model slows 10x+ on denormal floats otherwise
        # the engine samples without dropout: π_old and π must be the same function. Before LoRA, so
        # that the adapters' own dropout (lora_dropout) is the one the user asked for
        _disable_dropout(model)
        # precision, gradient checkpointing and LoRA are applied to `model` in place
        self.learner = Learner(model, config, rows_per_example=self.rows_per_example)
        self.model = model
        self.ref_model = self.learner.ref_model  # a frozen copy only when KL is on and there is no LoRA
        if engine is None:
            autocast = torch.bfloat16 if config.precision == "bf16-mixed" else None
            engine = HFEngine(model, tokenizer, decode=config.engine_decode, autocast_dtype=autocast)
        elif self.learner.peft_model is not None:
            # an engine of its own (vLLM, a fleet) takes the adapters from now on: version 0 is sampled with them
            sync_engine_weights(engine, model, 0)
        self.engine = engine
        self.optimizer = self.learner.make_optimizer(self.parameters())
        self.learner.scheduler = self.learner.make_scheduler(self.optimizer)
        self.level = "sequence"
        self.step_count = 0
        self._act_calls = 0
        # shuffles minibatches (the learner draws from it); saved with the agent's state
        self.minibatch_generator = torch.Generator().manual_seed(config.seed)

    # -- pieces subclasses may extend -------------------------------------------------------------
    def parameters(self) -> Iterable[torch.nn.Parameter]:
        """Parameters the optimiser trains (PPO adds its value head; with LoRA, only the adapters)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def has_reference(self) -> bool:
        """Whether a KL reference policy is in use (``kl_coef > 0``)."""
        return self.learner.has_reference

    def sampling(self, **overrides: Any) -> SamplingParams:
        c = self.config
        params = dict(n=1, temperature=c.temperature, top_p=c.top_p, max_new_tokens=c.max_new_tokens)
        return SamplingParams(**{**params, **overrides})

    # -- acting -----------------------------------------------------------------------------------
    def act(self, obs: dict[str, Any], level: str | None = None):
        """One action for ``obs``: a completion's token ids (sequence level) or one token id (token level).

        ``level`` defaults to the level of the env this agent last collected from (or ``"sequence"``).
        """
        level = level or self.level
        ids = [int(t) for t in obs["prompt_ids"]]
        key = row_keys(self.config.seed + 104_729 * self._act_calls, 1)
        self._act_calls += 1
        if level == "token":
            logits = token_stepper(self).next_token_logits([ids])  # KV cache reused along the episode
            token, _ = sample_next_token(logits, torch.tensor(key, device=logits.device),
                                         torch.zeros(1, dtype=torch.long, device=logits.device),
                                         self.config.temperature, self.config.top_p)
            return int(token[0])
        if level != "sequence":
            raise ValueError(f"level must be 'sequence' or 'token', got {level!r}")
        completion = self.engine.generate([ids], self.sampling(), keys=key)[0][0]
        return np.asarray(completion.token_ids, dtype=np.int64)

    def collect(self, env: gym.Env, num_tasks: int | None = None, draw: int = 0, *, engine=None,
                step: int | None = None, **rollout: Any) -> Batch:
        """Roll out ``tasks_per_step × group_size`` episodes of ``env`` (any level) into a :class:`Batch`.

        Tasks and tokens are seeded by ``(seed, step, draw)``; ``draw`` numbers extra draws within
        one step (DAPO's dynamic sampling). ``engine`` (default ``self.engine``) and ``step`` (default
        ``step_count``) are what the pipelined learner passes for a batch it rolls out ahead of the
        update; ``rollout`` goes to :func:`~llmgym.rollout.episodes.collect_episodes` (``step_pool``,
        ``observer``). Subclasses that override this pass all three on.

        The batch is built on the learner's device (``self.device``), where :meth:`update` trains on it.
        """
        engine = self.engine if engine is None else engine
        step = self.step_count if step is None else step
        self.level = "token" if is_token_level(env) else "sequence"
        seed = self.config.seed * 1_000_003 + step * 7_919 + draw
        num_tasks, tasks = num_tasks or self.config.tasks_per_step, None
        if distributed.is_distributed():
            # data parallel: every rank draws the same tasks and rolls out its contiguous share
            share = distributed.shard_range(num_tasks)
            tasks = draw_tasks(env, num_tasks, seed)[share.start:share.stop]
            if not tasks:
                raise ValueError(f"{num_tasks} tasks per step cannot be shared by {distributed.world_size()} "
                                 f"ranks: set tasks_per_step >= the number of processes")
            num_tasks, seed = len(tasks), seed + 7_777_777 * distributed.rank()
        episodes, stats = collect_episodes(
            env, engine, num_tasks=num_tasks,
            group_size=self.config.group_size, sampling=self.sampling(), seed=seed, tasks=tasks, **rollout,
        )
        batch: Batch = Batch.from_episodes(episodes, engine.pad_id)
        batch.stats = stats
        return batch.to(self.device)

    # -- learning ---------------------------------------------------------------------------------
    def forward(self, batch: Batch, model=None, with_values: bool = False) -> ForwardOutput:
        """Teacher-forced log-probs and entropy of ``batch``'s policy tokens under ``model`` (the policy).

        ``with_values`` also returns the last hidden states ``[N, L-1, H]`` (for a value head).
        Computed by :meth:`llmgym.agents.learner.Learner.forward` (chunked over the LM head)."""
        return self.learner.forward(batch, model=model, with_hidden=with_values)

    @torch.no_grad()
    def reference_logprobs(self, batch: Batch) -> torch.Tensor:
        """log π_ref of ``batch``'s tokens: the frozen copy, or the base model with LoRA adapters off."""
        size = self.config.micro_batch_size
        with self.learner.reference_policy() as ref:
            return torch.cat([self.learner.forward(part, model=ref).logprobs
                              for part in micro_batches(batch, size, self.rows_per_example)], dim=0)

    def batch_mean(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Masked mean of ``x`` over the whole batch — across all ranks under data parallel."""
        if not distributed.is_distributed():
            return F.masked_mean(x, mask)
        w = mask.to(x.dtype)
        total, count = distributed.all_reduce_sum(torch.stack([(x * w).sum(), w.sum()]).double()).tolist()
        return torch.tensor(total / count if count > 0 else 0.0, dtype=x.dtype, device=x.device)

    def batch_whiten(self, x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
        """``F.masked_whiten`` with the mean and unbiased variance of the whole (global) batch."""
        if not distributed.is_distributed():
            return F.masked_whiten(x.detach(), mask, eps=eps)
        x = x.detach()
        w = mask.to(x.dtype)
        mean = self.batch_mean(x, mask)
        sq_dev, count = distributed.all_reduce_sum(torch.stack([((x - mean) ** 2 * w).sum(), w.sum()]).double()).tolist()
        var = sq_dev / (count - 1) if count > 1 else 0.0
        whitened = (x - mean) / math.sqrt(var + eps)
        return torch.where(mask.bool(), whitened, torch.zeros_like(whitened))

    def sequence_scores(self, batch: Batch) -> torch.Tensor:
        """``[N]`` episode scores: the env's reward, minus β·Σ_t KL_t when KL is placed in the reward."""
        return F.masked_sum(self.kl_rewards(batch), batch.action_mask, dim=-1) if (
            self.has_reference and self.config.kl_placement == "reward") else batch.rewards

    def kl_rewards(self, batch: Batch) -> torch.Tensor:
        """Per-token rewards with −β·KL folded in when ``kl_placement == "reward"``."""
        rewards = batch.token_rewards
        if self.has_reference and self.config.kl_placement == "reward":
            kl = F.kl_estimate(batch.old_logprobs, batch.ref_logprobs, self.config.kl_estimator, batch.action_mask)
            rewards = rewards - self.config.kl_coef * kl
        return rewards

    @abc.abstractmethod
    def compute_advantages(self, batch: Batch) -> None:
        """Fill ``batch.advantages`` (``[N, L-1]``, 0 off the action mask)."""

    @abc.abstractmethod
    def loss(self, batch: Batch, out: ForwardOutput) -> tuple[torch.Tensor, dict[str, float]]:
        """The scalar loss of a minibatch and its diagnostics."""

    def reference_kl(self, batch: Batch, out: ForwardOutput) -> torch.Tensor | None:
        """``[N, L-1]`` estimate of KL(π‖π_ref) per token (``kl_estimator``); ``None`` without a reference."""
        if not self.has_reference:
            return None
        return F.kl_estimate(out.logprobs, batch.ref_logprobs, self.config.kl_estimator, batch.action_mask)

    @property
    def kl_coef_in_loss(self) -> float:
        """β where the KL penalty sits in the loss (``kl_placement == "loss"``); 0 where it sits in the
        reward (:meth:`kl_rewards`) or there is no reference."""
        return self.config.kl_coef if self.has_reference and self.config.kl_placement == "loss" else 0.0

    def loss_mask(self, batch: Batch) -> torch.Tensor:
        """The tokens the loss averages over (DAPO drops truncated episodes); the action mask by default."""
        return batch.action_mask

    def prepare(self, batch: Batch) -> Batch:
        """Everything computed once per batch before the optimiser steps."""
        if self.has_reference:
            batch.ref_logprobs = self.reference_logprobs(batch)
        self.compute_advantages(batch)
        return batch

    def update(self, batch: Batch) -> dict[str, float]:
        """Optimise on ``batch`` (``update_epochs`` passes over minibatches); return mean diagnostics.

        Data parallel (inside a ``torchrun`` process group; see :mod:`llmgym.runtime.distributed`): ``batch``
        is this rank's share of the global batch. Each rank's loss is multiplied by
        ``local_count · world_size / global_count`` (tokens for ``"token-mean"``, sequences for the
        ``seq-mean-*`` modes; counts all-reduced), so after DDP/FSDP averages gradients over ranks the
        step is the single-process step on the global batch. ``minibatch_size`` is global (each rank
        takes ``minibatch_size / world_size``). The returned diagnostics are averaged over ranks.
        Micro-batches (``micro_batch_size``) accumulate gradients with the same scaling. The loop
        is :meth:`llmgym.agents.learner.Learner.update`.
        """
        # an engine that cannot be taken at its word (a fleet) has its rows checked first: a distrusted server's
        # rows leave the batch before anything is computed from it (llmgym.agents.screening)
        sampled = getattr(batch, "sampled_from", None)  # every row sampled, where collect kept some by reward
        # a truncating sampler's log-probs (top-p) are brought to the learner's untruncated policy before anything
        # compares them with the learner's (llmgym.agents.truncation)
        batch, sampled = to_model_space(self, batch.to(self.device)), to_model_space(self, sampled)
        batch, screened = screen(self, batch, sampled)  # a batch built elsewhere comes over
        if batch is None:  # no trusted row left: no optimiser step
            metrics = {"loss": math.nan, "lr": float(self.optimizer.param_groups[0]["lr"]), **screened}
        else:
            batch = self.prepare(batch)
            metrics = {**self.learner.update(self, batch), **screened}
            if self.batch_observer is not None:
                self.batch_observer(batch)
        self.step_count += 1
        # a no-op for an HFEngine over this very model; a fleet of servers records the version
        sync_engine_weights(self.engine, self.model, self.step_count)
        return metrics

    # -- data parallel ----------------------------------------------------------------------------
    def extra_parameters(self) -> list[torch.nn.Parameter]:
        """Trained parameters outside ``self.model`` (e.g. PPO's value head): synced by hand."""
        own = {id(p) for p in self.model.parameters()}
        return [p for p in self.parameters() if id(p) not in own]

    def policy_stats(self, batch: Batch, out: ForwardOutput, is_clipped=None, kl=None) -> dict[str, float]:
        """Diagnostics common to every agent: entropy, KL to the reference, clip fraction.

        ``kl`` is the k3 estimate of KL(π‖π_ref), non-negative per token, whatever estimator the
        penalty uses; ``kl_k1`` and ``kl_k3`` report both estimators (as CleanRL reports both).
        The tokens were sampled from π_old, not π: at step 1 (π_old = π_ref) the k1 mean over them
        estimates ``E_{π_ref}[log π − log π_ref] = −KL(π_ref‖π) ≤ 0`` once the first minibatch has
        moved π (PPO logged −0.05), which is why the headline ``kl`` is k3.
        """
        mask = batch.action_mask
        stats = {"entropy": float(F.masked_mean(out.entropy.detach(), mask))}
        if kl is not None:
            lp = out.logprobs.detach()
            stats["kl_k1"] = float(F.masked_mean(F.kl_k1(lp, batch.ref_logprobs, mask), mask))
            stats["kl_k3"] = float(F.masked_mean(F.kl_k3(lp, batch.ref_logprobs, mask), mask))
            stats["kl"] = stats["kl_k3"]
        if is_clipped is not None:
            stats["clip_frac"] = float(F.clip_fraction(is_clipped, mask))
        # how far π_old is from the current policy (0 at an on-policy step), both estimators
        stats["approx_kl_old_k1"] = float(F.masked_mean(F.kl_k1(out.logprobs.detach(), batch.old_logprobs), mask))
        stats["approx_kl_old_k3"] = float(F.masked_mean(F.kl_k3(out.logprobs.detach(), batch.old_logprobs), mask))
        return stats

    def learn(
        self,
        env: gym.Env,
        steps: int,
        *,
        callback: Callable[[dict[str, float]], Any] | None = None,
        progress: bool = False,
        max_staleness: int | None = None,
        verify_workers: int | None = None,
        drain_every: int | None = None,
        pipeline_state: Any = None,
    ) -> list[dict[str, float]]:
        """Collect and update ``steps`` times; return the per-step metrics.

        Every entry has ``step``, ``reward_mean``, ``reward_std``, ``loss``, ``kl`` (NaN where no
        KL is defined), ``entropy``, ``clip_frac`` (NaN where there is no clipping),
        ``tokens_per_s`` (sampling speed) and ``wall_s``, plus the rollout's counters in ``batch.stats``
        (``rollout_s``, ``generate_s``, ``verify_s``, ``tokens_sampled``; DAPO adds ``extra_draws`` and
        ``kept_groups``).
        A ``callback`` returning ``False`` stops early.

        ``max_staleness=K`` trains with the pipelined learner (:class:`llmgym.agents.pipeline.Pipeline`):
        the batches of the next ``K`` steps are generated and verified while this one updates, each
        sampled by the weights of exactly ``K`` updates ago, and the decoupled importance-weight
        correction reweights them (``K = 0``: the same schedule as this loop, through the pipeline's
        machinery). ``verify_workers`` (threads that run ``env.step`` concurrently) and
        ``drain_every`` (steps at which the pipeline restarts its schedule, so a checkpoint there
        resumes exactly) are the pipeline's. ``None`` (the default): this synchronous loop.
        A pipelined run that a callback stops leaves :attr:`pipeline_state` (a
        :class:`~llmgym.agents.pipeline.PipelineState`, or ``None``), which ``pipeline_state=`` takes to
        continue it exactly (the state itself, or its ``state_dict()`` as a checkpoint keeps it).
        """
        if max_staleness is not None:
            from llmgym.agents.pipeline import Pipeline, PipelineState

            if isinstance(pipeline_state, dict):  # as saved in a checkpoint (llmgym.train.checkpoint)
                pipeline_state = PipelineState.from_state_dict(pipeline_state)

            pipeline = Pipeline(self, env, max_staleness=max_staleness, verify_workers=verify_workers,
                                drain_every=drain_every)
            try:
                return pipeline.run(steps, callback=callback, progress=progress, resume=pipeline_state)
            finally:
                self.pipeline_state = pipeline.state
        if verify_workers is not None or drain_every is not None or pipeline_state is not None:
            raise ValueError("verify_workers, drain_every and pipeline_state are options of the pipelined learner: "
                             "pass max_staleness=K too (K = 0 keeps the synchronous schedule)")
        with self.reporting(steps, callback, progress) as (history, report):
            for _ in range(steps):
                started = time.perf_counter()
                batch = self.collect(env)
                metrics = self.update(batch)
                if not report(self.step_row(batch, metrics, time.perf_counter() - started)):
                    break
        return history

    def step_row(self, batch: Batch, metrics: dict[str, float], wall_s: float) -> dict[str, float]:
        """The history entry of the step that just updated on ``batch`` (see :meth:`learn`)."""
        row = {
            "step": self.step_count,
            # over every sampled episode (DAPO reports them before dropping uninformative groups)
            "reward_mean": batch.stats.get("reward_mean", float(batch.rewards.mean())),
            "reward_std": batch.stats.get("reward_std", float(batch.rewards.std()) if len(batch) > 1 else 0.0),
            "kl": math.nan,
            "clip_frac": math.nan,
            **metrics,
            "tokens_per_s": batch.stats.get("tokens_per_s", math.nan),
            "completion_len": float(batch.lengths.mean()),
            "wall_s": wall_s,
        }
        # the rollout's own counters too (DAPO's extra_draws / kept_groups, tokens sampled)
        row.update({k: float(v) for k, v in batch.stats.items() if k not in row})
        return row

    @contextlib.contextmanager
    def reporting(self, steps: int, callback: Callable[[dict[str, float]], Any] | None, progress: bool):
        """``(history, report)`` for a training loop: ``report(row)`` appends the row, advances the
        progress bar (``progress``) and returns ``False`` when ``callback`` asks to stop."""
        history: list[dict[str, float]] = []
        bar = job = None
        if progress:
            from llmgym.runtime.display import make_console, make_progress

            bar = make_progress(make_console(), "reward {task.fields[reward]:.3f}")
            bar.start()
            job = bar.add_task(f"{self.name}", total=steps, reward=float("nan"))

        def report(row: dict[str, float]) -> bool:
            history.append(row)
            if bar is not None:
                bar.update(job, advance=1, reward=row["reward_mean"])
            return not (callback is not None and callback(row) is False)

        try:
            yield history, report
        finally:
            if bar is not None:
                bar.stop()

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: weights, optimiser, counters, RNG."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step_count": self.step_count,
            "act_calls": self._act_calls,
            "rng": self.minibatch_generator.get_state(),
            "config": dataclasses.asdict(self.config),
            "learner": self.learner.state_dict(),
            "extra": self.extra_state(),
        }

    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step_count = state["step_count"]
        self._act_calls = state["act_calls"]
        self.minibatch_generator.set_state(state["rng"])
        self.learner.load_state_dict(state.get("learner", {}))
        self.load_extra_state(state.get("extra", {}))
        sync_engine_weights(self.engine, self.model, self.step_count)

    def load_extra_state(self, extra: dict[str, Any]) -> None:
        pass
