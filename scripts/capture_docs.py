"""Regenerate the captured command output in the docs (``docs/cli.md``).

A captured block sits between markers; the script runs its command and writes what it printed::

    <!-- capture: llmgym --help -->
    ```
    $ llmgym --help
    ...
    [exit code 0]
    ```
    <!-- /capture -->

``capture-slow:`` marks a command that takes long (loads a dataset, ...): it runs only with ``--slow``.
Commands run in process (``llmgym.cli.main``) in a scratch folder holding a few fixture files, with
``COLUMNS=100`` and ``HF_HUB_OFFLINE=1``, output piped as into a file.

    python scripts/capture_docs.py            # rewrite the fast blocks
    python scripts/capture_docs.py --slow     # ... and the slow ones
    python scripts/capture_docs.py --check    # exit 1 and name the stale blocks; write nothing

``tests/project/test_captured_docs.py`` runs the fast blocks and fails when the page is stale.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "docs" / "cli.md"]
BLOCK = re.compile(r"<!-- capture(?P<slow>-slow)?: (?P<command>.+?) -->\n```\n(?P<body>.*?)```\n<!-- /capture -->",
                   re.S)
ENVIRONMENT = {"COLUMNS": "100", "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
# what differs from machine to machine without the docs being stale: the installed adapters' versions
ADAPTER_STATUS = re.compile(r"^((?:verifiers|textarena):<[^>]+>) \(.*\)$", re.M)


@dataclass
class Block:
    page: Path
    command: str
    slow: bool
    body: str
    start: int
    end: int


def blocks(page: Path) -> Iterator[Block]:
    text = page.read_text()
    for m in BLOCK.finditer(text):
        yield Block(page, m["command"], bool(m["slow"]), m["body"], m.start(), m.end())


def _fixtures(folder: Path) -> None:
    """Files the documented mistakes refer to: a run directory, a file where a directory is wanted."""
    run = folder / "runs" / "quickstart"
    (run / "checkpoints" / "last").mkdir(parents=True)
    (run / "checkpoints" / "last" / "config.json").write_text("{}\n")
    (run / "eval.json").write_text("{}\n")


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    old_cwd, old_env = os.getcwd(), {k: os.environ.get(k) for k in ENVIRONMENT}
    with tempfile.TemporaryDirectory(prefix="llmgym-capture-") as tmp:
        try:
            os.chdir(tmp)
            os.environ.update(ENVIRONMENT)
            _fixtures(Path(tmp))
            yield Path(tmp)
        finally:
            os.chdir(old_cwd)
            for k, v in old_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def run(command: str) -> str:
    """``$ command``, what it printed (stdout, then stderr) and its exit code: the body of a block."""
    from llmgym.cli import main

    argv = shlex.split(command)
    if argv[:1] != ["llmgym"]:
        raise ValueError(f"a captured command starts with llmgym: {command!r}")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv[1:])
        except SystemExit as exc:  # --help
            code = exc.code if isinstance(exc.code, int) else 0
    printed = "\n".join(line.rstrip() for line in (out.getvalue() + err.getvalue()).splitlines())
    printed = printed.replace(str(ROOT), "<checkout>")
    return f"$ {command}\n{printed}\n[exit code {code}]\n"


def comparable(body: str) -> str:
    """``body`` without what may differ between machines whose docs are equally fresh."""
    return ADAPTER_STATUS.sub(r"\1 (installed or not)", body)


def capture(pages: list[Path], slow: bool = False) -> dict[Path, list[tuple[Block, str]]]:
    """``{page: [(block, fresh body)]}`` of every block (the slow ones only with ``slow``)."""
    found: dict[Path, list[tuple[Block, str]]] = {}
    with _scratch():
        for page in pages:
            found[page] = [(b, run(b.command)) for b in blocks(page) if slow or not b.slow]
    return found


def stale(found: dict[Path, list[tuple[Block, str]]]) -> list[str]:
    return [f"{b.page.relative_to(ROOT)}: {b.command}" for entries in found.values() for b, fresh in entries
            if comparable(fresh) != comparable(b.body)]


def write(found: dict[Path, list[tuple[Block, str]]]) -> None:
    for page, entries in found.items():
        text = page.read_text()
        for b, fresh in sorted(entries, key=lambda e: -e[0].start):  # from the end: offsets stay valid
            tag = "capture-slow" if b.slow else "capture"
            text = text[:b.start] + f"<!-- {tag}: {b.command} -->\n```\n{fresh}```\n<!-- /capture -->" + text[b.end:]
        page.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", action="store_true", help="also the blocks marked capture-slow")
    parser.add_argument("--check", action="store_true", help="name the stale blocks and exit 1; write nothing")
    args = parser.parse_args(argv)
    found = capture(PAGES, slow=args.slow)
    if args.check:
        names = stale(found)
        for name in names:
            print(f"stale: {name}", file=sys.stderr)
        return 1 if names else 0
    write(found)
    print(f"captured {sum(len(e) for e in found.values())} blocks", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
