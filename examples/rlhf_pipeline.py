"""The RLHF pipeline end to end on a tiny model, on a CPU (≈40 s on 2 quiet cores, 1 torch thread).

A hidden "human" preference stands in for labellers: people here prefer answers with more digits.

1. SFT: warm a tiny model up to answer prompts with short strings of letters and digits.
2. Preferences: sample two answers per prompt from it; the hidden preference labels each pair.
3. Reward model: Bradley–Terry training on the pairs; held-out pairwise accuracy; save_pretrained.
4. RL against the reward model: PPO with a KL leash (k1 in the reward) in an env whose verifier is
   the reward model — the policy never sees the hidden preference, only the learned one.
5. DPO on the same pairs (no reward model, no sampling).
6. Rejection sampling: best-of-8 by the reward model, fine-tune on the winners.
7. An LLM grader: a tiny grader model asked "Is the response mostly digits?", alone and combined.

Run: ``python examples/rlhf_pipeline.py`` (``--quick`` for a smoke run). docs/rlhf.md walks through it.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import numpy as np
import torch

from llmgym import SequenceEnv, Task
from llmgym.agents import DPO, PPO, RejectionSampling
from llmgym.engines import HFEngine, SamplingParams
from llmgym.rlhf.llm_graders import LLMGrader
from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer, save_pretrained, supervised_warmup
from llmgym.rlhf.preferences import PreferencePair, save_preferences, split_preferences
from llmgym.rlhf.reward_models import RewardModelVerifier, reward_model_from_causal_lm, train_reward_model
from llmgym.rollout.episodes import collect_episodes
from llmgym.runtime.threads import set_torch_threads
from llmgym.env.verifiers import AllOf, RegexFormat

LETTERS, DIGITS = "abcdef", "0123456789"
PROMPTS = [Task(f"say{i}:", id=f"say-{i}") for i in range(16)]
SAMPLING = SamplingParams(max_new_tokens=8)


def hidden_preference(task: Task, completion: str) -> float:
    """What the 'labellers' like: the share of digits in the answer."""
    text = completion.strip()
    return sum(ch in DIGITS for ch in text) / len(text) if text else 0.0


def sft_data(n: int, rng: np.random.Generator) -> list[tuple[str, str]]:
    data = []
    for _ in range(n):
        p = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0])
        text = "".join(rng.choice(list(DIGITS)) if rng.random() < p else rng.choice(list(LETTERS))
                       for _ in range(int(rng.integers(3, 7))))
        data.append((PROMPTS[int(rng.integers(len(PROMPTS)))].prompt, text))
    return data


def samples(model, tokenizer, verifier, per_prompt: int, seed: int):
    env = SequenceEnv(PROMPTS, verifier)
    episodes, _ = collect_episodes(env, HFEngine(model, tokenizer), num_tasks=len(PROMPTS), group_size=per_prompt,
                                   tasks=PROMPTS, sampling=SAMPLING, seed=seed)
    return episodes


def hidden_score(model, tokenizer) -> float:
    return float(np.mean([e.total_reward for e in samples(model, tokenizer, hidden_preference, 8, seed=123)]))


def mean(values) -> str:
    values = list(values)
    return f"{np.mean(values):.3f}" if values else "—"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few steps of everything (a smoke run)")
    parser.add_argument("--out", default=None, help="where to save the reward model and pairs (default: a temp dir)")
    args = parser.parse_args()
    steps = {"sft": 80, "rm": 60, "ppo": 30, "dpo": 20, "rs": 10, "grader": 150}
    data = {"sft": 3000, "pairs": 32, "grader": 3000, "graded": 4}  # examples / samples per prompt
    if args.quick:
        steps = {k: 2 for k in steps}
        data = {"sft": 100, "pairs": 4, "grader": 100, "graded": 1}
    torch.manual_seed(0)
    out = Path(args.out or tempfile.mkdtemp(prefix="llmgym-rlhf-"))
    tokenizer = build_tokenizer()
    config = TinyModelConfig(hidden_size=64, num_layers=2, intermediate_size=256)
    rng = np.random.default_rng(0)

    # 1. SFT
    sft = build_tiny_model(tokenizer, config)
    set_torch_threads(sft)  # 1 CPU thread for these tiny models (OMP_NUM_THREADS=N in the environment picks N)
    supervised_warmup(sft, tokenizer, sft_data(data["sft"], rng), steps=steps["sft"], batch_size=32, lr=3e-3)
    start = hidden_score(sft, tokenizer)
    print(f"1. SFT policy: hidden preference score {start:.3f}")

    # 2. preference pairs, labelled by the hidden preference (ties dropped)
    episodes = samples(sft, tokenizer, hidden_preference, per_prompt=data["pairs"], seed=0)
    pairs = []
    for a, b in zip(episodes[0::2], episodes[1::2]):
        if a.total_reward != b.total_reward:
            win, lose = (a, b) if a.total_reward > b.total_reward else (b, a)
            pairs.append(PreferencePair(a.task.prompt, win.info["completion"], lose.info["completion"]))
    train, test = split_preferences(pairs, held_out=0.25, seed=0)
    save_preferences(train, out / "train_pairs.jsonl")
    print(f"2. preference pairs: {len(train)} train, {len(test)} held out, e.g. {train[0]}")

    # 3. Bradley–Terry reward model, initialised from the SFT model
    rm = reward_model_from_causal_lm(sft, tokenizer)
    history = train_reward_model(rm, tokenizer, train, eval_pairs=test, steps=steps["rm"], batch_size=32, lr=1e-3)
    save_pretrained(rm, tokenizer, out / "reward_model")
    print(f"3. reward model: held-out pairwise accuracy {history[-1]['eval_accuracy']:.3f} "
          f"(BT loss {history[0]['loss']:.3f} -> {history[-1]['loss']:.3f}), saved to {out / 'reward_model'}")

    # 4. PPO against the reward model, with a KL leash to the SFT policy
    rlhf_env = SequenceEnv(PROMPTS, RewardModelVerifier(out / "reward_model"))
    policy = copy.deepcopy(sft)
    ppo = PPO(policy, tokenizer, tasks_per_step=16, group_size=4, max_new_tokens=8, lr=5e-4, kl_coef=0.05, seed=0)
    rows = ppo.learn(rlhf_env, steps=steps["ppo"])
    print(f"4. PPO vs reward model: RM reward {rows[0]['reward_mean']:.3f} -> {rows[-1]['reward_mean']:.3f}, "
          f"KL to SFT {rows[-1]['kl']:.3f}; hidden score {start:.3f} -> {hidden_score(policy, tokenizer):.3f}")

    # 5. DPO on the same pairs
    policy = copy.deepcopy(sft)
    dpo = DPO(policy, tokenizer, pairs=str(out / "train_pairs.jsonl"), tasks_per_step=32, kl_coef=0.1, lr=5e-4)
    rows = dpo.learn(rlhf_env, steps=steps["dpo"])  # offline: the env is not sampled
    held = dpo.preference_metrics(test)
    print(f"5. DPO: implicit-reward accuracy train {rows[-1]['reward_accuracy']:.3f}, held out "
          f"{held['reward_accuracy']:.3f} (margin {held['reward_margin']:.3f}); "
          f"hidden score {start:.3f} -> {hidden_score(policy, tokenizer):.3f}")

    # 6. rejection sampling: best of 8 by the reward model, fine-tune on the winners
    policy = copy.deepcopy(sft)
    rs = RejectionSampling(policy, tokenizer, tasks_per_step=16, group_size=8, max_new_tokens=8, lr=1e-3)
    rows = rs.learn(rlhf_env, steps=steps["rs"])
    print(f"6. rejection sampling: RM reward {rows[0]['reward_mean']:.3f} -> {rows[-1]['reward_mean']:.3f}; "
          f"hidden score {start:.3f} -> {hidden_score(policy, tokenizer):.3f}")

    # 7. an LLM grader: a tiny grader model taught to answer the question, used through an engine
    grader_model = build_tiny_model(tokenizer, config)
    question = "Is the response mostly digits?"
    template_grader = LLMGrader(HFEngine(grader_model, tokenizer), question)
    grader_data = [(template_grader.grader_prompt(Task(p), text), " yes" if hidden_preference(None, text) > 0.5 else " no")
                  for p, text in sft_data(data["grader"], rng)]
    supervised_warmup(grader_model, tokenizer, grader_data, steps=steps["grader"], batch_size=32, lr=3e-3)
    graded = samples(sft, tokenizer, hidden_preference, per_prompt=data["graded"], seed=7)
    tasks, texts = [e.task for e in graded], [e.info["completion"] for e in graded]
    truth = [hidden_preference(None, t) > 0.5 for t in texts]
    binary = [s.reward for s in template_grader.verify_batch(tasks, texts)]
    prob = LLMGrader(HFEngine(grader_model, tokenizer), question, mode="prob").verify_batch(tasks, texts)
    both = AllOf([template_grader, RegexFormat(r"^\S{4,}$")])  # the grader and a format rule must both pass
    print(f"7. grader: agrees with the hidden preference on {mean(b == t for b, t in zip(binary, truth))} "
          f"of {len(texts)} samples; mean P(yes) {mean(s.reward for s, t in zip(prob, truth) if t)} when "
          f"mostly digits, {mean(s.reward for s, t in zip(prob, truth) if not t)} otherwise; "
          f"AllOf(grader, ≥4 chars) passes {mean(both(t, c).reward for t, c in zip(tasks, texts))}")


if __name__ == "__main__":
    main()
