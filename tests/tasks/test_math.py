"""Math: answer equivalence, extraction, time limits, batches, format reward, math envs, reasoning-gym."""

from __future__ import annotations

import collections
import concurrent.futures
import json
import multiprocessing
import re
import sys
import threading
import time
import types
from pathlib import Path

import gymnasium
import numpy as np
import pytest

import llmgym
from llmgym import Task

pytest.importorskip("math_verify")

from llmgym.envs.math import (
    MathVerifier,
    ThinkAnswerFormat,
    arithmetic_task,
    extract_answer,
    load_gsm8k,
    load_math,
    math_reward,
    normalize_gold,
)


DATA = Path(__file__).resolve().parents[1] / "data"
GSM8K_SAMPLE = DATA / "gsm8k_sample.jsonl"
MATH_SAMPLE = DATA / "math_sample.jsonl"

# Expanding and comparing degree-5000 polynomials takes SymPy minutes: a check that must be abandoned.
HANGING = ("(x+1)^{5000}", r"\boxed{(x+2)^{5000}}")
# Slow but finite (under a second here).
SLOW = ("(x+1)^{150}", r"\boxed{(x+2)^{150}}")

GSM8K_GOLD = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)

# (a, b, equal): each pair is checked both ways, a as gold and b as the completion, then swapped.
EQUIVALENCE = [
    (r"\frac{1}{2}", "0.5", True),
    (r"\frac{1}{2}", "1/2", True),
    (r"\frac{1}{2}", r"\boxed{\frac12}", True),
    (r"\frac{1}{2}", r"$\dfrac{1}{2}$", True),
    (r"\frac{1}{2}", "0.25", False),
    (r"\frac{1}{2}", "2", False),
    ("42", "The answer is 42.", True),
    ("42", "The answer is 41.", False),
    ("The answer is 42.", r"\boxed{42}", True),
    (GSM8K_GOLD, "72", True),
    (GSM8K_GOLD, "24", False),
    ("#### 18", r"so she has \boxed{18} eggs", True),
    ("#### 18", "17", False),
    ("#### 1,250", "1250", True),
    ("1,000", "1000", True),
    (r"\{1, 2\}", r"\{2, 1\}", True),
    (r"\{1, 2\}", r"\{1, 3\}", False),
    ("1, 2", r"\{2, 1\}", True),
    ("(1, 2)", r"\left(1, 2\right)", True),
    ("(1, 2)", "(2, 1)", False),
    (r"\left( 3, \frac{\pi}{2} \right)", r"$(3, \pi/2)$", True),
    (r"\left( 3, \frac{\pi}{2} \right)", r"$(3, \pi)$", False),
    (r"\sqrt{2}", "2^{1/2}", True),
    (r"3\sqrt{3}", "3", False),
    ("x = 3", "3", True),
    ("-7", "The final answer is -7", True),
    ("-7", "7", False),
    (r"\text{Monday}", "Monday", True),
    ("5", "<think>2 + 2 = 4, and 4 + 1 is 5</think><answer>5</answer>", True),
    ("5", "<think>it is 5</think><answer>6</answer>", False),
    # the string fast path keeps meaningful spaces and the case of symbols
    ("11/2", "1 1/2", False),
    ("12", "1 2", False),
    ("-12", "-1 2", False),
    ("2N", "2n", False),
    (r"\Delta", r"\delta", False),
    ("1 + 2x", "1+2x", True),
    ("(1 , 2)", "(1,2)", True),
    ("x + N", "N + x", True),
    ("Monday", "monday", True),
    (r"\text{New York}", "new york", True),
    (r"\pi r^2", r"\pi\, r^2", True),
]


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(time_limit=10.0) as v:
        yield v


@pytest.mark.parametrize("a, b, equal", EQUIVALENCE, ids=[f"{i}" for i in range(len(EQUIVALENCE))])
def test_answer_equivalence_both_directions(verifier, a, b, equal):
    forward = verifier(Task("q", answer=a), b)
    backward = verifier(Task("q", answer=b), a)
    assert forward.reward == float(equal), forward.info
    assert backward.reward == float(equal), backward.info


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"first $x=1$, then \boxed{2} and finally \boxed{\frac{3}{4}}", r"\frac{3}{4}"),
        ("<answer>7</answer> but \\boxed{8} outside", "7"),
        ("<think>maybe \\boxed{3}</think> It is 4", "4"),
        ("The final answer is $\\frac{1}{2}$. I hope it is correct.", r"\frac{1}{2}"),
        ("Answer: 12 apples", "12"),
        ("#### 1,250", "1,250"),
        ("He bought 3 pens for $5 and paid $7 in total", "7"),
        ("It costs 12.50 dollars", "12.50"),
        ("so x = 48/2", "48/2"),
        ("x = 48/2", "x = 48/2"),
        ("I am not sure how to solve this one.", None),
    ],
)
def test_extraction_rules(text, expected):
    assert extract_answer(text) == expected


