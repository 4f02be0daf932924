"""The captured command output in docs/cli.md is what the commands print today (scripts/capture_docs.py
regenerates it): a changed help text, a new env or a reworded error makes this fail until the page is
re-captured. Only the fast blocks run here (help, list, usage errors: about 15 s)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _capture():
    spec = importlib.util.spec_from_file_location("capture_docs", ROOT / "scripts" / "capture_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("capture_docs", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


_CHECK = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("capture_docs", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["capture_docs"] = module
spec.loader.exec_module(module)
found = module.capture(module.PAGES)
print(json.dumps({"commands": [b.command for entries in found.values() for b, _ in entries],
                  "stale": module.stale(found)}))
"""


def test_the_captured_blocks_are_fresh():
    """Captured in a fresh process, as a user runs the commands: inside the suite's worker, envs other tests
    registered would show up in ``llmgym list``."""
    import json
    import subprocess

    proc = subprocess.run([sys.executable, "-c", _CHECK, str(ROOT / "scripts" / "capture_docs.py")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    commands = result["commands"]
    assert "llmgym --help" in commands and "llmgym list" in commands and len(commands) >= 10
    stale = result["stale"]
    assert not stale, "stale captured output; run python scripts/capture_docs.py:\n" + "\n".join(stale)


def test_a_changed_output_is_caught(tmp_path):
    capture = _capture()
    page = capture.ROOT / "docs" / "_capture_test.md"  # under the checkout: stale() names pages from it
    page.write_text("<!-- capture: llmgym --help -->\n```\n$ llmgym --help\nan old help text\n[exit code 0]\n```\n"
                    "<!-- /capture -->\n")
    found = capture.capture([page])
    assert len(capture.stale(found)) == 1
    capture.write(found)
    try:
        assert "serve" in page.read_text() and capture.stale(capture.capture([page])) == []
    finally:
        page.unlink()


def test_every_captured_command_is_an_llmgym_command():
    capture = _capture()
    for page in capture.PAGES:
        for block in capture.blocks(page):
            assert block.command.startswith("llmgym ") and block.body.startswith(f"$ {block.command}\n"), block.command
