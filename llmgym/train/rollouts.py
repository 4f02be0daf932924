"""Rollouts on disk: a bounded sample of a run's episodes in ``rollouts.jsonl``, one JSON object per episode.

Every ``every`` steps (and at the first and last step, and at every held-out evaluation) the run appends
up to ``per_step`` episodes of the step's batch: the prompt as the task wrote it, the completion as the
policy wrote it, the reward and its named parts, the verifier's info, the group (task) the episode
belongs to, its advantage, the policy version that sampled it and how stale it was, and for a
multi-turn episode its turns and tool calls. Nothing else: the record holds what the run held in
memory for that episode (never the env's or the engine's configuration), each text cut to
:data:`MAX_TEXT` characters, so the file stays small whatever the model writes. A secret this process holds
(``OPENAI_API_KEY``, the fleet's secret: :mod:`llmgym.runtime.secrets`) that the model echoed is written as
``[redacted]``.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from llmgym import Task
    >>> from llmgym.rollout.episodes import Episode
    >>> from llmgym.train.rollouts import RolloutLog, episode_records, read_rollouts
    >>> class Tok:  # a tokenizer: one character per id
    ...     def decode(self, ids, skip_special_tokens=False):
    ...         return "".join(chr(i) for i in ids)
    >>> ep = Episode(Task("2+2=", answer="4", id="add-1"), 0, [50, 43, 50, 61, 52], [0, 0, 0, 0, 1],
    ...              [0, 0, 0, 0, -0.1], [0, 0, 0, 0, 1.0], 4, ["stop"], [1],
    ...              info={"score": {"format": {"reward": 1.0, "weight": 0.5}}})
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with RolloutLog(d, every=1, per_step=4) as log:
    ...         log.write(episode_records([ep], Tok(), step=1))
    ...     [(r["prompt"], r["completion"], r["reward"], r["reward_parts"]) for r in read_rollouts(Path(d))]
    [('2+2=', '4', 1.0, {'format': 1.0})]
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from llmgym.errors import LLMGymError
from llmgym.runtime.files import JsonlRead, open_append, read_jsonl, rewind
from llmgym.runtime.logging import json_safe
from llmgym.runtime.secrets import known_secrets, redact_tree

__all__ = ["MAX_TEXT", "ROLLOUTS_FILE", "ROLLOUTS_EVERY", "ROLLOUTS_PER_STEP", "RolloutLog", "episode_advantages",
           "episode_records", "read_rollouts", "rewind_rollouts", "sample_episodes", "step_records", "truncate_rollouts"]

ROLLOUTS_FILE = "rollouts.jsonl"
ROLLOUTS_EVERY = 10
"""Default: the episodes of every 10th step (and of the first and last) go to ``rollouts.jsonl``."""
ROLLOUTS_PER_STEP = 8
"""Default: at most 8 episodes of such a step (whole groups first)."""
MAX_TEXT = 4000
"""Characters kept of any one text in a record (a prompt, a completion, a turn, an info string)."""
MAX_INFO_ITEMS = 50
"""Entries kept of any one dict or list inside a record's ``info`` (deeper levels are cut the same way)."""


class RolloutSettingsError(LLMGymError, ValueError):
    """``rollouts_every`` / ``rollouts_per_step`` out of range."""


def _clip(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more characters]"


def _bounded(value: Any, depth: int = 0) -> Any:
    """``value`` as plain JSON with every string, dict and list cut (:data:`MAX_TEXT`, :data:`MAX_INFO_ITEMS`)."""
    if isinstance(value, str):
        return _clip(value)
    if depth >= 6:
        return _clip(json.dumps(value))
    if isinstance(value, dict):
        items = list(value.items())
        out = {k: _bounded(v, depth + 1) for k, v in items[:MAX_INFO_ITEMS]}
        if len(items) > MAX_INFO_ITEMS:
            out["…"] = f"{len(items) - MAX_INFO_ITEMS} more entries"
        return out
    if isinstance(value, list):
        out = [_bounded(v, depth + 1) for v in value[:MAX_INFO_ITEMS]]
        return out + ([f"… {len(value) - MAX_INFO_ITEMS} more"] if len(value) > MAX_INFO_ITEMS else [])
    return value


