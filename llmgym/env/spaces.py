"""Gymnasium spaces for text and token-id observations, bounded so that vector envs can batch them.

Both spaces have a documented default bound, :data:`DEFAULT_MAX_CHARS` characters of text and
:data:`DEFAULT_MAX_TOKENS` token ids, sized for long prompts and multi-turn transcripts while keeping
``AsyncVectorEnv``'s shared memory small (a 65,536-character slot is 256 KiB per env). An env whose
observation outgrows its bound raises a ``ValueError`` naming the bound to raise
(``SequenceEnv(max_prompt_chars=..., max_prompt_tokens=...)``).

Both plug into Gymnasium's space utilities (``flatten``/``unflatten``/``flatten_space``) and its
shared memory (``create/read/write_to_shared_memory``), so ``gymnasium.make_vec(id,
vectorization_mode="async")`` works with its default ``shared_memory=True``. Text is stored as
Unicode code points (int32, padded with ``0x110000``, one past the last code point), token ids as a
length followed by the ids (int64). A batch read from shared memory is a live view, like a ``Box``
batch; ``copy.deepcopy`` of it (what ``AsyncVectorEnv(copy=True)``, the default, does) is a tuple of
``str`` / of int64 arrays, exactly what ``SyncVectorEnv`` returns.
"""

from __future__ import annotations

import collections.abc
import string
import sys
from typing import Any, Callable

import numpy as np
from gymnasium import spaces
from gymnasium.spaces.utils import flatten, flatten_space, unflatten
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

__all__ = ["AnyText", "TokenIds", "token_ids_space", "DEFAULT_MAX_CHARS", "DEFAULT_MAX_TOKENS"]

DEFAULT_MAX_CHARS = 65_536
"""Default bound of :class:`AnyText` (prompts, transcripts and completions), in characters."""

DEFAULT_MAX_TOKENS = 65_536
"""Default bound of :class:`TokenIds` (``prompt_ids``), in token ids."""

_TEXT_PAD = sys.maxunicode + 1  # flattened text is padded with one past the last code point


class AnyText(spaces.Text):
    """A :class:`gymnasium.spaces.Text` that contains any ``str`` of bounded length.

    Prompts and completions hold arbitrary Unicode; ``Text``'s finite charset cannot enumerate it,
    so membership here only checks type and length, and flattening stores code points (any ``str``
    this space contains flattens and comes back unchanged). Samples are drawn from printable ASCII.

    Args:
        max_length: longest string in the space, default :data:`DEFAULT_MAX_CHARS` (65,536).
        min_length: shortest string (default 0).

    Example:
        >>> from gymnasium.spaces.utils import flatten, unflatten
        >>> from llmgym.env.spaces import AnyText
        >>> space = AnyText(max_length=100)
        >>> "∑ x² = 1\\n" in space, "" in space, 3 in space
        (True, True, False)
        >>> unflatten(space, flatten(space, "naïve ∑ 🙂"))
        'naïve ∑ 🙂'
        >>> AnyText().max_length
        65536
    """

    def __init__(self, max_length: int = DEFAULT_MAX_CHARS, *, min_length: int = 0, seed: Any = None):
        super().__init__(max_length, min_length=min_length, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random printable string of at most 64 characters (a 65,536-character sample helps no check)."""
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        high = min(self.max_length, max(self.min_length, 64))
        length = int(self.np_random.integers(self.min_length, high + 1))
        chars = self.np_random.choice(np.array(list(string.printable)), size=length)
        return "".join(chars.tolist())

    def encode(self, text: str) -> np.ndarray:
        """``text`` as ``max_length`` int32 code points, padded with ``0x110000``; a clear error if it does not fit."""
        if not isinstance(text, str):
            raise TypeError(f"{self!r} holds str, got {type(text).__name__}")
        if len(text) > self.max_length:
            raise ValueError(
                f"a text of {len(text):,} characters does not fit {self!r}: raise the bound "
                f"(SequenceEnv(max_prompt_chars=...), AnyText(max_length=...))"
            )
        out = np.full(self.max_length, _TEXT_PAD, dtype=np.int32)
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
        out[: len(codes)] = codes
        return out

    @staticmethod
    def decode(codes: np.ndarray) -> str:
        """The string of a row of code points (padding and out-of-range values skipped)."""
        codes = np.asarray(codes)
        codes = codes[(codes >= 0) & (codes < _TEXT_PAD)]
        return codes.astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")

    def __repr__(self) -> str:
        return f"AnyText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, AnyText) and (self.min_length, self.max_length) == (other.min_length, other.max_length)


class TokenIds(spaces.Sequence):
    """Variable-length token ids, at most ``max_length`` of them: ``Sequence(Discrete(vocab_size), stack=True)``.

    Args:
        vocab_size: ids lie in ``[0, vocab_size)``.
        max_length: most ids in one observation, default :data:`DEFAULT_MAX_TOKENS` (65,536).

    Example:
        >>> import numpy as np
        >>> from llmgym.env.spaces import TokenIds
        >>> space = TokenIds(10, max_length=4)
        >>> np.array([1, 2, 9]) in space, np.array([10]) in space, np.arange(5) in space
        (True, False, False)
    """

    def __init__(self, vocab_size: int, max_length: int = DEFAULT_MAX_TOKENS, seed: Any = None):
        super().__init__(spaces.Discrete(vocab_size), stack=True, seed=seed)
        self.max_length = int(max_length)

    def contains(self, x: Any) -> bool:
        return super().contains(x) and len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> Any:
        if mask is None and probability is None:  # a length the space contains (Sequence's is unbounded)
            length = int(self.np_random.integers(0, min(self.max_length, 64) + 1))
            return super().sample(mask=(length, None))
        return super().sample(mask=mask, probability=probability)

    def encode(self, ids: Any) -> np.ndarray:
        """``[length, *ids]`` padded with zeros to ``max_length + 1`` int64 values; a clear error if too long."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if len(ids) > self.max_length:
            raise ValueError(
                f"{len(ids):,} token ids do not fit {self!r}: raise the bound "
                f"(SequenceEnv(max_prompt_tokens=...), TokenIds(max_length=...))"
            )
        out = np.zeros(self.max_length + 1, dtype=np.int64)
        out[0], out[1 : len(ids) + 1] = len(ids), ids
        return out

    def __repr__(self) -> str:
        return f"TokenIds({self.feature_space.n}, max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (isinstance(other, TokenIds) and self.feature_space == other.feature_space
                and self.max_length == other.max_length)


