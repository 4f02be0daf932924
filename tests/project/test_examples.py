"""Every example runs (training examples in their seconds-long ``--quick`` mode).

Examples run as subprocesses with the suite's torch thread count (``LLMGYM_TEST_THREADS``) and
``OMP_WAIT_POLICY=PASSIVE``, both set by conftest: with a second spinning OpenMP thread per op, a
busy 2-core machine made each training example take 134-260 s instead of seconds. The time-out is
only a hang guard.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(name: str, *args: str, timeout: int = 600) -> str:
    threads = os.environ.get("LLMGYM_TEST_THREADS", "1")
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    result = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                            timeout=timeout, cwd=EXAMPLES.parent, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_custom_loop_example():
    out = run("custom_loop.py")
    assert out.count("reward=") == 4


def test_plug_in_example_is_at_most_20_lines_of_user_code_and_runs():
    code = [l for l in (EXAMPLES / "plug_in_env.py").read_text().splitlines()
            if l.strip() and not l.strip().startswith(("#", '"""'))]
    assert len(code) <= 20, f"{len(code)} lines of user code"
    assert "What is" in run("plug_in_env.py")


@pytest.mark.parametrize("algo", ["reinforce", "rloo", "ppo", "grpo", "dapo"])
def test_training_example_runs(algo):
    out = run(f"train_{algo}.py", "--quick")
    assert f"{algo.upper()}: held-out reward" in out and "in 2 steps" in out


def test_code_benchmark_example():
    out = run("benchmark_code.py", "--problems", "2", "--samples", "2", "--k", "1")
    assert "pass@1" in out


def test_math_benchmark_example():
    out = run("benchmark_math.py", "--tasks", "2", "--samples", "2")
    assert "pass@1" in out and "mean reward" in out
