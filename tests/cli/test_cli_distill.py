"""``llmgym train --agent distill --teacher MODEL``: trains, records the teacher, resumes exactly (HF and vLLM
engines), and refuses a missing teacher, a teacher for another agent and a teacher with another vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import vllm_missing_reason
from llmgym.cli import main
from llmgym.runtime.logging import TIMING_FIELDS, read_metrics

ENV = "llmgym/Copy-v0"
SMALL = ["--set", "tasks_per_step=2", "--set", "group_size=2", "--set", "max_new_tokens=4"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[str, str]:
    """A student and a teacher (other weights, same tokenizer), saved with save_pretrained. Head size 32, so
    vLLM's CPU attention can run the student too."""
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer, save_pretrained

    tok = build_tokenizer()
    shape = dict(hidden_size=64, num_layers=1, num_heads=2, intermediate_size=64)
    root = tmp_path_factory.mktemp("distill-models")
    student = save_pretrained(build_tiny_model(tok, TinyModelConfig(**shape)), tok, root / "student")
    teacher = save_pretrained(build_tiny_model(tok, TinyModelConfig(**shape, seed=5)), tok, root / "teacher")
    return str(student), str(teacher)


def _args(models, out: Path, steps: int, *extra: str) -> list[str]:
    student, teacher = models
    return ["train", "--env", ENV, "--agent", "distill", "--model", student, "--teacher", teacher, "--steps", str(steps),
            "--out", str(out), *SMALL, "--seed", "2", "--checkpoint-every", "1", *extra]


def _without_timing(rows):
    return [{k: v for k, v in row.items() if k not in TIMING_FIELDS} for row in rows]


def _straight_and_resumed(models, tmp_path, *extra):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(_args(models, straight, 3, *extra)) == 0
    assert main(_args(models, resumed, 1, *extra)) == 0
    assert main(["train", "--resume", str(resumed), "--steps", "3"]) == 0
    a, b = read_metrics(straight / "metrics.jsonl"), read_metrics(resumed / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3]
    assert _without_timing(a) == _without_timing(b)
    return a, json.loads((straight / "config.json").read_text())


def test_distill_trains_records_its_teacher_and_resumes_exactly(models, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows, config = _straight_and_resumed(models, tmp_path, "--distill-coef", "0.8")
    assert config["agent"] == "distill" and config["agent_config"]["distill_coef"] == 0.8
    assert config["agent_config"]["teacher"] == str(Path(models[1]).resolve())
    assert all(r["reverse_kl"] == r["reverse_kl"] and r["teacher_logprob"] < 0 for r in rows)


@pytest.mark.skipif(vllm_missing_reason() is not None, reason=vllm_missing_reason() or "")
def test_distill_with_vllm_rollouts_resumes_exactly(models, tmp_path):
    rows, config = _straight_and_resumed(models, tmp_path, "--engine", "vllm", "--engine-arg",
                                         "kv_cache_memory_bytes=67108864")
    assert config["engine"] == "vllm" and all(r["reverse_kl"] == r["reverse_kl"] for r in rows)


def test_distill_flags_are_checked_before_any_work(models, tmp_path, capsys):
    student, teacher = models
    base = ["train", "--env", ENV, "--model", student, "--steps", "1", "--out", str(tmp_path / "x")]
    assert main([*base, "--agent", "distill"]) == 2
    assert "--agent distill needs --teacher MODEL" in capsys.readouterr().err
    assert main([*base, "--agent", "grpo", "--teacher", teacher]) == 2
    assert "--teacher is an option of --agent distill" in capsys.readouterr().err
    assert main([*base, "--agent", "distill", "--teacher", str(tmp_path / "none")]) == 2
    assert "--teacher: no model at" in capsys.readouterr().err
    assert main([*base, "--agent", "distill", "--teacher", teacher, "--distill-coef", "2"]) == 2
    assert "distill_coef must be in [0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "x" / "metrics.jsonl").exists()


def test_a_teacher_with_another_tokenizer_is_refused_in_one_line(models, tmp_path, capsys):
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer, save_pretrained

    tok = build_tokenizer()
    tok.add_tokens(["<tool>"])
    other = save_pretrained(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2,
                                                                  intermediate_size=64)), tok, tmp_path / "other")
    assert main(["train", "--env", ENV, "--agent", "distill", "--model", models[0], "--teacher", str(other),
                 "--steps", "1", "--out", str(tmp_path / "run"), *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert "the teacher's tokenizer differs from the student's" in err and len(err.splitlines()) == 1, err


def test_resume_refuses_a_new_teacher(models, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_args(models, out, 1)) == 0
    assert main(["train", "--resume", str(out), "--teacher", models[1]]) == 2
    assert "drop --teacher" in capsys.readouterr().err


def test_the_student_as_its_own_teacher_is_refused_in_one_line(models, tmp_path, capsys):
    """``--teacher`` naming the student's own model: every reward would be 0 and nothing would train."""
    student, _ = models
    assert main(["train", "--env", ENV, "--agent", "distill", "--model", student, "--teacher", student,
                 "--steps", "1", "--out", str(tmp_path / "run"), *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert "the teacher has the student's weights" in err and "nothing would train" in err, err
    assert len(err.splitlines()) == 1, err


def test_a_teacher_whose_scores_cannot_be_log_probs_stops_the_run_in_one_line(models, tmp_path, capsys):
    """A broken teacher (NaN weights: NaN scores) is named on one line, exit 2, before a step trains on it."""
    import torch

    from llmgym.runtime.models import load_model, save_pretrained

    teacher, tok = load_model(models[1])
    with torch.no_grad():
        teacher.model.norm.weight.fill_(float("nan"))
    broken = save_pretrained(teacher, tok, tmp_path / "broken")
    assert main(["train", "--env", ENV, "--agent", "distill", "--model", models[0], "--teacher", str(broken),
                 "--steps", "1", "--out", str(tmp_path / "run"), *SMALL]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("llmgym: error: the teacher's scores cannot be log-probs of one model") and "nan" in err, err
