"""verifiers (PrimeIntellect's ``verifiers`` 0.4, its ``verifiers.v1`` stack) environments as llmgym envs.

A verifiers environment is a *taskset* — tasks whose ``@vf.reward`` methods score a rollout's
``Trace`` (weighted; the weighted sum is ``trace.reward``) — played by an ``Env``: the plain
``SingleAgentEnv`` (one reply per task), or an ``Env`` subclass whose ``run(task, agents)`` drives a
multi-turn exchange through ``agents.<role>.interaction(task)`` and ``await interaction.turn(msg)``.

:func:`from_verifiers` gives either one as a Gymnasium env:

* single-turn (a taskset, or a ``SingleAgentEnv``) → a :class:`~llmgym.SequenceEnv` over the
  taskset's tasks, scored by :class:`VerifiersScorer`: the completion becomes the sampled assistant
  message of a verifiers ``Trace``, and the task's own ``Task.score(trace)`` runs — every
  ``@vf.reward`` (async or not, taking ``trace``/``task``/``runtime`` by name, as verifiers
  decides), their weighted sum the reward, each component in ``info["score"][name]``
  (``{"reward", "weight"}``, what :class:`~llmgym.agents.GDPO` reads), ``@vf.metric`` values in
  ``info["score"]["metrics"]``;
* multi-turn (an ``Env`` that overrides ``run``) → :class:`VerifiersEpisodeEnv`, a
  :class:`~llmgym.MultiTurnEnv` whose episode is the env's own ``run()``: the policy plays one
  role; each ``interaction.turn(message)`` shows ``message`` to the policy and takes its next
  completion; ``@vf.stop`` conditions on the trace end the exchange; when ``run()`` returns, the
  task's rewards, what ``run()`` recorded itself and the env's ``finalize()`` make the episode's
  one reward, given at its last step (earlier steps earn 0).

Model text meets code llmgym does not control here (a taskset's rewards may hand it to
math-verify, SymPy's ``parse_expr`` -- an ``eval`` --, a regex...), so that code runs in the sandbox
(:mod:`llmgym.interop.adapter_pools`): each completion is scored, and each turn of a multi-turn episode is
replayed from the episode's start, in a fresh sandboxed process killed after ``time_limit`` seconds;
only plain data (JSON) comes back, checked here. The taskset's module is loaded there from its own
directory, bound read-only (a class defined in ``__main__`` or a notebook travels by value). No sandbox
on this machine raises :class:`~llmgym.sandbox.SandboxUnavailableError` at construction (the one
opt-out is the sandbox's own, ``LLMGYM_ALLOW_UNSANDBOXED=1``).

What does not map (a clear ``ValueError`` at construction, never a silent 0): rewards, metrics or
hooks that need a runtime (a container or sandbox box), LLM graders (a model endpoint), tool
servers (MCP toolsets), ``@vf.stop`` conditions on a ``Request``/``Response``, prompt-less tasks,
multi-modal prompts, and ``run()`` code that drives a second agent (llmgym plays one role). The
harness (the program verifiers would run the model in) is not used: the policy answers directly.

Example:
    >>> from llmgym.interop import from_verifiers
    >>> env = from_verifiers(_doc_taskset())   # a taskset: What is i + i? (exact: 1.0, short: 0.05)
    >>> obs, info = env.reset(seed=0)
    >>> obs["prompt"]
    'user: What is 3 + 3?\\nassistant:'
    >>> obs, reward, terminated, truncated, info = env.step("6")
    >>> reward, info["score"]["exact"]
    (1.05, {'reward': 1.0, 'weight': 1.0})
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import inspect
import math
import sys
import threading
from typing import Any, Callable, Sequence

from llmgym.env.core import SequenceEnv
from llmgym.interop import adapter_pools
from llmgym.interop.episode_env import EpisodeError, ReplayEpisodeEnv
from llmgym.interop.in_sandbox import (  # noqa: F401  (append_message, new_trace, run_coroutine, scored: re-exported)
    ReplayChannel,
    append_message,
    new_trace,
    play_verifiers,
    replay,
    run_coroutine,
    score_reply,
    scored,
    stop_parameters,
)
from llmgym.sandbox.pool import DEFAULT_POOL_SIZE
from llmgym.env.types import Score, Task
from llmgym.env.verifiers import Verifier
from llmgym.runtime.install import import_optional

__all__ = ["from_verifiers", "VerifiersScorer", "VerifiersEpisodeEnv", "checked_parts", "verifiers_tasks"]

DEFAULT_INFINITE_TASKS = 1000
"""Tasks taken from an infinite (procedural) taskset when ``num_tasks`` is not given."""
TASK_KEY = "verifiers_task"
"""``Task.metadata`` key holding the verifiers ``Task`` object an llmgym task was made from."""


def import_verifiers() -> Any:
    """``verifiers.v1``, or a ``ModuleNotFoundError`` saying how to install it."""
    return import_optional("verifiers.v1", extra="verifiers", distribution="verifiers", needed_by="the verifiers adapter")


# ------------------------------------------------------------------------------------------------
# tasks and traces


def _chat_messages(vf: Any, data: Any) -> list[dict[str, str]]:
    """The task's opening messages as llmgym chat messages (system prompt first)."""
    messages = []
    if data.system_prompt:
        messages.append({"role": "system", "content": data.system_prompt})
    prompt = data.prompt
    if isinstance(prompt, str):
        return messages + [{"role": "user", "content": prompt}]
    for message in prompt:
        content = message.content
        if not isinstance(content, (str, type(None))) and any(
                not isinstance(part, vf.TextContentPart) for part in content):
            raise ValueError(f"task {data.idx}: a multi-modal prompt (images) does not map to an llmgym text env")
        messages.append({"role": message.role, "content": vf.types.content_text(content)})
    return messages


