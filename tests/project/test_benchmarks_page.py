"""docs/benchmarks.md is generated from benchmarks/results/ (benchmarks/make_page.py): the committed page is what
the script writes, so a number changes there by changing the recorded data, never by hand."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _make_page():
    spec = importlib.util.spec_from_file_location("make_page", ROOT / "benchmarks" / "make_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_benchmarks_page_is_what_make_page_writes():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert page == _make_page().render(), "docs/benchmarks.md is stale: run python benchmarks/make_page.py"


def test_every_quoted_measurement_says_where_and_what():
    make_page = _make_page()
    machines = json.loads((ROOT / "benchmarks" / "results" / "machines.json").read_text())
    rows = make_page._read_jsonl(ROOT / "benchmarks" / "results" / "doc_measurements.jsonl")
    assert rows
    for row in rows:
        assert row["measured"] and row["topic"] and row["machine"] in machines, row
        assert (ROOT / row["page"]).exists() or row["page"] == "README.md", row


def test_a_measurement_on_an_unknown_machine_is_refused(tmp_path, monkeypatch):
    make_page = _make_page()
    (tmp_path / "machines.json").write_text('{"a": "machine a"}')
    (tmp_path / "doc_measurements.jsonl").write_text('{"topic": "t", "measured": "1 s", "machine": "b", "page": "x"}\n')
    monkeypatch.setattr(make_page, "RESULTS", tmp_path)
    with pytest.raises(SystemExit, match="machines machines.json lacks: b"):
        make_page.render()


def test_check_mode_names_a_stale_page(tmp_path, monkeypatch, capsys):
    make_page = _make_page()
    monkeypatch.setattr(make_page, "PAGE", tmp_path / "benchmarks.md")
    monkeypatch.setattr(make_page, "ROOT", tmp_path)
    (tmp_path / "benchmarks.md").write_text("# hand-edited\n")
    assert make_page.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert make_page.main([]) == 0 and make_page.main(["--check"]) == 0