def test_a_number_inside_code_or_a_path_after_an_answer_marker_is_no_answer(verifier):
    # "The answer is <payload>" took the payload's first number: the 2 of pytest's "pytest-2" folder paid for a
    # reference of 2 (a test passed or failed with the temporary folder's name)
    payload = "__import__('os').system('touch /tmp/pytest-of-root/pytest-2/pwned-1a2b; setsid sleep 4321.5 &')"
    for completion in (f"The answer is {payload}", "The answer is x2.", "answer: run-2 of 3", "Answer: 'v2'"):
        assert extract_answer(completion) != "2", completion
        assert verifier(Task("q", answer="2"), completion).reward == 0.0, completion
    for completion in ("The answer is 2.", "answer: 2 apples", "The answer is -2, I think", "The answer is (2)"):
        assert extract_answer(completion).lstrip("-(").rstrip(")") == "2", completion


def test_gold_normalisation_of_stored_forms():
    assert normalize_gold("some work... #### 1,250") == "1,250"
    assert normalize_gold(r"\frac{1}{2}") == r"\frac{1}{2}"
    assert normalize_gold(r"We get $\boxed{\sqrt{2}}$.") == r"\sqrt{2}"
    assert normalize_gold(7) == "7" and normalize_gold(0.5) == "0.5"
    with pytest.raises(ValueError, match="no reference answer"):
        normalize_gold(None)


def test_a_matrix_gold_is_kept_whole_and_its_last_entry_alone_scores_nothing(verifier):
    """MATH stores matrix and vector answers as bare ``pmatrix`` LaTeX. The environment's name read as a
    word made the gold "text", and the last-number rule reduced it to its last entry: a completion
    answering only that entry scored 1.0 and the right matrix scored 0."""
    gold = r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}"
    assert normalize_gold(gold) == gold
    task = Task(id="matrix", prompt="Compute the matrix.", answer=gold)
    assert verifier.verify(task, rf"So the matrix is \boxed{{{gold}}}.").reward == 1.0
    assert verifier.verify(task, r"\boxed{\begin{pmatrix} 1 & 2 \\ 3 & 5 \end{pmatrix}}").reward == 0.0
    assert verifier.verify(task, r"The answer is \boxed{4}.").reward == 0.0
    column = r"\begin{pmatrix} 2 \\ -1 \end{pmatrix}"
    assert verifier.verify(Task(id="v", prompt="p", answer=column), rf"\boxed{{{column}}}").reward == 1.0


def test_numbers_and_missing_answers_score_safely(verifier):
    from fractions import Fraction

    assert verifier(Task("q", answer=Fraction(1, 2)), "0.5").reward == 1.0
    assert verifier(Task("q", answer=18), "#### 18").reward == 1.0
    missing = verifier(Task("q"), "5")
    assert missing.reward == 0.0 and "no reference answer" in missing.info["error"]
    nothing = verifier(Task("q", answer="5"), "I am not sure how to solve this one.")
    assert nothing.reward == 0.0 and "no answer found" in nothing.info["error"]


# -- time limits ------------------------------------------------------------------------------------


def test_works_and_times_out_off_the_main_thread():
    results = {}
    threads_before = set(threading.enumerate())  # e.g. tqdm's monitor, started by an earlier test

    def run():
        results["ok"] = MathVerifier(time_limit=10.0)(Task("q", answer="1/2"), r"\boxed{0.5}")
        start = time.perf_counter()
        results["slow"] = MathVerifier(time_limit=0.5)(Task("q", answer=HANGING[0]), HANGING[1])
        results["elapsed"] = time.perf_counter() - start

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(300)  # a hang guard only (a loaded machine is slow)
    assert results["ok"].reward == 1.0, results["ok"].info  # no "signal only works in main thread"
    # behaviour, not speed: the watchdog gave up at its 0.05 s limit (the check itself takes longer)
    assert results["slow"].reward == 0.0 and results["slow"].info["error"].startswith("timeout")
    assert results["elapsed"] < 120  # the check takes many minutes: it was stopped (a hang guard, not a speed test)
    # ... by killing its worker process: no thread of ours is left running it
    assert [t for t in threading.enumerate() if t.is_alive() and t not in threads_before] == []


