"""Write docs/benchmarks.md from what benchmarks/results/ records: every measured number, with its machine and date.

The guides under docs/ explain and link here; the numbers live in ``benchmarks/results/``:

* ``machines.json`` — the machines the numbers were measured on, by name;
* ``doc_measurements.jsonl`` — one measured statement per line (``topic``, ``measured``, ``machine``,
  ``date``, ``load``, ``settings``, the ``page`` that cites it);
* ``notes_*.md`` — measured tables and paragraphs written by hand, included as they are;
* ``learning_spread.jsonl`` — every run of ``benchmarks/learning_spread.py``, summarised per check;
* every other ``*.json`` / ``*.jsonl`` — a benchmark script's output, its scalars listed; ``*.png`` linked.

    python benchmarks/make_page.py            # rewrite docs/benchmarks.md
    python benchmarks/make_page.py --check    # exit 1 if docs/benchmarks.md is not what this writes

The page depends only on the files (sorted by name), never on the machine running this script:
``tests/project/test_benchmarks_page.py`` checks the committed page equals its output.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
MAX_VALUES = 40
"""Scalars listed per result file; the rest are counted."""
SCRIPTS = {
    "async_speed": "async_speed.py", "engine_speed": "engine_speed.py", "fleet_speed": "fleet_speed.py",
    "gpu_check": "gpu_check.py", "grpo_vs_trl": "grpo_vs_trl.py", "lora_sync": "lora_sync.py",
    "memory_timeline": "memory_timeline.py",
    "sampler_speed": "sampler_speed.py", "tools_spread": "the tool-use recipe's `spread(seed)`, by hand",
    "fleet_spread": "`tests/engines/test_fleet.py`'s recipe, by hand",
}
HAND_MADE = {"machines.json", "doc_measurements.jsonl", "learning_spread.jsonl"}


def _number(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        return f"{v:.4g}" if abs(v) < 1e6 else f"{v:,.0f}"
    return str(v)


def _cell(v: Any, width: int = 160) -> str:
    text = _number(v) if not isinstance(v, str) else v
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 1] + "…"


def _leaves(obj: Any, path: str = "") -> list[tuple[str, Any]]:
    """``(dotted path, scalar)`` of every scalar in ``obj``; a list of numbers is one leaf."""
    if isinstance(obj, dict):
        return [leaf for k, v in obj.items() for leaf in _leaves(v, f"{path}.{k}" if path else str(k))]
    if isinstance(obj, list):
        if obj and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in obj):
            return [(path, "[" + ", ".join(_number(x) for x in obj) + "]")]
        return [leaf for i, v in enumerate(obj) for leaf in _leaves(v, f"{path}[{i}]")]
    return [(path, obj)]


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _machines() -> dict[str, str]:
    path = RESULTS / "machines.json"
    return json.loads(path.read_text()) if path.exists() else {}


def section_machines(machines: dict[str, str]) -> list[str]:
    lines = ["## Machines", "", "| name | machine |", "|---|---|"]
    lines += [f"| `{name}` | {_cell(text)} |" for name, text in machines.items()]
    return lines + [""]


def section_quoted(machines: dict[str, str]) -> list[str]:
    path = RESULTS / "doc_measurements.jsonl"
    if not path.exists():
        return []
    rows = _read_jsonl(path)
    unknown = sorted({r["machine"] for r in rows if r.get("machine") and r["machine"] not in machines})
    if unknown:
        raise SystemExit(f"{path.name} names machines machines.json lacks: {', '.join(unknown)}")
    lines = ["## Numbers the guides refer to", "",
             "Measured statements, by topic; load is the machine's load average while measuring (2 cores).", ""]
    for topic in dict.fromkeys(r["topic"] for r in rows):
        lines += [f"### {topic}", "", "| measured | machine | date | load | settings | cited by |", "|---|---|---|---|---|---|"]
        for r in rows:
            if r["topic"] == topic:
                lines.append("| " + " | ".join(_cell(r.get(k) or "–", 400) for k in
                                                ("measured", "machine", "date", "load", "settings", "page")) + " |")
        lines.append("")
    return lines


def section_notes() -> list[str]:
    lines: list[str] = []
    for path in sorted(RESULTS.glob("notes_*.md")):
        lines += [path.read_text().rstrip(), "", f"*(from `benchmarks/results/{path.name}`)*", ""]
    return lines


def section_learning_spread() -> list[str]:
    path = RESULTS / "learning_spread.jsonl"
    if not path.exists():
        return []
    rows = _read_jsonl(path)
    latest: dict[str, str] = {}
    for r in rows:  # the code each recipe ran last
        if r.get("kind") == "done":
            latest[r["recipe"]] = r["code"]
    checks = [r for r in rows if r.get("kind") == "check" and latest.get(r["recipe"]) == r.get("code")]
    runs = [r for r in rows if r.get("kind") == "done" and latest.get(r["recipe"]) == r.get("code")]
    lines = ["## Learning tests: the spread behind the margins", "",
             "Every run `benchmarks/learning_spread.py` recorded of each recipe's latest code "
             "([learning_tests.md](learning_tests.md) explains the recipes and kernel families); "
             "min ÷ bound above 1 means every run passed.", "",
             "| test (`tests/…`) | asserts | runs | min | mean | max | min ÷ bound | families | dates | load |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in checks:
        groups.setdefault((r["recipe"], r["check"]), []).append(r)
    for (recipe, check), group in groups.items():
        values = [r["value"] for r in group]
        bound, op = group[0]["bound"], group[0].get("op", ">")
        mine = [r for r in runs if r["recipe"] == recipe]
        loads = [x for r in mine for x in r.get("load", [])]
        dates = sorted({r["date"] for r in mine})
        fails = sum(not (v >= bound if op == ">=" else v > bound) for v in values)
        lines.append(
            f"| {recipe}: {check} | {group[0].get('statistic', 'held-out gain')} {op} {bound:g} "
            f"| {len(values)}{f' ({fails} fail)' if fails else ''} | {min(values):+.3f} | {statistics.mean(values):+.3f} "
            f"| {max(values):+.3f} | {min(values) / bound:.2f} | {', '.join(sorted({r['family'] for r in group}))} "
            f"| {dates[0]}{'..' + dates[-1] if len(dates) > 1 else ''} "
            f"| {f'{min(loads):.1f}–{max(loads):.1f}' if loads else '–'} |")
    wall = [(r["recipe"], r["family"], r["threads"], r["seed"], r.get("wall_s"), r.get("cpu_s")) for r in runs]
    lines += ["", "Time of each recorded run (CPU seconds are the better measure on a shared machine):", "",
              "| recipe | family | threads | seed | wall s | CPU s |", "|---|---|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} | {_number(e)} | {_number(f)} |" for a, b, c, d, e, f in wall]
    return lines + [""]


def section_files() -> list[str]:
    lines = ["## Result files", "",
             "Each benchmark script's own output, as recorded; the script's docstring says how to re-run it.", ""]
    for path in sorted(RESULTS.iterdir()):
        if path.name in HAND_MADE or path.name.startswith("notes_") or path.name.startswith("."):
            continue
        stem = path.stem
        script = next((s for prefix, s in SCRIPTS.items() if stem.startswith(prefix)), None)
        head = f"### `{path.name}`" + (f" — {script if '`' in script or ' ' in script else f'`benchmarks/{script}`'}"
                                       if script else "")
        if path.suffix == ".png":
            lines += [head, "", f"![{path.name}](../benchmarks/results/{path.name})", ""]
            continue
        if path.suffix == ".json":
            data: Any = json.loads(path.read_text())
        elif path.suffix == ".jsonl":
            data = _read_jsonl(path)
        else:
            continue
        leaves = _leaves(data)
        lines += [head, "", "| value | recorded |", "|---|---|"]
        lines += [f"| `{_cell(k, 90)}` | {_cell(v)} |" for k, v in leaves[:MAX_VALUES]]
        if len(leaves) > MAX_VALUES:
            lines.append(f"| … | {len(leaves) - MAX_VALUES} more values in the file |")
        lines.append("")
    return lines


def render() -> str:
    machines = _machines()
    lines = ["# Benchmarks and measured numbers", "",
             "<!-- generated by benchmarks/make_page.py from benchmarks/results/: edit those files and re-run it -->", "",
             "Every number the project measured, with the machine and the date. The guides explain and link "
             "here; numbers change with the code, the machine and its load, so each is kept with where and "
             "when it was taken. No test asserts a speed.", ""]
    for part in (section_machines(machines), section_quoted(machines), section_notes(), section_learning_spread(),
                 section_files()):
        lines += part
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale; write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python benchmarks/make_page.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
