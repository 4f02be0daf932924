"""The door of a rollout server: only the routes a fleet uses, and its control routes behind a secret.

``llmgym serve`` runs vLLM's API server with its RL routes on (``VLLM_SERVER_DEV_MODE=1``); that
switch also turns on vLLM's development routes — ``/collective_rpc`` (any worker method, any
arguments: a file of the caller's choosing written anywhere), ``/weight_checker`` (``reset`` zeroes
the weights), ``/update_weight_version`` (forges the version), ``/sleep``, ``/reset_prefix_cache``
… — and vLLM's ``--api-key`` guards ``/v1`` only. :class:`ControlPlaneGuard` is the ASGI middleware
``llmgym serve`` installs (vLLM's ``--middleware``; it is the outermost of vLLM's own layers):

* an **allow-list** (:data:`ROUTES`): a request for any other method and path is answered 404 before
  vLLM sees it — a route vLLM adds in a later release stays closed until it is listed here;
* the **control routes** (:data:`CONTROL_ROUTES`: weight transfer, pause/resume, the weight version
  and world size reads) need a **signed request** (:func:`sign`): an HMAC-SHA256, under a key derived
  from the secret, of the method, path, query, the body's digest, a timestamp and a fresh nonce, in
  the ``X-LLMGym-Signature`` header. The guard refuses a missing or wrong signature, a timestamp more
  than :data:`MAX_SKEW_S` seconds from its clock, and a nonce it has already seen (it remembers every
  nonce while its timestamp is fresh): a captured request is useless, sent again or altered, and
  the secret itself never crosses the network. There is no guard without a secret (``llmgym serve``
  refuses to start without one, on loopback too);
* generation (``/v1/...``) is vLLM's ``--api-key``: by default :func:`generation_key` of the secret
  (a bearer key replays by construction, so it is not the secret the control routes are signed
  with); ``/health`` is open (it says only whether the engine is up);
* the LoRA routes (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``: the adapter sync of
  ``llmgym serve --lora-r``) are control routes: they need the secret, and once it is checked the guard
  hands vLLM's ``--api-key`` check the generation key (``VLLM_API_KEY``) in its place.

The secret is handed over in process (:func:`configure`, called by ``llmgym serve`` before vLLM
builds its app), never on a command line (``ps`` shows those to every user of the machine).

Example:
    >>> from llmgym.fleet.guard import allowed
    >>> allowed("POST", "/update_weights"), allowed("POST", "/collective_rpc"), allowed("GET", "/v1/models")
    ('control', None, 'open')
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
import urllib.parse

__all__ = ["CONTROL_ROUTES", "ControlPlaneGuard", "INSTANCE_HEADER", "MAX_CONTROL_BODY_BYTES", "MAX_SKEW_S", "OPEN_ROUTES", "ROUTES",
           "SIGNATURE_HEADER", "allowed", "configure", "control_key", "generation_key", "sign", "signed_request"]

SIGNATURE_HEADER = "X-LLMGym-Signature"
INSTANCE_HEADER = "X-LLMGym-Instance"
"""The header every answer of a guarded server carries: the server process's instance, a random value drawn when it
starts. A control request's signature covers it, so a request signed for one server process is refused by every
other: another server of the fleet (one secret for all), or the same server restarted (its nonces forgotten)."""
"""The header of a signed control request: ``v1 t=<unix seconds> n=<32 hex nonce> d=<64 hex SHA-256 of the body>
s=<64 hex HMAC-SHA256>``: the body's digest is signed and named, so the signature is checked before the body is read."""
MAX_SKEW_S = 120
"""How far (seconds) a control request's timestamp may be from the server's clock: the learner's and the
servers' clocks must agree that well (NTP); a nonce is remembered this long on either side of now."""
MAX_CONTROL_BODY_BYTES = 16 << 20
"""The largest control request body the guard reads to check its digest (a weight update's metadata)."""
_MAX_NONCES = 1 << 18  # remembered nonces (fresh ones only): a learner sends a few per second
_PRUNE_AT = 4096
_SIGNATURE = re.compile(r"v1 t=([0-9]{1,12}) n=([0-9a-f]{32}) d=([0-9a-f]{64}) s=([0-9a-f]{64})")

CONTROL_ROUTES = frozenset({
    ("POST", "/init_weight_transfer_engine"), ("POST", "/shutdown_weight_transfer_engine"),
    ("POST", "/start_weight_update"), ("POST", "/update_weights"), ("POST", "/finish_weight_update"),
    ("POST", "/pause"), ("POST", "/resume"), ("GET", "/weight_info"), ("GET", "/get_world_size"),
    ("POST", "/v1/load_lora_adapter"), ("POST", "/v1/unload_lora_adapter"),
})
"""What the learner's :class:`~llmgym.fleet.fleet_engine.FleetEngine` calls to push weights: behind the secret."""

