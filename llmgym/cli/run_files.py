"""A run's directory: checked before any work, an earlier run kept aside, files written atomically.

Example:
    >>> from llmgym.cli.run_files import RUN_FILES
    >>> "metrics.jsonl" in RUN_FILES
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llmgym.cli.usage import UsageError

__all__ = ["check_out_dir", "check_out_file", "RUN_FILES", "existing_files", "keep_previous_run", "atomic_write_text"]

def _probe_writable(path: Path, flag: str, shown: str) -> None:
    """Raise a :class:`UsageError` unless a file can be created in the directory ``path`` (or in the
    nearest existing folder above it, which is where the missing folders would be made)."""
    import tempfile

    folder = path
    while not folder.exists():
        if folder.parent == folder:
            break
        folder = folder.parent
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{flag} {shown!r} cannot be created: {str(folder)!r} is a file, not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".llmgym-write-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"{flag} {shown!r} is not writable ({reason} in {str(folder)!r}): "
                         f"choose a folder you can write to") from None


def check_out_dir(path: str | Path, flag: str = "--out") -> Path:
    """The run directory ``path``, checked before any work: not a file, and writable (created later).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from llmgym.cli.run_files import check_out_dir
        >>> with tempfile.NamedTemporaryFile() as f:
        ...     check_out_dir(f.name)
        Traceback (most recent call last):
        ...
        llmgym.cli.usage.UsageError: --out '...' is a file, not a directory: give a directory for the run's files
    """
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {str(path)!r} is a file, not a directory: give a directory for the run's files")
    _probe_writable(out, flag, str(path))
    return out


def check_out_file(path: str | Path, flag: str = "--out", example: str = "results.json") -> Path:
    """The output file ``path``, checked before any work: not a directory, and its folder writable."""
    out = Path(path).expanduser()
    if out.is_dir():
        raise UsageError(f"{flag} {str(path)!r} is a directory: give a file name, e.g. {flag} {out / example}")
    _probe_writable(out.parent, flag, str(path))
    return out


from llmgym.runtime.files import RUN_FILES  # noqa: E402  (one list: what a run writes, none of it a link)


def existing_files(folder: Path, names: Sequence[str]) -> list[Path]:
    """The paths ``folder/name`` that exist, for each of ``names``."""
    return [folder / name for name in names if (folder / name).exists()]


def keep_previous_run(out: Path, names: Sequence[str] = RUN_FILES) -> Path | None:
    """Move an earlier run's files out of ``out`` into a new sibling ``<out>.N`` (N one more than any
    there), so a new run can use ``out`` and nothing is lost; return where they went (``None``: none).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from llmgym.cli.run_files import keep_previous_run
        >>> with tempfile.TemporaryDirectory() as d:
        ...     out = Path(d) / "quickstart"
        ...     (out / "checkpoints").mkdir(parents=True)
        ...     _ = (out / "metrics.jsonl").write_text("{}")
        ...     kept = keep_previous_run(out)
        ...     kept.name, sorted(p.name for p in kept.iterdir()), list(out.iterdir())
        ('quickstart.1', ['checkpoints', 'metrics.jsonl'], [])
    """
    import re
    import shutil

    found = existing_files(out, names)
    if not found:
        return None
    if out.name in ("", ".."):  # "." or "..": name the sibling after the real folder
        out = out.resolve()
    pattern = re.compile(re.escape(out.name) + r"\.(\d+)")
    taken = [int(m.group(1)) for p in out.parent.iterdir() if (m := pattern.fullmatch(p.name))]
    kept = out.with_name(f"{out.name}.{max(taken, default=0) + 1}")
    kept.mkdir()
    for path in found:
        shutil.move(str(path), str(kept / path.name))
    return kept


def atomic_write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename: a reader never sees half a file.

    If the write fails after all (the disk filled up, the folder vanished), the text goes to a file in
    the system's temporary folder instead and the :class:`UsageError` names it: results are never lost.
    """
    import os
    import tempfile

    from llmgym.runtime.files import write_text_atomic

    path = Path(path)
    try:
        write_text_atomic(path, text)
    except OSError as exc:
        fd, rescue = tempfile.mkstemp(prefix=f"llmgym-{path.stem}-", suffix=path.suffix or ".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        raise UsageError(f"could not write {str(path)!r} ({exc.strerror or exc}); the results are saved in "
                         f"{rescue} instead") from None
    return path
