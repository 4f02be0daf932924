"""Side-by-side rollout speed, measured in one run on this machine.

1. ``HFEngine.generate`` (KV cache + keyed inverse-CDF sampling) vs ``transformers``' own
   ``model.generate(do_sample=True)`` on the same model, prompts and token budget.
2. Collecting the same GRPO batch at sequence level vs token level (one env step per token), the
   token level both with the KV cache kept between steps (a decode session, today's path) and
   recomputing every context at every step (the path before sessions, still used by engines
   without ``open_session``).
3. A user's own token loop (``env.step`` per token, EOS masked so every episode runs the full
   length) at 16, 64 and 256 tokens: time per token with ``TokenStepper`` (cache reused) vs
   ``engine.next_token_logits`` (recomputed). With the cache the time per token stays flat.

Prints tokens/s and the ratios. Usage: ``OMP_NUM_THREADS=1 python benchmarks/rollout_speed.py [--repeats 3]``.
Section 2 also gives each side's CPU time (``time.process_time``): on one thread it is what the work
costs, and its ratio holds on a loaded machine, where wall-clock ratios swing (0.86–1.12 for the same
code in one session, load 13–16, while the CPU-time ratio stayed 1.08–1.13).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import gymnasium as gym
import torch
from rich.console import Console
from rich.table import Table

import llmgym  # noqa: F401
from llmgym.engines import HFEngine, SamplingParams, TokenStepper, pad_left
from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer
from llmgym.rollout.episodes import collect_episodes


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


class RecomputingEngine:
    """The engine without ``open_session``: token level recomputes every context (the old path)."""

    def __init__(self, engine: HFEngine):
        self.inner = engine
        self.tokenizer, self.eos_ids, self.pad_id = engine.tokenizer, engine.eos_ids, engine.pad_id
        self.max_batch_size = engine.max_batch_size

    def generate(self, *args, **kwargs):
        return self.inner.generate(*args, **kwargs)

    def next_token_logits(self, contexts):
        return self.inner.next_token_logits(contexts)


def user_loop(env, next_token_logits, eos_id: int) -> int:
    """One episode of a user's greedy token loop; EOS is masked so it runs to the token budget."""
    obs, _ = env.reset(seed=0)
    done, steps = False, 0
    while not done:
        logits = next_token_logits([obs["prompt_ids"]])[0].clone()
        logits[eos_id] = float("-inf")
        obs, _, terminated, truncated, _ = env.step(int(logits.argmax()))
        done, steps = terminated or truncated, steps + 1
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--grpo-only", action="store_true",
                        help="section 2 only (sequence vs token level), e.g. with --repeats 31 for its ratio")
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

    t_ours, t_hf = (1.0, 1.0) if args.grpo_only else (median_time(ours, args.repeats), median_time(theirs, args.repeats))

    env_seq = gym.make("llmgym/Copy-v0", tokenizer=tok)
    env_tok = gym.make("llmgym/Copy-v0", tokenizer=tok, level="token", max_new_tokens=8)
    small = SamplingParams(max_new_tokens=8)

    def seq_level():
        collect_episodes(env_seq, engine, num_tasks=8, group_size=8, sampling=small, seed=0)

    def token_level():
        collect_episodes(env_tok, engine, num_tasks=8, group_size=8, sampling=small, seed=0)

    recomputing = RecomputingEngine(engine)

    def token_level_recomputed():
        collect_episodes(env_tok, recomputing, num_tasks=8, group_size=8, sampling=small, seed=0)

    # interleaved, so load from other processes falls on all three alike
    times = {"seq": [], "tok": [], "old": []}
    cpu = {"seq": [], "tok": [], "old": []}
    for _ in range(args.repeats):
        for name, fn in (("seq", seq_level), ("tok", token_level), ("old", token_level_recomputed)):
            started = time.process_time()
            times[name].append(median_time(fn, 1))
            cpu[name].append(time.process_time() - started)
    t_seq, t_tok, t_old = (statistics.median(times[k]) for k in ("seq", "tok", "old"))
    c_seq, c_tok, c_old = (statistics.median(cpu[k]) for k in ("seq", "tok", "old"))
    # the same repeat's pair: load that falls on one repeat falls on both of its sides
    pair = [t / s for t, s in zip(cpu["tok"], cpu["seq"])]
    print(f"token level / sequence level, CPU time per repeat: min {min(pair):.3f}, median {statistics.median(pair):.3f}; "
          f"ratio of the minima {min(cpu['tok']) / min(cpu['seq']):.3f} ({args.repeats} repeats, load "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())})")
    if args.grpo_only:
        return

    # a user's loop: 256 tokens per measurement (256 / length episodes), lengths and methods
    # interleaved within each repeat so that load drifting during the run falls on all alike
    lengths = (16, 64, 256)
    loop_envs = {n: gym.make("llmgym/Copy-v0", tokenizer=tok, level="token", max_new_tokens=n) for n in lengths}
    methods = {"stepper": lambda: TokenStepper(engine).next_token_logits,
               "recompute": lambda: engine.next_token_logits}
    per_token: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for length in lengths:
            for name, make in methods.items():
                started = time.perf_counter()
                steps = sum(user_loop(loop_envs[length], make(), tok.eos_token_id) for _ in range(256 // length))
                assert steps == 256, steps
                per_token.setdefault((name, length), []).append((time.perf_counter() - started) / steps)
    loop_rows = [(n, statistics.median(per_token["stepper", n]), statistics.median(per_token["recompute", n]))
                 for n in lengths]

    table = Table(title=f"rollout speed (tiny Llama {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, "
                        f"{torch.get_num_threads()} threads, median of {args.repeats}, load "
                        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())})")
    for col in ("what", "seconds", "tokens/s", "ratio", "CPU seconds", "CPU ratio"):
        table.add_column(col)
    table.add_row("HFEngine.generate", f"{t_ours:.3f}", f"{produced['ours'] / t_ours:,.0f}", "1.00")
    table.add_row("transformers generate()", f"{t_hf:.3f}", f"{produced['hf'] / t_hf:,.0f}",
                  f"{(produced['hf'] / t_hf) / (produced['ours'] / t_ours):.2f}")
    table.add_row("GRPO batch 8x8, sequence level", f"{t_seq:.3f}", "", "1.00", f"{c_seq:.3f}", "1.00")
    table.add_row("same batch, token level (KV cache session)", f"{t_tok:.3f}", "", f"{t_tok / t_seq:.2f}x",
                  f"{c_tok:.3f}", f"{c_tok / c_seq:.2f}x")
    table.add_row("same batch, token level (recomputed, before)", f"{t_old:.3f}", "", f"{t_old / t_seq:.2f}x",
                  f"{c_old:.3f}", f"{c_old / c_seq:.2f}x")
    console = Console()
    console.print(table)
    loop = Table(title="a user's token loop (batch 1, env.step per token, 256 tokens per measurement): "
                       "milliseconds per token")
    for col in ("tokens", "TokenStepper", "next_token_logits (recomputed)", "per-token vs 16 (stepper)"):
        loop.add_column(col)
    base = loop_rows[0][1]
    for length, stepper, recompute in loop_rows:
        loop.add_row(str(length), f"{1e3 * stepper:.2f}", f"{1e3 * recompute:.2f}", f"{stepper / base:.2f}")
    console.print(loop)


if __name__ == "__main__":
    main()