def _llmgym_task(vf: Any, vf_task: Any, index: int, label: str) -> Task:
    data = vf_task.data
    if data.prompt is None:
        raise ValueError(f"{label}: task {index} has no prompt (the env opens the exchange); prompt-less tasks "
                         f"do not map to an llmgym env, whose observation starts with the task's prompt")
    task_id = data.id or data.name or f"{label}#{data.idx if data.idx is not None else index}"
    answer = getattr(data, "answer", None)
    return Task(_chat_messages(vf, data), answer=answer, id=str(task_id), metadata={TASK_KEY: vf_task})


def _requires_runtime(fn: Callable) -> bool:
    parameter = inspect.signature(fn).parameters.get("runtime")
    return parameter is not None and parameter.default is inspect.Parameter.empty


def _check_offline(vf: Any, vf_task: Any, label: str, *, multi_turn: bool) -> None:
    """What the adapter cannot run, said at construction (a silent 0 would train on a lie)."""
    cls = type(vf_task)
    problems = []
    if getattr(cls, "NEEDS_CONTAINER", False):
        problems.append("its tasks need a container (NEEDS_CONTAINER)")
    for hook in ("setup", "finalize", "stage_verifier"):
        if getattr(cls, hook) is not getattr(vf.Task, hook):
            problems.append(f"its tasks override {hook}(trace, runtime), which needs a runtime box")
    rewards, metrics = vf_task.hooks("reward"), vf_task.hooks("metric")
    needy = [fn.__name__ for fn in (*rewards, *metrics) if _requires_runtime(fn)]
    if needy:
        problems.append(f"reward/metric functions {needy} need a runtime box")
    if vf_task.plugged_judges():
        problems.append("it scores with LLM graders (a model endpoint)")
    if cls.toolsets(vf_task.config):
        problems.append("its tasks give the model tool servers (MCP toolsets)")
    if not rewards and not multi_turn:
        problems.append("its tasks declare no @vf.reward: there is nothing to score")
    from verifiers.v1.session import hook_boundary

    typed_stops = [fn.__name__ for fn in vf_task.hooks("stop") if hook_boundary(fn, allow_trace=True) is not vf.Trace]
    if typed_stops:
        problems.append(f"@vf.stop conditions {typed_stops} read a Request/Response, which llmgym does not build")
    if problems:
        raise ValueError(f"{label} cannot run as an llmgym env: " + "; ".join(problems))