def sample_episodes(episodes: Sequence[Any], per_step: int) -> list[int]:
    """Indices of the episodes a step records: whole groups first (so a group's spread shows), in order.

    Example:
        >>> from types import SimpleNamespace as E
        >>> sample_episodes([E(group=g) for g in (0, 0, 1, 1, 2, 2)], 3)
        [0, 1, 2]
    """
    order = sorted(range(len(episodes)), key=lambda i: (int(getattr(episodes[i], "group", 0)), i))
    return order[:max(0, int(per_step))]


def _segments(episode) -> list[tuple[str, list[int]]]:
    """The episode's tokens after the prompt as runs of ``("policy" | "env", ids)``."""
    out: list[tuple[str, list[int]]] = []
    for token, mask in zip(episode.token_ids[episode.prompt_length:], episode.action_mask[episode.prompt_length:]):
        role = "policy" if mask else "env"
        if out and out[-1][0] == role:
            out[-1][1].append(token)
        else:
            out.append((role, [token]))
    return out


def _reward_parts(score: Any) -> dict[str, float]:
    """A weighted sum's named parts (``info["score"][name]["reward"]``), as ``{name: reward}``."""
    if not isinstance(score, Mapping):
        return {}
    return {str(k): v["reward"] for k, v in score.items()
            if isinstance(v, Mapping) and isinstance(v.get("reward"), (int, float)) and not isinstance(v["reward"], bool)}


