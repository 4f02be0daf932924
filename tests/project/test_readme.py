"""The README is the product page: short, its Python snippets run as written, and it (with every guide under
docs/) carries no lab notes — no issue numbers, run dates or machine-load figures. Measured numbers with
their machine and date live in docs/benchmarks.md (generated) and history in CHANGELOG.md."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
MAX_README_LINES = 200
# the only pages that may carry dates, load figures and issue numbers
EXEMPT = {"docs/benchmarks.md", "CHANGELOG.md"}
LAB_NOTES = {
    "an issue number": re.compile(r"\b(?:issues?|PRs?|pull requests?)\s*#?\d+|(?<![\w/&#])#\d{1,4}\b", re.I),
    "a run date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    "a load figure": re.compile(r"\bload[ _-]?(?:average|avg)s?\b|\bloadavg\b|\bunder (?:a )?load\b"
                                r"|\bload (?:of )?\d|\b(?:heavy|light(?:er)?|busy) (?:load|machine)\b", re.I),
}


def test_readme_has_the_custom_loop_snippet():
    assert any("env.step" in s and "env.reset" in s for s in SNIPPETS)


def test_readme_is_a_product_page_of_at_most_200_lines():
    assert len(README.read_text().splitlines()) <= MAX_README_LINES


def _pages():
    yield README
    yield from (p for p in sorted((ROOT / "docs").glob("*.md")) if p.relative_to(ROOT).as_posix() not in EXEMPT)


@pytest.mark.parametrize("page", [p.relative_to(ROOT).as_posix() for p in _pages()])
def test_no_lab_notes_in_the_readme_or_the_guides(page):
    found = [f"{page}:{n}: {what}: {m.group(0)!r}" for n, line in enumerate((ROOT / page).read_text().splitlines(), 1)
             for what, pattern in LAB_NOTES.items() for m in pattern.finditer(line)]
    assert not found, ("measured numbers with machine and date go to benchmarks/results/ (docs/benchmarks.md), "
                       "history to CHANGELOG.md:\n" + "\n".join(found))


def test_the_lab_note_patterns_catch_what_they_are_for():
    caught = ["before issue 28's sampler", "(#12)", "on 2026-11-27", "under a load average of 6-8",
              "load 5", "loadavg 3.1", "on a busy machine"]
    kept = ["the load balancer", "docs/scale.md#a-fleet", "`llmgym list`", "load_model(path)", "2026 pages",
            "issue a request", "&#8203;"]
    hit = lambda s: any(p.search(s) for p in LAB_NOTES.values())  # noqa: E731
    assert all(hit(s) for s in caught), [s for s in caught if not hit(s)]
    assert not any(hit(s) for s in kept), [s for s in kept if hit(s)]


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index, capsys, tmp_path, monkeypatch):
    snippet = SNIPPETS[index]
    if "llmgym.train" in snippet and importlib.util.find_spec("llmgym.train") is None:
        pytest.skip("llmgym.train (the Trainer) is not in this tree")
    monkeypatch.chdir(tmp_path)  # a snippet that writes runs/ writes it here
    exec(compile(snippet, f"README.md snippet {index}", "exec"), {"__name__": "__readme__"})


@pytest.mark.parametrize("page", [p.relative_to(ROOT).as_posix() for p in (README, *sorted((ROOT / "docs").glob("*.md")))])
def test_every_relative_link_names_a_file_that_exists(page):
    path = ROOT / page
    links = re.findall(r"\]\(([^)\s]+)\)", path.read_text())
    missing = [link for link in links if not re.match(r"[a-z]+:|#", link)
               and not (path.parent / link.split("#", 1)[0]).exists()]
    assert not missing, f"{page} links to files that do not exist: {missing}"
