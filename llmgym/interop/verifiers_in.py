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
math-verify, SymPy, a regex...): by default (``time_limit=30``) scoring runs in a forked process
killed at the limit, and a multi-turn episode runs in its own process for its whole length
(:class:`~llmgym.interop.worker.EpisodeWorker`), from which only plain data (JSON) comes back.
``time_limit=None`` scores single-turn tasks in the calling process (for scorers you trust with
model text).

What does not map (a clear ``ValueError`` at construction, never a silent 0): rewards, metrics or
hooks that need a runtime (a container or sandbox box), LLM judges (a model endpoint), tool
servers (MCP toolsets), ``@vf.stop`` conditions on a ``Request``/``Response``, prompt-less tasks,
multi-modal prompts, and ``run()`` code that drives a second agent (llmgym plays one role). The
harness (the program verifiers would run the model in) is not used: the policy answers directly.

Example:
    >>> from llmgym.interop import from_verifiers
    >>> env = from_verifiers(_doc_taskset(), time_limit=None)   # a taskset: What is i + i? (exact: 1.0, short: 0.05)
    >>> obs, info = env.reset(seed=0)
    >>> obs["prompt"]
    'user: What is 3 + 3?\\nassistant:'
    >>> obs, reward, terminated, truncated, info = env.step("6")
    >>> reward, info["score"]["exact"]
    (1.05, {'reward': 1.0, 'weight': 1.0})
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
from typing import Any, Callable, Sequence

from llmgym.core import SequenceEnv
from llmgym.interop.adapters import import_package
from llmgym.interop.episode_env import WorkerEpisodeEnv
from llmgym.interop.worker import Channel, map_in_child
from llmgym.types import Score, Task
from llmgym.verifiers import Verifier

__all__ = ["from_verifiers", "VerifiersScorer", "VerifiersEpisodeEnv", "verifiers_tasks"]

DEFAULT_INFINITE_TASKS = 1000
"""Tasks taken from an infinite (procedural) taskset when ``num_tasks`` is not given."""
TASK_KEY = "verifiers_task"
"""``Task.metadata`` key holding the verifiers ``Task`` object an llmgym task was made from."""


def import_verifiers() -> Any:
    """``verifiers.v1``, or a ``ModuleNotFoundError`` saying how to install it."""
    return import_package("verifiers", "verifiers.v1")


def run_coroutine(coroutine: Any) -> Any:
    """Run ``coroutine`` to completion from synchronous code, also where an event loop is running (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a fresh loop on a helper thread
        return pool.submit(asyncio.run, coroutine).result()


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
        problems.append("it scores with LLM judges (a model endpoint)")
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


def new_trace(vf: Any, vf_task: Any, name: str = "llmgym") -> Any:
    """A verifiers ``Trace`` holding the task's opening messages, as a rollout starts one."""
    from verifiers.v1.state import state_cls

    trace = vf.Trace(task=vf.TraceTask(type=type(vf_task).__name__, data=vf_task.data, key=vf_task.key,
                                       hash=vf_task.hash),
                     state=state_cls(type(vf_task))(), agent=vf.AgentInfo(config=vf.AgentConfig(), name=name))
    opening = []
    if vf_task.data.system_prompt:
        opening.append(vf.SystemMessage(content=vf_task.data.system_prompt))
    prompt = vf_task.data.prompt
    opening += [vf.UserMessage(content=prompt)] if isinstance(prompt, str) else list(prompt or [])
    for message in opening:
        append_message(vf, trace, message)
    return trace


def append_message(vf: Any, trace: Any, message: Any, sampled: bool = False) -> None:
    """Append ``message`` to the trace's single branch (``sampled``: the policy wrote it)."""
    from verifiers.v1.graph import MessageNode

    parent = len(trace.nodes) - 1 if trace.nodes else None
    trace.nodes.append(MessageNode(parent=parent, message=message, sampled=sampled))


