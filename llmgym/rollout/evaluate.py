"""One evaluator, one vocabulary: the reward of a policy on fixed tasks, and how the tasks are chosen.

:func:`evaluate` is what every evaluation in llmgym calls — the command line's ``--eval-every``, the
quickstart's before/after table, the examples and the learning tests — and it reports in the words the
training metrics use: ``reward_mean``, ``exact_match`` (the share of episodes that earned full
reward) and ``episodes``. :func:`distinct_tasks` picks the tasks, each at most once.

Example:
    >>> import gymnasium, llmgym
    >>> from llmgym.engines import HFEngine, SamplingParams
    >>> from llmgym.rollout import distinct_tasks, evaluate
    >>> from llmgym.runtime.models import load_model
    >>> model, tok = load_model("tiny")
    >>> env = gymnasium.make("llmgym/Copy-v0", tokenizer=tok)
    >>> tasks, how = distinct_tasks(env, 4, seed=1)
    >>> sorted(evaluate(env, HFEngine(model, tok), tasks))
    ['episodes', 'exact_match', 'reward_mean']
"""

from __future__ import annotations

from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from llmgym.engines.base import SamplingParams
from llmgym.env.types import Task
from llmgym.rollout.episodes import collect_episodes

__all__ = ["evaluate", "distinct_tasks", "DISTINCT_DRAW_PATIENCE"]


def evaluate(
    env: gym.Env,
    engine: Any,
    tasks: Sequence[Task],
    sampling: SamplingParams | None = None,
    *,
    seed: int = 0,
    success_reward: float = 1.0,
    episodes_out: list | None = None,
) -> dict[str, float]:
    """The policy behind ``engine`` on fixed ``tasks``: ``reward_mean``, ``exact_match``, ``episodes``.

    Greedy decoding of 32 new tokens by default, so before/after comparisons are not sampling noise.
    With a temperature above 0, ``sampling.n`` completions are sampled per task (with ``seed``: the
    same draws every call). ``exact_match`` is the share of episodes whose total reward reached
    ``success_reward`` (full credit). The engine's own sampling state is not touched. ``episodes_out``: a
    list that receives the episodes (a run records a sample of them).

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym import Task
        >>> from llmgym.engines import HFEngine, SamplingParams
        >>> from llmgym.rollout import evaluate
        >>> from llmgym.runtime.models import load_model
        >>> model, tok = load_model("tiny")
        >>> env = gymnasium.make("llmgym/Copy-v0", tokenizer=tok)
        >>> result = evaluate(env, HFEngine(model, tok), [Task("copy:12=", answer="12")],
        ...                   SamplingParams(temperature=1.0, n=4, max_new_tokens=6), seed=3)
        >>> result["episodes"], 0.0 <= result["exact_match"] <= result["reward_mean"] <= 1.0
        (4.0, True)
    """
    sampling = sampling or SamplingParams(temperature=0.0, max_new_tokens=32)
    group_size = sampling.n if sampling.temperature > 0 else 1
    episodes, _ = collect_episodes(env, engine, num_tasks=len(tasks), group_size=group_size, sampling=sampling,
                                   seed=seed, tasks=list(tasks))
    if episodes_out is not None:
        episodes_out.extend(episodes)
    rewards = [e.total_reward for e in episodes]
    return {"reward_mean": float(np.mean(rewards)),
            "exact_match": float(np.mean([r >= success_reward - 1e-9 for r in rewards])),
            "episodes": float(len(rewards))}


DISTINCT_DRAW_PATIENCE = 200
"""Draws in a row that found no new task after which :func:`distinct_tasks` stops looking."""


