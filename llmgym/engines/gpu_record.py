"""Which ``HFEngine`` decoding modes have passed on a GPU: the record the GPU defaults are read from.

**The rule** (docs/scale.md, "The GPU check"): a GPU-only path — compiled kernels, CUDA graphs,
Triton code — is never a default before a GPU run has passed it, because a CPU cannot check it.
``benchmarks/gpu_check.py`` judges every decoding mode on a GPU (the engine contract tests on CUDA
per mode, the compiled step against the eager tokens, a run at the Qwen2-0.5B shape) and writes
its verdicts, with the commit and a digest of the code it ran, into its JSON;
``python benchmarks/gpu_check.py --promote that.json`` checks the digest against the commit, copies
the JSON into ``benchmarks/results/`` and writes the verdicts into ``gpu_record.json`` next to this
module — the file committed with the package, so an installed ``llmgym`` follows it too. On a GPU,
:func:`default_gpu_decode` (hence ``resolve_device_defaults`` and ``--engine-decode auto``) picks the
fastest mode whose latest GPU verdict is a pass (``compiled`` > ``static`` > ``eager``).

Record format (``format: 1``)::

    {"format": 1,
     "decode_modes": {"<mode>": {"passed": true | false, "commit": "<40 hex>", "gpu": "...",
                                 "torch": "...", "date_utc": "YYYY-MM-DD...", "evidence": "...",
                                 "source": "benchmarks/results/<file>.json" (optional)}}}
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

from llmgym.errors import LLMGymError
from llmgym.engines.static_decode import DECODE_MODES

__all__ = [
    "GPU_RECORD",
    "DECODE_PREFERENCE",
    "GPURecordError",
    "validate_gpu_record",
    "load_gpu_record",
    "gpu_verified_decodes",
    "default_gpu_decode",
    "merge_verdicts",
]

GPU_RECORD = Path(__file__).with_name("gpu_record.json")
"""The committed record (package data)."""

DECODE_PREFERENCE = ("compiled", "static", "eager")
"""Fastest first on a GPU; ``eager`` (plain PyTorch, the engine's own default) is the last resort."""

_FORMAT = 1
_REQUIRED = {"passed": bool, "commit": str, "gpu": str, "torch": str, "date_utc": str, "evidence": str}
_COMMIT = re.compile(r"[0-9a-f]{40}")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class GPURecordError(LLMGymError, ValueError):
    """The GPU record (or a GPU check's verdicts) is malformed; the message names the field."""


def validate_gpu_record(record: Any, where: str = "gpu_record.json") -> dict:
    """Check ``record``'s format; return it, or raise :class:`GPURecordError` naming the problem.

    Example:
        >>> from llmgym.engines.gpu_record import validate_gpu_record, GPURecordError
        >>> try:
        ...     validate_gpu_record({"format": 1, "decode_modes": {"turbo": {}}})
        ... except GPURecordError as err:
        ...     print(err)
        gpu_record.json: decode_modes has unknown mode 'turbo' (known: eager, static, compiled)
    """
    if not isinstance(record, dict):
        raise GPURecordError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if record.get("format") != _FORMAT:
        raise GPURecordError(f"{where}: format must be {_FORMAT}, got {record.get('format')!r}")
    modes = record.get("decode_modes")
    if not isinstance(modes, dict):
        raise GPURecordError(f"{where}: decode_modes must be an object of mode -> verdict")
    for mode, verdict in modes.items():
        if mode not in DECODE_MODES:
            raise GPURecordError(f"{where}: decode_modes has unknown mode {mode!r} (known: {', '.join(DECODE_MODES)})")
        if not isinstance(verdict, dict):
            raise GPURecordError(f"{where}: decode_modes.{mode} must be an object")
        for field, kind in _REQUIRED.items():
            if not isinstance(verdict.get(field), kind) or (kind is str and not verdict[field].strip()):
                raise GPURecordError(f"{where}: decode_modes.{mode}.{field} must be a non-empty {kind.__name__}")
        if not _COMMIT.fullmatch(verdict["commit"]):
            raise GPURecordError(f"{where}: decode_modes.{mode}.commit must be a full 40-hex commit id, "
                                 f"got {verdict['commit'][:60]!r}")
        if not _DATE.match(verdict["date_utc"]):
            raise GPURecordError(f"{where}: decode_modes.{mode}.date_utc must start YYYY-MM-DD")
        source = verdict.get("source")
        if source is not None and not (isinstance(source, str) and source.startswith("benchmarks/results/")
                                       and source.endswith(".json")):
            raise GPURecordError(f"{where}: decode_modes.{mode}.source must name a benchmarks/results/*.json file")
    return record


def load_gpu_record(path: str | Path | None = None) -> dict:
    """The record at ``path`` (default: the committed :data:`GPU_RECORD`), validated.

    Example:
        >>> from llmgym.engines.gpu_record import load_gpu_record
        >>> sorted(load_gpu_record()["decode_modes"])
        ['compiled', 'eager', 'static']
    """
    path = Path(path) if path is not None else GPU_RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise GPURecordError(f"{path}: cannot read the GPU record ({type(err).__name__}: {err}); restore it from "
                             "git or write it with benchmarks/gpu_check.py --promote") from None
    return validate_gpu_record(record, where=str(path))


def gpu_verified_decodes(record: Mapping | None = None) -> tuple[str, ...]:
    """Decoding modes whose latest GPU verdict is a pass, fastest first.

    Example:
        >>> from llmgym.engines.gpu_record import gpu_verified_decodes
        >>> rec = {"format": 1, "decode_modes": {}}
        >>> gpu_verified_decodes(rec)
        ()
    """
    record = load_gpu_record() if record is None else validate_gpu_record(dict(record), "GPU record")
    modes = record["decode_modes"]
    return tuple(m for m in DECODE_PREFERENCE if modes.get(m, {}).get("passed") is True)


def default_gpu_decode(record: Mapping | None = None) -> str:
    """The decoding mode a GPU gets by default: the fastest one a GPU run has passed, else ``eager``.

    Example:
        >>> from llmgym.engines.gpu_record import default_gpu_decode, gpu_verified_decodes
        >>> default_gpu_decode() in gpu_verified_decodes()
        True
    """
    verified = gpu_verified_decodes(record)
    return verified[0] if verified else "eager"


def merge_verdicts(record: Mapping, verdicts: Mapping, run: Mapping, source: str) -> dict:
    """A new record: ``record`` with each mode judged in ``verdicts`` replaced by that run's verdict.

    ``verdicts`` is a GPU check's ``{mode: {"passed": bool, ...}}``; ``run`` gives ``commit``, ``gpu``,
    ``torch`` and ``date_utc``; ``source`` is the check's JSON under ``benchmarks/results/``. The
    latest verdict wins, a failure too (a mode that fails on today's code loses its default).

    Example:
        >>> from llmgym.engines.gpu_record import merge_verdicts
        >>> run = {"commit": "a" * 40, "gpu": "NVIDIA H100", "torch": "2.11", "date_utc": "2026-11-27T10:00:00Z"}
        >>> new = merge_verdicts({"format": 1, "decode_modes": {}}, {"compiled": {"passed": True, "checks": {}}},
        ...                      run, "benchmarks/results/gpu_check_h100.json")
        >>> new["decode_modes"]["compiled"]["passed"], new["decode_modes"]["compiled"]["source"]
        (True, 'benchmarks/results/gpu_check_h100.json')
    """
    merged = {"format": _FORMAT, "decode_modes": {k: dict(v) for k, v in record.get("decode_modes", {}).items()}}
    for mode, verdict in verdicts.items():
        if mode not in DECODE_MODES or not isinstance(verdict, Mapping) or not isinstance(verdict.get("passed"), bool):
            raise GPURecordError(f"GPU check verdicts: {mode!r} needs a known mode and a boolean 'passed'")
        failed = [name for name, ok in (verdict.get("checks") or {}).items() if not ok]
        merged["decode_modes"][mode] = {
            "passed": verdict["passed"], "commit": str(run.get("commit") or ""), "gpu": str(run.get("gpu") or ""),
            "torch": str(run.get("torch") or ""), "date_utc": str(run.get("date_utc") or ""),
            "evidence": "benchmarks/gpu_check.py: " + ("every check passed" if verdict["passed"] else
                                                        "failed: " + (", ".join(failed) or "see the source JSON")),
            "source": source,
        }
    return validate_gpu_record(merged, "merged GPU record")
