"""Files a run writes whole (through a temporary file and a rename, so a reader never sees half of one), and
its step-keyed JSONL logs read back and rewound to a checkpoint's step.

Example:
    >>> import tempfile, pathlib
    >>> from llmgym.runtime.files import write_text_atomic
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> write_text_atomic(folder / "sub" / "a.txt", "hello").read_text()
    'hello'
    >>> sorted(p.name for p in (folder / "sub").iterdir())  # no temporary file left behind
    ['a.txt']
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["read_jsonl", "rewind_jsonl", "write_text_atomic"]


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` (UTF-8, its folders made) through a temporary file in the same folder and
    ``os.replace``: the file is the old one or the new one, never half of either. The file is readable by its
    owner only (``mkstemp``'s mode 0600): a run's outputs hold model text and settings. On failure the
    temporary file is removed and the error raised.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.json"
        >>> _ = write_text_atomic(p, "{}")
        >>> p.read_text(), oct(p.stat().st_mode & 0o777)
        ('{}', '0o600')
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _record(line: str) -> dict[str, Any] | None:
    """A line's JSON object; ``None`` for a blank line or one that is not a whole object (cut short by a
    writer that was killed mid-line)."""
    try:
        record = json.loads(line) if line.strip() else None
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a JSONL log, one JSON object a line; ``[]`` when there is no file. A line that is not a
    whole object (the last line of a run killed as it wrote it) is skipped.

    Example:
        >>> import tempfile, pathlib
        >>> from llmgym.runtime.files import read_jsonl
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "log.jsonl"
        >>> _ = p.write_text('{"step": 1}\\n{"step": 2}\\n{"step": 3, "rew')
        >>> read_jsonl(p)
        [{'step': 1}, {'step': 2}]
    """
    path = Path(path)
    if not path.is_file():
        return []
    return [r for r in map(_record, path.read_text(encoding="utf-8").splitlines()) if r is not None]


def rewind_jsonl(path: str | os.PathLike, last_step: int) -> list[dict[str, Any]]:
    """Rewind a step-keyed JSONL log (a run's ``metrics.jsonl``, ``rollouts.jsonl``) to ``last_step``, the step
    of the checkpoint a run resumes from: the records of later steps and any line that is not a whole
    object go, the rest stay as written, and the file is replaced atomically (:func:`write_text_atomic`).
    Returns the records kept; ``[]`` (and no file made) when there is none.

    Example:
        >>> import tempfile, pathlib
        >>> from llmgym.runtime.files import rewind_jsonl
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "log.jsonl"
        >>> _ = p.write_text("".join(f'{{"step": {s}}}\\n' for s in (1, 2, 3)) + '{"step": 4, "rew')
        >>> [r["step"] for r in rewind_jsonl(p, 2)], p.read_text().count("\\n")
        ([1, 2], 2)
    """
    path = Path(path)
    if not path.is_file():
        return []
    kept, lines = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        record = _record(line)
        if record is not None and int(record.get("step", 0)) <= last_step:
            kept.append(record)
            lines.append(line + "\n")
    write_text_atomic(path, "".join(lines))
    return kept