def test_numbers_decided_on_the_host_agree_with_math_verify():
    # Plain numbers never leave the host when the verdict is certain: it must be math-verify's own.
    from llmgym.envs.math.scorer_pools import MATH_VERIFY_WORKER
    from llmgym.envs.math.math_verifier import _host_verdict
    from llmgym.sandbox.worker import SandboxWorker, site_packages

    numbers = ["0", "-0", "18", "-18", "1000", "1,000", "1,000,000", "0.5", ".5", "1/2", r"\frac{1}{2}",
               r"\frac12", r"\dfrac{2}{4}", "1/3", "0.333333", "0.3333", "3.5", "7/2", "0.1", "1/10",
               "1.0000001", "12345678901234567890", "12345678901234567891", "-7/2"]
    pairs = [(g, p) for g in numbers for p in numbers if _host_verdict(g, p, 6) is not None]
    undecided = [(g, p) for g in numbers for p in numbers if _host_verdict(g, p, 6) is None]
    assert len(pairs) > 400 and ("1/3", "0.333333") in undecided  # close decimals are math-verify's call
    source = MATH_VERIFY_WORKER + (
        "\ndef prepare(context):\n    return context\n"
        "def handle(state, pairs):\n"
        "    return [float(mv.verify(_parse(g), _parse(p), float_rounding=6, numeric_precision=15, strict=True,\n"
        "                            timeout_seconds=None)) for g, p in pairs]\n")
    with SandboxWorker(source, paths=site_packages("math_verify")) as worker:
        status, verdicts = worker.call(None, pairs, time_limit=300)
    assert status == "ok", verdicts
    disagree = [(g, p, v) for (g, p), v in zip(pairs, verdicts) if _host_verdict(g, p, 6) != v]
    assert disagree == []


def test_astronomical_numbers_are_refused_quickly():
    # SymPy would compute 9^(9^9) exactly, in C calls that hold the GIL for minutes: the verifier
    # refuses by size (the error says why) before computing anything
    MathVerifier()(Task("q", answer="1/2"), "0.5")  # start the shared worker first: its start-up is not the point
    start = time.perf_counter()
    score = MathVerifier(time_limit=5.0)(Task("q", answer="1"), r"\boxed{9^{9^{9}}}")
    assert score.reward == 0.0 and "bits" in score.info["error"]
    assert MathVerifier()(Task("q", answer="1"), r"\boxed{(10^{7})!}").info["error"].endswith("not compared")
    assert time.perf_counter() - start < 60  # a hang guard only: milliseconds when quiet, minutes if computed
    # small powers and factorials are computed (the form check, off here, would refuse them for a written-out reference)
    assert MathVerifier(check_form=False)(Task("q", answer="1024"), r"\boxed{2^{10}}").reward == 1.0
    assert MathVerifier(check_form=False)(Task("q", answer="3628800"), r"\boxed{10!}").reward == 1.0


def test_works_inside_a_worker_process():
    ctx = multiprocessing.get_context("spawn")  # a user's own worker process starts its own sandboxed worker
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        good = pool.submit(MathVerifier(time_limit=10.0), Task("q", answer=r"\frac{1}{2}"), "0.5").result(60)
        slow = pool.submit(MathVerifier(time_limit=0.05), Task("q", answer=SLOW[0]), SLOW[1]).result(60)
    assert good.reward == 1.0, good.info
    assert slow.reward == 0.0 and slow.info["error"].startswith("timeout")


