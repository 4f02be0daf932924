"""One episode of a third-party env in its own process: completions go in, plain data comes out.

An adapted env (a TextArena game, a verifiers env's ``run()``) hands the policy's text to code
llmgym does not control. :class:`EpisodeWorker` keeps that code out of the trainer: the episode
runs in a forked child process for its whole length, the parent sends each completion over a pipe
and reads back the next event as JSON (never a pickle: a payload in the child cannot make the
parent run code by what it sends), and every wait has a time limit enforced by killing the child.

The child's side is a function ``play(channel)`` written as a plain loop (:class:`Channel`):
``channel.ask(reply)`` shows ``reply`` to the policy (``None``: nothing new, the prompt alone) and
returns its next completion; ``channel.finish(reward, info)`` ends the episode. What comes back is
checked on the parent's side: a finite reward and JSON data.

Example:
    >>> from llmgym.interop.worker import EpisodeWorker
    >>> def echo_twice(channel):
    ...     first = channel.ask(None)
    ...     second = channel.ask(f"you said {first!r}; again?")
    ...     channel.finish(float(first == second), {"said": [first, second]})
    >>> worker = EpisodeWorker(echo_twice, time_limit=10)
    >>> worker.receive()
    ('turn', None)
    >>> worker.send("hi"); worker.receive()
    ('turn', "you said 'hi'; again?")
    >>> worker.send("hi"); worker.receive()
    ('done', 1.0, {'said': ['hi', 'hi']})
    >>> worker.close()
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import traceback
import weakref
from typing import Any, Callable

from llmgym.verifiers import start_child_process

__all__ = ["Channel", "EpisodeWorker", "EpisodeError", "map_in_child"]

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The largest event a child may send (a reply and its info); a larger one ends the episode with an error."""


class EpisodeError(RuntimeError):
    """The episode's process failed: it raised, died, overstayed its time limit or sent bad data."""


class Channel:
    """The child's end of an :class:`EpisodeWorker`: ask the policy, then finish."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.last = False
        """Whether the completion :meth:`ask` returned last is the episode's final one (its turn limit)."""

    def ask(self, reply: str | None) -> str:
        """Show ``reply`` to the policy (``None``: nothing beyond what it sees) and return its next completion."""
        self._send(["turn", reply])
        message = json.loads(self._conn.recv_bytes().decode())
        self.last = bool(message["last"])
        return str(message["completion"])

    def finish(self, reward: float, info: dict[str, Any] | None = None) -> None:
        """End the episode with ``reward`` (a finite number) and ``info`` (JSON data)."""
        self._send(["done", float(reward), info or {}])

    def _send(self, message: list) -> None:
        self._conn.send_bytes(json.dumps(message, default=str).encode())


def _child_main(conn: Any, play: Callable[[Channel], None]) -> None:
    try:
        play(Channel(conn))
    except BaseException as exc:  # reported to the parent as text; the parent decides what it means
        try:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            conn.send_bytes(json.dumps(["error", detail[:2000], traceback.format_exc(limit=8)[-4000:]]).encode())
        except BaseException:
            pass
    finally:
        conn.close()
        os._exit(0)  # no atexit handlers or flushing of the parent's copied state


def _kill(process: Any, conn: Any) -> None:
    conn.close()
    if process.is_alive():
        process.kill()
    process.join()


