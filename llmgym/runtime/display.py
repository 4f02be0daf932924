"""Console output that stays readable in a terminal, a pipe and a file.

In a terminal, ``rich`` draws live progress bars and wraps text at the terminal's width. Written to
a pipe or a file (``llmgym quickstart > log.txt``, a CI log) rich would assume 80 columns: long
lines break in the middle of a command or a path, and a progress bar shows once, squeezed, at its
end. So when the output is not a terminal:

* :func:`make_console` gives a console that never wraps a line of text (tables still get
  ``$COLUMNS``, or :data:`PIPE_WIDTH`, to lay out in);
* :func:`make_progress` gives a :class:`LineProgress`: no bar, but one whole line per task at its
  first update, at every tenth of its total (or after ``every_s`` seconds without a line), and at
  its end — counts, the fields of the display, time elapsed and time left.

Example:
    >>> import io
    >>> from rich.console import Console
    >>> from llmgym.runtime.display import make_progress
    >>> out = io.StringIO()
    >>> progress = make_progress(Console(file=out, width=300), "reward {task.fields[reward]}")
    >>> with progress:
    ...     job = progress.add_task("GRPO", total=2, reward="—")
    ...     progress.update(job, advance=1, reward="0.50")
    ...     progress.update(job, advance=1, reward="0.75")
    >>> [line.split(" elapsed")[0] for line in out.getvalue().splitlines()]
    ['GRPO 1/2 reward 0.50', 'GRPO 2/2 reward 0.75']
"""

from __future__ import annotations

import math
import os
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

__all__ = ["PIPE_WIDTH", "LineProgress", "format_value", "is_live", "make_console", "make_progress", "quiet_hf_progress"]

PIPE_WIDTH = 400
"""Columns a table may use when the output is a pipe or a file and ``$COLUMNS`` is not set."""


def format_value(value: Any, digits: int = 3) -> str:
    """A number as the tables and progress bars show it: ``digits`` decimals, ``—`` for none or NaN.

    Example:
        >>> from llmgym.runtime.display import format_value
        >>> format_value(0.12345), format_value(float("nan")), format_value(3)
        ('0.123', '—', '3')
    """
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def is_live(console) -> bool:
    """Whether ``console`` can redraw in place (a terminal or a notebook): then bars are live."""
    return bool(console.is_terminal or console.is_jupyter)


def make_console(stderr: bool = False):
    """A ``rich`` console; in a pipe or a file it does not wrap lines (see the module docstring).

    Example:
        >>> from llmgym.runtime.display import make_console
        >>> make_console().soft_wrap  # the doctest's output is not a terminal
        True
    """
    console = Console(stderr=stderr, highlight=False)
    if not is_live(console):
        if "COLUMNS" not in os.environ:
            console.width = PIPE_WIDTH
        console.soft_wrap = True
    return console


def make_progress(console, *fields: str, every_s: float = 30.0):
    """Progress for ``console``: description, bar, ``done/total``, ``fields`` (``rich`` ``TextColumn``
    templates such as ``"reward {task.fields[reward]}"``), time elapsed and time left. A live bar
    where the console can redraw (:func:`is_live`); a :class:`LineProgress` elsewhere."""
    texts = [TextColumn(f) for f in fields]
    if is_live(console):
        return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), *texts,
                        TimeElapsedColumn(), TimeRemainingColumn(), console=console)
    return LineProgress(TextColumn("{task.description}"), MofNCompleteColumn(), *texts, TextColumn("elapsed"),
                        TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(), console=console,
                        every_s=every_s)


class LineProgress(Progress):
    """``rich.progress.Progress`` for a pipe or a file: whole lines instead of a live bar.

    A task prints a line at its first update, whenever it crosses another tenth of its total or
    ``every_s`` seconds passed since its last line, and at its end (or at ``stop``); never twice
    for the same count.
    """

    def __init__(self, *columns: Any, console=None, every_s: float = 30.0, **kwargs: Any):
        super().__init__(*columns, console=console, disable=True, **kwargs)  # no live display
        self.every_s = every_s
        self._last: dict[Any, tuple[float, int, float]] = {}  # task id -> (time, tenth, count) of its last line

    def update(self, task_id, **kwargs: Any) -> None:
        super().update(task_id, **kwargs)
        self._maybe_print(task_id)

    def advance(self, task_id, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._maybe_print(task_id)

    def stop(self) -> None:
        for task_id in list(self._tasks):
            self._maybe_print(task_id, final=True)

    def _maybe_print(self, task_id, final: bool = False) -> None:
        with self._lock:
            task = self._tasks[task_id]
            now = self.get_time()
            tenth = int(10 * task.completed / task.total) if task.total else 0
            last = self._last.get(task_id)
            if last is not None and last[2] == task.completed:
                return  # nothing new since its last line
            due = last is None or tenth > last[1] or now - last[0] >= self.every_s
            if not (due or final or task.finished):
                return
            self._last[task_id] = (now, tenth, task.completed)
            line = self.make_tasks_table([task])
        self.console.print(line)


def quiet_hf_progress() -> None:
    """Silence the per-file progress bars of ``transformers`` / ``huggingface_hub`` for this process
    (a command's own progress display is enough).

    Example:
        >>> from llmgym.runtime.display import quiet_hf_progress
        >>> quiet_hf_progress()
    """
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - an old or odd transformers: bars stay
        pass