def scored(trace: Any) -> dict[str, Any]:
    """``{name: {"reward", "weight"}, ..., "metrics": {...}}`` from a scored trace; raises if a signal did not run."""
    missing = [name for name, reward in trace.rewards.items() if reward is None]
    if missing:
        raise RuntimeError(f"verifiers did not score {missing}")
    parts: dict[str, Any] = {name: {"reward": r.score, "weight": r.weight} for name, r in trace.rewards.items()}
    metrics = {name: value for name, value in trace.metrics.items() if value is not None}
    if metrics:
        parts["metrics"] = metrics
    return parts


class VerifiersScorer(Verifier):
    """Score a completion with the verifiers task's own rewards: ``Task.score(trace)`` on a one-reply trace.

    The llmgym task must come from :func:`verifiers_tasks` (the verifiers task in its metadata). The
    reward is ``trace.reward`` (the weighted sum); ``info`` holds each component
    (``{"reward", "weight"}``) and ``metrics``. A reward function that raises scores 0 with the
    error, as any llmgym verifier. ``time_limit`` (default 30 s) runs each scoring in a forked
    process killed at the limit; ``None`` scores in this process.

    Example:
        >>> from llmgym.interop.verifiers_in import VerifiersScorer, verifiers_tasks
        >>> task = verifiers_tasks(_doc_taskset())[1]
        >>> scorer = VerifiersScorer(time_limit=None)
        >>> scorer(task, "2").reward, scorer(task, "two").reward
        (1.05, 0.0)
    """

    def __init__(self, time_limit: float | None = 30.0) -> None:
        super().__init__(time_limit)
        self._prefetched: dict[tuple[int, str], list[Score]] = {}

    def prefetch(self, tasks: Sequence[Task], completions: Sequence[str]) -> None:
        """Score a rollout turn's completions in one forked process (not one per completion); the envs' calls read them.

        Each completion still has ``time_limit`` seconds; one that overstays is scored 0 ("timeout")
        and the ones after it are left to the envs' own calls (one process each).
        """
        self._prefetched = {}
        if self.time_limit is None or not tasks:
            return

        def score(index: int) -> dict[str, Any]:
            result = self._guarded(tasks[index], completions[index])
            return {"reward": result.reward, "info": result.info}

        for index, result in enumerate(map_in_child(score, list(range(len(tasks))), self.time_limit)):
            if result is None:
                continue
            status, value = result
            reward_ok = status == "ok" and isinstance(value, dict) and isinstance(value.get("reward"), (int, float))
            self._prefetched.setdefault((id(tasks[index]), completions[index]), []).append(
                Score(value["reward"], value.get("info") or {}) if reward_ok else
                Score(0.0, {"error": value if status == "error" else "the scoring process sent bad data"}))

    def __call__(self, task: Task, completion: str) -> Score:
        prefetched = self._prefetched.get((id(task), completion))
        if prefetched:
            return prefetched.pop(0)
        return super().__call__(task, completion)

    def verify_batch(self, tasks: Sequence[Task], completions: Sequence[str],
                     max_workers: int | None = None) -> list[Score]:
        """Every completion scored in one forked process (see :meth:`prefetch`)."""
        if len(tasks) != len(completions):
            raise ValueError(f"verify_batch got {len(tasks)} tasks but {len(completions)} completions")
        self.prefetch(tasks, completions)
        return [self(t, c) for t, c in zip(tasks, completions)]

    def verify(self, task: Task, completion: str) -> Score:
        vf = import_verifiers()
        vf_task = task.metadata.get(TASK_KEY)
        if vf_task is None:
            raise ValueError("this task was not made from a verifiers task (no metadata['verifiers_task']): "
                             "build tasks with llmgym.interop.verifiers_in.verifiers_tasks")
        trace = new_trace(vf, vf_task)
        append_message(vf, trace, vf.AssistantMessage(content=completion), sampled=True)
        trace.stop("agent_completed")
        run_coroutine(vf_task.score(trace))
        return Score(trace.reward, scored(trace))


