"""Model text handed to third-party code through the interop adapters never runs on the host (issues 17, 22).

A verifiers reward function may parse a completion with SymPy (``parse_expr`` is an ``eval``: it stands here
for any scorer that does), a verifiers ``run()`` and a TextArena opponent read every reply. Each is attacked
through plain ``env.step`` as an RL run would find it: a payload that writes a host file, starts a process
that outlives the step, forges its score, or patches the interpreter for the next completion. Each must
score 0 (its honest score: a payload is not the answer), leave no file and no process, and change no other
completion's score. A reward that hangs is killed; one that cannot import raises -- but not when only the
completion made the import fail; a sandbox that is missing, or a module it cannot read, is refused when the
env is made, naming the fix.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import sandbox_missing_reason

from host_traces import host_is_clean  # noqa: E402  (tests/ is on sys.path)
from llmgym.interop import from_textarena, from_verifiers
from llmgym.sandbox import SandboxError, SandboxUnavailableError, SandboxWarning, check_sandbox
from llmgym.env.verifiers import VerifierUnavailableError

vf = pytest.importorskip("verifiers.v1", reason="the verifiers adapter tests need verifiers >= 0.4 (the verifiers extra)")
sympy = pytest.importorskip("sympy")

INFO = check_sandbox()
pytestmark = pytest.mark.skipif(
    bool(set(INFO["missing"]) - {"cgroup"}),
    reason=sandbox_missing_reason(INFO),
)


def payloads(path, marker) -> dict[str, str]:
    """Python a scorer that ``eval``s its input would run."""
    shell = f"touch {path}; setsid sleep {marker} >/dev/null 2>&1 &"
    forge = ("import os\nfor f in range(3, 64):\n    try: os.write(f, b'{\"ok\": 1.0}')\n    except OSError: pass\n"
             "os._exit(0)")
    spawn = f"import subprocess; subprocess.Popen(['setsid', 'sleep', '{marker}'])"
    return {
        "system": f"__import__('os').system({shell!r})",
        "forged score": f"exec({forge!r})",  # writes "1.0" on every descriptor the scoring process holds
        "subprocess": f"exec({spawn!r})",
        "file": f"exec({f'open({str(path)!r}, {chr(39)}w{chr(39)}).write({chr(39)}x{chr(39)})'!r})",
        "patch the next check": "exec('import sympy; sympy.simplify = lambda e: 0') or 0",  # every answer "equal"
    }


class _Data(vf.TaskData):
    answer: str = "6"


class _SympyTask(vf.Task[_Data]):
    @vf.reward
    async def equal(self, trace: vf.Trace) -> float:  # parse_expr runs its input as Python
        return float(sympy.simplify(sympy.parse_expr(trace.last_reply) - int(self.data.answer)) == 0)


class _ImportingTask(vf.Task[_Data]):
    @vf.reward
    async def needs(self, trace: vf.Trace) -> float:
        import llmgym_no_such_scorer_module  # noqa: F401  (installed nowhere: this reward can never run)

        return 1.0


def _taskset(task_cls, n=2):
    class Tasks(vf.Taskset[task_cls, vf.TasksetConfig]):
        def load(self):
            return [task_cls(_Data(idx=i, prompt=f"What is 2 * 3? #{i}")) for i in range(n)]

    return Tasks(vf.TasksetConfig())


def test_payloads_in_a_reward_that_evals_do_nothing_on_the_host(target):
    path, marker = target
    env = from_verifiers(_taskset(_SympyTask))
    for name, payload in payloads(path, marker).items():
        env.reset(seed=0)
        _, reward, terminated, _, info = env.step(payload)
        assert (reward, terminated) == (0.0, True), (name, info)
        host_is_clean(path, marker)
    env.reset(seed=0)
    assert env.step("2*3")[1] == 1.0  # the scorer still pays a right answer


def test_a_payload_cannot_touch_another_completions_score(target):
    path, marker = target
    from llmgym.interop.verifiers_in import VerifiersScorer, verifiers_tasks

    attacks = payloads(path, marker)
    tasks = verifiers_tasks(_taskset(_SympyTask, n=1)) * 5
    completions = [attacks["patch the next check"], "7", attacks["forged score"], "5", "2*3"]
    scores = VerifiersScorer(time_limit=10).verify_batch(tasks, completions)
    assert [s.reward for s in scores] == [0.0, 0.0, 0.0, 0.0, 1.0], [s.info for s in scores]
    assert "malformed answer" in scores[2].info["error"]  # the forged "1.0" is not a score
    host_is_clean(path, marker)


def test_a_reward_that_cannot_import_raises_unless_the_completion_broke_it():
    env = from_verifiers(_taskset(_ImportingTask))
    env.reset(seed=0)
    with pytest.raises(VerifierUnavailableError, match="llmgym_no_such_scorer_module.*reference input too"):
        env.step("6")
    # a completion that makes a good scorer fail to import is the completion's 0, not a reason to stop the run
    env = from_verifiers(_taskset(_SympyTask))
    env.reset(seed=0)
    _, reward, _, _, info = env.step("__import__('llmgym_no_such_scorer_module')")
    assert reward == 0.0 and "ModuleNotFoundError" in info["error"]


def test_a_module_the_sandbox_cannot_read_is_refused_naming_the_fix(tmp_path, monkeypatch):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(tmp_path, 0o700)
    (private / "llmgym_test_vf_private.py").write_text(textwrap.dedent('''
        import verifiers.v1 as vf

        class Data(vf.TaskData):
            answer: str

        class Echo(vf.Task[Data]):
            @vf.reward
            async def exact(self, trace: vf.Trace) -> float:
                return float(trace.last_reply == self.data.answer)

        class Tasks(vf.Taskset[Echo, vf.TasksetConfig]):
            def load(self):
                return [Echo(Data(idx=0, prompt="say 1", answer="1"))]

        __all__ = ["Tasks"]
    '''))
    monkeypatch.syspath_prepend(str(private))
    with pytest.raises(SandboxError, match=r"cannot read.*chmod o\+rx"):
        from_verifiers("llmgym_test_vf_private")


class _OneSeat(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class _EvalEnv(vf.Env[_OneSeat]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                value = sympy.parse_expr(segment.last_reply)  # the env's own parser: an eval
                segment = await interaction.turn("right" if value == 6 else "again")


class _ClockEnv(vf.Env[_OneSeat]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                segment = await interaction.turn(f"it is {time.perf_counter_ns()}")  # not a function of the moves


def _vf_env(env_cls):
    class Tasks(vf.Taskset[_SympyTask, vf.TasksetConfig]):
        def load(self):
            return [_SympyTask(_Data(idx=0, prompt="What is 2 * 3?"))]

    module = type(sys)("llmgym_test_vf_isolation")
    module.Tasks, module.__all__ = Tasks, ["Tasks"]
    sys.modules["llmgym_test_vf_isolation"] = module
    return env_cls(_OneSeat(taskset=vf.TasksetConfig(id="llmgym_test_vf_isolation")))


def test_payloads_in_a_multi_turn_run_do_nothing_on_the_host_nor_to_the_next_episode(target):
    path, marker = target
    env = from_verifiers(_vf_env(_EvalEnv), max_turns=3)

    def returns(moves):
        env.reset(seed=0)
        total = 0.0
        for move in moves:
            _, reward, terminated, truncated, info = env.step(move)
            total += reward
            if terminated or truncated:
                break
        return total, info

    for name, payload in payloads(path, marker).items():
        total, info = returns([payload, "1", "2"])
        # code a payload runs inside the episode can change that episode's own scoring, as "patch the next
        # check" does (every later replay of the episode runs it again; docs/interop.md, "What the sandbox
        # cannot stop") -- nothing beyond it: the host, other episodes
        assert total == 0.0 or name == "patch the next check", (name, info)
        host_is_clean(path, marker)
        assert returns(["1", "2", "3"])[0] == 0.0, name  # the next episode is scored as if nothing happened
    env.reset(seed=0)
    assert env.step("5")[4]["reply"] == "again" and env.step("2*3")[4]["reply"] == "right"


def test_an_episode_that_does_not_replay_scores_zero_and_says_why():
    env = from_verifiers(_vf_env(_ClockEnv), max_turns=4)
    env.reset(seed=0)
    env.step("1")
    with pytest.warns(RuntimeWarning, match="replays an episode from its start"):
        _, reward, terminated, _, info = env.step("2")
    assert (reward, terminated) == (0.0, True)
    assert "turn 2 showed" in info["error"] and "the same moves showed" in info["error"]


def _evaluating_opponent(observation, rng):  # a third-party opponent that evaluates what the policy wrote
    for line in observation.splitlines():
        if line.startswith("[0] [4] "):  # the policy's move, as the opponent's seat is shown it
            try:
                eval(line[len("[0] [4] "):])
            except Exception:
                pass
    return "[8]"


def test_payloads_reaching_a_textarena_opponent_do_nothing_on_the_host(target):
    path, marker = target
    env = from_textarena("TicTacToe-v0", opponent=_evaluating_opponent, max_turns=3)
    for name, payload in payloads(path, marker).items():
        env.reset(seed=0)
        _, reward, terminated, _, info = env.step(f"[4] {payload}")  # a legal move, then the payload
        assert "[Player 1] [8]" in (info["reply"] or "") or "error" in info, (name, info)  # the opponent ran ...
        host_is_clean(path, marker)  # ... in the sandbox


def test_without_the_sandbox_the_adapters_refuse_at_construction(no_bwrap):
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        from_verifiers(_taskset(_SympyTask))
    with pytest.raises(SandboxUnavailableError):
        from_verifiers(_vf_env(_EvalEnv))
    with pytest.raises(SandboxUnavailableError, match="LLMGYM_ALLOW_UNSANDBOXED"):
        from_textarena("GuessTheNumber-v0")
    no_bwrap.setenv("LLMGYM_ALLOW_UNSANDBOXED", "1")  # the sandbox's own opt-out, and the only one: it warns
    with pytest.warns(SandboxWarning, match="WITHOUT bwrap"):
        env = from_textarena("GuessTheNumber-v0", max_turns=2)
    env.reset(seed=0)
    assert env.step("[10]")[4]["reply"].startswith("[GAME] The target number is")


SCRIPT = textwrap.dedent('''
    import sys
    from llmgym.interop import from_textarena

    print("top level ran", file=sys.stderr)  # no __main__ guard: a worker that re-imported this would say so

    def corner(observation, rng):  # defined in __main__: it travels to the sandbox by value
        return "[8]"

    env = from_textarena("TicTacToe-v0", opponent=corner, max_turns=2)
    env.reset(seed=0)
    print("opponent played:", "[Player 1] [8]" in env.step("[4]")[4]["reply"])
''')


def test_a_script_without_a_main_guard_runs_once_from_standard_input():
    result = subprocess.run([sys.executable, "-"], input=SCRIPT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.count("top level ran") == 1, result.stderr[-2000:]
    assert result.stdout.strip() == "opponent played: True"  # the opponent from __main__ played, in the sandbox


def test_the_sandboxed_source_imports_no_llmgym_at_module_level():
    """in_sandbox.py runs as the sandbox worker's source, where llmgym cannot be imported: every llmgym
    import in it sits in a try whose except keeps the source running without llmgym."""
    import ast

    import llmgym.interop.in_sandbox as in_sandbox

    tree = ast.parse(open(in_sandbox.__file__, encoding="utf-8").read())
    bare = [node.lineno for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
            and any((getattr(node, "module", None) or alias.name).startswith("llmgym") for alias in node.names)]
    assert bare == [], f"in_sandbox.py imports llmgym outside a try at line(s) {bare}"
