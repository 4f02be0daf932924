"""Interop without third-party env packages: llmgym envs and verifiers as TRL reward functions, the adapter
list, and ``import llmgym`` importing none of the adapters' packages.
"""

from __future__ import annotations

import subprocess
import sys

import gymnasium
import pytest

import llmgym  # noqa: F401
from llmgym import SequenceEnv, Task
from llmgym.cli import main
from llmgym.interop import trl_dataset, trl_reward_funcs
from llmgym.env.verifiers import RegexFormat, WeightedSum, exact_match


def _weighted_env():
    tasks = [Task(f"{i}+{i}=", answer=str(2 * i), id=f"double-{i}") for i in range(6)]
    return SequenceEnv(tasks, WeightedSum({"format": (0.1, RegexFormat(r"^\d+$")), "correct": (1.0, exact_match)}))


def test_trl_reward_functions_score_like_env_step_and_log_the_components():
    env = _weighted_env()
    rows = trl_dataset(env, num_tasks=4)
    (reward_fn,) = trl_reward_funcs(env)
    completions = [[{"role": "assistant", "content": t}] for t in ("x", "4", "", "9")]
    logged = {}
    got = reward_fn(prompts=rows["prompt"], completions=completions, completion_ids=None, task_id=rows["task_id"],
                    log_metric=logged.__setitem__, trainer_state=None)
    want = []
    for row, completion in zip(rows, completions):
        env.reset(options={"task_id": row["task_id"]})
        want.append(env.step(completion[0]["content"])[1])
    assert got == pytest.approx(want) and sum(want) > 0
    assert set(logged) == {"llmgym_reward/format", "llmgym_reward/correct"}
    # without a task_id column the prompt finds the task; an unknown one is an error, never a silent 0
    assert reward_fn(prompts=rows["prompt"], completions=completions) == pytest.approx(want)
    with pytest.raises(KeyError, match="trl_dataset"):
        reward_fn(prompts=["unknown prompt"], completions=["x"])


def test_trl_reward_functions_on_a_procedural_env_and_a_bare_verifier():
    env = gymnasium.make("llmgym/Addition-v0")
    rows = trl_dataset(env, num_tasks=5, seed=3)
    (reward_fn,) = trl_reward_funcs(env)
    answers = []
    for row in rows:
        env.reset(seed=row["task_seed"])
        answers.append(str(env.unwrapped.task.answer))
    assert reward_fn(prompts=rows["prompt"], completions=answers, task_id=rows["task_id"],
                     task_seed=rows["task_seed"]) == [1.0] * 5
    (bare,) = trl_reward_funcs(lambda task, text: float(text == task.answer), name="exact")
    assert bare.__name__ == "exact"
    assert bare(prompts=["1+1=", "2+2="], completions=["2", "5"], answer=["2", "4"]) == [1.0, 0.0]
    with pytest.raises(TypeError, match="multi-turn"):
        trl_reward_funcs(gymnasium.make("llmgym/GuessNumber-v0"))


def test_list_shows_the_adapters_installed_or_how_to_install_them(capsys, monkeypatch):
    from llmgym.cli.listing import adapter_rows

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for spec, status, _ in adapter_rows():
        assert f"{spec} ({status})" in out
        assert status.startswith(("verifiers ", "textarena ", "missing: pip install "))
        assert "'llmgym[" not in status  # the PyPI name llmgym is another project


def test_importing_llmgym_imports_no_adapter_package():
    code = ("import sys, llmgym, llmgym.interop; "
            "print(sorted(m for m in ('verifiers', 'textarena', 'trl', 'datasets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
