"""Plugging envs in: ``--import MODULE`` on the command line, the ``llmgym.envs`` entry-point group,
multi-turn ``respond`` failures as reward 0, datasets as task sources and TRL-style reward
functions; every Python block of docs/plug_in_env.md runs.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import gymnasium
import pytest

from llmgym import MultiTurnEnv, SequenceEnv, Task, Turn
from llmgym.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "plug_in_env.md"
DOC_BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer, save_pretrained

    tok = build_tokenizer()
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
    return str(save_pretrained(model, tok, tmp_path_factory.mktemp("model") / "tiny-1layer"))


@pytest.fixture
def forget_envs():
    """Unregister the env ids (and forget the modules) a test adds, so tests stay independent."""
    from llmgym.env import registry

    before_ids, before_modules = set(registry._INFO), set(sys.modules)
    yield
    for env_id in set(registry._INFO) - before_ids:
        del registry._INFO[env_id]
        gymnasium.registry.pop(env_id, None)
    for name in set(sys.modules) - before_modules:
        if name.startswith(("wordcount_", "plugin_pkg_")):
            del sys.modules[name]


WORDCOUNT = textwrap.dedent('''
    from llmgym import SequenceEnv, Task, register_env


    def tasks(rng):
        words = " ".join(["ab"] * int(rng.integers(1, 4)))
        return Task(f"count: {words} =", answer=str(len(words.split())), id=f"wc-{len(words.split())}")


    def verify(task, completion):
        return float(completion.strip()[:2] == task.answer)


    def make(tokenizer=None, **kwargs):
        return SequenceEnv(tasks, verify, tokenizer, **kwargs)


    register_env("{name}", make, family="user", description="count the words")
''')


def test_import_makes_a_user_env_usable_from_every_command(model_dir, tmp_path, monkeypatch, capsys, forget_envs):
    (tmp_path / "wordcount_tasks.py").write_text(WORDCOUNT.replace("{name}", "WordCountCli"))
    monkeypatch.chdir(tmp_path)  # the module sits in the current directory, as a user's would
    env = "llmgym/WordCountCli-v0"
    assert main(["list", "--import", "wordcount_tasks", "--family", "user"]) == 0
    assert env in capsys.readouterr().out
    assert main(["train", "--import", "wordcount_tasks", "--env", env, "--agent", "grpo", "--model", model_dir,
                 "--steps", "1", "--out", str(tmp_path / "run"), "--set", "tasks_per_step=2",
                 "--set", "group_size=2", "--set", "max_new_tokens=2"]) == 0
    # the resumed run re-imports nothing by itself: --import is given again
    assert main(["bench", "--import", "wordcount_tasks", "--env", env, "--model", model_dir, "--samples", "1",
                 "--tasks", "3", "--max-new-tokens", "2", "--out", str(tmp_path / "b.json")]) == 0
    assert sorted(json.loads((tmp_path / "b.json").read_text())["task_ids"]) == ["wc-1", "wc-2", "wc-3"]


def test_without_import_the_user_env_is_an_unknown_id(capsys):
    assert main(["bench", "--env", "llmgym/WordCountNever-v0"]) == 2
    assert "unknown env id" in capsys.readouterr().err


def _install_fake_distribution(root: Path, name: str, value: str) -> None:
    """A ``*.dist-info`` with an ``llmgym.envs`` entry point: what ``pip install`` of a plug-in leaves."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[llmgym.envs]\n{name} = {value}\n")


def test_an_installed_package_registers_envs_through_the_entry_point_group(tmp_path, monkeypatch, capsys,
                                                                          forget_envs):
    from llmgym.env import registry

    (tmp_path / "plugin_pkg_ok.py").write_text(WORDCOUNT.replace("{name}", "WordCountPlugin")
                                               .replace('register_env("WordCountPlugin", make, family="user", '
                                                        'description="count the words")',
                                                        'def register():\n    register_env("WordCountPlugin", make, '
                                                        'family="user", description="count the words")'))
    (tmp_path / "plugin_pkg_broken.py").write_text("raise ImportError('a dependency is missing')\n")
    _install_fake_distribution(tmp_path, "plugin_pkg_ok", "plugin_pkg_ok:register")
    _install_fake_distribution(tmp_path, "plugin_pkg_broken", "plugin_pkg_broken")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    with pytest.warns(RuntimeWarning, match="plug-in 'plugin_pkg_broken'.*skipped"):
        assert main(["list", "--family", "user"]) == 0
    assert "llmgym/WordCountPlugin-v0" in capsys.readouterr().out
    env = gymnasium.make("llmgym/WordCountPlugin-v0")
    _, info = env.reset(seed=0)
    assert env.step(info["task"].answer)[1] == 1.0


