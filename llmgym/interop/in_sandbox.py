"""What runs inside the sandbox for the interop adapters: third-party code that reads model text.

A verifiers reward function may hand a completion to math-verify or SymPy (``parse_expr`` is an
``eval``), a verifiers ``run()`` and a TextArena game parse every move: code llmgym does not control,
fed hostile text. This file is the *source* of the adapters' :class:`~llmgym.sandbox.worker.SandboxWorker`
(:mod:`llmgym.interop.adapter_pools` reads it as text and starts it in the sandbox). Inside, it imports the
standard library, ``cloudpickle`` (to load what the host pickled by value) and verifiers or TextArena --
never llmgym, which the sandbox does not see. Keep it so.

The worker's three hooks:

* ``setup()`` (once, in the zygote): imports the adapter's package (``LLMGYM_INTEROP_KIND``) and warms
  verifiers' lazily built parts up on a task of its own;
* ``prepare(context)`` (per call, in the zygote, trusted data only): unpickles the host's *payload* once
  per key and keeps it -- the user's objects (a verifiers task or env, a TextArena opponent), imported
  from the directories bound read-only for them;
* ``handle(payload, request)`` (per call, in a fresh child under an unprivileged uid): the request holds
  model text. ``"score"``: one completion in a one-reply trace, scored by the task's own
  ``Task.score(trace)``. ``"vf_episode"`` / ``"textarena"``: an episode *replayed* from its start with
  every completion so far, up to the next event -- a child lives for one call, so an episode's state is
  its seed and its completions (each turn re-checks the replies the host already has, so an episode that
  does not reproduce says so instead of drifting).

Each answer is plain data -- ``{"score": ...}``, ``{"turn": reply}``, ``{"done": {"reward", "info"}}``,
``{"failed": {...}}`` -- decoded and checked on the host: a payload that ran code here can only lie
about its own call.

The host imports this module too, for what touches no model text there (the opening of a game, the
default opponent, traces of llmgym's own tasksets, which llmgym's verifiers score).

Example:
    >>> from llmgym.interop.in_sandbox import ReplayChannel, replay
    >>> def echo_twice(channel):
    ...     first = channel.ask(None)
    ...     second = channel.ask(f"you said {first!r}; again?")
    ...     channel.finish(float(first == second), {"said": [first, second]})
    >>> replay(echo_twice, ReplayChannel(["hi"], [None], max_turns=4))
    {'turn': "you said 'hi'; again?"}
    >>> replay(echo_twice, ReplayChannel(["hi", "hi"], [None, "you said 'hi'; again?"], max_turns=4))
    {'done': {'reward': 1.0, 'info': {'said': ['hi', 'hi']}}}
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import inspect
import os
import pickle
import random
import re
import sys
import types
from typing import Any, Callable

try:  # on the host: llmgym's error base; inside the sandbox llmgym is not importable (see above), nor needed
    from llmgym.errors import LLMGymError
except ImportError:  # pragma: no cover - the sandbox's side

    class LLMGymError(Exception):  # type: ignore[no-redef]
        """Stands in for llmgym's error base inside the sandbox."""

__all__ = [
    "KIND_ENV",
    "MODULE",
    "Game",
    "NotReproducible",
    "ReplayChannel",
    "append_message",
    "new_trace",
    "play_textarena",
    "play_verifiers",
    "random_move_opponent",
    "replay",
    "run_coroutine",
    "score_reply",
    "scored",
    "stop_parameters",
]

MODULE = "llmgym.interop.in_sandbox"
"""This module's name: inside the sandbox, objects the host pickled by reference to it find it here."""
KIND_ENV = "LLMGYM_INTEROP_KIND"
"""The worker's environment variable naming the package its zygote imports (``verifiers`` / ``textarena``)."""

_MAX_TEXT = 200_000  # characters of one reply sent back at most


