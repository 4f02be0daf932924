"""Preference pairs ``(prompt, chosen, rejected)``: the data of reward models and DPO.

:func:`load_preferences` reads them from a JSONL file, a ``datasets.Dataset``, or any iterable of
dicts or triples, and checks every row; :func:`encode_pair` turns one pair into the token ids a
causal LM sees (the prompt rendered exactly as :class:`~llmgym.SequenceEnv` renders it, then the
completion and EOS).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Union

from llmgym.env.core import encode_text, render_prompt
from llmgym.env.types import Prompt, Task

__all__ = ["PreferencePair", "load_preferences", "save_preferences", "encode_pair", "split_preferences"]

PreferenceSource = Union[str, os.PathLike, Iterable[Any]]


@dataclasses.dataclass(frozen=True)
class PreferencePair:
    """One comparison: for ``prompt``, the completion ``chosen`` is preferred to ``rejected``.

    ``margin`` (optional; TRL's ``margin`` column) is how much better ``chosen`` is: a reward model
    is then trained to score it at least that much higher (Llama 2's graded preferences). DPO does
    not read it.

    Example:
        >>> from llmgym.rlhf.preferences import PreferencePair
        >>> PreferencePair("2+2=", "4", "5").chosen
        '4'
        >>> PreferencePair("2+2=", "4", "five", margin=2.0).to_dict()["margin"]
        2.0
    """

    prompt: Prompt
    chosen: str
    rejected: str
    margin: float | None = None

    def __post_init__(self) -> None:
        for name in ("chosen", "rejected"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"PreferencePair.{name} must be a string, got {getattr(self, name)!r:.80}")
        if self.margin is not None:
            number = isinstance(self.margin, numbers.Real) and not isinstance(self.margin, bool)
            if not number or not math.isfinite(self.margin):
                raise TypeError(f"PreferencePair.margin must be a finite number (or absent), got {self.margin!r:.80}")
            object.__setattr__(self, "margin", float(self.margin))
        Task(self.prompt)  # the same prompt check as a task's (text or chat messages)
        if not isinstance(self.prompt, str):
            object.__setattr__(self, "prompt", tuple(dict(m) for m in self.prompt))

    def to_dict(self) -> dict[str, Any]:
        prompt = self.prompt if isinstance(self.prompt, str) else [dict(m) for m in self.prompt]
        row = {"prompt": prompt, "chosen": self.chosen, "rejected": self.rejected}
        return row if self.margin is None else {**row, "margin": self.margin}


def _as_pair(row: Any, where: str) -> PreferencePair:
    if isinstance(row, PreferencePair):
        return row
    if isinstance(row, Mapping):
        missing = [k for k in ("prompt", "chosen", "rejected") if k not in row]
        if missing:
            raise ValueError(f"{where}: preference row lacks {missing}; each row needs 'prompt', 'chosen' and "
                             f"'rejected' (got keys {sorted(row)[:10]})")
        return PreferencePair(row["prompt"], row["chosen"], row["rejected"], row.get("margin"))
    if isinstance(row, Sequence) and not isinstance(row, str) and len(row) == 3:
        return PreferencePair(*row)
    raise TypeError(f"{where}: a preference row must be a dict with prompt/chosen/rejected or a "
                    f"(prompt, chosen, rejected) triple, got {row!r:.80}")


def load_preferences(source: PreferenceSource) -> list[PreferencePair]:
    """Preference pairs from a JSONL path, a ``datasets.Dataset``, or an iterable of rows.

    A row is ``{"prompt": ..., "chosen": ..., "rejected": ...}`` with an optional ``"margin"`` (extra
    keys ignored) or a triple.

    Example:
        >>> from llmgym.rlhf.preferences import load_preferences
        >>> pairs = load_preferences([{"prompt": "q", "chosen": "a", "rejected": "b", "who": "me"}, ("q", "c", "d")])
        >>> [p.chosen for p in pairs]
        ['a', 'c']
        >>> load_preferences([{"prompt": "q", "chosen": "a"}])
        Traceback (most recent call last):
        ...
        ValueError: row 0: preference row lacks ['rejected']; each row needs 'prompt', 'chosen' and 'rejected' (got keys ['chosen', 'prompt'])
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"no preference file at {str(path)!r}: give a JSONL file with one "
                                    f'{{"prompt": ..., "chosen": ..., "rejected": ...}} object per line')
        pairs = []
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
                pairs.append(_as_pair(row, f"{path}:{number}"))
    else:
        pairs = [_as_pair(row, f"row {i}") for i, row in enumerate(source)]
    if not pairs:
        raise ValueError(f"no preference pairs in {source!r:.80}")
    return pairs


def save_preferences(pairs: Iterable[PreferencePair], path: str | os.PathLike) -> Path:
    """Write pairs as JSONL (what :func:`load_preferences` reads back).

    Example:
        >>> import tempfile, os
        >>> from llmgym.rlhf.preferences import PreferencePair, save_preferences, load_preferences
        >>> with tempfile.TemporaryDirectory() as d:
        ...     path = save_preferences([PreferencePair("q", "a", "b")], os.path.join(d, "p.jsonl"))
        ...     load_preferences(path)[0].rejected
        'b'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for pair in pairs:
            f.write(json.dumps(_as_pair(pair, "pair").to_dict()) + "\n")
    return path


def split_preferences(pairs: Sequence[PreferencePair], held_out: float = 0.2,
                      seed: int = 0) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """A seeded ``(train, held_out)`` split.

    Example:
        >>> from llmgym.rlhf.preferences import PreferencePair, split_preferences
        >>> train, test = split_preferences([PreferencePair("q", str(i), "x") for i in range(10)], 0.3)
        >>> len(train), len(test)
        (7, 3)
    """
    import numpy as np

    if not 0 < held_out < 1:
        raise ValueError(f"held_out must be a fraction in (0, 1), got {held_out}")
    order = np.random.default_rng(seed).permutation(len(pairs))
    cut = len(pairs) - max(1, int(round(held_out * len(pairs))))
    return [pairs[i] for i in order[:cut]], [pairs[i] for i in order[cut:]]


def encode_pair(tokenizer: Any, prompt: Prompt, completion: str) -> tuple[list[int], list[int]]:
    """``(prompt_ids, completion_ids)``: the prompt as an env renders it; the completion ends with EOS.

    Example:
        >>> from llmgym.runtime.models import build_tokenizer
        >>> from llmgym.rlhf.preferences import encode_pair
        >>> tok = build_tokenizer()
        >>> p, c = encode_pair(tok, "2+2=", "4")
        >>> p[0] == tok.bos_token_id, c[-1] == tok.eos_token_id, tok.decode(c, skip_special_tokens=True)
        (True, True, '4')
    """
    task = Task(prompt)
    prompt_ids = encode_text(tokenizer, render_prompt(task, tokenizer), first=not task.is_chat)
    completion_ids = list(tokenizer.encode(completion, add_special_tokens=False))
    if tokenizer.eos_token_id is not None:
        completion_ids.append(tokenizer.eos_token_id)
    return prompt_ids, completion_ids
