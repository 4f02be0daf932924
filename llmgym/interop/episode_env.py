"""A multi-turn env whose episode is third-party code running in its own process: :class:`WorkerEpisodeEnv`.

The adapters' multi-turn envs (a verifiers ``Env.run()``, a TextArena game) subclass it and override
one hook, :meth:`WorkerEpisodeEnv.episode`, which returns the child's side of the episode (a
``play(channel)`` function, see :mod:`llmgym.interop.worker`). ``reset`` starts it in a forked
process and waits for the policy's first turn; each ``step`` hands it the completion and reads the
next event; the episode's reward comes with its last step.

Example:
    >>> from llmgym import Task
    >>> from llmgym.interop.episode_env import WorkerEpisodeEnv
    >>> class Countdown(WorkerEpisodeEnv):
    ...     def episode(self, task):
    ...         def play(channel):
    ...             said = [channel.ask(None)]
    ...             while said[-1] != "0":
    ...                 said.append(channel.ask("lower"))
    ...             channel.finish(1.0, {"turns": len(said)})
    ...         return play
    >>> env = Countdown([Task("count down to 0")], max_turns=5)
    >>> _ = env.reset(seed=0)
    >>> env.step("2")[1:4], env.step("0")[1:4]
    ((0.0, False, False), (1.0, True, False))
"""

from __future__ import annotations

from typing import Callable

from llmgym.core import MultiTurnEnv, Turn
from llmgym.interop.worker import Channel, EpisodeError, EpisodeWorker
from llmgym.types import Task

__all__ = ["WorkerEpisodeEnv"]


class WorkerEpisodeEnv(MultiTurnEnv):
    """A :class:`~llmgym.MultiTurnEnv` whose episode runs in an :class:`~llmgym.interop.worker.EpisodeWorker`.

    Override :meth:`episode`. ``time_limit`` bounds every wait for the episode's process (killed
    past it). A failure before the policy's first turn raises at ``reset`` (the env cannot run); one
    later ends the episode with reward 0 and the error in ``info["error"]`` (the completion's).
    After ``max_turns`` completions the child is told (``channel.last``); a ``"done"`` it answers
    with ``info["stop_condition"] == "max_turns"`` is a ``truncated`` step, any other ``terminated``.
    """

    time_limit: float | None = 30.0
    _worker: EpisodeWorker | None = None

    def episode(self, task: Task) -> Callable[[Channel], None]:
        """The child's side of an episode of ``task``: ``play(channel)``. Override this."""
        raise NotImplementedError(f"{type(self).__name__} must override episode(task)")

    def describe(self) -> str:
        """What runs the episode, for error messages."""
        return type(self).__name__

    def start(self, task: Task) -> None:
        self._stop_worker()
        play = self.episode(task)
        self._worker = EpisodeWorker(play, time_limit=self.time_limit)
        try:
            event = self._worker.receive()
        except EpisodeError as exc:  # before the policy spoke: the env cannot run, not the completion's fault
            raise RuntimeError(f"{self.describe()} failed before the policy's first turn: {exc}") from None
        if event[0] != "turn":
            raise RuntimeError(f"{self.describe()} ended before the policy's first turn")

    def respond(self, completion: str) -> Turn:
        if self._worker is None:
            raise RuntimeError("no episode is running: call reset() first")
        self._worker.send(completion, last=self.turn + 1 >= self.max_turns)
        event = self._worker.receive()  # an EpisodeError here is the completion's 0 (MultiTurnEnv catches it)
        if event[0] == "turn":
            return Turn(0.0, reply=event[1] or "")
        _, reward, info = event
        return Turn(reward, None, done=info.get("stop_condition") != "max_turns", info=info)

    def clone(self) -> "WorkerEpisodeEnv":
        other = super().clone()
        other._worker = None
        return other

    def close(self) -> None:
        self._stop_worker()
        super().close()

    def _stop_worker(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None
