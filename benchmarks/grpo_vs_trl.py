"""GRPO step time and peak memory, llmgym vs TRL's ``GRPOTrainer``, side by side in one run.

Both sides load the same model directory, get the same prompts and the same reward function (share of
digits in the completion), and the same batch (``tasks × group`` completions of ``new_tokens``
tokens, β = 0, one optimiser step per batch, lr 1e-3, no gradient checkpointing on CPU). Each side
runs in a **fresh process**, one after the other, so its peak RSS (CPU) or
``torch.cuda.max_memory_allocated`` (GPU) is its own. Step time is the median of the steps after the
first (warm-up); each process's CPU seconds per step are reported too (on a shared, loaded host
they track the work done better than wall time).

A second table measures the **memory of one update** (no generation) at ``N = 32`` rows, prompt 32
+ completion 128 tokens, vocabulary 151,936 (a Qwen2-sized vocabulary on a small Llama body), for
llmgym's chunked log-probs (the default ``logits_chunk_size``: 220 tokens at this vocabulary) and for the full-logits path
(``logits_chunk_size=0``, the computation llmgym used before the chunked learner).

**The same work on both sides** (recorded in the JSON under ``same_work``): every optimiser step
sees ``tasks × group`` fresh completions, generated in one batch; ``--micro-batch-size M`` makes both
sides run forward/backward on ``M`` rows at a time and accumulate (llmgym ``micro_batch_size=M``;
TRL ``per_device_train_batch_size=M``, ``gradient_accumulation_steps=rows/M``, so its generation
batch stays ``rows``); both use fused AdamW (TRL's ``adamw_torch_fused`` default), gradient
clipping at 1.0, bf16 autocast on a GPU (TRL ``bf16=True``), and the same checkpointing.

**Until it settles**: TRL's first steps are slow (on an H100: 17 s, 10 s, then ~3.5 s). With
``--side-seconds S`` each side runs until ``--steps`` steps or ``S`` seconds of steps, whichever
comes first (TRL is stopped from a callback at a step boundary), and reports the median of the
second half of its steps (``settled_step_s``) next to the median after the first step. GPU peaks are
reported for the whole run and for the steps after the first (``peak_gpu_mib_steady``: compilation
and the optimiser state's creation happen in step 1).

Usage (TRL is a benchmark-only extra: ``pip install -e '.[bench]'`` from the checkout)::

    python benchmarks/grpo_vs_trl.py                   # CPU: tiny (1.1M) and 10M Llama + memory table
    python benchmarks/grpo_vs_trl.py --device cuda     # GPU: the same, on the GPU
    python benchmarks/grpo_vs_trl.py --models tiny --steps 4 --no-memory
    python benchmarks/grpo_vs_trl.py --json results.json
    python benchmarks/grpo_vs_trl.py --device cuda --models qwen2-0.5b --new-tokens 512 --steps 40 --side-seconds 150
    python benchmarks/grpo_vs_trl.py --models 10m --profile 15      # + each side's top functions (cProfile)
    OMP_NUM_THREADS=1 python benchmarks/grpo_vs_trl.py --models 10m --no-memory --steps 12 --interleaved --profile 1
        # the CPU ratio on a shared machine: both sides in one process, step by step; per-step ratio
        # min/median, tokens per row, and each side's split (generation, scoring, forward, backward, optimiser)

Side-by-side ratios are only meaningful on a quiet machine (2-core hosts shared with other jobs
inflate every number; see NOTES on thread oversubscription).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
try:  # installed (pip install -e .): llmgym.agents resolves through the package-dir mapping
    import llmgym.agents  # noqa: F401
except ImportError:  # a bare source tree: map agents/ and envs/ by hand
    import llmgym

    llmgym.__path__.append(str(ROOT))

MODELS = {  # TinyModelConfig fields
    "tiny": {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "intermediate_size": 512},
    "10m": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "intermediate_size": 2816},
    "qwen2-0.5b": None,  # the Qwen2-0.5B shape of benchmarks/gpu_check.py (random weights; GPU)
    # the Qwen2 architecture and its 151,936-token vocabulary on a small body (9.8M parameters, nearly
    # all in the tied embedding): the logits' memory terms of the Qwen2-0.5B shape, at a size a CPU runs
    "qwen2-vocab": {"qwen2": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                              "num_key_value_heads": 2, "intermediate_size": 256}},
}
SMOKE_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "intermediate_size": 128, "vocab_size": 4096}
PROMPTS = [f"Write digits after {a}+{b}=" for a, b in [(3, 4), (12, 7), (5, 55), (81, 9), (2, 2), (40, 4), (6, 13), (9, 90)]]
MEMORY_SHAPE = {"rows": 32, "prompt": 32, "completion": 128, "vocab": 151_936}


def digit_share(text: str) -> float:
    """The reward: share of digit characters in the completion (a random policy can climb it)."""
    return sum(ch.isdigit() for ch in text) / max(1, len(text))


def _peak() -> dict:
    import torch

    out = {"peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------
# one side per process
# ---------------------------------------------------------------------------------------------


def same_work(a) -> dict:
    """What each side does per optimiser step (written into the report, so a reader can check it)."""
    rows = a.tasks * a.group
    micro = a.micro or rows
    if rows % micro:
        raise SystemExit(f"--micro-batch-size {micro} must divide tasks × group = {rows}")
    autocast = "bf16" if a.precision == "bf16-mixed" else None
    return {
        "llmgym": {"rows_per_optimizer_step": rows, "generation_batch": rows, "micro_batch_rows": micro,
                   "micro_batches": rows // micro, "optimizer": "AdamW fused", "autocast": autocast,
                   "precision": a.precision, "gradient_checkpointing": a.checkpointing, "max_grad_norm": 1.0,
                   "engine_decode": a.engine_decode, "beta": 0.0, "loss": "seq-mean-token-mean"},
        "trl": {"rows_per_optimizer_step": rows, "generation_batch": rows, "per_device_train_batch_size": micro,
                "gradient_accumulation_steps": rows // micro, "optimizer": "adamw_torch_fused (transformers default)",
                "autocast": autocast, "gradient_checkpointing": a.checkpointing, "max_grad_norm": 1.0,
                "generate": "model.generate, dynamic cache, weights' dtype", "beta": 0.0, "loss_type": "grpo"},
    }


def make_llmgym(a):
    """``(agent, env)`` of llmgym's side (model loaded from ``a.model_dir``)."""
    from llmgym import SequenceEnv, Task
    from llmgym.agents import GRPO
    from llmgym.runtime.models import load_model

    model, tok = load_model(a.model_dir, device=a.device)
    if model.config.vocab_size > len(tok):  # the byte tokenizer in front of a bigger vocabulary
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from gpu_check import BigVocabTokenizer

        tok = BigVocabTokenizer(tok, model.config.vocab_size)
    agent = GRPO(model, tok, tasks_per_step=a.tasks, group_size=a.group, max_new_tokens=a.new_tokens,
                 kl_coef=0.0, lr=1e-3, seed=0, precision=a.precision, gradient_checkpointing=a.checkpointing,
                 engine_decode=a.engine_decode, loss_agg="seq-mean-token-mean", micro_batch_size=a.micro)
    env = SequenceEnv(lambda rng: Task(PROMPTS[int(rng.integers(len(PROMPTS)))]),
                      lambda task, text: digit_share(text), tok)
    return agent, env


