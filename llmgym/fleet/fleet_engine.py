"""Rollouts from a fleet of served vLLM rollout workers that take the learner's weights.

:class:`FleetEngine` is the :class:`~llmgym.engines.Engine` contract over N rollout servers
(``llmgym serve``: vLLM's own OpenAI-compatible server with its RL weight routes, see
:mod:`llmgym.fleet.serve`), on this machine or others:

* **Sampling** reuses :class:`~llmgym.engines.openai_api.OpenAIEngine` — one per server, through its
  one-row seam :meth:`~llmgym.engines.openai_api.OpenAIEngine.sample_row` (token-id prompts, per-token
  log-probs, seeds, stop strings, retries and the validation of each reply are that engine's). The
  rows of a call go to a shared queue, the rows of one prompt (a group) together; each server takes
  whole groups and samples their rows with ``max_concurrency`` workers, so at most that many requests
  are in flight per server and a faster server takes more groups. A row keeps
  its key (its seed) whichever server samples it.
* **Weight sync** (:meth:`FleetEngine.sync_weights`) pushes the learner's state dict to every server
  at once through vLLM's weight-transfer protocol: ``/pause?mode=wait`` (nothing is sampled
  half-old, half-new), ``/start_weight_update``, ``/update_weights`` with the tensors broadcast over
  a ``torch.distributed`` group (gloo: :mod:`llmgym.fleet.weight_transfer`; one group per server),
  ``/finish_weight_update`` with the **policy version** (vLLM records it as the server's weight
  version), ``/resume``.
* **No server's word is taken**: every control request is signed afresh with the servers' secret (no
  replay: :mod:`llmgym.fleet.guard`); after each sync every server is asked the log-probs of a fresh
  random token sequence (``prompt_logprobs``) and compared with the learner's own forward pass; and
  each batch is screened before it is used (next point). A server off by more than ``logprob_tolerance``
  is dropped (:class:`UntrustedServerWarning`); with none left, :class:`FleetError`. A server that answers ``/update_weights`` with an error fails the sync at once,
  quoting its answer.
* **Versions**: every :class:`~llmgym.engines.Completion` carries ``policy_version``, the version the
  fleet synced; after each batch every server that sampled it is asked its weight version
  (``/weight_info``), and a server holding another one (another learner pushed to it) stops the run.
  :func:`~llmgym.engines.base.sync_engine_weights` passes the learner's version (its update count);
  the pipelined learner passes the version of each batch's behaviour policy and checks the tags.
* **Samples are checked before the batch is used** (:mod:`llmgym.fleet.trust`): the learner hands its own
  scores of a batch's tokens, under the weights that sampled them, to :meth:`FleetEngine.screen_batch` before it
  computes anything from the batch (in place of the update's :meth:`FleetEngine.check_logprobs`): the reported
  log-probs are compared as above, and each server's completions are tested as samples of the policy (their
  likelihood against its entropy, and repeats). A server that fails is dropped and its rows leave the batch
  before the step.
* **Under torchrun** every learner rank samples its share from the whole fleet; rank 0 alone holds
  the weight-transfer groups and pushes (the ranks' weights are identical after each update; an
  FSDP model is gathered on every rank, a collective), and every rank waits at a barrier until the
  push has landed.
* **A server that dies** (a request or a sync fails — connection refused or reset, time-outs after
  the retries, a 5xx answer — and ``GET /health`` no longer answers 200) is reported once (a
  :class:`ServerLostWarning` naming it, the error and how many servers remain) and dropped: its
  unfinished rows go to the other servers, later syncs skip it, and the run continues on the
  others; it is not taken back (restarted, it would hold its initial weights). With no server left,
  :class:`FleetError` stops the call (the command line then saves its checkpoint). A server that is
  up but fails a request or refuses the weights raises that error: another server would fail alike.

A server that is not an llmgym rollout server — a plain ``vllm serve``, another OpenAI-compatible
API — is refused at construction (:class:`NotARolloutServerError`): it cannot take the learner's
weights (use :class:`~llmgym.engines.openai_api.OpenAIEngine` for evaluation there).

Example:
    >>> from llmgym.fleet.fleet_engine import FleetEngine, FleetError
    >>> try:
    ...     FleetEngine(["http://127.0.0.1:9"], tokenizer=None, max_retries=0, timeout=2)
    ... except FleetError as err:
    ...     print(str(err)[:57])
    no OpenAI-compatible server answers at http://127.0.0.1:9
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import os
import queue
import re
import threading
import time
import urllib.parse
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from llmgym.errors import LLMGymError, LLMGymWarning
from llmgym.runtime import distributed
from llmgym.runtime.secrets import register_secret
from llmgym.engines.base import Completion, SamplingParams, expand_rows
from llmgym.fleet.guard import CONTROL_ROUTES, INSTANCE_HEADER, control_key, generation_key, signed_request
from llmgym.fleet.weight_transfer import DEFAULT_BUCKET_BYTES, GlooSender, TransferError, local_address_towards

__all__ = ["FleetEngine", "FleetError", "NotARolloutServerError", "PROBE_TOKENS", "ServerLostWarning",
           "UntrustedServerWarning", "api_root"]


class FleetError(LLMGymError, ConnectionError):
    """The fleet cannot go on: no server left, a server that does not answer at start, or a server whose
    weights are not the version the fleet gave it."""


class NotARolloutServerError(FleetError):
    """The server answers, but cannot take a learner's weights (not started with ``llmgym serve``)."""


