"""Memory timeline of one GRPO step, llmgym's and TRL's: what each phase holds, and what it peaks at.

One GRPO step (the batch of ``benchmarks/grpo_vs_trl.py``: same saved model, prompts, reward, β = 0,
the same micro-batches; see its ``same_work``) is cut into phases where each trainer's own methods
are entered and left — nothing in either library changes:

* llmgym: ``rollout`` (``agent.collect``: prefill, decoding, the engine's caches and CUDA-graph
  pools), ``prepare`` (the batch on the device, advantages), ``zero_grad``, then per micro-batch
  ``forward[i]`` (activations, the chunked log-prob head), ``loss[i]``, ``backward[i]``
  (gradients), ``clip_grad``, ``optimizer_step`` and ``sync_weights`` (the end of ``update``);
* TRL ``GRPOTrainer``: ``rollout`` (``_generate_and_score_completions``: generation, rewards,
  advantages), per micro-batch ``forward+loss[i]`` (``compute_loss``) and ``backward[i]``,
  ``clip_grad``, ``optimizer_step`` and ``zero_grad`` (the end of the trainer's step).

For every phase: the memory allocated at its end and the peak inside it. The steps before the
measured one (``--warmup``) create the optimiser state and compile what is compiled, so the
measured step is the steady state. At the start, after the rollout and at the end the live
tensors are walked and attributed (weights, gradients, optimiser state, the engine's caches, the
batch, other): what is kept between rollout and update is read there.

Where the numbers come from:

* **GPU**: ``torch.cuda.memory_allocated`` at each boundary and ``max_memory_allocated`` since the
  previous one (the caching allocator's own counters); CUDA-graph pools are the segments of private
  pools in ``torch.cuda.memory_snapshot()``; memory no Python tensor holds (autograd, graph pools)
  is ``unaccounted``. ``--snapshot PATH`` records the allocator's history of the measured step
  (``torch.cuda.memory._record_memory_history``; open it at https://pytorch.org/memory_viz).
* **CPU**: a ``torch.profiler`` trace with ``profile_memory=True`` runs from before the model is
  loaded; each boundary is a zero-length ``record_function`` mark, and the running sum of the
  allocation events up to a mark is the tensor memory allocated then (exact, per allocation; no
  allocator cache, no Python objects).

Usage (the TRL side needs ``pip install -e '.[bench]'`` from the checkout)::

    python benchmarks/memory_timeline.py                               # llmgym, CPU, tiny Llama, 4 × 8 × 16
    python benchmarks/memory_timeline.py --side both --model 10m       # both, one fresh process each
    python benchmarks/memory_timeline.py --side both --device cuda --model qwen2-0.5b --new-tokens 128 \
        --json out.json --snapshot out/llmgym_snapshot.pickle
    python benchmarks/memory_timeline.py --adam foreach                # another AdamW implementation
    python benchmarks/memory_timeline.py --side both --model qwen2-vocab   # CPU: the 151,936 vocabulary's terms
    python benchmarks/memory_timeline.py --side both --device cuda --model qwen2-0.5b --time-steps 6

``--time-steps K`` (GPU) times ``K`` more steps after the measured one in the same process (warm: the
first steps' compilation and TRL's slow start are behind it), so one run per setting gives the
memory timeline, the settled step time of each side and the GPU peak over those steps.
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

__all__ = ["main", "run_llmgym", "run_trl", "PhaseRecorder", "live_tensor_breakdown"]

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


def live_tensor_breakdown(model, params, optimizer, engine=None, batch=None) -> dict[str, float]:
    """MiB of every live tensor storage, attributed to what holds it.

    Categories: ``weights`` (parameters and buffers of ``model``), ``grads`` (of ``params``),
    ``optimizer_state``, ``engine_cache`` (tensors ``engine`` keeps between calls: static KV caches,
    masks), ``batch`` (tensors reachable from ``batch``), ``other`` (any other tensor the garbage
    collector finds). A storage counts once, in the first category that claims it. On a GPU,
    ``unaccounted`` is what the allocator holds beyond all of these (autograd's saved tensors,
    CUDA-graph pools, anything only C++ holds)."""
    import torch

    engine_state = {k: v for k, v in vars(engine).items() if k not in ("model", "tokenizer")} if engine is not None else {}
    state = getattr(optimizer, "state", {})
    groups = [
        ("weights", [*model.parameters(), *model.buffers()]),
        ("grads", [p.grad for p in params if p.grad is not None]),
        ("optimizer_state", [v for st in state.values() for v in st.values()]),
        ("engine_cache", list(_tensors_in(engine_state))),
        ("batch", list(_tensors_in(batch, depth=3)) if batch is not None else []),
    ]
    gc.collect()
    groups.append(("other", [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]))
    sizes: dict[str, float] = {name: 0.0 for name, _ in groups}
    counted: set = set()
    device = next(model.parameters()).device
    for name, tensors in groups:
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.is_meta or t.device != device:
                continue
            try:
                key = _storage_key(t)
                nbytes = t.untyped_storage().nbytes()
            except Exception:  # noqa: BLE001 - tensor subclasses without a plain storage
                continue
            if key not in counted:
                counted.add(key)
                sizes[name] += nbytes / MIB
    if device.type == "cuda":
        sizes["unaccounted"] = torch.cuda.memory_allocated() / MIB - sum(sizes.values())
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
def llmgym_phases(agent, recorder: PhaseRecorder):
    """Mark phase boundaries as the agent's own methods are entered and left (nothing in llmgym changes)."""
    counter = {"micro": 0}
    originals = {name: getattr(agent, name) for name in ("collect", "prepare", "forward", "loss")}

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

    def after_backward():
        recorder.mark(f"backward[{counter['micro']}]")
        counter["micro"] += 1

    pre = agent.optimizer.register_step_pre_hook(lambda *_: recorder.mark("clip_grad"))
    post = agent.optimizer.register_step_post_hook(lambda *_: recorder.mark("optimizer_step"))
    try:
        with _wrapped(agent, {"collect": collect, "prepare": prepare, "forward": forward, "loss": loss}, after_backward):
            yield
    finally:
        pre.remove()
        post.remove()


