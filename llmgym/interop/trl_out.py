"""llmgym envs and verifiers as TRL ``GRPOTrainer`` reward functions: :func:`trl_reward_funcs`, :func:`trl_dataset`.

TRL calls a reward function as ``fn(prompts=, completions=, completion_ids=, **columns)`` with one
list entry per completion (``columns`` are the dataset's other columns, repeated per completion,
plus ``trainer_state``, ``log_extra``, ``log_metric``). The functions here score through llmgym's
own verifier — its time limits, sandbox and error handling included — so a completion gets the
reward it would get from ``env.step``: cut, like there, to the env's ``max_completion_chars`` (64k
characters for a bare verifier), so host-side parsing never reads more than ``env.step`` lets it. This is the other direction of
:func:`llmgym.env.verifiers.from_reward_function` (a TRL reward function as an llmgym verifier).

Which task a completion answers: with an env, the row's ``task_id`` column names it in a finite
task list (else its prompt is looked up there), and ``task_seed`` reproduces it from a procedural
source (:func:`trl_dataset` writes both); with a bare verifier, the
task is rebuilt from the row as :func:`llmgym.env.sources.tasks_from_dataset` would (``answer`` column
as the answer, every column in ``metadata``). A completion whose task cannot be found raises: a
silent 0 would train on a lie. A multi-turn env does not map (its reward depends on the env's
replies, which a reward function of one completion never sees): use :func:`llmgym.interop.to_verifiers`
or llmgym's own agents.

Example:
    >>> import gymnasium, llmgym
    >>> from llmgym.interop import trl_dataset, trl_reward_funcs
    >>> env = gymnasium.make("llmgym/Copy-v0")
    >>> rows = trl_dataset(env, num_tasks=2)
    >>> row = rows[0]
    >>> sorted(row)
    ['prompt', 'task_id', 'task_seed']
    >>> (reward,) = trl_reward_funcs(env)
    >>> answer = row["task_id"].split("-")[1]   # Copy's answer is in its id
    >>> reward(prompts=[row["prompt"]] * 2, completions=[answer, "0"], task_id=[row["task_id"]] * 2,
    ...        task_seed=[row["task_seed"]] * 2)
    [1.0, 0.0]
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from llmgym.env.types import Score, Task
from llmgym.env.verifiers import Verifier, as_verifier

__all__ = ["trl_reward_funcs", "trl_dataset"]

_TRL_KEYWORDS = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                 "environments", "prompt", "completion"}


def _text(completion: Any, max_chars: int) -> str:
    """A completion as text, cut to ``max_chars`` before anything else reads it: a string, or TRL's
    conversational ``[{"role": "assistant", "content": ...}]`` (the assistant messages' contents, joined;
    the messages past the bound are never read).

    Example:
        >>> _text([{"role": "assistant", "content": "ab"}, {"role": "user", "content": "x"},
        ...        {"role": "assistant", "content": "cd"}], 3)
        'abc'
    """
    if isinstance(completion, str):
        return str.__getitem__(completion, slice(0, max_chars))
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        parts, room = [], max_chars
        for message in completion:
            if room <= 0:
                break
            if not isinstance(message, dict) or message.get("role") != "assistant":
                continue
            content = message.get("content") or ""
            if not isinstance(content, str):
                raise TypeError(f"an assistant message's content must be text, got {type(content).__name__}")
            parts.append(str.__getitem__(content, slice(0, room)))
            room -= len(parts[-1])
        return "".join(parts)
    raise TypeError(f"a completion must be text or a list of chat messages, got {type(completion).__name__}")


def _prompt_key(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return repr([(m["role"], m["content"]) for m in prompt])


def _task_prompt(task: Task) -> Any:
    return [dict(m) for m in task.prompt] if task.is_chat else task.prompt


def trl_dataset(env: Any, num_tasks: int | None = None, seed: int = 0) -> Any:
    """A ``datasets.Dataset`` of the env's tasks for TRL: columns ``prompt`` (text or chat messages) and ``task_id``.

    A finite task list gives every task (or ``num_tasks`` of them); a procedural env needs
    ``num_tasks`` (distinct tasks from seeds ``seed, seed+1, ...``) and adds a ``task_seed`` column,
    the reset seed that reproduces each task. Pair it with :func:`trl_reward_funcs` of the same env.
    """
    from datasets import Dataset

    from llmgym.rollout import distinct_tasks

    seeds: list[int] = []
    try:
        tasks = distinct_tasks(env, num_tasks, seed=seed, seeds=seeds)[0]
    except ValueError as exc:
        raise ValueError(f"{exc} (num_tasks=)") from None
    rows = [{"prompt": _task_prompt(t), "task_id": t.id} for t in tasks]
    for row, task_seed in zip(rows, seeds):
        row["task_seed"] = task_seed
    return Dataset.from_list(rows)


class _EnvTasks:
    """The env's tasks: a finite list by id and by prompt; a procedural source's by the seed that makes them."""

    def __init__(self, env: Any) -> None:
        from llmgym.env.vector import clone_env

        self.env, self._probe = env, None
        self.by_id: dict[str, Task] = {}
        self.by_prompt: dict[str, Task] = {}
        self.by_seed: dict[int, Task] = {}
        source = getattr(env.unwrapped, "tasks", None)
        if getattr(source, "kind", None) == "sequence":
            for task in source:
                self.by_id.setdefault(task.id, task)
                self.by_prompt.setdefault(_prompt_key(_task_prompt(task)), task)
        else:
            self._probe = clone_env(env)

    def find(self, prompt: Any, row: dict[str, Any]) -> Task:
        task_id, task_seed = row.get("task_id"), row.get("task_seed")
        if self._probe is not None and task_seed is not None:
            if int(task_seed) not in self.by_seed:
                self.by_seed[int(task_seed)] = self._probe.reset(seed=int(task_seed))[1]["task"]
            task = self.by_seed[int(task_seed)]
            if task_id is None or task.id == str(task_id):
                return task
        elif task_id is not None and str(task_id) in self.by_id:
            return self.by_id[str(task_id)]
        elif _prompt_key(prompt) in self.by_prompt:
            return self.by_prompt[_prompt_key(prompt)]
        raise KeyError(f"no task of this env matches the row (task_id {task_id!r}, task_seed {task_seed!r}, prompt "
                       f"{str(prompt)[:80]!r}): build the dataset with llmgym.interop.trl_dataset(env)")


def trl_reward_funcs(env_or_verifier: Any, *, name: str = "llmgym_reward", max_workers: int | None = None
                     ) -> list[Callable[..., list[float]]]:
    """``[reward_fn]`` for ``GRPOTrainer(reward_funcs=...)``, scoring through an llmgym env's verifier or a verifier.

    Args:
        env_or_verifier: a single-turn llmgym env (``gymnasium.make(...)``, an adapted env...) or an
            llmgym :class:`~llmgym.Verifier` / function ``(task, completion) -> float | Score``.
        name: the function's ``__name__`` (TRL logs rewards under it).
        max_workers: threads for :meth:`~llmgym.Verifier.verify_batch` (verifiers that wait on processes).

    Components a verifier reports as ``info[name] = {"reward": ...}`` (:class:`~llmgym.env.verifiers.WeightedSum`,
    verifiers rubrics) are logged as their batch means through TRL's ``log_metric`` when it is given.
    """
    from llmgym.env.core import DEFAULT_MAX_COMPLETION_CHARS, MultiTurnEnv, SequenceEnv

    inner = getattr(env_or_verifier, "unwrapped", None)
    # the bound env.step puts on what host-side parsing reads: TRL hands over completions of any length
    max_chars = DEFAULT_MAX_COMPLETION_CHARS
    if isinstance(inner, MultiTurnEnv):
        raise TypeError("a multi-turn env's reward depends on the env's replies, which a TRL reward function of one "
                        "completion never sees: train it with llmgym's agents, or hand it to verifiers "
                        "(llmgym.interop.to_verifiers)")
    if isinstance(inner, SequenceEnv):
        if inner.verifier is None:
            raise TypeError(f"{type(inner).__name__} has no verifier to score with")
        verifier, tasks = inner.verifier, _EnvTasks(env_or_verifier)
        max_chars = inner.max_completion_chars
    elif isinstance(env_or_verifier, Verifier) or callable(env_or_verifier):
        verifier, tasks = as_verifier(env_or_verifier), None
    else:
        raise TypeError(f"trl_reward_funcs takes an llmgym env or verifier, got {type(env_or_verifier).__name__}")

    def reward(prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Any = None,
               **columns: Any) -> list[float]:
        log_metric = columns.get("log_metric")
        data = {k: v for k, v in columns.items() if k not in _TRL_KEYWORDS}
        rows = [{k: v[i] for k, v in data.items()} for i in range(len(completions))]
        if tasks is not None:
            chosen = [tasks.find(p, row) for p, row in zip(prompts, rows)]
        else:
            chosen = [Task(p, answer=row.get("answer"), metadata=row, id=str(row.get("task_id", "")))
                      for p, row in zip(prompts, rows)]
        texts = [_text(c, max_chars) for c in completions]  # what env.step would score, cut before it is read
        scores = verifier.verify_batch(chosen, texts, max_workers=max_workers)  # each verifier's own batch path
        if callable(log_metric):
            for part, mean in _component_means(scores).items():
                log_metric(f"{name}/{part}", mean)
        return [s.reward for s in scores]

    reward.__name__ = reward.__qualname__ = name
    return [reward]


def _component_means(scores: Sequence[Score]) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for score in scores:
        for key, part in score.info.items():
            if isinstance(part, dict) and isinstance(part.get("reward"), (int, float)):
                sums.setdefault(key, []).append(float(part["reward"]))
    return {key: sum(values) / len(values) for key, values in sums.items()}
