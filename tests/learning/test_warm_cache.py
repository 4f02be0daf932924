"""``tests/warm_cache.py``: a cached warm-up is bit for bit a fresh one, is reused, and is keyed by what
rounds its floats (so a run under other kernels or threads never picks up another set-up's model)."""

from __future__ import annotations

import torch

from llmgym.runtime.models import TinyModelConfig, build_tiny_model, supervised_warmup
from warm_cache import cached_warmup  # tests/ is on sys.path

SHAPE = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
PAIRS = [("1+1=", "2"), ("2+2=", "4"), ("3+4=", "7")]
SETTINGS = dict(steps=5, batch_size=4, lr=3e-3, seed=0)


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_a_cached_warm_up_equals_a_fresh_one_and_is_loaded_the_second_time(tokenizer, tmp_path):
    fresh = build_tiny_model(tokenizer, SHAPE)
    supervised_warmup(fresh, tokenizer, PAIRS, **SETTINGS)
    first = cached_warmup("t", lambda: build_tiny_model(tokenizer, SHAPE), tokenizer, PAIRS, SETTINGS, root=tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(weights(fresh).values(), weights(first).values()))
    [entry] = list(tmp_path.iterdir())
    # the second call loads what is saved: a weight changed on disk comes back changed
    saved = build_tiny_model(tokenizer, SHAPE)
    saved.load_state_dict(weights(first))
    with torch.no_grad():
        saved.model.norm.weight.fill_(7.0)
    saved.save_pretrained(entry)
    again = cached_warmup("t", lambda: build_tiny_model(tokenizer, SHAPE), tokenizer, PAIRS, SETTINGS, root=tmp_path)
    assert list(tmp_path.iterdir()) == [entry] and torch.all(again.model.norm.weight == 7.0)


def test_other_pairs_settings_init_or_kernels_are_another_entry(tokenizer, tmp_path, monkeypatch):
    def warm(pairs=PAIRS, settings=SETTINGS, shape=SHAPE):
        cached_warmup("t", lambda: build_tiny_model(tokenizer, shape), tokenizer, pairs, settings, root=tmp_path)
        return len(list(tmp_path.iterdir()))

    assert warm() == 1 and warm() == 1
    assert warm(pairs=PAIRS[:2]) == 2
    assert warm(settings={**SETTINGS, "steps": 6}) == 3
    assert warm(shape=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=1)) == 4
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")  # another MKL code path: other floats, so not the same model
    assert warm() == 5
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert warm() == 6
    finally:
        torch.set_num_threads(threads)
