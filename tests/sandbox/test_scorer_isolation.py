"""Model text never runs on the host, and a verifier that cannot run is never a silent 0 (issue 17).

Every family that scores through third-party code -- the nine reasoning-gym datasets whose scorers
``eval`` or ``sympy.parse_expr`` the answer, and math-verify -- is attacked through plain
``gymnasium.make`` / ``env.step``, as an RL run would find it: a payload that writes a file on the
host, starts a process that outlives the step, or forges its score. Each must score at most the
dataset's floor, leave no file and no process; the attacks on our own fix (attribute access,
Unicode look-alikes, huge exponents, deep nesting, 1 MB answers) too. A tripwire then checks that
no model text reached reasoning-gym, SymPy or math-verify in this process at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import re

import pytest
from conftest import sandbox_missing_reason

from llmgym.runtime.install import install_hint

import llmgym  # noqa: F401  (registers the envs)
from llmgym import Task
from llmgym.envs.math import MathVerifier, ReasoningGymVerifier, reasoning_gym_task
from llmgym.envs.math.answer_grammar import GUARDED_DATASETS, check_answer
from llmgym.envs.math.reasoning import upstream_score
from llmgym.envs.math.scorer_pools import close_workers, reasoning_gym_score
from llmgym.sandbox import SandboxUnavailableError, check_sandbox
from host_traces import host_is_clean  # noqa: E402  (tests/ is on sys.path)


INFO = check_sandbox()
needs_sandbox = pytest.mark.skipif(
    bool(set(INFO["missing"]) - {"cgroup"}),
    reason=sandbox_missing_reason(INFO),
)

EVAL_FAMILIES = ["binary_matrix", "spiral_matrix", "string_insertion", "n_queens"]
SYMPY_FAMILIES = ["polynomial_multiplication", "simple_integration", "intermediate_integration", "countdown", "puzzle24"]
FAMILIES = EVAL_FAMILIES + SYMPY_FAMILIES


def forging(score: float) -> str:
    """Python that writes ``{"ok": score}`` on every descriptor a check's child may hold, then exits."""
    code = f"import os\nfor f in range(3, 64):\n    try: os.write(f, b'{{\"ok\": {score}}}')\n    except OSError: pass\nos._exit(0)"
    return f"exec({code!r})"


def attacks(path, marker) -> dict[str, str]:
    shell = f"touch {path}; setsid sleep {marker} >/dev/null 2>&1 &"
    run = f"__import__('os').system({shell!r})"
    forge = forging(1.0)
    return {
        "system": run,
        "in a list": f"[{run}, 1]",
        "forged score": forge,
        "attribute chain": "().__class__.__base__.__subclasses__()",
        "nfkc look-alike": run.replace("__import__", "__\U0001d5c2mport__"),  # NFKC folds it to __import__
        "full-width": run.replace("__import__", "__ｉｍｐｏｒｔ__"),
        "f-string": f"f'{{{run}}}'",
        "lambda": f"(lambda: {run})()",
        "comprehension": f"[{run} for _ in (1,)]",
        "walrus": f"(x := {run})",
        "huge exponent": "9**9**9**9",
        "huge exponent of x": "x**(9**9**9)",
        "deep nesting": "[" * 5000 + "]" * 5000,
        "1 MB": "[" + "1, " * 350_000 + "]",
        "call of a sympy class": "Symbol('x').__class__.__init__.__globals__",
        "string": "'a' + 'b'",
    }


def floor(task) -> float:
    """What the dataset gives an answer it cannot parse (0.0; 0.01 for countdown and puzzle24)."""
    from llmgym.envs.math.reasoning import _scorer

    meta = task.metadata
    return float(_scorer(meta["dataset"], meta.get("config", {}), meta["seed"]).score_answer("", meta["entry"]) or 0)


