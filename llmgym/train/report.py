"""One page to open: a run (or a ``bench`` output) as a single self-contained HTML file.

:func:`write_report` reads a run directory (``metrics.jsonl``, ``curves.png``, ``config.json``,
``rollouts.jsonl``) or a benchmark's summary (``bench --out FILE.json`` and its ``FILE.samples.jsonl``) and
writes one HTML file that needs no server and no network: the data, the style, the script and the curves
(a PNG as a ``data:`` URL) are all inside it, and its Content-Security-Policy forbids every fetch. It shows
the curves, the settings, and the sampled episodes by step (a benchmark: the per-task results and each
failed sample), searchable by text and filterable by reward.

Model text is hostile input: the page puts every string it shows into the document as text
(``textContent``), never as markup, and the embedded JSON cannot close its ``<script>`` element.

Example:
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> from llmgym.train.report import write_report
    >>> with tempfile.TemporaryDirectory() as d:
    ...     run = Path(d)
    ...     _ = (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\\n")
    ...     _ = (run / "rollouts.jsonl").write_text(json.dumps({"step": 1, "completion": "</script>", "reward": 0.5}) + "\\n")
    ...     page = write_report(run).read_text()
    ...     "data:image/png;base64," in page, "</script>\\"" in page, page.count("</script>")
    (True, False, 2)
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from llmgym.errors import LLMGymError
from llmgym.runtime.files import (
    RunFileError,
    check_run_folder,
    read_bytes_bounded,
    scan_jsonl,
    step_span,
    write_text_atomic,
)

__all__ = ["MAX_METRIC_ROWS", "MAX_PAGE_CHARS", "MAX_PAGE_TEXT", "MAX_RECORDS", "ReportInputError", "report_data", "write_report"]

MAX_METRIC_ROWS = 50_000
"""At most twice this many ``metrics.jsonl`` records are held for a page: a longer file is thinned evenly (every
other record let go, again as it grows), its last record kept, so the page's memory is bounded by this, not by
the file (a 38 MB file of small records took the page to 721 MB before)."""
MAX_RECORDS = 5000
"""Sampled episodes a page holds at most (the first ones, in file order); the page says how many it left out."""
MAX_PAGE_TEXT = 20_000
"""Characters a page shows of any one text (a completion, a prompt, a setting); the rest is cut with a marker
that says how long the text was."""
MAX_PAGE_CHARS = 16_000_000
"""The page's data budget in characters: per-task rows and episodes beyond it are left out (and counted), so a
page's size is bounded by this, not by its inputs."""
MAX_PNG_BYTES = 8 * 2**20
"""A ``curves.png`` larger than this (8 MiB) is not embedded (the curves are drawn again from the metrics)."""
MAX_JSON_BYTES = 32 * 2**20
"""A ``config.json`` or bench summary larger than this (32 MiB) is not read."""
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_MAX_DEPTH = 24


class ReportInputError(LLMGymError, ValueError):
    """The path is neither a run directory nor a ``bench`` summary (or one of its files is a link)."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(read_bytes_bounded(path, MAX_JSON_BYTES))
    except RunFileError as exc:
        raise ReportInputError(str(exc)) from None
    except (OSError, ValueError, RecursionError):
        return None


def _png_data_url(path: Path) -> str | None:
    """``path`` as a ``data:`` URL when it is a regular file under :data:`MAX_PNG_BYTES` that begins with the PNG
    signature; ``None`` otherwise (a link is refused before: :func:`report_data`)."""
    try:
        data = read_bytes_bounded(path, MAX_PNG_BYTES)
    except (OSError, RunFileError):
        return None
    return "data:image/png;base64," + base64.b64encode(data).decode() if data.startswith(_PNG_SIGNATURE) else None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _clip(text: str) -> str:
    text = _SURROGATE.sub("\ufffd", text)
    return text if len(text) <= MAX_PAGE_TEXT else \
        text[:MAX_PAGE_TEXT] + f"… [cut for the page: {len(text):,} characters in all]"


def _for_page(value: Any, depth: int = 0) -> Any:
    """``value`` with every string (and key) cut to :data:`MAX_PAGE_TEXT`, lone surrogates replaced, nesting bounded."""
    if isinstance(value, str):
        return _clip(value)
    if isinstance(value, (dict, list)) and depth >= _MAX_DEPTH:
        return "… [nested too deep for the page]"
    if isinstance(value, dict):
        return {_clip(str(k)): _for_page(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_for_page(v, depth + 1) for v in value]
    return value


def _within(items: list[Any], budget: list[int]) -> tuple[list[Any], int]:
    """The first of ``items`` (made fit for the page) whose JSON fits in ``budget[0]`` characters (spent),
    and how many were left out."""
    from llmgym.runtime.logging import json_safe

    kept = []
    for i, item in enumerate(items):
        item = json_safe(_for_page(item))
        size = len(json.dumps(item, ensure_ascii=False))
        if size > budget[0]:
            return kept, len(items) - i
        budget[0] -= size
        kept.append(item)
    return kept, 0


def _records(path: Path) -> tuple[list[dict[str, Any]], int, int]:
    """A JSONL file's records (at most :data:`MAX_RECORDS`), how many more it holds, how many lines were unreadable."""
    try:
        read = scan_jsonl(path, limit=MAX_RECORDS)
    except RunFileError as exc:
        raise ReportInputError(str(exc)) from None
    return read.records, read.more, read.unreadable


