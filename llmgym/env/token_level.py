"""Token level: one action is one token id, over any sequence-level or multi-turn env."""

from __future__ import annotations

import reprlib
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from llmgym.env.core import end_of_turn_ids
from llmgym.env.spaces import as_token_array

__all__ = ["TokenLevel", "text_decoder"]


def text_decoder(tokenizer: Any):
    """``ids -> tokenizer.decode(ids, skip_special_tokens=True)``, without ``transformers``' per-call
    overhead where that adds nothing: a fast tokenizer that neither overrides decoding nor cleans up
    spaces decodes in its Rust backend directly (a token-level env decodes its completion at every
    token; the wrapper's argument checks cost several times the decoding of a short completion).

    Example:
        >>> from llmgym.env.token_level import text_decoder
        >>> from llmgym.runtime.models import build_tokenizer
        >>> tok = build_tokenizer()
        >>> ids = tok.encode("2+2=4") + [tok.eos_token_id]
        >>> text_decoder(tok)(ids) == tok.decode(ids, skip_special_tokens=True) == "2+2=4"
        True
    """
    try:
        from transformers import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: its own decode
        TokenizersBackend = None
    backend = getattr(tokenizer, "_tokenizer", None)
    cls = type(tokenizer)
    if (TokenizersBackend is not None and isinstance(tokenizer, TokenizersBackend)
            and cls.decode is PreTrainedTokenizerBase.decode and cls._decode is TokenizersBackend._decode
            and not getattr(tokenizer, "clean_up_tokenization_spaces", True) and callable(getattr(backend, "decode", None))):
        return lambda ids: backend.decode(ids, skip_special_tokens=True)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


