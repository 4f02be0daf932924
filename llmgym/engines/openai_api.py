"""Rollouts and evaluation against any OpenAI-compatible server: ``vllm serve``, SGLang, a hosted API.

:class:`OpenAIEngine` implements the :class:`~llmgym.engines.Engine` contract over the *completions*
endpoint (``POST {base_url}/completions``) with the ``openai`` client (the ``openai`` extra; vLLM installs it
too):

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
  at once with a one-line error (``ServerError`` / ``ModelNotServedError``) listing what it serves;
* **the server is not trusted**: every reply goes through
  :func:`~llmgym.engines.served_replies.validate_completions_response` (status, JSON, error bodies, the
  ``model`` that answered is the one asked for, choices, token ids integral and in the vocabulary,
  log-probs finite, <= 0 and >= :data:`~llmgym.engines.served_replies.LOGPROB_MIN`, at most
  ``max_new_tokens`` tokens); a bad one is a :class:`ServerError` naming the cause. A reply that is not
  HTTP (a bad chunk size, an oversized header, no status line, a truncated body) is a
  :class:`MalformedResponseError` saying so, not "stopped answering".
  Each request attempt has **one deadline** (``timeout`` seconds from sending to the last byte, however
  slowly the server drips) and a size cap, both enforced on the socket reads themselves
  (:mod:`llmgym.engines.bounded_http`).

vLLM-only request fields (``return_token_ids``, ``include_stop_str_in_output``, ``stop_token_ids``)
are sent only to a server whose model list says it is vLLM (``owned_by: "vllm"``); other servers
get the plain OpenAI fields. For log-probs that include the temperature, as the learner's do, start
vLLM with ``--logprobs-mode processed_logprobs`` (its default, raw, ignores the temperature).
A served model's log-probs are what its server computes; this engine cannot choose. It declares the
llmgym convention (:attr:`OpenAIEngine.top_p_renormalised_logprobs`: with ``top_p < 1``, the log-prob
under the renormalised nucleus the token was drawn from — vLLM's ``processed_logprobs``); for a server
that reports the full softmax instead (vLLM's raw modes, other servers), set the instance's
``top_p_renormalised_logprobs = False`` so that the learner takes its log-probs as they are.

A server holds its own weights: :meth:`OpenAIEngine.sync_weights` raises (train with
``VLLMEngine``, or with :class:`~llmgym.fleet.fleet_engine.FleetEngine` over servers started with ``llmgym
serve``; use this engine for evaluation, judges and frozen policies). Chat-only endpoints
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

from llmgym.runtime.install import install_hint

try:
    import httpcore
    import httpx
    import openai
except ImportError as err:  # pragma: no cover - exercised where openai is absent
    raise ImportError(f"llmgym.engines.openai_api needs the openai client: {install_hint('openai')}") from err

from llmgym.errors import LLMGymError
from llmgym.engines.base import Completion, SamplingParams, expand_rows
from llmgym.engines.bounded_http import REPLY_BASE_BYTES, REPLY_BYTES_PER_TOKEN, RequestBudget, bounded_http_client
from llmgym.engines.served_replies import (LOGPROB_MIN, MalformedResponseError, ServedChoice, ServerError, one_line,
                                           validate_completions_response, validate_models_response)

# the replies' checks (served_replies) and the bounded client (bounded_http) are importable from here too, as before
__all__ = ["LOGPROB_MIN", "MalformedResponseError", "ModelNotServedError", "OpenAIEngine", "ServedChoice", "ServerError", "bounded_http_client", "check_options",
           "validate_completions_response", "validate_models_response"]

_SEED_MASK = (1 << 63) - 1
MAX_SERVER_STOPS = 4
"""Stop strings the OpenAI API takes per request; with more, the engine cuts the completion itself."""


class ModelNotServedError(LLMGymError, ValueError):
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
        timeout: seconds per request attempt, from sending it to the last byte of the reply (one
            deadline, not a limit per read: a server that drips its answer is cut off).
        max_retries: retries after the first attempt (connection errors, time-outs, 408/409/429, 5xx),
            with exponential back-off.
        max_concurrency: requests in flight at once.
        prompt_format: ``"auto"`` (token ids, falling back to text if the server refuses them),
            ``"token_ids"`` or ``"text"``.

    Raises:
        ServerError: nothing answers at ``base_url`` (after the retries), or it is not an
            OpenAI-compatible API; at any later call, a reply that fails
            :func:`validate_completions_response`, or none within ``timeout``.
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
        self.timeout = timeout
        self._budget = RequestBudget()
        self.client = openai.OpenAI(base_url=self.base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
                                    timeout=timeout, max_retries=max_retries,
                                    http_client=bounded_http_client(timeout, max_concurrency + 4,
                                                                    budget=self._budget))
        served = self._served_models()
        names = [name for name, _ in served]
        if model is None:
            if len(names) != 1:
                raise ModelNotServedError(f"the server at {self.base_url} serves {len(names)} models "
                                          f"({_names(names) or 'none'}): name one")
            model = names[0]
        elif model not in names:
            raise ModelNotServedError(f"the server at {self.base_url} does not serve model {one_line(repr(model), 80)}; it "
                                      f"serves: {_names(names) or 'no model'}")
        self.model = model
        self.server_is_vllm = (model, "vllm") in served
        self.prompt_format = prompt_format
        self.prompts_sent_as: str | None = None if prompt_format == "auto" else prompt_format
        self.token_ids_from: str | None = None
        if tokenizer is not None:
            from llmgym.env.core import end_of_turn_ids

            eos = tokenizer.eos_token_id
            self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or 0)
            self.eos_ids = end_of_turn_ids(tokenizer) if eos is not None else []
            self.vocab_size: int | None = len(tokenizer)
        else:
            self.pad_id, self.eos_ids, self.vocab_size = 0, [], None

    # -- requests: every failure one ServerError (or ModelNotServedError) -----------------------------
    def _failed(self, exc: openai.OpenAIError, what: str, hint: str = "") -> ServerError:
        tries = f"{1 + self.max_retries} tries"
        if isinstance(exc, openai.APITimeoutError) or self._budget.why == "deadline":
            return ServerError(f"the server at {self.base_url} did not answer within {self.timeout:g} s "
                               f"({tries}; the timeout bounds each request, not each read)")
        if isinstance(exc, openai.APIConnectionError):
            malformed = _malformed_http(exc)
            if malformed is not None and self._budget.why is None:
                return MalformedResponseError(f"malformed HTTP response from {self.base_url}: {malformed} ({tries}; "
                                              f"a proxy or a server that does not speak HTTP/1.1 correctly?)")
            cause = self._budget.why or _root_cause(exc)
            return ServerError(f"{what} ({tries}: {cause}){hint}")
        if isinstance(exc, openai.APIStatusError):  # an HTTP error after the retries: name it from its body
            try:
                validate_completions_response(exc.status_code, exc.response.headers.get("content-type"),
                                              exc.response.content[:REPLY_BASE_BYTES], server=self.base_url,
                                              max_tokens=0)
            except ServerError as err:
                return err
        return ServerError(f"the server at {self.base_url} failed: {_first_line(exc)}")

    def _served_models(self) -> list[tuple[str, str]]:
        self._budget.max_bytes = REPLY_BASE_BYTES
        try:
            raw = self.client.models.with_raw_response.list()
        except openai.APIStatusError as exc:
            try:
                validate_models_response(exc.status_code, exc.response.headers.get("content-type"),
                                         exc.response.content[:REPLY_BASE_BYTES], server=self.base_url)
            except ServerError as err:
                raise ServerError(f"{err}: is it an OpenAI-compatible API root (ending in /v1), and is the API "
                                  f"key right?") from None
            raise ServerError(f"{self.base_url}/models answered HTTP {exc.status_code}") from None
        except openai.OpenAIError as exc:
            raise self._failed(exc, f"no OpenAI-compatible server answers at {self.base_url}",
                               ": start it, or check the URL (it ends in /v1)") from None
        http = raw.http_response
        return validate_models_response(http.status_code, http.headers.get("content-type"), http.content,
                                        server=self.base_url)

    def _request(self, *, max_tokens: int, echoed: int = 0, sent: Sequence[int] | None = None, **kwargs) -> ServedChoice:
        """One completion request; its reply checked by :func:`validate_completions_response` (with ``sent``, the
        ids of an echoed prompt: the echo checked against them position by position).
        ``openai.BadRequestError`` is left to the caller (a refused token-id prompt falls back to text)."""
        self._budget.max_bytes = REPLY_BASE_BYTES + REPLY_BYTES_PER_TOKEN * (max_tokens + echoed)
        try:
            raw = self.client.completions.with_raw_response.create(model=self.model, max_tokens=max_tokens,
                                                                   **kwargs)
        except openai.NotFoundError as exc:
            raise ModelNotServedError(f"the server at {self.base_url} does not serve model {self.model!r} "
                                      f"({_first_line(exc)})") from None
        except openai.BadRequestError:
            raise
        except openai.OpenAIError as exc:
            raise self._failed(exc, f"the server at {self.base_url} stopped answering") from None
        http = raw.http_response
        (choice,) = validate_completions_response(
            http.status_code, http.headers.get("content-type"), http.content, server=self.base_url,
            max_tokens=max_tokens, vocab_size=self.vocab_size, echoed=echoed, model=self.model, sent=sent,
            tokenizer=self.tokenizer)
        return choice

    # -- the engine contract --------------------------------------------------------------------------
    def sync_weights(self, model) -> None:
        """Not possible through this engine: the server holds its own weights. A server started with
        ``llmgym serve`` (an llmgym rollout server) takes them through
        :class:`~llmgym.fleet.fleet_engine.FleetEngine`; for any other, train with ``VLLMEngine`` or
        ``HFEngine`` and use this engine for evaluation, judges and frozen policies."""
        raise NotImplementedError(
            f"OpenAIEngine samples from the weights of the server at {self.base_url}; it cannot take the learner's: "
            f"if it is an llmgym rollout server (llmgym serve), train through FleetEngine([url]) (llmgym train "
            f"--engine vllm-server --server URL); else train with VLLMEngine (in process) or HFEngine, and use "
            f"OpenAIEngine for evaluation and judges")

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

    def sample_row(self, row: Sequence[int], sampling: SamplingParams, key: int) -> Completion:
        """One completion of the prompt ``row`` sampled with the row key ``key`` (one request; what
        ``generate`` sends per row). :class:`~llmgym.fleet.fleet_engine.FleetEngine` spreads rows over
        servers with it."""
        return self._sample([int(t) for t in row], sampling, int(key))

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
        kwargs = dict(max_tokens=int(sampling.max_new_tokens), temperature=sampling.temperature, top_p=sampling.top_p,
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
        completion = self._completion(row, response, key, int(sampling.max_new_tokens))
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

    def _completion(self, prompt: list[int], choice: ServedChoice, key: int, max_tokens: int) -> Completion:
        token_logprobs = choice.logprobs
        token_ids = choice.token_ids  # vLLM's return_token_ids, checked against the vocabulary
        if token_ids is not None:
            self.token_ids_from = "server"
        elif self.tokenizer is not None:
            self.token_ids_from = "text"
            # the text is the server's: bounded before it is tokenised (no token decodes to more characters
            # than its vocabulary entry has), and its ids must line up with the server's log-probs
            if len(choice.text) > max_tokens * self._longest_token():
                raise ServerError(f"the server at {self.base_url} answered {len(choice.text)} characters of text, "
                                  f"more than {max_tokens} tokens (max_new_tokens) can decode to")
            token_ids = list(self.tokenizer.encode(choice.text, add_special_tokens=False))
            if len(token_ids) != len(token_logprobs) or len(token_ids) > max_tokens:
                raise ServerError(f"the server at {self.base_url} answered {len(token_logprobs)} log-probs for a text "
                                  f"of {len(token_ids)} tokens (max_new_tokens={max_tokens}): the ids cannot be lined "
                                  f"up with the log-probs; serve with vLLM (it returns the token ids)")
        else:
            raise ServerError(f"the server at {self.base_url} returns no token ids; pass the model's tokenizer to "
                              f"OpenAIEngine so the text can be tokenised")
        text = (self.tokenizer.decode(token_ids, skip_special_tokens=True) if self.tokenizer is not None
                else choice.text)
        return Completion(
            prompt_ids=list(prompt),
            token_ids=token_ids,
            logprobs=[float(lp) if lp is not None else float("nan") for lp in token_logprobs],
            finish_reason=choice.finish_reason,
            text=text,
            key=int(key),
        )

    def _longest_token(self) -> int:
        """Characters of the tokenizer's longest vocabulary entry (what one token can decode to, at most)."""
        if getattr(self, "_longest", None) is None:
            self._longest = max(8, max((len(t) for t in self.tokenizer.get_vocab()), default=0))
        return self._longest

    def logprobs(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], temperature: float = 1.0) -> list[float]:
        """Log-probs of ``completion_ids`` after ``prompt_ids`` as the server scores its prompt
        (``echo=True``; vLLM's prompt log-probs are of the raw logits, so ``temperature`` must be 1).
        :class:`~llmgym.rlhf.llm_graders.LLMGrader`'s ``mode="prob"`` uses it. Every field of the echo that says
        what was scored (ids, token strings, offsets, alternatives, text) must name the ids sent, position by
        position (:func:`~llmgym.engines.served_replies.check_echo`), or :class:`ServerError` says so."""
        if temperature != 1.0:
            raise ValueError("OpenAIEngine.logprobs scores at temperature 1 only (the server's prompt log-probs)")
        ids = [int(t) for t in prompt_ids] + [int(t) for t in completion_ids]
        if self.tokenizer is None:
            raise ValueError("OpenAIEngine.logprobs needs the model's tokenizer: the server's echo of the scored tokens "
                             "is checked against the ids sent")
        # vLLM names each scored token by its id (token_id:N) when asked: the echo is then checked exactly
        extra = {"return_tokens_as_token_ids": True} if self.server_is_vllm else None
        try:
            choice = self._request(prompt=self._prompt(ids) if self.prompts_sent_as == "text" else ids, max_tokens=1,
                                   echoed=len(ids), sent=None if self.prompts_sent_as == "text" else ids,
                                   temperature=0.0, echo=True, logprobs=0, extra_body=extra)
        except openai.BadRequestError as exc:
            raise ServerError(f"the server at {self.base_url} refused the request: {_first_line(exc)}") from None
        scored = choice.logprobs
        # echo returns the prompt's log-probs (None for the first token), then the one generated token's
        prompt_part = scored[:len(ids)]
        if len(prompt_part) != len(ids) or self.prompts_sent_as == "text":
            raise ServerError(f"the server at {self.base_url} did not score the prompt token by token (echo with "
                              f"logprobs): use a vLLM server, or mode='binary' for a judge")
        if any(lp is None for lp in prompt_part[max(1, len(prompt_ids)):]):
            raise ServerError(f"the server at {self.base_url} left a log-prob of the scored tokens out")
        return [float(lp) for lp in prompt_part[len(prompt_ids):]]

    @property
    def score_tokens(self):
        """``score_tokens(sequences)``: each sequence's log-probs as the server scores it as a prompt (a teacher
        grading a student's tokens; see :meth:`logprobs`), or ``None`` where prompts go as text (a text prompt is
        re-tokenised by the server: its scores would not be of these ids)."""
        if self.prompts_sent_as == "text":
            return None
        return self._score_tokens

    def _score_tokens(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        rows = [[int(t) for t in s] for s in sequences]
        if any(len(r) < 2 for r in rows):
            raise ValueError("score_tokens needs sequences of at least two tokens (the first is only context)")
        if len(rows) <= 1 or self.max_concurrency == 1:
            return [self.logprobs(r[:1], r[1:]) for r in rows]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(rows))) as pool:
            return list(pool.map(lambda r: self.logprobs(r[:1], r[1:]), rows))

    def close(self) -> None:
        """Close the HTTP connections."""
        self.client.close()

    def __repr__(self) -> str:
        return f"OpenAIEngine({self.base_url!r}, {self.model!r})"


