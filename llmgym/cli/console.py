"""What the commands print: numbers (:func:`~llmgym.runtime.display.format_value`), the table of a run's files.

Example:
    >>> from llmgym.cli.console import format_value
    >>> format_value(0.12345), format_value(float("nan")), format_value(3)
    ('0.123', '—', '3')
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmgym.runtime.display import format_value

__all__ = ["format_value", "files_table", "summary_window"]


def files_table(title: str, files: dict[str, Path | None]):
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 2))
    for label, path in files.items():
        if path is not None:
            table.add_row(label, str(path))
    return table


def summary_window(rows: list[dict[str, Any]]) -> int:
    """Steps averaged for the "first" and "last" reward of a summary: up to 10, at most half the run."""
    return max(1, min(10, len(rows) // 2))