def test_verify_batch_matches_sequential_and_abandons_a_hung_check():
    tasks = [Task("q", answer=r"\frac{1}{2}"), Task("q", answer=HANGING[0]), Task("q", answer="#### 18"),
             Task("q", answer="(1, 2)"), Task("q", answer="3")]
    completions = ["0.5", HANGING[1], "The answer is 18.", "(2, 1)", "<answer>3</answer>"]
    with MathVerifier(time_limit=1.5) as v:
        start = time.perf_counter()
        scores = v.verify_batch(tasks, completions, max_workers=2)
        elapsed = time.perf_counter() - start
        assert [s.reward for s in scores] == [1.0, 0.0, 1.0, 0.0, 1.0]
        assert scores[1].info["error"].startswith("timeout")
        assert elapsed < 90  # a hang guard: the hung check was abandoned at 1.5 s, not waited for (minutes)
        # the killed worker was replaced: the next batch runs normally, same results as one by one
        again = v.verify_batch(tasks[:1] + tasks[2:], completions[:1] + completions[2:], max_workers=2)
        sequential = v.verify_batch(tasks[:1] + tasks[2:], completions[:1] + completions[2:])
        assert [s.reward for s in again] == [s.reward for s in sequential] == [1.0, 1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="2 tasks but 1 completions"):
        MathVerifier().verify_batch(tasks[:2], completions[:1])


# -- format and combined reward ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, ok",
    [
        ("<think>2+2=4</think><answer>4</answer>", True),
        ("  <think>\nlong\nthought\n</think>\n\n<answer> 4 </answer>\n", True),
        ("<answer>4</answer>", False),
        ("<think>a</think>", False),
        ("<think>a</think><answer></answer>", False),
        ("<think>a</think><answer>4</answer> trailing text", False),
        ("<think>a</think><think>b</think><answer>4</answer>", False),
        ("<answer>4</answer><think>a</think>", False),
    ],
)
def test_think_answer_format(completion, ok):
    assert ThinkAnswerFormat()(Task("q"), completion).reward == float(ok)


def test_math_reward_weights_format_and_correctness():
    reward = math_reward(format_weight=0.2)
    task = Task("q", answer=r"\frac{1}{2}")
    both = reward(task, "<think>half</think><answer>0.5</answer>")
    assert both.reward == pytest.approx(1.0)
    assert both.info["format"]["reward"] == 1.0 and both.info["correct"]["reward"] == 1.0
    assert reward(task, "0.5").reward == pytest.approx(0.8)
    assert reward(task, "<think>x</think><answer>3</answer>").reward == pytest.approx(0.2)
    with pytest.raises(ValueError):
        math_reward(format_weight=1.5)


# -- arithmetic -----------------------------------------------------------------------------------


def test_arithmetic_tasks_are_seeded_and_correct():
    for seed in range(200):
        task = arithmetic_task(np.random.default_rng(seed), min_ops=1, max_ops=4)
        expression = task.metadata["expression"]
        assert eval(expression.replace("/", "//")) == int(task.answer)  # "/" only where exact
        assert arithmetic_task(np.random.default_rng(seed), min_ops=1, max_ops=4) == task
    n_ops = {len(re.findall(r" [-+*/] ", arithmetic_task(np.random.default_rng(s), 2, 4).metadata["expression"]))
             for s in range(50)}
    assert n_ops == {2, 3, 4}


def test_arithmetic_env_through_gymnasium():
    env = gymnasium.make("llmgym/Arithmetic-v0", max_ops=3)
    obs, info = env.reset(seed=5)
    answer = info["task"].answer
    assert obs["prompt"] == info["task"].prompt and "\\boxed{}" in obs["prompt"]
    assert env.step(f"Working... \\boxed{{{answer}}}")[1] == 1.0
    env.reset(seed=5)
    assert env.step(f"\\boxed{{{int(answer) + 1}}}")[1] == 0.0


# -- GSM8K / MATH files --------------------------------------------------------------------------


def test_load_gsm8k_sample():
    tasks = load_gsm8k(GSM8K_SAMPLE)
    assert [t.answer for t in tasks] == ["18", "84", "1250", "11"]
    assert tasks[0].metadata["solution"].endswith("#### 18") and tasks[0].id == "gsm8k/0"
    assert "\\boxed{}" in tasks[0].prompt and tasks[0].metadata["question"] in tasks[0].prompt
    assert len(load_gsm8k(GSM8K_SAMPLE, limit=2, prompt="Q: {question}\nA:")) == 2
    verifier = MathVerifier()
    for task in tasks:  # the stored worked solution is itself a correct completion
        assert verifier(task, task.metadata["solution"]).reward == 1.0