# -- multi-turn: respond never crashes a run ------------------------------------------------------


class Brittle(MultiTurnEnv):
    def respond(self, completion):
        return Turn(float(int(completion) == self.task.answer), done=True)  # int("seven") raises


class Hangs(MultiTurnEnv):
    respond_time_limit = 0.5

    def respond(self, completion):
        if completion == "loop":
            while True:
                pass
        self.state["turns"] = self.state.get("turns", 0) + 1
        return Turn(0.5, reply=f"turn {self.state['turns']}")


def test_an_exception_in_respond_ends_the_episode_with_reward_0():
    env = Brittle([Task("Guess:", answer=7)], max_turns=3)
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step("seven")
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["error"].startswith("ValueError: invalid literal for int()") and "traceback" in info


def test_a_sandbox_failure_inside_respond_is_raised_never_a_silent_zero():
    from llmgym.sandbox import SandboxUnavailableError

    class NeedsSandbox(MultiTurnEnv):
        def respond(self, completion):
            raise SandboxUnavailableError(["bwrap"], {"bwrap": "not installed"})

    env = NeedsSandbox([Task("x")])
    env.reset(seed=0)
    with pytest.raises(SandboxUnavailableError):
        env.step("code")


def test_respond_past_its_time_limit_is_killed_and_keeps_state_otherwise():
    env = Hangs([Task("x")], max_turns=5)
    env.reset(seed=0)
    assert env.step("a")[4]["reply"] == "turn 1" and env.step("b")[4]["reply"] == "turn 2"
    assert env.state == {"turns": 2}  # the child's state came back
    _, reward, terminated, _, info = env.step("loop")
    assert (reward, terminated) == (0.0, True) and info["error"].startswith("TimeoutError")


def _hangs_env():
    return Hangs([Task("x")], max_turns=5)


def test_a_time_limited_respond_runs_inside_an_async_vector_env_worker():
    """An ``AsyncVectorEnv`` worker is a daemonic process, and multiprocessing refuses it children: the
    killable child lifts the flag for its start (this failed as 'daemonic processes are not allowed to
    have children', a 0 for every turn)."""
    envs = gymnasium.vector.AsyncVectorEnv([_hangs_env, _hangs_env])
    try:
        envs.reset(seed=0)
        _, rewards, terminated, _, infos = envs.step(("a", "loop"))
        assert rewards.tolist() == [0.5, 0.0] and terminated.tolist() == [False, True]
        assert infos["reply"][0] == "turn 1" and infos["error"][1].startswith("TimeoutError")
    finally:
        envs.close()


def test_a_time_limited_check_that_starts_a_process_takes_it_down_at_its_limit():
    """The killable child's process group is killed at the deadline: a check's own subprocess does not
    outlive it (before, only the child itself was killed)."""
    import subprocess
    import time

    from llmgym import as_verifier

    marker = "314159.26535"  # a unique duration: this test's own sleep, not another run's

    def spawns_and_hangs(task, completion):
        subprocess.Popen(["sleep", marker])
        time.sleep(60)
        return 1.0

    score = as_verifier(spawns_and_hangs, time_limit=2.0)(Task("x"), "y")
    assert score.reward == 0.0 and score.info["error"].startswith("timeout")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the kernel reaps it at once; give a loaded machine a moment
        alive = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True).stdout.split()
        if not alive:
            break
        time.sleep(0.2)
    assert alive == []


def test_the_guess_example_of_the_docs_trains_without_crashing(tokenizer):
    from llmgym.agents import GRPO
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model

    block = next(b for b in DOC_BLOCKS if "class Guess" in b)
    scope: dict = {"__name__": "__doc__"}
    exec(compile(block, "docs/plug_in_env.md (Guess)", "exec"), scope)
    guess = scope["Guess"]([Task("Guess 1-10:", answer=7, id="g7"), Task("Guess 1-10:", answer=3, id="g3")],
                           max_turns=3)
    model = build_tiny_model(tokenizer, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2,
                                                        intermediate_size=64))
    rows = GRPO(model, tokenizer, tasks_per_step=2, group_size=2, max_new_tokens=3).learn(guess, 2)
    assert [r["step"] for r in rows] == [1, 2]
    brittle = Brittle([Task("Guess:", answer=7)], max_turns=2)  # the undefended parse: still no crash
    rows = GRPO(model, tokenizer, tasks_per_step=2, group_size=2, max_new_tokens=3).learn(brittle, 1)
    assert rows[0]["reward_mean"] == 0.0


