"""A rollout server's door, second pass: replayed control requests and the weight rendezvous.

Found by the attacker's pass (each worked before the fix):

* a captured ``/pause`` (any control request) replayed: the secret travelled as a bearer token, so a
  captured request was good forever, and its query or body could be changed at will;
* the learner's weight rendezvous (torch's ``TCPStore``) took any local process for the whole run: two
  96 MB values grew the learner from 522 to 714 MB, and a process could join the group before a slow
  server's worker.

No vLLM here: the guard is tested as the ASGI middleware vLLM runs, the rendezvous with the learner's
real :class:`~llmgym.fleet.weight_transfer.GlooSender` and a peer in a thread.
"""

from __future__ import annotations

import datetime
import json
import socket
import threading
import time

import pytest
import torch

from llmgym.fleet import guard as serve_guard
from llmgym.fleet import rendezvous
from llmgym.fleet.weight_transfer import GlooSender, TransferError, metadata, open_group, receive_named_tensors

SECRET = "0123456789abcdef-door"


@pytest.fixture()
def guarded():
    """A FastAPI app behind the guard (as vLLM's ``--middleware`` installs it) that echoes what reached it,
    and a FleetEngine ``_Server`` whose control calls go to it (the learner's real signing code)."""
    fastapi = pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from llmgym.fleet.fleet_engine import _Server

    app = fastapi.FastAPI()
    reached = []

    async def echo(request):
        reached.append((request.url.path, request.url.query, await request.body()))
        return {"ok": True}

    echo.__annotations__ = {"request": fastapi.Request}  # (this module's annotations are strings)

    for method, path in serve_guard.CONTROL_ROUTES:
        app.add_api_route(path, echo, methods=[method])
    app.add_middleware(serve_guard.ControlPlaneGuard)
    serve_guard.configure(SECRET)
    sent = []  # every request the learner's client sends, as a capture of the wire would hold it
    client = TestClient(app, base_url="http://rollout:8000")
    client.event_hooks = {"request": [sent.append], "response": []}
    server = _Server("http://rollout:8000", client=None, http=client, secret=SECRET)
    yield server, client, sent, reached
    serve_guard._state.clear()


def _again(client, request, **changes):
    """Send a captured request again (optionally with its URL or body changed)."""
    return client.request(request.method, changes.get("url", request.url), headers=dict(request.headers),
                          content=changes.get("content", request.content))


def test_a_captured_control_request_sent_again_is_refused(guarded):
    server, client, sent, reached = guarded
    assert server.call("POST", "/pause", params={"mode": "wait"}) == {"ok": True}
    server.call("POST", "/finish_weight_update", json={"weight_version": "3"})
    assert [(p, q, json.loads(b or b"null")) for p, q, b in reached] == [
        ("/pause", "mode=wait", None), ("/finish_weight_update", "", {"weight_version": "3"})]
    pause, finish = [r for r in sent if r.url.path != "/health"]  # (the learner learns the instance first)
    again = _again(client, pause)
    assert again.status_code == 401 and "replay" in again.json()["error"]
    assert "authorization" not in pause.headers and SECRET not in str(pause.headers)  # the secret never travels
    assert _again(client, finish).status_code == 401
    # altered, the capture is worth nothing either: another query, another body
    assert _again(client, pause, url="http://rollout:8000/pause?mode=keep").status_code == 401
    forged = _again(client, finish, content=b'{"weight_version": "999"}')
    assert forged.status_code == 401 and ("altered" in forged.json()["error"] or "replay" in forged.json()["error"])
    assert len(reached) == 2  # nothing replayed or altered reached the server


def test_a_control_request_without_a_good_fresh_signature_is_refused(guarded):
    server, client, sent, reached = guarded
    key = serve_guard.control_key(SECRET)
    header = serve_guard.SIGNATURE_HEADER
    here = client.get("/health").headers[serve_guard.INSTANCE_HEADER]  # any answer names the server process
    refused = [
        {},  # none
        {"Authorization": f"Bearer {SECRET}"},  # the secret itself as a bearer token: it replays by construction
        {header: "v1 t=1 n=zz s=00"},  # malformed
        {header: serve_guard.sign(serve_guard.control_key(SECRET + "x"), "POST", "/resume")},  # another secret
        {header: serve_guard.sign(key, "POST", "/pause")},  # signed for another route
        {header: serve_guard.sign(key, "POST", "/resume", now=time.time() - serve_guard.MAX_SKEW_S - 30)},  # stale
        {header: serve_guard.sign(key, "POST", "/resume", now=time.time() + serve_guard.MAX_SKEW_S + 30)},  # future
        {header: serve_guard.sign(key, "POST", "/resume")},  # for no server process in particular
    ]
    for headers in refused:
        answer = client.post("/resume", headers=headers)
        assert answer.status_code == 401 and "\n" not in answer.json()["error"], headers
    assert reached == []
    assert client.post("/resume", headers={header: serve_guard.sign(key, "POST", "/resume", instance=here)}).status_code == 200


