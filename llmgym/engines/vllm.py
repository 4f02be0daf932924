"""Rollouts from vLLM (GPU only), colocated with the learner, with weights synced after every update.

``VLLMEngine`` implements the same :class:`~llmgym.engines.Engine` contract as
:class:`~llmgym.engines.HFEngine` — token ids in, ``n`` completions per prompt out, each with
per-token log-probs and a finish reason — on vLLM's public offline API:

* ``vllm.LLM(...)`` built with ``logprobs_mode="processed_logprobs"`` (the log-probs then include
  the temperature, as the learner's do; the default "raw" mode ignores it) and, for colocated
  training, ``enable_sleep_mode=True``;
* ``LLM.generate([{"prompt_token_ids": ids}, ...], sampling_params=[vllm.SamplingParams(n=1,
  temperature=, top_p=, max_tokens=, stop=, stop_token_ids=, seed=, logprobs=0,
  include_stop_str_in_output=True)], use_tqdm=False)``: one request per row, seeded with that row's
  key, so a row's tokens do not depend on the batch (the HFEngine contract);
* weight sync, in order of preference: ``LLM.apply_model(lambda m: m.load_weights(weights))``
  (vLLM >= 0.9; runs in this process because the engine core is kept in-process, see below), else
  ``llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(weights)`` (the path
  TRL's colocate mode used for 0.8–0.10); then ``LLM.reset_prefix_cache()`` so no KV block computed
  with the old weights is reused;
* ``LLM.sleep(level=1)`` (weights to CPU, KV cache dropped) and ``LLM.wake_up(tags=...)`` so the
  learner gets the GPU memory between generations.

Supported versions: vLLM >= 0.10.2 (V1 engine, ``logprobs_mode``). Older versions are refused,
because their log-probs ignore the temperature. **Not run on a GPU yet** (see ``docs/scale.md``).

Log-prob convention. With ``top_p = 1`` the log-probs are ``log softmax(logits / T)`` of the
sampled token, the HFEngine convention. With ``top_p < 1`` vLLM's processed log-probs are those of
the *nucleus-renormalised* distribution it sampled from (``log p_T(y) − log Σ_{nucleus} p_T``), which
is ≥ the HFEngine value; :attr:`VLLMEngine.top_p_renormalised_logprobs` says so. This is the true
behaviour policy, which is what truncated importance sampling (``AgentConfig.tis``) needs.

Importing this module without vLLM raises an ImportError that says what to install.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Sequence
from typing import Any

import torch

try:
    import vllm
except ImportError as err:  # pragma: no cover - the CPU machines have no vLLM
    raise ImportError(
        "llmgym.engines.vllm needs vLLM: `pip install 'llmgym[vllm]'`. vLLM's wheels are CUDA builds: "
        "they need an NVIDIA GPU (and pin their own torch version), and cannot run on a CPU-only "
        "machine. Use llmgym.engines.HFEngine there."
    ) from err

from llmgym.core import end_of_turn_ids
from llmgym.engines.base import Completion, SamplingParams, expand_rows

__all__ = ["MIN_VLLM_VERSION", "VLLMEngine"]

MIN_VLLM_VERSION = (0, 10, 2)
_SEED_MASK = (1 << 63) - 1


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _full_tensor(t: torch.Tensor) -> torch.Tensor:
    # FSDP2 shards parameters as DTensors; vLLM needs the whole tensor
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class VLLMEngine:
    """Sampling with vLLM on a GPU, colocated with a ``transformers`` learner.

    Args:
        model: a local model directory (config, tokenizer, weights) **or** a ``transformers``
            causal LM object. For an object, its config and ``tokenizer`` are saved to a temporary
            directory, vLLM starts with ``load_format="dummy"`` and the object's weights are pushed
            in with :meth:`sync_weights` (nothing is downloaded or written twice).
        tokenizer: the learner's tokenizer (EOS, pad, decoding of ``Completion.text``).
        gpu_memory_utilization: share of the GPU vLLM may take (weights + KV cache); leave room for
            the learner, its gradients and optimiser state when colocated.
        enable_sleep_mode: allow :meth:`sleep` / :meth:`wake_up`.
        sleep_after_generate: put the engine to sleep after every :meth:`generate` (implies sleep
            mode), so the learner has the memory during the update; :meth:`generate` wakes it.
        sleep_level: 1 keeps a CPU copy of the weights (the default); 2 discards them (fine when
            :meth:`sync_weights` always runs before the next generation).
        dtype: vLLM's ``dtype`` (default: the model's).
        max_model_len: context length (default: the model config's).
        seed: vLLM's engine seed (per-row seeds are always set explicitly).
        **llm_kwargs: passed to ``vllm.LLM`` (e.g. ``enforce_eager=True``, ``tensor_parallel_size``).

    Under ``torchrun`` (an initialised ``torch.distributed`` group), each rank runs its own vLLM
    copy on its own GPU with ``distributed_executor_backend="external_launcher"`` (TRL's colocate
    mode); otherwise the engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
    so :meth:`sync_weights` hands vLLM this process's tensors without serialising them.
    """

    #: with ``top_p < 1`` the log-probs are of the nucleus-renormalised distribution (see module doc)
    top_p_renormalised_logprobs = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        gpu_memory_utilization: float = 0.3,
        enable_sleep_mode: bool = True,
        sleep_after_generate: bool = False,
        sleep_level: int = 1,
        dtype: str | None = None,
        max_model_len: int | None = None,
        seed: int = 0,
        **llm_kwargs: Any,
    ):
        version = getattr(vllm, "__version__", "0")
        if _version_tuple(version) < MIN_VLLM_VERSION:
            raise ImportError(
                f"VLLMEngine needs vLLM >= {'.'.join(map(str, MIN_VLLM_VERSION))} (logprobs_mode="
                f"'processed_logprobs'); found {version}"
            )
        if not torch.cuda.is_available():
            raise RuntimeError("VLLMEngine needs a CUDA GPU; use llmgym.engines.HFEngine on CPU")
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 or 2, got {sleep_level}")
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("VLLMEngine needs a tokenizer with an EOS token (tokenizer.eos_token_id is None)")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        self.sleep_after_generate = sleep_after_generate
        self.sleep_level = sleep_level
        self.enable_sleep_mode = enable_sleep_mode or sleep_after_generate
        self._asleep = False
        self._tmpdir = None

        path, source_model = model, None
        if not isinstance(model, (str, os.PathLike)):
            source_model = getattr(model, "module", model)  # unwrap DDP
            self._tmpdir = tempfile.TemporaryDirectory(prefix="llmgym-vllm-")
            path = self._tmpdir.name
            source_model.config.save_pretrained(path)
            generation_config = getattr(source_model, "generation_config", None)
            if generation_config is not None:
                generation_config.save_pretrained(path)
            tokenizer.save_pretrained(path)
            llm_kwargs.setdefault("load_format", "dummy")
            if dtype is None:
                dtype = str(next(source_model.parameters()).dtype).removeprefix("torch.")
        # EOS, the chat template's end of turn (<|im_end|>), the generation config's list: as TokenLevel stops
        self.eos_ids = end_of_turn_ids(tokenizer, getattr(source_model, "generation_config", None))

        from llmgym import distributed

        if distributed.is_distributed():
            llm_kwargs.setdefault("distributed_executor_backend", "external_launcher")
        else:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.llm = vllm.LLM(
            model=str(path),
            tokenizer=str(path) if source_model is not None else llm_kwargs.pop("tokenizer", None),
            dtype=dtype or "auto",
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=self.enable_sleep_mode,
            max_model_len=max_model_len,
            logprobs_mode="processed_logprobs",
            **llm_kwargs,
        )
        if source_model is not None:
            self.sync_weights(source_model)

    # -- sleep / wake -------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the GPU for the learner: KV cache dropped, weights offloaded (level 1) or dropped (2)."""
        if not self.enable_sleep_mode:
            raise RuntimeError("this VLLMEngine was built with enable_sleep_mode=False")
        if not self._asleep:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = True

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Re-allocate what :meth:`sleep` freed (``tags``: ``["weights"]``, ``["kv_cache"]`` or all)."""
        if not self._asleep:
            return
        torch.cuda.empty_cache()
        try:
            self.llm.wake_up(tags=list(tags) if tags is not None else None)
        except TypeError:  # vLLM without tags: wakes everything
            self.llm.wake_up()
            tags = None
        if tags is None or "kv_cache" in tags:
            self._asleep = False

    # -- weights ------------------------------------------------------------------------------------
    def sync_weights(self, model) -> None:
        """Load ``model``'s current weights (a ``transformers`` model, DDP/FSDP-wrapped or not) into vLLM.

        Parameter names are Hugging Face's; vLLM's ``load_weights`` maps them (fused qkv/gate-up,
        tied embeddings). With sleep mode the weights are woken first (never loaded into freed memory).
        """
        module = getattr(model, "module", model)
        if self._asleep:
            self.wake_up(tags=["weights"])
        weights = [(name, _full_tensor(t).detach()) for name, t in module.state_dict().items()]
        self._load_weights(weights)
        with contextlib.suppress(AttributeError):
            self.llm.reset_prefix_cache()

    def _load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "1":
            warnings.warn("VLLM_ENABLE_V1_MULTIPROCESSING=1: every weight sync serialises the whole state "
                          "dict to the engine process; unset it for colocated training", stacklevel=3)
        if hasattr(self.llm, "apply_model"):
            self.llm.apply_model(lambda m: m.load_weights(weights) and None)
            return
        runner_model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model  # vLLM 0.8-0.10
        runner_model.load_weights(weights)

    # -- sampling -----------------------------------------------------------------------------------
    def _params(self, sampling: SamplingParams, key: int):
        return vllm.SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop) or None,
            stop_token_ids=list(self.eos_ids),
            include_stop_str_in_output=True,
            seed=int(key) & _SEED_MASK,
            logprobs=0,
        )

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams | None = None,
        *,
        keys: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """Sample ``sampling.n`` completions for every prompt; see :class:`~llmgym.engines.Engine`."""
        sampling, prompts, rows, keys = expand_rows(prompt_ids, sampling, keys)
        if not prompts:
            return []
        if self._asleep:
            self.wake_up()
        outputs = self.llm.generate(
            [{"prompt_token_ids": r} for r in rows],
            sampling_params=[self._params(sampling, k) for k in keys],
            use_tqdm=False,
        )
        flat = [self._completion(row, out.outputs[0], key) for row, out, key in zip(rows, outputs, keys)]
        if self.sleep_after_generate:
            self.sleep()
        return [flat[i * sampling.n:(i + 1) * sampling.n] for i in range(len(prompts))]

    def open_session(self, contexts: Sequence[Sequence[int]] = ()):
        """Not supported: vLLM schedules whole completions and exposes no per-token KV cache here.

        Token-level envs need an engine that steps one token at a time (``HFEngine``); drive vLLM
        through the sequence-level env, where it samples every token of a completion in one call.
        """
        raise NotImplementedError(
            "VLLMEngine cannot open an incremental decoding session (vLLM generates whole completions); "
            "use HFEngine for token-level envs, or the sequence-level env with VLLMEngine"
        )

    def _completion(self, prompt: list[int], output, key: int) -> Completion:
        token_ids = [int(t) for t in output.token_ids]
        if output.logprobs is None or len(output.logprobs) != len(token_ids):
            raise RuntimeError("vLLM returned no per-token log-probs (SamplingParams(logprobs=0) was ignored?)")
        logprobs = []
        for tok, entry in zip(token_ids, output.logprobs):
            lp = entry[tok]
            logprobs.append(float(getattr(lp, "logprob", lp)))
        finish = "length" if output.finish_reason == "length" else "stop"
        return Completion(
            prompt_ids=prompt,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,
            text=self.tokenizer.decode(token_ids, skip_special_tokens=True),
            key=int(key),
        )

    def close(self) -> None:
        """Release vLLM (and the temporary model directory)."""
        llm, self.llm = getattr(self, "llm", None), None
        del llm
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None
        torch.cuda.empty_cache()
