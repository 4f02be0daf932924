"""Files a run writes whole: through a temporary file and a rename, so a reader never sees half of one.

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

import os
import tempfile
from pathlib import Path

__all__ = ["write_text_atomic"]


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