def report_data(path: str | os.PathLike) -> dict[str, Any]:
    """What the page of ``path`` shows, as plain data: ``kind`` (``"run"`` or ``"bench"``), ``title``,
    ``summary`` (label → value), ``config``, ``curves`` (a PNG ``data:`` URL or ``None``), ``records`` (the
    sampled episodes), ``group_by`` (the field records are grouped by), ``tasks`` (a benchmark's per-task
    results) and ``left_out`` (records beyond :data:`MAX_RECORDS` or the page's budget).

    The files are data from whoever wrote them: one that is a link is refused (:class:`ReportInputError`),
    every line is read with a bound and unreadable ones are skipped and counted (``summary``), ``curves.png``
    is embedded only when it is a PNG, and the page's texts and size are bounded (:data:`MAX_PAGE_TEXT`,
    :data:`MAX_PAGE_CHARS`)."""
    from llmgym.runtime.logging import step_rows, plot_curves
    from llmgym.train.rollouts import ROLLOUTS_FILE

    path = Path(path)
    budget = [MAX_PAGE_CHARS]
    if path.is_dir() and os.path.lexists(path / "metrics.jsonl"):
        try:
            check_run_folder(path)
            read = scan_jsonl(path / "metrics.jsonl", thin=MAX_METRIC_ROWS)  # memory bounded, whatever its length
        except RunFileError as exc:
            raise ReportInputError(str(exc)) from None
        rows = step_rows(read.records)
        notes = [r for r in read.records if "step" not in r]
        config = _read_json(path / "config.json")
        config = config if isinstance(config, dict) else {}
        curves = _png_data_url(path / "curves.png")
        if curves is None and rows:
            with tempfile.TemporaryDirectory() as tmp:
                curves = _png_data_url(plot_curves(rows, Path(tmp) / "curves.png"))
        records, more, unreadable = _records(path / ROLLOUTS_FILE)
        last = rows[-1] if rows else {}
        evals = [r for r in rows if isinstance(r.get("eval_reward"), (int, float))]
        summary = {"steps": last.get("step"), "reward (last step)": last.get("reward_mean"),
                   "held-out reward (last evaluation)": evals[-1]["eval_reward"] if evals else None,
                   "sampled completions": last.get("samples_total"),
                   "wall time (s)": sum(_number(r.get("wall_s")) for r in rows) if rows else None}
        lost = sorted({s for n in notes if isinstance(n.get("lost_steps"), list) for s in n["lost_steps"]
                       if isinstance(s, int)})
        summary.update(_mismatch_summary(rows))
        if lost:
            summary["steps lost (cut or corrupt lines, noted at resume)"] = step_span(lost)
        skipped = read.unreadable + unreadable
        if skipped:
            summary["unreadable lines skipped"] = skipped
        title = _clip(f"{config.get('agent', 'run')} on {config.get('env', path.name)}")[:300]
        config = _for_page(config)
        kept, over = _within(records, budget)
        return {"kind": "run", "title": title, "source": _clip(str(path)), "summary": _for_page(summary),
                "config": config, "curves": curves, "records": kept, "left_out": more + over, "group_by": "step", "tasks": []}
    if os.path.lexists(path) and path.suffix == ".json":
        summary_json = _read_json(path)
        if isinstance(summary_json, dict) and isinstance(summary_json.get("per_task"), list):
            samples = path.with_name(path.stem + ".samples.jsonl")
            records, more, unreadable = _records(samples)
            tasks = summary_json["per_task"]
            prompts = {t.get("id"): t.get("prompt") for t in tasks if isinstance(t, dict) and _hashable(t.get("id"))}
            for r in records:  # the samples file leaves the prompt to the summary
                if _hashable(r.get("task_id")):
                    r.setdefault("prompt", prompts.get(r.get("task_id")))
            config = _for_page({k: v for k, v in summary_json.items() if k != "per_task"})
            keys = [k for k in summary_json if k.startswith("pass@")] + ["reward_mean", "reward_ci95", "tasks",
                                                                         "samples", "tokens_per_s", "wall_s"]
            summary = {_clip(k): _for_page(summary_json.get(k)) for k in keys if k in summary_json}
            if unreadable:
                summary["unreadable lines skipped"] = unreadable
            tasks, tasks_over = _within(tasks, budget)
            if tasks_over:
                summary["per-task rows left out (page size bound)"] = tasks_over
            kept, over = _within(records, budget)
            return {"kind": "bench", "title": _clip(f"bench: {summary_json.get('env', path.stem)}")[:300],
                    "source": _clip(str(path)), "summary": summary, "config": config, "curves": None,
                    "records": kept, "left_out": more + over, "group_by": "task_id", "tasks": tasks}
    raise ReportInputError(f"{str(path)!r} is neither a run directory (with metrics.jsonl) nor a bench summary "
                           f"(bench --out FILE.json): give one of those")


