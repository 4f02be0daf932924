"""One-shot GPU check: engine contract tests on the GPU, generation throughput, one GRPO step; JSON out.

Run on a machine with an NVIDIA GPU, from the repository root::

    bash benchmarks/gpu_check.sh                 # = python benchmarks/gpu_check.py
    python benchmarks/gpu_check.py --out results.json --quick

Sections (each timed; a failure is recorded and the next section still runs; the JSON is rewritten
after every section so a killed run keeps what it measured):

1. ``environment``: torch/CUDA/GPU, transformers and (if importable) vLLM versions.
2. ``contract_tests``: ``pytest tests/engines/test_engine_contract.py`` — the HF engine on the GPU
   (``hf-cuda``) and, where ``import vllm`` works, ``VLLMEngine``; the CPU variant runs too.
3. ``hf_generation``: tokens/s of :class:`~llmgym.engines.HFEngine` for a real-architecture model
   with random weights — a Qwen2-0.5B-shaped config (hidden 896, 24 layers, 14 heads, 2 KV heads,
   FFN 4864, vocab 151,936; bf16), built locally, nothing downloaded — on random prompt ids.
4. ``vllm_generation`` (only where vLLM imports): the same with ``VLLMEngine`` (dummy load + weight
   sync from the HF model), plus the time of ``sync_weights`` and of a sleep/wake cycle.
5. ``grpo_step``: one GRPO step (rollout + update) on that model with the HF engine (and with
   vLLM where available), on ``llmgym/Copy-v0`` with llmgym's byte tokenizer (its 259 ids are a
   subset of the model's vocabulary; sampled ids outside it decode to nothing). The agent uses the
   GPU defaults of ``llmgym.agents.learner.resolve_device_defaults`` (fp32 weights, bf16 autocast,
   compiled static-cache engine).
6. ``engine_compare``: ``model.generate`` (dynamic cache; static cache compiled) vs ``HFEngine``
   eager / static / compiled on the same model and prompts (``benchmarks/engine_speed.py``).
7. ``update_memory``: peak ``torch.cuda.max_memory_allocated`` of one GRPO update at N = 32 rows,
   prompt 32 + completion 128, on that model: chunked log-probs vs full logits.
8. ``grpo_vs_trl`` (only where ``import trl`` works): ``benchmarks/grpo_vs_trl.py --device cuda``
   on that model — llmgym vs TRL ``GRPOTrainer``, each side in a fresh process, step time and peak
   GPU memory, bf16 autocast and gradient checkpointing on both sides.

``--preset vs-trl`` runs issue 23's measurements instead, in priority order within ``--budget-s``
(default 330 s; a section with no time left is recorded as skipped): the engine tests (contract +
static decoding), ``memory_timeline_128`` (``benchmarks/memory_timeline.py --side both``: one step
of llmgym and of TRL phase by phase, allocator snapshot of each, then 6 timed steps per side in the
same warm process: the 128-token step ratio), ``engine_steps`` (ms per decoding step vs
``model.generate``'s compiled static cache and the bandwidth bound), ``memory_timeline_128_ckpt``,
``learner_exactness`` (the fused LM head and the shared-prefix forward against full logits on this
device, float32 and bf16), ``memory_timeline_512`` (the timeline at 512 tokens, then 4 timed steps
per side) and
``grpo_vs_trl_512`` (fresh processes until both step times settle; it needs ~150 s or more, so it
usually gets a run of its own: ``--preset vs-trl --only grpo_vs_trl_512``).

The run ends with a compact summary of the headline numbers. ``--quick`` (``bash
benchmarks/gpu_check.sh --quick``) shrinks every section (~2 minutes on one GPU).

Without a CUDA GPU it prints that it needs one and exits 0 without running anything.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # gpu_verdicts, sampler_speed, engine_speed
from gpu_verdicts import decode_verdicts, run_identity  # noqa: E402

try:  # installed (pip install -e .): llmgym.agents / llmgym.envs resolve through the package-dir mapping
    import llmgym.agents  # noqa: F401
except ImportError:  # a bare source tree (the lent GPU machine installs nothing): map agents/ and envs/ by hand
    import llmgym

    llmgym.__path__.append(str(ROOT))

DEVICE = "cuda"
QWEN2_05B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864, "vocab_size": 151936, "max_position_embeddings": 4096,
             "rope_theta": 1_000_000.0, "tie_word_embeddings": True}


class BigVocabTokenizer:
    """llmgym's byte tokenizer in front of a model with a larger vocabulary.

    Encoding is the byte tokenizer's (ids < 259); ``len()`` is the model's vocabulary (so envs accept
    every id the model can sample); decoding drops ids the byte tokenizer does not have.
    """

    def __init__(self, base, vocab_size: int):
        self._base = base
        self._vocab_size = vocab_size

    def __getattr__(self, name):
        return getattr(self._base, name)

    def __len__(self):
        return self._vocab_size

    def __call__(self, *args, **kwargs):
        return self._base(*args, **kwargs)

    def decode(self, ids, **kwargs):
        n = len(self._base)
        return self._base.decode([int(i) for i in ids if 0 <= int(i) < n], **kwargs)

    def batch_decode(self, rows, **kwargs):
        return [self.decode(r, **kwargs) for r in rows]


def _sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def build_qwen2(device: str | None = None, dtype=None, eos_token_id: int = 2, pad_token_id: int = 0):
    import torch

    device = device or DEVICE
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**QWEN2_05B, bos_token_id=1, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model = model.to(dtype or (torch.bfloat16 if device == "cuda" else torch.float32))
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = pad_token_id
    return model


class Report:
    def __init__(self, path: Path):
        self.path = path
        self.data: dict = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sections": {}}

    def run(self, name: str, fn, *args, **kwargs):
        print(f"== {name}", flush=True)
        started = time.perf_counter()
        try:
            result = {"ok": True, **(fn(*args, **kwargs) or {})}
        except Exception as err:  # noqa: BLE001 - record and go on to the next section
            result = {"ok": False, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
        result["section_s"] = round(time.perf_counter() - started, 2)
        self.data["sections"][name] = result
        self.save()
        summary = {k: v for k, v in result.items() if k not in ("traceback", "output_tail")}
        print(json.dumps(summary, indent=1, default=str)[:3000], flush=True)
        return result

    def save(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1, default=str))


def environment() -> dict:
    import torch
    import transformers

    props = torch.cuda.get_device_properties(0)
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "gpu": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1), "gpu_count": torch.cuda.device_count()}
    if importlib.util.find_spec("vllm") is not None:
        try:
            import vllm

            info["vllm"] = vllm.__version__
        except Exception as err:  # noqa: BLE001
            info["vllm_import_error"] = f"{type(err).__name__}: {err}"
    else:
        info["vllm"] = None
    for name in ("gymnasium", "trl", "datasets", "accelerate"):  # carried wheels (benchmarks/gpu_wheels.sh)
        try:
            info[name] = importlib.import_module(name).__version__
        except Exception as err:  # noqa: BLE001 - say what is missing, the sections that need it will fail
            info[name] = f"missing ({type(err).__name__}: {err})"[:200]
    return info


def contract_tests(timeout_s: int, extra: list[str] | None = None) -> dict:
    """``pytest -v`` on the engine contract (plus ``extra``); the outcome of every test that finished
    (``outcomes``: what the decoding modes are judged on, benchmarks/gpu_verdicts.py)."""
    from gpu_verdicts import pytest_outcomes

    cmd = [sys.executable, "-m", "pytest", "tests/engines/test_engine_contract.py", *(extra or []), "-v", "-rs",
           "-p", "no:cacheprovider", "-o", "addopts=", "-p", "no:xdist"]  # one process: outcomes read from -v lines
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False)
        out, returncode = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as err:  # what finished before the time-out still counts
        out = (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        out, returncode = out + f"\n[timed out after {timeout_s} s]", None
    lines = [ln for ln in out.splitlines() if ln.strip()]
    outcomes = pytest_outcomes(out)
    counts = {k: sum(v == k for v in outcomes.values()) for k in ("passed", "failed", "skipped")}
    return {"returncode": returncode, "summary": lines[-1] if lines else "", "counts": counts,
            "wall_s": round(time.perf_counter() - started, 2), "passed_all": returncode == 0,
            "outcomes": outcomes, "output_tail": out[-6000:]}


def sampler(vocab: int) -> dict:
    """The keyed sampler vs ``softmax + multinomial`` on this device (``benchmarks/sampler_speed.py``)."""
    from sampler_speed import run

    return run(DEVICE, batch=64, vocab=vocab, repeats=5, draws=200_000 if DEVICE == "cuda" else 20_000)


def _random_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=g).tolist()


def _throughput(engine, batches, prompt_len: int, new_tokens: int, vocab: int) -> dict:
    from llmgym.engines import SamplingParams

    rows = {}
    engine.generate(_random_prompts(2, prompt_len, vocab), SamplingParams(max_new_tokens=4, seed=0))  # warm-up
    for batch in batches:
        prompts = _random_prompts(batch, prompt_len, vocab, seed=batch)
        _sync()
        started = time.perf_counter()
        groups = engine.generate(prompts, SamplingParams(max_new_tokens=new_tokens, seed=1))
        _sync()
        elapsed = time.perf_counter() - started
        tokens = sum(len(c.token_ids) for g in groups for c in g)
        rows[f"batch_{batch}"] = {"new_tokens": tokens, "s": round(elapsed, 3), "tokens_per_s": round(tokens / elapsed, 1)}
    return rows


def hf_generation(batches, new_tokens: int) -> dict:
    import torch

    from llmgym.engines import HFEngine
    from llmgym.runtime.models import build_tokenizer

    model = build_qwen2()
    tok = BigVocabTokenizer(build_tokenizer(), QWEN2_05B["vocab_size"])
    engine = HFEngine(model, tok, max_batch_size=max(batches))
    params = sum(p.numel() for p in model.parameters())
    result = {"model": f"Qwen2-shaped {QWEN2_05B}, random weights, {next(model.parameters()).dtype}", "params_m": round(params / 1e6, 1),
              "prompt_len": 64, "max_new_tokens": new_tokens,
              **_throughput(engine, batches, 64, new_tokens, QWEN2_05B["vocab_size"])}
    if DEVICE == "cuda":
        result["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        torch.cuda.empty_cache()
    del engine, model
    return result


def vllm_generation(batches, new_tokens: int) -> dict:
    import torch

    from llmgym.engines.vllm import VLLMEngine
    from llmgym.runtime.models import build_tokenizer

    model = build_qwen2()
    tok = build_tokenizer()
    started = time.perf_counter()
    engine = VLLMEngine(model, tok, gpu_memory_utilization=0.4, max_model_len=1024)
    result = {"startup_s": round(time.perf_counter() - started, 2)}
    result.update(_throughput(engine, batches, 64, new_tokens, QWEN2_05B["vocab_size"]))
    _sync()
    started = time.perf_counter()
    engine.sync_weights(model)
    _sync()
    result["sync_weights_s"] = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    engine.sleep()
    result["sleep_s"] = round(time.perf_counter() - started, 3)
    result["mem_gib_asleep"] = round(torch.cuda.memory_reserved() / 2**30, 2)
    started = time.perf_counter()
    engine.wake_up()
    result["wake_s"] = round(time.perf_counter() - started, 3)
    engine.close()
    del model
    torch.cuda.empty_cache()
    return result


def grpo_step(engine_kind: str, tasks: int, group: int, new_tokens: int) -> dict:
    import gymnasium
    import torch

    import llmgym  # noqa: F401
    from llmgym.agents import GRPO
    from llmgym.runtime.models import build_tokenizer

    base = build_tokenizer()
    tok = BigVocabTokenizer(base, QWEN2_05B["vocab_size"])
    model = build_qwen2(eos_token_id=base.eos_token_id, pad_token_id=base.pad_token_id)
    engine = None
    if engine_kind == "vllm":
        from llmgym.engines.vllm import VLLMEngine

        engine = VLLMEngine(model, base, gpu_memory_utilization=0.3, max_model_len=1024, sleep_after_generate=True)
    from llmgym.agents.learner import resolve_device_defaults

    defaults = resolve_device_defaults(DEVICE)
    model = model.float()  # fp32 master weights; the forward runs under bf16 autocast (resolve_device_defaults)
    agent = GRPO(model, tok, engine=engine, tasks_per_step=tasks, group_size=group, max_new_tokens=new_tokens,
                 kl_coef=0.0, lr=1e-6, tis="token" if engine_kind == "vllm" else None,
                 precision=defaults["precision"], engine_decode=defaults["engine_decode"])
    env = gymnasium.make("llmgym/Copy-v0", tokenizer=tok)
    rows = []
    for _ in range(3):  # the first step includes warm-up (CUDA kernels, allocator, compilation)
        _sync()
        t0 = time.perf_counter()
        batch = agent.collect(env)
        _sync()
        t1 = time.perf_counter()
        metrics = agent.update(batch)
        _sync()
        t2 = time.perf_counter()
        rows.append({"rollout_s": round(t1 - t0, 3), "update_s": round(t2 - t1, 3), "step_s": round(t2 - t0, 3),
                     "completions": len(batch), "policy_tokens": batch.num_tokens,
                     **{k: round(v, 5) for k, v in metrics.items() if k.startswith(("loss", "tis_"))}})
    result = {"engine": engine_kind, "tasks_per_step": tasks, "group_size": group, "max_new_tokens": new_tokens,
              "precision": agent.config.precision, "engine_decode": agent.config.engine_decode, "steps": rows}
    if DEVICE == "cuda":
        result["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if engine is not None:
        engine.close()
    del agent, model
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return result


def engine_compare(batch: int, new_tokens: int) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import engine_speed

    engine_speed.QWEN2_05B.update(QWEN2_05B)  # the --cpu-smoke shape when shrunk
    return engine_speed.run(DEVICE, qwen2=True, batch=batch, prompt_len=32, new_tokens=new_tokens, repeats=2,
                            compile_=DEVICE == "cuda")  # CPU compilation (--cpu-smoke) takes minutes


def update_memory(rows: int = 32, prompt: int = 32, completion: int = 128) -> dict:
    """Peak memory of one GRPO update (no generation) on the Qwen2 shape: chunked vs full logits."""
    import torch

    from llmgym import Task
    from llmgym.agents import GRPO
    from llmgym.rollout.episodes import Batch, Episode
    from llmgym.runtime.models import build_tokenizer

    vocab = QWEN2_05B["vocab_size"]
    g = torch.Generator().manual_seed(1)
    episodes = []
    for i in range(rows):
        ids = torch.randint(3, vocab, (prompt + completion,), generator=g).tolist()
        rewards = [0.0] * len(ids)
        rewards[-1] = float(i % 3)
        episodes.append(Episode(Task(f"t{i // 8}"), i // 8, ids, [0] * prompt + [1] * completion,
                                [0.0] * len(ids), rewards, prompt, ["length"]))
    batch = Batch.from_episodes(episodes, 0)
    result = {"rows": rows, "prompt": prompt, "completion": completion, "vocab": vocab, "precision": "bf16-mixed"}
    for label, chunk in (("chunked", None), ("full_logits", 0)):
        model = build_qwen2(dtype=torch.float32)
        agent = GRPO(model, build_tokenizer(), group_size=8, kl_coef=0.0, max_new_tokens=completion, lr=1e-6,
                     logits_chunk_size=chunk, precision="bf16-mixed")
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        _sync()
        t0 = time.perf_counter()
        agent.update(batch)
        _sync()
        row = {"update_s": round(time.perf_counter() - t0, 3)}
        if DEVICE == "cuda":
            row.update(peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2),
                       weights_gib=round(before / 2**30, 2))
        result[label] = row
        del agent, model
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    if "peak_gib" in result["chunked"]:
        result["ratio_chunked_over_full"] = round(result["chunked"]["peak_gib"] / result["full_logits"]["peak_gib"], 3)
    return result


def grpo_vs_trl(steps: int, new_tokens: int, timeout_s: int) -> dict:
    if importlib.util.find_spec("trl") is None:
        print("grpo_vs_trl: TRL is not installed on this machine: skipped (carry the trl + datasets wheels)")
        return {"skipped": "trl not installed"}
    out = Path(os.environ.get("OUT") or ROOT / "benchmarks") / "grpo_vs_trl.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "grpo_vs_trl.py"), "--device", DEVICE, "--models", "qwen2-0.5b",
           "--steps", str(steps), "--new-tokens", str(new_tokens), "--checkpointing", "--no-memory",
           "--timeout", str(timeout_s), "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=2 * timeout_s + 60, check=False)
    if not out.exists():
        raise RuntimeError(f"grpo_vs_trl.py wrote no result (exit {proc.returncode}): {(proc.stdout + proc.stderr)[-1500:]}")
    data = json.loads(out.read_text())
    row = data["step"].get("qwen2-0.5b", {})
    return {"llmgym": {k: row.get("llmgym", {}).get(k) for k in ("median_step_s", "peak_gpu_mib", "error")},
            "trl": {k: row.get("trl", {}).get(k) for k in ("median_step_s", "peak_gpu_mib", "error")},
            "step_ratio_llmgym_over_trl": row.get("step_ratio_llmgym_over_trl"),
            "memory_ratio_llmgym_over_trl": row.get("memory_ratio_llmgym_over_trl"), "json": str(out)}


# ---------------------------------------------------------------------------------------------
# --preset vs-trl (issue 23): memory timelines, the 512-token side by side, decoding steps
# ---------------------------------------------------------------------------------------------


def _bench(script: str, args: list[str], out_name: str, timeout_s: float) -> dict:
    """Run ``benchmarks/<script>`` in a fresh process with ``--json $OUT/<out_name>``; its JSON."""
    out = _out_dir() / out_name
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), *args, "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "LLMGYM_BENCH_MODEL_CACHE": os.environ.get("LLMGYM_BENCH_MODEL_CACHE", "/tmp/llmgym-bench-models")}
    if DEVICE == "cpu":
        env["LLMGYM_BENCH_SMOKE"] = "1"  # the qwen2-0.5b model dir shrinks to the smoke shape
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(10, timeout_s), env=env,
                              check=False)
        tail = (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as err:
        tail = f"timed out after {timeout_s:.0f} s: " + str(err.stdout or "")[-2000:]
    if not out.exists():
        raise RuntimeError(f"{script} wrote no result: {tail}")
    return {"json": str(out), "wall_s": round(time.perf_counter() - started, 1), "data": json.loads(out.read_text()),
            "output_tail": tail}


OUT_DIR: Path | None = None  # the directory of --out (set by main); the sections' JSON files go there


def _out_dir() -> Path:
    return OUT_DIR or Path(os.environ.get("OUT") or ROOT / "benchmarks")


def memory_timelines(new_tokens: int, checkpointing: bool, snapshot: bool, timeout_s: float,
                     time_steps: int | None = None) -> dict:
    """``benchmarks/memory_timeline.py --side both``: one step of each trainer, phase by phase; then each
    side times ``time_steps`` more steps in the same process (the settled step time side by side,
    without a second cold start of either trainer). Default: 6 steps at 128 tokens, 4 at 512 (and at
    the CPU smoke's token counts), none with checkpointing (the step ratio is measured without it)."""
    if time_steps is None:
        time_steps = 0 if checkpointing else (4 if new_tokens >= 512 or new_tokens == 16 else 6)
    tag = f"{new_tokens}{'_ckpt' if checkpointing else ''}"
    args = ["--side", "both", "--device", DEVICE, "--model", "qwen2-0.5b", "--new-tokens", str(new_tokens),
            "--timeout", str(int(timeout_s / 2))]
    args += (["--checkpointing"] if checkpointing else [])
    if time_steps:  # on CPU (--cpu-smoke) the code path runs; the figures mean nothing there
        args += ["--time-steps", str(time_steps if DEVICE == "cuda" else 2)]
    if snapshot and DEVICE == "cuda":
        args += ["--snapshot", str(_out_dir() / f"snapshot_{tag}.pickle")]
    if DEVICE == "cpu":
        args += ["--engine-decode", "static", "--threads", "1"]
    r = _bench("memory_timeline.py", args, f"memory_timeline_{tag}.json", timeout_s)
    data = r.pop("data")
    out = {"json": r["json"], "wall_s": r["wall_s"]}
    for side in ("llmgym", "trl"):
        d = data.get(side, {})
        out[side] = {"error": d.get("error"), "terms": d.get("terms"), "kept": d.get("kept"),
                     "cuda_graph_pools": d.get("cuda_graph_pools"), "timed_steps": d.get("timed_steps")}
    out["compare"] = data.get("compare")
    if any(out[s]["error"] for s in ("llmgym", "trl")):
        out["output_tail"] = r["output_tail"]
    return out


def learner_exactness() -> dict:
    """On this device: the fused LM head (vocabulary tiles, its own backward) against full logits, and the
    shared-prefix forward against one pass, log-probs and gradients, float32 and bf16 autocast — the CPU
    tests of tests/agents/test_learner.py, on the device's kernels. A Qwen2 body with the 151,936 vocabulary,
    4 prompts × 8 completions of 48 tokens, small tiles so several are exercised."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from llmgym.agents.learner import token_logprobs_and_entropy

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=256, vocab_size=QWEN2_05B["vocab_size"], tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg).to(DEVICE).train()
    g = torch.Generator().manual_seed(1)
    rows = [(p, torch.randint(3, cfg.vocab_size, (30,), generator=g)) for p in range(4) for _ in range(8)]
    prompts = [torch.randint(3, cfg.vocab_size, (18 + 3 * p,), generator=g) for p in range(4)]
    seqs = [torch.cat([prompts[p], c[:48 - 18 - 3 * p + 5 * (i % 3)]]) for i, (p, c) in enumerate(rows)]
    width = max(len(x) for x in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros(len(seqs), width - 1)
    for i, (x, (p, _)) in enumerate(zip(seqs, rows)):
        ids[i, :len(x)], attn[i, :len(x)] = x, 1
        mask[i, 18 + 3 * p - 1:len(x) - 1] = 1
    ids, attn, mask = ids.to(DEVICE), attn.to(DEVICE), mask.to(DEVICE)
    weights = torch.linspace(-1, 1, width - 1, device=DEVICE)

    def run(chunk, share, mixed):
        model.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=mixed, cache_enabled=False):
            lp, ent, _ = token_logprobs_and_entropy(model, ids, attn, mask=mask, chunk_size=chunk, share_prefixes=share)
        ((lp * weights).sum() + 0.1 * ent.sum()).backward()
        grads = torch.cat([p.grad.float().flatten() for p in model.parameters()])
        return lp.detach().float(), ent.detach().float(), grads

    out: dict = {}
    for mixed in (False, True):
        ref = run(0, False, mixed)  # full logits, one pass
        for name, chunk, share in (("fused_head", 256, False), ("fused_head_shared_prefix", 256, True)):  # 3 tiles
            got = run(chunk, share, mixed)
            lp_gap = float((got[0] - ref[0]).abs().max())
            ent_gap = float((got[1] - ref[1]).abs().max())
            grad_rel = float((got[2] - ref[2]).norm() / ref[2].norm())
            tol = (5e-2, 2e-2) if mixed else (1e-4, 1e-4)
            out[f"{name}_{'bf16' if mixed else 'fp32'}"] = {
                "logprob_gap": lp_gap, "entropy_gap": ent_gap, "grad_rel_error": grad_rel, "finite": bool(torch.isfinite(got[0]).all()),
                "passed": bool(torch.isfinite(got[0]).all()) and max(lp_gap, ent_gap) < tol[0] and grad_rel < tol[1]}
    out["passed_all"] = all(v["passed"] for v in out.values() if isinstance(v, dict))
    if not out["passed_all"]:
        raise RuntimeError(f"the learner's chunked head or shared-prefix forward differs from full logits here: {out}")
    return out


def grpo_vs_trl_settled(new_tokens: int, side_seconds: float, timeout_s: float) -> dict:
    """``grpo_vs_trl.py`` until each side's step time settles (or ``side_seconds`` run out)."""
    args = ["--device", DEVICE, "--models", "qwen2-0.5b", "--new-tokens", str(new_tokens), "--steps", "40",
            "--side-seconds", str(side_seconds), "--no-memory", "--timeout", str(int(timeout_s / 2))]
    if DEVICE == "cpu":
        args += ["--engine-decode", "static", "--threads", "1"]
    r = _bench("grpo_vs_trl.py", args, f"grpo_vs_trl_{new_tokens}.json", timeout_s)
    row = r.pop("data")["step"].get("qwen2-0.5b", {})
    keys = ("settled_step_s", "settled", "steps_run", "median_step_s", "peak_gpu_mib", "peak_gpu_mib_steady",
            "peak_rss_mib", "error")
    out = {side: {k: row.get(side, {}).get(k) for k in keys} for side in ("llmgym", "trl")}
    out["llmgym"]["step_s"] = [round(x, 3) for x in row.get("llmgym", {}).get("step_s", [])]
    out["llmgym"]["rollout_s"] = [round(x, 3) for x in row.get("llmgym", {}).get("rollout_s", [])]
    out["trl"]["step_s"] = [round(x, 3) for x in row.get("trl", {}).get("step_s", [])]
    out.update({k: v for k, v in row.items() if "ratio" in k}, json=r["json"], wall_s=r["wall_s"])
    if out["llmgym"]["error"] or out["trl"]["error"]:
        out["output_tail"] = r["output_tail"]
    return out


def _copy_bandwidth() -> float:
    """Device memory bandwidth in bytes/s, from timing copies of a 1 GiB buffer (read + write)."""
    import torch

    n = 2**30 if DEVICE == "cuda" else 2**26
    x = torch.empty(n, dtype=torch.uint8, device=DEVICE)
    y = torch.empty_like(x)
    y.copy_(x)
    _sync()
    t0 = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    _sync()
    return 2 * n * 10 / (time.perf_counter() - t0)


def engine_steps(**kw) -> dict:
    import gc

    import torch

    try:
        return _engine_steps(**kw)
    finally:  # the section's model and compiled graphs go before the next (subprocess) sections
        gc.collect()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


def _engine_steps(batch: int = 32, prompt_len: int = 32, new_tokens: int = 128, short: int = 8) -> dict:
    """Milliseconds per decoding step (best of 3), prefill excluded (``(t(new_tokens) - t(short)) / (new_tokens - short)``):
    ``HFEngine`` compiled (GPU only) and static, the first with the sparse done check undone (a host
    sync on "all done?" every step), ``model.generate`` with a compiled static cache, and the bound
    set by reading the weights and the KV cache once per step. Also how many rows the compiled and
    static engines sample alike from the same keys (bf16 kernels differ, so not all need to)."""
    import torch

    from llmgym.engines import HFEngine, SamplingParams

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from engine_speed import _NoEosTokenizer

    model = build_qwen2().eval()
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, cfg.vocab_size, (batch, prompt_len), generator=g)
    decodes = ("compiled", "static") if DEVICE == "cuda" else ("static",)  # CPU compilation takes minutes
    engines = {d: HFEngine(model, _NoEosTokenizer(), max_batch_size=batch, decode=d) for d in decodes}
    for e in engines.values():
        e.eos_ids = [-1]  # every row runs the whole budget
    engine = engines[decodes[0]]

    def timed(fn, repeats=3):
        times = []
        for _ in range(repeats):
            _sync()
            t0 = time.perf_counter()
            fn()
            _sync()
            times.append(time.perf_counter() - t0)
        return min(times)  # the run least disturbed by anything else on the machine

    def per_step(fn_of_tokens) -> float:
        fn_of_tokens(short)  # warm-up (compilation)
        fn_of_tokens(new_tokens)
        return (timed(lambda: fn_of_tokens(new_tokens)) - timed(lambda: fn_of_tokens(short))) / (new_tokens - short) * 1e3

    rows_list = prompts.tolist()
    hf_engine = lambda n: engine.generate(rows_list, SamplingParams(max_new_tokens=n, seed=1))  # noqa: E731
    rows: dict[str, float] = {}
    t0 = time.perf_counter()
    rows[f"HFEngine decode={decodes[0]}"] = per_step(hf_engine)
    warm = time.perf_counter() - t0
    samples = {d: [c.token_ids for g in e.generate(rows_list, SamplingParams(max_new_tokens=short, seed=2)) for c in g]
               for d, e in engines.items()}
    for d in decodes[1:]:
        rows[f"HFEngine decode={d}"] = per_step(
            lambda n, e=engines[d]: e.generate(rows_list, SamplingParams(max_new_tokens=n, seed=1)))
    engine.done_check_every = 1
    rows["HFEngine, host sync every step (before)"] = per_step(hf_engine)
    engine.done_check_every = None
    ids = prompts.to(DEVICE)

    def hf_generate(n):
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=n,
                           min_new_tokens=n, top_k=0, cache_implementation="static")

    rows["model.generate (static cache, compiled)"] = per_step(hf_generate)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * next(model.parameters()).element_size()
    kv = kv_per_token * batch * (prompt_len + new_tokens / 2)
    bandwidth = _copy_bandwidth()
    bound_ms = (weights + kv) / bandwidth * 1e3
    out = {"device": DEVICE, "dtype": str(next(model.parameters()).dtype), "batch": batch, "prompt_len": prompt_len,
           "new_tokens": new_tokens, "ms_per_step": {k: round(v, 3) for k, v in rows.items()},
           "weights_gib": round(weights / 2**30, 3), "kv_read_per_step_gib": round(kv / 2**30, 4),
           "copy_bandwidth_gb_s": round(bandwidth / 1e9, 1), "bandwidth_bound_ms": round(bound_ms, 3),
           "first_call_s": round(warm, 1),
           "rows_sampled_alike": {d: sum(a == b for a, b in zip(samples[d], samples[decodes[-1]]))
                                  for d in decodes[:-1]} | {"of": batch}}
    base = rows["model.generate (static cache, compiled)"]
    out["speed_vs_generate"] = {k: round(base / v, 3) for k, v in rows.items() if v > 0}
    out["times_the_bound"] = {k: round(v / bound_ms, 1) for k, v in rows.items()}
    return out