def run_coroutine(coroutine: Any) -> Any:
    """Run ``coroutine`` to completion from synchronous code, also where an event loop is running (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a fresh loop on a helper thread
        return pool.submit(asyncio.run, coroutine).result()


# ------------------------------------------------------------------------------------------------
# replaying an episode: its state is its seed and its completions


class NotReproducible(LLMGymError, RuntimeError):
    """A replayed episode showed the policy something other than what it was shown the first time."""


class _Paused(BaseException):
    """Unwinds the env's code once the completions so far are used up (a BaseException: ``except Exception``
    in the env's own code does not swallow it)."""


class ReplayChannel:
    """The episode's side of the exchange, fed the completions so far; pauses at the first unanswered turn.

    ``ask(reply)`` shows ``reply`` to the policy (``None``: nothing beyond what it sees) and returns its
    next completion; once they are used up it records ``reply`` as the episode's next event and unwinds
    the episode. ``finish(reward, info)`` ends it. ``replies`` are what earlier calls showed: each one
    shown again must be the same (:class:`NotReproducible`). ``last`` tells whether the completion
    returned last is the episode's final one (``max_turns``).
    """

    def __init__(self, completions: list[str], replies: list[str | None], max_turns: int):
        self.completions, self.replies, self.max_turns = [str(c) for c in completions], list(replies), int(max_turns)
        self.shown: list[str | None] = []
        self.last = False
        self.paused = False
        self.next_reply: str | None = None
        self.result: tuple[float, dict] | None = None

    def ask(self, reply: str | None) -> str:
        if self.paused or self.result is not None:
            raise _Paused()
        turn = len(self.shown)
        if turn < len(self.replies) and _clip(reply) != self.replies[turn]:
            raise NotReproducible(
                f"turn {turn + 1} showed {str(reply)[:80]!r} where the same moves showed {str(self.replies[turn])[:80]!r} "
                "before: llmgym replays an episode from its start in a fresh sandboxed process every turn, so the "
                "env must depend only on its task, its seed (`random` is seeded) and the policy's moves")
        self.shown.append(reply)
        if turn >= len(self.completions):
            self.paused, self.next_reply = True, reply
            raise _Paused()
        self.last = turn + 1 >= self.max_turns
        return self.completions[turn]

    def finish(self, reward: float, info: dict | None = None) -> None:
        if self.paused:
            raise _Paused()
        self.result = (float(reward), dict(info or {}))


def replay(play: Callable[[ReplayChannel], None], channel: ReplayChannel) -> dict:
    """Run ``play(channel)`` up to its next event: ``{"turn": reply}`` or ``{"done": {"reward", "info"}}``."""
    try:
        play(channel)
    except _Paused:
        pass
    if channel.paused:
        return {"turn": _clip(channel.next_reply)}
    if channel.result is None:
        raise RuntimeError("the episode ended without a result")
    used = len(channel.shown)
    if used < len(channel.completions):
        raise NotReproducible(f"the episode ended after {used} of the {len(channel.completions)} moves it was "
                              "given: it does not replay as it was played")
    reward, info = channel.result
    return {"done": {"reward": reward, "info": info}}


def _clip(text: str | None) -> str | None:
    return None if text is None else str(text)[:_MAX_TEXT]


# ------------------------------------------------------------------------------------------------
# verifiers: traces, one completion scored, an Env's run() with the policy as one agent


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


def score_reply(vf: Any, vf_task: Any, completion: str) -> dict[str, Any]:
    """The task's own ``Task.score(trace)`` on a trace whose one reply is ``completion``: :func:`scored`'s parts."""
    trace = new_trace(vf, vf_task)
    append_message(vf, trace, vf.AssistantMessage(content=completion), sampled=True)
    trace.stop("agent_completed")
    run_coroutine(vf_task.score(trace))
    return scored(trace)


class _PolicyInteraction:
    """``agent.interaction(task)`` for the policy: each ``turn`` asks the channel for the policy's completion."""

    def __init__(self, vf: Any, vf_task: Any, channel: ReplayChannel, stop_params: dict[str, str] | None) -> None:
        self._vf, self._task, self._channel = vf, vf_task, channel
        self.trace = new_trace(vf, vf_task)
        self._stops = vf_task.hooks("stop")
        self._stop_params = stop_params
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
            if self._stop_params is not None:  # the trace's parameter, read from the type hints on the host
                verdict = stop(**{self._stop_params[stop.__name__]: self.trace})
            else:
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
            if self._channel.paused:  # unwinding at the pause: the episode goes on in the next call
                return self.trace
            self.trace.stop("user_closed")
            await self._task.score(self.trace)
            self.trace.ok = True
        return self.trace


