"""Rollouts and evaluation against any OpenAI-compatible server: ``vllm serve``, SGLang, a hosted API.

:class:`OpenAIEngine` implements the :class:`~llmgym.engines.Engine` contract over the *completions*
endpoint (``POST {base_url}/completions``) with the ``openai`` client (``pip install
'llmgym[openai]'``; vLLM installs it too):

* **prompts as token ids** where the server accepts them (the completions API allows an array of
  ids; vLLM and SGLang do), so the model sees exactly the env's tokens; a server that refuses them
  gets the text (``tokenizer.decode(ids)``) and :attr:`OpenAIEngine.prompts_sent_as` says
  ``"text"`` (``llmgym bench`` writes it into its results);
* **per-token log-probs** (``logprobs=1``: each sampled token's log-prob) and the sampled **token
  ids** — from the server where it returns them (vLLM's ``return_token_ids``), else re-tokenised from
  the text (:attr:`OpenAIEngine.token_ids_from` is then ``"text"``, and ids and log-probs may not
  line up: such a server serves evaluation, not training);
* **n samples** as ``n`` requests per prompt, each ``seed``-ed with its row's key (a row's sample
  does not depend on its batch, as with the other engines), sent ``max_concurrency`` at a time;
* **stop** strings (kept in the text, as the other engines keep them, where the server supports
  vLLM's ``include_stop_str_in_output``; the API takes at most 4, so with more the engine samples
  without them and cuts each completion at the token that completes the first one) and the
  tokenizer's end-of-turn ids (vLLM's ``stop_token_ids``);
* **retries with back-off**: the ``openai`` client retries connection errors, time-outs, 408/409/429
  and 5xx answers ``max_retries`` times with exponential back-off (0.5 s doubling, up to 8 s,
  jittered), then :class:`ServerError` names the server and what to do;
* at construction one ``GET {base_url}/models``: a dead server or a model it does not serve fails
  at once with a one-line error (``ServerError`` / ``ModelNotServedError``) listing what it serves.

vLLM-only request fields (``return_token_ids``, ``include_stop_str_in_output``, ``stop_token_ids``)
are sent only to a server whose model list says it is vLLM (``owned_by: "vllm"``); other servers
get the plain OpenAI fields. For log-probs that include the temperature, as the learner's do, start
vLLM with ``--logprobs-mode processed_logprobs`` (its default, raw, ignores the temperature).

A server holds its own weights: :meth:`OpenAIEngine.sync_weights` raises (train with
``VLLMEngine``; use this engine for evaluation, judges and frozen policies). Chat-only endpoints
(``/chat/completions`` without ``/completions``) are not supported: token-exact prompts need the
completions endpoint.

Example:
    >>> from llmgym.engines.openai_api import OpenAIEngine, ServerError
    >>> try:
    ...     OpenAIEngine("http://127.0.0.1:9/v1", "tiny", max_retries=0, timeout=2)
    ... except ServerError as err:
    ...     print(str(err)[:60])
    no OpenAI-compatible server answers at http://127.0.0.1:9/v1
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

try:
    import openai
except ImportError as err:  # pragma: no cover - exercised where openai is absent
    raise ImportError("llmgym.engines.openai_api needs the openai client: pip install 'llmgym[openai]'") from err

from llmgym.engines.base import Completion, SamplingParams, expand_rows

__all__ = ["ModelNotServedError", "OpenAIEngine", "ServerError", "check_options"]

_SEED_MASK = (1 << 63) - 1
MAX_SERVER_STOPS = 4
"""Stop strings the OpenAI API takes per request; with more, the engine cuts the completion itself."""


class ServerError(ConnectionError):
    """The server did not answer (after the retries), or answered with an error the engine cannot use."""


class ModelNotServedError(ValueError):
    """The server answers but does not serve the requested model."""


def check_options(api_key: Any = None, timeout: Any = 120.0, max_retries: Any = 3, max_concurrency: Any = 16,
                  prompt_format: Any = "auto") -> None:
    """Raise a one-line ``ValueError`` for an :class:`OpenAIEngine` option of the wrong type or range, before any
    request (a ``timeout`` the client cannot use would otherwise look like a server that does not answer).

    Example:
        >>> from llmgym.engines.openai_api import check_options
        >>> check_options(timeout=30, max_retries=0)
        >>> try:
        ...     check_options(timeout="abc")
        ... except ValueError as err:
        ...     print(err)
        timeout='abc': must be a number of seconds > 0
    """
    import math

    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    checks = (("api_key", api_key is None or isinstance(api_key, str), "must be a string"),
              ("timeout", number(timeout) and math.isfinite(timeout) and timeout > 0, "must be a number of seconds > 0"),
              ("max_retries", isinstance(max_retries, int) and not isinstance(max_retries, bool) and max_retries >= 0,
               "must be a whole number >= 0"),
              ("max_concurrency", isinstance(max_concurrency, int) and not isinstance(max_concurrency, bool)
               and max_concurrency >= 1, "must be a whole number >= 1"),
              ("prompt_format", prompt_format in ("auto", "token_ids", "text"), "must be 'auto', 'token_ids' or 'text'"))
    values = {"api_key": api_key, "timeout": timeout, "max_retries": max_retries, "max_concurrency": max_concurrency,
              "prompt_format": prompt_format}
    for name, ok, why in checks:
        if not ok:
            raise ValueError(f"{name}={values[name]!r}: {why}")


class OpenAIEngine:
    """Sampling from an OpenAI-compatible server's completions endpoint.

    Args:
        base_url: the API root, e.g. ``"http://127.0.0.1:8000/v1"``.
        model: the served model's name; ``None`` = the server's only model (an error if it serves several).
        tokenizer: the served model's tokenizer (a local copy): decodes ``Completion.text`` the way the
            other engines do, gives the end-of-turn ids, and turns ids into text for a server that
            takes only text. Without one, text comes from the server and ids must come from it too.
        api_key: sent as the bearer token (default: ``$OPENAI_API_KEY``, else ``"EMPTY"``, which
            ``vllm serve`` without ``--api-key`` accepts).
        timeout: seconds per request attempt.
        max_retries: retries after the first attempt (connection errors, time-outs, 408/409/429, 5xx),
            with exponential back-off.
        max_concurrency: requests in flight at once.
        prompt_format: ``"auto"`` (token ids, falling back to text if the server refuses them),
            ``"token_ids"`` or ``"text"``.

    Raises:
        ServerError: nothing answers at ``base_url`` (after the retries), or it is not an
            OpenAI-compatible API.
        ModelNotServedError: ``model`` is not among the server's models.
    """

    #: vLLM reports top-p log-probs under the nucleus-renormalised distribution (see llmgym.engines.vllm)
    top_p_renormalised_logprobs = True

    def __init__(self, base_url: str, model: str | None = None, tokenizer: Any = None, *, api_key: str | None = None,
                 timeout: float = 120.0, max_retries: int = 3, max_concurrency: int = 16,
                 prompt_format: str = "auto"):
        import os

        check_options(api_key, timeout, max_retries, max_concurrency, prompt_format)
        if prompt_format == "text" and tokenizer is None:
            raise ValueError("prompt_format='text' needs the model's tokenizer (to turn prompt ids into text)")
        self.base_url = base_url.rstrip("/")
        self.tokenizer = tokenizer
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.client = openai.OpenAI(base_url=self.base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
                                    timeout=timeout, max_retries=max_retries)
        served = self._served_models()
        names = [m.id for m in served]
        if model is None:
            if len(names) != 1:
                raise ModelNotServedError(f"the server at {self.base_url} serves {len(names)} models "
                                          f"({', '.join(names) or 'none'}): name one")
            model = names[0]
        elif model not in names:
            raise ModelNotServedError(f"the server at {self.base_url} does not serve model {model!r}; it serves: "
                                      f"{', '.join(names) or 'no model'}")
        self.model = model
        self.server_is_vllm = any(m.id == model and getattr(m, "owned_by", "") == "vllm" for m in served)
        self.prompt_format = prompt_format
        self.prompts_sent_as: str | None = None if prompt_format == "auto" else prompt_format
        self.token_ids_from: str | None = None
        if tokenizer is not None:
            from llmgym.core import end_of_turn_ids

            eos = tokenizer.eos_token_id
            self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or 0)
            self.eos_ids = end_of_turn_ids(tokenizer) if eos is not None else []
        else:
            self.pad_id, self.eos_ids = 0, []

    # -- errors -------------------------------------------------------------------------------------
    def _served_models(self):
        try:
            return list(self.client.models.list())
        except openai.APIConnectionError as exc:
            raise ServerError(f"no OpenAI-compatible server answers at {self.base_url} ({1 + self.max_retries} "
                              f"tries: {exc}): start it, or check the URL (it ends in /v1)") from None
        except openai.APIStatusError as exc:
            raise ServerError(f"{self.base_url}/models answered HTTP {exc.status_code} ({_first_line(exc)}): is it "
                              f"an OpenAI-compatible API root (ending in /v1), and is the API key right?") from None

    def _request(self, **kwargs):
        try:
            return self.client.completions.create(model=self.model, **kwargs)
        except openai.APIConnectionError as exc:
            raise ServerError(f"the server at {self.base_url} stopped answering ({1 + self.max_retries} tries: {exc})"
                              ) from None
        except openai.NotFoundError as exc:
            raise ModelNotServedError(f"the server at {self.base_url} does not serve model {self.model!r} "
                                      f"({_first_line(exc)})") from None

    # -- the engine contract --------------------------------------------------------------------------
    def sync_weights(self, model) -> None:
        """Not possible: the server holds its own weights. Train with ``VLLMEngine``; use this engine for
        evaluation, judges and frozen policies."""
        raise NotImplementedError(
            f"OpenAIEngine samples from the weights of the server at {self.base_url}; it cannot take the learner's: "
            f"train with VLLMEngine (in process) or HFEngine, and use OpenAIEngine for evaluation and judges")

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
        if self.prompts_sent_as is None:  # first call: find out whether the server takes token ids
            flat = [self._sample(rows[0], sampling, keys[0])]
            flat += self._sample_all(rows[1:], sampling, keys[1:])
        else:
            flat = self._sample_all(rows, sampling, keys)
        return [flat[i * sampling.n:(i + 1) * sampling.n] for i in range(len(prompts))]

    def _sample_all(self, rows, sampling, keys) -> list[Completion]:
        if len(rows) <= 1 or self.max_concurrency == 1:
            return [self._sample(r, sampling, k) for r, k in zip(rows, keys)]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(rows))) as pool:
            return list(pool.map(lambda rk: self._sample(rk[0], sampling, rk[1]), zip(rows, keys)))

    def _extra(self, sampling: SamplingParams) -> dict[str, Any]:
        if not self.server_is_vllm:
            return {}
        extra: dict[str, Any] = {"return_token_ids": True, "include_stop_str_in_output": True}
        if self.eos_ids:
            extra["stop_token_ids"] = list(self.eos_ids)
        return extra

    def _prompt(self, ids: list[int]):
        if self.prompts_sent_as == "text":
            return self.tokenizer.decode(ids, skip_special_tokens=False)
        return ids

    def _sample(self, row: list[int], sampling: SamplingParams, key: int) -> Completion:
        # the OpenAI API takes at most 4 stop strings (vLLM enforces it): more are applied here, afterwards
        server_stops = list(sampling.stop) if len(sampling.stop) <= MAX_SERVER_STOPS else []
        kwargs = dict(max_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
                      n=1, seed=int(key) & _SEED_MASK, logprobs=1, stop=server_stops or None,
                      extra_body=self._extra(sampling) or None)
        if self.prompts_sent_as is None:
            try:
                response = self._request(prompt=row, **kwargs)
                self.prompts_sent_as = "token_ids"
            except openai.BadRequestError as exc:
                if self.prompt_format != "auto" or self.tokenizer is None:
                    raise ServerError(f"the server at {self.base_url} refused a token-id prompt ({_first_line(exc)})"
                                      + ("; pass the model's tokenizer to send text" if self.tokenizer is None
                                         else "")) from None
                self.prompts_sent_as = "text"
                response = self._request(prompt=self._prompt(row), **kwargs)
        else:
            try:
                response = self._request(prompt=self._prompt(row), **kwargs)
            except openai.BadRequestError as exc:
                raise ServerError(f"the server at {self.base_url} refused the request: {_first_line(exc)}") from None
        completion = self._completion(row, response.choices[0], key)
        if sampling.stop and not server_stops:
            completion = self._cut_at_stop(completion, sampling.stop)
        return completion

    def _cut_at_stop(self, c: Completion, stops: tuple[str, ...]) -> Completion:
        """End ``c`` at the token that completes the first stop string (kept, as the other engines keep it)."""
        if self.tokenizer is None:
            raise ServerError(f"more than {MAX_SERVER_STOPS} stop strings need the model's tokenizer (the server "
                              f"takes {MAX_SERVER_STOPS}; the rest are applied to the tokens afterwards)")
        tail = max(len(s) for s in stops) + 2  # a stop string spans at most this many tokens (a byte or more each)
        for end in range(1, len(c.token_ids) + 1):
            text = self.tokenizer.decode(c.token_ids[max(0, end - tail):end], skip_special_tokens=True)
            if any(s in text for s in stops):
                ids = c.token_ids[:end]
                return Completion(c.prompt_ids, ids, c.logprobs[:end], "stop",
                                  self.tokenizer.decode(ids, skip_special_tokens=True), c.key)
        return c

    def _completion(self, prompt: list[int], choice, key: int) -> Completion:
        token_logprobs = list(getattr(choice.logprobs, "token_logprobs", None) or [])
        token_ids = getattr(choice, "token_ids", None)  # vLLM's return_token_ids (an extra field to the client)
        if token_ids is not None:
            self.token_ids_from = "server"
            token_ids = [int(t) for t in token_ids]
        elif self.tokenizer is not None:
            self.token_ids_from = "text"
            token_ids = list(self.tokenizer.encode(choice.text, add_special_tokens=False))
        else:
            raise ServerError(f"the server at {self.base_url} returns no token ids; pass the model's tokenizer to "
                              f"OpenAIEngine so the text can be tokenised")
        if len(token_logprobs) != len(token_ids) and self.token_ids_from == "server":
            raise ServerError(f"the server at {self.base_url} returned {len(token_logprobs)} log-probs for "
                              f"{len(token_ids)} tokens (does it support logprobs=1?)")
        text = (self.tokenizer.decode(token_ids, skip_special_tokens=True) if self.tokenizer is not None
                else choice.text)
        return Completion(
            prompt_ids=list(prompt),
            token_ids=token_ids,
            logprobs=[float(lp) if lp is not None else float("nan") for lp in token_logprobs],
            finish_reason="length" if choice.finish_reason == "length" else "stop",
            text=text,
            key=int(key),
        )

    def logprobs(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], temperature: float = 1.0) -> list[float]:
        """Log-probs of ``completion_ids`` after ``prompt_ids`` as the server scores its prompt
        (``echo=True``; vLLM's prompt log-probs are of the raw logits, so ``temperature`` must be 1).
        :class:`~llmgym.judges.JudgeVerifier`'s ``mode="prob"`` uses it."""
        if temperature != 1.0:
            raise ValueError("OpenAIEngine.logprobs scores at temperature 1 only (the server's prompt log-probs)")
        ids = [int(t) for t in prompt_ids] + [int(t) for t in completion_ids]
        response = self._request(prompt=self._prompt(ids) if self.prompts_sent_as == "text" else ids, max_tokens=1,
                                 temperature=0.0, echo=True, logprobs=0)
        scored = list(response.choices[0].logprobs.token_logprobs or [])
        # echo returns the prompt's log-probs (None for the first token), then the one generated token's
        prompt_part = scored[:len(ids)]
        if len(prompt_part) != len(ids) or self.prompts_sent_as == "text":
            raise ServerError(f"the server at {self.base_url} did not score the prompt token by token (echo with "
                              f"logprobs): use a vLLM server, or mode='binary' for a judge")
        return [float(lp) for lp in prompt_part[len(prompt_ids):]]

    def close(self) -> None:
        """Close the HTTP connections."""
        self.client.close()

    def __repr__(self) -> str:
        return f"OpenAIEngine({self.base_url!r}, {self.model!r})"


def _first_line(exc: BaseException) -> str:
    """The error's message on one line, at most 300 characters."""
    return " ".join(str(exc).split())[:300] or type(exc).__name__