def test_load_math_sample():
    tasks = load_math(MATH_SAMPLE)
    assert [t.answer for t in tasks][:4] == [r"\frac{1}{2}", r"\sqrt{3}", r"\left( 3, \frac{\pi}{2} \right)", "1, 2"]
    assert len(tasks) == 18 and tasks[4].answer == "70"
    assert tasks[0].id == "sample/prealgebra/1.json" and tasks[1].id == "math/1"  # answer from \boxed{}
    assert tasks[0].metadata["level"] == "Level 2" and tasks[0].metadata["type"] == "Prealgebra"
    verifier = MathVerifier()
    for task in tasks:
        assert verifier(task, task.metadata["solution"]).reward == 1.0, task.id


def test_loaders_read_json_and_report_bad_files(tmp_path):
    rows = [json.loads(line) for line in GSM8K_SAMPLE.read_text().splitlines()]
    (tmp_path / "g.json").write_text(json.dumps(rows))
    assert [t.answer for t in load_gsm8k(tmp_path / "g.json")] == ["18", "84", "1250", "11"]
    (tmp_path / "bad.jsonl").write_text('{"question": "q", "answer": "no marker"}\n')
    with pytest.raises(ValueError, match="####"):
        load_gsm8k(tmp_path / "bad.jsonl")
    with pytest.raises(FileNotFoundError):
        load_math(tmp_path / "missing.jsonl")


def test_loaders_use_the_datasets_cache_when_no_path(monkeypatch):
    calls = []
    fake = types.ModuleType("datasets")

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        return [{"problem": "1+1?", "solution": r"\boxed{2}", "answer": "2"}]

    fake.load_dataset = load_dataset
    fake.config = types.SimpleNamespace(HF_HUB_OFFLINE=True)  # offline: no probe of the hub
    monkeypatch.setitem(sys.modules, "datasets", fake)
    assert load_math(split="test")[0].answer == "2"
    assert calls == [("HuggingFaceH4/MATH-500", None, "test")]