class _PolicyAgent:
    """The one agent llmgym's policy plays: ``interaction(task)`` and ``run(task)`` over the channel."""

    trainable = True

    def __init__(self, vf: Any, name: str, channel: ReplayChannel, stop_params: dict[str, str] | None) -> None:
        self._vf, self.name, self._channel, self._stop_params = vf, name, channel, stop_params
        self.traces: list[Any] = []

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_: Any):
        if self.traces:
            raise RuntimeError(f"agent {self.name!r} was asked for a second rollout in one episode; llmgym plays "
                               f"one exchange per episode")
        interaction = _PolicyInteraction(self._vf, task, self._channel, self._stop_params)
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

    def __init__(self, role: str, agent: _PolicyAgent, roles: list[str]) -> None:
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


def stop_parameters(vf: Any, vf_task: Any) -> dict[str, str]:
    """``{@vf.stop hook: the name of its Trace parameter}``, from the hooks' type hints.

    verifiers passes a stop hook its trace by annotation. Read here, where the hooks were defined: a hook
    pickled by value (defined in ``__main__``) keeps only the globals its code uses, so its string
    annotations (``from __future__ import annotations``) may not resolve in the sandbox.
    """
    import typing

    found = {}
    for hook in vf_task.hooks("stop"):
        hints = typing.get_type_hints(hook)
        names = [name for name in inspect.signature(hook).parameters
                 if (typing.get_origin(hints.get(name)) or hints.get(name)) is vf.Trace]
        found[hook.__name__] = names[0] if names else "trace"
    return found


def play_verifiers(vf: Any, vf_env: Any, vf_task: Any, role: str,
                   stop_params: dict[str, str] | None = None) -> Callable[[ReplayChannel], None]:
    """An episode of a verifiers ``Env``'s own ``run()`` on ``vf_task``, the policy playing ``role``
    (``stop_params``: :func:`stop_parameters`, read where the hooks' annotations resolve)."""

    async def play(channel: ReplayChannel) -> None:
        from verifiers.v1.configs.agent import agent_config_fields

        agent = _PolicyAgent(vf, role, channel, stop_params)
        agents = _PolicyAgents(role, agent, list(agent_config_fields(vf_env.config)))
        await vf_env.setup(agents)
        await vf_env.run(vf_task, agents)
        if channel.paused:
            return
        if not agent.traces:
            raise RuntimeError(f"{type(vf_env).__name__}.run() never let agent {role!r} speak")
        (trace,) = agent.traces
        episode = vf.Episode(env=vf.EnvInfo(id=vf_env.config.env_id), task=trace.task, traces=[trace])
        await vf_env.finalize(vf_task, episode)
        channel.finish(trace.reward, {"score": scored(trace), "stop_condition": trace.stop_condition})

    return lambda channel: run_coroutine(play(channel))


# ------------------------------------------------------------------------------------------------
# TextArena: a seeded game, the opponent in every other seat

_LINE_PREFIX = re.compile(r"^\[[^\[\]\n]{1,40}\] ?")  # a line's speaker tag, "[GAME] " / "[Player 1] "
_MOVE = re.compile(r"\[[^\[\]\n]{1,40}\]")  # a bracketed move; no nesting, bounded: linear time
_MAX_OBSERVATION_CHARS = 200_000  # what the default opponent scans of its history at most


