"""The pipelined learner: generation, verification and learning overlap, with bounded staleness.

The synchronous loop (:meth:`~llmgym.agents.base.Agent.learn`) generates a batch, verifies it,
updates on it, and only then generates the next one. :class:`Pipeline` runs the same agent with
three stages working at once:

* **generation** in rollout threads, on an engine of its own: an :class:`~llmgym.engines.HFEngine`
  over the learner's model gets a separate copy of the weights (one more copy of the model in
  memory), a :class:`~llmgym.engines.VLLMEngine` is its own engine already; at most one rollout uses
  the engine at a time, in step order;
* **verification** (``env.step``) in a pool of ``verify_workers`` threads: the checks of batch ``b``
  run while the engine generates batch ``b + 1`` (for a single-turn env the engine is handed on as
  soon as a batch's completions are out; a multi-turn env, DAPO's extra draws and ReMax's greedy
  baseline hold it until their batch is done). Code verifiers wait on sandbox processes and
  graders on the network, so threads overlap them;
* **learning** in the calling thread: :meth:`Agent.update` on batch ``t`` while batches
  ``t + 1 … t + K`` are generated and verified.

**The schedule is deterministic.** Batch ``b`` is sampled by exactly the weights of version
:func:`behaviour_version` ``(b) = max(b − K, s)`` (version ``v`` = the weights after ``v`` updates;
``s`` = the step where the current *segment* began: the run's first step, and every multiple of
``drain_every``). So every token of batch ``t`` is exactly ``min(K, t − s)`` updates stale, never
more: nothing is ever too old, so nothing is dropped or regenerated — a rollout that would need
newer weights waits for them instead (back-pressure), and no compute is wasted. Thread timing
decides only *when* work happens, never *which* weights sample which batch: the same seed gives
the same history, bitwise, on one machine, and ``K = 0`` is the synchronous loop's schedule
(same history as ``learn`` on every metric but the timings).

**Weight sync.** After each update the learner publishes version ``v`` (no copy); before its next
optimiser step it freezes it: if the rollout thread is waiting for exactly that version the
learner copies it into the engine there and then; if a rollout still needs it later, it keeps a
snapshot (a copy of the state dict; with ``K ≥ 2`` up to ``K − 1`` of them exist at once); if no
rollout needs it, nothing is copied. Generation waits only for the copy of the version it needs
(``weight_sync_s`` in the metrics).

**The correction.** Each sampled token is tagged with its version (``Batch.policy_versions``); the
learner reweights stale tokens by ``min(π_prox / π_behav, tis_cap)`` and clips PPO's ratio around
``π_prox`` (AReaL's decoupled objective; :mod:`llmgym.agents.corrections`). With ``K = 0`` no token
is stale and the weights are exactly 1. With an engine that cannot be taken at its word (a fleet of
servers: it has ``screen_batch``) a server's reported log-prob never sets a weight: the pipeline keeps
the weights of each version that samples a stale batch until that batch's update
(``Learner.behaviour_weights``, at most ``K`` copies of the trained parameters), and ``π_behav`` is the
learner's score under them (:mod:`llmgym.agents.screening`).

**Checkpoints.** A segment boundary drains the pipeline (batch ``s`` is sampled by version ``s``):
a checkpoint written after step ``s`` (every ``drain_every`` steps; the command line passes its
``--checkpoint-every``) resumes exactly, because the resumed run starts a segment there too. A run
stopped at another step ``t`` (its callback returned ``False``: Ctrl-C on the command line) first
finishes the batches already due to weights older than ``t`` (at most ``K``; they were being sampled
anyway) and leaves them, with the schedule's segment start, in :attr:`Pipeline.state`
(:class:`PipelineState`); ``run(..., resume=state)`` uses them first and keeps the schedule, so the
resumed run is the uninterrupted one, exactly. The command line saves the state beside the checkpoint.

Example:
    >>> import gymnasium, llmgym
    >>> from llmgym.runtime.models import load_model
    >>> from llmgym.agents import GRPO
    >>> from llmgym.agents.pipeline import Pipeline, behaviour_version
    >>> [behaviour_version(b, max_staleness=2) for b in range(5)]
    [0, 0, 0, 1, 2]
    >>> model, tok = load_model("tiny")
    >>> agent = GRPO(model, tok, tasks_per_step=2, group_size=4, max_new_tokens=4, kl_coef=0.0)
    >>> rows = Pipeline(agent, gymnasium.make("llmgym/Copy-v0", tokenizer=tok), max_staleness=1).run(3)
    >>> [(r["step"], r["behaviour_version"], r["staleness_max"]) for r in rows]
    [(1, 0, 0.0), (2, 0, 1.0), (3, 1, 1.0)]
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import threading
import time
from typing import Any, Callable, Iterable

import gymnasium as gym
import torch

from llmgym.errors import LLMGymError
from llmgym.runtime import distributed
from llmgym.engines import HFEngine
from llmgym.engines.base import optional_member, sync_engine_weights

__all__ = ["DEFAULT_VERIFY_WORKERS", "STAGES", "Pipeline", "PipelineState", "StageMeter", "WeightChannel",
           "behaviour_version"]

STAGES = ("generate", "verify", "learn")
DEFAULT_VERIFY_WORKERS = 8
"""Threads that run a batch's ``env.step`` calls concurrently (they mostly wait: on sandbox
processes, a scorer's worker, a remote grader)."""

