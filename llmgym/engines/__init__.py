"""Rollout engines: :class:`HFEngine` (``transformers``, CPU/GPU) and ``VLLMEngine`` (GPU, optional).

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
]


def __getattr__(name):  # vLLM is an optional, GPU-only extra: import it only when asked for
    if name == "VLLMEngine":
        from llmgym.engines.vllm import VLLMEngine

        return VLLMEngine
    raise AttributeError(f"module 'llmgym.engines' has no attribute {name!r}")