CUDA_TESTS = ["tests/engines/test_static_decode.py", "tests/engines/test_sampling.py", "-k", "not hf-cpu and not vllm"]
"""What ``contract_tests`` adds to the contract suite on a GPU: each decoding mode's CUDA variant, the
compiled step against the eager tokens, the sampler on CUDA (benchmarks/gpu_verdicts.py judges them)."""
SMOKE_TESTS = ["tests/engines/test_sampling.py", "-k", "hf-cuda or cuda_and_cpu or hashes_per_row"]
"""--cpu-smoke: the same machinery on a handful of tests (the CUDA ones skip)."""


def _vs_trl_sections(report: "Report", budget_s: float, cpu_smoke: bool) -> None:
    """The issue-23 preset, in priority order, within ``budget_s`` seconds (a section that cannot fit
    is recorded as skipped, so a second run with ``--only`` can pick it up)."""
    deadline = time.perf_counter() + budget_s
    tokens = (8, 16) if cpu_smoke else (128, 512)
    plan = [  # (name, minimum seconds it needs, share of what is left it may take, function of its time-out)
        # the decoding modes' verdicts: ~7 compilations of a tiny model for the compiled variants (est. 1-2 min;
        # a time-out fails every mode: rerun with --only contract_tests,sampler,engine_steps)
        ("contract_tests", 120, 0.4, lambda t: contract_tests(int(t), extra=SMOKE_TESTS if cpu_smoke else CUDA_TESTS)),
        ("sampler", 10, 0.1, lambda t: sampler(QWEN2_05B["vocab_size"])),
        ("memory_timeline_128", 70, 0.5, lambda t: memory_timelines(tokens[0], False, True, t)),
        ("engine_steps", 50, 1.0, lambda t: engine_steps(new_tokens=16 if cpu_smoke else 128)),
        ("memory_timeline_128_ckpt", 60, 0.6, lambda t: memory_timelines(tokens[0], True, False, t)),
        ("learner_exactness", 20, 0.2, lambda t: learner_exactness()),
        ("memory_timeline_512", 100, 0.8, lambda t: memory_timelines(tokens[1], False, False, t)),
        # TRL's first steps at 512 tokens take ~30 s, 20 s: with less than ~150 s it cannot settle, and
        # a second run (--only grpo_vs_trl_512) gets the whole budget
        ("grpo_vs_trl_512", 30 if cpu_smoke else 150, 1.0,
         lambda t: grpo_vs_trl_settled(tokens[1], 10 if cpu_smoke else t / 2 - 30, t)),
    ]
    for name, minimum, share, fn in plan:
        left = deadline - time.perf_counter()
        if left < minimum:
            report.data["sections"][name] = {"ok": True, "skipped": f"budget: {left:.0f} s left, needs ~{minimum} s"}
            report.save()
            continue
        report.run(name, fn, max(minimum, share * left))


