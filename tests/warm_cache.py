"""Warmed-up tiny models cached across test runs, keyed by everything that decides their weights.

A learning test starts from a tiny model after a supervised warm-up. Where that warm-up is long (the
tool-use test's: minutes), it is built once and reused, like ``llmgym quickstart``'s base model, under
:func:`llmgym.models.cache_dir` (``$LLMGYM_CACHE`` or ``~/.cache/llmgym``). The key is content, not a
name: a digest of the random-init weights, of the warm-up pairs (token ids and targets), of the warm-up
settings and of ``supervised_warmup``'s source, plus what rounds the floats differently — torch and
transformers versions, torch's CPU capability (``ATEN_CPU_CAPABILITY``), MKL's code path (``MKL_CBWR``)
and the thread count. So a cached model is bit for bit the one the test would build in this process,
and ``benchmarks/learning_spread.py`` (which runs the same recipes in fresh processes, under other
kernel families) shares the cache instead of confusing it.

A fresh build is saved, then loaded back like a cached one, so a first run and a later run start the
test from the same object state.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

__all__ = ["FLOAT_ENVIRONMENT", "cached_warmup", "float_environment"]

FLOAT_ENVIRONMENT = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
"""Environment variables that choose other CPU kernels (and so other float rounding)."""


def float_environment() -> dict[str, object]:
    """What, besides the recipe, decides a trained model's floats in this process.

    Example:
        >>> from warm_cache import float_environment
        >>> sorted(float_environment())[:3]
        ['cpu_capability', 'env', 'threads']
    """
    import transformers

    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "env": {name: os.environ[name] for name in FLOAT_ENVIRONMENT if name in os.environ}}


def _digest(data: object) -> str:
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _weights_digest(model) -> str:
    h = hashlib.sha1()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def cached_warmup(name: str, build: Callable[[], object], tokenizer,
                  pairs: Sequence[tuple[str | Sequence[int], str]], settings: dict, *,
                  root: str | os.PathLike | None = None):
    """``build()`` warmed up with ``supervised_warmup(model, tokenizer, pairs, **settings)``, cached.

    Returns the model loaded from the cache (built and saved first when missing).

    Example:
        >>> import tempfile, torch
        >>> from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer
        >>> from warm_cache import cached_warmup
        >>> tok = build_tokenizer()
        >>> build = lambda: build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64))
        >>> with tempfile.TemporaryDirectory() as d:
        ...     first = cached_warmup("doc", build, tok, [("1+1=", "2")], dict(steps=3, batch_size=2), root=d)
        ...     again = cached_warmup("doc", build, tok, [("1+1=", "2")], dict(steps=3, batch_size=2), root=d)
        ...     len(list(Path(d).iterdir()))
        1
        >>> all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))
        True
    """
    from llmgym.runtime.models import cache_dir, load_model, save_pretrained, supervised_warmup

    model = build()
    key = {
        "init_weights": _weights_digest(model),
        "pairs": _digest([[list(p) if not isinstance(p, str) else p, a] for p, a in pairs]),
        "settings": settings,
        "supervised_warmup": hashlib.sha1(inspect.getsource(supervised_warmup).encode()).hexdigest()[:16],
        **float_environment(),
    }
    path = Path(root if root is not None else cache_dir() / "warm") / f"{name}-{_digest(key)}"
    if not (path / "config.json").is_file():
        supervised_warmup(model, tokenizer, pairs, **settings)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        save_pretrained(model, tokenizer, tmp)
        (tmp / "warm_key.json").write_text(json.dumps(key, indent=2, sort_keys=True) + "\n")
        try:
            tmp.rename(path)
        except OSError:  # another process saved it first: same key, same weights
            shutil.rmtree(tmp, ignore_errors=True)
    return load_model(path)[0]