def _finite(value: Any) -> float | None:
    """``value`` when it is a finite real number (not a bool), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _mismatch_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The page's lines on the sampler-vs-learner mismatch (``mismatch_kl``, ``mismatch_prob_error``): the last
    measured step's values and the largest KL, with the step; nothing when no step measured it.

    Example:
        >>> _mismatch_summary([{"step": 1, "mismatch_kl": 0.002, "mismatch_prob_error": 1.01},
        ...                    {"step": 2, "mismatch_kl": "x"}, {"step": 3, "mismatch_kl": 0.04}])
        {'sampler–learner KL, k3 (last measured)': 0.04, 'sampler–learner KL, k3 (largest)': '0.04 at step 3', 'token probability error (last measured)': 1.01}
        >>> _mismatch_summary([{"step": 1, "reward_mean": 0.5}])
        {}
    """
    out: dict[str, Any] = {}
    kls = [(v, r.get("step")) for r in rows if (v := _finite(r.get("mismatch_kl"))) is not None]
    if kls:
        out["sampler–learner KL, k3 (last measured)"] = kls[-1][0]
        value, step = max(kls, key=lambda x: x[0])
        out["sampler–learner KL, k3 (largest)"] = f"{value:.4g} at step {step}"
    errors = [v for r in rows if (v := _finite(r.get("mismatch_prob_error"))) is not None]
    if errors:
        out["token probability error (last measured)"] = errors[-1]
    return out


def _number(value: Any) -> float:
    try:
        return float(value or 0)
    except (TypeError, ValueError, OverflowError):
        return 0.0