@needs_sandbox
@pytest.mark.parametrize("dataset", FAMILIES)
def test_payloads_in_reasoning_gym_answers_do_nothing_on_the_host(dataset, target):
    path, marker = target
    env = gym.make(f"llmgym/RG-{dataset}-v0")
    _, info = env.reset(seed=0)
    task = info["task"]
    lowest = floor(task)
    for name, payload in attacks(path, marker).items():
        env.reset(seed=0)
        start = time.monotonic()
        _, reward, terminated, _, step_info = env.step(f"<answer>{payload}</answer>")
        assert terminated and reward <= lowest, (name, reward, step_info)
        score = step_info["score"]  # refused, and the reason shown (a 1 MB step is cut before its tag closes)
        assert "error" in score or score["extracted"] is None, (name, score)
        assert time.monotonic() - start < 30, name  # refused on the host, not computed
        host_is_clean(path, marker)
        direct = ReasoningGymVerifier()(task, f"<answer>{payload}</answer>")  # no env length cap
        assert direct.reward <= lowest and "error" in direct.info, (name, direct)
        host_is_clean(path, marker)
    # the family still pays its right answer
    env.reset(seed=0)
    _, reward, *_ = env.step(f"<answer>{task.answer}</answer>")
    assert reward == 1.0 or task.answer is None


@needs_sandbox
@pytest.mark.parametrize("dataset", ["binary_matrix", "polynomial_multiplication"])
def test_behind_the_grammar_the_sandbox_holds(dataset, target):
    # The second wall alone: hand payloads straight to the sandboxed scorer, past the grammar.
    path, marker = target
    task = reasoning_gym_task(dataset, seed=0)
    meta = task.metadata
    shell = f"touch {path}; setsid sleep {marker} >/dev/null 2>&1 &"
    payload = f"__import__('os').system({shell!r})"
    assert check_answer(dataset, payload, meta["entry"]) is not None  # the grammar would refuse it
    score, error = reasoning_gym_score(dataset, {}, meta["seed"], meta["entry"], payload, time_limit=10)
    assert score == 0.0
    host_is_clean(path, marker)
    # code that runs in the check can write its own answer: out-of-range lies are caught ...
    score, error = reasoning_gym_score(dataset, {}, meta["seed"], meta["entry"], forging(7.0), time_limit=10)
    assert score == 0.0 and "not a number in [0, 1]" in error, error
    # ... and in-range ones are why the grammar comes first (docs/sandbox.md, "Persistent workers")


@needs_sandbox
def test_payloads_in_math_answers_do_nothing_on_the_host(target):
    path, marker = target
    shell = f"touch {path}; setsid sleep {marker} >/dev/null 2>&1 &"
    run = f"__import__('os').system({shell!r})"
    env = gym.make("llmgym/Arithmetic-v0")  # literal answers only
    verifier = MathVerifier(time_limit=5)  # any math answer: goes to math-verify (in the sandbox)
    task = Task("q", answer="2")
    completions = [rf"\boxed{{{run}}}", f"The answer is {run}", f"<answer>{run}</answer>", rf"$ {run} $",
                   r"\boxed{9^{9^{9^{9}}}}", r"\boxed{" + "{" * 3000 + "1" + "}" * 3000 + "}",
                   r"\boxed{\text{" + run + "}}", "x" * (1 << 20), r"\boxed{().__class__.__base__}"]
    for completion in completions:
        env.reset(seed=0)
        _, reward, *_ = env.step(completion)
        assert reward == 0.0
        assert verifier(task, completion).reward == 0.0
        host_is_clean(path, marker)
    scores = verifier.verify_batch([task] * len(completions), completions, max_workers=2)
    assert [s.reward for s in scores] == [0.0] * len(completions)
    host_is_clean(path, marker)


