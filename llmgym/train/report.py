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
import os
import tempfile
from pathlib import Path
from typing import Any

from llmgym.errors import LLMGymError
from llmgym.runtime.files import write_text_atomic

__all__ = ["MAX_RECORDS", "ReportInputError", "report_data", "write_report"]

MAX_RECORDS = 5000
"""Sampled episodes a page holds at most (the first ones, in file order); the page says how many it left out."""


class ReportInputError(LLMGymError, ValueError):
    """The path is neither a run directory nor a ``bench`` summary."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line) if line.strip() else None
            except ValueError:  # a line cut short by a killed run
                continue
            if isinstance(record, dict):
                out.append(record)
    return out


def _png_data_url(path: Path) -> str | None:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode() if path.is_file() else None


def report_data(path: str | os.PathLike) -> dict[str, Any]:
    """What the page of ``path`` shows, as plain data: ``kind`` (``"run"`` or ``"bench"``), ``title``,
    ``summary`` (label → value), ``config``, ``curves`` (a PNG ``data:`` URL or ``None``), ``records`` (the
    sampled episodes), ``group_by`` (the field records are grouped by), ``tasks`` (a benchmark's per-task
    results) and ``left_out`` (records beyond :data:`MAX_RECORDS`)."""
    from llmgym.runtime.logging import plot_curves, read_metrics
    from llmgym.train.rollouts import read_rollouts

    path = Path(path)
    if path.is_dir() and (path / "metrics.jsonl").is_file():
        rows = read_metrics(path / "metrics.jsonl")
        config = _read_json(path / "config.json") or {}
        curves = _png_data_url(path / "curves.png")
        if curves is None and rows:
            with tempfile.TemporaryDirectory() as tmp:
                curves = _png_data_url(plot_curves(rows, Path(tmp) / "curves.png"))
        records = read_rollouts(path)
        last = rows[-1] if rows else {}
        evals = [r for r in rows if isinstance(r.get("eval_reward"), (int, float))]
        summary = {"steps": last.get("step"), "reward (last step)": last.get("reward_mean"),
                   "held-out reward (last evaluation)": evals[-1]["eval_reward"] if evals else None,
                   "sampled completions": last.get("samples_total"),
                   "wall time (s)": sum(float(r.get("wall_s") or 0) for r in rows) if rows else None}
        title = f"{config.get('agent', 'run')} on {config.get('env', path.name)}"
        return {"kind": "run", "title": title, "source": str(path), "summary": summary, "config": config,
                "curves": curves, "records": records[:MAX_RECORDS], "left_out": max(0, len(records) - MAX_RECORDS),
                "group_by": "step", "tasks": []}
    if path.is_file() and path.suffix == ".json":
        summary_json = _read_json(path)
        if isinstance(summary_json, dict) and isinstance(summary_json.get("per_task"), list):
            samples = path.with_name(path.stem + ".samples.jsonl")
            records = _read_jsonl(samples)
            tasks = summary_json["per_task"]
            prompts = {t.get("id"): t.get("prompt") for t in tasks if isinstance(t, dict)}
            for r in records:  # the samples file leaves the prompt to the summary
                r.setdefault("prompt", prompts.get(r.get("task_id")))
            config = {k: v for k, v in summary_json.items() if k != "per_task"}
            keys = [k for k in summary_json if k.startswith("pass@")] + ["reward_mean", "reward_ci95", "tasks",
                                                                         "samples", "tokens_per_s", "wall_s"]
            summary = {k: summary_json.get(k) for k in keys if k in summary_json}
            return {"kind": "bench", "title": f"bench: {summary_json.get('env', path.stem)}", "source": str(path),
                    "summary": summary, "config": config, "curves": None, "records": records[:MAX_RECORDS],
                    "left_out": max(0, len(records) - MAX_RECORDS), "group_by": "task_id", "tasks": tasks}
    raise ReportInputError(f"{str(path)!r} is neither a run directory (with metrics.jsonl) nor a bench summary "
                           f"(bench --out FILE.json): give one of those")


def write_report(path: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Write the page of the run directory or ``bench`` summary at ``path``; return where it went.

    ``out`` defaults to ``<run>/report.html`` for a run and ``FILE.report.html`` beside a benchmark's
    ``FILE.json``. The file is written whole (through a temporary file and a rename)."""
    from llmgym.runtime.logging import json_safe

    data = json_safe(report_data(path))  # NaN (a step without KL) becomes null
    source = Path(path)
    if out is None:
        out = source / "report.html" if data["kind"] == "run" else source.with_name(source.stem + ".report.html")
    out = Path(out)
    # JSON inside <script>: "<" escaped, so no text in it can end the element or open a comment
    payload = json.dumps(data, ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")
    title = data["title"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    page = _PAGE.replace("__TITLE__", title).replace("__STYLE__", _STYLE).replace("__SCRIPT__", _SCRIPT)
    page = page.replace("__DATA__", payload)
    write_text_atomic(out, page)
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