def _names(names: list[str], limit: int = 10) -> str:
    """The server's model names for a one-line error: each made printable and cut, at most ``limit`` of them."""
    shown = ", ".join(one_line(n, 80) for n in names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


#: httpx/h11's words for each malformed reply, and what they mean (first match wins).
_MALFORMED_HTTP = (
    ("illegal chunk header", "bad chunk size"),
    ("chunk", "bad chunked encoding"),
    ("receive buffer too long", "a header section (or chunk header) too long for the client (over 100 KiB)"),
    ("illegal status line", "no status line"),
    ("without sending complete message body", "truncated body"),
    ("illegal header", "a malformed header"),
)


def _causes(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _malformed_http(exc: BaseException) -> str | None:
    """What was malformed about the reply behind ``exc`` (httpx's ``RemoteProtocolError`` under the openai
    client's ``APIConnectionError``), or ``None`` when it was not a protocol error, or was only a server that
    closed the connection before answering (that one stopped answering)."""
    for cause in _causes(exc):
        if isinstance(cause, (httpx.RemoteProtocolError, httpcore.RemoteProtocolError)):
            detail = one_line(str(cause), 120)
            lowered = detail.lower()
            if "disconnected without sending a response" in lowered:
                return None
            for words, meaning in _MALFORMED_HTTP:
                if words in lowered:
                    return f"{meaning} ({detail})"
            return detail or type(cause).__name__
    return None


def _root_cause(exc: BaseException) -> str:
    """The innermost error's message under the openai client's generic "Connection error." (one line)."""
    last = exc
    for cause in _causes(exc):
        last = cause
    return _first_line(last) if last is not exc else _first_line(exc)


def _first_line(exc: BaseException) -> str:
    """The error's message on one line, printable, at most 300 characters (it may quote the server)."""
    return one_line(str(exc), 300) or type(exc).__name__
