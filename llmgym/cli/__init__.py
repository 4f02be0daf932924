"""The ``llmgym`` command line (also ``python -m llmgym``): one module per command.

Commands:

* ``llmgym quickstart`` (:mod:`llmgym.cli.quickstart`) — the main job on an embedded default: a tiny
  model, warmed up on the Copy toy task (cached), trained with GRPO on ``llmgym/Copy-v0`` on CPU; a
  before/after table of held-out reward and exact-match accuracy.
* ``llmgym train`` (:mod:`llmgym.cli.train`) — train any registered agent on any registered env;
  metrics JSONL, curves PNG, config JSON and checkpoints in one run directory; ``--resume`` continues
  an interrupted run exactly; Ctrl-C saves a checkpoint (never a half-updated mid-step state).
* ``llmgym bench`` (:mod:`llmgym.cli.bench`) — pass@1, pass@k, mean reward with a 95% confidence
  interval inside the reward's range, sampling tokens/s; per-sample records in JSONL.
* ``llmgym compare`` (:mod:`llmgym.cli.compare`) — several agents × seeds on one env: final reward,
  steps to a threshold, one plot.
* ``llmgym report`` (:mod:`llmgym.cli.report`) — one self-contained HTML page of a run (curves, config,
  sampled episodes by step) or of a ``bench`` output (per-task results, failures).
* ``llmgym rm`` (:mod:`llmgym.cli.rm`) — a Bradley–Terry reward model from preference pairs (JSONL);
  held-out pairwise accuracy; a directory ``RewardModelVerifier`` loads.
* ``llmgym serve`` (:mod:`llmgym.cli.serve`) — a rollout server: vLLM's OpenAI-compatible server that
  takes a learner's weights (``train --engine vllm-server --server URL``).
* ``llmgym list`` (:mod:`llmgym.cli.listing`) — registered envs and agents.

What the commands share, each in a module of public names: :mod:`llmgym.cli.common` (shared options:
``--set``, ``--device``, scale options, ``--import``), :mod:`llmgym.cli.usage` (the usage error, exit
codes), :mod:`llmgym.cli.console` (what they print), :mod:`llmgym.cli.resolve` (env, agent, model and engine
from their names), :mod:`llmgym.cli.run_files` (a run's directory), :mod:`llmgym.cli.engine_options`
(``--engine`` and its options) and :mod:`llmgym.cli.training` (:func:`train_run`: a run's names made into objects and
handed to the library's run loop, :class:`llmgym.train.Trainer`, which owns checkpoints, resume and
interrupts). A new command is a module with an
``add_parser(subparsers, common)`` function that sets ``handler``, listed in ``COMMANDS`` below.

``train``, ``compare`` and ``bench`` take ``--engine hf|vllm`` (``train`` and ``compare`` also
``vllm-server --server URL ...``, a fleet of rollout servers; ``bench`` also ``openai --base-url URL``)
and ``--engine-arg key=value``: who samples the rollouts (:func:`llmgym.cli.engine_options.check_engine`,
:func:`llmgym.cli.resolve.build_engine`).

Mistakes a user can make (unknown env or agent, missing model, missing optional package, bad or
out-of-range ``--set``/``--seed``/sampling setting, an env that cannot be made, an engine that is not
installed or cannot run the model) print one line on stderr and exit with code 2. The command line is the one part of the package that may import
``llmgym.agents`` and ``llmgym.envs``; it does so inside functions, so ``import llmgym`` stays light.

Example:
    >>> from llmgym.cli import main
    >>> main(["train", "--env", "llmgym/Nope-v0", "--agent", "grpo", "--out", "/tmp/x"])
    2
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence

from llmgym.cli import bench, compare, listing, quickstart, report, rm, serve, train
from llmgym.cli.common import check_spaced_pairs, import_user_modules, parse_overrides, plugin_options
from llmgym.cli.resolve import build_agent_config
from llmgym.cli.usage import EXIT_INTERRUPTED, EXIT_USAGE, UsageError, invoked_as
from llmgym.cli.quickstart import QUICKSTART_SETTINGS, quickstart_base_model
from llmgym.cli.training import RunSpec, train_run
from llmgym.train import TrainResult
from llmgym.runtime.threads import passive_openmp
from llmgym.runtime.files import RunFileError

__all__ = [
    "COMMANDS",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "QUICKSTART_SETTINGS",
    "RunSpec",
    "TrainResult",
    "UsageError",
    "build_agent_config",
    "build_parser",
    "main",
    "parse_overrides",
    "quickstart_base_model",
    "train_run",
]

COMMANDS = (quickstart, train, bench, compare, report, rm, serve, listing)
"""The command modules, in the order ``llmgym --help`` lists them; each has ``add_parser(subparsers, common)``."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``llmgym`` (one sub-command per module in :data:`COMMANDS`).

    Example:
        >>> from llmgym.cli import build_parser
        >>> build_parser().parse_args(["list", "--all"]).all
        True
    """
    from llmgym import __version__

    parser = argparse.ArgumentParser(
        prog="llmgym", description="Gymnasium-style RL for language models: train, benchmark and compare agents.",
        epilog="Start with `llmgym quickstart`; `llmgym list` shows envs and agents.")
    parser.add_argument("--version", action="version", version=f"llmgym {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False, parents=[plugin_options()])
    common.add_argument("--threads", type=int, metavar="N",
                        help="CPU threads for torch (default: $OMP_NUM_THREADS when set, else 1 for a model under "
                             "20M parameters on CPU, else torch's choice)")
    for command in COMMANDS:
        command.add_parser(subparsers, common)
    return parser



def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code (0 ok, 2 usage error, 130 interrupted)."""
    passive_openmp()  # before any command imports torch: OpenMP reads it once, when torch loads it
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        check_spaced_pairs(argv)
    except UsageError as exc:  # argparse would only say "unrecognized arguments: = 1e-4"
        print(f"llmgym: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or an argparse usage error (already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_USAGE
    threads = getattr(args, "threads", None)
    previous_threads = None
    try:
        import_user_modules(getattr(args, "imports", None) or [])  # before any command reads the registry
        if threads is not None and threads < 1:
            raise UsageError(f"--threads must be >= 1, got {threads}")
        if hasattr(args, "threads"):  # commands that run a model may change torch's threads: restore them after
            import torch

            previous_threads = torch.get_num_threads()
        return int(args.handler(args) or 0)
    except UsageError as exc:
        print(f"llmgym: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RunFileError as exc:  # a run folder's file that is a link (or not a regular file): never followed
        print(f"llmgym: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError) as exc:
        # a path that changed under a running command (its checks passed before the work began)
        print(f"llmgym: error: {exc.strerror or type(exc).__name__}: {exc.filename!r} "
              f"(check the paths given to --out, --model and --resume)", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        resume_dir = getattr(args, "resume_dir", None)
        with contextlib.suppress(OSError):  # stderr may be a closed pipe or a hung-up terminal too
            if resume_dir is not None and (resume_dir / "checkpoints" / "last" / "step.txt").is_file():
                again = getattr(args, "resume_imports", None) or []
                print(f"llmgym: interrupted; continue with: {invoked_as()} train --resume {resume_dir}"
                      f"{''.join(f' --import {name}' for name in again)}", file=sys.stderr)
            else:
                print("llmgym: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if previous_threads is not None:
            import torch

            torch.set_num_threads(previous_threads)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

