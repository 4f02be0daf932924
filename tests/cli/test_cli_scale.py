"""The command line's device, precision and memory flags (``--device``, ``--dtype``, ``--lora-r``, ...),
the pipelined learner's (``--async``, ``--max-staleness``, ``--verify-workers``) and ``llmgym rm`` (a
Bradley–Terry reward model from a pairs file).

Each flag must reach the agent's config (and the agent built from it), be recorded in ``config.json``
so ``--resume`` continues with it, and a bad value must be one line on stderr with exit code 2. A LoRA
run's checkpoint must resume exactly and load as ``--model``. Runs use a 1-layer model: seconds each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import llmgym.cli.train as train_module
from llmgym.cli import main
from llmgym.runtime.logging import TIMING_FIELDS, read_metrics

ENV = "llmgym/Copy-v0"
SMALL = ["--set", "tasks_per_step=2", "--set", "group_size=2", "--set", "max_new_tokens=4"]


@pytest.fixture(scope="module", autouse=True)
def isolated_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMGYM_CACHE", str(tmp_path_factory.mktemp("llmgym-cache")))
        mp.setenv("COLUMNS", "160")
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer, save_pretrained

    tok = build_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
    return str(save_pretrained(model, tok, tmp_path_factory.mktemp("model") / "tiny-1layer"))


def train_args(model_dir: str, out: Path, steps: int, *extra: str) -> list[str]:
    return ["train", "--env", ENV, "--agent", "grpo", "--model", model_dir, "--steps", str(steps),
            "--out", str(out), *SMALL, "--seed", "3", *extra]


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING_FIELDS} for row in rows]


@pytest.fixture
def captured_agents(monkeypatch) -> list:
    """The agents ``llmgym train`` builds (``train_run`` wrapped, not replaced)."""
    agents = []
    original = train_module.train_run

    def recording(*args, **kwargs):
        result = original(*args, **kwargs)
        agents.append(result.agent)
        return result

    monkeypatch.setattr(train_module, "train_run", recording)
    return agents


def test_every_flag_reaches_config_json_and_the_agent(model_dir, tmp_path, captured_agents):
    out = tmp_path / "run"
    assert main(train_args(model_dir, out, 2, "--device", "cpu", "--dtype", "bf16-mixed", "--lora-r", "4",
                           "--lora-alpha", "16", "--gradient-checkpointing", "--micro-batch-size", "2",
                           "--engine-decode", "static", "--lr-schedule", "cosine", "--lr-warmup-steps", "1",
                           "--checkpoint-every", "0")) == 0
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["device"] == "cpu"
    expected = {"precision": "bf16-mixed", "lora_r": 4, "lora_alpha": 16.0, "gradient_checkpointing": True,
                "micro_batch_size": 2, "engine_decode": "static", "lr_schedule": "cosine", "lr_warmup_steps": 1,
                "lr_total_steps": 2}  # lr_total_steps from --steps
    assert {k: recorded["agent_config"][k] for k in expected} == expected
    agent = captured_agents[-1]
    assert {k: getattr(agent.config, k) for k in expected} == expected
    assert agent.learner.peft_model is not None and agent.learner.peft_model.peft_config["default"].r == 4
    assert getattr(agent.model, "is_activation_checkpointing", None) or agent.model.is_gradient_checkpointing
    assert agent.engine.decode == "static"
    assert type(agent.learner.scheduler).__name__ == "LambdaLR" and agent.optimizer.param_groups[0]["lr"] == 0.0
    assert next(agent.model.parameters()).device.type == "cpu"


def test_flags_win_over_config_and_set_and_auto_resolves_on_this_machine(model_dir, tmp_path, captured_agents):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"lora_r": 2, "micro_batch_size": 1, "precision": "bf16"}))
    out = tmp_path / "run"
    assert main(train_args(model_dir, out, 1, "--config", str(config), "--set", "lora_r=3", "--lora-r", "0",
                           "--micro-batch-size", "4", "--dtype", "auto", "--engine-decode", "auto",
                           "--checkpoint-every", "0")) == 0
    agent_config = json.loads((out / "config.json").read_text())["agent_config"]
    gpu = torch.cuda.is_available()
    assert agent_config["lora_r"] == 0 and agent_config["micro_batch_size"] == 4
    assert agent_config["precision"] == ("bf16-mixed" if gpu and torch.cuda.is_bf16_supported() else "fp32")
    from llmgym.engines.gpu_record import default_gpu_decode

    assert agent_config["engine_decode"] == (default_gpu_decode() if gpu else "static")
    assert captured_agents[-1].learner.peft_model is None
    # without the flags, --config / --set stand (on CPU: no automatic precision or decoding)
    out2 = tmp_path / "run2"
    assert main(train_args(model_dir, out2, 1, "--config", str(config), "--checkpoint-every", "0")) == 0
    if not gpu:
        assert json.loads((out2 / "config.json").read_text())["agent_config"]["precision"] == "bf16"


def test_lora_run_resumes_exactly_and_its_checkpoint_benches_as_a_model(model_dir, tmp_path, captured_agents, capsys):
    lora = ("--lora-r", "4", "--set", "lr=0.01", "--set", "entropy_coef=0.1")  # a gradient even at reward 0
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(train_args(model_dir, straight, 3, *lora, "--checkpoint-every", "1")) == 0
    straight_agent = captured_agents[-1]
    assert main(train_args(model_dir, split, 2, *lora, "--checkpoint-every", "1")) == 0
    assert main(["train", "--resume", str(split), "--steps", "3"]) == 0
    resumed_agent = captured_agents[-1]
    assert resumed_agent.learner.peft_model is not None  # the recorded lora_r, not a full fine-tune
    assert without_timing(read_metrics(split / "metrics.jsonl")) == without_timing(read_metrics(straight / "metrics.jsonl"))
    adapters = {k: v for k, v in straight_agent.model.state_dict().items() if "lora_" in k}
    assert adapters and any(v.abs().sum() > 0 for k, v in adapters.items() if "lora_B" in k)  # trained
    resumed = resumed_agent.model.state_dict()
    assert all(torch.equal(v, resumed[k]) for k, v in adapters.items())

    last = split / "checkpoints" / "last"
    assert (last / "adapter" / "adapter_config.json").is_file()  # peft's format, for PeftModel.from_pretrained
    # the checkpoint's model.safetensors is the merged model: the same function as base + adapters
    from llmgym.runtime.models import load_model

    merged, tok = load_model(last)
    assert not any("lora" in k for k in merged.state_dict())
    ids = torch.tensor([tok.encode("copy: 1234")])
    with torch.no_grad():
        expected = resumed_agent.model(ids).logits
        torch.testing.assert_close(merged(ids).logits, expected, rtol=1e-4, atol=1e-5)
        base, _ = load_model(model_dir)
        assert not torch.allclose(base(ids).logits, expected, atol=1e-4)  # and not the untrained base
    bench_out = tmp_path / "bench.json"
    assert main(["bench", "--env", ENV, "--model", str(last), "--samples", "1", "--tasks", "2",
                 "--max-new-tokens", "2", "--device", "cpu", "--out", str(bench_out)]) == 0
    report = json.loads(bench_out.read_text())
    assert report["tasks"] == 2 and report["device"] == "cpu"
    assert "Traceback" not in capsys.readouterr().err


def test_resume_keeps_the_recorded_flags_and_refuses_new_ones(model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(train_args(model_dir, out, 1, "--micro-batch-size", "2", "--checkpoint-every", "1")) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--steps", "2", "--micro-batch-size", "1"]) == 2
    err = capsys.readouterr().err
    assert "drop --micro-batch-size" in err and err.count("\n") == 1
    assert main(["train", "--resume", str(out), "--steps", "2", "--device", "cpu"]) == 0  # where may change
    assert json.loads((out / "config.json").read_text())["agent_config"]["micro_batch_size"] == 2


@pytest.mark.parametrize("flags, expected", [
    (["--device", "tpu"], "--device 'tpu': give auto, cpu, cuda or cuda:N"),
    (["--dtype", "fp16"], "--dtype 'fp16': give one of auto, fp32, bf16-mixed, bf16"),
    (["--engine-decode", "fast"], "--engine-decode 'fast': give one of auto, eager, static, compiled"),
    (["--lr-schedule", "step"], "--lr-schedule 'step': give one of constant, linear, cosine"),
    (["--lora-r", "-1"], "--lora-r must be >= 0 (0 = off), got -1"),
    (["--lora-r", "4", "--lora-alpha", "0"], "--lora-alpha must be > 0, got 0"),
    (["--micro-batch-size", "0"], "--micro-batch-size must be >= 1, got 0"),
    (["--lr-warmup-steps", "-2"], "--lr-warmup-steps must be >= 0, got -2"),
    (["--set", "gradient_checkpointing=yes"], "--set gradient_checkpointing: grpo expects bool"),
])
@pytest.mark.parametrize("command", ["train", "compare"])
def test_bad_flag_values_print_one_line_and_exit_2(command, flags, expected, tmp_path, capsys):
    if command == "train":
        argv = ["train", "--env", ENV, "--agent", "grpo", "--out", str(tmp_path / "o"), *flags]
    else:
        argv = ["compare", "--agents", "grpo", "--env", ENV, "--out", str(tmp_path / "o"), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmgym: error: ") and expected in err, err
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()


def test_async_run_records_its_staleness_and_resumes_exactly(model_dir, tmp_path, captured_agents):
    """--async --max-staleness 1: recorded in config.json; a checkpoint (every 2 steps: where the
    pipeline drains) resumes to the uninterrupted run's metrics; rows carry the staleness."""
    flags = ("--async", "--max-staleness", "1", "--verify-workers", "2", "--checkpoint-every", "2")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(train_args(model_dir, straight, 4, *flags)) == 0
    recorded = json.loads((straight / "config.json").read_text())
    assert (recorded["max_staleness"], recorded["verify_workers"]) == (1, 2)
    assert main(train_args(model_dir, resumed, 2, *flags)) == 0
    assert main(["train", "--resume", str(resumed), "--steps", "4"]) == 0
    rows = read_metrics(straight / "metrics.jsonl")
    assert without_timing(read_metrics(resumed / "metrics.jsonl")) == without_timing(rows)
    assert [r["behaviour_version"] for r in rows] == [0, 0, 2, 2] and [r["staleness_max"] for r in rows] == [0, 1, 0, 1]