@needs_sandbox
def test_no_model_text_reaches_third_party_scorers_on_the_host(monkeypatch, target):
    # A tripwire in this process: reasoning-gym's scorers may see only None or "" (no model text),
    # SymPy's parser and math-verify nothing at all. The checks still get their right verdicts.
    import math_verify
    import sympy
    import sympy.parsing.sympy_parser as sympy_parser
    from reasoning_gym.factory import DATASETS

    tasks = {d: reasoning_gym_task(d, seed=0) for d in FAMILIES}  # generated before the wire is set
    seen = []

    def wire(name, real):
        def tripped(*args, **kwargs):
            if args and args[0] in ("", None):  # a floor computed on the host: no model text
                return real(*args, **kwargs)
            seen.append((name, args[:2]))
            raise AssertionError(f"{name} ran on the host")
        return tripped

    for name in FAMILIES:
        cls = DATASETS[name][0]
        real = cls.score_answer

        def score_answer(self, answer, entry, _real=real, _name=name):
            if answer not in (None, ""):
                seen.append((_name, answer))
            return _real(self, answer, entry)
        monkeypatch.setattr(cls, "score_answer", score_answer)
    import reasoning_gym.games.countdown as countdown
    import reasoning_gym.games.puzzle24 as puzzle24

    for module, attribute in ((sympy_parser, "parse_expr"), (sympy, "parse_expr"), (sympy, "sympify"),
                              (countdown, "parse_expr"), (puzzle24, "parse_expr"),
                              (math_verify, "parse"), (math_verify, "verify")):
        monkeypatch.setattr(module, attribute, wire(f"{module.__name__}.{attribute}", getattr(module, attribute)))

    path, marker = target
    verifier = ReasoningGymVerifier()
    for name, task in tasks.items():
        assert verifier(task, f"<answer>{task.answer}</answer>").reward == 1.0 or task.answer is None
        for payload in attacks(path, marker).values():
            verifier(task, f"<answer>{payload}</answer>")
        verifier(task, "no answer tags")
    math = MathVerifier()
    assert math(Task("q", answer="2x + 2"), r"\boxed{2(x+1)}").reward == 1.0
    assert math(Task("q", answer=r"\sqrt{2}"), r"\boxed{2^{1/2}}").reward == 1.0
    assert seen == []
    host_is_clean(path, marker)


def test_the_grammar_accepts_every_family_s_own_answers():
    import reasoning_gym

    for name in sorted(GUARDED_DATASETS):
        for entry in reasoning_gym.create_dataset(name, size=8, seed=5):
            answers = [entry["answer"]] if entry["answer"] is not None else []
            answers += list(entry["metadata"].get("valid_answers") or [])[:3]
            for answer in answers:
                assert check_answer(name, answer, entry) is None, (name, answer)


@pytest.mark.parametrize("dataset, answer, partial", [
    ("binary_matrix", None, 0.1),  # its right matrix as a Python list of lists: reasoning-gym's 0.1
    ("spiral_matrix", None, 0.1),
    ("string_insertion", None, 0.1),
])
@needs_sandbox
def test_literal_answers_keep_reasoning_gyms_partial_credit(dataset, answer, partial):
    task = reasoning_gym_task(dataset, seed=2)
    right = task.answer
    if dataset == "binary_matrix":
        literal = repr([[int(v) for v in row.split()] for row in right.splitlines()])
    elif dataset == "spiral_matrix":
        literal = repr([int(v) for v in right.split()])
    else:
        literal = repr(list(right))
    # the literal passes the grammar and reaches the sandboxed scorer, whose partial credit comes back
    # as it is under scoring="upstream"; the RL default (binary) pays only a right answer
    assert ReasoningGymVerifier(scoring="upstream")(task, f"<answer>{literal}</answer>").reward == partial
    assert ReasoningGymVerifier()(task, f"<answer>{literal}</answer>").reward == 0.0


@needs_sandbox
def test_a_scorer_that_hangs_is_killed_and_scores_zero():
    task = reasoning_gym_task("polynomial_multiplication", seed=1)
    tower = "((10**1000)**1000)**1000"  # each exponent small, yet SymPy would compute a billion-digit power
    # the env's path refuses it by its grammar now (issue 30's attacker pass) ...
    assert upstream_score(task, tower, time_limit=1.0)[1].startswith("powers of powers")
    # ... and the sandboxed scorer under the grammar, handed it anyway, is killed at its limit
    meta = task.metadata
    start = time.monotonic()
    score, error = reasoning_gym_score(meta["dataset"], dict(meta.get("config", {})), int(meta.get("seed", 0)),
                                       meta["entry"], tower, time_limit=1.0)
    assert (score, error) == (0.0, "timeout: verification took longer than 1.0 s")
    assert time.monotonic() - start < 30  # a hang guard: killed at ~1 s
    assert upstream_score(task, task.answer, time_limit=10) == (1.0, None)  # the worker goes on


# -- a verifier that cannot run raises ------------------------------------------------------------


