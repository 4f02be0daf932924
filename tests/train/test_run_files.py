"""A run folder is data from whoever wrote it: its files are never followed through links (read or written),
written owner-only, read with bounds per line and per record, and a resume says what a damaged log lost.

Each test here stands for one rule (a class of attack), with the attacker's instances of it as cases.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import pytest

# only names that exist before these rules did, so each test fails there by behaviour, not by an import
from llmgym.runtime.files import read_jsonl
from llmgym.runtime.logging import MetricsLogger, plot_curves, read_metrics, truncate_metrics
from llmgym.train.report import ReportInputError, report_data, write_report
from llmgym.train.rollouts import RolloutLog

LINE_BOUND = 4 * 2**20  # llmgym.runtime.files.MAX_LINE_BYTES, as the docs state it


def _notes(path: Path) -> list[dict]:
    """The records of a metrics file that are not step rows."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip() and "step" not in json.loads(line)]

SECRET = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key-4417\n"


def _run(folder: Path, steps: int = 3) -> Path:
    """A minimal run folder: metrics rows and one rollout."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward_mean": 0.1 * s}) + "\n"
                                                  for s in range(1, steps + 1)))
    (folder / "rollouts.jsonl").write_text(json.dumps({"step": 1, "completion": "hi", "reward": 1.0}) + "\n")
    (folder / "config.json").write_text(json.dumps({"agent": "grpo", "env": "llmgym/Copy-v0"}))
    return folder


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "id_ed25519"
    path.write_text(SECRET)
    return path


# --- links: never followed, for reading or writing -------------------------------------------------------------

@pytest.mark.parametrize("name", ["curves.png", "metrics.jsonl", "rollouts.jsonl", "config.json"])
def test_the_report_refuses_a_run_file_that_is_a_link_and_embeds_nothing_of_its_target(tmp_path, secret, name):
    run = _run(tmp_path / "run")
    if (run / name).exists():
        shutil.copy(run / name, tmp_path / f"real-{name}")
        (run / name).unlink()
    os.symlink(secret, run / name)
    with pytest.raises(ReportInputError, match="symbolic link"):
        write_report(run)
    assert not (run / "report.html").exists()


def test_the_report_embeds_curves_png_only_when_it_is_a_png(tmp_path):
    run = _run(tmp_path / "run")
    (run / "curves.png").write_text(SECRET)  # a regular file, but not an image
    data = report_data(run)
    assert data["curves"].startswith("data:image/png;base64,")
    assert base64.b64decode(data["curves"].split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n")  # drawn again
    assert base64.b64encode(SECRET.encode()).decode()[:24] not in write_report(run).read_text()


@pytest.mark.parametrize("writer", ["metrics", "rollouts"])
def test_a_trainer_log_that_is_a_link_is_refused_and_its_target_untouched(tmp_path, secret, writer):
    run = tmp_path / "run"
    run.mkdir()
    name = "metrics.jsonl" if writer == "metrics" else "rollouts.jsonl"
    os.symlink(secret, run / name)
    with pytest.raises(OSError, match="symbolic link"):
        if writer == "metrics":
            MetricsLogger(run, append=True, tensorboard=False)
        else:
            RolloutLog(run, every=1, append=True)
    assert secret.read_text() == SECRET


def test_curves_png_replaces_a_link_standing_there_and_run_files_are_owner_only(tmp_path, secret):
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(secret, run / "curves.png")
    plot_curves([{"step": 1, "reward_mean": 0.5}], run / "curves.png")
    assert secret.read_text() == SECRET and not (run / "curves.png").is_symlink()
    with MetricsLogger(run, tensorboard=False) as log:
        log.log({"step": 1})
    with RolloutLog(run, every=1) as rollouts:
        rollouts.write([{"step": 1}])
    for name in ("curves.png", "metrics.jsonl", "rollouts.jsonl"):
        assert (run / name).stat().st_mode & 0o777 == 0o600, name


# --- reading: bounded per line and per record, every decode error caught per line -------------------------------

def test_every_unreadable_line_is_skipped_and_counted_never_raised(tmp_path):
    run = _run(tmp_path / "run")
    bad = ['{"step": 2, "completion": "\\ud800 lone", "reward": 0.5}',  # a lone surrogate: decodes, cannot encode
           "[" * 100_000,  # nesting past Python's recursion limit
           '{"step": 2, "n": ' + "7" * 5000 + "}",  # an int past Python's 4300-digit limit
           '{"step": 2, "deep": ' + "[" * 200 + "]" * 200 + "}",  # deeper than a record may be
           '{"step": 2, "x": "' + "a" * (LINE_BOUND + 10) + '"}',  # past the line bound
           "\xff\xfe not utf-8", '"a string, not an object"']
    with open(run / "rollouts.jsonl", "a", encoding="utf-8", errors="surrogateescape") as f:
        f.write("\n".join(bad) + "\n")
    assert [r.get("completion") for r in read_jsonl(run / "rollouts.jsonl")] == ["hi", "\ufffd lone"]
    data = report_data(run)
    assert data["summary"]["unreadable lines skipped"] == len(bad) - 1
    page = write_report(run).read_text(encoding="utf-8")
    assert "\ufffd lone" in page


def test_a_long_line_is_skipped_without_being_held_in_memory(tmp_path):
    import tracemalloc

    path = tmp_path / "rollouts.jsonl"
    with open(path, "w") as f:
        f.write('{"step": 1, "x": "')
        for _ in range(64):
            f.write("a" * 2**20)
        f.write('"}\n{"step": 2}\n')
    tracemalloc.start()
    try:
        records = read_jsonl(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [r["step"] for r in records] == [2]
    assert peak < 3 * LINE_BOUND  # not the 64 MiB line


def test_the_page_is_bounded_by_its_budget_not_by_its_input(tmp_path):
    run = _run(tmp_path / "run")
    huge = "x" * 10_000_000
    with open(run / "rollouts.jsonl", "w") as f:
        for i in range(3):
            f.write(json.dumps({"step": 1, "completion": huge[:3_000_000] + str(i), "reward": 0.0}) + "\n")
    page = write_report(run).read_text()
    assert len(page) < 200_000
    assert page.count(f"cut for the page: {3_000_001:,} characters in all") == 3
    data = report_data(run)
    assert len(data["records"][0]["completion"]) < 100_000


def test_the_template_is_filled_in_one_pass(tmp_path):
    run = _run(tmp_path / "run")
    (run / "rollouts.jsonl").write_text(json.dumps({"step": 1, "completion": "p" * 16_000, "reward": 0.0}) + "\n")
    (run / "config.json").write_text(json.dumps({"agent": "grpo", "env": "__DATA__ " * 1000 + "__SCRIPT__"}))
    page = write_report(run).read_text()
    assert len(page) < 200_000  # the payload is not substituted once per placeholder in a value
    assert page.count("p" * 16_000) == 1


# --- resume after a damaged metrics.jsonl: what was lost is said and recorded -----------------------------------

def _metrics(path: Path, steps: int) -> list[str]:
    lines = [json.dumps({"step": s, "reward_mean": 0.5}) for s in range(1, steps + 1)]
    path.write_text("\n".join(lines) + "\n")
    return lines


@pytest.mark.parametrize("damage, lost, unreadable", [
    ("last line cut", [60], 1),
    ("last 5 lines removed", [56, 57, 58, 59, 60], 0),
    ("line 12 corrupted", [12], 1),
])
def test_a_rewind_names_the_steps_a_damaged_log_lost_and_records_them(tmp_path, damage, lost, unreadable):
    path = tmp_path / "metrics.jsonl"
    lines = _metrics(path, 60)
    if damage == "last line cut":
        lines[-1] = lines[-1][:9]
    elif damage == "last 5 lines removed":
        lines = lines[:-5]
    else:
        lines[11] = lines[11][:5] + "\x00garbage"
    path.write_text("\n".join(lines) + "\n")
    kept = truncate_metrics(path, 60)
    assert [r["step"] for r in kept] == [s for s in range(1, 61) if s not in lost]
    assert _notes(path) == [{"lost_steps": lost, "unreadable_lines": unreadable, "resumed_from": 60}]
    assert [r["step"] for r in read_metrics(path)] == [s for s in range(1, 61) if s not in lost]
    # a second resume does not note the same gap again
    truncate_metrics(path, 60)
    assert len(_notes(path)) == 1


def test_a_resumed_run_says_what_its_metrics_lost(saved_tiny_model_dir, tmp_path):
    from llmgym import SequenceEnv, Task
    from llmgym.agents import GRPO
    from llmgym.runtime.models import load_model
    from llmgym.train import Trainer

    def objects():
        model, tok = load_model(saved_tiny_model_dir)
        agent = GRPO(model, tok, tasks_per_step=2, group_size=2, max_new_tokens=3, kl_coef=0.0, seed=1)
        return agent, SequenceEnv(lambda rng: Task("a:", answer="b"), lambda t, c: float("b" in c), tok)

    agent, env = objects()
    Trainer(agent, env, tmp_path, checkpoint_every=3, rollouts_every=0, progress=False).run(3)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "metrics.jsonl").write_text(lines[0] + "\n" + lines[2][:20] + "\n")  # step 2 gone, step 3 cut
    agent, env = objects()
    trainer = Trainer.resume(tmp_path, agent, env, checkpoint_every=3, rollouts_every=0, progress=False)
    assert trainer.resume_notes == ["metrics.jsonl: steps 2–3 lost (cut, corrupt or removed lines; 1 unreadable "
                                    "line dropped); the run resumes from step 3"]
    result = trainer.run(4)
    assert [r["step"] for r in result.rows] == [1, 4]
    assert _notes(tmp_path / "metrics.jsonl")[0]["lost_steps"] == [2, 3]
    assert report_data(tmp_path)["summary"]["steps lost (cut or corrupt lines, noted at resume)"] == "2–3"


# --- a damaged model.safetensors: one line, as for agent.pt -----------------------------------------------------

def test_a_damaged_checkpoint_weights_file_is_one_checkpoint_error(saved_tiny_model_dir, tmp_path):
    from llmgym.agents import GRPO
    from llmgym.runtime.models import ModelFileError, load_model
    from llmgym.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

    model, tok = load_model(saved_tiny_model_dir)
    agent = GRPO(model, tok, tasks_per_step=2, group_size=2, max_new_tokens=3, kl_coef=0.0)
    folder = save_checkpoint(agent, tok, tmp_path / "last")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(agent, folder)
    assert str(weights) in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ModelFileError, match="damaged"):
        load_model(folder)


def test_a_page_holds_a_bounded_number_of_metrics_records_whatever_the_files_length(tmp_path, monkeypatch):
    """Found by the second attacker's pass: every line had a bound, but not their number -- a 38 MB metrics.jsonl
    of small records (a million steps) took `llmgym report` to 721 MB (0.05 GB for a real run). Rule: the page
    holds at most twice MAX_METRIC_ROWS records, thinned evenly over the whole file, its first and last kept."""
    from llmgym.runtime import files
    from llmgym.train import report

    run = _run(tmp_path / "run")
    with (run / "metrics.jsonl").open("a") as f:
        f.writelines(json.dumps({"step": step, "reward_mean": 0.5}) + "\n" for step in range(4, 2001))
    monkeypatch.setattr(report, "MAX_METRIC_ROWS", 50, raising=False)
    held = []
    scan = files.scan_jsonl

    def counted(*args, **kwargs):
        read = scan(*args, **kwargs)
        held.append(len(read.records))
        return read

    monkeypatch.setattr(report, "scan_jsonl", counted)
    data = report_data(run)
    assert held[0] <= 2 * 50 + 1 and data["summary"]["steps"] == 2000  # the last step is the file's
    steps = [r["step"] for r in files.scan_jsonl(run / "metrics.jsonl", thin=50).records]
    assert steps[0] == 1 and steps[-1] == 2000 and len(set(b - a for a, b in zip(steps, steps[1:-1]))) == 1


def test_a_checkpoint_step_far_past_the_log_is_refused_before_it_sizes_any_work(tmp_path):
    """Found by the second attacker's pass: a checkpoint's step is data too -- an agent.pt saying step 10^11 made
    `train --resume` list every lost step (15 GB in a minute, then killed). Rule: a log missing more than
    MAX_LOST_STEPS of the steps its checkpoint claims is refused in one line, before anything is listed."""
    from llmgym.runtime import files

    run = _run(tmp_path / "run")
    with pytest.raises(OSError, match="holds 3 of the 5000000 steps"):
        files.rewind(run / "metrics.jsonl", 5_000_000, every_step=True)
    assert len(files.rewind(run / "metrics.jsonl", 10, every_step=True).lost_steps) == 7  # a real gap is still named
