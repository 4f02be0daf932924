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
  and world size reads) need ``Authorization: Bearer <secret>``, compared in constant time; there is
  no guard without a secret (``llmgym serve`` refuses to start without one, on loopback too);
* generation (``/v1/...``) is vLLM's ``--api-key`` (``llmgym serve`` makes the secret that key when
  no other is given); ``/health`` is open (it says only whether the engine is up);
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

__all__ = ["CONTROL_ROUTES", "ControlPlaneGuard", "OPEN_ROUTES", "ROUTES", "allowed", "configure"]

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
    """Set the secret the control routes require; ``llmgym serve`` calls it before vLLM builds its app
    (a guard built without it refuses to start)."""
    if not isinstance(secret, str) or len(secret) < 16:
        raise ValueError("a rollout server's control secret must be at least 16 characters (e.g. openssl rand -hex 32)")
    _state["secret"] = hashlib.sha256(secret.encode()).digest()


def allowed(method: str, path: str) -> str | None:
    """``"control"``, ``"open"``, or ``None`` (not a rollout server's route: 404)."""
    key = (method.upper(), path.rstrip("/") or "/")
    if key in CONTROL_ROUTES:
        return "control"
    if key in OPEN_ROUTES:
        return "open"
    return None


def _bearer(scope) -> bytes | None:
    for name, value in scope.get("headers") or ():
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip().encode() if scheme.lower() == "bearer" else None
    return None


class ControlPlaneGuard:
    """ASGI middleware: the allow-list and the control routes' secret (see the module doc)."""

    def __init__(self, app) -> None:
        if "secret" not in _state:
            raise RuntimeError("ControlPlaneGuard is not configured: start the server with llmgym serve")
        self.app = app
        self.secret = _state["secret"]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan: vLLM's start-up and shutdown
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        kind = allowed(scope.get("method", "GET") if scope["type"] == "http" else "WEBSOCKET", path)
        if kind is None:
            await _answer(scope, send, 404, "Not Found")
            return
        if kind == "control":
            token = _bearer(scope)
            if token is None or not hmac.compare_digest(hashlib.sha256(token).digest(), self.secret):
                await _answer(scope, send, 401, "this control route needs the server's secret "
                                                "(Authorization: Bearer <LLMGYM_SERVE_SECRET>)")
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