_POLL_S = 0.05  # how often a waiting thread looks at the stop flag


def behaviour_version(step: int, max_staleness: int, start: int = 0, drain_every: int | None = None) -> int:
    """The policy version whose weights sample batch ``step``: ``max(step − K, segment start)``.

    Segments start at ``start`` (the run's first step) and at every multiple of ``drain_every``.

    Example:
        >>> from llmgym.agents.pipeline import behaviour_version
        >>> [behaviour_version(b, 1, start=0, drain_every=3) for b in range(7)]
        [0, 0, 1, 3, 3, 4, 6]
        >>> [behaviour_version(b, 0) for b in range(3)]  # K = 0: the synchronous schedule
        [0, 1, 2]
    """
    segment = start
    if drain_every:
        segment = max(segment, (step // drain_every) * drain_every)
    return max(step - max_staleness, segment)


class StageMeter:
    """Wall time during which a stage had work in hand: the union of its busy spans across threads.

    Example:
        >>> from llmgym.agents.pipeline import StageMeter
        >>> meter = StageMeter()
        >>> with meter.busy():
        ...     with meter.busy():  # two threads busy at once count once
        ...         pass
        >>> meter.seconds() >= 0.0
        True
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._since = self._total = 0.0

    @contextlib.contextmanager
    def busy(self):
        with self._lock:
            if self._active == 0:
                self._since = time.perf_counter()
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self._total += time.perf_counter() - self._since

    def seconds(self) -> float:
        """Busy seconds so far (a span in progress counts up to now)."""
        with self._lock:
            return self._total + (time.perf_counter() - self._since if self._active else 0.0)


class _Stages:
    """The observer :func:`~llmgym.rollout.episodes.collect_episodes` reports its spans to, plus the learner's."""

    def __init__(self) -> None:
        self.meters = {name: StageMeter() for name in STAGES}

    def busy(self, stage: str):
        return self.meters[stage].busy()

    def seconds(self) -> dict[str, float]:
        return {name: meter.seconds() for name, meter in self.meters.items()}


class _StateDict:
    """A snapshot standing in for a model in ``engine.sync_weights`` (which reads ``state_dict()``)."""

    def __init__(self, state: dict[str, torch.Tensor]):
        self._state = state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state


def _snapshot(model: torch.nn.Module) -> _StateDict:
    """A copy of ``model``'s weights (tied tensors copied once). With LoRA adapters injected only the
    trained adapters are copied: the frozen base weights never change, so the snapshot shares them."""
    copies: dict[int, torch.Tensor] = {}
    state = {}
    frozen: set[str] = set()
    if getattr(model, "peft_config", None):
        frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    for name, tensor in model.state_dict().items():
        if name in frozen:
            state[name] = tensor.detach()
            continue
        key = id(tensor.untyped_storage()) if tensor.numel() else id(tensor)
        state[name] = copies.setdefault(key, tensor.detach().clone())
    return _StateDict(state)


def _batch_state(batch) -> dict[str, Any]:
    """``batch`` as tensors and plain data (``torch.load(..., weights_only=True)`` reads it back), the tensors
    on the CPU whatever device the batch is on, so a checkpoint loads on any machine."""
    from llmgym.runtime.logging import json_safe

    tensors = {f.name: v.cpu() if isinstance(v := getattr(batch, f.name), torch.Tensor) else v
               for f in dataclasses.fields(batch) if f.name not in ("stats", "episodes")}
    episodes = []
    for e in batch.episodes:
        row = {f.name: getattr(e, f.name) for f in dataclasses.fields(e) if f.name not in ("task", "info")}
        row["task"] = json_safe(dataclasses.asdict(e.task))
        row["info"] = json_safe({k: v for k, v in e.info.items() if k != "task"})
        episodes.append(json_safe(row) | {"logprobs": [float(x) for x in e.logprobs],
                                          "rewards": [float(x) for x in e.rewards]})
    return {"tensors": tensors, "stats": {k: float(v) for k, v in batch.stats.items()}, "episodes": episodes}


def _batch_from_state(state: dict[str, Any]):
    from llmgym.rollout.episodes import Batch, Episode
    from llmgym.env.types import Task

    episodes = []
    for row in state["episodes"]:
        task = Task(**row["task"])
        episodes.append(Episode(**{**row, "task": task, "info": {**row["info"], "task": task}}))
    return Batch(**state["tensors"], stats=dict(state["stats"]), episodes=episodes)


@dataclasses.dataclass
class PipelineState:
    """Where a stopped pipelined run stands: what ``run(..., resume=state)`` needs to continue it exactly.

    Attributes:
        schedule_start: the segment start of the run's schedule (:func:`behaviour_version`'s ``start``).
        pending: batches already sampled for the next steps (global step -> batch), by weights older than
            the checkpoint's; the resumed run updates on them instead of sampling them again.

    Example:
        >>> from llmgym.agents.pipeline import PipelineState
        >>> PipelineState.from_state_dict(PipelineState(0, {}).state_dict())
        PipelineState(schedule_start=0, pending={})
    """

    schedule_start: int
    pending: dict[int, Any] = dataclasses.field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain data only (a checkpoint loads it with ``weights_only=True``)."""
        return {"schedule_start": int(self.schedule_start),
                "pending": {int(k): _batch_state(b) for k, b in self.pending.items()}}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> PipelineState:
        return cls(int(state["schedule_start"]), {int(k): _batch_from_state(b) for k, b in state["pending"].items()})


class PipelineStopped(LLMGymError, RuntimeError):
    """A rollout was waiting when the run ended (finished, stopped by its callback, or failed)."""


class WeightChannel:
    """Hands the learner's weight versions to the generation engine (see the module doc).

    ``versions``: every version the run's rollouts will ask for (in any order); a version no rollout
    needs is never copied. The learner calls :meth:`publish` after an update and :meth:`freeze`
    before the next one; a rollout thread calls :meth:`acquire` before it generates.

    Counters: ``loads`` (versions copied into the engine), ``snapshots`` (copies kept because the
    engine was busy), ``load_s`` (seconds spent copying into the engine).

    Example:
        >>> import torch
        >>> from llmgym.engines import HFEngine
        >>> from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer
        >>> from llmgym.agents.pipeline import WeightChannel
        >>> tok = build_tokenizer()
        >>> learner = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1))
        >>> sampler = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1))
        >>> with torch.no_grad():
        ...     _ = sampler.lm_head.weight.zero_()
        >>> channel = WeightChannel(HFEngine(sampler, tok), versions=[0, 1])
        >>> channel.publish(0, learner)
        >>> channel.acquire(0)  # the engine now samples version 0
        >>> torch.equal(sampler.lm_head.weight, learner.lm_head.weight), channel.loads
        (True, 1)
        >>> channel.publish(1, learner)
        >>> channel.freeze()  # the learner will change its weights: version 1 is kept for a rollout
        >>> channel.snapshots
        1
    """

    def __init__(self, engine: Any, versions: Iterable[int], loaded: int | None = None):
        self.engine = engine
        self.loaded = loaded
        self._pending = {v for v in versions if loaded is None or v > loaded}
        self._live: tuple[int, Any] | None = None
        self._snapshots: dict[int, _StateDict] = {}
        self._waiting_for: int | None = None
        self._cond = threading.Condition()
        self.loads = self.snapshots = 0
        self.load_s = 0.0

    def publish(self, version: int, model: torch.nn.Module) -> None:
        """The learner's weights are ``version`` now (kept by reference until :meth:`freeze`)."""
        with self._cond:
            self._live = (version, model)
            self._cond.notify_all()

    def freeze(self) -> None:
        """The learner is about to change its weights: hand the published version over, or keep a copy."""
        with self._cond:
            if self._live is None:
                return
            version, model = self._live
            self._live = None
            if version not in self._pending:
                return
            if self._waiting_for == version:  # the rollout thread waits for exactly these weights
                self._loaded(version, self._copy_in(model, version))
            else:
                self._snapshots[version] = _snapshot(model)
                self.snapshots += 1
            self._cond.notify_all()

    def acquire(self, version: int, stopped: Callable[[], bool] = lambda: False) -> None:
        """Make the engine sample from ``version`` (waiting until the learner publishes it)."""
        while True:
            with self._cond:
                if self.loaded == version:
                    return
                source = self._snapshots.pop(version, None)
                if source is None:
                    if self._live is not None and self._live[0] == version:
                        # under the lock: the learner's freeze() waits for this copy, never the reverse
                        self._loaded(version, self._copy_in(self._live[1], version))
                        return
                    if stopped():
                        raise PipelineStopped("the pipeline stopped while a rollout waited for weights")
                    self._waiting_for = version
                    self._cond.wait(_POLL_S)
                    self._waiting_for = None
                    continue
            seconds = self._copy_in(source, version)  # a private copy: loaded without holding the learner up
            with self._cond:
                self._loaded(version, seconds)
            return

    def _copy_in(self, source: Any, version: int) -> float:
        started = time.perf_counter()
        sync_engine_weights(self.engine, source, version)  # a fleet of servers records the version
        return time.perf_counter() - started

    def _loaded(self, version: int, seconds: float) -> None:
        """Record that the engine holds ``version`` (the caller holds the lock)."""
        self.load_s += seconds
        self.loads += 1
        self.loaded = version
        self._pending = {v for v in self._pending if v > version}
        self._snapshots = {v: s for v, s in self._snapshots.items() if v > version}

    def close(self) -> None:
        """Drop what is kept (snapshots, the reference to the learner's model)."""
        with self._cond:
            self._snapshots.clear()
            self._live = None
            self._cond.notify_all()