def test_dataset_envs_need_a_path_or_a_cache(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if `datasets` were not installed
    for env_id in ("llmgym/GSM8K-v0", "llmgym/MATH-v0"):
        with pytest.raises(TypeError, match="path="):
            gymnasium.make(env_id)
    with pytest.raises(ModuleNotFoundError, match="pip install datasets"):
        load_gsm8k()
    env = gymnasium.make("llmgym/MATH-v0", path=str(MATH_SAMPLE))
    obs, info = env.reset(seed=1)
    assert env.step(f"The answer is $\\boxed{{{info['task'].answer}}}$")[1] == 1.0


def test_parquet_loading(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [json.loads(line) for line in MATH_SAMPLE.read_text().splitlines()]
    keys = ["problem", "solution", "level", "type"]
    pq.write_table(pa.Table.from_pylist([{k: r[k] for k in keys} for r in rows]), tmp_path / "m.parquet")
    assert load_math(tmp_path / "m.parquet")[0].answer == r"\frac{1}{2}"


# -- reasoning-gym --------------------------------------------------------------------------------


def test_reasoning_gym_static_list_matches_the_library():
    pytest.importorskip("reasoning_gym")
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    offline = []
    for name in sorted(DATASETS):
        try:
            reasoning_gym.create_dataset(name, size=1, seed=0)[0]
        except Exception:  # needs a configuration (composite) or a download
            continue
        offline.append(name)
    assert list(llmgym.env.registry.REASONING_GYM_DATASETS) == offline
    ids = {e.id for e in llmgym.registered_envs("reasoning-gym")}
    assert ids == {f"llmgym/RG-{name}-v0" for name in offline}
    assert all(e.requires == ("reasoning_gym",) for e in llmgym.registered_envs("reasoning-gym"))


@pytest.mark.parametrize("dataset", ["basic_arithmetic", "chain_sum", "word_sorting", "letter_counting", "gcd"])
def test_reasoning_gym_own_answer_scores_one(dataset):
    pytest.importorskip("reasoning_gym")
    env = gymnasium.make(f"llmgym/RG-{dataset}-v0")
    for seed in range(3):
        obs, info = env.reset(seed=seed)
        task = info["task"]
        assert task.metadata["entry"]["question"] in obs["prompt"]
        obs, reward, terminated, truncated, info = env.step(f"<think>easy</think><answer>{task.answer}</answer>")
        assert (reward, terminated) == (1.0, True), info
        env.reset(seed=seed)
        assert env.step(str(task.answer))[1] == 0.0  # no tags: no answer, as reasoning-gym scores it
        lenient = gymnasium.make(f"llmgym/RG-{dataset}-v0", lenient=True)
        lenient.reset(seed=seed)
        assert lenient.step(str(task.answer))[1] == 1.0  # the opt-in leniency: the whole completion


def test_reasoning_gym_env_is_lazy_seeded_and_configurable():
    pytest.importorskip("reasoning_gym")
    from llmgym.envs.math import reasoning

    env = gymnasium.make("llmgym/RG-chain_sum-v0", min_terms=5, max_terms=5, instruction=None)
    first = env.reset(seed=11)[1]["task"]
    assert env.reset(seed=11)[1]["task"] == first and env.reset(seed=12)[1]["task"] != first
    assert first.prompt == first.metadata["entry"]["question"]  # instruction=None: the bare question
    assert first.metadata["entry"]["metadata"]["num_terms"] == 5
    before = len(reasoning._cache)
    gymnasium.make("llmgym/RG-sudoku-v0")  # making builds nothing ...
    assert len(reasoning._cache) == before
    with pytest.raises(TypeError, match="reset\\(seed="):
        gymnasium.make("llmgym/RG-chain_sum-v0", size=1000)
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset"):
        reasoning.make_env(dataset="chain_summ")


def test_reused_dataset_instances_give_the_same_items_as_fresh_ones():
    pytest.importorskip("reasoning_gym")
    import reasoning_gym

    from llmgym.envs.math import reasoning

    for dataset in sorted(reasoning.REUSABLE_DATASETS):
        for seed in (3, 1234567):
            fresh = reasoning_gym.create_dataset(dataset, size=1, seed=seed)[0]
            assert reasoning._build(dataset, {}, seed)[0] == fresh, dataset


# One process per hash seed: make every RG env, take its first task, print {dataset: [prompt, answer]} as JSON.
_FIRST_TASKS_SCRIPT = """
import contextlib, json, sys, warnings
import gymnasium
import llmgym
warnings.simplefilter("ignore")
out = {}
with contextlib.redirect_stdout(sys.stderr):  # some generators print
    for name in llmgym.env.registry.REASONING_GYM_DATASETS:
        obs, info = gymnasium.make(f"llmgym/RG-{name}-v0").reset(seed=0)
        out[name] = [obs["prompt"], repr(info["task"].answer)]
print(json.dumps(out))
"""


def test_exactly_the_hash_seed_dependent_datasets_vary_across_processes():
    pytest.importorskip("reasoning_gym")
    import os
    import subprocess

    from llmgym.envs.math.reasoning import HASH_SEED_DEPENDENT

    root = Path(__file__).resolve().parents[2]
    runs = []
    for hash_seed in ("0", "3"):  # two seeds under which every listed dataset gives another first task
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        runs.append(subprocess.Popen([sys.executable, "-c", _FIRST_TASKS_SCRIPT], cwd=root, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    for proc in runs:
        # a hang guard only: under a load of ~15 on 2 cores the two builds of 105 datasets took over 120 s
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-2000:]
        outputs.append(json.loads(stdout))
    first, second = outputs
    assert len(first) == len(llmgym.env.registry.REASONING_GYM_DATASETS) == 105
    differing = {name for name in first if first[name] != second[name]}
    assert differing == set(HASH_SEED_DEPENDENT)


def test_hash_seed_dependent_datasets_are_described_and_warn_once(monkeypatch):
    pytest.importorskip("reasoning_gym")
    import warnings

    from llmgym.envs.math import reasoning

    for info in llmgym.registered_envs("reasoning-gym"):
        dataset = info.id.removeprefix("llmgym/RG-").removesuffix("-v0")
        assert ("PYTHONHASHSEED=0" in info.description) == (dataset in reasoning.HASH_SEED_DEPENDENT), info.id
    monkeypatch.setattr(reasoning, "_warned_hash_seed", set())
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.warns(RuntimeWarning, match="PYTHONHASHSEED=0"):
        gymnasium.make("llmgym/RG-ransom_note-v0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gymnasium.make("llmgym/RG-ransom_note-v0")  # once only
        gymnasium.make("llmgym/RG-chain_sum-v0")  # not hash-seed dependent
        monkeypatch.setenv("PYTHONHASHSEED", "0")
        gymnasium.make("llmgym/RG-word_ladder-v0")  # the hash seed is fixed
    monkeypatch.setenv("PYTHONHASHSEED", "random")
    with pytest.warns(RuntimeWarning, match="word_ladder"):
        gymnasium.make("llmgym/RG-word_ladder-v0")


def test_list_functions_items_do_not_depend_on_the_global_random_state(monkeypatch):
    pytest.importorskip("reasoning_gym")
    import random

    from llmgym.envs.math import reasoning

    tasks = []
    for global_seed in (1, 2):
        monkeypatch.setattr(reasoning, "_cache", collections.OrderedDict())
        random.seed(global_seed)
        tasks.append(reasoning.reasoning_gym_task("list_functions", seed=0))
    assert tasks[0] == tasks[1]


# -- host-side parsing is linear (issue 10) ----------------------------------------------------------


def test_think_answer_format_scanner_equals_its_pattern_and_is_linear():
    import random
    import re

    from llmgym.envs.math import ThinkAnswerFormat

    pattern = re.compile(ThinkAnswerFormat.PATTERN, re.DOTALL)
    fmt, rng = ThinkAnswerFormat(), random.Random(0)
    pieces = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "a", "\x1c", "<", ">", "\u3000", "b "]
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 9)))
        assert fmt(Task("q"), text).reward == float(bool(pattern.search(text))), repr(text)
    # the regex backtracks quadratically over an unclosed answer (16k characters: 7 s); the scanner
    # does not (a hang guard, not a speed test)
    start = time.perf_counter()
    assert fmt(Task("q"), "<think>a</think><answer>" + "a" * 64_000).reward == 0.0
    assert time.perf_counter() - start < 2.0


