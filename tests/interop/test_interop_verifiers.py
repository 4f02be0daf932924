"""The verifiers adapter with the real package: verifiers environments in (single- and multi-turn), llmgym envs
out to verifiers and back (the same rewards), and on to TRL's GRPOTrainer through llmgym's reward functions.

The verifiers environments are small ones built here (``tests/data/verifiers_envs``, loaded by module id
as verifiers loads any installed environment, or defined inline). Everything runs offline.
"""

from __future__ import annotations

import os
import random
import re
import sys
import time
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from llmgym import SequenceEnv, Task
from llmgym.cli import main
from llmgym.interop import from_verifiers, make_adapted_env, to_verifiers, trl_dataset, trl_reward_funcs

vf = pytest.importorskip("verifiers.v1", reason="the verifiers adapter tests need verifiers >= 0.4 (the verifiers extra)")
# gymnasium warns that a wrapped env is checked: checking what users get (the wrappers) is the point
pytestmark = pytest.mark.filterwarnings("ignore:.*different from the unwrapped version:UserWarning")

VF_ENVS = Path(__file__).resolve().parents[1] / "data" / "verifiers_envs"
CONTENT_FREE = ["", "0", "1", "yes", "no", "True", "NaN", "[]", "[0]", "[1]", "?"]


@pytest.fixture(autouse=True)
def verifiers_envs_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(VF_ENVS))


def _say(env, tokenizer, text):
    """Step a token-level env through ``text`` + EOS; the last step's result."""
    for token in tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]:
        result = env.step(token)
    return result


# ------------------------------------------------------------------------------------------------
# verifiers in: single-turn


@pytest.fixture(scope="module")
def echo_env():
    sys.path.insert(0, str(VF_ENVS))
    try:
        yield from_verifiers("llmgym_test_vf")
    finally:
        sys.path.remove(str(VF_ENVS))


def test_a_verifiers_taskset_scores_with_its_weighted_rewards(echo_env):
    obs, info = echo_env.reset(seed=0)
    task = info["task"]
    assert task.id.startswith("echo-") and obs["prompt"] == f"user: Echo {task.answer}\nassistant:"
    _, reward, terminated, truncated, info = echo_env.step(task.answer)
    assert (reward, terminated, truncated) == (pytest.approx(1.05), True, False)
    assert info["score"]["exact"] == {"reward": 1.0, "weight": 1.0}
    assert info["score"]["digits"] == {"reward": 1.0, "weight": 0.05}
    assert info["score"]["metrics"] == {"length": 4.0}
    echo_env.reset(options={"task": task})
    wrong = task.answer[:2] + "xx"  # half the digits: only the small shaping term pays
    assert echo_env.step(wrong)[1] == pytest.approx(0.05 * 0.5)
    # the taskset's 12 tasks, each once, as an llmgym list
    assert len({t.id for t in echo_env.unwrapped.tasks}) == 12


def test_taskset_and_env_objects_and_taskset_config():
    env = vf.load_environment(vf.resolve_env_config({"taskset": {"id": "llmgym_test_vf", "num_tasks": 3}}))
    from_env = from_verifiers(env)
    from_taskset = from_verifiers(env.taskset)
    by_id = from_verifiers("llmgym_test_vf", taskset={"num_tasks": 3})
    ids = [[t.id for t in e.unwrapped.tasks] for e in (from_env, from_taskset, by_id)]
    assert ids[0] == ids[1] == ids[2] and len(ids[0]) == 3
    assert len(list(from_verifiers(env, num_tasks=2).unwrapped.tasks)) == 2


def test_verifiers_env_passes_check_env_at_both_levels_and_levels_agree(tokenizer):
    seq = make_adapted_env("verifiers:llmgym_test_vf", tokenizer)
    tok = make_adapted_env("verifiers:llmgym_test_vf", tokenizer, level="token", max_new_tokens=8)
    check_env(seq, skip_render_check=True)
    check_env(tok, skip_render_check=True)
    _, info_seq = seq.reset(seed=5)
    _, info_tok = tok.reset(seed=5)
    assert info_seq["task"].id == info_tok["task"].id
    answer = info_seq["task"].answer
    text_step = seq.step(tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id])
    token_step = _say(tok, tokenizer, answer)
    assert text_step[1:4] == token_step[1:4] == (pytest.approx(1.05), True, False)
    assert list(text_step[0]["prompt_ids"]) == list(token_step[0]["prompt_ids"])