def random_move_opponent(observation: str, rng: random.Random) -> str:
    """A uniformly random bracketed move from the latest message of ``observation`` that lists any.

    Speaker tags at the start of a line (``[GAME]``, ``[Player 0]``) are not moves. With no move
    listed anywhere it answers ``"[]"`` (an invalid move: TextArena then applies its rules).

    Example:
        >>> import random
        >>> from llmgym.interop.in_sandbox import random_move_opponent
        >>> seen = "[GAME] Your card is K\\n[GAME] Your available actions are: '[check]', '[bet]'"
        >>> random_move_opponent(seen, random.Random(0)) in ("[check]", "[bet]")
        True
        >>> random_move_opponent("[GAME] no moves listed", random.Random(0))
        '[]'
    """
    for message in reversed(observation[-_MAX_OBSERVATION_CHARS:].split("\n[")):
        moves = []
        for line in message.splitlines():
            moves += [m for m in _MOVE.findall(_LINE_PREFIX.sub("", line)) if m not in moves]
        if moves:
            return rng.choice(moves)
    return "[]"


class Game:
    """One seeded TextArena game, with ``opponent`` playing every seat but the policy's."""

    def __init__(self, ta: Any, env_id: str, seed: int, num_players: int, player_id: int,
                 opponent: Callable[[str, random.Random], str]) -> None:
        self.ta, self.player_id, self.opponent = ta, player_id, opponent
        random.seed(seed)  # TextArena draws from the global generator (reset and some steps)
        self.env = ta.make(env_id)
        self.env.reset(num_players=num_players, seed=seed)
        self.inner = self.env
        while isinstance(self.inner, ta.Wrapper):  # observations are read raw and formatted here
            self.inner = self.inner.env
        self.rng = random.Random(seed)
        self.seen: dict[int, list[str]] = collections.defaultdict(list)

    @property
    def done(self) -> bool:
        return bool(self.inner.state.done)

    def _format(self, messages: list) -> str:
        roles = getattr(self.inner.state, "role_mapping", {}) or {}
        lines = []
        for sender, message, kind in messages:
            if sender == self.player_id and kind == self.ta.ObservationType.PLAYER_ACTION:
                continue  # the policy's own move: its transcript already holds it
            name = "GAME" if sender == self.ta.GAME_ID else roles.get(sender, f"Player {sender}")
            lines.append(f"[{name}] {message}")
        return "\n".join(lines)

    def advance(self) -> str | None:
        """Opponent moves until the policy's turn; then what the policy sees next (``None``: the game ended)."""
        while not self.done:
            seat, messages = self.inner.get_observation()
            if seat == self.player_id:
                return self._format(messages)
            self.seen[seat].append("\n".join(f"[{s if s != self.ta.GAME_ID else 'GAME'}] {m}" for s, m, _ in messages))
            self.env.step(str(self.opponent("\n".join(self.seen[seat]), self.rng)))
        return None

    def outcome(self) -> tuple[float, dict[str, Any]]:
        rewards = self.inner.state.rewards or {}
        info = (getattr(self.inner.state, "game_info", {}) or {}).get(self.player_id, {})
        return float(rewards.get(self.player_id, 0.0)), {
            "outcome": str(info.get("reason", "")), "invalid_move": bool(info.get("invalid_move", False))}


def play_textarena(ta: Any, spec: dict[str, Any], seed: int, opening: str) -> Callable[[ReplayChannel], None]:
    """An episode of the game ``spec`` describes, seeded ``seed``, whose opening must be ``opening``.

    Ends with TextArena's own value for the policy's seat (``game_reward``; the host turns it into the
    env's reward), or with ``stop_condition="max_turns"`` when the turn limit comes first.
    """

    def play(channel: ReplayChannel) -> None:
        game = Game(ta, spec["env_id"], seed, spec["num_players"], spec["player_id"],
                    spec.get("opponent") or random_move_opponent)
        if game.advance() != opening:
            raise NotReproducible(f"{spec['env_id']} is not reproducible from its seed: its opening differs")
        reply: str | None = None
        while True:
            completion = channel.ask(reply)
            game.env.step(completion)
            reply = game.advance()
            if reply is None:  # the game is over
                value, info = game.outcome()
                channel.finish(value, {"game_reward": value, **info})
                return
            if channel.last:
                channel.finish(0.0, {"game_reward": None, "outcome": "unfinished at max_turns",
                                     "stop_condition": "max_turns"})
                return

    return play


# ------------------------------------------------------------------------------------------------
# the worker's hooks (inside the sandbox)