@pytest.mark.parametrize("index", range(len(DOC_BLOCKS)))
def test_every_python_block_of_plug_in_env_md_runs(index, forget_envs, capsys):
    exec(compile(DOC_BLOCKS[index], f"docs/plug_in_env.md block {index}", "exec"), {"__name__": "__doc__"})


# -- datasets and TRL-style reward functions -----------------------------------------------------


def test_tasks_from_a_dataset_follow_the_column_mapping():
    datasets = pytest.importorskip("datasets")
    from llmgym import tasks_from_dataset

    ds = datasets.Dataset.from_list([
        {"messages": [{"role": "user", "content": "2+3?"}], "gold": "5", "uid": "a", "level": 1},
        {"messages": [{"role": "user", "content": "4*4?"}], "gold": "16", "uid": "b", "level": 3},
    ])
    tasks = tasks_from_dataset(ds, prompt="messages", answer="gold", id="uid")
    assert len(tasks) == 2 and [t.id for t in tasks] == ["a", "b"]
    assert tasks[1].is_chat and tasks[1].prompt[0]["content"] == "4*4?" and tasks[1].answer == "16"
    assert dict(tasks[1].metadata) == {"gold": "16", "uid": "b", "level": 3}
    env = SequenceEnv(tasks, lambda task, text: text == task.answer)
    assert env.reset(options={"task_id": "b"})[1]["task"].answer == "16"
    with pytest.raises(KeyError, match="no column for prompt='question'"):
        tasks_from_dataset(ds, prompt="question")
    with pytest.raises(ValueError, match="no rows"):
        tasks_from_dataset(ds.select([]), prompt="messages", answer="gold")


def test_a_trl_reward_function_is_one_batched_call_and_never_crashes():
    from llmgym.env.verifiers import from_reward_function

    calls = []

    def reward(prompts, completions, target, **kwargs):
        calls.append((list(prompts), list(completions), list(target)))
        return [None if t is None else -abs(len(c) - t) for c, t in zip(completions, target)]

    verifier = from_reward_function(reward)
    tasks = [Task("a", metadata={"target": 2}), Task("b", metadata={"target": 1}), Task("c", metadata={"target": None})]
    scores = verifier.verify_batch(tasks, ["xx", "xxx", "x"])
    assert [s.reward for s in scores] == [0.0, -2.0, 0.0] and "None" in scores[2].info["error"]
    assert calls == [(["a", "b", "c"], ["xx", "xxx", "x"], [2, 1, None])]  # one call for the batch
    chat = Task([{"role": "user", "content": "hi"}], metadata={"target": 3})
    assert from_reward_function(lambda prompts, completions, **kw: [len(completions[0][0]["content"])])(
        chat, "abc").reward == 3.0  # chat tasks: TRL's conversational completion form

    def broken(prompts, completions, **kwargs):
        raise RuntimeError("judge down")

    assert all(s.reward == 0.0 and "judge down" in s.info["error"]
               for s in from_reward_function(broken).verify_batch(tasks, ["a", "b", "c"]))
    short = from_reward_function(lambda prompts, completions, **kw: [1.0])
    assert "returned 1 values for 3" in short.verify_batch(tasks, ["a", "b", "c"])[0].info["error"]
    nan = from_reward_function(lambda prompts, completions, **kw: [float("nan")])
    assert nan(tasks[0], "x").reward == 0.0


def test_a_reward_function_with_a_time_limit_is_stopped_not_crashing():
    import time as _time

    from llmgym import SequenceEnv, Task
    from llmgym.env.verifiers import from_reward_function

    def slow(prompts, completions, **kw):
        _time.sleep(300)
        return [1.0] * len(completions)

    def quick(prompts, completions, **kw):
        return [float(c == "ok") for c in completions]

    env = SequenceEnv([Task("say ok")], from_reward_function(slow, time_limit=0.5))
    env.reset(seed=0)
    _, reward, *_, info = env.step("ok")
    assert reward == 0.0 and info["error"].startswith("timeout")
    env = SequenceEnv([Task("say ok")], from_reward_function(quick, time_limit=30))
    env.reset(seed=0)
    assert env.step("ok")[1] == 1.0
