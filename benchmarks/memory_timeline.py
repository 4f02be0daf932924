"""Memory timeline of one GRPO step: what each phase holds, and what it peaks at.

One llmgym GRPO step (the batch of ``benchmarks/grpo_vs_trl.py``: same prompts, reward, β = 0) is cut
into phases at the points where the agent's own methods are entered and left:

``rollout`` (``agent.collect``: prefill, decoding, the engine's caches and CUDA-graph pools),
``prepare`` (the batch moved to the device, advantages; the reference pass when β > 0),
``zero_grad`` (the previous step's gradients released), then per micro-batch ``forward[i]``
(activations, the chunked log-prob head), ``loss[i]``, ``backward[i]`` (gradients),
``clip_grad`` and ``optimizer_step``, and ``sync_weights`` (the end of ``agent.update``).

For every phase the report gives the memory allocated at its end and the peak inside it. The
steps before the measured one (``--warmup``) create the optimiser state and compile what is compiled,
so the measured step is the steady state. At the phase boundaries of interest (the start, after the
rollout, after the update) the live tensors are walked and attributed: weights, gradients, optimiser
state, the engine's caches, the batch, the reference model, other — "kept between rollout and
update" is read there.

Where the numbers come from:

* **GPU**: ``torch.cuda.memory_allocated`` at each boundary and ``max_memory_allocated`` since the
  previous one (exact, the caching allocator's own counters); CUDA-graph pools are the segments of a
  private pool in ``torch.cuda.memory_snapshot()``; ``--snapshot PATH`` also records the allocator's
  history for the measured step (``torch.cuda.memory._record_memory_history``; open the pickle at
  https://pytorch.org/memory_viz).
* **CPU**: the same boundaries are marks in a ``torch.profiler`` trace with ``profile_memory=True``;
  the running sum of its allocation events is the tensor memory allocated since the step began
  (exact, per allocation; no allocator cache or Python objects in it), added to the live tensors
  found at the start.

Usage::

    python benchmarks/memory_timeline.py                                  # CPU, tiny Llama, 4 × 8 × 16
    python benchmarks/memory_timeline.py --model 10m --micro-batch-size 8
    python benchmarks/memory_timeline.py --device cuda --model qwen2-0.5b --new-tokens 128 --snapshot snap.pickle
    python benchmarks/memory_timeline.py --adam foreach --json before.json  # an optimiser implementation
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
try:  # installed (pip install -e .): llmgym.agents resolves through the package-dir mapping
    import llmgym.agents  # noqa: F401
except ImportError:  # a bare source tree (the lent GPU machine installs nothing)
    import llmgym

    llmgym.__path__.append(str(ROOT))

__all__ = ["run", "main", "PhaseRecorder"]

MIB = 2**20


def _storage_key(t):
    return (t.device.type, t.device.index, t.untyped_storage().data_ptr())


def _tensors_in(obj, depth: int = 8, seen: set | None = None):
    """Tensors reachable from ``obj`` through attributes, dicts, lists and tuples (not through modules'
    parameters: callers name those separately)."""
    import torch

    seen = set() if seen is None else seen
    if id(obj) in seen or depth < 0:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if isinstance(obj, torch.nn.Module):
        return
    if isinstance(obj, dict):
        items = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        items = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = list(vars(obj).values())
    else:
        return
    for item in items:
        yield from _tensors_in(item, depth - 1, seen)


def live_tensor_breakdown(agent, batch=None) -> dict[str, float]:
    """MiB of every live tensor storage, attributed to what holds it.

    Categories: ``weights`` (parameters and buffers of the policy), ``grads``, ``optimizer_state``,
    ``reference_model``, ``engine_cache`` (tensors the engine keeps between calls: static KV caches,
    masks), ``batch``, ``other`` (any other tensor the garbage collector finds). A storage counts
    once, in the first category that claims it. Tensors only C++ holds (autograd's saved tensors,
    CUDA-graph pools) are not visible here: the phase rows count them."""
    import torch

    engine_state = {k: v for k, v in vars(agent.engine).items() if k not in ("model", "tokenizer")}
    groups = [
        ("weights", [*agent.model.parameters(), *agent.model.buffers()]),
        ("grads", [p.grad for p in agent.parameters() if p.grad is not None]),
        ("optimizer_state", [v for s in agent.optimizer.state.values() for v in s.values()]),
        ("reference_model", list(agent.ref_model.parameters()) if getattr(agent, "ref_model", None) is not None else []),
        ("engine_cache", list(_tensors_in(engine_state))),
        ("batch", list(_tensors_in(vars(batch), depth=2)) if batch is not None else []),
    ]
    gc.collect()
    groups.append(("other", [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]))
    sizes: dict[str, float] = {name: 0.0 for name, _ in groups}
    counted: set = set()
    for name, tensors in groups:
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.is_meta:
                continue
            try:
                key = _storage_key(t)
                nbytes = t.untyped_storage().nbytes()
            except Exception:  # noqa: BLE001 - tensor subclasses without a plain storage
                continue
            if key not in counted:
                counted.add(key)
                sizes[name] += nbytes / MIB
    return {k: round(v, 3) for k, v in sizes.items()}


def cuda_graph_pool_mib() -> dict[str, float]:
    """Allocated and reserved MiB in private memory pools (CUDA graphs) of the caching allocator."""
    import torch

    allocated = reserved = 0
    for seg in torch.cuda.memory_snapshot():
        if tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0):
            allocated += seg.get("allocated_size", 0)
            reserved += seg.get("total_size", 0)
    return {"allocated_mib": round(allocated / MIB, 1), "reserved_mib": round(reserved / MIB, 1)}


class PhaseRecorder:
    """Boundaries between phases; ``allocated`` at each and ``peak`` inside each.

    On CUDA the allocator's counters are read at each :meth:`mark`. On CPU the recorder runs a
    memory-profiling ``torch.profiler`` trace from the moment it is opened (before the model is
    built, so every tensor's allocation, and hence the size of its release, is in the trace); each
    mark is a zero-length ``record_function`` range, and :meth:`rows` replays the allocation events
    up to each mark."""

    def __init__(self, device: str):
        self.device = device
        self.marks: list[str] = []
        self._rows: list[dict] = []
        self._prof = None

    def __enter__(self):
        if self.device == "cpu":
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._prof.__enter__()
        return self

    def __exit__(self, *exc):
        if self._prof is not None:
            self._prof.__exit__(*exc)
        return False

    def mark(self, phase: str) -> None:
        """End the current phase, named ``phase`` (the first mark, ``start``, opens the measured step)."""
        import torch

        index = len(self.marks)
        self.marks.append(phase)
        if self.device == "cuda":
            torch.cuda.synchronize()
            self._rows.append({"phase": phase, "allocated_mib": torch.cuda.memory_allocated() / MIB,
                               "peak_mib": torch.cuda.max_memory_allocated() / MIB})
            torch.cuda.reset_peak_memory_stats()
        else:
            with torch.profiler.record_function(f"llmgym_phase::{index}"):
                pass

    def rows(self) -> list[dict]:
        """One row per phase: ``allocated_mib`` at its end, ``peak_mib`` inside it, ``delta_mib``."""
        if self.device == "cuda":
            rows = [dict(r) for r in self._rows]
        else:
            marks, allocs = {}, []
            for e in self._prof.profiler.kineto_results.events():
                name = e.name()
                if name.startswith("llmgym_phase::"):
                    marks[int(name.split("::")[1])] = e.start_ns()
                elif name == "[memory]" and e.device_type().name == "CPU":
                    allocs.append((e.start_ns(), e.nbytes()))
            allocs.sort()
            rows, level, peak, j = [], 0, 0, 0
            for index, phase in enumerate(self.marks):
                while j < len(allocs) and allocs[j][0] <= marks[index]:
                    level += allocs[j][1]
                    peak = max(peak, level)
                    j += 1
                rows.append({"phase": phase, "allocated_mib": level / MIB, "peak_mib": peak / MIB})
                peak = level
        rows[0]["peak_mib"] = rows[0]["allocated_mib"]  # "start" is a point, not a phase
        previous = rows[0]["allocated_mib"]
        for row in rows:
            row["delta_mib"] = row["allocated_mib"] - previous
            previous = row["allocated_mib"]
            for k in ("allocated_mib", "peak_mib", "delta_mib"):
                row[k] = round(row[k], 2)
        return rows


@contextlib.contextmanager
def phases_of_a_step(agent, recorder: PhaseRecorder):
    """Mark phase boundaries as the agent's own methods are entered and left (nothing in llmgym changes)."""
    import torch

    counter = {"micro": 0}
    originals = {name: getattr(agent, name) for name in ("collect", "prepare", "forward", "loss")}
    tensor_backward = torch.Tensor.backward

    def collect(*a, **kw):
        out = originals["collect"](*a, **kw)
        recorder.mark("rollout")
        return out

    def prepare(*a, **kw):
        out = originals["prepare"](*a, **kw)
        recorder.mark("prepare")
        return out

    def forward(*a, **kw):
        i = counter["micro"]
        recorder.mark("zero_grad" if i == 0 else f"between[{i}]")
        out = originals["forward"](*a, **kw)
        recorder.mark(f"forward[{i}]")
        return out

    def loss(*a, **kw):
        out = originals["loss"](*a, **kw)
        recorder.mark(f"loss[{counter['micro']}]")
        return out

    def backward(self, *a, **kw):
        out = tensor_backward(self, *a, **kw)
        recorder.mark(f"backward[{counter['micro']}]")
        counter["micro"] += 1
        return out

    pre = agent.optimizer.register_step_pre_hook(lambda *_: recorder.mark("clip_grad"))
    post = agent.optimizer.register_step_post_hook(lambda *_: recorder.mark("optimizer_step"))
    for name, fn in (("collect", collect), ("prepare", prepare), ("forward", forward), ("loss", loss)):
        setattr(agent, name, fn)
    torch.Tensor.backward = backward
    try:
        yield
    finally:
        torch.Tensor.backward = tensor_backward
        for name in originals:
            delattr(agent, name)  # the instance attribute goes; the class's method is visible again
        pre.remove()
        post.remove()


def build(args):
    """``(agent, env)`` for ``args`` (the model is built in memory, random weights)."""
    import torch

    from grpo_vs_trl import MODELS, PROMPTS, digit_share
    from llmgym import SequenceEnv, Task
    from llmgym.agents import GRPO
    from llmgym.models import TinyModelConfig, build_tiny_model, build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    if args.model == "qwen2-0.5b":
        from gpu_check import BigVocabTokenizer, build_qwen2

        model = build_qwen2(device=args.device, dtype=torch.float32, eos_token_id=tok.eos_token_id,
                            pad_token_id=tok.pad_token_id)
        tok = BigVocabTokenizer(tok, model.config.vocab_size)
    else:
        model = build_tiny_model(tok, TinyModelConfig(**MODELS[args.model])).to(args.device)
    agent = GRPO(model, tok, tasks_per_step=args.tasks, group_size=args.group, max_new_tokens=args.new_tokens,
                 kl_coef=args.kl_coef, lr=1e-3, seed=0, precision=args.precision,
                 gradient_checkpointing=args.checkpointing, engine_decode=args.engine_decode,
                 micro_batch_size=args.micro_batch_size, loss_agg="seq-mean-token-mean")
    if args.adam != "default":  # compare optimiser implementations on the same step
        agent.optimizer = torch.optim.AdamW(agent.parameters(), lr=1e-3, weight_decay=0.0,
                                            **{"foreach": {"foreach": True}, "fused": {"fused": True},
                                               "for-loop": {"foreach": False, "fused": False}}[args.adam])
    env = SequenceEnv(lambda rng: Task(PROMPTS[int(rng.integers(len(PROMPTS)))]),
                      lambda task, text: digit_share(text), tok)
    return agent, env


def _mib(tensors) -> float:
    return round(sum(t.numel() * t.element_size() for t in tensors) / MIB, 3)


def terms(rows: list[dict]) -> dict[str, float]:
    """The step's memory terms from the phase rows (MiB)."""
    by = {r["phase"]: r for r in rows}
    out = {"start_allocated_mib": by["start"]["allocated_mib"],
           "rollout_peak_over_start_mib": round(by["rollout"]["peak_mib"] - by["start"]["allocated_mib"], 2),
           "kept_after_rollout_mib": round(by["rollout"]["allocated_mib"] - by["start"]["allocated_mib"], 2),
           "step_peak_mib": max(r["peak_mib"] for r in rows)}
    out["step_peak_phase"] = max(rows, key=lambda r: r["peak_mib"])["phase"]
    forwards = [r for r in rows if r["phase"].startswith("forward[")]
    out["activations_per_micro_batch_mib"] = [r["delta_mib"] for r in forwards]
    # the forward's transient above what it leaves behind: the chunked LM head's [K, V] temporaries
    out["forward_transient_mib"] = [round(r["peak_mib"] - r["allocated_mib"], 2) for r in forwards]
    backwards = [r for r in rows if r["phase"].startswith("backward[")]
    out["backward_peak_mib"] = [r["peak_mib"] for r in backwards]
    opt = by.get("optimizer_step")
    if opt is not None:
        out["optimizer_step_transient_mib"] = round(opt["peak_mib"] - max(opt["allocated_mib"], by["clip_grad"]["allocated_mib"]), 2)
    out["kept_after_step_mib"] = round(rows[-1]["allocated_mib"] - by["start"]["allocated_mib"], 2)
    return out


def run(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    with PhaseRecorder(args.device) as rec:
        agent, env = build(args)
        for _ in range(args.warmup):  # optimiser state, compiled graphs, allocator warm
            agent.update(agent.collect(env))
        if args.device == "cuda":
            torch.cuda.synchronize()
        gc.collect()
        report: dict = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                        "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                        "weights_mib": _mib(agent.model.parameters()), "trained_mib": _mib(agent.parameters()),
                        "kept": {"start": live_tensor_breakdown(agent)}}
        if args.device == "cuda":
            report["cuda_graph_pools"] = {"start": cuda_graph_pool_mib()}
            if args.snapshot:
                torch.cuda.memory._record_memory_history(max_entries=args.snapshot_entries)
        with phases_of_a_step(agent, rec):
            rec.mark("start")
            t0 = time.perf_counter()
            batch = agent.collect(env)
            walk = time.perf_counter()
            kept_after_rollout = live_tensor_breakdown(agent, batch)  # allocates no tensor memory
            walk = time.perf_counter() - walk
            agent.update(batch)
            rec.mark("sync_weights")
            report["step_s"] = round(time.perf_counter() - t0 - walk, 3)
        if args.device == "cuda" and args.snapshot:
            torch.cuda.memory._dump_snapshot(str(args.snapshot))
            torch.cuda.memory._record_memory_history(enabled=None)
            report["snapshot"] = str(args.snapshot)
    report["phases"] = rows = rec.rows()
    report["terms"] = terms(rows)
    report["kept"]["after_rollout"] = kept_after_rollout
    report["kept"]["end"] = live_tensor_breakdown(agent)
    report["micro_batches"] = sum(r["phase"].startswith("forward[") for r in rows)
    if args.device == "cuda":
        report["cuda_graph_pools"]["end"] = cuda_graph_pool_mib()
        report["max_memory_reserved_mib"] = round(torch.cuda.max_memory_reserved() / MIB, 1)
    return report


def _print(report: dict) -> None:
    print(f"{'phase':18s} {'allocated':>11s} {'delta':>10s} {'peak in phase':>14s}   (MiB)")
    for r in report["phases"]:
        print(f"{r['phase']:18s} {r['allocated_mib']:11.1f} {r['delta_mib']:+10.1f} {r['peak_mib']:14.1f}")
    print("terms:", json.dumps(report["terms"]))
    for where, kept in report["kept"].items():
        print(f"live tensors ({where}):", json.dumps(kept))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--model", default="tiny", choices=["tiny", "10m", "qwen2-0.5b"])
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--kl-coef", type=float, default=0.0)
    p.add_argument("--precision", default=None, help="default: per device (resolve_device_defaults)")
    p.add_argument("--engine-decode", default=None, choices=["eager", "static", "compiled"])
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--adam", default="default", choices=["default", "foreach", "fused", "for-loop"],
                   help="replace the agent's AdamW with this implementation (to compare their memory)")
    p.add_argument("--warmup", type=int, default=1, help="steps before the measured one")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or (os.cpu_count() or 1))
    p.add_argument("--snapshot", type=Path, default=None, help="GPU: dump the allocator history of the measured step here")
    p.add_argument("--snapshot-entries", type=int, default=200_000)
    p.add_argument("--json", type=Path, default=None)
    return p


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    from llmgym.agents.learner import resolve_device_defaults

    defaults = resolve_device_defaults(args.device, args.precision, args.engine_decode)
    args.precision, args.engine_decode = defaults["precision"], defaults["engine_decode"]
    report = run(args)
    _print(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return report


if __name__ == "__main__":
    main()
