"""Generation speed side by side: ``model.generate`` (dynamic and static cache) vs ``HFEngine``'s
eager, static-cache and compiled decoding — same model, same prompts, same number of new tokens.

Usage::

    python benchmarks/engine_speed.py                         # CPU, tiny Llama (compiled path included)
    python benchmarks/engine_speed.py --device cuda --qwen2   # GPU, Qwen2-0.5B-shaped random model, bf16
    python benchmarks/engine_speed.py --no-compile            # skip the torch.compile variants

Every engine row samples with the same keys; ``model.generate`` rows sample with its own sampler and
run without EOS (``min_new_tokens``) so every row produces the full budget. Compiled variants report
their warm-up (compilation) separately from the timed runs. Numbers on a loaded machine are noisy;
the ratios of one run are what to compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QWEN2_05B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864, "vocab_size": 151936, "max_position_embeddings": 4096,
             "rope_theta": 1_000_000.0, "tie_word_embeddings": True}


def _sync(device):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def build_model(device: str, qwen2: bool, dtype=None):
    import torch

    torch.manual_seed(0)
    if qwen2:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        with torch.device(device):
            model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_05B, bos_token_id=1, eos_token_id=2, pad_token_id=0))
        vocab = QWEN2_05B["vocab_size"]
    else:
        from llmgym.models import TinyModelConfig, build_tiny_model, build_tokenizer

        model = build_tiny_model(build_tokenizer(), TinyModelConfig()).to(device)
        vocab = model.config.vocab_size
    model = model.to(dtype or (torch.bfloat16 if device == "cuda" else torch.float32)).eval()
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model, vocab


class _NoEosTokenizer:
    """The minimum HFEngine needs; EOS id -1 never matches, so every row runs the full budget."""

    eos_token_id = 2
    pad_token_id = 0

    def decode(self, ids, **kw):
        return ""


def _timed(fn, device, repeats):
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        produced = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), produced


def run(device="cpu", qwen2=False, batch=32, prompt_len=32, new_tokens=64, repeats=3, compile_=True) -> dict:
    import torch

    from llmgym.engines import HFEngine, SamplingParams

    model, vocab = build_model(device, qwen2)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (batch, prompt_len), generator=g)
    ids = prompts.to(device)
    attn = torch.ones_like(ids)
    rows: dict[str, dict] = {}

    def hf_generate(**kw):
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, top_k=0, **kw)
        return int(out.shape[0] * (out.shape[1] - prompt_len))

    variants = [("model.generate (dynamic cache)", lambda: hf_generate(), False)]
    if compile_:
        variants.append(("model.generate (static cache, compiled)", lambda: hf_generate(cache_implementation="static"), True))
    tok = _NoEosTokenizer()
    engines = {"eager": HFEngine(model, tok, max_batch_size=batch), "static": HFEngine(model, tok, max_batch_size=batch, decode="static")}
    if compile_:
        engines["compiled"] = HFEngine(model, tok, max_batch_size=batch, decode="compiled")
    for engine in engines.values():
        engine.eos_ids = [-1]  # run the full budget, like min_new_tokens above
    params = SamplingParams(max_new_tokens=new_tokens, seed=1)
    prompt_lists = prompts.tolist()
    for name, engine in engines.items():
        variants.append((f"HFEngine decode={name}", lambda e=engine: sum(len(c.token_ids) for grp in e.generate(prompt_lists, params) for c in grp),
                         name == "compiled"))
    for name, fn, compiled in variants:
        try:
            t0 = time.perf_counter()
            fn()  # warm-up (compilation for the compiled variants)
            _sync(device)
            warm = time.perf_counter() - t0
            seconds, produced = _timed(fn, device, repeats)
            rows[name] = {"s": round(seconds, 4), "tokens": produced, "tokens_per_s": round(produced / seconds, 1),
                          **({"warmup_s": round(warm, 1)} if compiled else {})}
        except Exception as err:  # noqa: BLE001 - report and go on
            rows[name] = {"error": f"{type(err).__name__}: {err}"[:300]}
        print(f"{name:45s} {json.dumps(rows[name])}", flush=True)
    base = rows.get("model.generate (dynamic cache)", {}).get("tokens_per_s")
    if base:
        for r in rows.values():
            if "tokens_per_s" in r:
                r["speed_vs_generate"] = round(r["tokens_per_s"] / base, 2)
    # same keys ⇒ same tokens in every engine mode (float32 only: bf16 kernels may round differently)
    if model.dtype == torch.float32:
        outs = {k: [c.token_ids for grp in e.generate(prompt_lists[:4], params) for c in grp] for k, e in engines.items()}
        rows["engine_modes_same_tokens"] = len({json.dumps(v) for v in outs.values()}) == 1
    return {"device": device, "model": "Qwen2-0.5B-shaped" if qwen2 else "tiny Llama", "dtype": str(model.dtype),
            "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1), "batch": batch,
            "prompt_len": prompt_len, "new_tokens": new_tokens, "threads": torch.get_num_threads(), "rows": rows}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--qwen2", action="store_true", help="Qwen2-0.5B-shaped random model (default: tiny Llama)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    result = run(a.device, a.qwen2, a.batch, a.prompt_len, a.new_tokens, a.repeats, not a.no_compile)
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
