"""Cost of the interop adapters' isolation: per scored completion (verifiers), per turn (verifiers ``run()``,
TextArena games).

Prints one JSON line per measurement: the median seconds over ``--repeats`` rounds. Rows:

* ``in_process``: the taskset's own ``Task.score(trace)`` called in this process (no isolation at all:
  the floor every isolated path is compared with);
* ``batch``: ``VerifiersScorer().verify_batch`` of ``--n`` completions (what a rollout turn and
  ``trl_reward_funcs`` do), per completion;
* ``step``: a lone ``env.step`` (one completion, nothing batched);
* ``vf_turn`` / ``ta_turn``: one step of a multi-turn verifiers episode (``llmgym_test_vf_guess``, 6 turns)
  and of a TextArena game (TicTacToe, against the random opponent), per turn;
* ``start``: the first scoring / reset of the process (a worker's start-up where there is one).

Every completion is a new string, as in RL. Run it on two checkouts alternately to compare (``--label``
names the side) and report ``uptime`` with it:

    PYTHONPATH=<other checkout> python benchmarks/interop_cost.py --label before
    python benchmarks/interop_cost.py --label after
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "data", "verifiers_envs"))  # the test environments
sys.path.insert(0, HERE)
from scoring_cost import timed  # noqa: E402  (the same medians as the math scorers' costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import llmgym.interop.verifiers_in as vi
    from llmgym.interop import from_textarena, from_verifiers

    def row(name: str, seconds: float, **extra) -> None:
        print(json.dumps({"label": args.label, "row": name, "ms": round(1000 * seconds, 2), **extra,
                          "load": os.getloadavg()[0]}), flush=True)

    env = from_verifiers("llmgym_test_vf")
    tasks = list(env.unwrapped.tasks)
    scorer = env.unwrapped.verifier
    t0 = time.perf_counter()
    env.reset(options={"task": tasks[0]})
    env.step("0000")
    row("start", time.perf_counter() - t0, what="first verifiers scoring of the process")

    vf = vi.import_verifiers()

    def in_process(k: int) -> None:
        task = tasks[k % len(tasks)]
        trace = vi.new_trace(vf, task.metadata[vi.TASK_KEY])
        vi.append_message(vf, trace, vf.AssistantMessage(content=f"{k:04d}"), sampled=True)
        trace.stop("agent_completed")
        vi.run_coroutine(task.metadata[vi.TASK_KEY].score(trace))

    row("in_process", timed(in_process, args.n, args.repeats))

    def batch(k: int) -> None:
        chosen = [tasks[(k + i) % len(tasks)] for i in range(args.n)]
        scorer.verify_batch(chosen, [f"{k}{i:03d}" for i in range(args.n)])

    row("batch", timed(batch, 1, args.repeats) / args.n, n=args.n)

    def step(k: int) -> None:
        env.reset(options={"task": tasks[k % len(tasks)]})
        env.step(f"{k:04d}")

    row("step", timed(step, args.n, args.repeats))

    guess = from_verifiers("llmgym_test_vf_guess", max_turns=6)
    t0 = time.perf_counter()
    guess.reset(seed=0)
    row("vf_start", time.perf_counter() - t0, what="first multi-turn reset of the process")

    def vf_episode(k: int) -> None:
        guess.reset(seed=k)
        for turn in range(6):
            if any(guess.step(str(100 + 7 * k + turn))[2:4]):
                break

    row("vf_turn", timed(vf_episode, 2, args.repeats) / 6, turns=6)

    game = from_textarena("TicTacToe-v0", max_turns=5)
    t0 = time.perf_counter()
    game.reset(seed=0)
    row("ta_start", time.perf_counter() - t0, what="first TextArena reset of the process")
    counted = []

    def ta_episode(k: int) -> None:
        game.reset(seed=k)
        for move in ("[4]", "[0]", "[8]", "[2]", "[6]"):
            counted.append(1)
            if any(game.step(f"{move} move {k}")[2:4]):
                break

    seconds = timed(ta_episode, 2, args.repeats)
    row("ta_turn", seconds * 2 * args.repeats / max(1, len(counted)), turns=len(counted) / (2 * args.repeats))


if __name__ == "__main__":
    main()