def _hashable(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


_PLACEHOLDER = re.compile(r"__(TITLE|STYLE|SCRIPT|DATA)__")


def write_report(path: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Write the page of the run directory or ``bench`` summary at ``path``; return where it went.

    ``out`` defaults to ``<run>/report.html`` for a run and ``FILE.report.html`` beside a benchmark's
    ``FILE.json``. The file is written whole (through a temporary file and a rename, which replaces a link
    standing there rather than following it). The template is filled in one pass: a value that holds a
    placeholder's name is not filled again."""
    from llmgym.runtime.logging import json_safe

    data = json_safe(report_data(path))  # NaN (a step without KL) becomes null
    source = Path(path)
    if out is None:
        out = source / "report.html" if data["kind"] == "run" else source.with_name(source.stem + ".report.html")
    out = Path(out)
    # JSON inside <script>: "<" escaped, so no text in it can end the element or open a comment
    payload = json.dumps(data, ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")
    title = data["title"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    values = {"TITLE": title, "STYLE": _STYLE, "SCRIPT": _SCRIPT, "DATA": payload}
    write_text_atomic(out, _PLACEHOLDER.sub(lambda m: values[m.group(1)], _PAGE))
    return out


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__ · llmgym report</title>
<style>__STYLE__</style></head>
<body>
<header><h1 id="title"></h1><div id="source" class="muted"></div></header>
<section id="summary-section"><h2>Summary</h2><table id="summary"></table></section>
<section id="curves-section" hidden><h2>Curves</h2><img id="curves" alt="training curves"></section>
<section id="tasks-section" hidden><h2>Per task</h2><table id="tasks"><thead><tr><th>task</th><th>prompt</th>
<th>samples</th><th>passed</th><th>mean reward</th></tr></thead><tbody></tbody></table></section>
<section id="records-section"><h2 id="records-title">Sampled episodes</h2>
<div class="controls">
<label>search <input id="search" type="search" placeholder="text in prompt, completion or info"></label>
<label>reward &ge; <input id="min-reward" type="number" step="any"></label>
<label>reward &le; <input id="max-reward" type="number" step="any"></label>
<label id="split-label">split <select id="split"><option value="">all</option><option>train</option><option>eval</option></select></label>
<label id="failed-label" hidden><input id="failed" type="checkbox"> failures only</label>
<span id="shown" class="muted"></span></div>
<div id="records"></div><div id="left-out" class="muted"></div></section>
<section id="config-section"><details><summary>Configuration</summary><pre id="config"></pre></details></section>
<script id="report-data" type="application/json">__DATA__</script>
<script>__SCRIPT__</script>
</body></html>
"""

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.5em;margin:0}h2{font-size:1.15em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.5em}
.muted{color:#777;font-size:.9em}table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:.25em .6em;
text-align:left;vertical-align:top}th{background:#f5f5f5}#curves{max-width:100%;border:1px solid #eee}
.controls{display:flex;flex-wrap:wrap;gap:1em;align-items:center;margin:.5em 0 1em}.controls input[type=number]{width:6em}
.group h3{font-size:1em;margin:1em 0 .3em;color:#444}.rec{border:1px solid #e3e3e3;border-radius:4px;margin:.35em 0;
padding:.4em .6em}.rec.bad{border-left:4px solid #d9534f}.rec.good{border-left:4px solid #5cb85c}
.rec .head{display:flex;gap:1.2em;flex-wrap:wrap;font-size:.92em}.rec .reward{font-weight:600}
pre{white-space:pre-wrap;word-break:break-word;background:#fafafa;border:1px solid #eee;padding:.4em;margin:.3em 0;
max-height:24em;overflow:auto}.label{color:#888;font-size:.85em;margin-top:.3em}
.rec .body{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,2fr);gap:.8em}.rec details{font-size:.9em}
"""

_SCRIPT = r"""
"use strict";
const data = JSON.parse(document.getElementById("report-data").textContent);
const $ = (id) => document.getElementById(id);
function el(tag, text, cls) { const e = document.createElement(tag); if (text !== undefined && text !== null) e.textContent = String(text); if (cls) e.className = cls; return e; }
function fmt(v) { if (v === null || v === undefined) return "—"; if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toPrecision(4); if (typeof v === "string") return v; if (Array.isArray(v) && v.every((x) => typeof x === "number")) return "[" + v.map(fmt).join(", ") + "]"; return JSON.stringify(v); }
function asText(v) { return typeof v === "string" ? v : JSON.stringify(v, null, 1); }
document.title = data.title + " · llmgym report";
$("title").textContent = data.title;
$("source").textContent = data.source;
for (const [k, v] of Object.entries(data.summary)) { const tr = el("tr"); tr.append(el("th", k), el("td", fmt(v))); $("summary").append(tr); }
if (data.curves) { $("curves").src = data.curves; $("curves-section").hidden = false; }
$("config").textContent = JSON.stringify(data.config, null, 2);
if (data.kind === "bench") {
  $("tasks-section").hidden = false; $("split-label").hidden = true; $("failed-label").hidden = false;
  $("records-title").textContent = "Samples by task";
  const body = $("tasks").querySelector("tbody");
  for (const t of data.tasks) { const tr = el("tr"); tr.append(el("td", t.id), el("td", asText(t.prompt)), el("td", fmt(t.samples)), el("td", fmt(t.passed)), el("td", fmt(t.reward_mean))); if (t.passed === 0) tr.className = "failed"; body.append(tr); }
}
if (data.left_out) $("left-out").textContent = data.left_out + " more records are in the file, not on this page.";
const cards = [];
let currentGroup = null, groupBox = null;
for (const r of data.records) {
  const key = r[data.group_by];
  if (groupBox === null || key !== currentGroup) {
    currentGroup = key; groupBox = el("div", null, "group");
    groupBox.append(el("h3", (data.group_by === "step" ? "step " : "") + fmt(key)));
    $("records").append(groupBox);
  }
  const passed = r.passed !== undefined ? r.passed : null;
  const card = el("div", null, "rec" + (passed === false ? " bad" : passed === true ? " good" : ""));
  const head = el("div", null, "head");
  head.append(el("span", "reward " + fmt(r.reward), "reward"));
  for (const f of ["split", "task_id", "group", "sample", "advantage", "policy_version", "staleness", "finish_reason", "completion_tokens", "turns", "tool_calls"]) {
    if (r[f] !== undefined && r[f] !== null && !(f === data.group_by)) head.append(el("span", f + " " + fmt(r[f])));
  }
  card.append(head);
  const body = el("div", null, "body"), left = el("div"), right = el("div");
  if (r.prompt !== undefined) left.append(el("div", "prompt", "label"), el("pre", asText(r.prompt)));
  if (r.answer !== undefined && r.answer !== null && r.answer !== "") left.append(el("div", "reference answer", "label"), el("pre", asText(r.answer)));
  if (r.transcript && typeof r.transcript !== "string") {
    right.append(el("div", "turns", "label"));
    for (const t of r.transcript) right.append(el("pre", t.role + ": " + t.text));
  } else {
    right.append(el("div", "completion", "label"), el("pre", asText(r.completion)));
    if (typeof r.transcript === "string") right.append(el("div", "transcript", "label"), el("pre", r.transcript));
  }
  body.append(left, right); card.append(body);
  if (r.reward_parts && Object.keys(r.reward_parts).length) card.append(el("div", "reward parts: " + JSON.stringify(r.reward_parts), "label"));
  if (r.info !== undefined) { const d = el("details"); d.append(el("summary", "verifier info"), el("pre", JSON.stringify(r.info, null, 1))); card.append(d); }
  groupBox.append(card);
  cards.push({card: card, group: groupBox, r: r, text: (asText(r.prompt) + "\n" + asText(r.completion) + "\n" + asText(r.transcript || "") + "\n" + JSON.stringify(r.info || {}) + "\n" + (r.task_id || "")).toLowerCase()});
}
function num(id) { const v = $(id).value.trim(); return v === "" ? null : Number(v); }
function apply() {
  const q = $("search").value.trim().toLowerCase(), lo = num("min-reward"), hi = num("max-reward");
  const split = $("split").value, failed = $("failed").checked;
  let shown = 0; const visibleGroups = new Set();
  for (const c of cards) {
    const reward = typeof c.r.reward === "number" ? c.r.reward : NaN;
    const ok = (!q || c.text.includes(q)) && (lo === null || reward >= lo) && (hi === null || reward <= hi)
      && (!split || c.r.split === split) && (!failed || c.r.passed === false);
    c.card.hidden = !ok; if (ok) { shown++; visibleGroups.add(c.group); }
  }
  for (const c of cards) c.group.hidden = !visibleGroups.has(c.group);
  $("shown").textContent = shown + " of " + cards.length + " shown";
}
for (const id of ["search", "min-reward", "max-reward", "split", "failed"]) { $(id).addEventListener("input", apply); $(id).addEventListener("change", apply); }
if (!cards.length) $("records").append(el("p", data.kind === "run" ? "No sampled episodes: the run wrote no rollouts.jsonl (rollouts every 0 steps, or a run from before it existed)." : "No samples file beside the summary.", "muted"));
apply();
"""