@contextlib.contextmanager
def _wrapped(obj, methods: dict, after_backward):
    """``methods`` as instance attributes of ``obj`` and ``after_backward()`` after every
    ``Tensor.backward``, for the duration of the block (then the class's methods are visible again)."""
    import torch

    tensor_backward = torch.Tensor.backward

    def backward(self, *a, **kw):
        out = tensor_backward(self, *a, **kw)
        after_backward()
        return out

    for name, fn in methods.items():
        setattr(obj, name, fn)
    torch.Tensor.backward = backward
    try:
        yield
    finally:
        torch.Tensor.backward = tensor_backward
        for name in methods:
            delattr(obj, name)


@contextlib.contextmanager
def trl_phases(trainer, recorder: PhaseRecorder, measured_step: int, kept: dict, on_start=None, on_end=None):
    """Mark the phases of TRL's ``measured_step``-th optimiser step (callbacks, and wrappers around
    the trainer's own methods); ``on_start``/``on_end`` run at its first and last mark."""
    from transformers import TrainerCallback

    state = {"on": False, "micro": 0}
    originals = {name: getattr(trainer, name) for name in ("_generate_and_score_completions", "compute_loss")}
    model = trainer.model

    def breakdown(batch=None):
        return live_tensor_breakdown(model, [p for p in model.parameters() if p.requires_grad],
                                     getattr(trainer.optimizer, "optimizer", trainer.optimizer), batch=batch)

    class Marks(TrainerCallback):
        def on_step_begin(self, args, st, control, **kw):
            if st.global_step == measured_step:
                kept["start"] = breakdown()
                if on_start is not None:
                    on_start()
                recorder.mark("start")
                state["on"] = True

        def on_pre_optimizer_step(self, args, st, control, **kw):
            if state["on"]:
                recorder.mark("clip_grad")

        def on_optimizer_step(self, args, st, control, **kw):
            if state["on"]:
                recorder.mark("optimizer_step")

        def on_step_end(self, args, st, control, **kw):
            if state["on"]:
                recorder.mark("zero_grad")
                state["on"] = False
                if on_end is not None:
                    on_end()
                kept["end"] = breakdown()

    def generate(*a, **kw):
        out = originals["_generate_and_score_completions"](*a, **kw)
        if state["on"]:
            recorder.mark("rollout")
            kept["after_rollout"] = breakdown(out)
        return out

    def compute_loss(*a, **kw):
        if state["on"] and state["micro"]:
            recorder.mark(f"between[{state['micro']}]")
        out = originals["compute_loss"](*a, **kw)
        if state["on"]:
            recorder.mark(f"forward+loss[{state['micro']}]")
        return out

    def after_backward():
        if state["on"]:
            recorder.mark(f"backward[{state['micro']}]")
            state["micro"] += 1

    trainer.add_callback(Marks())
    with _wrapped(trainer, {"_generate_and_score_completions": generate, "compute_loss": compute_loss}, after_backward):
        yield