def verifiers_tasks(taskset: Any, *, num_tasks: int | None = None, label: str = "verifiers") -> list[Task]:
    """The taskset's tasks as llmgym :class:`~llmgym.Task`\\ s (the verifiers task in ``metadata["verifiers_task"]``).

    A finite taskset gives every task (or its first ``num_tasks``); an infinite (procedural) one its
    first ``num_tasks`` (default :data:`DEFAULT_INFINITE_TASKS`).
    """
    vf = import_verifiers()
    if num_tasks is not None and num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    if not taskset.bounded and num_tasks is None:
        num_tasks = DEFAULT_INFINITE_TASKS
    view = taskset.take(num_tasks) if num_tasks is not None else taskset
    tasks = [_llmgym_task(vf, vf_task, i, label) for i, vf_task in enumerate(view)]
    if not tasks:
        raise ValueError(f"{label}: the taskset yielded no tasks")
    return tasks


def _vf_task(task: Task) -> Any:
    vf_task = task.metadata.get(TASK_KEY)
    if vf_task is None:
        raise ValueError("this task was not made from a verifiers task (no metadata['verifiers_task']): "
                         "build tasks with llmgym.interop.verifiers_in.verifiers_tasks")
    return vf_task


def _llmgym_own(vf_obj: Any) -> bool:
    """Whether ``vf_obj`` is llmgym's own verifiers taskset task or env (:mod:`~llmgym.interop.verifiers_taskset`),
    exactly (not a subclass): its reward is an llmgym verifier, which isolates what it hands to third-party
    code itself; it runs here (the sandbox has no llmgym)."""
    module = sys.modules.get("llmgym.interop.verifiers_taskset")
    if module is None or type(vf_obj) not in (module.LlmgymTask, module.LlmgymEnv):
        return False
    config = getattr(vf_obj, "config", None)  # a task whose config plugs in other functions is not ours alone
    return not any(getattr(config, name, None) for name in ("rewards", "metrics", "stops", "judges"))


def _reference_answer(vf_task: Any) -> str:
    """Trusted text to re-run a check on: the task's own answer where it has a text one, else ``""``."""
    answer = getattr(vf_task.data, "answer", None)
    return answer if isinstance(answer, str) else ""


_MAX_PARTS = 256