class _Data(vf.TaskData):
    answer: str = "x"


class _RaisingTask(vf.Task[_Data]):
    @vf.reward
    async def broken(self, trace: vf.Trace) -> float:
        raise ZeroDivisionError("the scorer broke on this completion")


class _SlowTask(vf.Task[_Data]):
    @vf.reward
    async def slow(self, trace: vf.Trace) -> float:
        time.sleep(60)  # a scorer stuck on hostile text: only a killed process stops it
        return 1.0


_CALLS = {"n": 0}  # what a scoring process has scored before this completion (pickled with the task)


class _PidTask(vf.Task[_Data]):
    @vf.reward
    async def right(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.metric
    async def pid(self, trace: vf.Trace) -> float:
        return float(os.getpid())

    @vf.metric
    async def uid(self, trace: vf.Trace) -> float:
        return float(os.getuid())

    @vf.metric
    async def calls(self, trace: vf.Trace) -> float:
        _CALLS["n"] += 1
        return float(_CALLS["n"])


class _RuntimeTask(vf.Task[_Data]):
    @vf.reward
    async def in_box(self, trace: vf.Trace, runtime) -> float:  # needs a runtime box
        return 1.0


class _NoRewardTask(vf.Task[_Data]):
    pass


def _taskset(task_cls, n=2):
    class Tasks(vf.Taskset[task_cls, vf.TasksetConfig]):
        def load(self):
            return [task_cls(_Data(idx=i, prompt=f"say x #{i}")) for i in range(n)]

    return Tasks(vf.TasksetConfig())


def test_a_reward_that_raises_scores_zero_with_the_error():
    env = from_verifiers(_taskset(_RaisingTask))
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("x")
    assert (reward, terminated) == (0.0, True)
    assert "ZeroDivisionError" in info["error"]


def test_scoring_runs_in_the_sandbox_and_a_hanging_reward_is_killed():
    env = from_verifiers(_taskset(_PidTask))
    env.reset(seed=0)
    _, reward, _, _, info = env.step("x")
    metrics = info["score"]["metrics"]
    assert reward == 1.0 and metrics["pid"] != os.getpid()  # scored in another process ...
    assert metrics["uid"] != os.getuid() and metrics["uid"] >= 60000  # ... under the sandbox's unprivileged uid
    slow = from_verifiers(_taskset(_SlowTask), time_limit=1.0)
    slow.reset(seed=0)
    started = time.perf_counter()
    _, reward, _, _, info = slow.step("x")
    assert reward == 0.0 and "timeout: " in info["error"] and time.perf_counter() - started < 20


def test_each_completion_of_a_batch_is_scored_in_a_fresh_process_each_time_limited():
    from llmgym.interop.verifiers_in import VerifiersScorer, verifiers_tasks

    tasks = verifiers_tasks(_taskset(_PidTask, n=3)) * 2
    scores = VerifiersScorer().verify_batch(tasks, ["x", "y", "x", "x", "", "x"])
    assert [s.reward for s in scores] == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert all(s.info["metrics"]["pid"] != os.getpid() for s in scores)
    assert [s.info["metrics"]["calls"] for s in scores] == [1.0] * 6  # no scoring saw another's state
    slow = verifiers_tasks(_taskset(_SlowTask, n=2))
    started = time.perf_counter()
    scores = VerifiersScorer(time_limit=1.0).verify_batch(slow, ["x", "x"])
    assert all(s.reward == 0.0 and "timeout" in s.info["error"] for s in scores)
    assert time.perf_counter() - started < 20


@pytest.mark.parametrize("task_cls, problem", [(_RuntimeTask, "need a runtime box"),
                                                (_NoRewardTask, "declare no @vf.reward")])
def test_what_cannot_run_offline_is_refused_at_construction(task_cls, problem):
    with pytest.raises(ValueError, match=problem):
        from_verifiers(_taskset(task_cls))


def test_content_free_answers_earn_nothing_in_the_verifiers_test_env(echo_env):
    for answer in CONTENT_FREE:
        rewards = []
        for task in list(echo_env.unwrapped.tasks)[:4]:
            echo_env.reset(options={"task": task})
            rewards.append(echo_env.step(answer)[1])
        assert np.mean(rewards) < 0.1, answer


# ------------------------------------------------------------------------------------------------
# verifiers in: multi-turn (the env's own run())


def test_a_multi_turn_verifiers_env_plays_its_run_and_pays_at_the_end(tokenizer):
    env = from_verifiers("llmgym_test_vf_guess", tokenizer=tokenizer, max_turns=6)
    obs, info = env.reset(seed=0)
    secret = int(info["task"].id.split("-")[1])
    assert obs["prompt"].startswith("<|user|>Guess my number")
    results = [env.step(guess) for guess in ("50", "nope", str(secret))]
    assert [r[4]["reply"] for r in results[:2]] == ["higher" if secret > 50 else "lower", "a number, please"]
    assert [r[1:4] for r in results] == [(0.0, False, False), (0.0, False, False), (1.0, True, False)]
    final = results[-1][4]
    assert final["stop_condition"] == "guessed" and final["score"]["solved"] == {"reward": 1.0, "weight": 1.0}
    assert final["score"]["metrics"] == {"turns": 3.0}
    assert results[1][0]["prompt"].endswith("<|user|>a number, please\n<|assistant|>")


def test_the_turn_limit_stops_the_exchange_and_scores_the_partial_trajectory():
    env = from_verifiers("llmgym_test_vf_guess", max_turns=2)
    env.reset(seed=0)
    env.step("100")
    _, reward, terminated, truncated, info = env.step("101")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info["stop_condition"] == "max_turns" and info["score"]["solved"]["reward"] == 0.0


def test_multi_turn_verifiers_env_passes_check_env_at_both_levels(tokenizer):
    check_env(make_adapted_env("verifiers:llmgym_test_vf_guess", tokenizer, max_turns=3),
              skip_render_check=True)
    check_env(make_adapted_env("verifiers:llmgym_test_vf_guess", tokenizer, level="token", max_new_tokens=4,
                                  max_turns=3), skip_render_check=True)


class _GuessData(vf.TaskData):
    secret: int = 3


class _GuessTask(vf.Task[_GuessData]):
    @vf.reward
    async def solved(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == str(self.data.secret))


class _OneSeat(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class _HangingEnv(vf.Env[_OneSeat]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            if segment.last_reply == "hang":
                time.sleep(60)
            await interaction.turn("again")


class _TwoSeats(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()
    judge: vf.AgentConfig = vf.AgentConfig()


class _JudgedEnv(vf.Env[_TwoSeats]):
    async def run(self, task, agents):
        await agents.player.run(task)
        await agents.judge.run(task)


def _vf_env(env_cls, config_cls):
    class Tasks(vf.Taskset[_GuessTask, vf.TasksetConfig]):
        def load(self):
            return [_GuessTask(_GuessData(idx=0, prompt="guess"))]

    module = type(sys)("llmgym_test_vf_inline")
    module.Tasks, module.__all__ = Tasks, ["Tasks"]
    sys.modules["llmgym_test_vf_inline"] = module
    return env_cls(config_cls(taskset=vf.TasksetConfig(id="llmgym_test_vf_inline")))


def test_a_hanging_run_is_killed_and_scores_zero_and_a_second_agent_is_refused():
    env = from_verifiers(_vf_env(_HangingEnv, _OneSeat), time_limit=1.0)
    env.reset(seed=0)
    started = time.perf_counter()
    _, reward, terminated, _, info = env.step("hang")
    assert (reward, terminated) == (0.0, True) and "timeout: " in info["error"]
    assert time.perf_counter() - started < 20
    env.reset(seed=0)
    assert env.step("3")[1:3] == (0.0, False)  # "again": the exchange goes on
    judged = _vf_env(_JudgedEnv, _TwoSeats)
    with pytest.raises(ValueError, match="choose the one the policy plays with role="):
        from_verifiers(judged)
    env = from_verifiers(judged, role="player")
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("3")
    assert (reward, terminated) == (0.0, True) and "uses agent 'judge'" in info["error"]


# ------------------------------------------------------------------------------------------------
# llmgym out to verifiers, and back: the same rewards on the same completions


@pytest.mark.parametrize("env_id", ["llmgym/Addition-v0", "llmgym/Copy-v0"])
def test_round_trip_single_turn_gives_the_same_rewards(env_id):
    original = gymnasium.make(env_id)
    vf_env = to_verifiers(original, num_tasks=6)
    assert type(vf_env).__name__ == "SingleAgentEnv"
    back = from_verifiers(vf_env)
    rng = random.Random(0)
    for task, vf_task in zip(back.unwrapped.tasks, vf_env.taskset):
        own = vf_task.llmgym_task
        assert task.id == own.id
        for completion in (str(own.answer), str(own.answer)[:-1] + "0", "", str(rng.randrange(10**4))):
            original.reset(options={"task": own})
            back.reset(options={"task": task})
            assert back.step(completion)[1] == pytest.approx(original.step(completion)[1]), (task.id, completion)


def test_round_trip_multi_turn_gives_the_same_returns():
    original = gymnasium.make("llmgym/GuessNumber-v0")
    vf_env = to_verifiers(original, num_tasks=3)
    assert type(vf_env).__name__ == "LlmgymEnv"
    back = from_verifiers(vf_env, max_turns=original.unwrapped.max_turns)
    for task, vf_task in zip(back.unwrapped.tasks, vf_env.taskset):
        secret = int(vf_task.llmgym_task.answer)
        for moves in (["50", "25", str(secret)], ["banana"], ["1", "2", "3", "4", "5", "6", "7"]):
            results = []
            for env, t in ((original, vf_task.llmgym_task), (back, task)):
                env.reset(options={"task": t})
                returns, ended = 0.0, None
                for move in moves:
                    _, reward, terminated, truncated, _ = env.step(move)
                    returns += reward
                    if terminated or truncated:
                        ended = (terminated, truncated)
                        break
                results.append((returns, ended))
            assert results[0] == results[1], (secret, moves)


def test_verifiers_loads_the_llmgym_taskset_by_id():
    to_verifiers("llmgym/Copy-v0", num_tasks=2)  # makes the plugin module importable by its id here
    env = vf.load_environment(vf.resolve_env_config(
        {"taskset": {"id": "llmgym_taskset", "env": "llmgym/Reverse-v0", "num_tasks": 3}}))
    tasks = list(env.taskset)
    assert len(tasks) == 3 and all(t.data.prompt.startswith("rev:") for t in tasks)
    trace = _trace_with_reply(tasks[0], tasks[0].data.answer)
    from llmgym.interop.verifiers_in import run_coroutine

    run_coroutine(tasks[0].score(trace))
    assert trace.reward == 1.0 and trace.rewards["llmgym"].score == 1.0


def _trace_with_reply(vf_task, reply):
    from llmgym.interop.verifiers_in import append_message, new_trace

    trace = new_trace(vf, vf_task)
    append_message(vf, trace, vf.AssistantMessage(content=reply), sampled=True)
    return trace


# ------------------------------------------------------------------------------------------------
# ... and on to TRL, and llmgym's own agents and command line on verifiers envs


def test_trl_reward_functions_score_like_env_step(echo_env):
    rows = trl_dataset(echo_env, num_tasks=4)
    (reward_fn,) = trl_reward_funcs(echo_env)
    prompts = [row["prompt"] for row in rows]
    completions = [[{"role": "assistant", "content": t}] for t in ("x", "1234", "", "9")]
    logged = {}
    got = reward_fn(prompts=prompts, completions=completions, completion_ids=None,
                    task_id=[row["task_id"] for row in rows], log_metric=logged.__setitem__, trainer_state=None)
    want = []
    for row, completion in zip(rows, completions):
        echo_env.reset(options={"task_id": row["task_id"]})
        want.append(echo_env.step(completion[0]["content"])[1])
    assert got == pytest.approx(want)
    assert set(logged) == {"llmgym_reward/exact", "llmgym_reward/digits"}
    with pytest.raises(KeyError, match="trl_dataset"):
        reward_fn(prompts=["unknown prompt"], completions=["x"])


def test_trl_grpo_trainer_trains_on_an_adapted_env_through_its_reward_function(tmp_path, tokenizer, tiny_config):
    trl = pytest.importorskip("trl", reason="TRL is not installed")
    from llmgym.runtime.models import build_tiny_model

    env = from_verifiers("llmgym_test_vf")
    model = build_tiny_model(tokenizer, tiny_config)
    config = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                            max_completion_length=6, max_steps=2, learning_rate=1e-3, beta=0.0, use_cpu=True,
                            bf16=False, report_to=[], logging_steps=1, save_strategy="no", seed=0)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=trl_reward_funcs(env), args=config,
                              train_dataset=trl_dataset(env), processing_class=tokenizer)
    trainer.train()
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    assert len(rewards) == 2 and all(np.isfinite(rewards))


@pytest.mark.parametrize("spec", ["verifiers:llmgym_test_vf", "verifiers:llmgym_test_vf_guess"])
def test_grpo_trains_on_verifiers_envs(spec, tiny_model, tokenizer):
    from llmgym.agents import GRPO

    env = make_adapted_env(spec, tokenizer, max_turns=2)
    agent = GRPO(tiny_model, tokenizer, group_size=2, tasks_per_step=2, max_new_tokens=4, lr=1e-3, seed=0)
    history = agent.learn(env, steps=2)
    assert len(history) == 2 and all(np.isfinite(row["loss"]) for row in history)


def test_train_from_the_command_line(tmp_path):
    out = tmp_path / "run"
    small = ["--set", "tasks_per_step=2", "--set", "group_size=2", "--set", "max_new_tokens=4"]
    assert main(["train", "--env", "verifiers:llmgym_test_vf", "--agent", "grpo", "--steps", "2",
                 "--out", str(out), *small]) == 0
    assert (out / "metrics.jsonl").read_text().count("\n") == 2


@pytest.mark.parametrize("spec, message", [
    ("verifiers:no_such_env_module", "no verifiers environment module 'no_such_env_module' installed or in the current folder"),
    ("verifiers:", "names no module"),
])
def test_bad_verifiers_specs_are_one_line_before_any_work(spec, message, capsys, tmp_path):
    capsys.readouterr()
    assert main(["train", "--env", spec, "--agent", "grpo", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("llmgym: error: ") and message in err[0], err
    assert not (tmp_path / "x" / "config.json").exists()


def test_an_adapted_env_is_a_plain_llmgym_env_and_is_not_registered():
    env = from_verifiers("llmgym_test_vf")
    assert isinstance(env, SequenceEnv) and isinstance(env.unwrapped.tasks.source[0], Task)
    from llmgym.env.registry import registered_envs

    assert not any(e.id.startswith(("verifiers", "textarena")) for e in registered_envs())


DOC_BLOCKS = re.findall(r"```python\n(.*?)```", (Path(__file__).resolve().parents[2] / "docs" / "interop.md").read_text(),
                        flags=re.S)


@pytest.mark.parametrize("index", range(len(DOC_BLOCKS)))
def test_every_python_block_of_interop_md_runs(index, tmp_path, monkeypatch, capsys):
    pytest.importorskip("textarena")
    if "import trl" in DOC_BLOCKS[index]:
        pytest.importorskip("trl")
    monkeypatch.chdir(tmp_path)  # the TRL example writes its run directory under the current one
    monkeypatch.setitem(sys.modules, "guess_taskset", None)  # the multi-turn example installs its own
    # as a script runs: a block that is also a module (the echo taskset) runs its example under its main guard
    exec(compile(DOC_BLOCKS[index], f"docs/interop.md block {index}", "exec"), {"__name__": "__main__"})
    if "__main__" in DOC_BLOCKS[index]:
        assert "1.05" in capsys.readouterr().out


def test_the_docs_verifiers_commands_run_on_a_module_in_the_current_folder(tmp_path):
    """docs/interop.md's commands as a user runs them: the echo taskset saved as echo_taskset.py, then the
    console script (which, unlike ``python -m``, does not put the current folder on sys.path) from that folder."""
    import json
    import subprocess
    import tempfile

    block = re.search(r"<!-- vf-echo-taskset -->\n```python\n(.*?)```",
                      (Path(__file__).resolve().parents[2] / "docs" / "interop.md").read_text(), re.S).group(1)
    folder = Path(tempfile.mkdtemp(prefix="llmgym-vf-docs-", dir="/tmp"))  # the sandbox's uid must read it
    folder.chmod(0o755)
    try:
        (folder / "echo_taskset.py").write_text(block)
        (folder / "echo_taskset.py").chmod(0o644)
        script = Path(sys.executable).parent / "llmgym"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop("PYTHONPATH", None)
        for args in (["bench", "--env", "verifiers:echo_taskset", "--samples", "2", "--max-new-tokens", "4",
                      "--out", "bench.json"],
                     ["train", "--env", "verifiers:echo_taskset", "--env-arg", "num_tasks=2", "--agent", "grpo",
                      "--steps", "1", "--out", "runs/echo", "--set", "tasks_per_step=2", "--set", "group_size=2",
                      "--set", "max_new_tokens=4"]):
            proc = subprocess.run([str(script), *args], cwd=folder, env=env, capture_output=True, text=True,
                                  timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads((folder / "bench.json").read_text())["tasks"] == 3
        assert (folder / "runs" / "echo" / "checkpoints" / "last").is_dir()
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