def _replace_adam(args, params):
    import torch

    impl = {"foreach": {"foreach": True}, "fused": {"fused": True}, "for-loop": {"foreach": False, "fused": False}}
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0, **impl[args.adam])


def _mib(tensors) -> float:
    return round(sum(t.numel() * t.element_size() for t in tensors) / MIB, 3)


def terms(rows: list[dict]) -> dict:
    """The step's memory terms from the phase rows (MiB)."""
    by = {r["phase"]: r for r in rows}
    start = by["start"]["allocated_mib"]
    out = {"start_allocated_mib": start,
           "rollout_peak_over_start_mib": round(by["rollout"]["peak_mib"] - start, 2),
           "kept_after_rollout_mib": round(by["rollout"]["allocated_mib"] - start, 2),
           "step_peak_mib": max(r["peak_mib"] for r in rows),
           "step_peak_phase": max(rows, key=lambda r: r["peak_mib"])["phase"]}
    forwards = [r for r in rows if r["phase"].startswith("forward")]
    out["activations_per_micro_batch_mib"] = [r["delta_mib"] for r in forwards]
    # a forward's transient above what it leaves behind: llmgym's chunked LM head's [K, V] temporaries
    out["forward_transient_mib"] = [round(r["peak_mib"] - r["allocated_mib"], 2) for r in forwards]
    out["backward_peak_mib"] = [r["peak_mib"] for r in rows if r["phase"].startswith("backward[")]
    if "optimizer_step" in by and "clip_grad" in by:
        opt = by["optimizer_step"]
        out["optimizer_step_transient_mib"] = round(opt["peak_mib"] - max(opt["allocated_mib"], by["clip_grad"]["allocated_mib"]), 2)
    out["kept_after_step_mib"] = round(rows[-1]["allocated_mib"] - start, 2)
    return out


def run_llmgym(args) -> dict:
    import torch

    from grpo_vs_trl import make_llmgym

    with PhaseRecorder(args.device) as rec:
        agent, env = make_llmgym(args)
        if args.adam != "default":
            agent.optimizer = _replace_adam(args, agent.parameters())
        for _ in range(args.warmup):  # optimiser state, compiled graphs, allocator warm
            agent.update(agent.collect(env))
        if args.device == "cuda":
            torch.cuda.synchronize()

        def breakdown(batch=None):
            return live_tensor_breakdown(agent.model, agent.parameters(), agent.optimizer, agent.engine, batch)

        report: dict = {"weights_mib": _mib(agent.model.parameters()), "trained_mib": _mib(agent.parameters()),
                        "kept": {"start": breakdown()}}
        _start_cuda_extras(args, report)
        with llmgym_phases(agent, rec):
            rec.mark("start")
            t0 = time.perf_counter()
            batch = agent.collect(env)
            walk = time.perf_counter()
            report["kept"]["after_rollout"] = breakdown(batch)  # allocates no tensor memory
            walk = time.perf_counter() - walk
            agent.update(batch)
            rec.mark("sync_weights")
            report["step_s"] = round(time.perf_counter() - t0 - walk, 3)
        _end_cuda_extras(args, report)
        report["kept"]["end"] = breakdown()
    if args.time_steps:  # after the CPU recorder's profiler stopped
        report["timed_steps"] = _time_llmgym_steps(agent, env, args)
    return _finish(args, rec, report)


def _sync(args) -> None:
    import torch

    if args.device == "cuda":
        torch.cuda.synchronize()


def _reset_peak(args) -> None:
    import torch

    if args.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _timed(step_s: list[float], args, **extra) -> dict:
    """``--time-steps``: each step's seconds, the settled median (grpo_vs_trl's rule) and the GPU peak over them."""
    import torch

    from grpo_vs_trl import settled

    out = {"step_s": [round(x, 4) for x in step_s], **settled(step_s), **extra}
    if args.device == "cuda":
        out["peak_mib"] = round(torch.cuda.max_memory_allocated() / MIB, 1)
    return out


def _time_llmgym_steps(agent, env, args) -> dict:
    """``args.time_steps`` more whole steps after the measured one (warm: no compilation, optimiser state made)."""
    steps, rollouts = [], []
    _reset_peak(args)
    for _ in range(args.time_steps):
        _sync(args)
        t0 = time.perf_counter()
        batch = agent.collect(env)
        _sync(args)
        t1 = time.perf_counter()
        agent.update(batch)
        _sync(args)
        steps.append(time.perf_counter() - t0)
        rollouts.append(t1 - t0)
    return _timed(steps, args, rollout_s=[round(x, 4) for x in rollouts])