def token_ids_space(vocab_size: int, seed: Any = None, max_length: int = DEFAULT_MAX_TOKENS) -> TokenIds:
    """Variable-length token ids: a :class:`TokenIds` space (int64 arrays of at most ``max_length`` ids).

    Example:
        >>> import numpy as np
        >>> from llmgym.env.spaces import token_ids_space
        >>> space = token_ids_space(10)
        >>> np.array([1, 2, 9]) in space, np.array([10]) in space
        (True, False)
    """
    return TokenIds(vocab_size, max_length=max_length, seed=seed)


def as_token_array(ids) -> np.ndarray:
    return np.asarray(ids, dtype=np.int64).reshape(-1)


# -- Gymnasium space utilities (singledispatch: these handlers win over Text's for AnyText) ----------
@flatten.register(AnyText)
def _flatten_any_text(space: AnyText, x: str) -> np.ndarray:
    return space.encode(x)


@unflatten.register(AnyText)
def _unflatten_any_text(space: AnyText, x: np.ndarray) -> str:
    return space.decode(x)


@flatten_space.register(AnyText)
def _flatten_space_any_text(space: AnyText) -> spaces.Box:
    return spaces.Box(low=0, high=_TEXT_PAD, shape=(space.max_length,), dtype=np.int32)


class _SharedBatch(collections.abc.Sequence):
    """A live view of one text or token-id field of a batch in shared memory; deep-copies to a tuple."""

    def __init__(self, rows: np.ndarray, decode: Callable[[np.ndarray], Any]):
        self._rows, self._decode = rows, decode

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self)[i]
        return self._decode(self._rows[i])

    def __deepcopy__(self, memo: dict) -> tuple:
        return tuple(self)

    def __reduce__(self):
        return tuple, (tuple(self),)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({tuple(self)!r:.200})"


# AnyText inherits Text's shared memory: n * max_length int32 (create_shared_memory)
@write_to_shared_memory.register(AnyText)
def _write_any_text(space: AnyText, index: int, value: str, shared_memory: Any) -> None:
    rows = np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape(-1, space.max_length)
    rows[index] = space.encode(value)


@read_from_shared_memory.register(AnyText)
def _read_any_text(space: AnyText, shared_memory: Any, n: int = 1) -> _SharedBatch:
    rows = np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape(n, space.max_length)
    return _SharedBatch(rows, space.decode)


@create_shared_memory.register(TokenIds)
def _create_token_ids_memory(space: TokenIds, n: int = 1, ctx: Any = None) -> Any:
    import multiprocessing

    return (ctx or multiprocessing).Array(np.dtype(np.int64).char, n * (space.max_length + 1))


@write_to_shared_memory.register(TokenIds)
def _write_token_ids(space: TokenIds, index: int, value: Any, shared_memory: Any) -> None:
    rows = np.frombuffer(shared_memory.get_obj(), dtype=np.int64).reshape(-1, space.max_length + 1)
    rows[index] = space.encode(value)


def _decode_token_row(row: np.ndarray) -> np.ndarray:
    return row[1 : int(row[0]) + 1].copy()


@read_from_shared_memory.register(TokenIds)
def _read_token_ids(space: TokenIds, shared_memory: Any, n: int = 1) -> _SharedBatch:
    rows = np.frombuffer(shared_memory.get_obj(), dtype=np.int64).reshape(n, space.max_length + 1)
    return _SharedBatch(rows, _decode_token_row)
