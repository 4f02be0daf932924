"""What a rollout server's door costs: signing and checking a control request, and forming a weight group.

* **signing** (the learner, :func:`llmgym.fleet.guard.signed_request`) and **checking** (the server's
  :class:`~llmgym.fleet.guard.ControlPlaneGuard`, called as vLLM calls its middleware, with a trivial app
  behind it) of a control request: an empty ``/pause`` and an ``/update_weights`` carrying the metadata of
  300 tensors; against a plain bearer-token check (hash and constant-time compare, what the guard did before);
* **forming a weight group** of the learner and one peer over loopback (``GlooSender.rendezvous`` + ``join``,
  the peer's ``open_group`` in a thread): the authenticated rendezvous (:mod:`llmgym.fleet.rendezvous`) against
  torch's ``TCPStore`` (the rendezvous before), rounds alternating.

Usage:
    python benchmarks/door_cost.py [--requests 2000] [--groups 10]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import hmac
import json
import os
import socket
import statistics
import threading
import time

import torch

from llmgym.fleet import guard
from llmgym.fleet.weight_transfer import GlooSender, metadata, open_group, receive_named_tensors

SECRET = "0123456789abcdef-bench"


async def _app(scope, receive, send):
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


class _Bearer:
    """The check before: ``Authorization: Bearer <secret>``, hashed and compared in constant time."""

    def __init__(self, app):
        self.app, self.digest = app, hashlib.sha256(SECRET.encode()).digest()

    async def __call__(self, scope, receive, send):
        token = dict(scope["headers"]).get(b"authorization", b"").partition(b" ")[2]
        if not hmac.compare_digest(hashlib.sha256(token).digest(), self.digest):
            raise AssertionError("refused")
        await self.app(scope, receive, send)


def _per_request(middleware, path: str, requests: list[tuple[list, bytes, bytes]]) -> float:
    statuses = []

    async def go():
        for headers, body, query in requests:
            given = [False]

            async def receive(body=body, given=given):
                if given[0]:
                    return {"type": "http.disconnect"}
                given[0] = True
                return {"type": "http.request", "body": body, "more_body": False}

            async def send(message):
                if message["type"] == "http.response.start":
                    statuses.append(message["status"])

            scope = {"type": "http", "method": "POST", "path": path, "query_string": query, "headers": headers}
            await middleware(scope, receive, send)

    start = time.perf_counter()
    asyncio.run(go())
    elapsed = (time.perf_counter() - start) / len(requests)
    if set(statuses) != {200}:
        raise RuntimeError(f"the guard refused a well-signed request: {sorted(set(statuses))}")
    return elapsed


def _tcpstore_group(info: dict, sender_socket: socket.socket, result: dict) -> None:
    """torch's TCPStore rendezvous (as before): the learner's store on its socket, the peer a client."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=30)

    def group(store, rank):
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        return dist.ProcessGroupGloo(dist.PrefixStore("llmgym-weights", store), rank, 2, options)

    def peer():
        store = dist.TCPStore("127.0.0.1", info["master_port"], 2, False, timeout)
        result["peer"] = (group(store, 1), store)

    thread = threading.Thread(target=peer)
    thread.start()
    store = dist.TCPStore("127.0.0.1", info["master_port"], 2, True, timeout,
                          master_listen_fd=sender_socket.detach(), use_libuv=False)
    result["host"] = (group(store, 0), store)
    thread.join()


def _form(kind: str) -> float:
    sender = GlooSender("127.0.0.1", world_size=2, timeout_s=30)
    info = sender.rendezvous()
    result: dict = {}
    start = time.perf_counter()
    if kind == "tcpstore":
        listener, sender._socket = sender._socket, None
        _tcpstore_group(info, listener, result)
        host_group = result["host"][0]
    else:
        thread = threading.Thread(target=lambda: result.update(peer=open_group(
            info["master_address"], info["master_port"], 1, 2, timeout_s=30, nonce=info["nonce"])))
        thread.start()
        sender.join()
        thread.join()
        host_group = sender.group
    elapsed = time.perf_counter() - start
    pairs = [("w", torch.ones(4))]  # the group carries weights
    receiver = threading.Thread(target=lambda: list(receive_named_tensors(result["peer"][0], metadata(pairs), 64)))
    receiver.start()
    host_group.broadcast(torch.ones(4).view(torch.uint8), 0).wait()
    receiver.join()
    for group in (host_group, result["peer"][0]):
        group.shutdown()
    sender.close()
    return elapsed


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--groups", type=int, default=10)
    args = parser.parse_args(argv)
    out: dict = {"load_average_before": os.getloadavg()}
    key = guard.control_key(SECRET)
    update = {"update_info": {"names": [f"model.layers.{i}.mlp.weight" for i in range(300)],
                              "dtype_names": ["float32"] * 300, "shapes": [[896, 896]] * 300}}
    guard.configure(SECRET)
    for name, params, body in (("pause", {"mode": "wait"}, None), ("update_weights", None, update)):
        checker = guard.ControlPlaneGuard(_app)  # one server process: requests are signed for its instance
        start = time.perf_counter()
        signed = [guard.signed_request(key, "POST", "/" + name, params, body, instance=checker.instance)
                  for _ in range(args.requests)]
        out[f"sign_us_{name}"] = (time.perf_counter() - start) / args.requests * 1e6
        out[f"body_bytes_{name}"] = len(signed[0][2])
        requests = [([(k.lower().encode(), v.encode()) for k, v in headers.items()], content,
                     target.partition("?")[2].encode()) for target, headers, content in signed]
        out[f"check_us_{name}"] = _per_request(checker, "/" + name, requests) * 1e6
        bearer = [([(b"authorization", f"Bearer {SECRET}".encode())], c, q) for _, c, q in requests]
        out[f"bearer_check_us_{name}"] = _per_request(_Bearer(_app), "/" + name, bearer) * 1e6
    times: dict[str, list[float]] = {"rendezvous": [], "tcpstore": []}
    for _ in range(args.groups):
        for kind in times:
            times[kind].append(_form(kind))
    for kind, values in times.items():
        out[f"group_formation_ms_{kind}"] = {"median": statistics.median(values) * 1e3, "min": min(values) * 1e3,
                                             "max": max(values) * 1e3}
    out["load_average_after"] = os.getloadavg()
    out["date_utc"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