def run_trl(args) -> dict:
    import torch

    from grpo_vs_trl import make_trl

    kept: dict = {}
    with PhaseRecorder(args.device) as rec:
        trainer = make_trl(args, max_steps=args.warmup + 1 + args.time_steps)
        timer_box: dict = {}
        if args.time_steps:
            trainer.add_callback(_trl_step_timer(args, args.warmup, timer_box))
        if args.adam != "default":
            trainer.create_optimizer = lambda *a, **kw: setattr(trainer, "optimizer", _replace_adam(
                args, [p for p in trainer.model.parameters() if p.requires_grad])) or trainer.optimizer
        model = trainer.model
        report: dict = {"weights_mib": _mib(model.parameters()),
                        "trained_mib": _mib(p for p in model.parameters() if p.requires_grad), "kept": kept}
        with trl_phases(trainer, rec, args.warmup, kept, on_start=lambda: _start_cuda_extras(args, report),
                        on_end=lambda: _end_cuda_extras(args, report)):
            t0 = time.perf_counter()
            trainer.train()
        report["train_s"] = round(time.perf_counter() - t0, 3)
        if args.device == "cuda":
            torch.cuda.synchronize()
    report["kept"] = {k: kept[k] for k in ("start", "after_rollout", "end") if k in kept}
    if args.time_steps:  # on a CPU TRL's trainer runs them under the memory profiler: not a speed figure
        report["timed_steps"] = _timed(timer_box.get("step_s", []), args, under_cpu_profiler=args.device == "cpu")
    return _finish(args, rec, report)


def _trl_step_timer(args, measured_step: int, box: dict):
    """A callback timing TRL's steps after the measured one (``--time-steps``)."""
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            if state.global_step == measured_step + 1:
                _reset_peak(args)
            if state.global_step > measured_step:
                _sync(args)
                self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            if state.global_step > measured_step + 1:  # global_step counts the step just ended
                _sync(args)
                box.setdefault("step_s", []).append(time.perf_counter() - self.t0)

    return Timer()


def _start_cuda_extras(args, report):
    import torch

    if args.device == "cuda":
        report["cuda_graph_pools"] = {"start": cuda_graph_pool_mib()}
        if args.snapshot:
            torch.cuda.memory._record_memory_history(stacks="python", max_entries=args.snapshot_entries)


def _end_cuda_extras(args, report):
    import torch

    if args.device == "cuda":
        report["cuda_graph_pools"]["end"] = cuda_graph_pool_mib()
        report["max_memory_reserved_mib"] = round(torch.cuda.max_memory_reserved() / MIB, 1)
        if args.snapshot:
            args.snapshot.parent.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(str(args.snapshot))
            torch.cuda.memory._record_memory_history(enabled=None)
            report["snapshot"] = str(args.snapshot)


def _finish(args, rec, report) -> dict:
    import torch

    rows = rec.rows()
    report.update(side=args.side, phases=rows, terms=terms(rows),
                  micro_batches=sum(r["phase"].startswith("backward[") for r in rows),
                  device_name=torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                  config={k: v for k, v in vars(args).items() if k in CONFIG_KEYS})
    return report


CONFIG_KEYS = ("device", "model", "tasks", "group", "new_tokens", "micro", "precision", "engine_decode",
               "checkpointing", "adam", "warmup", "threads", "time_steps")


def _print(report: dict) -> None:
    print(f"== {report['side']}: {'phase':16s} {'allocated':>11s} {'delta':>10s} {'peak in phase':>14s}   (MiB)")
    for r in report["phases"]:
        print(f"   {r['phase']:22s} {r['allocated_mib']:11.1f} {r['delta_mib']:+10.1f} {r['peak_mib']:14.1f}")
    print("   terms:", json.dumps(report["terms"]))
    for where, kept in report["kept"].items():
        print(f"   live tensors ({where}):", json.dumps(kept))


