"""``llmgym report PATH``: a run directory or a ``bench`` summary as one self-contained HTML page.

The page (:func:`llmgym.train.report.write_report`) holds everything it shows — curves, settings, the
sampled episodes with their rewards and verifier info, searchable and filterable by reward; for a
benchmark, the per-task results and each failed sample — and needs no server and no network.

Example:
    >>> from llmgym.cli import main
    >>> main(["report", "/nonexistent/run"])
    2
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llmgym.cli.run_files import check_out_file
from llmgym.cli.usage import UsageError
from llmgym.runtime.display import make_console

__all__ = ["add_parser", "cmd_report"]


def add_parser(subparsers, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``report`` sub-command to ``subparsers``."""
    p = subparsers.add_parser(
        "report", help="one self-contained HTML page of a run or a benchmark (curves, config, sampled episodes)",
        description="Write one HTML file that needs no server and no network: a training run's curves, config "
                    "and sampled episodes (rollouts.jsonl) by step, searchable and filterable by reward; or a "
                    "benchmark's per-task results and failed samples (bench --out FILE.json).")
    p.add_argument("path", metavar="RUN_DIR|BENCH.json", help="a run directory (train, quickstart) or a bench summary")
    p.add_argument("--out", metavar="FILE.html",
                   help="where to write the page (default: RUN_DIR/report.html, or BENCH.report.html beside the summary)")
    p.set_defaults(handler=cmd_report)
    return p


def cmd_report(args: argparse.Namespace) -> int:
    """``llmgym report``."""
    from llmgym.train.report import ReportInputError, write_report

    out = check_out_file(args.out, example="report.html") if args.out else None
    try:
        page = write_report(Path(args.path).expanduser(), out)
    except ReportInputError as exc:
        raise UsageError(str(exc)) from None
    make_console().print(f"report: {page} (open it in a browser; it needs no server and no network)")
    return 0