class TokenLevel(gym.Wrapper):
    """Make a sequence-level or multi-turn env token-level: ``action_space = Discrete(vocab)``.

    The wrapper buffers tokens. The observation holds the ids so far (``prompt_ids`` = context +
    tokens of the current completion) and the decoded text. Reward is 0 until an end-of-turn id (the
    turn ends, ``terminated``) or ``max_new_tokens`` tokens (``truncated``); then the buffered ids
    (the end-of-turn id included) go to the inner env's ``step`` and its reward is returned. The
    end-of-turn ids (``stop_token_ids``) are all that :func:`llmgym.env.core.end_of_turn_ids` finds —
    the tokenizer's EOS, its chat template's end of turn (ChatML's ``<|im_end|>``), the
    ``generation_config``'s ``eos_token_id`` list — plus any given; the inner env learns the same set,
    so a turn ends on the same ids at both levels. In a multi-turn env the
    episode then continues with the env's reply appended, and the budget starts again.

    Because the inner env receives exactly the tokens, the same seed and the same tokens give the
    same episode and reward at both levels.

    Args:
        env: a :class:`~llmgym.SequenceEnv` or :class:`~llmgym.MultiTurnEnv` (possibly wrapped).
        tokenizer: defaults to the inner env's; must have an EOS token.
        max_new_tokens: tokens per completion (per turn) at most.
        stop_token_ids: extra ids that end a completion like EOS.
        generation_config: the model's ``GenerationConfig`` (or anything with ``eos_token_id``): its
            end-of-turn ids count too (Qwen's lists both ``<|im_end|>`` and ``<|endoftext|>``).

    Example:
        >>> from llmgym import SequenceEnv, Task, TokenLevel
        >>> from llmgym.runtime.models import build_tokenizer
        >>> tok = build_tokenizer()
        >>> env = TokenLevel(SequenceEnv([Task("1+1=", answer="2")], lambda t, c: c == t.answer), tok, max_new_tokens=4)
        >>> obs, info = env.reset(seed=0)
        >>> obs, r, term, trunc, info = env.step(tok.convert_tokens_to_ids("2"))
        >>> r, term
        (0.0, False)
        >>> obs, r, term, trunc, info = env.step(tok.eos_token_id)
        >>> r, term, trunc
        (1.0, True, False)
    """

    def __init__(self, env: gym.Env, tokenizer: Any = None, max_new_tokens: int = 64,
                 stop_token_ids: Any = None, generation_config: Any = None):
        super().__init__(env)
        inner = env.unwrapped
        tokenizer = tokenizer if tokenizer is not None else getattr(inner, "tokenizer", None)
        if tokenizer is None:
            raise ValueError("TokenLevel needs a tokenizer: TokenLevel(env, tokenizer=tok, max_new_tokens=N)")
        if tokenizer.eos_token_id is None:
            raise ValueError(
                "TokenLevel needs a tokenizer with an EOS token (tokenizer.eos_token_id is None): an "
                "episode ends at EOS; set tokenizer.eos_token or add one"
            )
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if getattr(inner, "tokenizer", None) is not tokenizer:
            inner.set_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self._decode = text_decoder(tokenizer)  # runs at every token: the shortest path to the same text
        self.max_new_tokens = max_new_tokens
        self.eos_token_id = int(tokenizer.eos_token_id)
        # tokens that end a completion: EOS, the chat template's end of turn, the generation config's, any given
        self.stop_token_ids = {*end_of_turn_ids(tokenizer, generation_config), *(int(t) for t in (stop_token_ids or ()))}
        self.action_space = spaces.Discrete(len(tokenizer))
        self.observation_space = inner.observation_space
        self._context_text = ""
        self._context: list[int] = []
        self._buffer: list[int] = []
        self._done = True

    @property
    def stop_token_ids(self) -> set[int]:
        """Ids that end a completion; setting them tells the inner env too (both levels agree)."""
        return self._stop_token_ids

    @stop_token_ids.setter
    def stop_token_ids(self, ids: Any) -> None:
        self._stop_token_ids = {int(t) for t in ids}
        inner = self.env.unwrapped
        if hasattr(inner, "stop_token_ids"):
            inner.stop_token_ids = set(inner.stop_token_ids) | self._stop_token_ids

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._start_turn(obs)
        self._done = False
        return self._observation(), info

    def step(self, action: Any):
        if self._done:
            raise gym.error.ResetNeeded(
                "the episode is over (terminated or truncated): call env.reset() before stepping again"
            )
        token = self._check_token(action)
        self._buffer.append(token)
        hit_eos = token in self.stop_token_ids
        if not hit_eos and len(self._buffer) < self.max_new_tokens:
            return self._observation(), 0.0, False, False, {"task": self.unwrapped.task, "tokens": len(self._buffer)}
        obs, reward, terminated, truncated, info = self.env.step(list(self._buffer))
        info = {**info, "tokens": len(self._buffer), "finish_reason": "stop" if hit_eos else "length"}
        if terminated or truncated:
            self._done = True
            if not hit_eos:  # the completion was cut at the token budget
                terminated, truncated = False, True
            self._context, self._context_text = list(obs.get("prompt_ids", [])), obs["prompt"]
            self._buffer = []
            return self._observation(), reward, terminated, truncated, info
        self._start_turn(obs)  # multi-turn: the env replied; a new completion begins
        return self._observation(), reward, False, False, info

    def buffer_token(self, token: int) -> bool:
        """Take ``token`` as :meth:`step` would when it does not end the turn — buffered, reward 0 —
        without building the observation; ``False`` (nothing changed) when it would end the turn, is
        not a token id of the vocabulary, or the episode is over: then :meth:`step` must take it.

        A rollout that drives many rows calls this for a turn's inner tokens and ``step`` for its last,
        so the inner env, its verifier and the Gymnasium checks run exactly as with ``step`` alone.

        Example:
            >>> from llmgym import SequenceEnv, Task, TokenLevel
            >>> from llmgym.runtime.models import build_tokenizer
            >>> tok = build_tokenizer()
            >>> env = TokenLevel(SequenceEnv([Task("1+1=", answer="2")], lambda t, c: c == t.answer), tok, max_new_tokens=4)
            >>> _ = env.reset(seed=0)
            >>> env.buffer_token(tok.convert_tokens_to_ids("2")), env.buffer_token(tok.eos_token_id)
            (True, False)
            >>> env.step(tok.eos_token_id)[1:3]
            (1.0, True)
        """
        buffer = self._buffer
        if (self._done or type(token) is not int or token in self._stop_token_ids
                or len(buffer) + 1 >= self.max_new_tokens or not 0 <= token < self.action_space.n):
            return False
        buffer.append(token)
        return True

    def _start_turn(self, obs: dict[str, Any]) -> None:
        self._context = obs["prompt_ids"].tolist()
        self._context_text = obs["prompt"]
        self._buffer = []

    def _observation(self) -> dict[str, Any]:
        text = self._context_text
        if self._buffer:
            text += self._decode(self._buffer)
        return {"prompt": text, "prompt_ids": as_token_array(self._context + self._buffer)}

    def _check_token(self, action: Any) -> int:
        if type(action) is int and 0 <= action < self.action_space.n:  # the common case, checked first
            return action
        if hasattr(action, "detach") and getattr(action, "ndim", None) == 0:  # a 0-d tensor; any other is refused
            action = action.detach().cpu().numpy()
        if isinstance(action, np.ndarray) and action.shape == () and np.issubdtype(action.dtype, np.integer):
            action = int(action)
        if isinstance(action, bool) or not isinstance(action, (int, np.integer)):
            raise TypeError(
                f"a token-level action is one token id (int), got {type(action).__name__}: {reprlib.repr(action)}; "
                f"to act with a whole completion use the sequence-level env (level='sequence')"
            )
        token = int(action)
        if not 0 <= token < self.action_space.n:
            raise ValueError(
                f"token id {token} is outside the vocabulary [0, {self.action_space.n}): was it produced "
                f"with a different tokenizer or model head?"
            )
        return token
