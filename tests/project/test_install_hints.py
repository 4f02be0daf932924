"""Every install hint installs this project: the distribution is llmgym-rl (``llmgym`` on PyPI is another
project), and every "pip install" hint with an extra comes from ``llmgym.runtime.install.install_hint``."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from llmgym.runtime import install
from llmgym.runtime.install import DISTRIBUTION, install_hint

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])
# the bare name with an extra: "llmgym" + "[math]" (spelled in two parts so this file does not match itself)
# not a path's last folder: a checkout cloned as ".../llmgym" is installed as "pip install -e '/home/me/llmgym[math]'"
BARE = re.compile(r"(?<![\w.\-/\\])" + "llmgym" + r"\\?\[[a-z][a-z0-9,-]*\\?\]")  # also written as a regex (a backslash before each bracket)
SCANNED = ["llmgym", "agents", "envs", "scripts", "benchmarks", "tests", "docs", "examples"]


def _text_files():
    yield ROOT / "README.md"
    yield ROOT / "pyproject.toml"
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in {".py", ".md", ".sh", ".toml", ".txt", ".cfg"} and path.is_file():
                yield path


def test_the_distribution_is_llmgym_rl_and_refers_to_itself_by_that_name():
    assert PYPROJECT["project"]["name"] == DISTRIBUTION == "llmgym-rl"
    assert PYPROJECT["project"]["scripts"] == {"llmgym": "llmgym.cli:main"}  # the command keeps its name
    self_refs = [r for deps in PYPROJECT["project"]["optional-dependencies"].values() for r in deps
                 if re.match(r"llmgym\b", r)]
    assert self_refs and all(r.startswith(f"{DISTRIBUTION}[") for r in self_refs), self_refs


def test_no_file_names_the_bare_llmgym_distribution_with_an_extra():
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:120]}" for p in _text_files()
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if BARE.search(line)]
    assert not found, "install hints must name llmgym-rl or install from the checkout:\n" + "\n".join(found)


def _hint_calls():
    for folder in ("llmgym", "agents", "envs"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "install_hint":
                    yield path, node


def test_the_bare_name_is_found_but_not_a_checkout_folder_named_llmgym():
    name = "llmgym"  # (in two parts above: this file must not match itself)
    assert BARE.search(f"pip install '{name}[math]'") and BARE.search(f"pip install {name}[math,code]")
    assert BARE.search(f"install {name}\\[math\\] first")
    for path in (f"/home/me/{name}", f"C:\\src\\{name}", f"./{name}", f"~/{name}"):
        assert not BARE.search(f"pip install -e '{path}[math]'"), path


def test_every_hint_names_an_extra_that_exists():
    calls = list(_hint_calls())
    assert len(calls) >= 15, "the hints moved away from install_hint"
    for path, node in calls:
        for arg in node.args:
            if isinstance(arg, ast.Constant):
                assert arg.value in EXTRAS, f"{path.relative_to(ROOT)}:{node.lineno}: no extra {arg.value!r}"


def test_no_hand_written_pip_install_of_an_extra_in_the_code():
    # a hint with an extra written out by hand would drift from install_hint: "pip install ... [extra]"
    pattern = re.compile(r"pip install[^\n\"']*['\"][^'\"]*\[[a-z]")
    found = [f"{p.relative_to(ROOT)}:{n}" for folder in ("llmgym", "agents", "envs")
             for p in sorted((ROOT / folder).rglob("*.py")) if p.name != "install.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found


def test_from_a_checkout_the_hint_installs_the_checkout(monkeypatch):
    assert install.source_checkout() == ROOT
    assert install_hint("math") == f"pip install -e '{ROOT}[math]'"
    assert install_hint("math", "code") == f"pip install -e '{ROOT}[math,code]'"


def test_from_a_wheel_the_hint_names_the_published_distribution(monkeypatch):
    monkeypatch.setattr(install, "source_checkout", lambda: None)
    assert install_hint("vllm") == "pip install 'llmgym-rl[vllm]'"
    assert install_hint() == "pip install 'llmgym-rl'"


def test_an_extras_name_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match="not an extra's name"):
        install_hint("math'; rm")


def test_a_missing_scorer_package_names_the_hint(monkeypatch):
    import importlib.util

    from llmgym.envs.math import math_verifier

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else real(name, *a))
    with pytest.raises(ModuleNotFoundError) as info:
        math_verifier._math_verify_installed()
    assert install_hint("math") in str(info.value) and not BARE.search(str(info.value))
