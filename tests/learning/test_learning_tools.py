"""Learning to use a tool: GRPO raises the tiny model's held-out reward on ``llmgym/Calculator-v0``.

The tiny model (with the tiny tokenizer's chat template, which has tool roles) gets a supervised warm-up
built by stepping the env itself: for each task, the context the env shows is paired with the call a
tool user writes (``write_tool_calls``), and the context after the calculator's reply with the answer.
Half the warm-up's answers are near misses (the tool's result with its last digit off by one), so the
warm model calls the calculator, reads the result and answers, but copies it right only about half the
time. GRPO then trains on the env (multi-turn episodes, the calculator in the tool worker) and has to
make the right answer win: the mean reward of sampled episodes on a fixed held-out set must rise by a
clear margin.

Factors have a fixed 3 digits (products of 5-6 digits, no sum a tiny model does in its head): the
model must copy them into its call across ~80 tokens of call syntax, which it learns only late in the
warm-up (after 350 steps it never did; lengths that vary were not learnt in 600).

Held-out reward before -> after ``STEPS`` with this recipe (900 warm-up steps), measured with
``benchmarks/learning_spread.py --recipes tools`` (tabled in docs/learning_tests.md), 2026-11-27,
shared 2-core AMD EPYC (load 5-15): AVX2 kernels, 2 threads (the CI's setting), seed 0: 0.406 -> 0.594
(+0.188, 2.3x ``MARGIN``). Since then, with ``spread(seed)`` in a fresh process per setting (quiet
machine, docs/learning_tests.md): AVX2, 1 thread, seeds 0-2: +0.188, +0.289, +0.250;
``ATEN_CPU_CAPABILITY=default``, 1 thread, seed 0: +0.258, 2 threads, seeds 0-1: +0.258, +0.242; the
``default`` family (MKL and oneDNN generic too), 1 thread, seed 0: +0.273. The smallest is 2.3x ``MARGIN``. With the earlier 550-step warm-up (older numerics) the warm model started at
0.06-0.23 depending on kernels and threads (default kernels: +0.211 and +0.102 on 1 and 2 threads; AVX2:
+0.016 on 1 thread, and 0.062 -> 0.094 in the CI), i.e. nearly hopeless on AVX2: hence 900 steps.
Older figures (550 steps, one machine, 2026-11-26):

    seed 0, 1 thread: 0.227 -> 0.445 (+0.219)     seed 0, 2 threads: 0.164 -> 0.500 (+0.336)
    seed 1, 1 thread: 0.242 -> 0.398 (+0.156)     seed 1, 2 threads: 0.102 -> 0.445 (+0.344)

The thread count and kernels move the warm model itself more than the seed does. Recipes that
failed: lr 1e-3 took seed 1 to 0.0 within 10 steps (seed 0: +0.148); without the near-miss answers the warm model scored 0.578 and GRPO (lr 1e-3, 30 steps of
16 x 8) ended at 0.523. Cost on 1 thread (550-step warm-up): warm-up ~170 CPU s, 20 GRPO steps ~85 CPU s, each held-out
evaluation ~10 CPU s.
"""

from __future__ import annotations

import copy
import json

import gymnasium as gym
import numpy as np
import pytest

import llmgym  # noqa: F401
from llmgym.agents import GRPO
from llmgym.engines import HFEngine, SamplingParams
from llmgym.envs.tools.calculator import multiplication_task
from llmgym.runtime.models import build_tiny_model
from llmgym.rollout import evaluate
from llmgym.tools import ToolCall, write_tool_calls
from warm_cache import cached_warmup  # tests/ is on sys.path

DIGITS = dict(min_digits=3, max_digits=3)
WARMUP_STEPS = 900
WARMUP_TASKS = 1000
ANSWER_REPEATS = 3
DISTRACTOR_SHARE = 0.5  # of the warm-up's answers: the tool's result with its last digit off by one
STEPS = 20
MAX_NEW_TOKENS = 96  # a call is ~85 tokens of the byte-level tokenizer
BATCH = dict(tasks_per_step=8, group_size=8)
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW_TOKENS)
SEED = 0
MARGIN = 0.08
AGENTS = [(GRPO, dict(lr=3e-4, kl_coef=0.0))]


def tasks(n: int, seed: int):
    rng = np.random.default_rng(seed)
    return [multiplication_task(rng, **DIGITS) for _ in range(n)]


HELD_OUT = tasks(64, seed=999) * 2  # 128 sampled episodes


def make_env(tokenizer):
    return gym.make("llmgym/Calculator-v0", tokenizer=tokenizer, **DIGITS)


def expert_pairs(tokenizer, n: int = WARMUP_TASKS, seed: int = 1) -> list[tuple[list[int], str]]:
    """(context ids, what to write) for both turns of ``n`` tasks, through the env: the call, then the answer
    (for the first ``DISTRACTOR_SHARE`` of the tasks, a near miss of it).

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
        wrong = len(answers) < DISTRACTOR_SHARE * n  # the warm-up samples pairs at random
        near_miss = task.answer[:-1] + str((int(task.answer[-1]) + 1) % 10)
        answers.append((obs["prompt_ids"].tolist(), near_miss if wrong else task.answer))
    return calls + answers * ANSWER_REPEATS


def warm_model(tokenizer, tiny_config, steps: int = WARMUP_STEPS):
    """The warm-up's model, built once per machine set-up and cached (``tests/warm_cache.py``)."""
    settings = dict(steps=steps, batch_size=32, lr=3e-3, seed=0)
    return cached_warmup("calculator", lambda: build_tiny_model(tokenizer, tiny_config), tokenizer,
                         expert_pairs(tokenizer), settings)


def held_out_reward(model, tokenizer, seed: int = SEED) -> float:
    return evaluate(make_env(tokenizer), HFEngine(model, tokenizer), HELD_OUT, SAMPLING, seed=1000 + seed)["reward_mean"]


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
    from llmgym.runtime.models import save_pretrained

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


def spread(seed: int):
    """This file's learning assertion at agent seed ``seed`` (the test runs ``SEED``), as rows for
    ``benchmarks/learning_spread.py``: ``value`` is compared with ``bound``."""
    from conftest import tiny_shape

    from llmgym.runtime.models import build_tokenizer

    tokenizer = build_tokenizer()
    base = warm_model(tokenizer, tiny_shape())
    before = held_out_reward(base, tokenizer, seed)
    for cls, config in AGENTS:
        model = copy.deepcopy(base)
        train(cls, config, model, tokenizer, seed=seed)
        after = held_out_reward(model, tokenizer, seed)
        yield {"check": f"test_grpo_raises_the_calculator_reward[{cls.name}]", "value": after - before, "bound": MARGIN,
               "before": before, "after": after}