# ------------------------------------------------------------------------------------------------
# multi-turn: the env's own run(), with the policy as one agent


class _PolicyInteraction:
    """``agent.interaction(task)`` for the policy: each ``turn`` asks the llmgym env's policy (over the channel)."""

    def __init__(self, vf: Any, vf_task: Any, channel: Channel) -> None:
        self._vf, self._task, self._channel = vf, vf_task, channel
        self.trace = new_trace(vf, vf_task)
        self._stops = vf_task.hooks("stop")
        self._started = self._over = self._closed = self._limit_reached = False

    async def turn(self, message: Any = None) -> Any:
        from verifiers.v1.agent import Segment

        vf = self._vf
        if self._closed:
            raise RuntimeError("this interaction is closed")
        if self._over:
            raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
        if self._limit_reached:  # as verifiers' own turn limit: the turn after the last one is refused
            self.trace.stop("max_turns")
        if self.trace.stop_condition is not None:  # a @stop or the turn limit ended it: this turn is refused
            self._over = True
            return Segment(messages=[], terminated=True)
        prompted = not self._started and self._task.data.prompt is not None
        if message is None and not prompted:
            raise ValueError("nothing to run a turn on: a bare turn() takes a prompted task's opening reply")
        if message is not None and prompted:
            raise ValueError("the task's prompt opens this exchange: take its first reply with a bare turn()")
        shown = None
        if message is not None:
            from verifiers.v1.dialects.chat import parse_message

            messages = [vf.UserMessage(content=message)] if isinstance(message, str) else [
                parse_message(m) if isinstance(m, dict) else m for m in message]
            for item in messages:
                append_message(vf, self.trace, item)
            shown = "\n\n".join(vf.types.content_text(item.content) for item in messages)
        self._started = True
        completion = self._channel.ask(shown)
        reply = vf.AssistantMessage(content=completion)
        append_message(vf, self.trace, reply, sampled=True)
        self._limit_reached = self._channel.last
        from verifiers.v1.utils.decorators import invoke

        for stop in self._stops:
            verdict = invoke(stop, {"trace": self.trace, vf.Trace: self.trace})
            if inspect.isawaitable(verdict):
                verdict = await verdict
            if verdict:
                self.trace.stop(stop.__name__)
                break
        return Segment(messages=[reply])

    async def send(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("steering/queued user messages (interaction.send/steer) do not map to an llmgym "
                                  "env: use interaction.turn(message)")

    steer = send

    async def close(self) -> Any:
        if not self._closed:
            self._closed = True
            self.trace.stop("user_closed")
            await self._task.score(self.trace)
            self.trace.ok = True
        return self.trace


class _PolicyAgent:
    """The one agent llmgym's policy plays: ``interaction(task)`` and ``run(task)`` over the channel."""

    trainable = True

    def __init__(self, vf: Any, name: str, channel: Channel) -> None:
        self._vf, self.name, self._channel = vf, name, channel
        self.traces: list[Any] = []

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_: Any):
        if self.traces:
            raise RuntimeError(f"agent {self.name!r} was asked for a second rollout in one episode; llmgym plays "
                               f"one exchange per episode")
        interaction = _PolicyInteraction(self._vf, task, self._channel)
        self.traces.append(interaction.trace)
        try:
            yield interaction
        finally:
            await interaction.close()

    async def run(self, task: Any, **_: Any) -> Any:
        async with self.interaction(task) as interaction:
            await interaction.turn()
        return interaction.trace


class _PolicyAgents:
    """``agents`` as ``Env.run`` sees it: the policy's role, and a clear error for any other."""

    def __init__(self, role: str, agent: _PolicyAgent, roles: Sequence[str]) -> None:
        self._role, self._agent, self._roles = role, agent, list(roles)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name == self._role:
            return self._agent
        if name in self._roles:
            raise RuntimeError(f"this env's run() uses agent {name!r}; llmgym's policy plays {self._role!r} only and "
                               f"cannot run a second agent")
        raise AttributeError(f"no agent {name!r}; this env declares {self._roles}")