def test_extraction_matches_the_old_regexes_and_is_linear():
    import random
    import re

    from llmgym.envs.math.answer_extraction import _BOXED, last_boxed as _last_boxed, math_spans as _math_spans

    span = re.compile(r"(?<!\\)\$\$(.+?)(?<!\\)\$\$|(?<!\\)\$(.+?)(?<!\\)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)

    def old_boxed(text):
        for match in reversed(list(_BOXED.finditer(text))):
            depth, begin = 1, match.end()
            for i in range(begin, len(text)):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                if depth == 0:
                    return text[begin:i]
        return None

    rng = random.Random(0)
    pieces = ["$", "$$", "\\", "(", ")", "[", "]", "a", " ", "\\(", "\\)", "\\[", "\\]", "\\$", "{", "}",
              "\\boxed{", "}}"]
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert _math_spans(text) == [next(g for g in m.groups() if g is not None) for m in span.finditer(text)]
        assert _last_boxed(text) == old_boxed(text), repr(text)
    for adversarial in ["\\(" * 128_000, "$" * 256_000, "\\boxed{" * 36_000, "a" + " " * 256_000 + "b",
                        "." * 256_000 + "x", "answer is" + " " * 256_000]:
        start = time.perf_counter()
        extract_answer(adversarial)
        assert time.perf_counter() - start < 5.0  # quadratic versions took minutes (a hang guard)


_EXTRACTION_CASES = [
    "<answer>4</answer>", "<answer> 4 </answer>", "<answer>\n 4\n</answer>", "4", "",
    "<answer>1</answer> then <answer>2</answer>", "<answer>1</answer><answer>2", "<answer>2",
    "<answer><answer>3</answer>", "<answer>1</answer></answer>5</answer>", "</answer><answer>6</answer>",
    "<ANSWER>7</ANSWER>", "<Answer>8</answer>", "<answer></answer>", "<answer> </answer>",
    "<answer>a\nb</answer>", "<answer>x</answer >", "< answer>9</answer>", "<answer>1<answer>2</answer>3</answer>",
]


def _fragments_text(rng):
    parts = ["<answer>", "</answer>", "<ANSWER>", "</Answer>", " ", "\n", "7", "x", "<", ">", "answer", "/"]
    return "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))


def test_reasoning_gym_extraction_equals_reasoning_gyms_own():
    pytest.importorskip("reasoning_gym")
    import random

    from reasoning_gym.utils import extract_answer as rg_extract

    from llmgym.envs.math.reasoning import extract_tagged_answer

    rng = random.Random(0)
    texts = _EXTRACTION_CASES + [_fragments_text(rng) for _ in range(3000)]
    for text in texts:
        assert extract_tagged_answer(text) == rg_extract(text), repr(text)
    assert rg_extract("4") is None and extract_tagged_answer("4") is None  # the reported difference


def test_reasoning_gym_lenient_extraction_is_opt_in_and_documented():
    from llmgym.envs.math.reasoning import extract_tagged_answer

    assert extract_tagged_answer(" 42\n", lenient=True) == "42"  # no tag: the whole completion
    assert extract_tagged_answer("<answer>2", lenient=True) == "2"  # unclosed last tag
    assert extract_tagged_answer("<ANSWER>7</ANSWER>", lenient=True) == "7"  # any case
    assert extract_tagged_answer("<answer>1</answer>x<answer>2", lenient=True) == "2"
    assert extract_tagged_answer("<answer>1</answer>x<answer>2") == "1"
    # hostile input: many opening tags and no closing one stays linear (reasoning-gym's regex rescans)
    hostile = "<answer>" * 20_000
    assert extract_tagged_answer(hostile) is None
    assert extract_tagged_answer(hostile, lenient=True) == hostile[len("<answer>"):]  # the first tag runs to the end


@pytest.mark.parametrize("dataset", ["basic_arithmetic", "countdown"])
def test_reasoning_gym_verifier_reward_equals_reasoning_gyms_pipeline(dataset):
    # reasoning-gym scores a completion as score_answer(extract_answer(completion), entry)
    pytest.importorskip("reasoning_gym")
    from reasoning_gym.utils import extract_answer as rg_extract

    from llmgym.envs.math.reasoning import ReasoningGymVerifier, _scorer, reasoning_gym_task

    task = reasoning_gym_task(dataset, seed=3)
    meta = task.metadata
    ds = _scorer(dataset, {}, meta["seed"])
    gold = str(task.answer)
    parity = ReasoningGymVerifier(scoring="upstream")  # evaluation parity; the RL default is binary
    for text in (gold, f"<answer>{gold}</answer>", f"<answer>{gold}", "<answer>nope</answer>", ""):
        expected = float(ds.score_answer(rg_extract(text), meta["entry"]) or 0.0)
        assert parity(task, text).reward == expected, text
        assert ReasoningGymVerifier()(task, text).reward == float(expected == 1.0), text
    # countdown gives 0.01 to a missing answer; llmgym passes the None through, as reasoning-gym does
    if dataset == "countdown":
        assert parity(task, gold).reward == 0.01


def test_arithmetic_refuses_an_echo_of_the_question_and_false_equations():
    # red-team finding: math-verify evaluates expressions, so "\boxed{8 * 18}" for "Compute 8 * 18"
    # scored 1.0 on 50/50 seeds; Arithmetic wants the number written out
    env = gymnasium.make("llmgym/Arithmetic-v0")
    for seed in range(10):
        _, info = env.reset(seed=seed)
        task = info["task"]
        expression = task.metadata["expression"]
        assert env.step(rf"\boxed{{{expression}}}")[1] == 0.0, expression
        env.reset(seed=seed)
        assert env.step(rf"\boxed{{0 = {task.answer}}}")[1] == 0.0
        env.reset(seed=seed)
        assert env.step(rf"The answer is \boxed{{{task.answer}}}.")[1] == 1.0
        env.reset(seed=seed)
        assert env.step(f"x = {task.answer}")[1] == 1.0
    # the general verifier takes an expression where the reference is one; where the reference is written out
    # (144), so must the answer be -- math-verify alone (check_form=False) would take 8 * 18
    assert MathVerifier()(Task("q", answer="144"), r"\boxed{8 \cdot 18}").reward == 0.0
    assert MathVerifier(check_form=False)(Task("q", answer="144"), r"\boxed{8 \cdot 18}").reward == 1.0
    assert MathVerifier()(Task("q", answer="2^{3} \cdot 18"), r"\boxed{8 \cdot 18}").reward == 1.0


def test_gsm8k_without_a_file_reads_only_the_cache_when_the_hub_is_unreachable(monkeypatch):
    # offline, load_dataset spent ~30 s in retries before failing: one short probe decides instead
    import datasets
    import huggingface_hub

    from llmgym.envs.math import load_gsm8k

    seen = {}

    def unreachable(*args, **kwargs):
        raise OSError("Name or service not known")

    def fake_load_dataset(*args, **kwargs):
        seen["offline"] = datasets.config.HF_HUB_OFFLINE
        raise ConnectionError("not in the cache")

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "dataset_info", unreachable)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    with pytest.raises(RuntimeError, match="path='file.jsonl'"):
        load_gsm8k()
    assert seen["offline"] is True and datasets.config.HF_HUB_OFFLINE is False  # restored after