def episode_records(episodes: Sequence[Any], tokenizer, *, step: int, split: str = "train",
                    advantages: Sequence[float] | None = None, current_version: int | None = None,
                    sampled_by: int | None = None, indices: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """The ``rollouts.jsonl`` records of ``episodes`` (those at ``indices``; all by default).

    Args:
        episodes: :class:`~llmgym.rollout.episodes.Episode` objects.
        tokenizer: decodes the completion's ids (``decode(ids, skip_special_tokens=True)``).
        step: the run's step the episodes were trained on (or evaluated at).
        split: ``"train"`` or ``"eval"``.
        advantages: one per episode (the mean over its sampled tokens), where the agent computed them.
        current_version: the policy version that learned from them (``step - 1``): staleness is
            ``current_version −`` the oldest version that sampled a token of the episode.
        sampled_by: the version that sampled an episode whose engine reported none (the synchronous
            loop's: the current weights); ``None``: unknown.
    """
    records = []
    secrets = known_secrets()
    hide = lambda value: redact_tree(value, secrets)  # noqa: E731 (before any cut: no secret's prefix survives a clip)
    for i in (range(len(episodes)) if indices is None else indices):
        e = episodes[i]
        task = e.task
        info = dict(e.info or {})
        score = info.pop("score", {})
        info.pop("task", None)
        info.pop("completion", None)  # the completion is the record's own field
        segments = _segments(e)
        decode = lambda ids: hide(tokenizer.decode(ids, skip_special_tokens=True))  # noqa: E731
        completion = hide("".join(decode(ids) for role, ids in segments if role == "policy"))
        versions = [v for v, m in zip(e.policy_versions, e.action_mask) if m and v >= 0] if e.policy_versions else []
        version = min(versions) if versions else sampled_by
        record: dict[str, Any] = {
            "step": int(step), "split": split, "group": int(e.group), "task_id": str(getattr(task, "id", "")),
            "prompt": _bounded(hide(json_safe(task.prompt))), "answer": _bounded(hide(json_safe(getattr(task, "answer", None)))),
            "completion": _clip(completion), "reward": float(e.total_reward),
            "reward_parts": _reward_parts(score), "info": _bounded(hide(json_safe({**info, "score": score}))),
            "completion_tokens": int(sum(e.action_mask[e.prompt_length:])),
            "finish_reason": e.finish_reasons[-1] if e.finish_reasons else None,
            "advantage": None if advantages is None else float(advantages[i]),
            "policy_version": version,
            "staleness": None if version is None or current_version is None else int(current_version - version),
            "turns": int(e.num_turns),
        }
        if e.num_turns > 1 or any(role == "env" for role, _ in segments):
            record["transcript"] = [{"role": role, "text": _clip(decode(ids))} for role, ids in segments]
            calls = info.get("tool_calls_total")
            record["tool_calls"] = int(calls) if isinstance(calls, (int, float)) else None
        records.append(record)
    return records


def episode_advantages(batch) -> list[float] | None:
    """Each episode's advantage in ``batch`` (its mean over the sampled tokens), or ``None`` where the agent
    computed none.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> from llmgym.train.rollouts import episode_advantages
        >>> batch = SimpleNamespace(episodes=[0, 1], advantages=torch.tensor([[1.0, 3.0], [2.0, 0.0]]),
        ...                         action_mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
        >>> episode_advantages(batch)
        [2.0, 2.0]
    """
    episodes = getattr(batch, "episodes", None) or []
    adv = getattr(batch, "advantages", None)
    if adv is None or len(adv) != len(episodes):
        return None
    adv = adv.detach().float().cpu()
    if adv.dim() == 2:
        mask = batch.action_mask.detach().float().cpu()
        adv = (adv * mask).sum(1) / mask.sum(1).clamp(min=1.0)
    return adv.tolist()


def step_records(episodes: Sequence[Any], advantages: Sequence[float] | None, tokenizer, step: int, per_step: int,
                 *, on_policy: bool) -> list[dict[str, Any]]:
    """``rollouts.jsonl`` records of up to ``per_step`` of a step's ``episodes`` (whole groups first), with
    their ``advantages`` (:func:`episode_advantages`). ``on_policy``: the synchronous loop, whose engine samples
    with the weights of the step before (version ``step - 1``) when it reports no version itself."""
    return episode_records(episodes, tokenizer, step=step, advantages=advantages, current_version=step - 1,
                           sampled_by=step - 1 if on_policy else None,
                           indices=sample_episodes(episodes, per_step))


class RolloutLog:
    """Appends sampled episodes to ``<out_dir>/rollouts.jsonl`` (one JSON object a line, flushed as written;
    the file is opened without following a link and made with mode 0600).

    Args:
        out_dir: the run directory.
        every: record the episodes of every this many steps (and the first and last step); ``0``: never.
        per_step: at most this many episodes of such a step (and of each evaluation).
        append: keep the file's lines (a resumed run, after :func:`truncate_rollouts`).
    """

    def __init__(self, out_dir: str | os.PathLike, *, every: int = ROLLOUTS_EVERY, per_step: int = ROLLOUTS_PER_STEP,
                 append: bool = False):
        if every < 0:
            raise RolloutSettingsError(f"rollouts_every must be >= 0 (0 = no rollouts.jsonl), got {every}")
        if per_step < 1:
            raise RolloutSettingsError(f"rollouts_per_step must be >= 1, got {per_step}")
        self.every, self.per_step = int(every), int(per_step)
        self.path = Path(out_dir) / ROLLOUTS_FILE
        self._file = None
        if every > 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open_append(self.path, truncate=not append)  # never through a link; mode 0600

    def wants(self, step: int, last: int) -> bool:
        """Whether step ``step`` (of ``last`` in all) records its episodes."""
        return self._file is not None and (step == 1 or step == last or step % self.every == 0)

    def write(self, records: Iterable[Mapping[str, Any]]) -> None:
        if self._file is None:
            return
        for record in records:
            self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()

    def __enter__(self) -> RolloutLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_rollouts(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of ``rollouts.jsonl`` (``path``: the file or its run directory); ``[]`` if there is none. A
    line cut short by a run killed as it wrote it is skipped."""
    path = Path(path)
    return read_jsonl(path / ROLLOUTS_FILE if path.is_dir() else path)


def truncate_rollouts(path: str | os.PathLike, last_step: int) -> int:
    """Drop the records of steps after ``last_step`` (a resumed run logs them again) and any line cut short,
    atomically (:func:`llmgym.runtime.files.rewind_jsonl`); return how many stay.

    Example:
        >>> import json, tempfile
        >>> from pathlib import Path
        >>> from llmgym.train.rollouts import truncate_rollouts
        >>> with tempfile.TemporaryDirectory() as d:
        ...     p = Path(d) / "rollouts.jsonl"
        ...     _ = p.write_text("".join(json.dumps({"step": s}) + "\\n" for s in (1, 2, 3)))
        ...     truncate_rollouts(p, 2), p.read_text().count("\\n")
        (2, 2)
    """
    return len(rewind_rollouts(path, last_step).records)


def rewind_rollouts(path: str | os.PathLike, last_step: int) -> JsonlRead:
    """:func:`truncate_rollouts`, and what the rewind found (the unreadable lines it dropped)."""
    return rewind(path, last_step)
