"""A run folder's files: written whole (a temporary file and a rename, so a reader never sees half of one) or
appended to, and its step-keyed JSONL logs read back and rewound to a checkpoint's step.

A run folder is data from whoever wrote it (a shared folder, a download), so the rules here hold for every
run file, read or written:

- *never through a link*: each file is opened with ``O_NOFOLLOW`` and must be a regular file
  (:class:`RunFileError` otherwise); a whole file is replaced by a rename, which replaces a link itself;
- *owner only*: a file made here has mode 0600 (it holds model text and settings);
- *bounded*: a JSONL line over :data:`MAX_LINE_BYTES`, a record nested deeper than :data:`MAX_DEPTH`, and any
  line that does not decode (bad UTF-8, bad JSON, a number past Python's digit limit, nesting past its
  recursion limit) is skipped and counted, never raised; lone surrogates become U+FFFD;
- *rewound with a word*: :func:`rewind` says which steps a damaged log lost.

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

import dataclasses
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from llmgym.errors import LLMGymError

__all__ = ["LOST_STEPS", "MAX_DEPTH", "MAX_LINE_BYTES", "MAX_LOST_STEPS", "RUN_FILES", "JsonlRead", "RunFileError", "check_run_folder",
           "lost_steps_note", "step_span",
           "open_append", "read_bytes_bounded", "read_jsonl", "rewind", "rewind_jsonl", "scan_jsonl",
           "write_bytes_atomic", "write_text_atomic"]

MAX_LINE_BYTES = 4 * 2**20
"""A JSONL line longer than this (4 MiB) is skipped unread: no run writes one (a rollout's texts are cut to
4,000 characters), and reading it whole would cost memory in proportion to what a stranger wrote."""
MAX_LOST_STEPS = 1_000_000
"""A resumed log missing more steps than this (of those its checkpoint says the run reached) is refused, not
listed: a checkpoint's step is data too (an ``agent.pt`` saying step 10^11 took a resume to 15 GB before)."""
MAX_DEPTH = 64
"""A record nested deeper than this is skipped (Python's own parser gives up near 1,000 with a
``RecursionError``; no run writes more than a few levels)."""

RUN_FILES = ("metrics.jsonl", "curves.png", "config.json", "eval.json", "checkpoints", "tensorboard", "rollouts.jsonl",
             "report.html", "trackers.json", "wandb")
"""What a training run writes into its directory; none of them may be a symbolic link."""


class RunFileError(LLMGymError, OSError):
    """A run file that is a symbolic link, or not a regular file (a FIFO, a device), or larger than its bound."""


def _refuse(path: Path, what: str) -> RunFileError:
    return RunFileError(f"{str(path)!r} is {what}: a run folder's files are read and written only as regular "
                        f"files, never through links (a link can point at any file of yours); replace it with the "
                        f"file itself, or start a new run")


def check_run_folder(folder: str | os.PathLike, names: Iterable[str] = RUN_FILES) -> None:
    """Raise :class:`RunFileError` if any of ``names`` in ``folder`` is a symbolic link, or neither a regular file
    nor a directory (a FIFO, a device, a socket: opening one blocks or never ends); a missing one is fine.

    Example:
        >>> import os, tempfile, pathlib
        >>> from llmgym.runtime.files import check_run_folder
        >>> run = pathlib.Path(tempfile.mkdtemp())
        >>> check_run_folder(run)
        >>> os.symlink("/etc/hostname", run / "curves.png")
        >>> check_run_folder(run)
        Traceback (most recent call last):
        ...
        llmgym.runtime.files.RunFileError: '.../curves.png' is a symbolic link: ...
    """
    folder = Path(folder)
    for name in names:
        try:
            mode = os.lstat(folder / name).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISLNK(mode):
            raise _refuse(folder / name, "a symbolic link")
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # a FIFO blocks whoever opens it; a device has no end
            raise _refuse(folder / name, "not a regular file (a FIFO, a device or a socket)")


