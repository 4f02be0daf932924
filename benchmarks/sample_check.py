"""The sample check of a fleet's completions (llmgym.fleet.trust): false alarms on honest sampling, power on
lies, and its cost per batch.

Honest batches are sampled in process by ``HFEngine`` (the policy's own sampler: what an honest server
samples); each batch's rows are split by group between two "servers", and each server's completions are judged
as :func:`llmgym.fleet.trust.screen_batch` judges them (:func:`~llmgym.fleet.trust.judge_samples` over the
learner's scores from :func:`llmgym.agents.screening.token_scores`). Lies, each on one server's half:

* ``fixed``: one fixed completion (the first honest completion of the batch) for every row, true log-probs;
* ``cold``: sampled at temperature 0.5, claimed 1.0 (true log-probs at 1.0);
* ``greedy``: the greedy completion of each prompt;
* ``best-of-4``: each row the best of 4 honest samples by a reward unrelated to likelihood (the share of its
  tokens in a fixed random half of the vocabulary).

Two policies: the random tiny model (almost uniform: entropy near log V) and the same with its head scaled ×4
(a peaked policy, as a trained one is). Cost: seconds of the learner's scoring pass + the judgement per batch,
beside a GRPO update on the same batch (same run, alternating).

    python benchmarks/sample_check.py --honest 2000 --attacks 100
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    import gymnasium as gym

    import llmgym  # noqa: F401 (registers the envs)
    from llmgym.agents import GRPO
    from llmgym.agents.screening import token_scores
    from llmgym.engines import SamplingParams
    from llmgym.fleet.trust import SampleTally, judge_samples
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer

    parser = argparse.ArgumentParser()
    parser.add_argument("--honest", type=int, default=500, help="honest batches per policy")
    parser.add_argument("--attacks", type=int, default=50, help="batches per attack and policy")
    parser.add_argument("--cost", type=int, default=20, help="batches timed (check vs update)")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tok = build_tokenizer()
    print(f"load before: {load_average()}")
    for sharpen in (1.0, 4.0):
        torch.manual_seed(0)
        model = build_tiny_model(tok, TinyModelConfig(hidden_size=64, num_layers=2, intermediate_size=256))
        with torch.no_grad():
            model.lm_head.weight.mul_(sharpen)
        agent = GRPO(model, tok, tasks_per_step=6, group_size=4, max_new_tokens=args.tokens, kl_coef=0.0)
        env = gym.make("llmgym/Copy-v0", tokenizer=tok)
        vocab = model.lm_head.weight.shape[0]
        favoured = set(torch.randperm(vocab, generator=torch.Generator().manual_seed(1))[: vocab // 2].tolist())

        def judge(batch, rows, scores=None):
            mask = batch.action_mask.bool()
            lp, h, m = scores if scores is not None else token_scores(agent, batch, mask)
            tally = SampleTally()
            for r in rows:
                sel = mask[r]
                tally.add(batch.input_ids[r, 1:][sel].tolist(), lp[r][sel], h[r][sel], m[r][sel])
            return judge_samples(tally, vocab)

        def honest(step):
            agent.step_count = step  # a fresh seed per batch
            return agent.collect(env)

        def rebuild(batch, rows, new):
            """``batch`` with the completions of ``rows`` replaced by ``new[row]`` (token lists)."""
            from llmgym.rollout.episodes import Batch

            episodes = []
            for r, e in enumerate(batch.episodes):
                if r in rows:
                    prompt = [t for t, a in zip(e.token_ids, e.action_mask) if not a]
                    toks = new[r]
                    e = type(e)(e.task, e.group, prompt + toks, [0] * len(prompt) + [1] * len(toks),
                                [0.0] * (len(prompt) + len(toks)), [0.0] * (len(prompt) + len(toks)), len(prompt))
                episodes.append(e)
            return Batch.from_episodes(episodes, agent.engine.pad_id)

        def prompt_of(e):
            return [t for t, a in zip(e.token_ids, e.action_mask) if not a]

        def completion_of(e):
            return [t for t, a in zip(e.token_ids, e.action_mask) if a]

        halves = (list(range(0, 12)), list(range(12, 24)))
        alarms, ratios, seconds = 0, [], []
        started = time.perf_counter()
        for b in range(args.honest):
            batch = honest(10_000 + b)
            scores = token_scores(agent, batch, batch.action_mask.bool())
            for rows in halves:
                ratio, why = judge(batch, rows, scores)
                ratios.append(ratio)
                alarms += why is not None
        seconds = time.perf_counter() - started
        ratios.sort()
        print(f"\npolicy head x{sharpen:g}: honest {args.honest} batches x 2 servers x 12 rows x <= {args.tokens} "
              f"tokens: false alarms {alarms} / {2 * args.honest} server-batches; Σ(logπ+H)/bound max "
              f"{ratios[-1]:.3f}, 99th pct {ratios[int(0.99 * len(ratios))]:.3f}, median {ratios[len(ratios) // 2]:.3f}"
              f" ({seconds:.0f} s)")

        def attack(name, make):
            caught = 0
            for b in range(args.attacks):
                batch = honest(50_000 + b)
                lied = rebuild(batch, set(halves[1]), make(batch))
                caught += judge(lied, halves[1])[1] is not None
            print(f"  {name}: caught {caught} / {args.attacks} batches")

        def fixed(batch):
            first = completion_of(batch.episodes[0])
            return {r: first for r in halves[1]}

        def resample(batch, temperature=1.0, k=1, pick=None):
            out = {}
            for r in halves[1]:
                e = batch.episodes[r]
                groups = agent.engine.generate([prompt_of(e)], SamplingParams(n=k, temperature=temperature,
                                                                               max_new_tokens=args.tokens, seed=r))
                options = [c.token_ids for c in groups[0]]
                out[r] = max(options, key=pick) if pick else options[0]
            return out

        def greedy(batch):
            return resample(batch, temperature=0.0)

        def best_of_4(batch):
            return resample(batch, k=4, pick=lambda ids: sum(t in favoured for t in ids) / max(1, len(ids)))

        attack("fixed completion", fixed)
        attack("temperature 0.5 claimed 1.0", lambda batch: resample(batch, temperature=0.5))
        attack("greedy", greedy)
        attack("best of 4 by an unrelated reward", best_of_4)

        check_s, update_s = [], []
        for b in range(args.cost):
            batch = honest(90_000 + b)
            t0 = time.perf_counter()
            scores = token_scores(agent, batch, batch.action_mask.bool())  # one scoring pass per batch
            for rows in halves:
                judge(batch, rows, scores)
            t1 = time.perf_counter()
            agent.update(batch)
            t2 = time.perf_counter()
            check_s.append(t1 - t0)
            update_s.append(t2 - t1)
        print(f"  cost per batch (24 rows): check {statistics.median(check_s):.4f} s, update "
              f"{statistics.median(update_s):.4f} s (medians of {args.cost}, alternating)")
    print(f"load after: {load_average()}")


if __name__ == "__main__":
    main()