class ServerLostWarning(LLMGymWarning):
    """A rollout server stopped answering; the fleet goes on without it."""


class UntrustedServerWarning(ServerLostWarning):
    """A rollout server's log-probs are not the learner's (after a sync, or in a batch): the fleet drops it."""


PROBE_TOKENS = 32
"""Length of the random token sequence whose log-probs each server is asked for after every sync."""


def api_root(url: str) -> tuple[str, str]:
    """``(root, api)``: the server's root URL and its OpenAI API root (``.../v1``), from either.

    Example:
        >>> from llmgym.fleet.fleet_engine import api_root
        >>> api_root("http://10.0.0.2:8000/v1/")
        ('http://10.0.0.2:8000', 'http://10.0.0.2:8000/v1')
        >>> api_root("http://10.0.0.2:8000")[1]
        'http://10.0.0.2:8000/v1'
    """
    if not isinstance(url, str):
        raise ValueError(f"a server URL must be a string like http://HOST:PORT, got {url!r}")
    text = url.strip().rstrip("/")
    parsed = urllib.parse.urlparse(text)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"server URL {url!r}: give http://HOST:PORT (optionally ending in /v1)")
    root = text[: -len("/v1")] if text.endswith("/v1") else text
    return root, root + "/v1"


_ADAPTER_NAME = re.compile(r"llmgym-v[0-9]{1,12}")


def _adapter_names(models: Any) -> list[str]:
    """The learner adapters (``llmgym-v<N>``) in a ``/v1/models`` reply."""
    data = models.get("data") if isinstance(models, dict) else None
    return [m["id"] for m in data or [] if isinstance(m, dict) and isinstance(m.get("id"), str)
            and _ADAPTER_NAME.fullmatch(m["id"])]


def _base_model(url: str, key: str | None, timeout: float) -> str | None:
    """The one model of a rollout server that is not a learner's adapter, or ``None``."""
    from llmgym.engines.bounded_http import bounded_http_client

    with bounded_http_client(timeout) as http:
        try:
            reply = http.get(api_root(url)[1] + "/models", headers={"Authorization": f"Bearer {key}"} if key else {},
                             timeout=30).json()
        except Exception:  # noqa: BLE001 (the caller's error says what the server serves)
            return None
    names = [m.get("id") for m in (reply.get("data") or []) if isinstance(m, dict)] if isinstance(reply, dict) else []
    base = [n for n in names if isinstance(n, str) and not _ADAPTER_NAME.fullmatch(n)]
    return base[0] if len(base) == 1 else None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


