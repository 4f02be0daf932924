"""One-shot GPU check: engine contract tests on the GPU, generation throughput, one GRPO step; JSON out.

Run on a machine with an NVIDIA GPU, from the repository root::

    bash benchmarks/gpu_check.sh                 # = python benchmarks/gpu_check.py
    python benchmarks/gpu_check.py --out results.json --quick

Sections (each timed; a failure is recorded and the next section still runs; the JSON is rewritten
after every section so a killed run keeps what it measured):

1. ``environment``: torch/CUDA/GPU, transformers and (if importable) vLLM versions.
2. ``contract_tests``: ``pytest tests/test_engine_contract.py`` — the HF engine on the GPU
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
    return info


def contract_tests(timeout_s: int) -> dict:
    cmd = [sys.executable, "-m", "pytest", "tests/test_engine_contract.py", "-q", "-rs", "-p", "no:cacheprovider"]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False)
    out = proc.stdout + proc.stderr
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return {"returncode": proc.returncode, "summary": lines[-1] if lines else "", "wall_s": round(time.perf_counter() - started, 2),
            "passed_all": proc.returncode == 0, "output_tail": out[-6000:]}


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
    from llmgym.models import build_tokenizer

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
    from llmgym.models import build_tokenizer

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
    from llmgym.models import build_tokenizer

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
    from llmgym.batch import Batch
    from llmgym.models import build_tokenizer
    from llmgym.rollout import Episode

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
    args = parser.parse_args(argv)

    import torch

    global DEVICE
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
        report.run = (lambda run: lambda name, *a: run(name, *a) if name in wanted else None)(report.run)
    report.data["mode"] = "cpu-smoke (tiny Qwen2 shape; numbers meaningless)" if args.cpu_smoke else "gpu"
    if not args.cpu_smoke:
        report.run("environment", environment)
    else:
        report.data["sections"]["environment"] = {"ok": True, "vllm": None}
    if not args.skip_tests:
        report.run("contract_tests", contract_tests, args.test_timeout)
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
    report.data["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
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
