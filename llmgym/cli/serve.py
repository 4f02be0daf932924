"""``llmgym serve``: a rollout server — vLLM's OpenAI-compatible server that takes a learner's weights.

The same as ``python -m llmgym.fleet.serve`` (:mod:`llmgym.fleet.serve`): vLLM's own server, with
its weight-update routes on and llmgym's gloo weight transfer; a learner
samples from it and pushes every new policy into it with ``llmgym train --engine vllm-server
--server URL``. Options after ``--`` go to vLLM unchanged.

Example:
    >>> from llmgym.cli import main
    >>> main(["serve", "--model", "/no/such/dir"])
    2
"""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "cmd_serve"]


def add_parser(subparsers, common) -> None:
    from llmgym.fleet.serve import build_parser

    template = build_parser("llmgym serve")
    parser = subparsers.add_parser(
        "serve", parents=[template], add_help=False, conflict_handler="resolve",
        help="a rollout server (vLLM's OpenAI-compatible server) that takes a learner's weights",
        description=template.description, epilog=template.epilog)
    parser.add_argument("-h", "--help", action="help", help="show this help message and exit")
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """``llmgym serve``: runs the server until it is stopped (Ctrl-C or SIGTERM)."""
    from llmgym.fleet.serve import main

    argv = ["--model", args.model, "--host", args.host, "--port", str(args.port), "--dtype", args.dtype,
            "--seed", str(args.seed)]
    if args.served_model_name:
        argv += ["--served-model-name", args.served_model_name]
    if args.secret_file is not None:
        argv += ["--secret-file", args.secret_file]
    if args.kv_cache_memory_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(args.kv_cache_memory_bytes)]
    if args.lora_r:
        argv += ["--lora-r", str(args.lora_r), "--lora-versions", str(args.lora_versions)]
    extra = list(args.vllm_args or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    return main(argv + (["--", *extra] if extra else []), prog="llmgym serve")