def test_the_generation_key_is_not_the_secret_and_signs_nothing(guarded):
    """A sampling request carries its key as a bearer token (vLLM's ``--api-key``): anyone who captures one
    reads it. It is derived from the secret, and the control routes take no bearer token at all."""
    server, client, sent, reached = guarded
    key = serve_guard.generation_key(SECRET)
    assert SECRET not in key and server._generation == {"Authorization": f"Bearer {key}"}
    assert client.post("/pause", headers={"Authorization": f"Bearer {key}"}).status_code == 401
    assert serve_guard.control_key(key) != serve_guard.control_key(SECRET)


# -- the weight rendezvous -------------------------------------------------------------------------------


def _peer(info, got, pairs, nonce=None):
    group, _ = open_group(info["master_address"], info["master_port"], 1, 2, timeout_s=30,
                          nonce=nonce or info["nonce"])
    for bucket in receive_named_tensors(group, metadata(pairs), info["bucket_bytes"]):
        got.extend((name, t.clone()) for name, t in bucket)


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except OSError:
        return True
    return False


def test_the_rendezvous_closes_once_the_group_forms_and_the_weights_still_flow():
    """Before: the ``TCPStore`` listened, and took any client's writes, for the whole run."""
    pairs = [("w", torch.randn(8, 4)), ("b", torch.arange(5))]
    sender = GlooSender("127.0.0.1", world_size=2, timeout_s=30)
    info = sender.rendezvous()
    assert len(info["nonce"]) == 64 and info["nonce"] != GlooSender("127.0.0.1", 2).rendezvous()["nonce"]
    got = []
    peer = threading.Thread(target=_peer, args=(info, got, pairs))
    peer.start()
    try:
        sender.join()
        assert _refused(info["master_port"])  # nobody reaches the rendezvous any more
        sender.send(pairs)
        peer.join(timeout=60)
        assert [n for n, _ in got] == ["w", "b"] and all(torch.equal(a, b) for (_, a), (_, b) in zip(got, pairs))
    finally:
        sender.close()


def test_a_process_without_the_nonce_cannot_write_to_the_rendezvous_or_join_the_group(monkeypatch):
    """Before: a ``TCPStore`` client wrote 96 MB values into the learner and could publish its address in place
    of a slow server's worker. Now it is cut after the 64 bytes of its (wrong) answer, and the group forms
    with the invited peer only."""
    monkeypatch.setattr(rendezvous, "AUTH_TIMEOUT_S", 2.0)
    import torch.distributed as dist

    pairs = [("w", torch.randn(3))]
    sender = GlooSender("127.0.0.1", world_size=2, timeout_s=30)
    info = sender.rendezvous()
    joining = threading.Thread(target=sender.join)
    joining.start()
    try:
        while sender._socket is not None:  # the host serves the port
            time.sleep(0.01)
        with pytest.raises((RuntimeError, OSError)):  # torch's own store client: refused, whatever it writes
            rogue = dist.TCPStore("127.0.0.1", info["master_port"], 2, False, datetime.timedelta(seconds=5))
            rogue.set("llmgym-weights/0/1", b"x" * (96 << 20))
        with socket.create_connection(("127.0.0.1", info["master_port"]), timeout=10) as raw:
            raw.recv(64)
            with pytest.raises(OSError):
                for _ in range(96):  # 96 MB after a wrong answer: the door shuts after 64 bytes
                    raw.sendall(b"\0" * (1 << 20))
        with pytest.raises(TransferError, match="did not form"):  # a guessed nonce: its handshake fails
            _peer(dict(info, timeout_s=5), [], pairs, nonce="0" * 64)
        got = []
        peer = threading.Thread(target=_peer, args=(info, got, pairs))
        peer.start()
        joining.join(timeout=60)
        assert sender.group is not None
        sender.send(pairs)
        peer.join(timeout=60)
        assert len(got) == 1 and torch.equal(got[0][1], pairs[0][1])
    finally:
        joining.join(timeout=60)
        sender.close()


