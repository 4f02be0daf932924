"""The declared dependency floors are the versions docs/install.md says were tested, and the code paths
that differ by version (transformers' dtype keyword) pick the right branch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _floors() -> dict[str, str]:
    text = (ROOT / "pyproject.toml").read_text()
    return {name.lower(): version for name, version in re.findall(r'"([A-Za-z0-9_.-]+)>=([0-9.]+)"', text)}


def test_tested_versions_table_matches_the_declared_floors():
    floors = _floors()
    readme = (ROOT / "docs" / "install.md").read_text()
    table = dict(re.findall(r"^\| ([a-z-]+)(?: \(`\[math\]`\))? \| ([0-9.]+) \|", readme, re.M))
    for package in ("transformers", "tokenizers", "gymnasium", "math-verify", "reasoning-gym", "rich"):
        assert table[package] == floors[package], package


@pytest.mark.parametrize("version, keyword", [("4.46.3", "torch_dtype"), ("4.55.4", "torch_dtype"),
                                              ("4.56.0", "dtype"), ("5.24.0", "dtype"), ("5.0.0rc1", "dtype")])
def test_from_pretrained_dtype_keyword_follows_the_installed_transformers(monkeypatch, version, keyword):
    import torch
    import transformers

    from llmgym.runtime import models

    monkeypatch.setattr(transformers, "__version__", version)
    assert models._dtype_kwarg(torch.float32) == {keyword: torch.float32}


def test_tiny_model_cache_is_per_transformers_major(monkeypatch, tmp_path):
    import transformers

    from llmgym.runtime import models

    monkeypatch.setenv("LLMGYM_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "save_pretrained", lambda model, tok, path: Path(path).mkdir(parents=True))
    monkeypatch.setattr(models, "build_tiny_model", lambda tok, config: None)
    monkeypatch.setattr(transformers, "__version__", "4.46.3")
    old = models.tiny_model_path()
    monkeypatch.setattr(transformers, "__version__", "5.24.0")
    assert models.tiny_model_path() != old