async def _play(vf_env: Any, vf_task: Any, role: str, channel: Channel) -> None:
    vf = import_verifiers()
    from verifiers.v1.configs.agent import agent_config_fields

    agent = _PolicyAgent(vf, role, channel)
    agents = _PolicyAgents(role, agent, list(agent_config_fields(vf_env.config)))
    await vf_env.setup(agents)
    await vf_env.run(vf_task, agents)
    if not agent.traces:
        raise RuntimeError(f"{type(vf_env).__name__}.run() never let agent {role!r} speak")
    (trace,) = agent.traces
    episode = vf.Episode(env=vf.EnvInfo(id=vf_env.config.env_id), task=trace.task, traces=[trace])
    await vf_env.finalize(vf_task, episode)
    channel.finish(trace.reward, {"score": scored(trace), "stop_condition": trace.stop_condition})


def _episode(vf_env: Any, vf_task: Any, role: str) -> Callable[[Channel], None]:
    def play(channel: Channel) -> None:
        asyncio.run(_play(vf_env, vf_task, role, channel))

    return play


class VerifiersEpisodeEnv(WorkerEpisodeEnv):
    """A verifiers ``Env``'s own multi-turn ``run()`` as a :class:`~llmgym.MultiTurnEnv` (see the module docstring).

    Each episode runs in a forked process (:class:`~llmgym.interop.episode_env.WorkerEpisodeEnv`)
    started at ``reset``; ``time_limit`` bounds every wait for it (the env's work between two
    turns). A failure of the env's code, a time-out, or a run that ends with an error ends the
    episode with reward 0 and the error in ``info["error"]``; one that fails before the policy first
    speaks raises at ``reset``. After ``max_turns`` completions the env's next ``turn()`` is refused
    (``"max_turns"``, as verifiers' own turn limit) and the partial trajectory is scored: that step
    is ``truncated``; a ``run()`` that ends by itself on the last turn ``terminated`` as usual.

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

    def episode(self, task: Task) -> Callable[[Channel], None]:
        vf_task = task.metadata.get(TASK_KEY)
        if vf_task is None:
            raise ValueError("this task was not made from a verifiers task (no metadata['verifiers_task'])")
        return _episode(self.vf_env, vf_task, self.role)

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
        source: an installed verifiers environment's module id (``"reverse_text"``: the package that
            exports its ``Taskset``, and its ``Env`` if it has one), a ``verifiers.v1.Env`` or a
            ``verifiers.v1.Taskset``.
        tokenizer: as for any llmgym env.
        taskset: with a module id, the taskset's config fields (``{"num_tasks": 10}``).
        num_tasks: take only the first N tasks (an infinite taskset: default 1000).
        role: the agent the policy plays in a multi-agent ``Env`` (default: its only one).
        max_turns: completions per multi-turn episode at most.
        time_limit: seconds a scoring (single-turn) or one wait for the episode (multi-turn) may
            take, in a process killed at the limit; ``None``: single-turn scoring in this process.
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
        return SequenceEnv(tasks, VerifiersScorer(time_limit), tokenizer, **env_kwargs)
    from verifiers.v1.configs.agent import agent_config_fields

    roles = list(agent_config_fields(vf_env.config))
    if role is None:
        if len(roles) != 1:
            raise ValueError(f"{label} declares agents {roles}: choose the one the policy plays with role=")
        role = roles[0]
    elif role not in roles:
        raise ValueError(f"{label} has no agent {role!r}; its agents are {roles}")
    return VerifiersEpisodeEnv(tasks, vf_env, role, tokenizer, max_turns=max_turns, time_limit=time_limit,
                               **env_kwargs)


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