def test_the_rendezvous_store_is_bounded_and_refuses_every_request_once_closed():
    listener = socket.create_server(("127.0.0.1", 0))
    nonce = rendezvous.new_nonce()
    host = rendezvous.RendezvousHost(listener, nonce, peers=1, timeout_s=5)
    try:
        peer = rendezvous.RendezvousClient("127.0.0.1", listener.getsockname()[1], nonce, timeout_s=5)
        with pytest.raises(rendezvous.RendezvousError, match="value over"):
            peer.set("k", b"x" * (rendezvous.MAX_VALUE_BYTES + 1))
        for i in range(rendezvous.MAX_STORE_BYTES // rendezvous.MAX_VALUE_BYTES - 1):
            peer.set(f"k{i}", b"x" * rendezvous.MAX_VALUE_BYTES)
        with pytest.raises(rendezvous.RendezvousError, match="at most"):
            peer.set("one-more", b"x" * rendezvous.MAX_VALUE_BYTES)
        with pytest.raises(rendezvous.RendezvousError, match="refused this peer"):  # one connection per peer
            rendezvous.RendezvousClient("127.0.0.1", listener.getsockname()[1], nonce, timeout_s=5).get("k0")
    finally:
        host.close()
    with pytest.raises(rendezvous.RendezvousError, match="closed|broke"):
        peer.get("k0")
    with pytest.raises(rendezvous.RendezvousError, match="closed"):
        host.store.set("k", b"v")
    with pytest.raises(rendezvous.RendezvousError, match="nonce"):
        rendezvous.RendezvousHost(socket.create_server(("127.0.0.1", 0)), "", peers=1, timeout_s=5)


def test_the_guard_remembers_a_nonce_as_long_as_its_time_is_fresh_and_no_longer(monkeypatch):
    """A replay is refused by its nonce while its time is fresh, by its time after; the memory stays bounded."""
    monkeypatch.setattr(serve_guard, "_PRUNE_AT", 3)
    nonces = serve_guard._Nonces()
    now = 1_000_000.0
    assert nonces.take("a" * 32, int(now), now) is None
    assert "replay" in nonces.take("a" * 32, int(now), now + 60)
    assert nonces.take("b" * 32, int(now) + serve_guard.MAX_SKEW_S, now) is None  # signed on a clock ahead
    assert nonces.take("c" * 32, int(now), now) is None
    assert nonces.take("d" * 32, int(now) + 200, now + 200) is None  # prunes "a" and "c" (their time has passed)
    assert set(nonces.seen) == {"b" * 32, "d" * 32}


def test_a_server_refuses_an_init_without_the_rendezvous_nonce_in_one_line():
    """A learner that sends no nonce (an older one) is refused before any connection, in one line."""
    pytest.importorskip("vllm")
    from llmgym.fleet.vllm_plugin import GlooInitInfo

    shape = {"master_address": "127.0.0.1", "master_port": 29500, "world_size": 2}
    assert GlooInitInfo(**shape, nonce=rendezvous.new_nonce()).world_size == 2
    for nonce in ("", "0" * 63, "Z" * 64):
        with pytest.raises(ValueError, match="no rendezvous nonce"):
            GlooInitInfo(**shape, nonce=nonce)


def _guarded_app(reached):
    """One rollout server process: an app behind its own guard (a fresh instance), recording what reached it."""
    fastapi = pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    app = fastapi.FastAPI()

    async def echo(request):
        reached.append(request.url.path)
        return {"ok": True}

    echo.__annotations__ = {"request": fastapi.Request}
    for method, path in serve_guard.CONTROL_ROUTES | {("GET", "/health")}:
        app.add_api_route(path, echo, methods=[method])
    app.add_middleware(serve_guard.ControlPlaneGuard)
    return TestClient(app, base_url="http://rollout:8000")


def test_a_control_request_signed_for_one_server_process_is_refused_by_any_other():
    """Found by the second attacker's pass: a fleet shares one secret, and a server's nonce memory is its process's,
    so a captured ``/pause`` sent to another server of the fleet, or to the same server after a restart, within the
    120 s window, was taken (200). Rule: a signature covers the server process's instance (drawn at start, named on
    every answer); the learner signs for the process it talks to and signs again once when a server restarted."""
    from llmgym.fleet.fleet_engine import _Server

    serve_guard.configure(SECRET)
    try:
        reached_a, reached_b, reached_a2 = [], [], []
        a, b = _guarded_app(reached_a), _guarded_app(reached_b)
        sent = []
        a.event_hooks = {"request": [sent.append], "response": []}
        learner = _Server("http://rollout:8000", client=None, http=a, secret=SECRET)
        assert learner.call("POST", "/pause", params={"mode": "wait"}) == {"ok": True}
        pause = sent[-1]
        assert _again(b, pause).status_code == 401 and reached_b == []  # another server of the fleet
        restarted = _guarded_app(reached_a2)  # the same server, restarted: its nonces are gone
        answer = _again(restarted, pause)
        assert answer.status_code == 401 and "restarted" in answer.json()["error"] and reached_a2 == []
        learner.http = restarted  # the learner's own next request to the restarted server is signed for it
        assert learner.call("POST", "/resume") == {"ok": True} and reached_a2 == ["/resume"]
    finally:
        serve_guard._state.clear()


def test_the_guard_reads_no_body_before_the_signature_holds():
    """Found by the second attacker's pass: the guard read (and held) up to 16 MB of a control request's body before
    it checked the signature, so any client that could reach the port, with a well-formed header of the current
    time and no secret, made the server hold 16 MB per connection. Rule: the body's digest is in the signed header,
    the signature is checked first, and only a signed, fresh request's body is read."""
    import asyncio

    serve_guard.configure(SECRET)
    try:
        reached = []

        async def app(scope, receive, send):
            reached.append(scope["path"])

        guard = serve_guard.ControlPlaneGuard(app)
        forged = serve_guard.sign(serve_guard.control_key("not the secret, 0123"), "POST", "/update_weights",
                                  instance=guard.instance)  # well-formed and fresh, but no one's
        pulled, answers = [], []

        async def receive():  # an endless body, 1 MB a message
            pulled.append(1)
            return {"type": "http.request", "body": b"x" * (1 << 20), "more_body": True}

        async def send(message):
            answers.append(message)

        scope = {"type": "http", "method": "POST", "path": "/update_weights", "query_string": b"",
                 "headers": [(serve_guard.SIGNATURE_HEADER.lower().encode(), forged.encode())]}
        asyncio.run(guard(scope, receive, send))
        assert answers[0]["status"] == 401 and pulled == [] and reached == []
        # signed, the body is read, and one that is not the body signed is refused
        key = serve_guard.control_key(SECRET)
        good = serve_guard.sign(key, "POST", "/update_weights", b"", b"{}", instance=guard.instance)
        body = [{"type": "http.request", "body": b"{}", "more_body": False}]
        scope["headers"] = [(serve_guard.SIGNATURE_HEADER.lower().encode(), good.encode())]

        async def receive_one():
            return body.pop(0) if body else {"type": "http.disconnect"}

        asyncio.run(guard(scope, receive_one, send))
        assert reached == ["/update_weights"]
        other = serve_guard.sign(key, "POST", "/update_weights", b"", b"{}", instance=guard.instance)
        body[:] = [{"type": "http.request", "body": b"{1}", "more_body": False}]
        scope["headers"] = [(serve_guard.SIGNATURE_HEADER.lower().encode(), other.encode())]
        answers.clear()
        asyncio.run(guard(scope, receive_one, send))
        assert answers[0]["status"] == 401 and reached == ["/update_weights"]
    finally:
        serve_guard._state.clear()


def test_strangers_holding_every_rendezvous_slot_cannot_keep_the_peer_out(monkeypatch):
    """Found by the second attacker's pass: the rendezvous took at most 128 unauthenticated connections and dropped
    every later one unread, with a time limit per read (a byte every few seconds kept a slot for minutes): any local
    process holding 128 connections kept the real server's worker out, and the weight group never formed. Rule: the
    handshake has one deadline, and a newcomer past the limit cuts the oldest unauthenticated connection."""
    monkeypatch.setattr(rendezvous, "_MAX_PENDING", 4)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    nonce = rendezvous.new_nonce()
    host = rendezvous.RendezvousHost(listener, nonce, peers=1, timeout_s=5)
    strangers = []
    try:
        for _ in range(4):  # every slot held by a connection that never answers the challenge
            stranger = socket.create_connection(("127.0.0.1", port), timeout=5)
            stranger.recv(len(rendezvous._HELLO) + 32)  # (the host has taken it: it sent its challenge)
            strangers.append(stranger)
        peer = rendezvous.RendezvousClient("127.0.0.1", port, nonce, timeout_s=5)
        peer.set("rank1", b"address")
        assert host.store.get("rank1") == b"address"
        assert strangers[0].recv(1) == b""  # the oldest stranger was cut
    finally:
        for stranger in strangers:
            stranger.close()
        host.close()
