"""``benchmarks/learning_spread.py``: each kernel family reaches torch in a fresh process, recorded runs
resume (and are redone when the code they ran changes), the table counts every run, and a family the
CPU cannot execute is refused before anything runs."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

STUB = '''
"""A recipe whose rows report what its process ran with."""
import os

import torch


def spread(seed):
    yield {"check": "stub", "value": float(seed), "bound": -1.0, "capability": torch.backends.cpu.get_cpu_capability(),
           "mkl_cbwr": os.environ.get("MKL_CBWR"), "torch_threads": torch.get_num_threads()}
'''


@pytest.fixture(scope="module")
def spread():
    spec = importlib.util.spec_from_file_location("learning_spread", ROOT / "benchmarks" / "learning_spread.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_test_module_with_a_spread_is_a_recipe_and_back(spread):
    with_spread = {p.stem for p in (ROOT / "tests").rglob("test_*.py") if "\ndef spread(seed: int)" in p.read_text()}
    assert with_spread == set(spread.RECIPES.values())


def test_a_worker_finds_each_recipe_module_and_helper_in_the_folders_of_tests():
    """The workers import a recipe by module name, from the folders learning_spread.py puts on sys.path (a fresh
    process: none of pytest's), and digest the files it names."""
    probe = ("import importlib.util, sys; sys.path.insert(0, 'benchmarks'); import learning_spread as s\n"
             "print([m for m in s.RECIPES.values() if importlib.util.find_spec(m) is None])\n"
             "print([n for r in s.RECIPES for n in s.RECIPE_HELPERS.get(r, ()) if not s._in_tests(n).is_file()])")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == ["[]", "[]"], proc.stdout


@pytest.fixture
def stub_recipe(spread, tmp_path, monkeypatch):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text("")
    (tests / "stub_recipe.py").write_text(STUB)
    monkeypatch.setattr(spread, "TESTS", tests)
    monkeypatch.setitem(spread.RECIPES, "stub", "stub_recipe")
    monkeypatch.setenv("PYTHONPATH", str(tests))  # where the workers import it from
    return tests / "stub_recipe.py"


def sweep(spread, out: Path, **kw) -> None:
    args = dict(recipes=["stub"], families=["default", "avx2"], threads=[1, 2], seeds=[0], out=str(out), nice=0)
    spread.sweep(argparse.Namespace(**{**args, **kw}))


def test_each_family_and_thread_count_runs_in_a_fresh_process_and_the_sweep_resumes(spread, stub_recipe, tmp_path,
                                                                                   monkeypatch, capsys):
    if "avx2" not in spread.supported_families():
        pytest.skip("this CPU has no AVX2")  # the default family alone is checked by the other tests
    out = tmp_path / "spread.jsonl"
    settings = [dict(families=["default"], threads=[1]), dict(families=["avx2"], threads=[2])]
    for kw in settings:
        sweep(spread, out, **kw)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    checks = {(r["family"], r["threads"]): r for r in rows if r["kind"] == "check"}
    assert {key: (r["capability"], r["mkl_cbwr"], r["torch_threads"]) for key, r in checks.items()} == {
        ("default", 1): ("DEFAULT", "COMPATIBLE", 1), ("avx2", 2): ("AVX2", "AVX2", 2)}
    assert sum(r["kind"] == "done" for r in rows) == 2

    def no_run(*args):
        raise AssertionError("a recorded run was run again")

    with monkeypatch.context() as m:  # resumed: nothing to do; a docstring edit is not a code change
        m.setattr(spread, "run_one", no_run)
        stub_recipe.write_text(STUB.replace("what its process ran with", "the family and threads it saw"))
        for kw in settings:
            sweep(spread, out, **kw)
    assert capsys.readouterr().out.count("1 of 1 runs already") == 2
    stub_recipe.write_text(STUB.replace("float(seed)", "float(seed) + 1.0"))  # a code change: run again
    sweep(spread, out, **settings[0])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["value"] for r in rows if r["kind"] == "check"][-1] == 1.0
    text = spread.table(rows, {"stub": spread.code_id("stub")}, ["default", "avx2"])
    assert "| stub_recipe.py::stub | held-out gain > -1 | 1 |" in text  # only the run of the current code


def test_a_failing_run_is_reported_and_not_recorded(spread, stub_recipe, tmp_path, capsys):
    stub_recipe.write_text(STUB + "\nraise RuntimeError('the recipe is broken')\n")
    out = tmp_path / "spread.jsonl"
    sweep(spread, out, families=["default"], threads=[1])
    printed = capsys.readouterr().out
    assert "FAILED" in printed and "the recipe is broken" in printed
    assert not out.exists() or "done" not in out.read_text()


def test_the_table_shows_every_run_its_range_per_family_and_the_failures(spread):
    rows = [{"kind": "check", "recipe": "tools", "check": "test_x", "value": v, "bound": 0.05, "family": f,
             "threads": t, "seed": s, "code": "c"}
            for (f, t, s, v) in [("default", 1, 0, 0.04), ("default", 2, 0, 0.08), ("avx2", 1, 0, 0.2), ("avx2", 1, 1, 0.12)]]
    rows += [{"kind": "done", "recipe": "tools", "family": f, "threads": t, "seed": s, "code": "c", "load": [0.5, 1.5],
              "date": "2026-11-26", "commit": "abc"} for (f, t, s) in [("default", 1, 0), ("default", 2, 0), ("avx2", 1, 0)]]
    text = spread.table(rows, {"tools": "c"}, ["default", "avx2"])
    assert ("| test_learning_tools.py::test_x | held-out gain > 0.05 | 4 (1 fail) | +0.040 | +0.110 | +0.200 | 0.80 | "
            "+0.040..+0.080 | +0.120..+0.200 |") in text
    assert "load average 0.5–1.5" in text and "commit abc" in text
    assert spread.table(rows, {"tools": "other code"}, ["default"]).startswith("(no runs recorded")


def test_a_family_the_cpu_cannot_run_is_refused_in_one_line(spread, monkeypatch, capsys):
    monkeypatch.setattr(spread, "cpu_flags", lambda: {"fma", "avx2"})
    monkeypatch.setattr(sys, "argv", ["learning_spread.py", "--families", "avx512", "--table-only"])
    with pytest.raises(SystemExit) as exc:
        spread.main()
    assert exc.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "cannot run the avx512 kernels" in error and "illegal instruction" in error and "default, avx2" in error


def test_prose_does_not_change_a_code_digest_and_code_does(spread, tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""Doc."""\n\n\ndef f(x):\n    """Doc."""\n    return x + 1  # why\n')
    before = spread._source_digest(path)
    path.write_text('"""Other doc."""\n\n\ndef f(x):\n    """Other."""\n    # a comment\n    return x + 1\n')
    assert spread._source_digest(path) == before
    path.write_text('"""Doc."""\n\n\ndef f(x):\n    return x + 2\n')
    assert spread._source_digest(path) != before
