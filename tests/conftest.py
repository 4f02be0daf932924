"""Shared fixtures: a tiny tokenizer and model built locally (no hub access)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def tokenizer():
    from llmgym.models import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_config():
    from llmgym.models import TinyModelConfig

    return TinyModelConfig(hidden_size=64, num_layers=2, intermediate_size=256)


@pytest.fixture()
def tiny_model(tokenizer, tiny_config):
    from llmgym.models import build_tiny_model

    return build_tiny_model(tokenizer, tiny_config)