def make_trl(a, callbacks=(), max_steps: int | None = None):
    """TRL's ``GRPOTrainer`` on the same model directory, prompts, reward and batch."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(a.model_dir)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir)
    if a.device == "cuda":
        model = model.to("cuda")

    def reward(completions, **kwargs):
        return [digit_share(c) for c in completions]

    rows = a.tasks * a.group
    micro = a.micro or rows
    steps = max_steps or a.steps
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"), per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows // micro,  # one generation of `rows` completions per optimiser step
        num_generations=a.group, max_completion_length=a.new_tokens, beta=0.0, learning_rate=1e-3,
        max_steps=steps, logging_steps=10_000, save_strategy="no", report_to="none",
        use_cpu=a.device == "cpu", bf16=a.precision == "bf16-mixed", gradient_checkpointing=a.checkpointing,
        loss_type="grpo", temperature=1.0, seed=0, disable_dropout=True, dataloader_num_workers=0,
    )
    data = Dataset.from_list([{"prompt": p} for p in PROMPTS * (rows * steps // len(PROMPTS) + 1)])
    return GRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=data,
                       processing_class=tok, callbacks=list(callbacks))


class _Profiler:
    """cProfile over the steps after the first, when ``--profile N`` asks for the top N functions.

    Timed in the process's CPU seconds (``time.process_time``), not wall time: on a shared host a
    wall-clock profile charges other jobs' time slices to whatever function was running."""

    def __init__(self, top: int):
        import cProfile

        self.top, self.prof = top, cProfile.Profile(time.process_time) if top else None

    def start(self):
        if self.prof is not None:
            self.prof.enable()

    def stop(self):
        if self.prof is not None:
            self.prof.disable()

    def report(self) -> dict:
        if self.prof is None:
            return {}
        import pstats

        stats = pstats.Stats(self.prof).stats
        total = sum(tt for _, _, tt, _, _ in stats.values())
        rows = []
        for (path, line, fn), (_, calls, tt, ct, _) in stats.items():
            short = "/".join(Path(path).parts[-2:]) if path != "~" else "builtin"
            rows.append({"function": f"{short}:{line}({fn})", "calls": calls, "tottime_share": tt / total,
                         "cumtime_share": ct / total})
        pick = lambda key: [{**r, key: round(r[key], 4)} for r in sorted(rows, key=lambda r: -r[key])[:self.top]]
        return {"profile_total_s": round(total, 3), "top_tottime": pick("tottime_share"),
                "top_cumtime": pick("cumtime_share")}


