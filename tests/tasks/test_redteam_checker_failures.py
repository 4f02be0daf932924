"""Red-team pass on "a checker that cannot run raises -- never a silent 0" (attacks not listed in issue 17).

* A sandboxed scorer worker killed from outside in the middle of a check scored that check 0.0
  ("died during the call"): the verdict was unknown, and the right answer lost its reward. Now the
  call runs again on a fresh worker (dying twice is the call's own doing, and its error).
* A code sandbox killed from outside in the middle of a run (its supervisor gone without a report,
  no limit hit) scored the completion 0.0 with "the sandbox could not run the program". Now it raises
  :class:`~llmgym.sandbox.SandboxError` out of ``env.step``.
* A grader model or a reward model that raises (out of memory, a dead server, a context too long for
  it) scored every completion 0.0 with the error in ``info``; now ``env.step`` raises
  :class:`~llmgym.env.verifiers.VerifierUnavailableError` naming it.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import gymnasium
import pytest

import llmgym  # noqa: F401  (registers the envs)
from llmgym import SequenceEnv, Task
from llmgym.sandbox import SandboxError, check_sandbox
from llmgym.env.verifiers import VerifierUnavailableError

needs_sandbox = pytest.mark.skipif(bool(check_sandbox()["missing"]), reason="sandbox mechanisms missing")


def _children_named(name: str) -> list[int]:
    me, found = os.getpid(), []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/comm") as fh:
                comm = fh.read().strip()
        except OSError:
            continue
        if int(fields[1]) == me and comm == name:
            found.append(int(pid))
    return found


def _kill_when(find, after: float, deadline: float = 20.0) -> threading.Thread:
    """A thread that SIGKILLs the first process ``find()`` returns, ``after`` seconds after it appears."""
    def run():
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            pids = find()
            if pids:
                time.sleep(after)
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return
            time.sleep(0.01)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@needs_sandbox
def test_a_scorer_worker_killed_mid_check_does_not_score_zero():
    from llmgym.sandbox.worker import SandboxWorker

    source = "import time\ndef handle(state, request):\n    time.sleep(1.0)\n    return state + request\n"
    with SandboxWorker(source) as worker:
        assert worker.call(1, 2, time_limit=10) == ("ok", 3)  # started, warm
        first = worker._proc.pid
        killer = _kill_when(lambda: [first], after=0.3)
        assert worker.call(40, 2, time_limit=10) == ("ok", 42)  # on a fresh worker, not ("error", ...)
        killer.join()
        assert worker._proc.pid != first


@needs_sandbox
def test_a_code_sandbox_killed_mid_run_raises():
    env = gymnasium.make("llmgym/MBPP-v0")
    env.reset(options={"task_id": "builtin/sum_of_squares"})
    code = "import time\ndef sum_of_squares(n):\n    time.sleep(3)\n    return sum(i * i for i in range(n + 1))\n"
    # only the bwrap this step starts: earlier tests' scorer workers (also under bwrap) may be alive
    before = set(_children_named("bwrap"))
    killer = _kill_when(lambda: [p for p in _children_named("bwrap") if p not in before], after=0.8)
    with pytest.raises(SandboxError, match="killed from outside"):
        env.step(code)
    killer.join()


class _BrokenEngine:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, *args, **kwargs):
        raise RuntimeError("CUDA out of memory")


def test_a_grader_model_that_fails_raises():
    from llmgym.rlhf.llm_graders import LLMGrader
    from llmgym.runtime.models import build_tokenizer

    grader = LLMGrader(_BrokenEngine(build_tokenizer()), "Is the response polite?")
    env = SequenceEnv([Task("say hi")], grader)
    env.reset(seed=0)
    with pytest.raises(VerifierUnavailableError, match="grader model failed.*CUDA out of memory"):
        env.step("hello")
    with pytest.raises(VerifierUnavailableError):
        grader.verify_batch([Task("q")] * 2, ["a", "b"])


def test_a_reward_model_that_fails_raises():
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer
    from llmgym.rlhf.reward_models import RewardModelVerifier, reward_model_from_causal_lm

    tok = build_tokenizer()
    model = reward_model_from_causal_lm(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)))

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA out of memory")

    model.forward = broken
    verifier = RewardModelVerifier(model, tok)
    env = SequenceEnv([Task("say hi")], verifier)
    env.reset(seed=0)
    with pytest.raises(VerifierUnavailableError, match="reward model failed.*CUDA out of memory"):
        env.step("hello")
    with pytest.raises(VerifierUnavailableError):
        verifier.verify_batch([Task("q")] * 2, ["a", "b"])


def test_a_math_task_whose_gold_cannot_be_parsed_raises():
    pytest.importorskip("math_verify")
    from llmgym.envs.math import MathVerifier

    # Scoring 0 would train on a lie (the right answer punished); the row is the dataset's fault.
    for gold, message in [("", "no reference answer"), (r"\text{}", "could not be parsed")]:
        env = SequenceEnv([Task("What is 1 + 1?", answer=gold)], MathVerifier())
        env.reset(seed=0)
        with pytest.raises(VerifierUnavailableError, match=message):
            env.step(r"\boxed{2}")