def distinct_tasks(env: gym.Env, num_tasks: int | None = None, seed: int = 0,
                   seeds: list[int] | None = None, allow_fewer: bool = False) -> tuple[list[Task], str]:
    """Tasks for an evaluation, each at most once; and a sentence saying how they were chosen.

    * A finite task list (HumanEval, a JSONL file): ``num_tasks=None`` takes every task, in the list's
      order; ``num_tasks=N`` takes N of them without replacement (a permutation seeded by ``seed``,
      kept in list order).
    * A procedural source (a function of the env's seeded generator, or an iterable): ``num_tasks``
      is required; tasks come from ``env.reset(seed=seed + i)`` for i = 0, 1, …, and a task already
      drawn (same id and prompt) is skipped, so the N tasks are distinct.

    Raises ``ValueError`` (with what to do) when ``num_tasks`` exceeds the distinct tasks there are;
    with ``allow_fewer=True`` a procedural source that runs out gives every distinct task it found,
    and the sentence says so (a default count, not one the user asked for).
    With a procedural source, a list given as ``seeds`` receives each task's reset seed (what
    reproduces it: ``env.reset(seed=seeds[i])``).

    Example:
        >>> import gymnasium, llmgym
        >>> from llmgym import SequenceEnv, Task
        >>> from llmgym.rollout import distinct_tasks
        >>> env = SequenceEnv([Task(str(i), id=f"t{i}") for i in range(5)], lambda t, c: 0.0)
        >>> [t.id for t in distinct_tasks(env)[0]]
        ['t0', 't1', 't2', 't3', 't4']
        >>> tasks, how = distinct_tasks(gymnasium.make("llmgym/Copy-v0"), 20, seed=0)
        >>> len({t.id for t in tasks}), how
        (20, '20 distinct tasks from seeds 0..19 (procedural source)')
        >>> few = SequenceEnv(lambda rng: Task(str(int(rng.integers(3)))), lambda t, c: 0.0)
        >>> tasks, how = distinct_tasks(few, 64, allow_fewer=True)  # a default count: what exists
        >>> len(tasks), how.split(" in ")[0]
        (3, 'all 3 distinct tasks found')
    """
    from llmgym.env.core import TaskSource

    source = getattr(env.unwrapped, "tasks", None)
    if isinstance(source, TaskSource) and source.kind == "sequence":
        every = list(source)
        if num_tasks is None:
            return every, f"all {len(every)} tasks of the list"
        if not 1 <= num_tasks <= len(every):
            raise ValueError(f"this env has {len(every)} tasks; ask for 1..{len(every)} (or all of them)")
        if num_tasks == len(every):
            return every, f"all {len(every)} tasks of the list"
        chosen = sorted(np.random.default_rng(seed).permutation(len(every))[:num_tasks].tolist())
        return [every[i] for i in chosen], f"{num_tasks} of {len(every)} tasks, drawn without replacement (seed {seed})"
    if num_tasks is None:
        raise ValueError("this env generates its tasks (no finite list): give a number of tasks")
    if num_tasks < 1:
        raise ValueError(f"the number of tasks must be >= 1, got {num_tasks}")
    tasks: list[Task] = []
    seen: set[tuple[str, str]] = set()
    # a small task space runs out of distinct tasks: stop after PATIENCE draws in a row gave nothing new
    # (or 10 draws per task asked for), and say so
    budget, misses, tried = 10 * num_tasks + 100, 0, 0
    while len(tasks) < num_tasks and tried < budget and misses < DISTINCT_DRAW_PATIENCE:
        try:
            _, info = env.reset(seed=seed + tried)
        except ValueError:  # an iterable source ran out
            break
        tried += 1
        key = (info["task"].id, str(info["task"].prompt))
        if key in seen:
            misses += 1
        else:
            seen.add(key)
            tasks.append(info["task"])
            if seeds is not None:
                seeds.append(seed + tried - 1)
            misses = 0
    if len(tasks) < num_tasks:
        if allow_fewer and tasks:
            return tasks, (f"all {len(tasks)} distinct tasks found in {tried} draws from seeds {seed}..{seed + tried - 1} "
                           f"(procedural source; fewer than the {num_tasks} asked for)")
        raise ValueError(f"found only {len(tasks)} distinct tasks in {tried} draws; ask for {len(tasks)} or fewer")
    return tasks, f"{num_tasks} distinct tasks from seeds {seed}..{seed + tried - 1} (procedural source)"