class _Server:
    """One rollout server: its sampling client, its control-plane client and its weight link."""

    def __init__(self, url: str, client: Any, http: Any, secret: str | None = None, api_key: str | None = None):
        self.root, self.api = api_root(url)
        self.client, self.http = client, http
        self._key = control_key(secret) if secret else None  # control requests are signed with it, never sent
        key = api_key or generation_key(secret)
        self._generation = {"Authorization": f"Bearer {key}"} if key else {}
        self.host = urllib.parse.urlparse(self.root).hostname
        self.link: GlooSender | None = None
        self.world_size = 1
        self.lost: str | None = None
        self.untrusted = False  # dropped for what it answered (not for dying): its rows leave every batch
        self.rows_served = 0
        self.instance: str | None = None  # the server process's INSTANCE_HEADER: control requests are signed for it

    def call(self, method: str, path: str, *, timeout: float | None = None, **kwargs) -> Any:
        """A control-plane request; the JSON reply (``None`` for an empty one). Raises ``FleetError``."""
        import httpx

        if timeout is not None:  # (httpx reads an explicit None as "no time limit")
            kwargs["timeout"] = timeout
        target, kwargs["headers"] = path, self._generation if path.startswith("/v1/") else {}
        signed = (method.upper(), path) in CONTROL_ROUTES and self._key is not None
        params, body = (kwargs.pop("params", None), kwargs.pop("json", None)) if signed else (None, None)
        for attempt in range(2):
            if signed:  # signed afresh, for this server process: no replay, here or at another server
                if self.instance is None:
                    self._learn_instance(timeout)
                target, kwargs["headers"], kwargs["content"] = signed_request(
                    self._key, method, path, params, body, instance=self.instance or "")
            try:
                response = self.http.request(method, self.root + target, **kwargs)
            except httpx.HTTPError as exc:
                raise FleetError(f"{self.root}{path}: {type(exc).__name__}: {_one_line(exc)}") from None
            now = response.headers.get(INSTANCE_HEADER)
            if not (signed and response.status_code == 401 and now and now != self.instance and attempt == 0):
                break
            self.instance = now  # the server restarted (a new process): sign for it once more
        if response.status_code == 404:
            raise NotARolloutServerError(
                f"the server at {self.root} has no {path} route: it is not an llmgym rollout server (start it with "
                f"`llmgym serve --model DIR`, which turns on vLLM's weight-update routes); a plain OpenAI-compatible "
                f"server cannot take the learner's weights (use OpenAIEngine for evaluation)")
        if response.status_code == 401:
            raise FleetError(
                f"the server at {self.root} refused {path} (HTTP 401: {response.text[:200]!r}): give the learner the "
                f"server's secret (the LLMGYM_SERVE_SECRET environment variable, or FleetEngine(secret=...))")
        if response.status_code >= 400:
            raise FleetError(f"{self.root}{path} answered HTTP {response.status_code}: {response.text[:300]!r}")
        if not response.content:
            return None
        if path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            return None  # vLLM answers these with a line of text
        try:
            return response.json()
        except ValueError:
            raise FleetError(f"{self.root}{path} answered something that is not JSON: {response.text[:200]!r}") from None

    def _learn_instance(self, timeout: float | None) -> None:
        """The server process's instance (:data:`~llmgym.fleet.guard.INSTANCE_HEADER`, on every guarded answer)."""
        import httpx

        try:
            self.instance = self.http.get(self.root + "/health", timeout=timeout or 30).headers.get(INSTANCE_HEADER)
        except httpx.HTTPError as exc:
            raise FleetError(f"{self.root}/health: {type(exc).__name__}: {_one_line(exc)}") from None

    def alive(self) -> bool:
        """Whether the server answers ``GET /health`` with 200 (vLLM's engine is up) within a few seconds."""
        import httpx

        try:
            return self.http.get(self.root + "/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def weight_version(self) -> str:
        reply = self.call("GET", "/weight_info", timeout=30)
        version = reply.get("weight_version") if isinstance(reply, dict) else None
        if not isinstance(version, str) or len(version) > 100:
            raise FleetError(f"{self.root}/weight_info answered {str(reply)[:200]!r}, not a weight version")
        return version


class FleetEngine:
    """Sampling from N llmgym rollout servers, with the learner's weights pushed to all of them.

    Args:
        servers: the servers' URLs (``http://HOST:PORT``, with or without ``/v1``), each started with
            ``llmgym serve`` for the same model architecture as the learner's.
        tokenizer: the learner's tokenizer (decodes ``Completion.text``, gives the end-of-turn ids).
        model: the learner's model: when given, its weights are pushed now (policy version ``0``), so
            the servers sample the learner's policy from the first rollout.
        served_model: the model's name on the servers (default: each server's only model).
        max_concurrency: requests in flight per server.
        timeout, max_retries, api_key: per sampling request, as in
            :class:`~llmgym.engines.openai_api.OpenAIEngine`.
        sync_address: the address of this machine the servers reach for the weight transfer
            (default: the interface that routes to each server).
        sync_timeout_s: seconds one weight transfer (or forming its group) may take.
        bucket_bytes: the largest broadcast of a weight transfer (:mod:`llmgym.fleet.weight_transfer`).
        secret: the servers' secret (default: this process's ``LLMGYM_SERVE_SECRET``, as ``llmgym serve``'s): it
            signs every control request (it is never sent); the generation key derives from it unless ``api_key``.
        logprob_tolerance: the largest mean |server log-prob − learner log-prob| (nats per token) a server
            may show — on a random probe sequence after every sync, and on the tokens of each batch it
            sampled (:meth:`check_logprobs`) — before the fleet drops it as not holding the learner's
            weights (:class:`UntrustedServerWarning`). An fp32 server is within ~1e-6 of an fp32 learner;
            a bf16 one within a few hundredths.
        token_tolerance: the largest |server log-prob − learner log-prob| (nats) on any one token, probe or
            batch: a mean over many tokens would let a server lie by a lot on a few of them.

    Raises:
        FleetError: a server does not answer, or answers something that is not an OpenAI-compatible API.
        NotARolloutServerError: a server was not started with ``llmgym serve`` (or not for vLLM).
    """

    #: :func:`~llmgym.engines.base.sync_engine_weights` passes the policy version to :meth:`sync_weights`
    versioned_weights = True
    #: vLLM reports top-p log-probs under the nucleus-renormalised distribution (see llmgym.engines.vllm)
    top_p_renormalised_logprobs = True

    def __init__(self, servers: Sequence[str], tokenizer: Any, model: Any = None, *, served_model: str | None = None,
                 max_concurrency: int = 16, timeout: float = 120.0, max_retries: int = 2, api_key: str | None = None,
                 sync_address: str | None = None, sync_timeout_s: float = 120.0,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, secret: str | None = None, logprob_tolerance: float = 0.5,
                 token_tolerance: float = 5.0, lora_versions: int = 1):
        from llmgym.engines.bounded_http import bounded_http_client
        from llmgym.engines.openai_api import ModelNotServedError, OpenAIEngine, ServerError

        if isinstance(servers, str):
            servers = [servers]
        urls = [api_root(u)[0] for u in servers]
        if not urls:
            raise ValueError("FleetEngine needs at least one server URL")
        if len(set(urls)) != len(urls):
            raise ValueError(f"a server is listed twice: {', '.join(urls)}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if sync_timeout_s <= 0:
            raise ValueError(f"sync_timeout_s must be > 0, got {sync_timeout_s}")
        if not logprob_tolerance > 0:
            raise ValueError(f"logprob_tolerance must be > 0 (nats per token), got {logprob_tolerance}")
        if not token_tolerance >= logprob_tolerance:
            raise ValueError(f"token_tolerance must be >= logprob_tolerance ({logprob_tolerance}), got {token_tolerance}")
        if isinstance(lora_versions, bool) or not isinstance(lora_versions, int) or lora_versions < 1:
            raise ValueError(f"lora_versions must be a whole number >= 1 (max_staleness + 1), got {lora_versions!r}")
        self.lora_versions = lora_versions
        self._adapters: collections.OrderedDict[int, str] = collections.OrderedDict()  # version -> served name
        self._adapter_config: dict | None = None
        self._base_synced = False
        self.last_sync_bytes = 0
        self.token_tolerance = float(token_tolerance)
        secret = secret if secret is not None else (os.environ.get("LLMGYM_SERVE_SECRET") or None)
        register_secret(secret), register_secret(api_key)  # never written into rollouts.jsonl (llmgym/runtime/secrets.py)
        self.logprob_tolerance = float(logprob_tolerance)
        self.probe_gaps: dict[str, float] = {}  # the last sync's probe: mean |server - learner| per server
        self.batch_gaps: dict[str, float] = {}  # the last check_logprobs: the same over a batch's tokens
        # per generate call (the last 1024: the batches in flight, each multi-turn episode's turns), the hash of each
        # returned completion's (tokens, log-probs) -> (index of the server that sampled it, top-p, temperature)
        self._sampled_by: collections.deque[dict[int, tuple]] = collections.deque(maxlen=1024)
        self.sample_scores: dict[str, float] = {}  # the last screen_batch: Σ(log π + H) / its bound, per server
        self.tokenizer = tokenizer
        self.max_concurrency, self.sync_timeout_s, self.bucket_bytes = max_concurrency, sync_timeout_s, bucket_bytes
        self.sync_address = sync_address
        # under torchrun every rank samples, and rank 0 alone pushes the (identical) weights
        self.pushes_weights = distributed.rank() == 0
        self.servers: list[_Server] = []
        self.policy_version: int | None = None
        self.weight_syncs = 0
        self.last_sync_s = 0.0
        self._busy = threading.Lock()  # one generate or sync at a time: a batch never straddles a sync
        self._state = threading.Lock()  # the servers' lost flags, set from worker threads
        self._unreported: list[tuple[str, type]] = []
        try:
            for url in urls:
                def client_for(name):
                    return OpenAIEngine(api_root(url)[1], name, tokenizer, api_key=api_key or generation_key(secret),
                                        timeout=timeout, max_retries=max_retries, max_concurrency=max_concurrency,
                                        prompt_format="token_ids")

                try:
                    try:
                        client = client_for(served_model)
                    except ModelNotServedError:
                        base = None if served_model else _base_model(url, api_key or generation_key(secret), timeout)
                        if base is None:
                            raise
                        client = client_for(base)  # the others are a learner's adapters (llmgym-v<N>)
                except ServerError as exc:
                    raise FleetError(str(exc)) from None
                except ModelNotServedError as exc:
                    raise FleetError(str(exc)) from None
                # the control plane is bounded like sampling: one deadline per call (not per read), a size cap,
                # no compressed reply, no redirect (a 300 KB gzip reply to /weight_info took 1.5 GB before)
                server = _Server(url, client, bounded_http_client(timeout), secret=secret, api_key=api_key)
                server.base_model = client.model  # the base model's name; an adapter version is served by its own
                self.servers.append(server)
                if not client.server_is_vllm:
                    raise NotARolloutServerError(f"the server at {server.root} is not vLLM (its model list does not "
                                                 f"say owned_by 'vllm'): a rollout server is `llmgym serve`")
                server.weight_version()  # 404 here: a plain server, not an llmgym rollout server
                size = server.call("GET", "/get_world_size", params={"include_dp": "true"}, timeout=30)
                world = size.get("world_size") if isinstance(size, dict) else None
                if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= 4096:
                    raise FleetError(f"{server.root}/get_world_size answered {str(size)[:200]!r}, not a world size")
                server.world_size = world
            first = self.servers[0].client
            self.pad_id, self.eos_ids = first.pad_id, first.eos_ids
            if self.pushes_weights:
                for server in self.servers:  # adapters an earlier learner left adapted other weights: unloaded
                    for name in _adapter_names(server.call("GET", "/v1/models", timeout=30)):
                        server.call("POST", "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=30)
                self._connect_all()
            if model is not None:
                self.sync_weights(model, version=0)
        except BaseException:
            self.close()
            raise

    # -- the fleet ----------------------------------------------------------------------------------
    @property
    def live(self) -> list[str]:
        """URLs of the servers still in the fleet."""
        return [s.root for s in self.servers if s.lost is None]

    @property
    def lost(self) -> dict[str, str]:
        """``{url: why}`` of the servers the fleet dropped."""
        return {s.root: s.lost for s in self.servers if s.lost is not None}

    def server_versions(self) -> dict[str, str]:
        """``{url: weight version}`` as each live server reports it (``/weight_info``; ``"default"`` before
        any sync)."""
        return {s.root: s.weight_version() for s in self.servers if s.lost is None}

    def rows_served(self) -> dict[str, int]:
        """``{url: rows sampled}`` per server since the engine was made (how the load was spread)."""
        return {s.root: s.rows_served for s in self.servers}

    def _report(self) -> None:
        with self._state:
            messages, self._unreported = self._unreported, []
        for message, category in messages:
            warnings.warn(message, category, stacklevel=3)

    def _live_servers(self) -> list[_Server]:
        self._report()
        live = [s for s in self.servers if s.lost is None]
        if not live:
            reasons = "; ".join(f"{url}: {why}" for url, why in self.lost.items())
            raise FleetError(f"every rollout server is lost ({reasons}): restart them and resume the run")
        return live

    def _lose(self, server: _Server, why: str, untrusted: bool = False) -> None:
        """Drop ``server`` (any thread); the calling thread of ``generate``/``sync_weights`` reports it."""
        with self._state:
            if server.lost is not None:
                return
            server.lost, server.untrusted = why, untrusted
            left = sum(s.lost is None for s in self.servers)
            what = "is not trusted" if untrusted else "is lost"
            self._unreported.append((f"rollout server {server.root} {what} ({why}); continuing on {left} of "
                                     f"{len(self.servers)} servers",
                                     UntrustedServerWarning if untrusted else ServerLostWarning))
        if server.link is not None:
            with contextlib.suppress(Exception):
                server.link.close()
            server.link = None

    def _connect(self, server: _Server) -> None:
        address = self.sync_address or local_address_towards(server.host)
        link = GlooSender(address, world_size=1 + server.world_size, timeout_s=self.sync_timeout_s,
                          bucket_bytes=self.bucket_bytes)
        info = link.rendezvous()
        # the server's workers join inside /init_weight_transfer_engine while this end waits for them; a
        # server that refuses answers at once, so its answer is not left waiting behind the group's time-out
        pool = ThreadPoolExecutor(2)
        try:
            joined = pool.submit(link.join)
            answered = pool.submit(server.call, "POST", "/init_weight_transfer_engine", json={"init_info": info},
                                   timeout=self.sync_timeout_s + 30)
            concurrent.futures.wait([joined, answered], return_when=concurrent.futures.FIRST_EXCEPTION)
            refused = answered.exception() if answered.done() else None
            if refused is not None:
                if "Weight transfer not configured" in str(refused) or "Invalid weight transfer backend" in str(refused):
                    raise NotARolloutServerError(
                        f"the server at {server.root} was started without llmgym's weight transfer (start it with "
                        f"`llmgym serve --model DIR`): {refused}") from None
                raise refused
            try:
                joined.result()
            except TransferError as exc:
                raise FleetError(f"{server.root}: {exc}") from None
            answered.result()
        except BaseException:
            with contextlib.suppress(Exception):
                link.close()
            raise
        finally:
            pool.shutdown(wait=False)  # a join the server abandoned ends at its time-out
        server.link = link

    def _connect_all(self) -> None:
        with ThreadPoolExecutor(len(self.servers)) as pool:
            for future in [pool.submit(self._connect, s) for s in self.servers]:
                future.result()

    # -- weights ------------------------------------------------------------------------------------
    def sync_weights(self, model: Any, *, version: int | None = None) -> None:
        """Push ``model``'s weights (a ``transformers`` model, DDP/FSDP-wrapped or not) to every live server
        and record them there as policy ``version`` (default: one more than the last).

        A server that fails during the sync is dropped (:class:`ServerLostWarning`); the others get
        the weights.

        A model with ``peft`` LoRA adapters injected (servers started with ``llmgym serve --lora-r N``) sends
        the frozen base weights once, then only the adapter: its tensors over the same weight transfer (kept in
        the server's memory), registered as the served adapter ``llmgym-v<version>`` (``/v1/load_lora_adapter``,
        a control route) and sampled by name from then on, so every completion names the adapter that sampled
        it; the versions beyond the newest ``lora_versions`` are unloaded. A server without the adapter answers
        an error, never the base model. The probe after the sync compares the server's log-probs under the
        adapter with the learner's.
        """
        from llmgym.engines.lora import adapter_config, has_lora, split_lora_state

        module = getattr(model, "module", model)
        pairs = []
        for name, tensor in module.state_dict().items():
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor  # FSDP2 DTensors
            pairs.append((name, full.detach()))
        if has_lora(dict(pairs)):
            base, adapter = split_lora_state(dict(pairs))
            config = adapter_config(module) or self._adapter_config
            if config is None:
                raise ValueError("FleetEngine.sync_weights got LoRA tensors without their peft config (the model's "
                                 "peft_config): pass the peft-injected model")
            self._adapter_config = config
            with self._busy:
                if version is None:
                    version = 0 if self.policy_version is None else self.policy_version + 1
                if not self._base_synced:  # the frozen base weights travel once
                    self._sync(list(base.items()), None, int(version))
                self._sync(list(adapter.items()), config, int(version), model=model)
            return
        with self._busy:
            if version is None:
                version = 0 if self.policy_version is None else self.policy_version + 1
            self._sync(pairs, None, int(version), model=model)
            self._base_synced = True
            self._release_adapters(keep=0)  # adapters of the old base weights: unloaded, not just forgotten
            for server in self.servers:
                server.client.model = server.base_model

    def _sync(self, pairs, lora_config: dict | None, version: int, model: Any = None) -> None:
        """Push ``pairs`` to every live server as ``version`` (an adapter when ``lora_config`` is given), then
        verify against ``model`` (none: base weights under an adapter still to come)."""
        started = time.perf_counter()
        name = f"llmgym-v{int(version)}" if lora_config is not None else None
        if self.pushes_weights:
            update_info = {"names": [n for n, _ in pairs],
                           "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in pairs],
                           "shapes": [list(t.shape) for _, t in pairs]}
            if name is not None:
                update_info.update(lora_name=name, lora_config=lora_config)
            live = self._live_servers()
            with ThreadPoolExecutor(len(live)) as pool:
                outcomes = list(pool.map(lambda s: self._push(s, pairs, update_info, int(version), name), live))
            for server, error in zip(live, outcomes):
                if error is not None and server.alive():
                    raise FleetError(f"the server at {server.root} refused the {'adapter' if name else 'weights'} "
                                     f"of version {version}: {error}")
                if error is not None:
                    self._lose(server, error)
            # what the gloo broadcast carried to one server (each gets the same), measured at the sender
            self.last_sync_bytes = max((s.link.bytes_sent for s in live if s.link is not None), default=0)
        if name is not None:
            for server in self.servers:
                server.client.model = name  # every completion from now on names the adapter that sampled it
            self._adapters.pop(int(version), None)
            self._adapters[int(version)] = name
            self._release_adapters()
        if self.pushes_weights and model is not None:
            self._verify(self._live_servers(), model, int(version))
            self._live_servers()  # none left: FleetError
        distributed.barrier()  # no rank samples before rank 0's push has landed
        if model is None:
            self._base_synced = True
            return
        self.policy_version = int(version)
        self.weight_syncs += 1
        self.last_sync_s = time.perf_counter() - started

    def _release_adapters(self, keep: int | None = None) -> None:
        """Unload the adapter versions beyond the newest ``keep`` (default ``lora_versions``) from every live
        server."""
        keep = self.lora_versions if keep is None else keep
        while len(self._adapters) > keep:
            _, old = self._adapters.popitem(last=False)
            if not self.pushes_weights:
                continue
            for server in self.servers:
                if server.lost is None:
                    with contextlib.suppress(FleetError):
                        server.call("POST", "/v1/unload_lora_adapter", json={"lora_name": old},
                                    timeout=self.sync_timeout_s)

    def _push(self, server: _Server, pairs, update_info: dict, version: int, adapter: str | None = None) -> str | None:
        """One server's weight update (an adapter's, named ``adapter``: then loaded from the server's memory as
        a served adapter once the transfer ends); ``None`` when it took them, else why it failed."""
        paused = False
        try:
            server.call("POST", "/pause", params={"mode": "wait"}, timeout=self.sync_timeout_s)
            paused = True
            server.call("POST", "/start_weight_update", timeout=self.sync_timeout_s)
            error = self._transfer(server, pairs, update_info)
            if error is not None:
                return error
            server.call("POST", "/finish_weight_update", json={"weight_version": str(version)},
                        timeout=self.sync_timeout_s)
            if adapter is not None:
                from llmgym.fleet.weight_transfer import ADAPTER_PATH_PREFIX

                if adapter in self._adapters.values():  # a version synced again (the pipeline, a resume): replaced
                    with contextlib.suppress(FleetError):
                        server.call("POST", "/v1/unload_lora_adapter", json={"lora_name": adapter},
                                    timeout=self.sync_timeout_s)
                server.call("POST", "/v1/load_lora_adapter", timeout=self.sync_timeout_s,
                            json={"lora_name": adapter, "lora_path": ADAPTER_PATH_PREFIX + adapter})
            server.call("POST", "/resume", timeout=self.sync_timeout_s)
            paused = False
            return None
        except NotARolloutServerError:
            raise
        except (FleetError, TransferError, OSError) as exc:
            return _one_line(exc)
        finally:
            if paused:
                with contextlib.suppress(Exception):
                    server.call("POST", "/resume", timeout=10)

    def _transfer(self, server: _Server, pairs, update_info: dict) -> str | None:
        """Broadcast the weights while the server receives them inside ``/update_weights``; ``None`` when both
        ends finished, else why not. A server that answers the route with an error has stopped receiving:
        its answer is returned at once (gloo's send would wait out the whole time-out, then quote gloo); the
        abandoned send ends at that time-out in a daemon thread that drops the link."""
        link = server.link
        sent: concurrent.futures.Future = concurrent.futures.Future()

        def send() -> None:
            try:
                link.send(pairs)
                sent.set_result(None)
            except BaseException as exc:  # noqa: BLE001 (handed to the waiting thread)
                sent.set_exception(exc)

        sender = threading.Thread(target=send, name=f"llmgym-weights-{server.root}", daemon=True)
        pool = ThreadPoolExecutor(1)
        try:
            receiving = pool.submit(server.call, "POST", "/update_weights", json={"update_info": update_info},
                                    timeout=self.sync_timeout_s)
            sender.start()
            concurrent.futures.wait([receiving, sent], return_when=concurrent.futures.FIRST_COMPLETED)
            if receiving.done() and receiving.exception() is not None and not sent.done():
                server.link = None  # cut: the group cannot be reused (its close would wait out the send)
                threading.Thread(target=lambda: (sent.exception(), link.close()), daemon=True).start()
                raise receiving.exception()
            try:
                sent.result()
            except TransferError as exc:
                with contextlib.suppress(Exception):
                    receiving.result()
                return str(exc)
            receiving.result()
            return None
        finally:
            pool.shutdown(wait=False)

    # -- trust: nothing a server supplies is used unchecked (llmgym.fleet.trust) ----------------------
    def _verify(self, live: list[_Server], model: Any, version: int) -> None:
        from llmgym.fleet import trust

        trust.verify_probe(self, live, model, version, PROBE_TOKENS)

    def check_logprobs(self, batch: Any, learner_logprobs: Any, version: int | None = None) -> dict[str, float]:
        """Compare the log-probs the servers reported for ``batch``'s tokens (``batch.old_logprobs``) with the
        learner's recomputation (``learner_logprobs``, ``[N, L-1]`` as the batch's per-token tensors), on the
        tokens sampled by ``version`` (default: every token). With ``top_p < 1`` a server reports the log-prob
        under the renormalised nucleus; the learner adds its own log kept mass to it before this check
        (:mod:`llmgym.agents.truncation`), so no gap is excused. A server whose mean
        gap is over :attr:`logprob_tolerance` (or one token's over :attr:`token_tolerance`) is dropped
        (:class:`UntrustedServerWarning`); with none left, :class:`FleetError`. Returns ``{url: mean gap}``."""
        from llmgym.fleet import trust

        return trust.check_logprobs(self, batch, learner_logprobs, version)

    def screen_batch(self, batch: Any, scores: Any) -> list[bool]:
        """Check every server's log-probs *and samples* in ``batch`` against the learner's ``scores`` before the
        batch is used (:func:`llmgym.fleet.trust.screen_batch`); drop the servers that fail; return per row
        whether it stays (its servers are all trusted); ``scores``: :class:`llmgym.fleet.trust.TokenScores`. With
        none left, :class:`FleetError`."""
        from llmgym.fleet import trust

        return trust.screen_batch(self, batch, scores)

    # -- sampling -----------------------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams | None = None,
        *,
        keys: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """Sample ``sampling.n`` completions for every prompt; see :class:`~llmgym.engines.Engine`.

        Every completion's ``policy_version`` is the fleet's :attr:`policy_version`."""
        sampling, prompts, rows, keys = expand_rows(prompt_ids, sampling, keys)
        if not prompts:
            return []
        with self._busy:
            version = self.policy_version
            flat: list[Completion | None] = [None] * len(rows)
            origin: list[int] = [-1] * len(rows)
            pending = list(range(len(rows)))
            used: set[int] = set()
            while pending:
                live = self._live_servers()
                pending = self._sample_round(live, rows, keys, sampling, pending, flat, used, origin)
            for i in sorted(used):
                server = self.servers[i]
                if server.lost is None and version is not None:
                    try:
                        held = server.weight_version()
                    except FleetError as exc:
                        self._lose(server, _one_line(exc))
                        continue
                    if held != str(version):
                        raise FleetError(f"the server at {server.root} holds weight version {held!r}, not the "
                                         f"{version} this fleet synced: is another learner pushing to it?")
            self._report()
        sampled_by = {}  # which server sampled which completion (and its top-p), for check_logprobs
        for c, server in zip(flat, origin):
            c.policy_version = version
            sampled_by[hash((tuple(c.token_ids), tuple(c.logprobs)))] = (server, float(sampling.top_p),
                                                                          float(sampling.temperature))
        self._sampled_by.append(sampled_by)
        return [flat[i * sampling.n:(i + 1) * sampling.n] for i in range(len(prompts))]

    def _sample_round(self, live: list[_Server], rows, keys, sampling, pending: list[int], flat: list,
                      used: set[int], origin: list[int]) -> list[int]:
        """Sample the ``pending`` rows on the ``live`` servers; the rows a lost server left undone."""
        import openai

        from llmgym.engines.openai_api import ServerError

        # the rows of one prompt (a group) go to one server: a server found untrusted takes its whole groups out
        # of the batch (llmgym.agents.screening), not a share of every group
        todo: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
        groups: dict[tuple[int, ...], list[int]] = {}
        for i in pending:
            groups.setdefault(tuple(rows[i]), []).append(i)
        for group in groups.values():
            todo.put(group)
        taken = {id(s): collections.deque() for s in live}  # the rows of the groups each server took
        undone: list[int] = []
        guard = threading.Lock()

        def work(server: _Server) -> None:
            index, own = self.servers.index(server), taken[id(server)]
            while server.lost is None:
                with guard:
                    if not own:
                        try:
                            own.extend(todo.get_nowait())
                        except queue.Empty:
                            return
                    i = own.popleft()
                try:
                    flat[i] = server.client.sample_row(rows[i], sampling, keys[i])
                except (ServerError, openai.InternalServerError) as exc:
                    if server.alive():  # the server is up: the request itself failed, which another would too
                        raise
                    with guard:
                        undone.append(i)
                    self._lose(server, _one_line(exc))
                    return
                with guard:
                    server.rows_served += 1
                    used.add(index)
                    origin[i] = index

        # workers started server by server in turn, no more per server than its share of the rows: a small
        # batch is spread over every server rather than taken by the first one's workers
        per_server = min(self.max_concurrency, -(-len(pending) // len(live)))
        with ThreadPoolExecutor(per_server * len(live)) as pool:
            futures = [pool.submit(work, s) for _ in range(per_server) for s in live]
            for future in futures:
                future.result()
        while True:  # rows still queued when their server's workers stopped
            try:
                undone.extend(todo.get_nowait())
            except queue.Empty:
                break
        return sorted(undone + [i for own in taken.values() for i in own])

    def close(self) -> None:
        """Release the weight-transfer groups (the servers keep running) and the HTTP connections."""
        for server in getattr(self, "servers", []):
            if server.link is not None:
                if server.lost is None:
                    with contextlib.suppress(Exception):
                        server.call("POST", "/shutdown_weight_transfer_engine", timeout=10)
                with contextlib.suppress(Exception):
                    server.link.close()
                server.link = None
            with contextlib.suppress(Exception):
                server.client.close()
            with contextlib.suppress(Exception):
                server.http.close()

    def __enter__(self) -> FleetEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FleetEngine({self.live!r}, policy_version={self.policy_version})"