OPEN_ROUTES = frozenset({
    ("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
})
"""Health and generation (``/v1`` is behind vLLM's ``--api-key``)."""

ROUTES = CONTROL_ROUTES | OPEN_ROUTES
"""Every route a rollout server answers; anything else is 404."""

_state: dict[str, bytes] = {}


def configure(secret: str) -> None:
    """Set the secret the control routes' signatures are checked with; ``llmgym serve`` calls it before vLLM
    builds its app (a guard built without it refuses to start)."""
    if not isinstance(secret, str) or len(secret) < 16:
        raise ValueError("a rollout server's control secret must be at least 16 characters (e.g. openssl rand -hex 32)")
    _state["secret"] = control_key(secret)


def control_key(secret: str) -> bytes:
    """The HMAC key control requests are signed with (derived from the secret: the secret never travels).

    Example:
        >>> from llmgym.fleet.guard import control_key
        >>> len(control_key("0123456789abcdef")), control_key("0123456789abcdef") == control_key("0123456789abcdeg")
        (32, False)
    """
    return hmac.new(secret.encode(), b"llmgym control v1", hashlib.sha256).digest()


def generation_key(secret: str | None) -> str | None:
    """The API key of a rollout server's generation routes (``/v1``) by default: derived from the secret, so
    the bearer key a sampling request carries (and anyone who captures one reads) signs no control request
    (``None`` without a secret).

    Example:
        >>> from llmgym.fleet.guard import generation_key
        >>> key = generation_key("0123456789abcdef")
        >>> key.startswith("llmgym-"), len(key), "0123456789abcdef" in key
        (True, 71, False)
    """
    if not secret:
        return None
    return "llmgym-" + hmac.new(secret.encode(), b"llmgym generation v1", hashlib.sha256).hexdigest()


def _message(method: str, path: str, query: bytes, digest: str, stamp: str, nonce: str, instance: str) -> bytes:
    return b"\n".join([b"llmgym-control-v1", method.upper().encode(), path.encode("utf-8"), query,
                       digest.encode(), stamp.encode(), nonce.encode(), instance.encode("ascii", "replace")])


def sign(key: bytes, method: str, path: str, query: bytes = b"", body: bytes = b"", *, now: float | None = None,
         nonce: str | None = None, instance: str = "") -> str:
    """The :data:`SIGNATURE_HEADER` value of one control request (``key``: :func:`control_key``) for the server
    process ``instance`` (its :data:`INSTANCE_HEADER`); a fresh nonce each call, so no two requests carry the same
    signature.

    Example:
        >>> from llmgym.fleet.guard import control_key, sign
        >>> header = sign(control_key("0123456789abcdef"), "POST", "/pause", b"mode=wait", now=1e9, nonce="0" * 32)
        >>> header[:50]
        'v1 t=1000000000 n=00000000000000000000000000000000'
    """
    stamp, nonce = str(int(time.time() if now is None else now)), nonce or secrets.token_hex(16)
    body_digest = hashlib.sha256(body).hexdigest()
    digest = hmac.new(key, _message(method, path, query, body_digest, stamp, nonce, instance), hashlib.sha256).hexdigest()
    return f"v1 t={stamp} n={nonce} d={body_digest} s={digest}"


def signed_request(key: bytes, method: str, path: str, params: dict | None = None,
                   body: object = None, instance: str = "") -> tuple[str, dict[str, str], bytes]:
    """``(target, headers, content)`` of a signed control request for the server process ``instance`` (its
    :data:`INSTANCE_HEADER`): ``target`` is ``path`` with its query (``params``, encoded as signed), ``content``
    the JSON ``body`` (or nothing).

    Example:
        >>> from llmgym.fleet.guard import control_key, signed_request
        >>> key = control_key("0123456789abcdef")
        >>> target, headers, content = signed_request(key, "POST", "/pause", {"mode": "wait"})
        >>> target, sorted(headers), content
        ('/pause?mode=wait', ['X-LLMGym-Signature'], b'')
    """
    query = urllib.parse.urlencode(params or {}).encode()
    content = b"" if body is None else json.dumps(body).encode()
    headers = {SIGNATURE_HEADER: sign(key, method, path, query, content, instance=instance)}
    if body is not None:
        headers["Content-Type"] = "application/json"
    return (path + "?" + query.decode() if query else path), headers, content


class _Nonces:
    """The nonces of the signed requests this server took while their timestamps are fresh (a replay is one
    seen again; an older one is refused by its timestamp)."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()

    def take(self, nonce: str, stamp: int, now: float) -> str | None:
        """``None`` when ``nonce`` is new (it is remembered), else why it is refused."""
        with self.lock:
            if nonce in self.seen:
                return "this signed request was already used (a replay): every control request is signed afresh"
            if len(self.seen) >= _PRUNE_AT:  # forget those whose time has passed: the time check refuses them now
                self.seen = {n: t for n, t in self.seen.items() if now - t <= MAX_SKEW_S}
                if len(self.seen) >= _MAX_NONCES:
                    return "too many control requests in the last minutes: retry later"
            self.seen[nonce] = stamp
            return None


def allowed(method: str, path: str) -> str | None:
    """``"control"``, ``"open"``, or ``None`` (not a rollout server's route: 404)."""
    key = (method.upper(), path.rstrip("/") or "/")
    if key in CONTROL_ROUTES:
        return "control"
    if key in OPEN_ROUTES:
        return "open"
    return None


def _header(scope, wanted: bytes) -> str | None:
    for name, value in scope.get("headers") or ():
        if name.lower() == wanted:
            return value.decode("latin-1")
    return None


async def _read_body(receive) -> tuple[bytes | None, list]:
    """The request's body (``None``: over :data:`MAX_CONTROL_BODY_BYTES`) and the messages read for it."""
    parts, size, messages = [], 0, []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_CONTROL_BODY_BYTES:
            return None, messages
        parts.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(parts), messages


class ControlPlaneGuard:
    """ASGI middleware: the allow-list and the control routes' secret (see the module doc)."""

    def __init__(self, app) -> None:
        if "secret" not in _state:
            raise RuntimeError("ControlPlaneGuard is not configured: start the server with llmgym serve")
        self.app = app
        self.secret = _state["secret"]
        self.nonces = _Nonces()
        self.instance = secrets.token_hex(16)  # this server process: a signature for another is refused

    async def _check(self, scope, receive, method: str, path: str):
        """``(None, receive)`` for a well-signed, fresh, first-seen request (``receive`` hands the app the body
        read here), else ``(why, None)``."""
        found = _SIGNATURE.fullmatch((_header(scope, SIGNATURE_HEADER.lower().encode()) or "").strip())
        if found is None:
            return (f"this control route needs a signed request ({SIGNATURE_HEADER}: the learner's FleetEngine "
                    f"signs with the server's secret, LLMGYM_SERVE_SECRET)"), None
        stamp, nonce, body_digest, given = found.groups()
        now = time.time()
        if abs(now - int(stamp)) > MAX_SKEW_S:
            return (f"the request was signed {now - int(stamp):+.0f} s from this server's clock (more than "
                    f"{MAX_SKEW_S} s: a replay, or clocks apart; synchronise them, e.g. NTP)"), None
        query = scope.get("query_string", b"") or b""
        expected = hmac.new(self.secret, _message(method, path, query, body_digest, stamp, nonce, self.instance),
                            hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, given):
            return ("the request's signature is wrong (another secret, signed for another server or before this one "
                    f"restarted ({INSTANCE_HEADER}), or the request was altered)"), None
        refused = self.nonces.take(nonce, int(stamp), now)
        if refused is not None:
            return refused, None
        # only a signed, fresh request's body is read (an unsigned one could make the guard hold 16 MB per connection)
        body, messages = (b"", []) if scope["type"] != "http" else await _read_body(receive)
        if body is None:
            return f"a control request body over {MAX_CONTROL_BODY_BYTES} bytes", None
        if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), body_digest):
            return "the request's body is not the one signed (the request was altered)", None
        pending = list(messages)

        async def replay():
            return pending.pop(0) if pending else await receive()

        return None, replay

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan: vLLM's start-up and shutdown
            await self.app(scope, receive, send)
            return
        instance = (INSTANCE_HEADER.lower().encode(), self.instance.encode())
        inner_send = send

        async def send(message):  # every answer names this server process (the learner signs for it)
            if message.get("type") == "http.response.start":
                message = dict(message, headers=[*(message.get("headers") or ()), instance])
            await inner_send(message)
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        kind = allowed(scope.get("method", "GET") if scope["type"] == "http" else "WEBSOCKET", path)
        if kind is None:
            await _answer(scope, send, 404, "Not Found")
            return
        if kind == "control":
            why, receive = await self._check(scope, receive, scope.get("method", "GET"), path)
            if why is not None:
                await _answer(scope, send, 401, why)
                return
            key = os.environ.get("VLLM_API_KEY")
            if path.startswith("/v1/") and key:  # vLLM's own --api-key check of /v1 comes next
                headers = [(n, v) for n, v in scope.get("headers") or () if n.lower() != b"authorization"]
                scope = dict(scope, headers=[*headers, (b"authorization", f"Bearer {key}".encode("latin-1"))])
        await self.app(scope, receive, send)


async def _answer(scope, send, status: int, message: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
