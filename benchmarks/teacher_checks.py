"""What the teacher-score checks cost, and whether they ever refuse an honest teacher.

Honest teachers score the student's own sampled batches (Copy, groups of 8 per prompt), and every batch goes
through :func:`llmgym.agents.teacher_checks.check_teacher_scores`:

* an HF forward of another tiny model, at logit scales 1, 10 and 50 (the final norm multiplied: 1 is a random
  init's near-uniform distribution; 50 spreads the logits over ~100s of nats, far peakier than a trained LM);
* vLLM in process (``VLLMEngine.score_tokens``: its prompt log-probs) of the scale-10 teacher, when vLLM imports;
* with ``--served``, a real ``vllm serve`` of the scale-10 teacher through ``OpenAIEngine.score_tokens`` (every
  echo checked by ``check_echo``), twice: tokens named ``token_id:N`` (what the engine asks vLLM for) and
  tokens as vLLM displays them (decoded, byte-level pieces and all: the random student samples bytes that
  are no whole character).

It records, per teacher: batches, refusals (false alarms), the lowest log-prob seen against the floor, the
largest sum of probabilities over distinct next tokens at a shared prefix, and the time of the check next to
the time of the scoring. Run: ``python benchmarks/teacher_checks.py [--batches 20]``; writes
``benchmarks/results/teacher_checks.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from llmgym.agents.teacher_checks import TeacherScoreError, check_teacher_scores, logprob_floor
from llmgym.engines import HFEngine, SamplingParams
from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer

OUT = Path(__file__).resolve().parent / "results" / "teacher_checks.json"
SHAPE = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)


def largest_prefix_sum(rows, scores) -> float:
    """The largest Σ exp(score) over the distinct next tokens after any prefix the rows share."""
    groups: dict[tuple, dict[int, float]] = {}
    for row, s in zip(rows, scores):
        for j in range(1, len(row)):
            groups.setdefault(tuple(row[:j]), {}).setdefault(row[j], math.exp(s[j - 1]))
    return max(sum(g.values()) for g in groups.values() if len(g) > 1) if any(len(g) > 1 for g in groups.values()) else 0.0


def batches(tok, student, n: int, seed: int = 0):
    """``n`` student batches: 8 prompts (``copy: <digits>=``) × 8 samples of up to 12 tokens; rows = prompt +
    completion ids."""
    sampler = HFEngine(student, tok)
    gen = torch.Generator().manual_seed(seed)
    for b in range(n):
        prompts = [tok.encode("copy: " + "".join(str(int(d)) for d in torch.randint(0, 10, (6,), generator=gen)) + "=")
                   for _ in range(8)]
        groups = sampler.generate(prompts, SamplingParams(n=8, max_new_tokens=12, seed=seed + b))
        yield [list(c.prompt_ids) + list(c.token_ids) for g in groups for c in g]


def measure(name: str, teacher, rows_list, vocab: int) -> dict:
    refusals, low, top, t_score, t_check = 0, 0.0, 0.0, 0.0, 0.0
    for rows in rows_list:
        start = time.perf_counter()
        scores = teacher.score_tokens(rows)
        t_score += time.perf_counter() - start
        start = time.perf_counter()
        try:
            check_teacher_scores(rows, scores, vocab_size=vocab)
        except TeacherScoreError as err:
            refusals += 1
            print(f"{name}: refused: {err}")
        t_check += time.perf_counter() - start
        low = min(low, min(min(s) for s in scores))
        top = max(top, largest_prefix_sum(rows, scores))
    n = len(rows_list)
    row = {"teacher": name, "batches": n, "rows_per_batch": len(rows_list[0]),
           "tokens_per_batch": round(sum(len(r) for rows in rows_list for r in rows) / n),
           "refusals": refusals, "lowest_logprob": round(low, 2), "floor": round(logprob_floor(vocab), 2),
           "largest_prefix_prob_sum": round(top, 6), "score_ms_per_batch": round(1000 * t_score / n, 2),
           "check_ms_per_batch": round(1000 * t_check / n, 3)}
    print(json.dumps(row))
    return row


def served(teacher, tok, rows_list, vocab: int) -> list[dict]:
    """The teacher behind a real ``vllm serve``, scored through ``OpenAIEngine`` in both token displays."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from served import vllm_server

    from llmgym.engines.openai_api import OpenAIEngine, ServerError
    from llmgym.runtime.models import save_pretrained

    directory = save_pretrained(teacher, tok, Path(tempfile.mkdtemp()) / "teacher")
    out = []
    with vllm_server(directory, "teacher") as url:
        for display in ("token_id", "decoded"):
            engine = OpenAIEngine(url, "teacher", tok, max_concurrency=4)
            engine.server_is_vllm = display == "token_id"  # False: no return_tokens_as_token_ids, vLLM's text
            refused = []

            class Counted:
                tokenizer = tok

                def score_tokens(self, rows):
                    try:
                        return engine.score_tokens(rows)
                    except ServerError as err:
                        refused.append(str(err))
                        raise

            try:
                row = measure(f"vllm serve through OpenAIEngine, tokens {display}", Counted(), rows_list, vocab)
            except ServerError as err:
                row = {"teacher": f"vllm serve, tokens {display}", "echo_refused": str(err)}
                print(json.dumps(row))
            row["echo_refusals"] = len(refused)
            out.append(row)
            engine.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--served", action="store_true", help="also a real vllm serve through OpenAIEngine")
    parser.add_argument("--served-only", action="store_true", help="only the served teacher (--batches of it)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tok = build_tokenizer()
    student = build_tiny_model(tok, SHAPE)
    rows_list = list(batches(tok, student, args.batches))
    vocab = student.config.vocab_size
    results = []
    teachers = {}
    for scale in ((10.0,) if args.served_only else (1.0, 10.0, 50.0)):
        teacher = build_tiny_model(tok, TinyModelConfig(**{**SHAPE.__dict__, "seed": 7}))
        with torch.no_grad():
            teacher.model.norm.weight.mul_(scale)  # the logits, scaled
        teachers[scale] = teacher
        if not args.served_only:
            results.append(measure(f"hf, logit scale {scale:g}", HFEngine(teacher, tok), rows_list, vocab))
    if args.served or args.served_only:
        results += served(teachers[10.0], tok, rows_list, vocab)
    if not args.no_vllm and not args.served_only:
        try:
            from llmgym.engines import VLLMEngine

            start = time.perf_counter()
            engine = VLLMEngine(copy.deepcopy(teachers[10.0]), tok, dtype="float32")
            print(f"vLLM in process started in {time.perf_counter() - start:.1f} s")
            results.append(measure("vllm in process, logit scale 10", engine, rows_list, vocab))
            engine.close()
        except ImportError as err:
            print(f"vLLM skipped: {err}")
    load = os.getloadavg()
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": f"{os.cpu_count()} CPU cores, 1 thread",
           "load_1_5_15": [round(x, 2) for x in load], "results": results}
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
