"""The trackers as their users expect them, against the real packages: wandb (offline), trackio (local, no
account) and TensorBoard. Every row goes to each; the sampled episodes go as the tracker's own table type
(TensorBoard: text); a resumed run continues the same tracker run (its id kept in ``trackers.json``),
and a new run starts a new one. Every tracker file stays under the test's folder."""

from __future__ import annotations

import json
import re

import pytest

from llmgym.runtime.logging import TABLE_COLUMNS, TRACKER_IDS, MetricsLogger

RECORD = {"step": 1, "split": "train", "group": 0, "task_id": "t-1", "prompt": [{"role": "user", "content": "2+2?"}],
          "completion": "four | <b>4</b>", "reward": 1.0, "advantage": 0.5, "staleness": 0, "finish_reason": "stop",
          "info": {"score": {"exact": True}}}


@pytest.fixture
def project(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMGYM_PROJECT", f"llmgym-test-{tmp_path.name}")
    return f"llmgym-test-{tmp_path.name}"


def test_wandb_gets_rows_and_a_table_and_a_resumed_run_continues_the_same_wandb_run(tmp_path, monkeypatch, project):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)  # the run folder then holds wandb's files
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    out = tmp_path / "run"
    with MetricsLogger(out, tensorboard=False, trackers=["wandb"], run_name="grpo-copy", run_config={"lr": 0.1}) as log:
        log.log({"step": 1, "reward_mean": 0.5})
        log.log_table("rollouts", [RECORD], 1)
        first = log.tracker_runs["wandb"]
        assert wandb.run.project == project and wandb.run.config["lr"] == 0.1
    assert json.loads((out / TRACKER_IDS).read_text()) == {"wandb": first}
    with MetricsLogger(out, append=True, tensorboard=False, trackers=["wandb"], run_name="grpo-copy") as log:
        assert log.tracker_runs["wandb"] == first and wandb.run.id == first
        log.log({"step": 2, "reward_mean": 0.75})
    runs = sorted((out / "wandb").glob("offline-run-*"))
    # one wandb run, continued: offline-run-<time>-<id>, with "-1" added where both started in the same second
    assert len(runs) == 2 and all(re.fullmatch(rf"offline-run-\d+_\d+-{first}(-\d+)?", r.name) for r in runs), runs
    (table,) = (runs[0] / "files" / "media" / "table").glob("rollouts_1_*.table.json")
    data = json.loads(table.read_text())
    assert data["columns"] == list(TABLE_COLUMNS)
    row = dict(zip(data["columns"], data["data"][0]))
    assert row["completion"] == RECORD["completion"] and row["reward"] == 1.0
    assert json.loads(row["prompt"]) == RECORD["prompt"]  # chat messages as JSON text
    with MetricsLogger(tmp_path / "other", tensorboard=False, trackers=["wandb"]) as log:  # a new run: a new one
        assert log.tracker_runs["wandb"] != first


def test_trackio_gets_rows_and_a_table_and_a_resumed_run_continues_the_same_trackio_run(tmp_path, monkeypatch,
                                                                                         project):
    trackio = pytest.importorskip("trackio")
    import trackio.run
    import trackio.sqlite_storage
    import trackio.table
    import trackio.utils

    home = tmp_path / "trackio"
    for module in (trackio, trackio.utils, trackio.sqlite_storage):
        monkeypatch.setattr(module, "TRACKIO_DIR", home)
    for module in (trackio.utils, trackio.run, trackio.table):
        monkeypatch.setattr(module, "MEDIA_DIR", home / "media")
    out = tmp_path / "run"
    with MetricsLogger(out, tensorboard=False, trackers=["trackio"], run_name="grpo-copy") as log:
        log.log({"step": 1, "reward_mean": 0.5})
        log.log_table("rollouts", [RECORD], 1)
        name = log.tracker_runs["trackio"]
    assert name.startswith("grpo-copy-") and json.loads((out / TRACKER_IDS).read_text()) == {"trackio": name}
    with MetricsLogger(out, append=True, tensorboard=False, trackers=["trackio"], run_name="grpo-copy") as log:
        log.log({"step": 2, "reward_mean": 0.75})
    storage = trackio.sqlite_storage.SQLiteStorage
    assert storage.get_runs(project) == [name]  # continued, not a second run
    logs = storage.get_logs(project, name)
    assert [(e["step"], e.get("reward_mean")) for e in logs if "reward_mean" in e] == [(1, 0.5), (2, 0.75)]
    (table,) = [e["rollouts"] for e in logs if "rollouts" in e]
    assert table["_type"] == "trackio.table"  # trackio's own table type, as its dashboard shows it
    assert table["_value"][0]["completion"] == RECORD["completion"] and table["_value"][0]["reward"] == 1.0
    assert home.is_dir() and (home / f"{project}.db").is_file()


def test_tensorboard_gets_the_sampled_episodes_as_text(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, trackers=()) as log:
        assert log.tensorboard_dir == tmp_path / "tensorboard"
        log.log({"step": 1, "reward_mean": 0.5})
        log.log_table("rollouts", [RECORD], 1)
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    (text,) = events.Tensors("rollouts/text_summary")
    markdown = text.tensor_proto.string_val[0].decode()
    assert markdown.splitlines()[0] == "| " + " | ".join(TABLE_COLUMNS) + " |"
    assert "four \\| <b>4</b>" in markdown  # a "|" in model text cannot break the table's columns
    assert [e.value for e in events.Scalars("reward_mean")] == [0.5]
