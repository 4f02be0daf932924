"""Episodes: an engine drives groups of env copies through the plain Gymnasium API; a Batch pads them.

:func:`collect_episodes` draws ``num_tasks`` tasks, pins each on ``group_size`` env copies
(``reset(options={"task": task})``), and steps every live episode with completions sampled in one
batched engine call per turn — single-turn and multi-turn envs alike. At token level (an env whose
action space is ``Discrete``) every live episode is stepped one token at a time, with the same keyed
sampling, so the same seed yields the same tokens and rewards at both levels; a decode session
(:func:`llmgym.engines.open_decode_session`) keeps the KV cache between steps, so each context token
— prompt, sampled token, a multi-turn env's reply — goes through the model once.

The result is a list of :class:`Episode`; :class:`Batch` pads them into the tensors every agent trains
on. Both forms of the data live here, beside the loop that records it: an episode's per-token lists
(mask, log-probs, rewards, policy versions) are one contract between the recording and the padding.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Iterator, Sequence

import gymnasium as gym
import numpy as np
import torch

from llmgym.engines.base import Completion, EngineView, SamplingParams
from llmgym.engines.sampling import keyed_uniforms, row_keys, sample_next_token
from llmgym.env.token_level import TokenLevel
from llmgym.env.types import Task
from llmgym.env.verifiers import Verifier
from llmgym.env.vector import clone_envs

__all__ = ["Episode", "Batch", "collect_episodes", "draw_tasks", "turn_keys", "is_token_level", "at_most_one_turn"]


@dataclasses.dataclass
class Episode:
    """One episode as token ids with per-token annotations (all lists have ``len(token_ids)``).

    Attributes:
        task: the task.
        group: index of the task within the collected batch (samples of one task share it).
        token_ids: prompt, then each completion and each env reply, exactly as the policy saw them.
        action_mask: 1 where the policy sampled the token, 0 for prompt and env tokens.
        logprobs: generation-time log-prob of each sampled token (0 elsewhere).
        rewards: each turn's reward placed on that turn's last sampled token (0 elsewhere).
        prompt_length: tokens before the first completion.
        finish_reasons: per turn, ``"stop"`` or ``"length"``.
        turn_lengths: per turn, the number of sampled tokens.
        terminated / truncated: how the episode ended (Gymnasium's flags).
        info: the last ``step`` info.
        policy_versions: per token, the policy version (number of updates) of the weights that
            sampled it, ``-1`` on prompt and env tokens; empty when the engine reports no version
            (an engine reports one through a ``policy_version`` attribute: the pipelined learner's does).
    """

    task: Task
    group: int
    token_ids: list[int]
    action_mask: list[int]
    logprobs: list[float]
    rewards: list[float]
    prompt_length: int
    finish_reasons: list[str] = dataclasses.field(default_factory=list)
    turn_lengths: list[int] = dataclasses.field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    policy_versions: list[int] = dataclasses.field(default_factory=list)

    @property
    def total_reward(self) -> float:
        return float(sum(self.rewards))

    @property
    def num_turns(self) -> int:
        return len(self.finish_reasons)

    @property
    def completion_ids(self) -> list[int]:
        """Every token after the prompt (completions and env replies)."""
        return self.token_ids[self.prompt_length:]


@dataclasses.dataclass
class Batch:
    """``N`` episodes, right-padded to length ``L``; per-token tensors are ``[N, L-1]``.

    Per-token tensors are aligned with the *predicted* tokens ``input_ids[:, 1:]``: column ``j`` is
    about token ``j + 1`` (whose log-prob comes from the logits at position ``j``).

    Attributes:
        input_ids, attention_mask: ``[N, L]``.
        action_mask: ``[N, L-1]`` float, 1 on tokens the policy sampled (not prompt, env replies or padding).
        old_logprobs: ``[N, L-1]`` generation-time log-probs (π_old when there is one update per batch).
        token_rewards: ``[N, L-1]`` each turn's reward on its last sampled token.
        rewards: ``[N]`` episode returns (sum of turn rewards).
        groups: ``[N]`` long, which task (group) each episode belongs to.
        truncated: ``[N]`` bool, a completion hit the token budget.
        longest_turn: ``[N]`` sampled tokens of each episode's longest turn (the per-turn budget's unit).
        ref_logprobs, teacher_logprobs, values, advantages, returns: filled by agents where they need them
            (``teacher_logprobs``: a distillation teacher's log-probs of the same tokens).
        baseline_rewards: ``[N]`` an external per-episode baseline (ReMax's greedy rewards).
        policy_versions: ``[N, L-1]`` long, the policy version that sampled each token (``-1`` off the
            action mask); ``None`` when the engine reported no versions (the synchronous loop).
        stats: rollout statistics (``tokens_per_s``, ...); episodes: the source episodes.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    old_logprobs: torch.Tensor
    token_rewards: torch.Tensor
    rewards: torch.Tensor
    groups: torch.Tensor
    truncated: torch.Tensor
    longest_turn: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    baseline_rewards: torch.Tensor | None = None
    policy_versions: torch.Tensor | None = None
    stats: dict[str, float] = dataclasses.field(default_factory=dict)
    episodes: list[Episode] = dataclasses.field(default_factory=list, repr=False)

    @classmethod
    def from_episodes(cls, episodes: Sequence[Episode], pad_id: int = 0) -> "Batch":
        """Pad a list of :class:`Episode` into a batch.

        Example:
            >>> from llmgym.rollout.episodes import Batch, Episode
            >>> from llmgym import Task
            >>> ep = Episode(Task("p"), 0, [1, 5, 6, 2], [0, 0, 1, 1], [0, 0, -0.5, -0.1], [0, 0, 0, 1.0], 2)
            >>> b = Batch.from_episodes([ep, ep])
            >>> b.input_ids.shape, b.action_mask[0].tolist(), b.rewards.tolist()
            (torch.Size([2, 4]), [0.0, 1.0, 1.0], [1.0, 1.0])
        """
        if not episodes:
            raise ValueError("cannot build a Batch from no episodes")
        n, width = len(episodes), max(len(e.token_ids) for e in episodes)
        ids = torch.full((n, width), pad_id, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        act = torch.zeros((n, width), dtype=torch.float32)
        lps = torch.zeros((n, width), dtype=torch.float32)
        rew = torch.zeros((n, width), dtype=torch.float32)
        tagged = all(len(e.policy_versions) == len(e.token_ids) for e in episodes)
        versions = torch.full((n, width), -1, dtype=torch.long) if tagged else None
        for i, e in enumerate(episodes):
            k = len(e.token_ids)
            ids[i, :k] = torch.tensor(e.token_ids)
            attn[i, :k] = 1
            act[i, :k] = torch.tensor(e.action_mask, dtype=torch.float32)
            lps[i, :k] = torch.tensor(e.logprobs, dtype=torch.float32)
            rew[i, :k] = torch.tensor(e.rewards, dtype=torch.float32)
            if versions is not None:
                versions[i, :k] = torch.tensor(e.policy_versions, dtype=torch.long)
        return cls(
            input_ids=ids,
            attention_mask=attn,
            action_mask=act[:, 1:],
            old_logprobs=lps[:, 1:],
            token_rewards=rew[:, 1:],
            rewards=torch.tensor([e.total_reward for e in episodes], dtype=torch.float32),
            groups=torch.tensor([e.group for e in episodes], dtype=torch.long),
            truncated=torch.tensor(["length" in e.finish_reasons for e in episodes], dtype=torch.bool),
            longest_turn=torch.tensor([max(e.turn_lengths, default=0) for e in episodes], dtype=torch.float32),
            policy_versions=versions[:, 1:] if versions is not None else None,
            episodes=list(episodes),
        )

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_tokens(self) -> int:
        """Policy tokens in the batch (the token-mean denominator)."""
        return int(self.action_mask.sum())

    @property
    def lengths(self) -> torch.Tensor:
        """Sampled tokens per episode ``[N]``."""
        return self.action_mask.sum(-1)

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: v for f in dataclasses.fields(self) if isinstance(v := getattr(self, f.name), torch.Tensor)}

    def to(self, device) -> "Batch":
        return dataclasses.replace(self, **{k: v.to(device) for k, v in self._tensors().items()})

    def select(self, index: torch.Tensor | Sequence[int]) -> "Batch":
        """The episodes at ``index`` (trailing all-padding columns are kept; they are masked)."""
        index = torch.as_tensor(index, dtype=torch.long)
        episodes = [self.episodes[i] for i in index.tolist()] if self.episodes else []
        return dataclasses.replace(self, episodes=episodes,
                                   **{k: v[index.to(v.device)] for k, v in self._tensors().items()})

    def minibatches(self, size: int, generator: torch.Generator | None = None) -> Iterator["Batch"]:
        """Shuffled minibatches of ``size`` episodes (the last may be smaller)."""
        order = torch.randperm(len(self), generator=generator)
        for start in range(0, len(self), size):
            yield self.select(order[start:start + size])


def is_token_level(env: gym.Env) -> bool:
    """Whether ``env`` takes one token id per step (``Discrete`` action space)."""
    return isinstance(env.action_space, gym.spaces.Discrete)


def turn_keys(seed: int, num_rows: int, turn: int) -> list[int]:
    """Sampling keys of every row for one turn: distinct per (seed, row, turn).

    Example:
        >>> from llmgym.rollout.episodes import turn_keys
        >>> turn_keys(0, 2, 0) != turn_keys(0, 2, 1)
        True
    """
    return row_keys(seed * 1_000_003 + turn, num_rows)


def _row_keys(seed: int, first_row: int, num_rows: int, turn: int) -> list[int]:
    """:func:`turn_keys` of rows ``first_row … first_row + num_rows - 1`` (a row's key depends on its index only)."""
    return turn_keys(seed, first_row + num_rows, turn)[first_row:]


def draw_tasks(env: gym.Env, num_tasks: int, seed: int | None = None) -> list[Task]:
    """Draw tasks through ``env.reset`` (so the env's own seeded task source decides).

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym.rollout.episodes import draw_tasks
        >>> env = gymnasium.make("llmgym/Copy-v0")
        >>> [t.id for t in draw_tasks(env, 2, seed=0)] == [t.id for t in draw_tasks(env, 2, seed=0)]
        True
    """
    tasks = []
    for i in range(num_tasks):
        _, info = env.reset(seed=seed if i == 0 else None)
        if "task" not in info:
            raise ValueError("env.reset() must return info['task'] (llmgym envs do) to pin groups of samples")
        tasks.append(info["task"])
    return tasks


def _ensure_tokenizer(env: gym.Env, tokenizer: Any) -> None:
    inner = env.unwrapped
    if getattr(inner, "tokenizer", None) is None:
        if not hasattr(inner, "set_tokenizer"):
            raise TypeError(f"{type(inner).__name__} is not an llmgym env (no set_tokenizer)")
        inner.set_tokenizer(tokenizer)


def collect_episodes(
    env: gym.Env,
    engine: Any,
    *,
    num_tasks: int,
    group_size: int,
    sampling: SamplingParams,
    seed: int,
    tasks: Sequence[Task] | None = None,
    max_turns: int = 10_000,
    on_episodes_done: Callable[[int], Any] | None = None,
    step_pool: Executor | None = None,
    observer: Any = None,
    first_row: int = 0,
) -> tuple[list[Episode], dict[str, float]]:
    """Run ``num_tasks × group_size`` episodes to the end; return them and timing stats.

    Episodes ``g * group_size … (g+1) * group_size - 1`` share task ``g``. ``seed`` fixes the task
    draw (through ``env.reset(seed=seed)``) and every sampled token; ``tasks`` pins the tasks instead.
    ``max_turns`` stops an episode whose env never ends it (a guard, not a game rule).
    ``first_row``: the rows are sampled as rows ``first_row, first_row + 1, …`` of a larger run with
    this ``seed`` (their keys are that run's), so a run done in parts samples what it would at once.
    ``on_episodes_done(k)`` is called as episodes end (``k`` of them since its last call): a
    progress display's hook. Rows go to the engine in batches of its ``max_batch_size`` (the
    batches it would make itself), so results do not depend on the hook.

    The stats: ``rollout_s`` (the whole rollout), ``generate_s`` (inside the engine: the model and
    sampling), ``verify_s`` (inside ``env.step`` and verifier prefetch: scoring, and a multi-turn
    env's replies), ``tokens_sampled`` and ``tokens_per_s`` = tokens sampled / ``generate_s``, the
    sampling speed.

    For a pipelined learner (:mod:`llmgym.agents.pipeline`):

    * ``step_pool``: an executor that runs the ``env.step`` calls of a turn's completions
      concurrently (sequence level; each env copy is stepped by one thread at a time, and results
      are recorded in row order, so they do not depend on the pool). Verifiers that wait on the
      sandbox, a process or the network overlap there.
    * ``observer``: an object whose ``busy("generate")`` / ``busy("verify")`` context managers
      wrap the same spans as ``generate_s`` / ``verify_s`` (the pipeline's per-stage busy time).
    * Engine hooks, read where present: ``engine.policy_version`` tags every sampled token
      (:attr:`Episode.policy_versions`); ``engine.generation_done()`` is called as soon as this
      rollout will make no more engine calls -- right after the last completions of a single-turn
      env (:func:`at_most_one_turn`), before they are verified; else when the last episode ends.

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym.runtime.models import load_model
        >>> from llmgym.engines import HFEngine, SamplingParams
        >>> from llmgym.rollout.episodes import collect_episodes
        >>> model, tok = load_model("tiny")
        >>> env = gymnasium.make("llmgym/Copy-v0", tokenizer=tok)
        >>> episodes, stats = collect_episodes(env, HFEngine(model, tok), num_tasks=2, group_size=3,
        ...                                    sampling=SamplingParams(max_new_tokens=4), seed=0)
        >>> len(episodes), episodes[0].task == episodes[2].task, episodes[0].group, episodes[3].group
        (6, True, 0, 1)
    """
    tokenizer = engine.tokenizer
    view = EngineView.of(engine)  # the engine's optional members, read once for the whole rollout
    _ensure_tokenizer(env, tokenizer)
    if tasks is None:
        tasks = draw_tasks(env, num_tasks, seed)
    n = len(tasks) * group_size
    envs = clone_envs(env, n)  # Gymnasium checks the first; the rest are the same env
    episodes: list[Episode] = []
    observations = []
    for i, e in enumerate(envs):
        task = tasks[i // group_size]
        obs, _ = e.reset(options={"task": task})
        ids = [int(t) for t in obs["prompt_ids"]]
        episodes.append(Episode(task, i // group_size, ids, [0] * len(ids), [0.0] * len(ids),
                                [0.0] * len(ids), len(ids)))
        observations.append(obs)
    started = time.perf_counter()
    clock = _RolloutClock(on_episodes_done, observer)
    if is_token_level(env):
        _run_token_level(envs, episodes, observations, view, sampling, seed, max_turns, clock, first_row)
    else:
        one_turn = max_turns <= 1 or at_most_one_turn(env)
        _run_sequence_level(envs, episodes, observations, view, sampling, seed, max_turns, clock, step_pool, one_turn,
                            first_row)
    _generation_done(view)
    elapsed = time.perf_counter() - started
    return episodes, {"rollout_s": elapsed, "generate_s": clock.generate_s, "verify_s": clock.verify_s,
                      "tokens_sampled": float(clock.sampled),
                      "tokens_per_s": clock.sampled / max(clock.generate_s, 1e-9)}


class _RolloutClock:
    """Where a rollout's time goes (the engine vs ``env.step``), tokens sampled, and episodes ended."""

    def __init__(self, on_episodes_done: Callable[[int], Any] | None = None, observer: Any = None):
        self.generate_s = self.verify_s = 0.0
        self.sampled = 0
        self.on_episodes_done = on_episodes_done
        self.observer = observer

    def generating(self) -> _Timer:
        return _Timer(self, "generate_s", "generate")

    def verifying(self) -> _Timer:
        return _Timer(self, "verify_s", "verify")

    def episodes_done(self, count: int) -> None:
        if count and self.on_episodes_done is not None:
            self.on_episodes_done(count)


class _Timer:
    # entered once per row per token at token level: no stage object unless an observer watches
    __slots__ = ("clock", "field", "stage", "started")

    def __init__(self, clock: _RolloutClock, field: str, stage: str):
        self.clock, self.field = clock, field
        self.stage = clock.observer.busy(stage) if clock.observer is not None else None

    def __enter__(self) -> None:
        if self.stage is not None:
            self.stage.__enter__()
        self.started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        setattr(self.clock, self.field, getattr(self.clock, self.field) + time.perf_counter() - self.started)
        if self.stage is not None:
            self.stage.__exit__(*exc)


def _generation_done(view: EngineView) -> None:
    if view.generation_done is not None:
        view.generation_done()


def at_most_one_turn(env: gym.Env) -> bool:
    """Whether every episode of ``env`` ends after its first completion: a :class:`~llmgym.SequenceEnv`
    that is not multi-turn and keeps its own ``step`` (a subclass that overrides it may not end).

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym.rollout.episodes import at_most_one_turn
        >>> at_most_one_turn(gymnasium.make("llmgym/Copy-v0")), at_most_one_turn(gymnasium.make("llmgym/CodeRetry-v0"))
        (True, False)
    """
    from llmgym.env.core import MultiTurnEnv, SequenceEnv

    inner = env.unwrapped
    kind = type(inner)
    return (isinstance(inner, SequenceEnv) and not isinstance(inner, MultiTurnEnv)
            and kind.step is SequenceEnv.step and kind._after_completion is SequenceEnv._after_completion)


def _record_turn(ep: Episode, completion_ids: list[int], logprobs: list[float], rewards: list[float],
                 finish: str, next_obs: dict[str, Any], terminated: bool, truncated: bool, info: dict,
                 version: int | None = None) -> None:
    """Append one turn; ``rewards`` holds one reward per sampled token (dense) or one for the turn;
    ``version`` is the policy version that sampled it (``None``: the engine reports none)."""
    if version is not None and not ep.policy_versions:
        ep.policy_versions = [-1] * len(ep.token_ids)  # the context so far: no policy sampled it
    if ep.policy_versions:
        ep.policy_versions += [-1 if version is None else int(version)] * len(completion_ids)
    ep.token_ids += completion_ids
    ep.action_mask += [1] * len(completion_ids)
    ep.logprobs += list(logprobs)
    if len(rewards) == len(completion_ids) and completion_ids:
        ep.rewards += [float(r) for r in rewards]
    else:  # one reward for the turn: on its last sampled token (the last context token if none)
        ep.rewards += [0.0] * len(completion_ids)
        ep.rewards[-1] += float(sum(rewards))
    ep.finish_reasons.append(finish)
    ep.turn_lengths.append(len(completion_ids))
    ep.terminated, ep.truncated, ep.info = terminated, truncated, info
    if not (terminated or truncated):
        # the env's reply: whatever the observation adds beyond what the policy wrote
        context = [int(t) for t in next_obs["prompt_ids"]]
        if context[: len(ep.token_ids)] != ep.token_ids:
            raise RuntimeError(
                "the env's new observation does not extend the previous context + completion: "
                "multi-turn envs must append to prompt_ids, not re-tokenise the transcript"
            )
        reply = context[len(ep.token_ids):]
        if ep.policy_versions:
            ep.policy_versions += [-1] * len(reply)
        ep.token_ids += reply
        ep.action_mask += [0] * len(reply)
        ep.logprobs += [0.0] * len(reply)
        ep.rewards += [0.0] * len(reply)


def _run_sequence_level(envs, episodes, observations, view, sampling, seed, max_turns, clock, step_pool=None,
                        one_turn=False, first_row=0) -> None:
    for e in envs:  # a turn the engine stopped on one of its ids is a turn the model closed (chat replies)
        inner = e.unwrapped
        if hasattr(inner, "stop_token_ids"):
            inner.stop_token_ids = set(inner.stop_token_ids) | set(view.eos_ids)
    live = list(range(len(envs)))
    turn = 0
    per_turn = dataclasses.replace(sampling, n=1)
    # the engine's own batches (an engine without max_batch_size takes the whole turn at once)
    chunk = view.max_batch_size or max(1, len(envs))
    while live and turn < max_turns:
        keys_all = _row_keys(seed, first_row, len(envs), turn)
        still = []
        for start in range(0, len(live), chunk):
            rows = live[start:start + chunk]
            prompts = [observations[i]["prompt_ids"].tolist() for i in rows]
            with clock.generating():
                groups = view.engine.generate(prompts, per_turn, keys=[keys_all[i] for i in rows])
            version = view.policy_version
            if one_turn and start + chunk >= len(live):
                _generation_done(view)  # the engine is free while these completions are verified
            with clock.verifying():
                _prefetch_scores(envs, rows, groups)
            if step_pool is not None:  # the turn's checks run concurrently; results are used in row order
                with clock.verifying():
                    results = list(step_pool.map(lambda i, g: envs[i].step(list(g[0].token_ids)), rows, groups))
            for k, (i, group) in enumerate(zip(rows, groups)):
                c: Completion = group[0]
                clock.sampled += len(c.token_ids)
                if step_pool is not None:
                    obs, reward, terminated, truncated, info = results[k]
                else:
                    with clock.verifying():
                        obs, reward, terminated, truncated, info = envs[i].step(list(c.token_ids))
                _record_turn(episodes[i], list(c.token_ids), c.logprobs, [reward], c.finish_reason, obs,
                             terminated, truncated, info, version)
                observations[i] = obs
                if terminated or truncated:
                    clock.episodes_done(1)
                else:
                    still.append(i)
        live, turn = still, turn + 1
    clock.episodes_done(len(live))  # stopped by max_turns


def _prefetch_scores(envs, rows, groups) -> None:
    """Hand each batch-friendly verifier (a reward model) its share of this turn's completions at once."""
    batches: dict[int, tuple[Verifier, list[Task], list[str]]] = {}
    for i, group in zip(rows, groups):
        inner = envs[i].unwrapped
        verifier, task = getattr(inner, "verifier", None), getattr(inner, "task", None)
        if verifier is None or task is None or type(verifier).prefetch is Verifier.prefetch:
            continue
        _, tasks, texts = batches.setdefault(id(verifier), (verifier, [], []))
        tasks.append(task)
        texts.append(inner.completion_text(list(group[0].token_ids)))
    for verifier, tasks, texts in batches.values():
        verifier.prefetch(tasks, texts)


def _token_wrapper(env: gym.Env):
    while isinstance(env, gym.Wrapper):
        if hasattr(env, "stop_token_ids") and hasattr(env, "max_new_tokens"):
            return env
        env = env.env
    raise TypeError("a token-level env must contain llmgym.TokenLevel")


def _run_token_level(envs, episodes, observations, view, sampling, seed, max_turns, clock, first_row=0) -> None:
    if not view.steps_tokens:
        raise TypeError(
            f"{type(view.engine).__name__} cannot drive a token-level env (it has neither open_session nor "
            f"next_token_logits); use HFEngine, or the sequence-level env"
        )
    if sampling.stop:
        raise ValueError("stop strings are not supported at token level: the env ends a completion at EOS "
                         "or max_new_tokens; drop SamplingParams.stop or use the sequence-level env")
    for e in envs:  # the agent's budget and stop tokens rule, as at sequence level
        wrapper = _token_wrapper(e)
        wrapper.max_new_tokens = sampling.max_new_tokens
        wrapper.stop_token_ids = wrapper.stop_token_ids | set(view.eos_ids)
    # rows are independent (keyed sampling, one env each): a session per engine batch bounds the cache
    chunk = max(1, view.max_batch_size or len(envs))
    for start in range(0, len(envs), chunk):
        _run_token_rows(list(range(start, min(start + chunk, len(envs)))), envs, episodes, observations, view,
                        sampling, seed, max_turns, clock, first_row)


def _run_token_rows(live, envs, episodes, observations, view, sampling, seed, max_turns, clock, first_row=0) -> None:
    """Step episodes ``live`` one token at a time; the model sees each context token once (a session)."""
    from llmgym.engines.session import open_decode_session

    with clock.generating():
        session = open_decode_session(view, [observations[i]["prompt_ids"] for i in live])
    version = view.policy_version
    with session:  # eval mode held for the whole rollout, not switched per token
        _step_rows(session, live, envs, episodes, observations, sampling, seed, max_turns, clock, version, first_row)


def _direct_token_level(env: gym.Env) -> TokenLevel | None:
    """``env``'s :class:`~llmgym.TokenLevel` when every layer above it is one of Gymnasium's own
    ``OrderEnforcing`` / ``PassiveEnvChecker`` (exactly those classes, ``step`` not patched): their
    ``step`` only forwards once the env is reset (the checker checks the first ``step`` that reaches
    it), so a turn's inner tokens can go to the ``TokenLevel`` buffer directly and its last token
    through ``env.step``. ``None`` for anything else above it (a wrapper of the user's that watches
    every token, a ``TimeLimit`` counting steps) or a subclass of ``TokenLevel``: then every token goes
    through ``env.step``.
    """
    from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker

    layer = env
    while type(layer) in (OrderEnforcing, PassiveEnvChecker) and "step" not in vars(layer):
        layer = layer.env
    if type(layer) is TokenLevel and not {"step", "buffer_token"} & vars(layer).keys():
        return layer
    return None


def _step_rows(session, live, envs, episodes, observations, sampling, seed, max_turns, clock, version=None,
               first_row=0) -> None:
    """Step rows ``live`` one token at a time. A row whose env is llmgym's own token-level env under
    Gymnasium's pass-through wrappers (:func:`_direct_token_level`) buffers a turn's inner tokens in
    that env (:meth:`~llmgym.TokenLevel.buffer_token`: the reward 0 and the observation ``step`` would
    give are not built) and goes through ``env.step`` for the token that ends the turn; any other row
    goes through ``env.step`` at every token. Tokens, rewards and episodes are the same either way."""
    row_of = dict(zip(live, session.rows))
    turn_of = {i: 0 for i in live}
    buffers: dict[int, list[int]] = {i: [] for i in live}
    buffer_lps: dict[int, list[float]] = {i: [] for i in live}
    buffer_rewards: dict[int, list[float]] = {i: [] for i in live}
    direct = {i: _direct_token_level(envs[i]) for i in live}
    keys_cache: dict[int, list[int]] = {}
    # every row's keyed uniforms of one turn, hashed at once (as the engine does): [rows, budget]
    lo, hi, budget = min(live, default=0), max(live, default=-1) + 1, sampling.max_new_tokens
    uniform_tables: dict[int, torch.Tensor] = {}
    while live:
        turns = {turn_of[i] for i in live}
        for t in turns:
            if t not in keys_cache:
                keys_cache[t] = _row_keys(seed, first_row, len(envs), t)
        positions = [len(buffers[i]) for i in live]
        uniforms = keys = None
        if sampling.temperature == 0:
            pass
        elif len(turns) == 1 and max(positions) < budget:
            (t,) = turns
            if t not in uniform_tables:
                row_keys_t = torch.tensor(keys_cache[t][lo:hi])
                uniform_tables[t] = keyed_uniforms(row_keys_t[:, None], torch.arange(budget)[None])
            uniforms = uniform_tables[t][torch.tensor(live) - lo, torch.tensor(positions)]
        else:
            keys = torch.tensor([keys_cache[turn_of[i]][i] for i in live])
        with clock.generating():
            logits = session.logits([row_of[i] for i in live])
            if keys is not None:
                keys, positions = keys.to(logits.device), torch.tensor(positions, device=logits.device)
            tokens, lps = sample_next_token(logits, keys, positions if keys is not None else None,
                                            sampling.temperature, sampling.top_p, uniforms=uniforms)
            tokens, lps = tokens.tolist(), lps.tolist()
        clock.sampled += len(live)
        still, finished, extensions = [], [], {}
        for i, tok, lp in zip(live, tokens, lps):
            buffers[i].append(tok)
            buffer_lps[i].append(lp)
            wrapper = direct[i]
            if wrapper is not None and wrapper.buffer_token(tok):  # an inner token of the turn: reward 0
                buffer_rewards[i].append(0.0)
                still.append(i)
                extensions[row_of[i]] = [tok]
                continue
            with clock.verifying():
                obs, reward, terminated, truncated, info = envs[i].step(tok)
            buffer_rewards[i].append(float(reward))  # dense per-token rewards are kept where an env gives them
            turn_over = "finish_reason" in info
            if turn_over:
                _record_turn(episodes[i], buffers[i], buffer_lps[i], buffer_rewards[i], info["finish_reason"], obs,
                             terminated, truncated, info, version)
                buffers[i], buffer_lps[i], buffer_rewards[i] = [], [], []
                turn_of[i] += 1
            observations[i] = obs
            if not (terminated or truncated) and turn_of[i] < max_turns:
                still.append(i)
                extensions[row_of[i]] = _new_ids(session, row_of[i], obs["prompt_ids"], tok)
            else:
                finished.append(row_of[i])
        clock.episodes_done(len(finished))
        with clock.generating():  # the session's cache bookkeeping (a new context is prefilled here)
            session.drop(finished)
            stale = [r for r, ids in extensions.items() if ids is None]
            if stale:  # the observation rewrote the context: start those rows again from their full context
                session.drop(stale)
                fresh = session.add([observations[i]["prompt_ids"] for i in still if row_of[i] in stale])
                row_of.update(zip([i for i in still if row_of[i] in stale], fresh))
            session.extend({r: ids for r, ids in extensions.items() if ids is not None})
        live = still


def _new_ids(session, row: int, context, token: int) -> list[int] | None:
    """What ``context`` adds to ``row``'s cached ids (the token just sampled, maybe an env reply);
    ``None`` when it does not extend them."""
    n = session.context_length(row)
    if len(context) == n + 1 and int(context[-1]) == token:
        return [token]  # the common step: the observation grew by the sampled token
    ids = [int(t) for t in context]
    return ids[n:] if len(ids) > n and ids[:n] == session.context(row) else None