class _RolloutEngine:
    """The generation engine as one rollout sees it: its tokens tagged with the rollout's policy
    version; ``generation_done`` hands the engine on to the next rollout (see ``collects_once``)."""

    def __init__(self, engine: Any, version: int, hand_on: Callable[[], None], early: bool):
        self._engine, self.policy_version = engine, version
        self._hand_on, self._early, self._done = hand_on, early, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, prompt_ids, sampling=None, *, keys=None):
        if self._done:
            raise RuntimeError("a rollout generated after it handed the engine on (collect_episodes said it was "
                               "done): an env that is not single-turn was taken for one")
        groups = self._engine.generate(prompt_ids, sampling, keys=keys)
        # an engine that tags its completions (a fleet of servers) must have sampled this batch's version
        tagged = {c.policy_version for group in groups for c in group} - {None}
        if tagged - {self.policy_version}:
            raise RuntimeError(f"the engine sampled with policy version(s) {sorted(tagged)}, but this batch is "
                               f"version {self.policy_version}'s: the staleness bound would not hold")
        return groups

    def generation_done(self) -> None:
        if self._early and not self._done:
            self._done = True
            self._hand_on()


class _LearnerSideEngine:
    """``agent.engine`` while the pipeline runs: the update's ``sync_weights`` is the channel's job, and
    the engine generates only in rollout threads."""

    def __init__(self, engine: Any):
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def sync_weights(self, model, **_version) -> None:
        pass  # the pipeline publishes every version itself (also after an update that skipped the optimiser)

    def generate(self, *args: Any, **kwargs: Any):
        raise RuntimeError("while the pipelined learner runs, its engine generates in the rollout threads only; "
                           "sample with agent.act / agent.engine after learn() returns")


