"""Gymnasium spaces for text and token-id observations."""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = ["AnyText", "token_ids_space"]


class AnyText(spaces.Text):
    """A :class:`gymnasium.spaces.Text` that contains any ``str`` of bounded length.

    Prompts and completions hold arbitrary Unicode; ``Text``'s finite charset cannot enumerate it,
    so membership here only checks type and length. Samples are drawn from printable ASCII.

    Example:
        >>> from llmgym.spaces import AnyText
        >>> space = AnyText(max_length=100)
        >>> "∑ x² = 1\\n" in space, "" in space, 3 in space
        (True, True, False)
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: Any = None):
        super().__init__(max_length, min_length=min_length, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random printable string of at most 64 characters (a million-character sample helps no check)."""
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        high = min(self.max_length, max(self.min_length, 64))
        length = int(self.np_random.integers(self.min_length, high + 1))
        chars = self.np_random.choice(np.array(list(string.printable)), size=length)
        return "".join(chars.tolist())

    def __repr__(self) -> str:
        return f"AnyText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, AnyText) and (self.min_length, self.max_length) == (other.min_length, other.max_length)


def token_ids_space(vocab_size: int, seed: Any = None) -> spaces.Sequence:
    """Variable-length token ids: ``Sequence(Discrete(vocab_size), stack=True)`` (int64 arrays).

    Example:
        >>> import numpy as np
        >>> from llmgym.spaces import token_ids_space
        >>> space = token_ids_space(10)
        >>> np.array([1, 2, 9]) in space, np.array([10]) in space
        (True, False)
    """
    return spaces.Sequence(spaces.Discrete(vocab_size), stack=True, seed=seed)


def as_token_array(ids) -> np.ndarray:
    return np.asarray(ids, dtype=np.int64).reshape(-1)