def test_without_the_sandbox_scoring_raises_never_a_silent_zero(no_bwrap):
    env = gym.make("llmgym/RG-polynomial_multiplication-v0")
    _, info = env.reset(seed=0)
    env.step("no answer: scored without model text")  # nothing to sandbox
    env.reset(seed=0)
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        env.step(f"<answer>{info['task'].answer}</answer>")
    verifier = MathVerifier()
    assert verifier(Task("q", answer="8"), r"\boxed{8}").reward == 1.0  # numbers: decided on the host
    assert verifier(Task("q", answer="8"), r"\boxed{16/2}").reward == 0.0  # not written out: on the host too
    assert verifier(Task("q", answer="8"), r"\boxed{8.0}").reward == 1.0
    with pytest.raises(SandboxUnavailableError):
        verifier(Task("q", answer="2x + 2"), r"\boxed{2(x+1)}")


def test_a_math_env_without_math_verify_fails_at_make(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # as if it were not installed
    for env_id in ("llmgym/Arithmetic-v0", "llmgym/GSM8K-v0", "llmgym/MATH-v0"):
        with pytest.raises(ModuleNotFoundError, match=re.escape(install_hint("math"))):
            gym.make(env_id)


@needs_sandbox
@pytest.mark.parametrize("how", ["file", "stdin"])
def test_a_script_without_a_main_guard_runs_once_and_gets_right_answers(tmp_path, how):
    # Verifier workers are started with subprocess, never multiprocessing's spawn/forkserver, which
    # re-run the user's __main__ (and cannot at all when it came from standard input). The pairs are
    # the (decided on the host now) and one that needs math-verify's sandboxed worker.
    script = textwrap.dedent(r"""
        print("TOP-LEVEL", flush=True)
        from llmgym import Task
        from llmgym.envs.math import MathVerifier
        v = MathVerifier()
        pairs = [(r"\boxed{\frac{1}{2}}", "0.5"), (r"\boxed{1,000}", "1000"), (r"\boxed{2(x+1)}", "2x + 2")]
        print([v(Task("q", answer=a), c).reward for c, a in pairs])
        print([s.reward for s in v.verify_batch([Task("q", answer=a) for _, a in pairs], [c for c, _ in pairs],
                                                max_workers=2)])
    """)
    path = tmp_path / "no_guard.py"
    path.write_text(script)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if how == "file":
        out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600, env=env,
                             cwd=tmp_path)
    else:
        out = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=600,
                             env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["TOP-LEVEL", "[1.0, 1.0, 1.0]", "[1.0, 1.0, 1.0]"], out


def test_a_verifier_that_cannot_run_raises_and_a_bad_completion_scores_zero():
    from llmgym.env.verifiers import FunctionVerifier, VerifierUnavailableError

    def needs_a_missing_package(task, completion):
        import llmgym_no_such_package  # noqa: F401
        return 1.0

    def breaks_on_the_completion(task, completion):
        return float(int(completion))

    for limit in (None, 10.0):  # in the caller, and in a forked time-limited child
        with pytest.raises((ModuleNotFoundError, VerifierUnavailableError), match="llmgym_no_such_package"):
            FunctionVerifier(needs_a_missing_package, time_limit=limit)(Task("q"), "1")
        score = FunctionVerifier(breaks_on_the_completion, time_limit=limit)(Task("q"), "not a number")
        assert score.reward == 0.0 and "ValueError" in score.info["error"]


@needs_sandbox
def test_a_sandboxed_scorer_inside_a_time_limited_wrapper_is_refused_not_zeroed():
    from llmgym.env.verifiers import VerifierUnavailableError, WeightedSum

    close_workers()
    wrapped = WeightedSum({"correct": (1.0, MathVerifier())}, time_limit=10)
    assert wrapped(Task("q", answer="8"), r"\boxed{8.0}").reward == 1.0  # decided on the host: fine
    # math-verify's worker would start inside the forked child, its start-up eating the limit: every
    # check would time out, a silent 0 -- refused, naming the fix
    with pytest.raises(VerifierUnavailableError, match="give the time limit to the math verifier itself"):
        wrapped(Task("q", answer="2x + 2"), r"\boxed{2(x+1)}")