def summary(data: dict) -> list[str]:
    """The headline numbers, one line each (a section that failed says so)."""
    sec = data["sections"]
    lines = []

    def get(name, *keys):
        node = sec.get(name, {})
        for k in keys:
            node = node.get(k, {}) if isinstance(node, dict) else {}
        return node if node != {} else None

    for name, v in sec.items():
        if not v.get("ok", True):
            lines.append(f"{name}: FAILED ({v.get('error', '')[:160]})")
    if "contract_tests" in sec:
        lines.append(f"contract tests: {get('contract_tests', 'summary')}")
    for mode, v in (data.get("decode_modes") or {}).items():
        failed = [k for k, ok in v["checks"].items() if not ok]
        lines.append(f"decode={mode}: {'PASSED' if v['passed'] else 'failed: ' + '; '.join(failed)}")
    sp = sec.get("sampler", {})
    if "speed" in sp:
        lines.append(f"sampler {sp['speed']['batch']}x{sp['speed']['vocab']}: {sp['speed']['median_s']} s; "
                     f"TV distance keyed {sp['exactness']['keyed']['tv_distance']} vs multinomial "
                     f"{sp['exactness']['multinomial']['tv_distance']}")
    rows = get("engine_compare", "rows") or {}
    for k, r in rows.items():
        if isinstance(r, dict):
            lines.append(f"engine {k}: {r.get('tokens_per_s', r.get('error'))} tok/s"
                         + (f" ({r['speed_vs_generate']}x generate)" if "speed_vs_generate" in r else "")
                         + (f", warm-up {r['warmup_s']} s" if "warmup_s" in r else ""))
    um = sec.get("update_memory", {})
    if "chunked" in um:
        lines.append(f"one update N=32, 32+128, bf16-mixed: peak {um['chunked'].get('peak_gib')} GiB chunked vs "
                     f"{um['full_logits'].get('peak_gib')} GiB full logits (ratio {um.get('ratio_chunked_over_full')})")
    for name in ("grpo_step_hf", "grpo_step_vllm"):
        steps = get(name, "steps")
        if steps:
            lines.append(f"{name}: step {[s['step_s'] for s in steps]} s (rollout {[s['rollout_s'] for s in steps]}), "
                         f"peak {sec[name].get('peak_mem_gib')} GiB")
    gt = sec.get("grpo_vs_trl", {})
    if "llmgym" in gt:
        lines.append(f"GRPO vs TRL: step {gt['llmgym'].get('median_step_s')} s vs {gt['trl'].get('median_step_s')} s "
                     f"(ratio {gt.get('step_ratio_llmgym_over_trl')}); peak {gt['llmgym'].get('peak_gpu_mib')} vs "
                     f"{gt['trl'].get('peak_gpu_mib')} MiB (ratio {gt.get('memory_ratio_llmgym_over_trl')})")
    elif gt.get("skipped"):
        lines.append(f"GRPO vs TRL: skipped ({gt['skipped']})")
    le = sec.get("learner_exactness", {})
    if "passed_all" in le:
        lines.append("learner exactness (fused head, shared prefixes vs full logits): "
                     + ", ".join(f"{k} {'ok' if v['passed'] else 'FAILED'} (log-prob gap {v['logprob_gap']:.2g}, "
                                 f"grad {v['grad_rel_error']:.2g})" for k, v in le.items() if isinstance(v, dict)))
    for name in ("memory_timeline_128", "memory_timeline_128_ckpt", "memory_timeline_512"):
        mt = sec.get(name, {})
        if mt.get("compare"):
            c = mt["compare"]
            lines.append(f"{name}: step peak llmgym {c['step_peak_mib']['llmgym']} vs TRL {c['step_peak_mib']['trl']} MiB "
                         f"(ratio {c['step_peak_ratio_llmgym_over_trl']}); activations "
                         f"{c['activations_per_micro_batch_mib']}; llmgym kept at start "
                         f"{(mt.get('llmgym') or {}).get('kept', {}).get('start')}")
            if "settled_step_s" in c:
                lines.append(f"{name}: settled step llmgym {c['settled_step_s']['llmgym']} s vs TRL "
                             f"{c['settled_step_s']['trl']} s (ratio {c['settled_step_ratio_llmgym_over_trl']}, settled "
                             f"{c['settled_step_s']['settled']}); peak over the timed steps ratio "
                             f"{c.get('timed_steps_peak_ratio_llmgym_over_trl')}")
        elif mt.get("skipped"):
            lines.append(f"{name}: skipped ({mt['skipped']})")
    g5 = sec.get("grpo_vs_trl_512", {})
    if "llmgym" in g5:
        lines.append(f"GRPO vs TRL 512 tokens: settled step {g5['llmgym'].get('settled_step_s')} s vs "
                     f"{g5['trl'].get('settled_step_s')} s (settled: {g5['llmgym'].get('settled')}/{g5['trl'].get('settled')}; "
                     f"ratio {g5.get('settled_step_ratio_llmgym_over_trl')}); peak {g5['llmgym'].get('peak_gpu_mib')} vs "
                     f"{g5['trl'].get('peak_gpu_mib')} MiB, steady {g5['llmgym'].get('peak_gpu_mib_steady')} vs "
                     f"{g5['trl'].get('peak_gpu_mib_steady')}")
    es = sec.get("engine_steps", {})
    if "ms_per_step" in es:
        lines.append(f"decoding ms/step (bound {es['bandwidth_bound_ms']}): {es['ms_per_step']}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="llmgym GPU check (see the module docstring)")
    default_out = Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else ROOT / "benchmarks" / "gpu_check.json"
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--quick", action="store_true", help="smaller batches and fewer tokens")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--only", metavar="S1,S2", help="run only these sections (e.g. grpo_step_hf,grpo_vs_trl)")
    parser.add_argument("--test-timeout", type=int, default=420)
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="check this script's code paths on CPU with a tiny Qwen2 shape (numbers meaningless)")
    parser.add_argument("--preset", choices=["all", "vs-trl"], default="all",
                        help="vs-trl: issue 23's memory timelines, 512-token side by side and decoding steps")
    parser.add_argument("--budget-s", type=float, default=330,
                        help="--preset vs-trl: seconds for all its sections (later ones are skipped when short)")
    args = parser.parse_args(argv)

    import torch

    global DEVICE, OUT_DIR
    OUT_DIR = args.out.parent
    if args.cpu_smoke:
        DEVICE = "cpu"
        QWEN2_05B.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=4096)
        args.quick, args.skip_tests = True, True
    elif not torch.cuda.is_available():
        print("benchmarks/gpu_check.py needs a CUDA GPU (torch.cuda.is_available() is False): nothing was run.")
        return 0
    batches = [1, 16] if args.quick else [1, 16, 64]
    new_tokens = 32 if args.quick else 128
    report = Report(args.out)
    if args.only:
        wanted = set(args.only.split(",")) | {"environment"}
        report.run = (lambda run: lambda name, *a, **kw: run(name, *a, **kw) if name in wanted else None)(report.run)
    report.data["mode"] = "cpu-smoke (tiny Qwen2 shape; numbers meaningless)" if args.cpu_smoke else "gpu"
    report.data.update(run_identity(ROOT))  # the commit (when known) and a digest of the code: --promote checks it
    if not args.cpu_smoke:
        report.run("environment", environment)
    else:
        report.data["sections"]["environment"] = {"ok": True, "vllm": None}
    if args.preset == "vs-trl":
        _vs_trl_sections(report, args.budget_s, args.cpu_smoke)
        return _finish(report, args)
    if not args.skip_tests:
        report.run("contract_tests", contract_tests, args.test_timeout, CUDA_TESTS)
    report.run("sampler", sampler, QWEN2_05B["vocab_size"])
    report.run("engine_steps", engine_steps, new_tokens=new_tokens)
    report.run("hf_generation", hf_generation, batches, new_tokens)
    has_vllm = bool(report.data["sections"]["environment"].get("vllm"))
    if has_vllm:
        report.run("vllm_generation", vllm_generation, batches, new_tokens)
    report.run("engine_compare", engine_compare, 32 if args.quick else 64, new_tokens)
    report.run("update_memory", update_memory)
    report.run("grpo_step_hf", grpo_step, "hf", 4, 8, 64 if args.quick else 128)
    if has_vllm:
        report.run("grpo_step_vllm", grpo_step, "vllm", 4, 8, 64 if args.quick else 128)
    if not args.cpu_smoke:
        report.run("grpo_vs_trl", grpo_vs_trl, 3, 64 if args.quick else 128, 240)
    return _finish(report, args)


def _finish(report: "Report", args) -> int:
    report.data["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    sec = report.data["sections"]
    if "outcomes" in sec.get("contract_tests", {}):  # no tests, no verdicts: nothing to promote
        tests = sec["contract_tests"]
        report.data["decode_modes"] = decode_verdicts(tests["outcomes"], sec.get("engine_steps"),
                                                      tests_finished=tests.get("returncode") is not None)
    report.data["summary"] = summary(report.data)
    report.save()
    print("== summary")
    for line in report.data["summary"]:
        print("  " + line)
    failed = [k for k, v in report.data["sections"].items() if not v.get("ok") or v.get("passed_all") is False]
    print(f"results: {args.out}; failed sections: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
