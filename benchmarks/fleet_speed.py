"""Rollout servers vs vLLM in process, side by side: weight-sync cost and rollout throughput.

Three ways to sample the same model, timed in one run (round-robin: each repeat runs every variant
once, so a load change on a shared machine hits them alike):

* ``VLLMEngine`` — vLLM in the learner's process; ``sync_weights`` = vLLM's ``reload_weights`` on the
  learner's own tensors (no copy over a wire);
* ``FleetEngine`` over **1** ``llmgym serve`` server on 127.0.0.1;
* ``FleetEngine`` over **2** servers (rows spread over both).

A fleet's ``sync_weights`` is the whole round trip: pause, the gloo broadcast of the state dict,
vLLM's layerwise reload, the version, resume — on every server at once. Throughput is tokens
sampled per wall second for one ``generate`` call of ``--batch`` prompts (16 random tokens each,
one completion each, ``--new-tokens`` at most; the same seeds for every variant, so equal work).

On a CPU each server's worker is bound to its own core (``VLLM_CPU_OMP_THREADS_BIND``: server *i* on
core *i* mod the core count) and the learner runs torch on ``--threads`` threads, so on a 2-core
machine "2 servers" uses both cores for sampling while "in process" uses the learner's thread(s).

    python benchmarks/fleet_speed.py                        # tiny and 10m shapes, 3 repeats
    python benchmarks/fleet_speed.py --shapes 10m --json benchmarks/results/fleet_speed_cpu.json
    python benchmarks/fleet_speed.py --quick                # a smoke run (tiny shape, one repeat)

Shapes: ``tiny`` = the vLLM tests' tiny Llama (hidden 64, 2 layers, head size 32; 0.1M parameters,
llmgym's tokenizer), ``10m`` = ``benchmarks/engine_speed.py``'s Llama 10M (head size 64). The load
average before and after each shape is in the output.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests/served.py starts the servers
sys.path.insert(0, str(ROOT / "benchmarks"))  # engine_speed's shapes

from engine_speed import load_average, shape_model  # noqa: E402


def _tokens_per_s(engine, prompts, new_tokens: int, seed: int) -> float:
    from llmgym.engines import SamplingParams

    started = time.perf_counter()
    groups = engine.generate(prompts, SamplingParams(max_new_tokens=new_tokens, seed=seed))
    seconds = time.perf_counter() - started
    return sum(len(c.token_ids) for g in groups for c in g) / seconds


def _sync_s(engine, model, syncs: int) -> float:
    times = []
    for _ in range(syncs):
        started = time.perf_counter()
        engine.sync_weights(model)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def run_shape(shape: str, *, batch: int, new_tokens: int, repeats: int, syncs: int, threads: int) -> dict:
    import torch

    from served import RolloutServers

    from llmgym.fleet.fleet_engine import FleetEngine
    from llmgym.engines.vllm import VLLMEngine
    from llmgym.runtime.models import save_pretrained

    torch.set_num_threads(threads)
    model, tok = shape_model(shape)
    load_before = load_average()
    params = sum(p.numel() for p in model.parameters())
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    scratch = Path(tempfile.mkdtemp(prefix="llmgym-fleet-bench-"))  # the model the servers load; removed after
    directory = save_pretrained(model, tok, scratch / shape)
    servers = RolloutServers(directory, 2, kv_cache_bytes=256 << 20)
    try:
        in_process = VLLMEngine(model, tok, dtype="float32", kv_cache_memory_bytes=256 << 20)  # while they start
        urls = servers.urls()
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(3, tok.vocab_size if hasattr(tok, "vocab_size") else 500, (16,), generator=g).tolist()
                   for _ in range(batch)]
        variants = {"VLLMEngine (in process)": None, "FleetEngine, 1 server": urls[:1], "FleetEngine, 2 servers": urls}
        speed = {name: [] for name in variants}
        sync = {name: [] for name in variants}
        connect = {name: [] for name in variants}
        for r in range(repeats):
            for name, fleet_urls in variants.items():
                if fleet_urls is None:
                    engine = in_process
                else:
                    started = time.perf_counter()
                    engine = FleetEngine(fleet_urls, tok, model, secret=servers.secret)  # connects, pushes version 0
                    connect[name].append(time.perf_counter() - started)
                try:
                    _tokens_per_s(engine, prompts[:8], 4, seed=10_000 + r)  # warm-up (the first request is slow)
                    speed[name].append(_tokens_per_s(engine, prompts, new_tokens, seed=r))
                    sync[name].append(_sync_s(engine, model, syncs))
                finally:
                    if fleet_urls is not None:
                        engine.close()
        in_process.close()
    finally:
        servers.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    rows = []
    base = statistics.median(speed["VLLMEngine (in process)"])
    for name in variants:
        rows.append({"variant": name, "tokens_per_s": round(statistics.median(speed[name]), 1),
                     "tokens_per_s_all": [round(x, 1) for x in speed[name]],
                     "vs_in_process": round(statistics.median(speed[name]) / base, 2),
                     "sync_s": round(statistics.median(sync[name]), 4),
                     "sync_s_all": [round(x, 4) for x in sync[name]],
                     "connect_s": round(statistics.median(connect[name]), 2) if connect[name] else None})
    return {"shape": shape, "parameters": params, "state_dict_mib": round(state_bytes / 2**20, 2), "batch": batch,
            "new_tokens": new_tokens, "repeats": repeats, "syncs_per_repeat": syncs, "threads": threads,
            "cores": os.cpu_count(), "load_before": load_before, "load_after": load_average(), "rows": rows}


def markdown(results: list[dict]) -> str:
    lines = ["| shape | variant | tokens/s (× in process) | `sync_weights` median s | connect s |", "|---|---|---|---|---|"]
    for res in results:
        for row in res["rows"]:
            connect = "—" if row["connect_s"] is None else f"{row['connect_s']:.2f}"
            lines.append(f"| {res['shape']} ({res['parameters'] / 1e6:.1f}M, {res['state_dict_mib']} MiB) | "
                         f"{row['variant']} | {row['tokens_per_s']:,.0f} ({row['vs_in_process']:.2f}×) | "
                         f"{row['sync_s']:.3f} | {connect} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="tiny,10m", help="comma-separated: tiny, 10m (default both)")
    p.add_argument("--batch", type=int, default=64, help="prompts per generate call (default 64)")
    p.add_argument("--new-tokens", type=int, default=32, help="new tokens per completion (default 32)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--syncs", type=int, default=5, help="sync_weights calls timed per repeat (median)")
    p.add_argument("--threads", type=int, default=1, help="the learner's torch threads (in-process vLLM too)")
    p.add_argument("--quick", action="store_true", help="tiny shape, batch 16, one repeat")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    a = p.parse_args(argv)
    shapes = ["tiny"] if a.quick else [s.strip() for s in a.shapes.split(",") if s.strip()]
    if any(s not in ("tiny", "10m") for s in shapes):
        p.error(f"--shapes: give tiny and/or 10m, got {a.shapes!r}")
    results = []
    for shape in shapes:
        res = run_shape(shape, batch=16 if a.quick else a.batch, new_tokens=a.new_tokens,
                        repeats=1 if a.quick else a.repeats, syncs=2 if a.quick else a.syncs, threads=a.threads)
        results.append(res)
        print(json.dumps(res), flush=True)
    print(markdown(results))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
