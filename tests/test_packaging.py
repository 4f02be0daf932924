"""The wheel installs one top-level package, ``llmgym``, and the layers import one way."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_has_llmgym_as_its_only_top_level_package(tmp_path):
    pytest.importorskip("setuptools")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("llmgym-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"llmgym"}, top
    # agents/ and envs/ travel inside it, data files included
    assert "llmgym/agents/grpo.py" in names and "llmgym/envs/code/verifier.py" in names
    assert "llmgym/agents/__init__.py" in names and "llmgym/envs/math/__init__.py" in names


def _imports(path: Path) -> set[str]:
    """Modules imported at module level (not under ``if TYPE_CHECKING`` or inside functions)."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _touches(mods: set[str], package: str) -> set[str]:
    return {m for m in mods if m == package or m.startswith(package + ".")}


@pytest.mark.parametrize("path", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "llmgym").rglob("*.py")))
def test_the_core_imports_neither_agents_nor_envs(path):
    if path.startswith("llmgym/cli"):
        pytest.skip("the command line is the one face above agents and envs")
    mods = _imports(ROOT / path)
    assert not (_touches(mods, "llmgym.agents") | _touches(mods, "llmgym.envs")), path


def test_agents_and_envs_never_import_each_other():
    for folder, other in (("agents", "llmgym.envs"), ("envs", "llmgym.agents")):
        for path in (ROOT / folder).rglob("*.py"):
            assert not _touches(_imports(path), other), path
            # the old top-level names are gone too
            assert not (_touches(_imports(path), "agents") | _touches(_imports(path), "envs")), path