def checked_parts(parts: Any) -> tuple[float, dict[str, Any]]:
    """``(reward, parts)`` from a scored trace's parts as they came back from the sandbox, or a ``ValueError``.

    Each part must be ``{"reward": finite, "weight": finite}``, ``metrics`` finite numbers; the reward is
    their weighted sum, computed here (as verifiers computes ``trace.reward``).

    Example:
        >>> from llmgym.interop.verifiers_in import checked_parts
        >>> checked_parts({"exact": {"reward": 1.0, "weight": 1.0}, "short": {"reward": 1.0, "weight": 0.05}})[0]
        1.05
        >>> checked_parts({"exact": {"reward": float("nan"), "weight": 1.0}})
        Traceback (most recent call last):
        ...
        ValueError: the sandbox's scores are not plain finite numbers
    """
    def finite(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    if not isinstance(parts, dict) or len(parts) > _MAX_PARTS or not all(isinstance(k, str) for k in parts):
        raise ValueError("the sandbox's scores are not a table of named parts")
    metrics = parts.get("metrics", {})
    if not isinstance(metrics, dict) or not all(isinstance(k, str) and finite(v) for k, v in metrics.items()):
        raise ValueError("the sandbox's metrics are not plain finite numbers")
    rewards = {name: part for name, part in parts.items() if name != "metrics"}
    if not all(isinstance(p, dict) and set(p) == {"reward", "weight"} and finite(p["reward"]) and finite(p["weight"])
               for p in rewards.values()):
        raise ValueError("the sandbox's scores are not plain finite numbers")
    total = sum(float(p["reward"]) * float(p["weight"]) for p in rewards.values())
    if not math.isfinite(total):
        raise ValueError("the sandbox's scores add up to a non-finite reward")
    return total, parts


class VerifiersScorer(Verifier):
    """Score a completion with the verifiers task's own rewards: ``Task.score(trace)`` on a one-reply trace, adapter_pools.

    The llmgym task must come from :func:`verifiers_tasks` (the verifiers task in its metadata). The
    reward is ``trace.reward`` (the weighted sum, recomputed here from the parts); ``info`` holds each
    component (``{"reward", "weight"}``) and ``metrics``. Each completion is scored in its own sandboxed
    process (:mod:`llmgym.interop.adapter_pools`), killed after ``time_limit`` seconds (``None``: the
    worker's 60 s); a reward function that raises, hangs or crashes scores 0 with the error. One that
    cannot import a module -- on the completion and again on the task's own answer -- raises
    (:class:`~llmgym.env.verifiers.VerifierUnavailableError`), as does a missing sandbox.

    Example:
        >>> from llmgym.interop.verifiers_in import VerifiersScorer, verifiers_tasks
        >>> task = verifiers_tasks(_doc_taskset())[1]
        >>> scorer = VerifiersScorer()
        >>> scorer(task, "2").reward, scorer(task, "two").reward
        (1.05, 0.0)
    """

    def __init__(self, time_limit: float | None = 30.0) -> None:
        super().__init__(time_limit)
        self._prefetched: dict[tuple[int, str], list[Score]] = {}
        self._payloads: dict[int, tuple[Any, adapter_pools.Payload]] = {}
        self._lock = threading.Lock()

    def _safe(self, task: Task, completion: str) -> Score:
        return self._guarded(task, completion)  # the sandbox enforces time_limit: no fork of this process

    def payload(self, vf_task: Any) -> adapter_pools.Payload:
        """The sandbox's copy of ``vf_task`` (made once per task)."""
        with self._lock:
            held = self._payloads.get(id(vf_task))
        if held is not None and held[0] is vf_task:
            return held[1]
        payload = adapter_pools.make_payload("verifiers", {"op": "score", "task": vf_task})
        with self._lock:
            if len(self._payloads) >= 4096:
                self._payloads.clear()
            self._payloads[id(vf_task)] = (vf_task, payload)
        return payload

    def check(self, task: Task) -> None:
        """Raise now what scoring ``task`` would raise first (a module the sandbox cannot read, no sandbox)."""
        vf_task = _vf_task(task)
        if not _llmgym_own(vf_task):
            adapter_pools.check_available(self.payload(vf_task))

    def prefetch(self, tasks: Sequence[Task], completions: Sequence[str]) -> None:
        """Score a rollout turn's completions ahead of the envs' calls, each in its own sandboxed child, on
        up to :data:`~llmgym.sandbox.pool.DEFAULT_POOL_SIZE` workers at once (one per 8 completions: a
        worker's start costs seconds, a check tens of milliseconds); the envs' calls read them."""
        self._prefetched = {}
        if not tasks:
            return
        with concurrent.futures.ThreadPoolExecutor(min(DEFAULT_POOL_SIZE, max(1, len(tasks) // 8))) as pool:
            scores = list(pool.map(self._guarded, tasks, completions))
        for task, completion, score in zip(tasks, completions, scores):
            self._prefetched.setdefault((id(task), completion), []).append(score)

    def __call__(self, task: Task, completion: str) -> Score:
        prefetched = self._prefetched.get((id(task), completion))
        if prefetched:
            return prefetched.pop(0)
        return super().__call__(task, completion)

    def verify_batch(self, tasks: Sequence[Task], completions: Sequence[str],
                     max_workers: int | None = None) -> list[Score]:
        """Every completion scored, concurrently on the pool's workers (see :meth:`prefetch`)."""
        if len(tasks) != len(completions):
            raise ValueError(f"verify_batch got {len(tasks)} tasks but {len(completions)} completions")
        self.prefetch(tasks, completions)
        return [self(t, c) for t, c in zip(tasks, completions)]

    def verify(self, task: Task, completion: str) -> Score:
        vf_task = _vf_task(task)
        if _llmgym_own(vf_task):  # llmgym's own verifier scores; it isolates what it must itself
            reward, parts = checked_parts(score_reply(import_verifiers(), vf_task, completion))
            return Score(reward, parts)
        payload = self.payload(vf_task)
        status, answer = adapter_pools.run(payload, completion, self.time_limit)
        failed = adapter_pools.failure(status, answer, self.time_limit)
        if failed is not None:
            if failed["import_error"]:
                adapter_pools.reference_check(payload, _reference_answer(vf_task), self.time_limit, failed,
                                          f"the reward functions of {type(vf_task).__name__}")
            return Score(0.0, {"error": failed["error"]})
        try:
            reward, parts = checked_parts(answer.get("score"))
        except ValueError as exc:
            return Score(0.0, {"error": str(exc)})
        return Score(reward, parts)


# ------------------------------------------------------------------------------------------------
# multi-turn: the env's own run(), with the policy as one agent, replayed in the sandbox turn by turn


class VerifiersEpisodeEnv(ReplayEpisodeEnv):
    """A verifiers ``Env``'s own multi-turn ``run()`` as a :class:`~llmgym.MultiTurnEnv` (see the module docstring).

    Every turn replays the episode -- ``setup``, ``run()`` up to the policy's next turn, at the end the
    task's rewards and ``finalize`` -- from its start in a fresh sandboxed process
    (:class:`~llmgym.interop.episode_env.ReplayEpisodeEnv`), with ``random`` (and numpy's generator) seeded
    from the task; ``time_limit`` bounds each such call. A failure of the env's code, a time-out, or a run
    that ends with an error ends the episode with reward 0 and the error in ``info["error"]``; one that
    fails before the policy first speaks raises at ``reset``. After ``max_turns`` completions the env's next
    ``turn()`` is refused (``"max_turns"``, as verifiers' own turn limit) and the partial trajectory is
    scored: that step is ``truncated``; a ``run()`` that ends by itself on the last turn ``terminated`` as
    usual. llmgym's own :class:`~llmgym.interop.verifiers_taskset.LlmgymEnv` (an llmgym env handed out and
    back) is replayed in this process: its reward is an llmgym env's, which isolates what it must itself.

    Args:
        tasks: llmgym tasks from :func:`verifiers_tasks`.
        vf_env: the verifiers ``Env``.
        role: the agent llmgym's policy plays (one of the env config's ``AgentConfig`` fields).
        (others as :class:`~llmgym.MultiTurnEnv`)
    """

    def __init__(self, tasks: Any, vf_env: Any, role: str, tokenizer: Any = None, *, max_turns: int = 8,
                 time_limit: float | None = 30.0, **kwargs: Any) -> None:
        super().__init__(tasks, None, tokenizer, max_turns=max_turns, **kwargs)
        self.vf_env, self.role, self.time_limit = vf_env, role, time_limit
        self._payloads: dict[int, tuple[Any, adapter_pools.Payload]] = {}

    def payload(self, vf_task: Any) -> adapter_pools.Payload:
        """The sandbox's copy of the env and ``vf_task`` (made once per task)."""
        held = self._payloads.get(id(vf_task))
        if held is not None and held[0] is vf_task:
            return held[1]
        payload = adapter_pools.make_payload("verifiers", {
            "op": "vf_episode", "env": self.vf_env, "task": vf_task, "role": self.role,
            "stop_params": stop_parameters(import_verifiers(), vf_task)})
        if len(self._payloads) >= 1024:
            self._payloads.clear()
        self._payloads[id(vf_task)] = (vf_task, payload)
        return payload

    def play(self, task: Task, completions: list[str], replies: list[str | None]) -> dict[str, Any]:
        vf_task = _vf_task(task)
        if _llmgym_own(self.vf_env):
            channel = ReplayChannel(completions, replies, self.max_turns)
            try:
                return replay(play_verifiers(import_verifiers(), self.vf_env, vf_task, self.role), channel)
            except Exception as exc:  # the llmgym env's own failure: the completion's 0, as in env.step
                raise EpisodeError(f"{type(exc).__name__}: {exc}") from exc
        seed = int(hashlib.sha256(str(task.id).encode()).hexdigest()[:8], 16)
        return self.run_sandboxed(self.payload(vf_task), {"seed": seed, "completions": completions,
                                                          "replies": replies, "max_turns": self.max_turns})

    def finished(self, reward: float, info: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        if _llmgym_own(self.vf_env):
            return reward, info
        reward, parts = checked_parts(info.get("score"))
        stop = info.get("stop_condition")
        return reward, {"score": parts, "stop_condition": stop if isinstance(stop, str) else None}

    def describe(self) -> str:
        return f"{type(self.vf_env).__name__}.run()"


# ------------------------------------------------------------------------------------------------


def _load(source: Any, taskset: dict[str, Any] | None) -> tuple[Any, Any, str]:
    """``(vf_env or None, taskset, label)`` for a module id, a verifiers ``Env`` or a ``Taskset``."""
    vf = import_verifiers()
    if isinstance(source, str):
        config = vf.resolve_env_config({"taskset": {**(taskset or {}), "id": source}})
        env = vf.load_environment(config)
        return env, env.taskset, source
    if taskset:
        raise ValueError("taskset= configures a taskset loaded by id; pass a module id, or configure your object")
    if isinstance(source, vf.Env):
        return source, source.taskset, source.config.env_id or type(source).__name__
    if isinstance(source, vf.Taskset):
        return None, source, source.config.id or type(source).__name__
    raise TypeError(f"from_verifiers takes a verifiers environment module id (str), a verifiers.v1.Env or a "
                    f"verifiers.v1.Taskset; got {type(source).__name__}")


def from_verifiers(source: Any, tokenizer: Any = None, *, taskset: dict[str, Any] | None = None,
                   num_tasks: int | None = None, role: str | None = None, max_turns: int = 8,
                   time_limit: float | None = 30.0, **env_kwargs: Any) -> SequenceEnv:
    """A verifiers environment as an llmgym env (single-turn: :class:`~llmgym.SequenceEnv`; multi-turn:
    :class:`VerifiersEpisodeEnv`); see the module docstring for what maps and how.

    Args:
        source: a verifiers environment's module id (``"echo_taskset"``: an installed package or a module on
            ``sys.path`` that exports its ``Taskset``, and its ``Env`` if it has one, in ``__all__``), a
            ``verifiers.v1.Env`` or a ``verifiers.v1.Taskset``.
        tokenizer: as for any llmgym env.
        taskset: with a module id, the taskset's config fields (``{"num_tasks": 10}``).
        num_tasks: take only the first N tasks (an infinite taskset: default 1000).
        role: the agent the policy plays in a multi-agent ``Env`` (default: its only one).
        max_turns: completions per multi-turn episode at most.
        time_limit: seconds a scoring (single-turn) or one turn of the episode (multi-turn, replayed from
            its start) may take in the sandbox, whose process is killed at the limit; ``None``: 60 s.
        env_kwargs: passed to the llmgym env (``max_prompt_chars=``, ``render_mode=``...).
    """
    vf = import_verifiers()
    vf_env, vf_taskset, label = _load(source, taskset)
    tasks = verifiers_tasks(vf_taskset, num_tasks=num_tasks, label=label)
    multi_turn = vf_env is not None and type(vf_env).run is not vf.SingleAgentEnv.run
    _check_offline(vf, tasks[0].metadata[TASK_KEY], label, multi_turn=multi_turn)
    if not multi_turn:
        if role is not None:
            raise ValueError(f"role= picks the agent of a multi-agent env; {label} is single-turn (one agent)")
        scorer = VerifiersScorer(time_limit)
        scorer.check(tasks[0])  # a module the sandbox cannot read, or no sandbox: said now, not at the first step
        return SequenceEnv(tasks, scorer, tokenizer, **env_kwargs)
    from verifiers.v1.configs.agent import agent_config_fields

    roles = list(agent_config_fields(vf_env.config))
    if role is None:
        if len(roles) != 1:
            raise ValueError(f"{label} declares agents {roles}: choose the one the policy plays with role=")
        role = roles[0]
    elif role not in roles:
        raise ValueError(f"{label} has no agent {role!r}; its agents are {roles}")
    env = VerifiersEpisodeEnv(tasks, vf_env, role, tokenizer, max_turns=max_turns, time_limit=time_limit,
                              **env_kwargs)
    if not _llmgym_own(vf_env):
        adapter_pools.check_available(env.payload(tasks[0].metadata[TASK_KEY]))
    return env


def _doc_taskset() -> Any:
    """A small addition taskset for the examples: ``exact`` (weight 1) and ``short`` (weight 0.05)."""
    vf = import_verifiers()

    class AddData(vf.TaskData):
        answer: str

    class AddTask(vf.Task[AddData]):
        @vf.reward
        async def exact(self, trace: vf.Trace) -> float:
            return float(trace.last_reply == self.data.answer)

        @vf.reward(weight=0.05)
        async def short(self, trace: vf.Trace) -> float:  # a right answer without padding
            return float(trace.last_reply == self.data.answer and len(trace.last_reply) < 8)

    class AddTaskset(vf.Taskset[AddTask, vf.TasksetConfig]):
        def load(self):
            return [AddTask(AddData(idx=i, prompt=f"What is {i} + {i}?", answer=str(2 * i))) for i in range(4)]

    return AddTaskset(vf.TasksetConfig())