def _generation_engine(agent, max_staleness: int) -> tuple[Any, bool]:
    """``(engine, owned)``: an engine that can sample while the learner updates its own weights.

    With ``K = 0`` generation never overlaps an update (batch ``t`` waits for version ``t``, and the
    update waits for batch ``t``), so an ``HFEngine`` over the learner's model keeps sampling from it:
    no copy, and the synchronous loop's numbers exactly."""
    engine = agent.engine
    if max_staleness > 0 and isinstance(engine, HFEngine) and engine.model is agent.model:
        # the second copy of the weights that lets both work at once. Its parameters keep
        # requires_grad as they are: turning it off changes which CPU kernels run (measured: log-probs
        # 5e-7 apart), and the engine samples under inference_mode anyway
        twin = copy.deepcopy(agent.model)
        return HFEngine(twin, engine.tokenizer, max_batch_size=engine.max_batch_size, decode=engine.decode,
                        autocast_dtype=engine.autocast_dtype), True
    return engine, False


def _wait(event: threading.Event, stop: threading.Event) -> None:
    while not event.wait(_POLL_S):
        if stop.is_set():
            raise PipelineStopped("the pipeline stopped while a rollout waited for its turn at the engine")


class Pipeline:
    """Train ``agent`` on ``env`` with generation, verification and learning overlapped (module doc).

    Args:
        agent: any agent whose ``pipelined`` is true (every on-policy agent; not DPO).
        env: the env to train on (any level; single-turn envs overlap the most).
        max_staleness: ``K``, how many updates old a sample may be; batch ``b`` is sampled by
            version ``max(b − K, segment start)``. ``0``: the synchronous schedule.
        verify_workers: threads that run a batch's ``env.step`` calls concurrently (sequence level;
            default :data:`DEFAULT_VERIFY_WORKERS`; 1 = one at a time).
        drain_every: start a new segment at every multiple of this step (exact resume from a
            checkpoint written there); ``None``: only at the run's start.

    :meth:`run` returns the history :meth:`Agent.learn` returns, each row with, besides:
    ``behaviour_version``; ``staleness_mean``, ``staleness_max`` and the histogram
    ``staleness_0 … staleness_K`` (share of sampled tokens that many updates old); the correction's
    ``is_weight_mean/min/max``, ``is_weight_clip_frac``, ``behaviour_log_ratio_abs`` and
    ``is_corrected`` (from the learner); per stage ``generate_busy_s``/``_idle_s``,
    ``verify_busy_s``/``_idle_s``, ``learn_busy_s``/``_idle_s`` (busy: wall seconds of the step
    during which the stage had work; idle: the rest of the step's ``wall_s``); ``weight_sync_s``
    (seconds copying weights into the engine) and ``weight_snapshots`` (copies kept, cumulative).

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.agents import REINFORCE
        >>> from llmgym.agents.pipeline import Pipeline
        >>> model, tok = load_model("tiny")
        >>> agent = REINFORCE(model, tok, tasks_per_step=4, max_new_tokens=4)
        >>> pipeline = Pipeline(agent, gymnasium.make("llmgym/Copy-v0", tokenizer=tok), max_staleness=2)
        >>> pipeline.engine is not agent.engine  # its own copy of the weights
        True
        >>> rows = pipeline.run(4)
        >>> [row["staleness_max"] for row in rows], sorted(k for k in rows[-1] if k.startswith("staleness_"))
        ([0.0, 1.0, 2.0, 2.0], ['staleness_0', 'staleness_1', 'staleness_2', 'staleness_max', 'staleness_mean'])
    """

    def __init__(self, agent, env: gym.Env, *, max_staleness: int = 1, verify_workers: int | None = None,
                 drain_every: int | None = None):
        if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0:
            raise ValueError(f"max_staleness must be an int >= 0 (0 = the synchronous schedule), got {max_staleness!r}")
        workers = DEFAULT_VERIFY_WORKERS if verify_workers is None else verify_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"verify_workers must be an int >= 1, got {verify_workers!r}")
        if drain_every is not None and (isinstance(drain_every, bool) or not isinstance(drain_every, int)
                                        or drain_every < 1):
            raise ValueError(f"drain_every must be an int >= 1 or None, got {drain_every!r}")
        if not getattr(agent, "pipelined", False):
            raise ValueError(f"{type(agent).__name__} cannot train on stale samples (its loss has no policy-gradient "
                             f"correction): run it synchronously (learn without max_staleness)")
        if distributed.is_distributed():
            raise ValueError("the pipelined learner runs in one process; under torchrun train synchronously "
                             "(data parallel already overlaps the ranks' rollouts)")
        self.agent, self.env = agent, env
        self.max_staleness, self.verify_workers, self.drain_every = max_staleness, workers, drain_every
        self.engine, self.owns_engine = _generation_engine(agent, max_staleness)
        self.state: PipelineState | None = None
        """After :meth:`run` stopped early with batches due to older weights: what continues it exactly."""

    def run(self, steps: int, *, callback: Callable[[dict[str, float]], Any] | None = None,
            progress: bool = False, resume: PipelineState | None = None) -> list[dict[str, float]]:
        """Train ``steps`` steps; return the per-step metrics (a ``callback`` returning ``False`` stops).

        ``resume``: the :attr:`state` of a run stopped at this step: its schedule and its batches sampled ahead."""
        agent, k = self.agent, self.max_staleness
        start = agent.step_count
        segment = start if resume is None else resume.schedule_start
        ready = {} if resume is None else {g - start: b for g, b in resume.pending.items() if g >= start}
        schedule = [behaviour_version(start + i, k, segment, self.drain_every) for i in range(steps)]
        missing = [start + i for i in range(steps) if schedule[i] < start and i not in ready]
        if missing:
            raise ValueError(f"steps {missing} are due to weights older than the model's (step {start}) and their "
                             f"batches are not in the resume state: resume from the checkpoint that saved them")
        sampled = [v for i, v in enumerate(schedule) if i not in ready]
        # a fresh copy of the model is version `start` already; any other engine is loaded now, here,
        # so an engine that cannot take weights (a served model) says so before a thread starts
        channel = WeightChannel(self.engine, sampled, loaded=start if self.owns_engine else None)
        channel.publish(start, agent.model)
        if sampled:
            channel.acquire(sampled[0])
        self.state = None
        # an engine that cannot be taken at its word: the weights of each version that samples a batch trained on
        # after a newer one are kept until that update, which scores the batch under them (agents/screening.py)
        stale_at = ({i: schedule[i] for i in range(steps) if i not in ready and schedule[i] < start + i}
                    if optional_member(self.engine, "screen_batch") is not None else {})
        kept = agent.learner.behaviour_weights
        kept.clear()
        stages = _Stages()
        stop = threading.Event()
        turns = [threading.Event() for _ in range(steps + 1)]  # turns[i]: rollout i may use the engine
        turns[0].set()
        checks = (concurrent.futures.ThreadPoolExecutor(self.verify_workers, thread_name_prefix="llmgym-verify")
                  if self.verify_workers > 1 else None)
        rollouts = concurrent.futures.ThreadPoolExecutor(k + 1, thread_name_prefix="llmgym-rollout")

        def rollout(i: int):
            if i in ready:  # sampled before the stop, by the weights the schedule gave it
                turns[i + 1].set()
                return ready[i]
            try:
                _wait(turns[i], stop)
                channel.acquire(schedule[i], stop.is_set)
                engine = _RolloutEngine(self.engine, schedule[i], turns[i + 1].set, agent.collects_once)
                return agent.collect(self.env, engine=engine, step=start + i, step_pool=checks, observer=stages)
            finally:
                turns[i + 1].set()

        engine_before = agent.engine
        agent.engine = _LearnerSideEngine(engine_before)
        futures: list[concurrent.futures.Future] = []
        try:
            futures = [rollouts.submit(rollout, i) for i in range(steps)]
            with agent.reporting(steps, callback, progress) as (history, report):
                step_started, busy_before, sync_before = time.perf_counter(), stages.seconds(), channel.load_s
                for i in range(steps):
                    batch = _result(futures[i])
                    staleness = self._staleness(batch, schedule[i])
                    for version in {agent.step_count} & set(stale_at.values()) - set(kept):
                        kept[version] = _snapshot(agent.model).state_dict()
                    channel.freeze()
                    with stages.busy("learn"):
                        metrics = agent.update(batch)
                    for version in [v for v in kept if v not in {stale_at[j] for j in stale_at if j > i}]:
                        del kept[version]
                    channel.publish(agent.step_count, agent.model)
                    now, busy = time.perf_counter(), stages.seconds()
                    row = agent.step_row(batch, metrics, now - step_started)
                    row["behaviour_version"] = schedule[i]
                    row.update(staleness)
                    for stage in STAGES:
                        spent = min(busy[stage] - busy_before[stage], row["wall_s"])
                        row[f"{stage}_busy_s"], row[f"{stage}_idle_s"] = spent, row["wall_s"] - spent
                    row["weight_sync_s"], row["weight_snapshots"] = channel.load_s - sync_before, float(channel.snapshots)
                    step_started, busy_before, sync_before = now, busy, channel.load_s
                    if not report(row):
                        self.state = self._stopped_at(i, schedule, futures, segment)
                        break
        finally:
            stop.set()
            for future in futures:
                future.cancel()
            rollouts.shutdown(wait=True)  # a rollout in progress finishes its batch (its result is dropped)
            if checks is not None:
                checks.shutdown(wait=True)
            agent.engine = engine_before
            kept.clear()
            channel.close()
        if not self.owns_engine:  # the agent's engine samples the trained policy afterwards, as after learn()
            sync_engine_weights(self.engine, agent.model, agent.step_count)
        return history

    def _stopped_at(self, i: int, schedule: list[int], futures: list, segment: int) -> PipelineState | None:
        """The run stops after update ``i``: finish the batches due to weights older than the learner's now
        (they cannot be sampled again after a restart) and keep them; ``None`` when there are none."""
        now = self.agent.step_count
        due = [j for j in range(i + 1, len(schedule)) if schedule[j] < now]
        if not due:
            return None
        return PipelineState(segment, {now - (i + 1) + j: _result(futures[j]) for j in due})

    def _staleness(self, batch, version: int) -> dict[str, float]:
        """The staleness histogram of ``batch``'s sampled tokens; raises if one is older than ``K``."""
        current = self.agent.step_count
        if batch.policy_versions is None:  # an agent whose batch lost its tags: the schedule's age
            ages = torch.full((max(1, batch.num_tokens),), float(current - version))
        else:
            ages = (current - batch.policy_versions[batch.action_mask.bool()]).float()
        if ages.numel() and (ages.min() < 0 or ages.max() > self.max_staleness):
            raise RuntimeError(f"a sample is {int(ages.max())} updates old (max_staleness={self.max_staleness}) "
                               f"or from the future ({int(-ages.min())}): the pipeline's schedule is broken")
        row = {"staleness_mean": float(ages.mean()) if ages.numel() else 0.0,
               "staleness_max": float(ages.max()) if ages.numel() else 0.0}
        for age in range(self.max_staleness + 1):
            row[f"staleness_{age}"] = float((ages == age).float().mean()) if ages.numel() else 0.0
        return row


def _result(future: concurrent.futures.Future):
    """``future.result()``, waiting in short slices so Ctrl-C reaches the learner's thread."""
    while True:
        try:
            return future.result(timeout=_POLL_S * 4)
        except concurrent.futures.TimeoutError:
            continue