_payloads: dict[str, Any] = {}
_package: Any = None


def _register_module() -> None:
    """Make this source importable as :data:`MODULE` (under bare parent modules: nothing else of llmgym
    exists here), so that what the host pickled by reference to it -- the default opponent -- loads."""
    module = types.ModuleType(MODULE)
    module.__dict__.update({k: v for k, v in globals().items() if not k.startswith("__")})
    for parent in ("llmgym", "llmgym.interop"):
        sys.modules.setdefault(parent, types.ModuleType(parent))
    sys.modules[MODULE] = module
    sys.modules["llmgym"].interop = sys.modules["llmgym.interop"]
    sys.modules["llmgym.interop"].in_sandbox = module


def setup() -> None:
    global _package
    _register_module()
    import cloudpickle  # noqa: F401  (what the host pickled by value needs it to load)

    kind = os.environ.get(KIND_ENV)
    if kind == "verifiers":
        import verifiers.v1 as vf

        _package = vf
        _warm_up_verifiers(vf)
    elif kind == "textarena":
        import textarena

        _package = textarena
    else:
        raise RuntimeError(f"{KIND_ENV} must be 'verifiers' or 'textarena', got {kind!r}")


def _warm_up_verifiers(vf: Any) -> None:
    # verifiers builds parts of its models on first use (pydantic validators, lazy imports): once here, in the
    # zygote, not in every call's child. A task of our own, no user code.
    class _Data(vf.TaskData):
        answer: str = "x"

    class _Task(vf.Task[_Data]):
        @vf.reward
        async def right(self, trace: vf.Trace) -> float:
            return float(trace.last_reply == self.data.answer)

    class _Config(vf.EnvConfig):
        player: vf.AgentConfig = vf.AgentConfig()

    class _Env(vf.Env[_Config]):  # never constructed (that loads a taskset by id): run() is what is warmed up
        async def run(self, task: Any, agents: Any) -> None:
            async with agents.player.interaction(task) as interaction:
                await interaction.turn()
                await interaction.turn("again")

    task = _Task(_Data(idx=0, prompt="say x"))
    score_reply(vf, task, "x")
    env = _Env.__new__(_Env)
    env.config = _Config.model_construct(player=vf.AgentConfig())  # no taskset to validate
    env.setup = env.finalize = lambda *args: asyncio.sleep(0)
    for completions in (["x"], ["x", "y"]):
        replay(play_verifiers(vf, env, task, "player"), ReplayChannel(completions, [], max_turns=2))


def prepare(context: tuple[str, bytes]) -> Any:  # in the zygote, on trusted data: the host's payload
    key, blob = context
    if key not in _payloads:
        if len(_payloads) >= 256:
            _payloads.clear()
        _payloads[key] = pickle.loads(blob)
    return _payloads[key]


def _failure(exc: BaseException) -> dict[str, Any]:
    """A check's failure as plain data; an import that failed anywhere in its chain is named apart."""
    missing, seen, cause = None, set(), exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ImportError):
            missing = getattr(cause, "name", None) or str(cause)[:200]
            break
        cause = cause.__cause__ or cause.__context__
    return {"error": f"{type(exc).__name__}: {str(exc)[:2000]}", "import_error": missing,
            "not_reproducible": isinstance(exc, NotReproducible)}


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)


def handle(payload: dict[str, Any], request: Any) -> dict[str, Any]:  # in the call's child: model text
    try:
        op = payload["op"]
        if op == "score":
            return {"score": score_reply(_package, payload["task"], request)}
        channel = ReplayChannel(request["completions"], request["replies"], request["max_turns"])
        if op == "vf_episode":
            _seed_everything(request["seed"])
            return replay(play_verifiers(_package, payload["env"], payload["task"], payload["role"],
                                         payload["stop_params"]), channel)
        if op == "textarena":
            return replay(play_textarena(_package, payload, request["seed"], request["opening"]), channel)
        raise ValueError(f"unknown operation {op!r}")
    except Exception as exc:  # the check's failure, as data; the host decides what it means
        return {"failed": _failure(exc)}