def _open_fd(path: Path, flags: int) -> int:
    """``os.open`` with ``O_NOFOLLOW``; the file must be a regular one."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0), 0o600)
    except OSError as exc:
        if os.path.islink(path):  # ELOOP (Linux), EMLINK (FreeBSD), ...
            raise _refuse(path, "a symbolic link") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _refuse(path, "not a regular file")
    return fd


def read_bytes_bounded(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (never through a link), at most ``limit`` of them:
    :class:`RunFileError` for a link, a non-regular file or a larger file; ``FileNotFoundError`` if absent.

    Example:
        >>> import tempfile, pathlib
        >>> from llmgym.runtime.files import read_bytes_bounded
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.json"
        >>> _ = p.write_text("{}")
        >>> read_bytes_bounded(p, 10)
        b'{}'
        >>> read_bytes_bounded(p, 1)
        Traceback (most recent call last):
        ...
        llmgym.runtime.files.RunFileError: '.../a.json' is larger than 1 bytes: ...
    """
    path = Path(path)
    fd = _open_fd(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise RunFileError(f"{str(path)!r} is larger than {limit} bytes: not a file this run wrote; move it away")
    return data


def open_append(path: str | os.PathLike, *, truncate: bool = False) -> TextIO:
    """``path`` opened to append text (UTF-8), never through a link, made with mode 0600 when new;
    ``truncate=True`` empties it first. What a run's per-step logs (``metrics.jsonl``, ``rollouts.jsonl``)
    are written through: each line is appended where it belongs, no file is rewritten per step.

    Example:
        >>> import tempfile, pathlib
        >>> from llmgym.runtime.files import open_append
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "log.jsonl"
        >>> with open_append(p) as f:
        ...     _ = f.write("a\\n")
        >>> with open_append(p) as f:
        ...     _ = f.write("b\\n")
        >>> p.read_text(), oct(p.stat().st_mode & 0o777)
        ('a\\nb\\n', '0o600')
    """
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0)
    return os.fdopen(_open_fd(path, flags), "a", encoding="utf-8")


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` as :func:`write_text_atomic` writes text (a temporary file, mode 0600, and a
    rename that replaces whatever was at ``path`` — a link included — without following it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


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
    return write_bytes_atomic(path, text.encode("utf-8"))




@dataclasses.dataclass
class JsonlRead:
    """What :func:`scan_jsonl` (or :func:`rewind`) found in a JSONL file."""

    records: list[dict[str, Any]]
    """The whole JSON objects, in file order (after ``limit``: none)."""
    unreadable: int = 0
    """Lines skipped: cut short, not JSON, not an object, too long, too deep, a step that is not a number."""
    more: int = 0
    """Lines past ``limit`` records, counted, not read."""
    lost_steps: list[int] = dataclasses.field(default_factory=list)
    """(:func:`rewind`) Steps up to the checkpoint that no record holds and no earlier note names."""

    def note(self, name: str) -> str:
        """One line on what was skipped, or ``""``."""
        return f"{name}: skipped {self.unreadable} unreadable line{'s' * (self.unreadable != 1)}" \
            if self.unreadable else ""


_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


class _TooDeep(ValueError):
    pass


def _clean(value: Any, depth: int = 0) -> Any:
    """``value`` with lone surrogates in its strings (and keys) replaced by U+FFFD; :class:`_TooDeep` past
    :data:`MAX_DEPTH`."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return _SURROGATE.sub("\ufffd", value)
    if depth >= MAX_DEPTH and isinstance(value, (dict, list)):
        raise _TooDeep
    if isinstance(value, dict):
        return {_clean(k): _clean(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v, depth + 1) for v in value]
    return value


def _lines(f: BinaryIO, max_line: int) -> Iterator[bytes | None]:
    """Each line of ``f`` (``None`` for one longer than ``max_line``, which is read past in pieces, never held)."""
    while True:
        line = f.readline(max_line + 1)
        if not line:
            return
        if len(line) > max_line and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = f.readline(2**20)
            yield None
            continue
        yield line


def _parse(line: bytes) -> dict[str, Any] | None:
    """A line's JSON object; ``None`` for anything else (every way a line can fail to decode is caught here)."""
    try:
        record = json.loads(line.decode("utf-8"))
        if not isinstance(record, dict):
            return None
        # the walk is needed only where a surrogate escape or deep nesting can be (valid UTF-8 holds no surrogate)
        if _ESCAPED_SURROGATE.search(line) or line.count(b"[") + line.count(b"{") > MAX_DEPTH:
            return _clean(record)
        return record
    except (ValueError, RecursionError):  # bad UTF-8 or JSON, > 4300-digit ints, _TooDeep; nesting past the limit
        return None


def scan_jsonl(path: str | os.PathLike, *, limit: int | None = None, max_line: int = MAX_LINE_BYTES,
               thin: int | None = None, keep: Any = None) -> JsonlRead:
    """Read a JSONL file (one JSON object a line) by the rules of this module: never through a link
    (:class:`RunFileError`), each line bounded and decoded on its own, the unreadable ones counted. After
    ``limit`` records the remaining lines are counted (``more``), not parsed. With ``thin``, at most ``2 * thin``
    records are held whatever the file's length: past that, every other one is let go and the stride doubles, so
    what is kept spans the whole file evenly, its last record included (``more`` counts those let go). ``keep``: a
    test of each record; those it refuses are counted in ``more``, never held. No file: nothing read.

    Example:
        >>> import tempfile, pathlib
        >>> from llmgym.runtime.files import scan_jsonl
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "log.jsonl"
        >>> lines = ['{"a": "\\\\ud800"}', "[" * 100_000, '{"n": ' + "9" * 5000 + "}", '{"b": 1}']
        >>> _ = p.write_text("\\n".join(lines) + "\\n")
        >>> got = scan_jsonl(p)
        >>> got.records, got.unreadable
        ([{'a': '\ufffd'}, {'b': 1}], 2)
    """
    path = Path(path)
    if not os.path.lexists(path):
        return JsonlRead([])
    out = JsonlRead([])
    stride, seen, last = 1, 0, None
    with os.fdopen(_open_fd(path, os.O_RDONLY), "rb") as f:
        for line in _lines(f, max_line):
            if limit is not None and len(out.records) >= limit:
                out.more += 1
                continue
            if line is not None and not line.strip():
                continue
            record = _parse(line) if line is not None else None
            if record is None:
                out.unreadable += 1
                continue
            if keep is not None and not keep(record):
                out.more += 1
                continue
            seen += 1
            if thin is None:
                out.records.append(record)
                continue
            last = None
            if (seen - 1) % stride:
                last = record  # kept only if it turns out to be the file's last
                continue
            out.records.append(record)
            if len(out.records) >= 2 * thin:  # a file longer than a run writes: hold no more than this
                out.records, stride = out.records[::2], stride * 2
    if last is not None:
        out.records.append(last)
    if thin is not None:
        out.more += seen - len(out.records)
    return out


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a JSONL log, one JSON object a line; ``[]`` when there is no file. A line that is not a
    whole object (the last line of a run killed as it wrote it), or is past a bound, is skipped
    (:func:`scan_jsonl` counts them).

    Example:
        >>> import tempfile, pathlib
        >>> from llmgym.runtime.files import read_jsonl
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "log.jsonl"
        >>> _ = p.write_text('{"step": 1}\\n{"step": 2}\\n{"step": 3, "rew')
        >>> read_jsonl(p)
        [{'step': 1}, {'step': 2}]
    """
    return scan_jsonl(path).records


def _step(record: dict[str, Any]) -> int | None:
    """A record's step: an integer (or integral float); ``None`` when it has none; ``-1`` when it is not one."""
    step = record.get("step")
    if step is None:
        return None
    if isinstance(step, bool) or not isinstance(step, (int, float)) or step != step or abs(step) > 2**62:
        return -1
    return int(step) if float(step).is_integer() else -1


LOST_STEPS = "lost_steps"
"""The field of a note :func:`rewind` appends to a log that lost steps (a record without ``step``)."""


def step_span(steps: list[int]) -> str:
    """Sorted steps as ranges.

    Example:
        >>> from llmgym.runtime.files import step_span
        >>> step_span([3, 5, 6, 7])
        '3, 5–7'
    """
    parts, i = [], 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        parts.append(str(steps[i]) if i == j else f"{steps[i]}–{steps[j]}")
        i = j + 1
    return ", ".join(parts)


def rewind(path: str | os.PathLike, last_step: int, *, every_step: bool = False) -> JsonlRead:
    """Rewind a step-keyed JSONL log (a run's ``metrics.jsonl``, ``rollouts.jsonl``) to ``last_step``, the step
    of the checkpoint a run resumes from: the records of later steps and every unreadable line go, the rest
    stay as written, and the file is replaced atomically (:func:`write_text_atomic`). Records without a step
    (notes) stay.

    ``every_step=True`` (a log with one record per step, ``metrics.jsonl``): the steps ``1..last_step`` that no
    record holds are ``lost_steps`` — cut or corrupt lines, or lines removed — and, unless an earlier note
    already names them, a note ``{"lost_steps": [...], "unreadable_lines": N, "resumed_from": last_step}`` is
    appended, so no gap in the steps exists without a word.

    Example:
        >>> import tempfile, pathlib
        >>> from llmgym.runtime.files import rewind
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl"
        >>> _ = p.write_text('{"step": 1}\\n{"st\\n{"step": 3}\\n{"step": 5}\\n')
        >>> got = rewind(p, 4, every_step=True)
        >>> [r.get("step") for r in got.records], got.lost_steps, got.unreadable
        ([1, 3, None], [2, 4], 1)
        >>> p.read_text().splitlines()[-1]
        '{"lost_steps": [2, 4], "unreadable_lines": 1, "resumed_from": 4}'
    """
    path = Path(path)
    if not os.path.lexists(path):
        return JsonlRead([])
    read = scan_jsonl(path, keep=lambda record: (_step(record) or 0) <= last_step)  # later steps: never held
    read.more = 0
    kept, noted, present = [], set(), set()
    for record in read.records:
        step = _step(record)
        if step == -1:
            read.unreadable += 1
            continue
        if step is None:
            lost = record.get(LOST_STEPS)
            if isinstance(lost, list):
                noted.update(s for s in lost if isinstance(s, int))
        elif step > last_step:
            continue
        else:
            present.add(step)
        kept.append(record)
    read.records = kept
    if every_step:
        accounted = sum(1 for s in present | noted if isinstance(s, int) and 1 <= s <= last_step)
        if last_step - accounted > MAX_LOST_STEPS:  # the checkpoint's step sizes no work before it is believed
            raise RunFileError(f"{str(path)!r} holds {accounted} of the {last_step} steps its checkpoint says the run "
                               f"reached: not this run's log, or not this run's checkpoint; start a new run")
        read.lost_steps = [s for s in range(1, last_step + 1) if s not in present and s not in noted]
        if read.lost_steps:
            kept.append({LOST_STEPS: read.lost_steps, "unreadable_lines": read.unreadable, "resumed_from": last_step})
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))
    return read


def lost_steps_note(name: str, read: JsonlRead, last_step: int) -> str:
    """The line a resumed run prints for a log :func:`rewind` found damaged, or ``""``.

    Example:
        >>> from llmgym.runtime.files import JsonlRead, lost_steps_note
        >>> lost_steps_note("metrics.jsonl", JsonlRead([], unreadable=2, lost_steps=[12, 56, 57, 58]), 60)
        'metrics.jsonl: steps 12, 56–58 lost (cut, corrupt or removed lines; 2 unreadable lines dropped); the run resumes from step 60'
    """
    if read.lost_steps:
        dropped = (f"; {read.unreadable} unreadable line{'s' * (read.unreadable != 1)} dropped"
                   if read.unreadable else "")
        return (f"{name}: step{'s' * (len(read.lost_steps) != 1)} {step_span(read.lost_steps)} lost (cut, corrupt or "
                f"removed lines{dropped}); the run resumes from step {last_step}")
    if read.unreadable:
        return f"{name}: dropped {read.unreadable} unreadable line{'s' * (read.unreadable != 1)}; no step up to " \
               f"{last_step} is missing"
    return ""


def rewind_jsonl(path: str | os.PathLike, last_step: int) -> list[dict[str, Any]]:
    """The records :func:`rewind` keeps (no note on lost steps: for logs that skip steps, ``rollouts.jsonl``).

    Example:
        >>> import tempfile, pathlib
        >>> from llmgym.runtime.files import rewind_jsonl
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "log.jsonl"
        >>> _ = p.write_text("".join(f'{{"step": {s}}}\\n' for s in (1, 2, 3)) + '{"step": 4, "rew')
        >>> [r["step"] for r in rewind_jsonl(p, 2)], p.read_text().count("\\n")
        ([1, 2], 2)
    """
    return rewind(path, last_step).records
