"""The wheel installs one top-level package, ``llmgym``, and the layers import one way."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_has_llmgym_as_its_only_top_level_package(tmp_path):
    pytest.importorskip("setuptools")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("llmgym_rl-*.whl")  # the distribution llmgym-rl
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"llmgym"}, top
    # agents/ and envs/ travel inside it, data files included
    assert "llmgym/agents/grpo.py" in names and "llmgym/envs/code/code_verifier.py" in names
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


def _engine_imports(path: Path) -> dict[str, set[str]]:
    """``{llmgym.engines module: names imported from it}`` for every import in ``path``, at module
    level or inside functions (a lazy import is still a dependency), relative imports resolved."""
    tree = ast.parse(path.read_text())
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("llmgym.engines."):
                    out.setdefault(alias.name, set())
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = "llmgym.engines" + ("." + module if module else "")
            if module == "llmgym.engines":  # `from llmgym.engines import x`: x may be a submodule
                for alias in node.names:
                    if (ENGINES / f"{alias.name}.py").is_file():
                        out.setdefault(f"llmgym.engines.{alias.name}", set())
                    else:
                        out.setdefault(module, set()).add(alias.name)
            elif module.startswith("llmgym.engines."):
                out.setdefault(module, set()).update(a.name for a in node.names)
    return out


ENGINES = ROOT / "llmgym" / "engines"


def test_the_engines_package_imports_one_way():
    """Inside ``llmgym/engines/`` the modules form a layering, with no cycle (lazy imports in functions
    count) and no private name crossing a module boundary; a module never reaches back into the
    package's ``__init__`` (which imports them all)."""
    modules = {f"llmgym.engines.{p.stem}": p for p in ENGINES.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imports = _engine_imports(path)
        assert "llmgym.engines" not in imports, f"{name} imports from the package __init__: import the module itself"
        private = sorted(f"{target}.{n}" for target, names in imports.items() for n in names if n.startswith("_"))
        assert not private, f"{name} imports private names from another module: {private}"
        graph[name] = {target for target in imports if target in modules and target != name}
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> None:
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", "import cycle in llmgym/engines: " + " -> ".join(trail + [node])
        state[node] = "open"
        for target in sorted(graph[node]):
            visit(target, trail + [node])
        state[node] = "done"
        order.append(node)

    for name in sorted(graph):
        visit(name, [])
    # the layering the package documents: contracts and helpers below the engines built on them
    below = {"llmgym.engines.base": ["llmgym.engines.session", "llmgym.engines.hf"],
             "llmgym.engines.session": ["llmgym.engines.hf"]}
    for low, highs in below.items():
        for high in highs:
            assert order.index(low) < order.index(high), f"{low} must not depend on {high}"


TEST_FILES = sorted((ROOT / "tests").rglob("test_*.py"))


def test_test_files_are_in_folders_by_subsystem_under_unique_names():
    """The tables of tests/conftest.py and ``benchmarks/learning_spread.py`` name test files by file name, and
    pytest imports each as a top-level module: a second file of the same name would be another module."""
    names = [p.name for p in TEST_FILES]
    assert len(names) > 50 and len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)
    loose = [p.name for p in TEST_FILES if p.parent == ROOT / "tests"]
    assert loose == [], f"{loose}: put each test file in the folder of its subsystem (docs/concepts.md, 'The source layout')"


def test_the_slow_table_names_real_tests_and_holds_every_learning_test():
    """``pytest -m "not slow"`` is the inner loop: every learning test module is in the table, and
    every test it names exists (a renamed test would silently join the fast loop)."""
    from conftest import SLOW_TESTS, SLOWEST_FILES_FIRST

    files = {p.name: p for p in TEST_FILES}
    learning = {name for name in files if "learning" in name and name != "test_learning_spread.py"}
    assert learning and all(SLOW_TESTS.get(name) == "*" for name in learning), learning
    assert set(SLOWEST_FILES_FIRST) <= set(files), set(SLOWEST_FILES_FIRST) - set(files)
    for name, entry in SLOW_TESTS.items():
        path = files.get(name)
        assert path is not None, name
        if entry != "*":
            defined = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
            assert set(entry) <= defined, (name, set(entry) - defined)


def _private_imports(path: Path) -> list[str]:
    """``from <project module> import _name`` and imports of a project module whose name is private."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("llmgym")):
            found += [f"from {'.' * node.level}{node.module or ''} import {a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
            found += [f"from {node.module} ..." for part in (node.module or "").split(".")
                      if part.startswith("_") and not part.startswith("__")]
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.startswith("llmgym") and any(
                p.startswith("_") and not p.startswith("__") for p in a.name.split("."))]
    return found


@pytest.mark.parametrize("folder", ["llmgym", "agents", "envs"])
def test_no_private_name_is_imported_across_modules(folder):
    """A name another module needs is public (in the API, documented); ``_names`` stay in their module."""
    crossing = {str(p.relative_to(ROOT)): hits for p in sorted((ROOT / folder).rglob("*.py"))
                if (hits := _private_imports(p))}
    assert crossing == {}


# the core's subpackages by concept, lowest first: a package imports only packages of a lower layer
LAYERS = {"sandbox": 0, "runtime": 0, "env": 1, "engines": 2, "tools": 2, "rollout": 3, "fleet": 3, "rlhf": 3, "interop": 4,
          "train": 4,
          "cli": 9}


def _all_imports(path: Path) -> set[str]:
    """Every absolute module imported anywhere in ``path`` (inside functions too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_subpackages_import_only_lower_layers(package):
    assert (ROOT / "llmgym" / package / "__init__.py").exists()
    upward = set()
    for path in (ROOT / "llmgym" / package).rglob("*.py"):
        for module in _all_imports(path):
            parts = module.split(".")
            if parts[0] == "llmgym" and len(parts) > 1 and parts[1] in LAYERS and parts[1] != package:
                if LAYERS[parts[1]] >= LAYERS[package]:
                    upward.add(f"{path.relative_to(ROOT)} imports {module}")
    assert upward == set()


def test_the_core_has_at_most_four_loose_modules():
    loose = sorted(p.name for p in (ROOT / "llmgym").glob("*.py"))
    assert len(loose) <= 4, loose