def compare(llmgym: dict, trl: dict) -> dict:
    """Side-by-side terms (MiB) and the ratio of step peaks."""
    keys = ("start_allocated_mib", "rollout_peak_over_start_mib", "kept_after_rollout_mib", "step_peak_mib",
            "step_peak_phase", "activations_per_micro_batch_mib", "forward_transient_mib",
            "optimizer_step_transient_mib", "kept_after_step_mib")
    out = {k: {"llmgym": llmgym["terms"].get(k), "trl": trl["terms"].get(k)} for k in keys}
    out["step_peak_ratio_llmgym_over_trl"] = round(llmgym["terms"]["step_peak_mib"] / trl["terms"]["step_peak_mib"], 3)
    timed = [side.get("timed_steps") or {} for side in (llmgym, trl)]
    if all(t.get("settled_step_s") for t in timed):
        out["settled_step_s"] = {"llmgym": timed[0]["settled_step_s"], "trl": timed[1]["settled_step_s"],
                                 "settled": [timed[0]["settled"], timed[1]["settled"]]}
        out["settled_step_ratio_llmgym_over_trl"] = round(timed[0]["settled_step_s"] / timed[1]["settled_step_s"], 3)
    if all(t.get("peak_mib") for t in timed):
        out["timed_steps_peak_ratio_llmgym_over_trl"] = round(timed[0]["peak_mib"] / timed[1]["peak_mib"], 3)
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--side", default="llmgym", choices=["llmgym", "trl", "both"],
                   help="both: each side in a fresh process on the same saved model")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--model", default="tiny", choices=["tiny", "10m", "qwen2-vocab", "qwen2-0.5b"],
                   help="qwen2-vocab: the Qwen2 architecture and 151,936-token vocabulary on a small body (CPU)")
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--micro-batch-size", dest="micro", type=int, default=None, help="rows per forward/backward (both sides)")
    p.add_argument("--precision", default=None, help="llmgym precision; TRL bf16=True iff bf16-mixed (default: per device)")
    p.add_argument("--engine-decode", default=None, choices=["eager", "static", "compiled"])
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--adam", default="default", choices=["default", "foreach", "fused", "for-loop"],
                   help="replace the side's AdamW with this implementation (to compare their memory)")
    p.add_argument("--warmup", type=int, default=1, help="steps before the measured one")
    p.add_argument("--time-steps", type=int, default=0,
                   help="time this many more steps after the measured one (step seconds, settled median, GPU peak); "
                        "GPU figures: on a CPU TRL's steps run under the memory profiler (use grpo_vs_trl.py)")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or (os.cpu_count() or 1))
    p.add_argument("--snapshot", type=Path, default=None,
                   help="GPU: dump the allocator history of the measured step (with --side both: <stem>_<side>.pickle)")
    p.add_argument("--snapshot-entries", type=int, default=100_000)
    p.add_argument("--timeout", type=int, default=900, help="seconds per side process (--side both)")
    p.add_argument("--json", type=Path, default=None)
    return p


def _spawn_side(args, side: str, model_dir: str) -> dict:
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="llmgym-mem-") as tmp:
        out = Path(tmp) / f"{side}.json"
        argv = [sys.executable, __file__, "--side", side, "--model-dir", model_dir, "--json", str(out),
                "--device", args.device, "--model", args.model, "--tasks", str(args.tasks), "--group", str(args.group),
                "--new-tokens", str(args.new_tokens), "--precision", args.precision, "--engine-decode", args.engine_decode,
                "--adam", args.adam, "--warmup", str(args.warmup), "--threads", str(args.threads),
                "--time-steps", str(args.time_steps)]
        argv += (["--checkpointing"] if args.checkpointing else []) + (["--micro-batch-size", str(args.micro)] if args.micro else [])
        if args.snapshot:
            argv += ["--snapshot", str(args.snapshot.with_name(f"{args.snapshot.stem}_{side}{args.snapshot.suffix}"))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout, env=env, check=False)
        except subprocess.TimeoutExpired:
            return {"side": side, "error": f"timed out after {args.timeout} s"}
        if not out.exists():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-8:]
            return {"side": side, "error": f"exit {proc.returncode}: " + " | ".join(tail)}
        return json.loads(out.read_text())


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    import tempfile

    import torch

    from grpo_vs_trl import build_model_dir
    from llmgym.agents.learner import resolve_device_defaults

    defaults = resolve_device_defaults(args.device, args.precision, args.engine_decode)
    args.precision, args.engine_decode = defaults["precision"], defaults["engine_decode"]
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="llmgym-mem-model-") as tmp:
        if args.model_dir is None:
            args.model_dir = str(build_model_dir(args.model, Path(tmp)))
        if args.side == "both":
            sides = {side: _spawn_side(args, side, args.model_dir) for side in ("llmgym", "trl")}
            report = {"llmgym": sides["llmgym"], "trl": sides["trl"],
                      "load_avg_1_5_15": os.getloadavg()}
            for r in sides.values():
                _print(r) if "phases" in r else print(f"== {r['side']}: {r['error']}")
            if all("terms" in r for r in sides.values()):
                report["compare"] = compare(sides["llmgym"], sides["trl"])
                print("compare:", json.dumps(report["compare"]))
        else:
            report = run_llmgym(args) if args.side == "llmgym" else run_trl(args)
            _print(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return report


if __name__ == "__main__":
    main()
