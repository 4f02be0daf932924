"""Side-by-side rollout speed, measured in one run on this machine.

1. ``HFEngine.generate`` (KV cache + keyed Gumbel sampling) vs ``transformers``' own
   ``model.generate(do_sample=True)`` on the same model, prompts and token budget.
2. Collecting the same GRPO batch at sequence level vs token level (one env step per token).

Prints tokens/s and the ratios. Usage: ``python benchmarks/rollout_speed.py [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import torch
from rich.console import Console
from rich.table import Table

import llmgym  # noqa: F401
from llmgym.engines import HFEngine, SamplingParams, pad_left
from llmgym.models import TinyModelConfig, build_tiny_model, build_tokenizer
from llmgym.rollout import collect_episodes


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    torch.manual_seed(0)
    tok = build_tokenizer()
    model = build_tiny_model(tok, TinyModelConfig()).eval()
    engine = HFEngine(model, tok)
    prompts = [tok.encode(f"copy:{1000 + i}=") for i in range(args.batch)]
    budget = args.new_tokens
    sampling = SamplingParams(max_new_tokens=budget, seed=0)

    produced = {}

    def ours():
        groups = engine.generate(prompts, sampling)
        produced["ours"] = sum(len(g[0].token_ids) for g in groups)

    ids, attn = pad_left(prompts, tok.pad_token_id)

    def theirs():
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, max_new_tokens=budget,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        new = out[:, ids.shape[1]:]
        produced["hf"] = int(((new != tok.pad_token_id).cumprod(-1)).sum())

    t_ours, t_hf = median_time(ours, args.repeats), median_time(theirs, args.repeats)

    env_seq = gym.make("llmgym/Copy-v0", tokenizer=tok)
    env_tok = gym.make("llmgym/Copy-v0", tokenizer=tok, level="token", max_new_tokens=8)
    small = SamplingParams(max_new_tokens=8)

    def seq_level():
        collect_episodes(env_seq, engine, num_tasks=8, group_size=8, sampling=small, seed=0)

    def token_level():
        collect_episodes(env_tok, engine, num_tasks=8, group_size=8, sampling=small, seed=0)

    t_seq, t_tok = median_time(seq_level, args.repeats), median_time(token_level, args.repeats)

    table = Table(title=f"rollout speed (tiny Llama {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, "
                        f"{torch.get_num_threads()} threads, median of {args.repeats})")
    for col in ("what", "seconds", "tokens/s", "ratio"):
        table.add_column(col)
    table.add_row("HFEngine.generate", f"{t_ours:.3f}", f"{produced['ours'] / t_ours:,.0f}", "1.00")
    table.add_row("transformers generate()", f"{t_hf:.3f}", f"{produced['hf'] / t_hf:,.0f}",
                  f"{(produced['hf'] / t_hf) / (produced['ours'] / t_ours):.2f}")
    table.add_row("GRPO batch 8x8, sequence level", f"{t_seq:.3f}", "", "1.00")
    table.add_row("same batch, token level", f"{t_tok:.3f}", "", f"{t_tok / t_seq:.2f}x slower")
    Console().print(table)


if __name__ == "__main__":
    main()
