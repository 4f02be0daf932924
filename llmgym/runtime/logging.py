"""Run records: metrics as JSONL (and TensorBoard where installed), training-curve plots, and the
curve statistics the command line reports (moving averages, threshold crossings). pass@k and
confidence intervals live in :mod:`llmgym.runtime.metrics`.

Everything here is plain Python, ``numpy`` and ``matplotlib`` (Agg backend, imported only when a
plot is drawn), so ``import llmgym`` stays light.

Example:
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> from llmgym.runtime.logging import MetricsLogger, read_metrics
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with MetricsLogger(d, tensorboard=False) as log:
    ...         log.log({"step": 1, "reward_mean": 0.5})
    ...     [row["reward_mean"] for row in read_metrics(Path(d) / "metrics.jsonl")]
    [0.5]
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llmgym.runtime.files import (
    JsonlRead,
    check_run_folder,
    open_append,
    read_bytes_bounded,
    read_jsonl,
    rewind,
    write_bytes_atomic,
    write_text_atomic,
)

__all__ = [
    "TIMING_FIELDS",
    "json_safe",
    "CURVE_PANELS",
    "TABLE_COLUMNS",
    "curve_panels",
    "TRACKERS",
    "TRACKER_IDS",
    "MetricsLogger",
    "moving_average",
    "plot_comparison",
    "plot_curves",
    "read_metrics",
    "metrics_notes",
    "rewind_metrics",
    "step_rows",
    "reward_band",
    "steps_to_threshold",
    "truncate_metrics",
]

TIMING_FIELDS: tuple[str, ...] = (
    "wall_s", "tokens_per_s", "rollout_s", "generate_s", "verify_s", "time", "eval_s",
    # the pipelined learner's stage clocks and weight copies (when a copy is made depends on thread timing)
    "generate_busy_s", "generate_idle_s", "verify_busy_s", "verify_idle_s", "learn_busy_s", "learn_idle_s",
    "weight_sync_s", "weight_snapshots", "update_s",
)
"""Per-step fields that measure time (or depend on thread timing), so differ between two otherwise
identical runs; every other field of a seeded run repeats exactly on one machine."""


def _json_value(value: Any) -> Any:
    """A JSON-safe scalar: tensors and numpy numbers become floats; NaN/inf become ``None``."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON: dicts (with string keys), lists, strings, finite numbers, ``None``.

    Tensors and numpy values become numbers or lists; NaN and infinities ``None``; anything else
    (a ``Task``, an exception) its ``str``. For records of what a verifier said about a completion.

    Example:
        >>> import math
        >>> from llmgym.runtime.logging import json_safe
        >>> json_safe({"score": {"reward": math.nan, "parts": (1, 2)}, 3: ValueError("bad")})
        {'score': {'reward': None, 'parts': [1, 2]}, '3': 'bad'}
    """
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        try:
            return json_safe(value.tolist())
        except (TypeError, ValueError, RuntimeError):
            return str(value)
    value = _json_value(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


class MetricsLogger:
    """Append one JSON object per step to ``<out_dir>/metrics.jsonl``; mirror numbers to TensorBoard.

    TensorBoard (``torch.utils.tensorboard``, which needs the ``tensorboard`` package) is used when it
    can be imported and ``tensorboard`` is not ``False``; otherwise it is skipped silently. Event files
    go to ``<out_dir>/tensorboard``. Each row is flushed as it is written, so an interrupted run
    keeps every completed step. ``metrics.jsonl`` is appended to, never through a link, and made with mode
    0600 (:func:`llmgym.runtime.files.open_append`); a run folder whose files are links is refused.

    Args:
        out_dir: the run directory (created if missing).
        append: keep existing rows (resuming a run) instead of starting the file afresh; the trackers
            then continue the run's tracker runs (their ids are kept in ``<out_dir>/trackers.json``).
        tensorboard: ``None`` = use it if importable; ``False`` = never.
        trackers: experiment trackers to mirror every row to, by module name: ``"wandb"`` and/or
            ``"trackio"`` (the project's extras of those names); one that is not
            installed raises ``ImportError`` naming the package. The project is ``$LLMGYM_PROJECT`` or
            ``"llmgym"``; wandb keeps its files in ``<out_dir>/wandb`` unless ``$WANDB_DIR`` says otherwise,
            trackio its database in its own folder (``$TRACKIO_DIR``; view it with ``trackio show``).
        run_name, run_config: the tracker run's name and config.
    """

    def __init__(self, out_dir: str | os.PathLike, *, append: bool = False, tensorboard: bool | None = None,
                 trackers: Sequence[str] = (), run_name: str | None = None,
                 run_config: Mapping[str, Any] | None = None):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "metrics.jsonl"
        for name in trackers:
            if name not in TRACKERS:
                raise ValueError(f"unknown tracker {name!r}: choose from {', '.join(TRACKERS)}")
        check_run_folder(self.out_dir, ("metrics.jsonl", "tensorboard", TRACKER_IDS, "wandb"))
        self._file = open_append(self.path, truncate=not append)
        self._writer = None
        if tensorboard is not False:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(log_dir=str(self.out_dir / "tensorboard"))
            except Exception:  # tensorboard not installed (or broken): JSONL only
                self._writer = None
        self._trackers: list[_Tracker] = []
        try:
            ids_path = self.out_dir / TRACKER_IDS
            ids = _read_tracker_ids(ids_path) if append else {}
            for name in trackers:
                tracker = _Tracker.start(name, run_name, run_config, ids.get(name), self.out_dir)
                self._trackers.append(tracker)
                ids[name] = tracker.run_id
            if trackers:
                _write_tracker_ids(ids_path, ids)
        except BaseException:
            self.close()
            raise

    @property
    def tensorboard_dir(self) -> Path | None:
        """Where TensorBoard event files go, or ``None`` when TensorBoard is not in use."""
        return self.out_dir / "tensorboard" if self._writer is not None else None

    def log(self, row: Mapping[str, Any]) -> None:
        """Write one step's metrics (a flat mapping with a ``step`` entry)."""
        clean = {k: _json_value(v) for k, v in row.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        if self._writer is not None:
            step = int(clean.get("step", 0) or 0)
            for key, value in clean.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._writer.add_scalar(key, value, step)
        if self._trackers:
            step = int(clean.get("step", 0) or 0)
            numbers = {k: v for k, v in clean.items()
                       if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
            for tracker in self._trackers:
                tracker.log(numbers, step)

    def log_table(self, key: str, records: Sequence[Mapping[str, Any]], step: int) -> None:
        """Sampled episodes (``rollouts.jsonl`` records) to each tracker as its table type (``wandb.Table``,
        ``trackio.Table``) and to TensorBoard as text, under ``key`` at ``step``."""
        if not records:
            return
        rows = [[_table_cell(r.get(c)) for c in TABLE_COLUMNS] for r in records]
        for tracker in self._trackers:
            tracker.table(key, list(TABLE_COLUMNS), rows, step)
        if self._writer is not None:
            self._writer.add_text(key, _markdown_table(list(TABLE_COLUMNS), rows), step)

    @property
    def tracker_runs(self) -> dict[str, str]:
        """Each tracker's run id (wandb) or name (trackio), as kept in ``trackers.json``."""
        return {t.name: t.run_id for t in self._trackers}

    def close(self) -> None:
        """Close the JSONL file and the TensorBoard writer; finish the tracker runs."""
        if not self._file.closed:
            self._file.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.finish()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


TRACKERS: tuple[str, ...] = ("wandb", "trackio")
"""Experiment trackers :class:`MetricsLogger` can mirror rows to (the extras ``llmgym-rl[wandb]``, ``[trackio]``)."""

TRACKER_IDS = "trackers.json"
"""The run folder's record of its tracker runs (``{"wandb": id, "trackio": name}``): ``--resume`` continues them."""

TABLE_COLUMNS: tuple[str, ...] = ("step", "split", "group", "task_id", "prompt", "completion", "reward",
                                  "advantage", "staleness", "finish_reason", "info")
"""The columns of the sampled-episodes table a tracker gets (fields of a ``rollouts.jsonl`` record)."""


def _table_cell(value: Any) -> Any:
    """A table cell: numbers and strings as they are, anything else (chat messages, info) as JSON text."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    return json.dumps(value, ensure_ascii=False)


def _markdown_table(columns: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table for TensorBoard's text tab (cells escaped, one line each)."""
    def cell(v: Any) -> str:
        text = "" if v is None else str(v)
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ⏎ ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _read_tracker_ids(path: Path) -> dict[str, str]:
    try:
        data = json.loads(read_bytes_bounded(path, 2**16))
    except FileNotFoundError:
        return {}
    except (ValueError, RecursionError):  # not JSON: the run starts new tracker runs
        return {}
    return {k: v for k, v in data.items() if k in TRACKERS and isinstance(v, str)} if isinstance(data, dict) else {}


def _write_tracker_ids(path: Path, ids: Mapping[str, str]) -> None:
    write_text_atomic(path, json.dumps(dict(ids), indent=2) + "\n")


class _Tracker:
    """One tracker's run: ``log`` numbers, ``table`` rows, ``finish``; ``run_id`` continues it later."""

    def __init__(self, name: str, module: Any, run_id: str):
        self.name, self.module, self.run_id = name, module, run_id

    @classmethod
    def start(cls, name: str, run_name: str | None, run_config: Mapping[str, Any] | None, run_id: str | None,
              out_dir: Path) -> _Tracker:
        """Import tracker ``name`` and start its run (``run_id``: continue that one)."""
        import importlib
        import uuid

        try:
            module = importlib.import_module(name)
        except ImportError:
            from llmgym.runtime.install import install_hint

            raise ImportError(f"logging to {name} needs the {name} package: {install_hint(name)} "
                              f"(or pip install {name})") from None
        project = os.environ.get("LLMGYM_PROJECT", "llmgym")
        config = dict(run_config or {})
        if name == "wandb":
            options: dict[str, Any] = {} if os.environ.get("WANDB_DIR") else {"dir": str(out_dir)}
            run = module.init(project=project, name=run_name, config=config, id=run_id or uuid.uuid4().hex[:12],
                              resume="allow" if run_id else "never", **options)
            return cls(name, module, str(run.id))
        # trackio names its runs: a new run gets a name of its own, so it never continues another's
        name_ = run_id or f"{run_name or 'run'}-{uuid.uuid4().hex[:6]}"
        module.init(project=project, name=name_, config=config, resume="must" if run_id else "never")
        return cls(name, module, name_)

    def log(self, numbers: Mapping[str, float], step: int) -> None:
        self.module.log(dict(numbers), step=step)

    def table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        self.module.log({key: self.module.Table(columns=columns, data=rows)}, step=step)

    def finish(self) -> None:
        self.module.finish()


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The step rows of a metrics JSONL file (``None`` values read back as NaN); ``[]`` if it is missing. A line
    cut short by a run killed as it wrote it, or otherwise unreadable, is skipped; so are notes (records
    without a step: :func:`metrics_notes`)."""
    return step_rows(read_jsonl(path))


def metrics_notes(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The notes of a metrics JSONL file: records without a ``step``, such as the one a resumed run writes
    when the file had lost steps (``{"lost_steps": [...], "unreadable_lines": N, "resumed_from": S}``)."""
    return [r for r in read_jsonl(path) if "step" not in r]


def step_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The metrics rows among ``records`` (those with an integer ``step``), ``None`` values as NaN.

    Example:
        >>> from llmgym.runtime.logging import step_rows
        >>> step_rows([{"step": 1, "kl": None}, {"lost_steps": [2]}])
        [{'step': 1, 'kl': nan}]
    """
    return [_metrics_row(r) for r in records if isinstance(r.get("step"), int) and not isinstance(r["step"], bool)]


def _metrics_row(record: dict[str, Any]) -> dict[str, Any]:
    return {k: (math.nan if v is None else v) for k, v in record.items()}


def rewind_metrics(path: str | os.PathLike, last_step: int) -> tuple[list[dict[str, Any]], JsonlRead]:
    """:func:`truncate_metrics`, and what the rewind found (:class:`~llmgym.runtime.files.JsonlRead`: the steps
    up to ``last_step`` the file had lost, now named by a note in it, and the unreadable lines dropped)."""
    read = rewind(path, last_step, every_step=True)
    return step_rows(read.records), read


def truncate_metrics(path: str | os.PathLike, last_step: int) -> list[dict[str, Any]]:
    """Drop rows after ``last_step`` (steps logged after the checkpoint a run resumes from) and any line cut
    short, atomically (:func:`llmgym.runtime.files.rewind`), noting steps up to ``last_step`` the file lost;
    return the rows kept.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from llmgym.runtime.logging import MetricsLogger, truncate_metrics
        >>> with tempfile.TemporaryDirectory() as d:
        ...     with MetricsLogger(d, tensorboard=False) as log:
        ...         for s in (1, 2, 3):
        ...             log.log({"step": s})
        ...     [r["step"] for r in truncate_metrics(Path(d) / "metrics.jsonl", 2)]
        [1, 2]
    """
    return rewind_metrics(path, last_step)[0]


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` values (shorter at the start).

    Example:
        >>> from llmgym.runtime.logging import moving_average
        >>> moving_average([0, 1, 2, 3], 2)
        [0.0, 0.5, 1.5, 2.5]
    """
    window = max(1, int(window))
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += float(v)
        if i >= window:
            total -= float(values[i - window])
        out.append(total / min(i + 1, window))
    return out


def steps_to_threshold(steps: Sequence[int], rewards: Sequence[float], threshold: float, window: int = 5) -> int | None:
    """First step at which the ``window``-step moving average of the reward reaches ``threshold``.

    Example:
        >>> from llmgym.runtime.logging import steps_to_threshold
        >>> steps_to_threshold([1, 2, 3, 4], [0.2, 0.9, 0.9, 0.9], 0.8, window=2)
        3
        >>> steps_to_threshold([1, 2], [0.1, 0.2], 0.8) is None
        True
    """
    for step, value in zip(steps, moving_average(rewards, window)):
        if value >= threshold:
            return int(step)
    return None


def _save_png(plt, fig, path: Path, dpi: int) -> None:
    """``fig`` as a PNG at ``path``, written whole through a temporary file and a rename (never through a link
    that stands at ``path``; mode 0600)."""
    import io

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    write_bytes_atomic(path, buffer.getvalue())


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _series(rows: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [_float(r.get(key)) for r in rows]


def _has(values: Sequence[float]) -> bool:
    return any(math.isfinite(v) for v in values)


CURVE_PANELS: tuple[str, ...] = ("reward", "kl", "entropy", "length", "clip", "zero_var", "importance",
                                 "mismatch", "staleness", "speed", "time")
"""The panels :func:`plot_curves` draws, in order, each where the run logged its fields: reward (train and
held-out), KL to the reference, policy entropy, completion length (mean, max), clip fraction, the share of
groups with zero reward variance, importance weights, the sampler-vs-learner mismatch (overall and by
version lag) and staleness (off-policy runs), tokens/s and the time split of a step (generation,
verification, update)."""

_LAG_FIELD = re.compile(r"^(mismatch_kl|mismatch_prob_error)/lag(\d{1,4})$")


def mismatch_lags(rows: Sequence[Mapping[str, Any]]) -> list[int]:
    """The version lags whose ``mismatch_kl/lag{k}`` some row of ``rows`` logged, in order.

    Example:
        >>> from llmgym.runtime.logging import mismatch_lags
        >>> mismatch_lags([{"step": 1, "mismatch_kl/lag2": 0.1, "mismatch_kl/lag0": 0.01}, {"mismatch_kl/lagx": 1}])
        [0, 2]
    """
    lags = {int(m.group(2)) for r in rows for k in r if isinstance(k, str) and (m := _LAG_FIELD.match(k))
            and m.group(1) == "mismatch_kl"}
    return sorted(lags)


def curve_panels(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The panels of :data:`CURVE_PANELS` that ``rows`` have data for (reward always).

    Example:
        >>> from llmgym.runtime.logging import curve_panels
        >>> curve_panels([{"step": 1, "reward_mean": 0.5, "entropy": 2.0, "tokens_per_s": 90.0}])
        ['reward', 'entropy', 'speed']
    """
    fields = {"kl": ["kl"], "entropy": ["entropy"], "length": ["completion_len", "completion_len_max"],
              "clip": ["clip_frac"], "zero_var": ["zero_var_groups"],
              "importance": ["is_weight_mean", "is_weight_min", "is_weight_max"],
              "mismatch": ["mismatch_kl", "mismatch_prob_error"],
              "staleness": ["staleness_mean", "staleness_max"], "speed": ["tokens_per_s"],
              "time": ["generate_s", "verify_s", "update_s"]}
    return ["reward"] + [p for p in CURVE_PANELS[1:] if any(_has(_series(rows, k)) for k in fields[p])]


def plot_curves(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike, title: str = "",
                reward_range: tuple[float, float] | None = None) -> Path:
    """Save the curves that explain a run as one PNG: one panel per quantity the run logged (:func:`curve_panels`).

    Reward: the batch mean, a moving average, a spread band and held-out evaluations. The band is the
    batch's ± std, clipped to ``reward_range`` when the reward's bounds are known (a 0/1 reward with
    mean 0.8 has std 0.4, and mean + std would draw an impossible 1.2). Without known bounds the band
    is the standard error of the batch mean (std / √n, with n the step's sampled completions), which
    is what a reader of the mean's line needs, and the legend says so. Rows with ``eval_reward``
    (``--eval-every``) are drawn as points. Then, where logged: KL to the reference (a run without a
    KL term, ``kl_coef = 0``, says so in the entropy panel), policy entropy, completion length (mean
    and max), clip fraction, the share of groups whose rewards were all equal (no signal for a
    group-relative advantage), importance weights (mean, min, max), the sampler-vs-learner mismatch
    (``mismatch_kl`` and ``mismatch_prob_error − 1`` on a log scale, and ``mismatch_kl`` per version lag)
    and staleness (mean, max) of an off-policy run, sampling tokens/s, and each step's time split between generation, verification
    and the update.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from llmgym.runtime.logging import plot_curves
        >>> with tempfile.TemporaryDirectory() as d:
        ...     p = plot_curves([{"step": 1, "reward_mean": 0.1, "kl": 0.0}, {"step": 2, "reward_mean": 0.3, "kl": 0.1}],
        ...                     Path(d) / "curves.png")
        ...     p.stat().st_size > 0
        True
    """
    import numpy as np

    plt = _pyplot()
    path = Path(path)
    steps = [int(r["step"]) for r in rows]
    panels = curve_panels(rows)
    cols = 1 if len(panels) <= 2 else 3 if len(panels) > 4 else 2
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols if cols > 1 else 7, 3 * nrows + 0.4),
                             sharex=True, squeeze=False)
    flat = list(axes.flat)
    for ax in flat[len(panels):]:
        ax.set_visible(False)
    no_kl = not _has(_series(rows, "kl"))

    def line(ax, key, label, **kw):
        values = _series(rows, key)
        if _has(values):
            ax.plot(steps, values, label=label, **kw)

    for ax, panel in zip(flat, panels):
        ax.grid(alpha=0.3)
        if panel == "reward":
            reward = np.array(_series(rows, "reward_mean"))
            ax.plot(steps, reward, color="tab:blue", alpha=0.35, label="reward (batch mean)")
            low, high, band = reward_band(rows, reward_range)
            ax.fill_between(steps, low, high, color="tab:blue", alpha=0.12, label=band)
            ax.plot(steps, moving_average(list(reward), max(1, len(steps) // 20)), color="tab:blue",
                    label="moving average")
            evals = [(int(r["step"]), _float(r.get("eval_reward"))) for r in rows if r.get("eval_reward") is not None]
            evals = [(s, v) for s, v in evals if math.isfinite(v)]
            if evals:
                ax.plot(*zip(*evals), "o-", color="tab:green", markersize=4, label="held-out reward (greedy)")
            ax.set_ylabel("reward")
            ax.set_title(title or "reward", fontsize=9)
        elif panel == "kl":
            line(ax, "kl", "KL", color="tab:red")
            ax.set_ylabel("KL to reference")
        elif panel == "entropy":
            line(ax, "entropy", "entropy", color="tab:purple")
            ax.set_ylabel("policy entropy (nats/token)")
            if no_kl:
                ax.set_title("no KL to a reference (kl_coef = 0): policy entropy shown", fontsize=8)
        elif panel == "length":
            line(ax, "completion_len", "mean", color="tab:orange")
            line(ax, "completion_len_max", "max", color="tab:orange", linestyle="--")
            ax.set_ylabel("completion tokens")
        elif panel == "clip":
            line(ax, "clip_frac", "clip fraction", color="tab:brown")
            ax.set_ylabel("clip fraction")
        elif panel == "zero_var":
            line(ax, "zero_var_groups", "groups with equal rewards", color="tab:gray")
            ax.set_ylabel("zero-variance groups")
            ax.set_ylim(-0.05, 1.05)
        elif panel == "importance":
            line(ax, "is_weight_mean", "mean", color="tab:cyan")
            line(ax, "is_weight_min", "min", color="tab:cyan", linestyle=":")
            line(ax, "is_weight_max", "max", color="tab:cyan", linestyle="--")
            ax.set_ylabel("importance weight")
        elif panel == "mismatch":
            line(ax, "mismatch_kl", "KL(sampler ‖ learner), k3", color="tab:red")
            error = [v - 1.0 for v in _series(rows, "mismatch_prob_error")]
            if _has(error):
                ax.plot(steps, error, label="token prob. error − 1", color="tab:pink", linestyle="--")
            lags = mismatch_lags(rows)[:8]  # the lags of a run with max_staleness <= 7
            for i, lag in enumerate(lags):
                line(ax, f"mismatch_kl/lag{lag}", f"KL, lag {lag}", color=plt.cm.viridis(0.9 * i / max(1, len(lags) - 1)),
                     linestyle=":")
            drawn = [v for series in ax.get_lines() for v in series.get_ydata() if math.isfinite(v)]
            if drawn and min(drawn) > 0:
                ax.set_yscale("log")
            ax.set_ylabel("sampler–learner mismatch")
        elif panel == "staleness":
            line(ax, "staleness_mean", "mean", color="tab:olive")
            line(ax, "staleness_max", "max", color="tab:olive", linestyle="--")
            ax.set_ylabel("staleness (updates)")
        elif panel == "speed":
            line(ax, "tokens_per_s", "tokens/s", color="tab:green")
            ax.set_ylabel("sampled tokens/s")
        elif panel == "time":
            parts = [(k, label) for k, label in (("generate_s", "generation"), ("verify_s", "verification"),
                                                 ("update_s", "update")) if _has(_series(rows, k))]
            ax.stackplot(steps, *[np.nan_to_num(_series(rows, k)) for k, _ in parts], labels=[lb for _, lb in parts],
                         alpha=0.7)
            ax.set_ylabel("seconds per step")
        if panel == "reward" or len(ax.get_legend_handles_labels()[0]) > 1:
            ax.legend(loc="lower right" if panel == "reward" else "best", fontsize=7)
    for ax in flat[max(0, len(panels) - cols):len(panels)]:
        ax.set_xlabel("step")
        ax.xaxis.set_tick_params(labelbottom=True)
    fig.tight_layout()
    _save_png(plt, fig, path, dpi=90)
    return path


def reward_band(rows: Sequence[Mapping[str, Any]], reward_range: tuple[float, float] | None = None):
    """The band drawn around the reward curve: ``(low, high, label)`` arrays over ``rows``.

    Known bounds: mean ± std clipped to them. Unknown: mean ± std/√n, the standard error of the
    batch mean (n = completions sampled that step, from ``samples_total``; 1 when unknown).

    Example:
        >>> from llmgym.runtime.logging import reward_band
        >>> low, high, label = reward_band([{"reward_mean": 0.8, "reward_std": 0.4}], (0.0, 1.0))
        >>> float(low[0]), float(high[0]), label
        (0.4, 1.0, '± std, clipped to [0, 1]')
        >>> low, high, label = reward_band([{"reward_mean": 0.8, "reward_std": 0.4, "samples_total": 16}])
        >>> round(float(high[0]), 3), label
        (0.9, '± std/√n (s.e. of the batch mean)')
    """
    import numpy as np

    reward = np.array([_float(r.get("reward_mean")) for r in rows])
    std = np.nan_to_num(np.array([_float(r.get("reward_std"), 0.0) for r in rows]))
    if reward_range is not None:
        return (np.clip(reward - std, *reward_range), np.clip(reward + std, *reward_range),
                f"± std, clipped to [{reward_range[0]:g}, {reward_range[1]:g}]")
    totals = [_float(r.get("samples_total")) for r in rows]
    counts = np.diff([0.0] + totals) if all(math.isfinite(t) for t in totals) else np.ones(len(rows))
    sem = std / np.sqrt(np.maximum(counts, 1.0))
    return reward - sem, reward + sem, "± std/√n (s.e. of the batch mean)"


def _float(value: Any, default: float = math.nan) -> float:
    """A row value as a float (``None`` and missing become ``default``)."""
    if value is None:
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def plot_comparison(curves: Mapping[str, Sequence[Sequence[Mapping[str, Any]]]], path: str | os.PathLike,
                    title: str = "", threshold: float | None = None, window: int = 5,
                    x: str = "samples_total") -> Path:
    """One PNG with every agent's reward curve: the mean over seeds (smoothed) and its min–max band.

    Args:
        curves: agent name → one metrics row list per seed.
        path: the PNG to write.
        threshold: drawn as a dashed line when given.
        window: moving-average window of the plotted curves.
        x: the row field on the x-axis: ``"samples_total"`` (sampled completions, the default: agents
            that sample more per step are not flattered), ``"tokens_total"`` or ``"step"``. Steps are
            marked on a secondary axis when the agents share samples per step.
    """
    import numpy as np

    plt = _pyplot()
    path = Path(path)
    fig, ax = plt.subplots(figsize=(8, 5))
    per_step: set[float | None] = set()
    for name, runs in curves.items():
        runs = [r for r in runs if r]
        if not runs:
            continue
        length = min(len(r) for r in runs)
        # x of a point: the seeds' mean (DAPO's extra draws differ between seeds)
        xs = np.array([[_float(row.get(x, row["step"] if x == "step" else math.nan)) for row in r[:length]]
                       for r in runs]).mean(0)
        smoothed = np.array([moving_average([float(row["reward_mean"]) for row in r[:length]], window) for r in runs])
        (line,) = ax.plot(xs, smoothed.mean(0), label=f"{name} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
        if len(runs) > 1:
            ax.fill_between(xs, smoothed.min(0), smoothed.max(0), color=line.get_color(), alpha=0.15)
        per_step.add(round(float(xs[0]) / max(1, int(runs[0][0]["step"])), 6) if length else None)
    if threshold is not None:
        ax.axhline(threshold, color="gray", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
    labels = {"samples_total": "sampled completions", "tokens_total": "sampled completion tokens", "step": "step"}
    ax.set_xlabel(labels.get(x, x))
    if x == "samples_total" and len(per_step) == 1 and None not in per_step:
        ratio = per_step.pop()  # every agent samples the same per step: steps on a second axis
        secondary = ax.secondary_xaxis("top", functions=(lambda v: v / ratio, lambda v: v * ratio))
        secondary.set_xlabel(f"step ({ratio:g} completions per step)")
    ax.set_ylabel(f"reward (moving average, {window} steps)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    _save_png(plt, fig, path, dpi=100)
    return path
