"""A multi-turn env whose episode is third-party code, replayed turn by turn: :class:`ReplayEpisodeEnv`.

The adapters' multi-turn envs (a verifiers ``Env.run()``, a TextArena game) hand each completion to code
llmgym does not control, so that code runs in the sandbox, one fresh process per call
(:mod:`llmgym.interop.adapter_pools`). A process that lives for one call cannot hold a game between turns:
the episode's state is its task, its seed and the completions so far, and each turn *replays* the episode
from its start with them, up to the next event -- the env's reply, or the end with its reward. Each
replay also checks that the replies it shows again are the ones already shown (an env that does not
reproduce from its seed says so, and scores 0, instead of drifting). A replay costs the turns before it
again (microseconds for a TextArena move, a few milliseconds for a verifiers ``run()``), against a
fork of the worker per turn that the sandbox costs anyway; and nothing of an episode -- no process, no
state a payload could leave -- outlives a call.

Subclasses override :meth:`ReplayEpisodeEnv.play` (one hook): run the episode with the completions so far,
return the next event. ``reset`` asks for the first event (the policy's turn, before any completion);
each ``step`` for the next; the episode's reward comes with its last step.

Example:
    >>> from llmgym import Task
    >>> from llmgym.interop.episode_env import ReplayEpisodeEnv
    >>> from llmgym.interop.in_sandbox import ReplayChannel, replay
    >>> class Countdown(ReplayEpisodeEnv):   # trusted code of our own: replayed in this process
    ...     def play(self, task, completions, replies):
    ...         def countdown(channel):
    ...             said = [channel.ask(None)]
    ...             while said[-1] != "0":
    ...                 said.append(channel.ask("lower"))
    ...             channel.finish(1.0, {"turns": len(said)})
    ...         return replay(countdown, ReplayChannel(completions, replies, self.max_turns))
    >>> env = Countdown([Task("count down to 0")], max_turns=5)
    >>> _ = env.reset(seed=0)
    >>> env.step("2")[1:4], env.step("0")[1:4]
    ((0.0, False, False), (1.0, True, False))
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from llmgym.env.core import MultiTurnEnv, Turn
from llmgym.interop import adapter_pools
from llmgym.interop.adapter_pools import EpisodeError
from llmgym.env.types import Task

__all__ = ["EpisodeError", "ReplayEpisodeEnv"]

_MAX_REPLY_CHARS = 200_000


class ReplayEpisodeEnv(MultiTurnEnv):
    """A :class:`~llmgym.MultiTurnEnv` whose episode is replayed from its start every turn (see the module docstring).

    Override :meth:`play`; :meth:`finished` may turn the end's ``(reward, info)`` into the env's. A failure
    before the policy's first turn raises at ``reset`` (the env cannot run); an :class:`EpisodeError` later
    ends the episode with reward 0 and the error in ``info["error"]`` (the completion's); a failure of the
    sandbox itself raises. After ``max_turns`` completions the episode is told so (the replay's
    ``channel.last``); an end with ``info["stop_condition"] == "max_turns"`` is a ``truncated`` step, any
    other ``terminated``.
    """

    time_limit: float | None = 30.0
    """Seconds one turn's replay may take in the sandbox (killed past it); ``None``: the worker's 60 s."""

    def play(self, task: Task, completions: list[str], replies: list[str | None]) -> dict[str, Any]:
        """The episode of ``task`` replayed with ``completions``: ``{"turn": reply}`` (``None``: nothing new)
        or ``{"done": {"reward": r, "info": {...}}}``. ``replies`` are the ones shown so far, in order.
        Override this; raise :class:`EpisodeError` for the completion's failure."""
        raise NotImplementedError(f"{type(self).__name__} must override play(task, completions, replies)")

    def finished(self, reward: float, info: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """The env's reward and info for an episode that ended with ``(reward, info)`` (default: as they are)."""
        return reward, info

    def describe(self) -> str:
        """What runs the episode, for error messages."""
        return type(self).__name__

    def run_sandboxed(self, payload: adapter_pools.Payload, request: dict[str, Any]) -> dict[str, Any]:
        """:meth:`play` through the sandbox: the replay ``request`` for ``payload``, its answer checked here."""
        status, answer = adapter_pools.run(payload, request, self.time_limit)
        failed = adapter_pools.failure(status, answer, self.time_limit)
        if failed is not None:
            if failed["import_error"]:  # trusted moves instead of the policy's: does the import fail anyway?
                reference = {**request, "completions": [""] * len(request["completions"]),
                             "replies": request["replies"][:1]}
                adapter_pools.reference_check(payload, reference, self.time_limit, failed, self.describe())
            if failed["not_reproducible"]:
                warnings.warn(f"{self.describe()}: {failed['error']}", RuntimeWarning, stacklevel=3)
            raise EpisodeError(failed["error"])
        return answer

    def _next_event(self) -> tuple:
        event = self.play(self.task, list(self.state["completions"]), list(self.state["replies"]))
        if isinstance(event, dict) and len(event) == 1 and "turn" in event:
            reply = event["turn"]
            if reply is None or (isinstance(reply, str) and len(reply) <= _MAX_REPLY_CHARS):
                return ("turn", reply)
        elif isinstance(event, dict) and len(event) == 1 and isinstance(event.get("done"), dict):
            reward, info = event["done"].get("reward"), event["done"].get("info")
            if (isinstance(reward, (int, float)) and not isinstance(reward, bool) and math.isfinite(reward)
                    and isinstance(info, dict)):
                try:
                    reward, info = self.finished(float(reward), info)
                except (ValueError, TypeError, KeyError) as exc:
                    raise EpisodeError(f"the episode ended with data llmgym cannot read: {exc}") from None
                return ("done", float(reward), info)
        raise EpisodeError(f"the episode sent an event llmgym does not know: {str(event)[:120]}")

    def start(self, task: Task) -> None:
        self.state.update(completions=[], replies=[])
        try:
            event = self._next_event()
        except EpisodeError as exc:  # before the policy spoke: the env cannot run, not the completion's fault
            raise RuntimeError(f"{self.describe()} failed before the policy's first turn: {exc}") from None
        if event[0] != "turn":
            raise RuntimeError(f"{self.describe()} ended before the policy's first turn")
        self.state["replies"].append(event[1])

    def respond(self, completion: str) -> Turn:
        if "completions" not in self.state:
            raise RuntimeError("no episode is running: call reset() first")
        self.state["completions"].append(completion)
        event = self._next_event()  # an EpisodeError here is the completion's 0 (MultiTurnEnv catches it)
        if event[0] == "turn":
            self.state["replies"].append(event[1])
            return Turn(0.0, reply=event[1] or "")
        _, reward, info = event
        return Turn(reward, None, done=info.get("stop_condition") != "max_turns", info=info)