class EpisodeWorker:
    """Run ``play(channel)`` in a forked child process; exchange completions and events with it.

    Args:
        play: the episode, run in the child; see :class:`Channel`.
        time_limit: seconds each :meth:`receive` may wait for the child (``None``: no limit); past it
            the child is killed and :class:`EpisodeError` says "timeout".

    Events from :meth:`receive`: ``("turn", reply_or_None)`` — the policy speaks next;
    ``("done", reward, info)`` — the episode is over. A child that raised, died or sent something
    that is not a finite reward with JSON data raises :class:`EpisodeError` in the parent. The
    child is forked (never re-imports the user's ``__main__``) and killed at :meth:`close`, at a
    time-out, and when the worker is garbage collected.
    """

    def __init__(self, play: Callable[[Channel], None], *, time_limit: float | None = 30.0) -> None:
        if time_limit is not None and not time_limit > 0:
            raise ValueError(f"time_limit must be > 0 seconds or None, got {time_limit!r}")
        context = multiprocessing.get_context("fork")
        self._conn, child_end = context.Pipe(duplex=True)
        self._process = context.Process(target=_child_main, args=(child_end, play), daemon=True)
        start_child_process(self._process)
        child_end.close()
        self.time_limit = time_limit
        self.finished = False
        self._finalizer = weakref.finalize(self, _kill, self._process, self._conn)

    def send(self, completion: str, *, last: bool = False) -> None:
        """Hand the child the policy's ``completion`` (``last``: the episode's turn limit is reached)."""
        if self.finished:
            raise EpisodeError("the episode is over: start a new one")
        try:
            self._conn.send_bytes(json.dumps({"completion": str(completion), "last": bool(last)}).encode())
        except (BrokenPipeError, OSError):
            self._fail(f"the episode's process is gone (exit code {self._process.exitcode})")

    def receive(self) -> tuple:
        """The child's next event (see the class docstring); :class:`EpisodeError` on any failure."""
        if self.finished:
            raise EpisodeError("the episode is over: start a new one")
        try:
            ready = self._conn.poll(self.time_limit)
        except (EOFError, OSError):
            ready = True
        if not ready:
            self._fail(f"timeout: the episode's process took longer than {self.time_limit} s (killed)")
        try:
            raw = self._conn.recv_bytes(MAX_MESSAGE_BYTES)
        except (EOFError, OSError) as exc:
            self._process.join(1)
            reason = "sent more than 4 MiB" if isinstance(exc, OSError) and not isinstance(exc, EOFError) else \
                f"died (exit code {self._process.exitcode})"
            self._fail(f"the episode's process {reason}")
        try:
            message = json.loads(raw.decode())
        except (UnicodeDecodeError, json.JSONDecodeError):
            self._fail("the episode's process sent something that is not JSON")
        return self._checked(message)

    def _checked(self, message: Any) -> tuple:
        kind = message[0] if isinstance(message, list) and message else None
        if kind == "turn" and len(message) == 2 and (message[1] is None or isinstance(message[1], str)):
            return ("turn", message[1])
        if kind == "done" and len(message) == 3 and isinstance(message[2], dict):
            reward = message[1]
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
                self._fail(f"the episode ended with a reward that is not a finite number: {reward!r:.80}")
            self.finished = True
            self.close()
            return ("done", float(reward), message[2])
        if kind == "error" and len(message) == 3:
            self._fail(str(message[1]), traceback=str(message[2]))
        self._fail(f"the episode's process sent an event llmgym does not know: {str(message)[:120]}")

    def _fail(self, reason: str, traceback: str | None = None) -> None:
        self.finished = True
        self.close()
        error = EpisodeError(reason)
        error.child_traceback = traceback
        raise error

    def close(self) -> None:
        """Kill the child (if still running) and close the pipe; safe to call twice."""
        self._finalizer()


def _map_main(conn: Any, fn: Callable[[Any], Any], items: list) -> None:
    try:
        for item in items:
            try:
                conn.send_bytes(json.dumps(["ok", fn(item)], default=str).encode())
            except Exception as exc:  # this item's failure; the next items still run
                conn.send_bytes(json.dumps(["error", f"{type(exc).__name__}: {exc}"[:2000]]).encode())
    finally:
        conn.close()
        os._exit(0)


def map_in_child(fn: Callable[[Any], Any], items: list, time_limit: float | None) -> list[tuple[str, Any] | None]:
    """``fn(item)`` for every item in one forked child, results streamed back as JSON.

    Each result must arrive within ``time_limit`` seconds of the previous one; past it the child is
    killed. Returns one entry per item: ``("ok", value)``, ``("error", message)`` (``fn`` raised, or
    ``"timeout: ..."`` for the item the child was working on when it was killed), or ``None`` for an
    item never reached (after a time-out, a crash or bad data) — the caller decides what to do with
    those (score them one by one, for instance).

    Example:
        >>> from llmgym.interop.worker import map_in_child
        >>> map_in_child(lambda x: 10 // x, [5, 0, 2], time_limit=10)
        [('ok', 2), ('error', 'ZeroDivisionError: integer division or modulo by zero'), ('ok', 5)]
    """
    results: list[tuple[str, Any] | None] = [None] * len(items)
    if not items:
        return results
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_map_main, args=(sender, fn, list(items)), daemon=True)
    start_child_process(process)
    sender.close()
    try:
        for index in range(len(items)):
            if not receiver.poll(time_limit):
                results[index] = ("error", f"timeout: took longer than {time_limit} s (killed)")
                break
            try:
                message = json.loads(receiver.recv_bytes(MAX_MESSAGE_BYTES).decode())
            except (EOFError, OSError, UnicodeDecodeError, json.JSONDecodeError):
                break  # the child died or sent garbage: the rest is left to the caller
            if isinstance(message, list) and len(message) == 2 and message[0] in ("ok", "error"):
                results[index] = (message[0], message[1])
            else:
                break
    finally:
        _kill(process, receiver)
    return results