@pytest.mark.parametrize("flags, expected", [
    (["--max-staleness", "1"], "--max-staleness needs --async (options of the pipelined learner)"),
    (["--verify-workers", "4", "--max-staleness", "2"], "--max-staleness and --verify-workers need --async"),
    (["--async", "--max-staleness", "-1"], "--max-staleness must be >= 0 (0 = the synchronous schedule), got -1"),
    (["--async", "--verify-workers", "0"], "--verify-workers must be >= 1, got 0"),
    (["--async", "--agent", "dpo"], "--async: dpo cannot learn from stale samples"),
])
def test_async_flags_are_checked_before_any_work(flags, expected, tmp_path, capsys):
    assert main(["train", "--env", ENV, "--agent", "grpo", "--out", str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmgym: error: ") and expected in err, err
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()


@pytest.mark.parametrize("flags, expected", [
    (["--correction", "seq-tis"], "--correction 'seq-tis': give one of tis-token, tis-seq, mis, geo, icepop"),
    (["--correction-bounds", "2"], "--correction-bounds is the band of a correction: add --correction NAME"),
    (["--correction", "icepop", "--correction-bounds", "0.5,x"], "--correction-bounds '0.5,x': give HIGH or LOW,HIGH"),
    (["--correction", "icepop", "--correction-bounds", "nan"], "--correction-bounds 'nan': give HIGH or LOW,HIGH"),
    (["--correction", "geo", "--correction-bounds", "1.1,0.9"], "its band must satisfy 0 <= low <= high"),
    (["--correction", "tis-seq", "--correction-bounds", "0.5,2"], "tis-seq truncates from above only"),
    (["--correction", "mis", "--agent", "dpo"], "a correction does not apply"),
])
def test_correction_flags_are_checked_before_any_work(flags, expected, tmp_path, capsys):
    argv = ["train", "--env", ENV, "--agent", "grpo", "--out", str(tmp_path / "o"), *flags]
    if "--agent" in flags:
        argv = [a for i, a in enumerate(argv) if i not in (3, 4)]  # the flags' own --agent
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmgym: error: ") and expected in err, err
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()


def test_correction_reaches_the_agent_is_recorded_and_logs_its_shares(model_dir, tmp_path, captured_agents, capsys):
    out = tmp_path / "run"
    assert main(train_args(model_dir, out, 2, "--correction", "icepop", "--correction-bounds", "0.8,1.25",
                           "--checkpoint-every", "1")) == 0
    config = captured_agents[-1].config
    assert (config.correction, config.correction_low, config.correction_high) == ("icepop", 0.8, 1.25)
    recorded = json.loads((out / "config.json").read_text())
    recorded = recorded["agent_config"]
    assert (recorded["correction"], recorded["correction_low"], recorded["correction_high"]) == ("icepop", 0.8, 1.25)
    rows = read_metrics(out / "metrics.jsonl")
    for row in rows:  # the HF engine samples what the learner scores: nothing masked, every weight 1
        assert row["correction_masked_share"] == 0.0 and row["correction_rows_masked_share"] == 0.0
        assert abs(row["correction_weight_mean"] - 1.0) < 1e-3 and row["correction_truncated_share"] == 0.0
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--steps", "3", "--correction", "mis"]) == 2
    assert "drop --correction" in capsys.readouterr().err


def test_resume_refuses_async_flags(model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(train_args(model_dir, out, 1, "--checkpoint-every", "1")) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--steps", "2", "--async"]) == 2
    assert "drop --async" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
@pytest.mark.parametrize("command", ["train", "bench", "quickstart"])
def test_device_cuda_without_a_gpu_is_one_line(command, tmp_path, capsys):
    argv = {"train": ["train", "--env", ENV, "--agent", "grpo", "--out", str(tmp_path / "o")],
            "bench": ["bench", "--env", ENV],
            "quickstart": ["quickstart", "--quick", "--out", str(tmp_path / "o")]}[command]
    assert main([*argv, "--device", "cuda:0"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda:0: no CUDA GPU is visible here" in err and err.count("\n") == 1


# -- llmgym rm ------------------------------------------------------------------------------------


def write_pairs(path: Path, n: int, seed: int = 0) -> Path:
    """Pairs whose hidden preference is digits over letters (a reward model learns it in a few steps)."""
    import random

    rng = random.Random(seed)
    rows = [{"prompt": "say:", "chosen": "".join(rng.choice("0123456789") for _ in range(4)),
             "rejected": "".join(rng.choice("abcdefgh") for _ in range(4))} for _ in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rm_trains_a_reward_model_that_the_verifier_loads(tmp_path, capsys):
    from llmgym import Task
    from llmgym.rlhf.reward_models import RewardModelVerifier

    pairs = write_pairs(tmp_path / "pairs.jsonl", 24)
    held_out = write_pairs(tmp_path / "eval.jsonl", 8, seed=1)
    out = tmp_path / "rm"
    assert main(["rm", "--pairs", str(pairs), "--eval-pairs", str(held_out), "--out", str(out), "--steps", "20",
                 "--batch-size", "8", "--lr", "1e-2", "--eval-every", "10"]) == 0
    printed = capsys.readouterr().out
    assert "held-out pairs (8; trained on 24)" in printed and "accuracy" in printed
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert [r["step"] for r in rows if r.get("eval_accuracy") is not None] == [10, 20]
    final = json.loads((out / "eval.json").read_text())
    assert final["pairs"] == 8 and final["accuracy"] >= 0.875  # digits over letters: learnt
    verifier = RewardModelVerifier(str(out))
    digits, letters = verifier.verify_batch([Task("say:")] * 2, ["2718", "abcd"])
    assert digits.reward > letters.reward
    # again into the same --out: refused without --overwrite, then the held-out split of --pairs
    assert main(["rm", "--pairs", str(pairs), "--out", str(out), "--steps", "2"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["rm", "--pairs", str(pairs), "--out", str(out), "--steps", "2", "--held-out", "0.25",
                 "--overwrite"]) == 0
    assert "held-out pairs (6; trained on 18)" in capsys.readouterr().out


@pytest.mark.parametrize("content, flags, expected", [
    (None, [], "--pairs: no preference file at"),
    ('{"prompt": "q", "chosen": "a"}\n', [], "lacks ['rejected']"),
    ("not json\n", [], ":1: not valid JSON"),
    ("", [], "no preference pairs in"),
    ('{"prompt": "q", "chosen": "a", "rejected": "b"}\n', [], "need at least 2 to hold some out"),
    ('{"prompt": "q", "chosen": "a", "rejected": "b"}\n' * 4, ["--held-out", "1"], "--held-out must be in (0, 1)"),
    ('{"prompt": "q", "chosen": "a", "rejected": "b"}\n' * 4, ["--steps", "0"], "--steps must be >= 1"),
    ('{"prompt": "q", "chosen": "a", "rejected": "b"}\n' * 4, ["--center-rewards-coefficient", "-1"],
     "--center-rewards-coefficient must be >= 0"),
    ('{"prompt": "q", "chosen": "a", "rejected": "b", "margin": "big"}\n', [], "margin must be a finite number"),
    ('{"prompt": "q", "chosen": "a", "rejected": "b"}\n' * 4, ["--model", "/no/model"], "no model at '/no/model'"),
    ('{"prompt": "q", "chosen": "a", "rejected": "b"}\n' * 4, ["--eval-pairs", "/no/e.jsonl"], "--eval-pairs: no"),
])
def test_rm_bad_input_prints_one_line_and_exit_2(content, flags, expected, tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    if content is not None:
        pairs.write_text(content)
    assert main(["rm", "--pairs", str(pairs), "--out", str(tmp_path / "rm"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmgym: error: ") and expected in err, err
    assert err.count("\n") == 1 and not (tmp_path / "rm").exists()


def test_rm_out_that_is_a_file_fails_before_work(tmp_path, capsys):
    pairs = write_pairs(tmp_path / "pairs.jsonl", 4)
    assert main(["rm", "--pairs", str(pairs), "--out", str(pairs)]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
