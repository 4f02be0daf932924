"""Task sources beyond lists and functions: rows of a Hugging Face ``datasets.Dataset`` as :class:`~llmgym.Task`\\ s.

``datasets`` is not a dependency of llmgym: the function takes a dataset the user already has
(``datasets.load_dataset(...)``, ``Dataset.from_list(...)``, a local Parquet file) and never imports
the library itself. The result is a lazy, indexable task list, so any env that takes a list of tasks
takes it, rows are converted only when drawn, and ``reset(seed=)`` picks the same row every time.

Example:
    >>> from datasets import Dataset
    >>> from llmgym.env.sources import tasks_from_dataset
    >>> rows = Dataset.from_list([{"question": "2+3=", "solution": "5", "level": 1},
    ...                           {"question": "4*4=", "solution": "16", "level": 2}])
    >>> tasks = tasks_from_dataset(rows, prompt="question", answer="solution")
    >>> len(tasks), tasks[1].prompt, tasks[1].answer, tasks[1].id, dict(tasks[1].metadata)
    (2, '4*4=', '16', 'row-1', {'solution': '16', 'level': 2})
"""

from __future__ import annotations

import collections.abc
from typing import Any

from llmgym.env.types import Task

__all__ = ["DatasetTasks", "tasks_from_dataset"]


class DatasetTasks(collections.abc.Sequence):
    """A ``datasets.Dataset`` (or any indexable of dict rows) seen as a sequence of :class:`Task`\\ s.

    Args:
        rows: the dataset; ``rows[i]`` must be a mapping of column → value.
        prompt: the column holding the prompt (text, or a list of chat messages ``{"role", "content"}``).
        answer: the column holding the reference answer, or ``None``.
        id: the column holding a stable id; ``None``: ``"<id_prefix><row index>"``.
        metadata: the columns copied into ``Task.metadata``; ``None``: every column but the prompt's
            (the answer and id columns too, under their own names: what a TRL-style reward function
            receives as keyword arguments, see :func:`llmgym.env.verifiers.from_reward_function`).
        id_prefix: prefix of the row-index ids.
    """

    def __init__(self, rows: Any, *, prompt: str = "prompt", answer: str | None = "answer", id: str | None = None,
                 metadata: collections.abc.Sequence[str] | None = None, id_prefix: str = "row-"):
        columns = list(getattr(rows, "column_names", None) or (rows[0].keys() if len(rows) else []))
        wanted = {"prompt": prompt, "answer": answer, "id": id}
        missing = [f"{role}={name!r}" for role, name in wanted.items() if name is not None and name not in columns]
        missing += [f"metadata column {name!r}" for name in (metadata or ()) if name not in columns]
        if columns and missing:
            raise KeyError(f"the dataset has no column for {', '.join(missing)}; its columns are {columns}: "
                           f"map them with prompt=, answer=, id=, metadata=")
        if len(rows) == 0:
            raise ValueError("the dataset has no rows: a task source needs at least one")
        self.rows, self.prompt, self.answer, self.id, self.id_prefix = rows, prompt, answer, id, id_prefix
        self.metadata = list(metadata) if metadata is not None else [c for c in columns if c != prompt]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} is outside the dataset's {len(self)} rows")
        row = self.rows[int(index)]
        prompt = row[self.prompt]
        if prompt is None or (isinstance(prompt, str) and not prompt):
            raise ValueError(f"row {index}: the prompt column {self.prompt!r} is empty")
        return Task(prompt=prompt, answer=row[self.answer] if self.answer is not None else None,
                    metadata={name: row[name] for name in self.metadata},
                    id=str(row[self.id]) if self.id is not None else f"{self.id_prefix}{index}")


def tasks_from_dataset(rows: Any, *, prompt: str = "prompt", answer: str | None = "answer", id: str | None = None,
                       metadata: collections.abc.Sequence[str] | None = None, id_prefix: str = "row-") -> DatasetTasks:
    """The rows of a ``datasets.Dataset`` as a lazy list of :class:`Task`\\ s, by a column mapping.

    Pass the result wherever a list of tasks goes: ``SequenceEnv(tasks_from_dataset(ds, prompt="question",
    answer="answer"), verifier)``, or return it from a factory given to :func:`llmgym.register_env`.
    See :class:`DatasetTasks` for the arguments.

    Example:
        >>> from datasets import Dataset
        >>> from llmgym import SequenceEnv
        >>> from llmgym.env.sources import tasks_from_dataset
        >>> ds = Dataset.from_dict({"prompt": ["1+1=", "2+2="], "answer": ["2", "4"], "uid": ["a", "b"]})
        >>> env = SequenceEnv(tasks_from_dataset(ds, id="uid"), lambda task, text: text == task.answer)
        >>> obs, info = env.reset(seed=0)
        >>> info["task"].id in ("a", "b"), env.step(info["task"].answer)[1]
        (True, 1.0)
    """
    return DatasetTasks(rows, prompt=prompt, answer=answer, id=id, metadata=metadata, id_prefix=id_prefix)