def _reset_gpu_peak(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def side_llmgym(a) -> dict:
    import torch

    agent, env = make_llmgym(a)
    rss_loaded = _peak()
    profiler = _Profiler(a.profile)
    times, rollout, rewards, cpu = [], [], [], []
    first_peak = None
    started = time.perf_counter()
    for step in range(a.steps):
        if step == 1:  # after warm-up: compilation, the optimiser state, allocator growth
            first_peak = _peak()
            _reset_gpu_peak(a.device)
            profiler.start()
        _sync(a.device)
        c0 = time.process_time()
        t0 = time.perf_counter()
        batch = agent.collect(env)
        _sync(a.device)
        t1 = time.perf_counter()
        agent.update(batch)
        _sync(a.device)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        rollout.append(t1 - t0)
        rewards.append(float(batch.rewards.mean()))
        if a.side_seconds and time.perf_counter() - started > a.side_seconds and step >= 1:
            break
    profiler.stop()
    return {"step_s": times, "cpu_s": cpu, "rollout_s": rollout, "reward_mean": rewards, "loaded": rss_loaded,
            "after_first_step": first_peak, "threads": torch.get_num_threads(), **profiler.report()}


def side_trl(a) -> dict:
    import torch
    from transformers import TrainerCallback

    times: list[float] = []
    cpu: list[float] = []
    profiler = _Profiler(a.profile)
    box: dict = {}

    class Timer(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            self.started = time.perf_counter()

        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == 1:
                box["after_first_step"] = _peak()
                _reset_gpu_peak(a.device)
                profiler.start()
            _sync(a.device)
            self.c0 = time.process_time()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            _sync(a.device)
            times.append(time.perf_counter() - self.t0)
            cpu.append(time.process_time() - self.c0)
            if a.side_seconds and time.perf_counter() - self.started > a.side_seconds and len(times) >= 2:
                control.should_training_stop = True

    trainer = make_trl(a, callbacks=[Timer()])
    rss_loaded = _peak()
    trainer.train()
    profiler.stop()
    return {"step_s": times, "cpu_s": cpu, "loaded": rss_loaded, "after_first_step": box.get("after_first_step"),
            "threads": torch.get_num_threads(), **profiler.report()}


# where a step's CPU time goes: (category, side) -> the functions whose cumulative time it is, as
# "path tail:function name"; "collect"/"step" are the wholes that generation/scoring are carved out of
SPLIT = {
    "llmgym": {"collect": ["agents/base.py:collect"], "generation": ["engines/hf.py:_generate_rows",
                                                                     "engines/session.py:_forward"],
               "update": ["agents/learner.py:update"], "backward": ["~run_backward"],
               "optimizer": ["optim/optimizer.py:wrapper", "utils/clip_grad.py:clip_grad_norm_"]},
    "trl": {"collect": ["trainer/grpo_trainer.py:_generate_and_score_completions"],
            "generation": ["trainer/grpo_trainer.py:_generate_single_turn"],
            "scoring": ["trainer/grpo_trainer.py:_calculate_rewards"],
            "update": ["trainer/grpo_trainer.py:compute_loss", "~run_backward",
                       "optim/optimizer.py:wrapper", "utils/clip_grad.py:clip_grad_norm_"],
            "backward": ["~run_backward"],
            "optimizer": ["optim/optimizer.py:wrapper", "utils/clip_grad.py:clip_grad_norm_"]},
}


def profile_split(prof, side: str, steps: int) -> dict:
    """CPU seconds per step by category from a cProfile (``time.process_time``) of ``steps`` steps:
    generation, scoring + rollout bookkeeping, forward + loss, backward, optimiser (clipping
    included), and the rest (the trainer's loop, batching, Python between the parts)."""
    import pstats

    stats = pstats.Stats(prof).stats
    total = sum(tt for _, _, tt, _, _ in stats.values())

    def cum(names):
        out = 0.0
        for (path, _line, fn), (_cc, _nc, _tt, ct, _callers) in stats.items():
            label = fn if path == "~" else "/".join(Path(path).parts[-3:]) + ":" + fn
            # "~name": a builtin (C) function whose name contains name; else the tail of path:function
            out += ct if any((path == "~" and n[1:] in fn) if n.startswith("~") else (path != "~" and label.endswith(n))
                             for n in names) else 0.0
        return out

    pick = SPLIT[side]
    gen, collect = cum(pick["generation"]), cum(pick["collect"])
    backward, optim = cum(pick["backward"]), cum(pick["optimizer"])
    update = cum(pick["update"])
    split = {"generation": gen, "scoring_and_rollout": collect - gen, "forward_and_loss": update - backward - optim,
             "backward": backward, "optimizer": optim}
    split["other"] = total - sum(split.values())
    return {k: round(v / steps, 4) for k, v in {**split, "total": total}.items()}


def side_pair(a) -> dict:
    """Both sides in one process, interleaved step by step: TRL's trainer runs, and after each of its
    steps (outside its timing) one llmgym step runs. Load from other jobs then falls on both alike.
    Reports each side's CPU and wall seconds per step, tokens generated per step, the per-step
    CPU ratios (min/median), and with ``--profile`` each side's split of a step."""
    import cProfile

    import torch
    from transformers import TrainerCallback

    agent, env = make_llmgym(a)
    prof = {"llmgym": cProfile.Profile(time.process_time), "trl": cProfile.Profile(time.process_time)}
    rec = {side: {"cpu_s": [], "step_s": [], "tokens": []} for side in prof}
    box: dict = {}

    def llmgym_step(profiled: bool):
        p = prof["llmgym"] if profiled else None
        if p:
            p.enable()
        c0, t0 = time.process_time(), time.perf_counter()
        batch = agent.collect(env)
        agent.update(batch)
        c1, t1 = time.process_time(), time.perf_counter()
        if p:
            p.disable()
        return c1 - c0, t1 - t0, float(batch.action_mask.sum()) / len(batch)

    class Pair(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.profiled = bool(a.profile) and state.global_step >= 1  # the first step of each side is warm-up
            if self.profiled:
                prof["trl"].enable()
            self.c0, self.t0 = time.process_time(), time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            c, t = time.process_time() - self.c0, time.perf_counter() - self.t0
            if self.profiled:
                prof["trl"].disable()
            lengths = box["trainer"]._metrics["train"].get("completions/mean_length") or [float("nan")]
            for side, (cpu, wall, tokens) in (("trl", (c, t, lengths[-1])),
                                              ("llmgym", llmgym_step(self.profiled))):
                rec[side]["cpu_s"].append(cpu)
                rec[side]["step_s"].append(wall)
                rec[side]["tokens"].append(tokens)

    box["trainer"] = trainer = make_trl(a, callbacks=[Pair()])
    trainer.train()
    out = {"threads": torch.get_num_threads(), "load_avg": os.getloadavg()}
    for side, r in rec.items():
        out[side] = {**{k: [round(x, 4) for x in v] for k, v in r.items()},
                     "median_cpu_s": round(_median_after_warmup(r["cpu_s"]), 4),
                     "median_step_s": round(_median_after_warmup(r["step_s"]), 4),
                     "tokens_per_row": round(statistics.mean(r["tokens"]), 2)}
        if a.profile:
            out[side]["split_cpu_s_per_step"] = profile_split(prof[side], side, len(r["cpu_s"]) - 1)
    ratios = [x / y for x, y in zip(rec["llmgym"]["cpu_s"][1:], rec["trl"]["cpu_s"][1:])]
    wall = [x / y for x, y in zip(rec["llmgym"]["step_s"][1:], rec["trl"]["step_s"][1:])]
    out["cpu_ratio_min_median"] = [round(min(ratios), 3), round(statistics.median(ratios), 3)]
    out["wall_ratio_min_median"] = [round(min(wall), 3), round(statistics.median(wall), 3)]
    return out


def side_update_memory(a) -> dict:
    """One GRPO update (no generation) on a fixed random batch of MEMORY_SHAPE; peak memory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmgym import Task
    from llmgym.agents import GRPO
    from llmgym.rollout.episodes import Batch, Episode
    from llmgym.runtime.models import build_tokenizer

    s = {**MEMORY_SHAPE, "rows": a.rows}
    if a.device == "cpu" and a.mem_cap_gib:  # fail with MemoryError rather than starve a shared machine
        cap = int(a.mem_cap_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=s["vocab"], hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, intermediate_size=128, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(cfg).to(a.device)
    tok = build_tokenizer()
    g = torch.Generator().manual_seed(1)
    episodes = []
    for i in range(s["rows"]):
        ids = torch.randint(3, s["vocab"], (s["prompt"] + s["completion"],), generator=g).tolist()
        rewards = [0.0] * len(ids)
        rewards[-1] = float(i % 3)
        episodes.append(Episode(Task(f"t{i // 8}"), i // 8, ids, [0] * s["prompt"] + [1] * s["completion"],
                                [0.0] * len(ids), rewards, s["prompt"], ["length"]))
    batch = Batch.from_episodes(episodes, 0)
    agent = GRPO(model, tok, group_size=8, kl_coef=0.0, max_new_tokens=s["completion"], lr=1e-4,
                 logits_chunk_size=None if a.chunk < 0 else a.chunk, precision=a.precision, micro_batch_size=a.micro)
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    before = _peak()
    _sync(a.device)
    t0 = time.perf_counter()
    try:
        agent.update(batch)
    except (MemoryError, RuntimeError) as err:
        if a.device == "cpu" and a.mem_cap_gib and ("memory" in str(err).lower() or isinstance(err, MemoryError)):
            return {"error": f"needs more than the {a.mem_cap_gib} GiB address-space cap ({type(err).__name__})",
                    "rows": s["rows"]}
        raise
    _sync(a.device)
    return {"rows": s["rows"], "update_s": time.perf_counter() - t0, "before_update": before,
            "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2)}


def run_side(a) -> None:
    import torch

    torch.set_num_threads(a.threads)
    fn = {"llmgym": side_llmgym, "trl": side_trl, "pair": side_pair, "update-memory": side_update_memory}[a.side]
    result = fn(a)
    final = _peak()
    first = result.get("after_first_step") or {}
    if "peak_gpu_mib" in final and "peak_gpu_mib" in first:  # the counter was reset after step 1
        final["peak_gpu_mib_steady"] = final["peak_gpu_mib"]
        final["peak_gpu_mib"] = max(final["peak_gpu_mib"], first["peak_gpu_mib"])
    result.update(final)
    print("RESULT " + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------------------------
# the driver
# ---------------------------------------------------------------------------------------------


def _spawn(args: list[str], timeout: int) -> dict:
    cmd = [sys.executable, __file__, *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-6:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}


def _median_after_warmup(times: list[float]) -> float:
    return statistics.median(times[1:] if len(times) > 1 else times)


def settled(times: list[float]) -> dict:
    """The median of the second half of the steps, and whether the last three agree within 25 %."""
    half = times[len(times) // 2:] or times
    last = times[-3:]
    return {"settled_step_s": round(statistics.median(half), 4), "steps_run": len(times),
            "settled": len(times) >= 4 and max(last) <= 1.25 * min(last)}


def build_model_dir(name: str, root: Path) -> Path:
    """Save model ``name`` (random weights, seed 0) under ``root``; with ``LLMGYM_BENCH_MODEL_CACHE``
    set, under that directory instead, reusing a model saved there before (the GPU preset's sections
    share one 2 GB Qwen2-0.5B directory instead of writing it three times)."""
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer, save_pretrained

    import torch

    if os.environ.get("LLMGYM_BENCH_MODEL_CACHE"):
        smoke = "-smoke" if MODELS[name] is None and os.environ.get("LLMGYM_BENCH_SMOKE") == "1" else ""
        root = Path(os.environ["LLMGYM_BENCH_MODEL_CACHE"]) / f"{name}{smoke}"
        if (root / name / "config.json").exists():
            return root / name

    tok = build_tokenizer()
    torch.manual_seed(0)
    if MODELS[name] is None or "qwen2" in MODELS[name]:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        sys.path.insert(0, str(ROOT / "benchmarks"))
        from gpu_check import QWEN2_05B

        shape = dict(QWEN2_05B)
        if MODELS[name] is not None:
            shape.update(MODELS[name]["qwen2"])
        elif os.environ.get("LLMGYM_BENCH_SMOKE") == "1":  # check this path's code on a CPU (numbers meaningless)
            shape.update(SMOKE_SHAPE)
        model = Qwen2ForCausalLM(Qwen2Config(**shape, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                             pad_token_id=tok.pad_token_id))
    else:
        model = build_tiny_model(tok, TinyModelConfig(**MODELS[name]))
    path = root / name
    save_pretrained(model, tok, path)
    return path


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--side", choices=["llmgym", "trl", "pair", "update-memory"], help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--chunk", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--micro-batch-size", "--micro", dest="micro", type=int, default=None,
                   help="rows per forward/backward on both sides (default: the whole batch; see same_work)")
    p.add_argument("--side-seconds", type=float, default=0.0,
                   help="stop a side after this many seconds of steps (at least 2 steps; 0 = run --steps)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="cProfile the steps after the first; report each side's top N functions")
    p.add_argument("--rows", type=int, default=MEMORY_SHAPE["rows"], help="rows of the memory table's update (default 32)")
    p.add_argument("--mem-cap-gib", type=float, default=14.0,
                   help="CPU: address-space cap of each memory-table process (0 = none)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--models", default="tiny,10m", help="comma-separated: " + ",".join(MODELS))
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--steps", type=int, default=5, help="steps per side; the first is warm-up")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or (os.cpu_count() or 1))
    p.add_argument("--precision", default=None, help="llmgym precision (TRL: bf16=True iff bf16-mixed); default: per device")
    p.add_argument("--checkpointing", action="store_true", help="gradient checkpointing on both sides")
    p.add_argument("--engine-decode", default=None, choices=["eager", "static", "compiled"],
                   help="HFEngine decoding (default: resolve_device_defaults: static on CPU, the fastest GPU-verified mode on GPU)")
    p.add_argument("--interleaved", action="store_true",
                   help="CPU step ratio: both sides in one process, one llmgym step after each TRL step (load falls "
                        "on both alike); prints the per-step CPU ratio (min/median), tokens per row, and with "
                        "--profile N each side's split of a step")
    p.add_argument("--no-trl", action="store_true")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--timeout", type=int, default=900, help="seconds per side process (model loading included)")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    from llmgym.agents.learner import resolve_device_defaults

    defaults = resolve_device_defaults(a.device, a.precision, a.engine_decode)
    a.precision, a.engine_decode = defaults["precision"], defaults["engine_decode"]
    if a.side:
        run_side(a)
        return {}

    import platform

    import torch

    report = {"machine": {"cpu_count": os.cpu_count(), "load_avg_1_5_15": os.getloadavg(), "python": platform.python_version(),
                          "torch": torch.__version__, "device": a.device, "threads": a.threads,
                          "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else None},
              "config": {"tasks": a.tasks, "group": a.group, "new_tokens": a.new_tokens, "steps": a.steps,
                         "side_seconds": a.side_seconds, "precision": a.precision, "checkpointing": a.checkpointing,
                         "engine_decode": a.engine_decode, "micro_batch_size": a.micro},
              "same_work": same_work(a), "step": {}, "memory": {}}
    common = ["--device", a.device, "--tasks", str(a.tasks), "--group", str(a.group), "--new-tokens", str(a.new_tokens),
              "--steps", str(a.steps), "--threads", str(a.threads), "--precision", a.precision,
              "--engine-decode", a.engine_decode, "--side-seconds", str(a.side_seconds), "--profile", str(a.profile)]
    common += (["--checkpointing"] if a.checkpointing else []) + (["--micro-batch-size", str(a.micro)] if a.micro else [])
    with tempfile.TemporaryDirectory(prefix="llmgym-bench-") as tmp:
        for name in [m for m in a.models.split(",") if m]:
            model_dir = build_model_dir(name, Path(tmp))
            if a.interleaved:
                print(f"== {name}: llmgym and TRL interleaved in one process", flush=True)
                r = _spawn(["--side", "pair", "--model-dir", str(model_dir), *common], a.timeout)
                report["step"][name] = r
                print("   " + json.dumps({k: v for k, v in r.items() if "ratio" in k or k in ("error", "load_avg")}))
                for side in ("llmgym", "trl"):
                    if side in r:
                        print(f"   {side}: " + json.dumps({k: v for k, v in r[side].items()
                                                          if k in ("median_cpu_s", "median_step_s", "tokens_per_row",
                                                                   "split_cpu_s_per_step")}), flush=True)
                continue
            row = {}
            for side in ["llmgym"] + ([] if a.no_trl else ["trl"]):
                print(f"== {name}: {side}", flush=True)
                r = _spawn(["--side", side, "--model-dir", str(model_dir), *common], a.timeout)
                if "step_s" in r:
                    r["median_step_s"] = round(_median_after_warmup(r["step_s"]), 4)
                    r["median_cpu_s"] = round(_median_after_warmup(r["cpu_s"]), 4)
                    r.update(settled(r["step_s"]))
                row[side] = r
                shown = ("median_step_s", "settled_step_s", "steps_run", "median_cpu_s", "peak_rss_mib", "peak_gpu_mib",
                         "peak_gpu_mib_steady", "error")
                print("   " + json.dumps({k: v for k, v in r.items() if k in shown}), flush=True)
            if "median_step_s" in row.get("llmgym", {}) and "median_step_s" in row.get("trl", {}):
                row["step_ratio_llmgym_over_trl"] = round(row["llmgym"]["median_step_s"] / row["trl"]["median_step_s"], 3)
                # CPU seconds of the process: less sensitive than wall time to other jobs on a shared host
                row["cpu_ratio_llmgym_over_trl"] = round(row["llmgym"]["median_cpu_s"] / row["trl"]["median_cpu_s"], 3)
                row["settled_step_ratio_llmgym_over_trl"] = round(
                    row["llmgym"]["settled_step_s"] / row["trl"]["settled_step_s"], 3)
                key = "peak_gpu_mib" if a.device == "cuda" else "peak_rss_mib"
                row["memory_ratio_llmgym_over_trl"] = round(row["llmgym"][key] / row["trl"][key], 3)
                if "peak_gpu_mib_steady" in row["llmgym"] and "peak_gpu_mib_steady" in row["trl"]:
                    row["steady_memory_ratio_llmgym_over_trl"] = round(
                        row["llmgym"]["peak_gpu_mib_steady"] / row["trl"]["peak_gpu_mib_steady"], 3)
            report["step"][name] = row
    if not a.no_memory:
        for label, chunk in (("chunked", -1), ("full_logits", 0)):
            print(f"== update memory: {label}", flush=True)
            r = _spawn(["--side", "update-memory", "--chunk", str(chunk), "--device", a.device, "--rows", str(a.rows),
                        "--mem-cap-gib", str(a.mem_cap_gib), "--threads", str(a.threads), "--precision", a.precision],
                       a.timeout)
            report["memory"][label] = r
            print("   " + json.dumps({k: v for k, v in r.items() if k in ("update_s", "peak_rss_mib", "peak_gpu_mib", "error")}), flush=True)
        m = report["memory"]
        key = "peak_gpu_mib" if a.device == "cuda" else "peak_rss_mib"
        if key in m.get("chunked", {}) and key in m.get("full_logits", {}):
            m["ratio_chunked_over_full"] = round(m["chunked"][key] / m["full_logits"][key], 3)
    report["machine"]["load_avg_after"] = os.getloadavg()
    print(json.dumps({"step": {k: {kk: vv for kk, vv in v.items() if "ratio" in kk} for k, v in report["step"].items()},
                      "memory_ratio": report["memory"].get("ratio_chunked_over_full")}, indent=1))
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
