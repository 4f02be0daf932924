"""LoRA adapter sync vs full-weight sync into vLLM (in process, or through a fleet): seconds and bytes per update.

For each model shape, in one run:

* **full weights**: a ``VLLMEngine`` without LoRA; ``sync_weights(model)`` = vLLM's ``reload_weights`` of the
  whole state dict (what ``--engine vllm`` does after every update without ``--lora-r``);
* **adapter**: a ``VLLMEngine(lora_rank=R)``; ``sync_weights(peft_model)`` hands vLLM's worker the adapter's
  A and B matrices as a new adapter version (what ``--engine vllm --lora-r R`` does).

Each sync is timed ``--syncs`` times (median reported, all kept); the adapters are perturbed between syncs so
every sync carries new values. Bytes are the tensors handed over (``engine.last_sync_bytes``).

``--fleet``: the same two syncs through a ``FleetEngine`` over **one** ``llmgym serve --lora-r R`` server on
127.0.0.1 (started by ``tests/served.py``'s ``RolloutServers``, as ``benchmarks/fleet_speed.py`` does; its worker
bound to core 0). Full weights = the whole gloo broadcast of the state dict + vLLM's reload + the probe; adapter
(after the base has gone once, untimed) = the adapter's tensors over gloo + ``/v1/load_lora_adapter`` + the
probe under the adapter. One engine, round-robin: each round times one full-weight sync, then one adapter sync,
so a load change on a shared machine hits both alike. Bytes are what the gloo broadcast carried to the server,
counted at the sender.

    python benchmarks/lora_sync.py --json benchmarks/results/lora_sync_cpu.json
    python benchmarks/lora_sync.py --shapes tiny --syncs 3          # a smoke run
    python benchmarks/lora_sync.py --fleet --shapes tiny,10m --json benchmarks/results/lora_sync_fleet_cpu.json

Shapes: ``tiny`` (hidden 64, 2 layers), ``10m`` and ``qwen2-0.5b`` as in ``benchmarks/engine_speed.py``.
The load average before and after each shape is in the output.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from engine_speed import load_average, shape_model  # noqa: E402


def _timed(engine, model, syncs: int, perturb=None) -> list[float]:
    times = []
    for i in range(syncs):
        if perturb is not None:
            perturb(i)
        started = time.perf_counter()
        engine.sync_weights(model)
        times.append(round(time.perf_counter() - started, 4))
    return times


def _with_lora(model, rank: int):
    """A peft-injected copy of ``model`` (all-linear LoRA r ``rank``): its inner model and ``perturb(i)``, which
    gives the adapters new values (seeded by ``i``) so every sync carries new tensors."""
    import peft
    import torch

    lora_model = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=rank, lora_alpha=2 * rank,
                                                                            target_modules="all-linear"))
    inner = lora_model.base_model.model
    adapters = [p for n, p in inner.named_parameters() if "lora_B" in n]

    def perturb(i: int) -> None:
        with torch.no_grad():
            for p in adapters:
                p.normal_(0, 0.01, generator=torch.Generator().manual_seed(i))

    return inner, perturb


def _summary(shape: str, model, rows: list[dict], **settings) -> dict:
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    full_row, lora_row = rows
    return {"shape": shape, "parameters": sum(p.numel() for p in model.parameters()),
            "state_dict_mib": round(state_bytes / 2**20, 2), **settings, "cores": os.cpu_count(), "rows": rows,
            "adapter_vs_full_bytes": round(lora_row["bytes_per_sync"] / full_row["bytes_per_sync"], 5),
            "adapter_vs_full_time": round(lora_row["sync_s"] / full_row["sync_s"], 3)}


def run_fleet_shape(shape: str, *, rank: int, syncs: int, threads: int) -> dict:
    """Full-weight vs adapter ``FleetEngine.sync_weights`` through one ``llmgym serve --lora-r rank`` server,
    round-robin in one engine (see the module's docstring)."""
    import shutil
    import tempfile

    import torch

    sys.path.insert(0, str(ROOT / "tests"))  # tests/served.py starts the servers
    from served import RolloutServers

    from llmgym.fleet.fleet_engine import FleetEngine
    from llmgym.runtime.models import save_pretrained

    torch.set_num_threads(threads)
    model, tok = shape_model(shape)
    inner, perturb = _with_lora(model, rank)
    scratch = Path(tempfile.mkdtemp(prefix="llmgym-lora-fleet-bench-"))  # the model the server loads
    try:
        servers = RolloutServers(save_pretrained(model, tok, scratch / shape), 1, kv_cache_bytes=128 << 20,
                                 lora_r=rank)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    try:
        urls = servers.urls()
        load_before = load_average()
        full, adapter, full_bytes, adapter_bytes = [], [], set(), set()
        with FleetEngine(urls, tok, model, secret=servers.secret) as engine:  # connects, pushes version 0
            perturb(syncs)
            engine.sync_weights(inner)  # untimed: the adapter's first sync (the base went at connect)
            for i in range(syncs):
                full += _timed(engine, model, 1)
                full_bytes.add(engine.last_sync_bytes)
                adapter += _timed(engine, inner, 1, lambda _: perturb(i))
                adapter_bytes.add(engine.last_sync_bytes)
        load_after = load_average()
    finally:
        servers.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    if len(full_bytes) != 1 or len(adapter_bytes) != 1:
        raise RuntimeError(f"bytes per sync varied: full {sorted(full_bytes)}, adapter {sorted(adapter_bytes)}")
    rows = [{"variant": "full weights", "sync_s": statistics.median(full), "sync_s_all": full,
             "bytes_per_sync": full_bytes.pop()},
            {"variant": f"LoRA adapter (r {rank})", "sync_s": statistics.median(adapter), "sync_s_all": adapter,
             "bytes_per_sync": adapter_bytes.pop()}]
    return _summary(shape, model, rows, engine="FleetEngine, 1 llmgym serve server", lora_rank=rank, syncs=syncs,
                    threads=threads, order="round-robin (full, adapter) per round, one engine",
                    load_before=load_before, load_after=load_after)


def run_shape(shape: str, *, rank: int, syncs: int, threads: int) -> dict:
    import torch

    from llmgym.engines.vllm import VLLMEngine

    torch.set_num_threads(threads)
    model, tok = shape_model(shape)
    load_before = load_average()
    rows = []
    with VLLMEngine(model, tok, dtype="float32", kv_cache_memory_bytes=128 << 20) as engine:
        full = _timed(engine, model, syncs)
        rows.append({"variant": "full weights", "sync_s": statistics.median(full), "sync_s_all": full,
                     "bytes_per_sync": engine.last_sync_bytes})
    inner, perturb = _with_lora(model, rank)
    with VLLMEngine(inner, tok, dtype="float32", kv_cache_memory_bytes=128 << 20, lora_rank=rank) as engine:
        adapter = _timed(engine, inner, syncs, perturb)
        rows.append({"variant": f"LoRA adapter (r {rank})", "sync_s": statistics.median(adapter),
                     "sync_s_all": adapter, "bytes_per_sync": engine.last_sync_bytes})
    return _summary(shape, model, rows, lora_rank=rank, syncs=syncs, threads=threads, load_before=load_before,
                    load_after=load_average())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="10m,qwen2-0.5b", help="comma-separated: tiny, 10m, qwen2-0.5b")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--syncs", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--fleet", action="store_true",
                   help="through a FleetEngine over one llmgym serve --lora-r server instead of vLLM in process")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    results = []
    for shape in a.shapes.split(","):
        result = (run_fleet_shape if a.fleet else run_shape)(shape, rank=a.rank, syncs=a.syncs, threads=a.threads)
        results.append(result)
        for row in result["rows"]:
            print(f"{shape:>11}  {row['variant']:<20} {row['sync_s']:8.4f} s  {row['bytes_per_sync'] / 2**20:10.3f} MiB")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
