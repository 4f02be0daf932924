"""The two value types everything else passes around: a :class:`Task` and a :class:`Score`."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence, Union

__all__ = ["Task", "Score", "Message", "Prompt"]

Message = Mapping[str, str]
"""A chat message: ``{"role": "user", "content": "..."}``."""

Prompt = Union[str, Sequence[Message]]
"""A prompt is plain text or a list of chat messages."""


@dataclasses.dataclass(frozen=True)
class Task:
    """One problem: a prompt, what a verifier needs to judge an answer, and an id.

    Args:
        prompt: plain text, or chat messages (``[{"role": "user", "content": ...}]``).
        answer: the reference answer, as the task source stores it (may be ``None``).
        tests: unit tests or other checks for code tasks (any form its verifier understands).
        metadata: anything else a verifier or a report may need.
        id: a stable identifier (``"HumanEval/0"``, ``"add-17"``); used by ``reset(options={"task_id": ...})``.

    Example:
        >>> from llmgym import Task
        >>> task = Task("2+3=", answer="5", id="add-0")
        >>> task.prompt, task.answer, task.id
        ('2+3=', '5', 'add-0')
        >>> task.is_chat
        False
    """

    prompt: Prompt
    answer: Any = None
    tests: Any = None
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    id: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.prompt, str):
            return
        if not isinstance(self.prompt, Sequence) or not all(
            isinstance(m, Mapping) and "role" in m and "content" in m for m in self.prompt
        ):
            raise TypeError(
                f"Task.prompt must be a string or a list of chat messages like "
                f"[{{'role': 'user', 'content': '...'}}], got {self.prompt!r:.120}"
            )
        object.__setattr__(self, "prompt", tuple(dict(m) for m in self.prompt))

    @property
    def is_chat(self) -> bool:
        """Whether the prompt is a list of chat messages rather than plain text."""
        return not isinstance(self.prompt, str)

    def __hash__(self) -> int:  # metadata may hold unhashable values; the id and prompt identify a task
        return hash((self.id, str(self.prompt)))


@dataclasses.dataclass(frozen=True)
class Score:
    """A verifier's judgement of one completion.

    Args:
        reward: the scalar reward.
        info: the verifier's details (parsed answer, failing test, error message...).

    Example:
        >>> from llmgym import Score
        >>> Score(1.0, {"parsed": "5"}).reward
        1.0
    """

    reward: float
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            reward = float(self.reward)
        except (TypeError, ValueError):
            raise TypeError(f"Score.reward must be a number, got {self.reward!r:.80}") from None
        object.__setattr__(self, "reward", reward)
        object.__setattr__(self, "info", dict(self.info))
