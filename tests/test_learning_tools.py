"""Learning to use a tool: GRPO raises the tiny model's held-out reward on ``llmgym/Calculator-v0``.

The tiny model (with the tiny tokenizer's chat template, which has tool roles) gets a short supervised
warm-up on the call format, built by stepping the env itself: for each task, the context the env shows
is paired with the call a tool user writes (``write_tool_calls``), and the context after the
calculator's reply with the product. Then GRPO trains on the env — multi-turn episodes in which the
calculator runs in the tool worker — and the mean reward of sampled episodes on a fixed held-out set
must rise by a clear margin.

Factors have a fixed 3 digits here (products of 5-6 digits, still no sum a tiny model does in its
head): the model must copy them into its call across ~80 tokens of call syntax, and with lengths that
vary it did not learn to in 600 warm-up steps; with fixed lengths it does, abruptly, around step 250.
The margin is to be set against the improvement measured over seeds and thread counts with
``benchmarks/learning_spread.py --recipe test_learning_tools`` (which imports this recipe).

**Not yet a passing recipe: opt-in with ``LLMGYM_TOOL_LEARNING=1``.** Measured 2026-11-26 on the shared
2-core machine (load 2.6-4.4), 1 torch thread, seed 0: the warm-up gives held-out 0.578; GRPO at lr 1e-3
ends 30 steps at 0.523 (the test fails); at lr 3e-4 (``--lr-scale 0.3``) 0.578 after 10 steps and 0.602
after 20. A warm-up of 350 steps leaves 0.0. No spread over seeds or threads was measured. The module
took 12 min 40 s (warm-up 320 s, GRPO 433 s wall), over the suite's budget. What it needs: a recipe whose
gain is several times the held-out noise (128 episodes: about ±0.04 per evaluation) in a few minutes.
"""

from __future__ import annotations

import copy
import json
import os

import gymnasium as gym
import numpy as np
import pytest

import llmgym  # noqa: F401
from llmgym.agents import GRPO
from llmgym.engines import HFEngine, SamplingParams
from llmgym.envs.tools.calculator import multiplication_task
from llmgym.models import build_tiny_model, supervised_warmup
from llmgym.rollout import evaluate
from llmgym.tools import ToolCall, write_tool_calls

DIGITS = dict(min_digits=3, max_digits=3)
WARMUP_STEPS = 550
WARMUP_TASKS = 1000
ANSWER_REPEATS = 3
STEPS = 30
MAX_NEW_TOKENS = 96  # a call is ~85 tokens of the byte-level tokenizer
BATCH = dict(tasks_per_step=16, group_size=8)
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW_TOKENS)
SEED = 0
MARGIN = 0.05
AGENTS = [(GRPO, dict(lr=1e-3, kl_coef=0.0))]
pytestmark = pytest.mark.skipif(
    not os.environ.get("LLMGYM_TOOL_LEARNING"),
    reason="the tool learning recipe is not measured to pass yet (see this module's docstring); "
           "LLMGYM_TOOL_LEARNING=1 runs it (~13 min on 2 cores)",
)


def tasks(n: int, seed: int):
    rng = np.random.default_rng(seed)
    return [multiplication_task(rng, **DIGITS) for _ in range(n)]


HELD_OUT = tasks(64, seed=999) * 2  # 128 sampled episodes


def make_env(tokenizer):
    return gym.make("llmgym/Calculator-v0", tokenizer=tokenizer, **DIGITS)


def expert_pairs(tokenizer, n: int = WARMUP_TASKS, seed: int = 1) -> list[tuple[list[int], str]]:
    """(context ids, what to write) for both turns of ``n`` tasks, through the env: the call, then the answer.

    Answer pairs are repeated ``ANSWER_REPEATS`` times: they are a few tokens each against a call's ~85,
    and without the repeats the answer was still unlearnt after 500 steps (with them: 0.19 reward)."""
    env = make_env(tokenizer)
    calls, answers = [], []
    for task in tasks(n, seed):
        obs, _ = env.reset(options={"task": task})
        a, b = task.id.split("-")[1:]
        call = write_tool_calls([ToolCall("calculator", {"expression": f"{a} * {b}"})])
        calls.append((obs["prompt_ids"].tolist(), call))
        obs, *_ = env.step(tokenizer.encode(call, add_special_tokens=False) + [tokenizer.eos_token_id])
        answers.append((obs["prompt_ids"].tolist(), task.answer))
    return calls + answers * ANSWER_REPEATS


def warm_model(tokenizer, tiny_config, steps: int = WARMUP_STEPS):
    model = build_tiny_model(tokenizer, tiny_config)
    supervised_warmup(model, tokenizer, expert_pairs(tokenizer), steps=steps, batch_size=32, lr=3e-3, seed=0)
    return model


def held_out_reward(model, tokenizer, seed: int = SEED) -> float:
    return evaluate(make_env(tokenizer), HFEngine(model, tokenizer), HELD_OUT, SAMPLING, seed=1000 + seed)["mean_reward"]


def train(cls, config, model, tokenizer, seed: int = SEED, steps: int = STEPS):
    agent = cls(model, tokenizer, max_new_tokens=MAX_NEW_TOKENS, seed=seed, **{**BATCH, **config})
    return agent.learn(make_env(tokenizer), steps=steps)


@pytest.fixture(scope="module")
def warm_base(tokenizer, tiny_config):
    model = warm_model(tokenizer, tiny_config)
    return model, held_out_reward(model, tokenizer)


@pytest.mark.parametrize("cls, config", AGENTS, ids=lambda x: getattr(x, "name", ""))
def test_grpo_raises_the_calculator_reward(cls, config, warm_base, tokenizer):
    base, before = warm_base
    assert 0.0 < before < 0.9, f"the warm-up should leave the model imperfect but not hopeless, got {before:.3f}"
    model = copy.deepcopy(base)
    history = train(cls, config, model, tokenizer)
    after = held_out_reward(model, tokenizer)
    assert len(history) == STEPS
    assert after > before + MARGIN, f"{cls.name}: held-out reward {before:.3f} -> {after:.3f}"


def test_the_tool_task_benches_and_trains_from_the_command_line(warm_base, tokenizer, tmp_path, capsys):
    from llmgym.cli import main
    from llmgym.models import save_pretrained

    model, before = warm_base
    model_dir = str(save_pretrained(model, tokenizer, tmp_path / "warm"))
    digits = ["--env-arg", "min_digits=3", "--env-arg", "max_digits=3"]
    out = tmp_path / "bench.json"
    assert main(["bench", "--env", "llmgym/Calculator-v0", "--model", model_dir, "--samples", "4", "--tasks", "16",
                 "--max-new-tokens", str(MAX_NEW_TOKENS), "--out", str(out), *digits]) == 0
    report = json.loads(out.read_text())
    assert report["tasks"] == 16 and 0.0 < report["reward_mean"] <= 1.0  # the warm model calls, reads, answers
    run = tmp_path / "run"
    assert main(["train", "--env", "llmgym/Calculator-v0", "--agent", "grpo", "--model", model_dir, "--steps", "1",
                 "--out", str(run), "--set", "tasks_per_step=2", "--set", "group_size=2",
                 "--set", f"max_new_tokens={MAX_NEW_TOKENS}", *digits]) == 0
    assert (run / "metrics.jsonl").exists() and (run / "checkpoints" / "last").exists()
