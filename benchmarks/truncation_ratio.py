"""The importance ratio's mean under top-p sampling, before and after the learner adds its log kept mass back.

Each engine samples at ``top_p`` and reports ``log q(y)`` (the renormalised nucleus); the learner (HF, float32,
the same weights) scores the tokens teacher-forced. Per token:

* ``full``: ``p'(y) / q(y)`` — the ratio a learner that compares its full softmax with the report computes
  (main before this change, with vLLM; mean ``E_q[S']``);
* ``nucleus``: ``p'(y) / (q(y) S') = q'(y) / q(y)`` — :mod:`llmgym.agents.truncation`'s (mean 1).

Prints mean ± standard error for each engine (``hf``; ``vllm`` where vLLM is installed) and two heads: the
random tiny model (a flat distribution) and the same with its LM head ×3 (a peaked one, like a trained LM's).

    python benchmarks/truncation_ratio.py [--top-p 0.8] [--engines hf,vllm]
"""

from __future__ import annotations

import argparse
import copy
import math

import torch

from llmgym.engines import HFEngine, SamplingParams
from llmgym.engines.sampling import nucleus_log_mass
from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer


def ratios(engine, learner, tok, top_p: float, n: int = 32, new: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    prompts = [tok.encode(s) for s in ("12+3=", "hello", "a much longer prompt:", "xyz")]
    full, nucleus = [], []
    for group in engine.generate(prompts, SamplingParams(n=n, max_new_tokens=new, top_p=top_p, seed=11)):
        for c in group:
            ids = torch.tensor([c.prompt_ids + c.token_ids])
            with torch.no_grad():
                logp = torch.log_softmax(learner(input_ids=ids).logits[0, len(c.prompt_ids) - 1:-1].float(), -1)
            chosen = logp.gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1).double()
            log_mass = nucleus_log_mass(logp, top_p).double()
            reported = torch.tensor(c.logprobs, dtype=torch.float64)
            full.append((chosen - reported).exp())
            nucleus.append((chosen - log_mass - reported).exp())
    return torch.cat(full), torch.cat(nucleus)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--top-p", type=float, default=0.8)
    parser.add_argument("--engines", default="hf,vllm")
    args = parser.parse_args()
    tok = build_tokenizer()
    base = build_tiny_model(tok, TinyModelConfig(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=256,
                                                 seed=3)).eval()
    peaked = copy.deepcopy(base)
    with torch.no_grad():
        peaked.lm_head.weight.mul_(3.0)
    for head, learner in (("flat", base), ("peaked", peaked)):
        for kind in args.engines.split(","):
            if kind == "hf":
                sampler = copy.deepcopy(learner)
                with torch.no_grad():  # the sampler's weights rounded to bf16: a known engine/learner mismatch
                    for p in sampler.parameters():
                        p.copy_(p.to(torch.bfloat16).float())
                engine = HFEngine(sampler, tok)
            else:
                from llmgym.engines.vllm import VLLMEngine

                engine = VLLMEngine(learner, tok, dtype="float32")
            try:
                full, nucleus = ratios(engine, learner, tok, args.top_p)
            finally:
                if hasattr(engine, "close"):
                    engine.close()
            for name, r in (("full p'/q", full), ("nucleus q'/q", nucleus)):
                se = float(r.std() / math.sqrt(len(r)))
                print(f"{head:6s} {kind:4s} top_p={args.top_p:g} {name:13s} mean {float(r.mean()):.4f} ± {se:.1e} "
                      f"(SE, {len(r)} tokens)")


if __name__ == "__main__":
    main()
