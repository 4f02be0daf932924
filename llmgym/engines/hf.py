"""Rollouts from a Hugging Face ``transformers`` causal LM (CPU or GPU), with per-token log-probs."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Sequence

import torch

from llmgym.env.core import end_of_turn_ids
from llmgym.engines.base import Completion, SamplingParams, expand_rows
from llmgym.engines.model_inputs import cache_argument, cache_of, pad_left, position_ids, shared_rows
from llmgym.engines.sampling import keyed_uniforms, sample_next_token
from llmgym.engines.session import HFDecodeSession
from llmgym.engines.static_decode import DECODE_MODES, StaticCacheDecoder, last_logits_only

__all__ = ["HFEngine", "sequence_logprobs", "pad_left"]  # pad_left lives in llmgym.engines.model_inputs


def sequence_logprobs(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0,
    return_logits: bool = False,
):
    """Teacher-forced ``log π(x_t | x_<t)`` for ``t = 1..L-1``: shape ``[B, L-1]``.

    ``logprobs[:, j]`` scores ``input_ids[:, j + 1]``; padding may be on either side. With
    ``return_logits`` also returns the tempered logits ``[B, L-1, V]`` (for the entropy).

    Example:
        >>> import torch
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> from llmgym.engines.hf import sequence_logprobs
        >>> tok = build_tokenizer()
        >>> model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64))
        >>> ids = torch.tensor([tok.encode("1+1=2")])
        >>> sequence_logprobs(model, ids, torch.ones_like(ids)).shape
        torch.Size([1, 5])
    """
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask))
    logits = out.logits[:, :-1].float()
    t = temperature if temperature > 0 else 1.0
    logits = logits / t
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return (logprobs, logits) if return_logits else logprobs


_DONE_CHECK_EVERY = 8  # decoding steps between host syncs on "all rows done?" (GPU); 1 on CPU


class HFEngine:
    """Batched sampling with a KV cache from a ``transformers`` causal LM.

    The engine samples from the very model object it is given (no copy), so after an optimiser step
    it already sees the new weights; :meth:`sync_weights` copies weights when a different model
    object (e.g. a learner on another device) is passed.

    Args:
        model: a causal LM (``AutoModelForCausalLM``).
        tokenizer: its tokenizer (gives EOS, pad and decoding).
        max_batch_size: rows per forward pass; bigger requests are split.
        decode: ``"eager"`` (dynamic KV cache), ``"static"`` (static KV cache) or ``"compiled"``
            (static cache + a ``torch.compile``-d step, CUDA graphs on a GPU); see
            :mod:`llmgym.engines.static_decode`. Same keys, same tokens in every mode.
        autocast_dtype: run generation under ``torch.autocast`` with this dtype (e.g.
            ``torch.bfloat16`` over float32 weights); ``None`` = the weights' dtype. The static and
            compiled modes always decode in the weights' dtype (a static cache holds one dtype, and
            autocast makes keys and values differ); load bf16 weights for bf16 decoding there.

    Example:
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> from llmgym.engines import HFEngine, SamplingParams
        >>> tok = build_tokenizer()
        >>> engine = HFEngine(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)), tok)
        >>> groups = engine.generate([tok.encode("2+2=")], SamplingParams(n=3, max_new_tokens=4, seed=0))
        >>> len(groups), len(groups[0]), groups[0][0].finish_reason in ("stop", "length")
        (1, 3, True)
        >>> len(groups[0][0].token_ids) == len(groups[0][0].logprobs) <= 4
        True
    """

    done_check_every: int | None = None
    """Decoding steps between host-side "all rows done?" checks (``None``: 1 on CPU, 8 on a GPU)."""

    top_p_renormalised_logprobs = True
    """With ``top_p < 1`` a completion's log-probs are of the renormalised nucleus it was drawn from
    (:func:`~llmgym.engines.sampling.sample_next_token`), as vLLM's are."""

    def __init__(self, model, tokenizer, max_batch_size: int = 64, decode: str = "eager",
                 autocast_dtype: torch.dtype | None = None):
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}, got {decode!r}")
        self.model = model
        self.decode = decode
        self.autocast_dtype = autocast_dtype
        self._static = None  # StaticCacheDecoder, built at the first static/compiled generate
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("HFEngine needs a tokenizer with an EOS token (tokenizer.eos_token_id is None)")
        # EOS, the chat template's end of turn (<|im_end|>), the generation config's list: as TokenLevel stops
        self.eos_ids = end_of_turn_ids(tokenizer, getattr(model, "generation_config", None))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        # transformers >= 5.2x renamed the KV-cache argument from past_key_values to cache
        self.cache_arg = cache_argument(model)
        self._last_only = last_logits_only(model)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def sync_weights(self, model) -> None:
        """Sample from ``model``'s weights from now on (a no-op when it is the engine's own model)."""
        if model is self.model:
            return
        self.model.load_state_dict(model.state_dict())

    @contextmanager
    def eval_mode(self):
        """Eval mode, inference mode and the engine's autocast for a block of forward passes (the
        model's training flag is restored after)."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                                                        enabled=self.autocast_dtype is not None):
                yield
        finally:
            self.model.train(was_training)

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
        flat: list[Completion] = []
        for start in range(0, len(rows), self.max_batch_size):
            flat += self._generate_rows(rows[start:start + self.max_batch_size],
                                        list(keys[start:start + self.max_batch_size]), sampling)
        return [flat[i * sampling.n:(i + 1) * sampling.n] for i in range(len(prompts))]

    def _generate_rows(self, rows: list[list[int]], keys: list[int], sampling: SamplingParams) -> list[Completion]:
        device = self.device
        batch = len(rows)
        ids, attn = pad_left(rows, self.pad_id, device)
        # every step's uniform at once: one hash over [B, T] instead of a dozen small kernels per step
        uniforms = keyed_uniforms(torch.tensor(keys, dtype=torch.long, device=device)[:, None],
                                  torch.arange(sampling.max_new_tokens, device=device)[None, :])
        eos = torch.tensor(self.eos_ids, device=device)
        tokens = torch.full((batch, sampling.max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        logps = torch.zeros((batch, sampling.max_new_tokens), dtype=torch.float32, device=device)
        lengths = torch.zeros(batch, dtype=torch.long, device=device)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        stopped = torch.zeros(batch, dtype=torch.bool, device=device)
        # asking "are all rows done?" copies a flag to the host and waits for the device; on a GPU ask
        # every few steps so the host keeps queueing work (a finished row only samples padding)
        check_every = self.done_check_every or (1 if device.type == "cpu" else _DONE_CHECK_EVERY)
        with self.eval_mode():
            static = self._static_decoder() if self.decode != "eager" else None
            shared = shared_rows(rows)  # a group's samples share their prompt: prefill it once
            if static is not None:
                logits = static.prefill(ids, attn, sampling.max_new_tokens, shared)
            else:
                positions = position_ids(attn)
                pick = torch.tensor(shared[0], device=device) if shared is not None else slice(None)
                out = self.model(input_ids=ids[pick], attention_mask=attn[pick], position_ids=positions[pick],
                                 use_cache=True, **self._last_only)
                cache, last_pos = cache_of(out), positions[:, -1:]
                logits = out.logits[:, -1, :]
                if shared is not None:  # the distinct rows' cache and logits, copied to every repeat
                    index = shared[1].to(device)
                    cache.reorder_cache(index)
                    logits = logits.index_select(0, index)
            for step in range(sampling.max_new_tokens):
                tok, lp = sample_next_token(logits, None, None, sampling.temperature, sampling.top_p,
                                            uniforms=uniforms[:, step])
                tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
                live = ~done
                tokens[:, step] = tok
                logps[:, step] = torch.where(live, lp, torch.zeros_like(lp))
                lengths += live.long()
                hit = live & torch.isin(tok, eos)
                if sampling.stop:
                    hit |= live & self._hit_stop_string(tokens, lengths, sampling.stop)
                stopped |= hit
                done |= hit
                if step == sampling.max_new_tokens - 1 or (step % check_every == check_every - 1 and bool(done.all())):
                    break
                if static is not None:
                    logits = static.step(tok)
                    continue
                attn = torch.cat([attn, torch.ones((batch, 1), dtype=attn.dtype, device=device)], dim=1)
                last_pos = last_pos + 1
                out = self.model(input_ids=tok[:, None], attention_mask=attn, position_ids=last_pos,
                                 use_cache=True, **{self.cache_arg: cache})
                cache, logits = cache_of(out), out.logits[:, -1, :]
            if static is not None and not static.compiled:
                static.release()  # a KV cache held until the next rollout would sit through the update
        tokens, logps, lengths, stopped = tokens.cpu(), logps.cpu(), lengths.cpu(), stopped.cpu()
        completions = []
        for i in range(batch):
            n = int(lengths[i])
            token_ids = tokens[i, :n].tolist()
            completions.append(Completion(
                prompt_ids=rows[i],
                token_ids=token_ids,
                logprobs=logps[i, :n].tolist(),
                finish_reason="stop" if bool(stopped[i]) else "length",
                text=self.tokenizer.decode(token_ids, skip_special_tokens=True),
                key=keys[i],
            ))
        return completions

    def _static_decoder(self) -> StaticCacheDecoder:
        if self._static is None:
            self._static = StaticCacheDecoder(self.model, self.cache_arg, compiled=self.decode == "compiled")
        return self._static

    def _hit_stop_string(self, tokens: torch.Tensor, lengths: torch.Tensor, stop: tuple[str, ...]) -> torch.Tensor:
        # decode only a tail long enough to contain the longest stop string (a byte or more per token)
        tail = max(len(s) for s in stop) + 2
        hits = []
        for row, n in zip(tokens.tolist(), lengths.tolist()):
            text = self.tokenizer.decode(row[max(0, n - tail):n], skip_special_tokens=True)
            hits.append(any(s in text for s in stop))
        return torch.tensor(hits, device=tokens.device)

    def open_session(self, contexts: Sequence[Sequence[int]] = ()):
        """An incremental decoding session over ``contexts`` that keeps the KV cache between calls.

        See :class:`llmgym.engines.session.HFDecodeSession` (and :class:`~llmgym.engines.DecodeSession`
        for the contract); token-level rollouts and :class:`~llmgym.engines.TokenStepper` use it.

        Example:
            >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
            >>> from llmgym.engines import HFEngine
            >>> tok = build_tokenizer()
            >>> engine = HFEngine(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)), tok)
            >>> engine.open_session([[5, 6, 7]]).logits().shape[0]
            1
        """
        return HFDecodeSession(self, contexts)

    def next_token_logits(self, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Logits ``[B, V]`` (float32) of the next token after each context, recomputed from scratch.

        A token loop that calls this at every step is quadratic in the context length; use
        :class:`~llmgym.engines.TokenStepper` (same call, cache kept) or :meth:`open_session`.
        """
        ids, attn = pad_left([list(c) for c in contexts], self.pad_id, self.device)
        with self.eval_mode():
            out = self.model(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn))
        return out.logits[:, -1, :].float()

    def score_tokens(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Teacher-forced log-probs (temperature 1) of every token after the first of each sequence.

        ``result[i][j]`` is ``log π(sequences[i][j + 1] | sequences[i][:j + 1])``: what a teacher
        answers when it grades a student's tokens (:class:`llmgym.agents.distill.OnPolicyDistillation`).
        Rows are right-padded in batches of ``max_batch_size``; the model may sit on any device.

        Example:
            >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
            >>> from llmgym.engines import HFEngine
            >>> tok = build_tokenizer()
            >>> engine = HFEngine(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)), tok)
            >>> [len(row) for row in engine.score_tokens([[1, 5, 6], [1, 7]])]
            [2, 1]
        """
        rows = [[int(t) for t in s] for s in sequences]
        if any(len(r) < 2 for r in rows):
            raise ValueError("score_tokens needs sequences of at least two tokens (the first is only context)")
        out: list[list[float]] = []
        for start in range(0, len(rows), self.max_batch_size):
            part = rows[start:start + self.max_batch_size]
            width = max(map(len, part))
            ids = torch.full((len(part), width), self.pad_id, dtype=torch.long)
            attn = torch.zeros_like(ids)
            for i, r in enumerate(part):
                ids[i, :len(r)] = torch.tensor(r)
                attn[i, :len(r)] = 1
            with self.eval_mode():
                lp = sequence_logprobs(self.model, ids.to(self.device), attn.to(self.device)).float().cpu()
            out += [lp[i, :len(r) - 1].tolist() for i, r in enumerate(part)]
        return out

    def logprobs(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], temperature: float = 1.0) -> list[float]:
        """Teacher-forced log-probs of ``completion_ids`` after ``prompt_ids`` (same distribution as sampling).

        Example:
            >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
            >>> from llmgym.engines import HFEngine, SamplingParams
            >>> tok = build_tokenizer()
            >>> engine = HFEngine(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)), tok)
            >>> c = engine.generate([tok.encode("hi")], SamplingParams(max_new_tokens=3, seed=1))[0][0]
            >>> max(abs(a - b) for a, b in zip(c.logprobs, engine.logprobs(c.prompt_ids, c.token_ids))) < 1e-4
            True
        """
        ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=self.device)
        with self.eval_mode():
            lp = sequence_logprobs(self.model, ids, torch.ones_like(ids), temperature)
        return lp[0, len(prompt_ids) - 1:].tolist()

