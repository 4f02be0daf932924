"""The rendezvous of a weight-transfer group: only the invited peers write to it, and it closes once the group forms.

The learner's end of a weight sync (:class:`~llmgym.fleet.weight_transfer.GlooSender`) hosts the
rendezvous where a rollout server's workers and the learner exchange their gloo addresses. torch's
``TCPStore`` authenticates no one: any process that reaches its port writes any key, values of any
size (the learner's memory), reads or lists the keys, and can publish its address in place of a
slow server's worker. This store is the rendezvous with a door:

* **invited peers only**: the learner draws a fresh random **nonce** for every group and sends it
  to the server inside the signed ``/init_weight_transfer_engine`` request (:mod:`llmgym.fleet.guard`);
  a peer that connects must answer a fresh challenge with ``HMAC-SHA256(nonce, challenge)`` (and the
  learner answers the peer's challenge the same way) before the store reads a single request from it.
  A peer that answers wrong, or not within :data:`AUTH_TIMEOUT_S`, is disconnected having sent at most
  the answer's 64 bytes; at most ``peers`` authenticated connections are taken;
* **bounded**: a key is at most :data:`MAX_KEY_BYTES`, a value :data:`MAX_VALUE_BYTES`, the whole
  store :data:`MAX_STORE_BYTES` per peer (gloo's addresses are a few hundred bytes per rank);
* **closed when the group forms**: each peer reports when its group is whole; once every peer has,
  the learner closes the listening socket and every connection, so nothing reaches it for the rest
  of the run (a new group, after a reconnect, is a new rendezvous with a new nonce).

It is a ``torch.distributed.Store`` (the part gloo's rendezvous uses: ``set``, ``get``, ``wait``,
``add``, ``check``), so ``ProcessGroupGloo`` forms over it unchanged.

Example:
    >>> import socket, threading
    >>> from llmgym.fleet.rendezvous import RendezvousClient, RendezvousHost, new_nonce
    >>> listener = socket.create_server(("127.0.0.1", 0))
    >>> nonce = new_nonce()
    >>> host = RendezvousHost(listener, nonce, peers=1, timeout_s=5)
    >>> peer = RendezvousClient("127.0.0.1", listener.getsockname()[1], nonce, timeout_s=5)
    >>> peer.set("rank1", b"address"); host.store.get("rank1")
    b'address'
    >>> peer.joined(); host.wait_joined(); host.close()
    >>> host.closed
    True
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import re
import secrets
import socket
import struct
import threading
import time

import torch.distributed as dist

from llmgym.errors import LLMGymError

__all__ = ["AUTH_TIMEOUT_S", "MAX_KEY_BYTES", "MAX_STORE_BYTES", "MAX_VALUE_BYTES", "RendezvousClient",
           "RendezvousError", "RendezvousHost", "new_nonce"]

AUTH_TIMEOUT_S = 10.0
"""Seconds a connecting peer has to answer the challenge."""
MAX_KEY_BYTES = 512
MAX_VALUE_BYTES = 1 << 20
"""The largest value a peer may set (gloo's address list of a rank: ~85 bytes per peer rank)."""
MAX_STORE_BYTES = 4 << 20
"""Bytes of keys and values the store holds per expected peer."""
_MAX_PENDING = 128  # connections not yet authenticated at once (a newcomer past them cuts the oldest)
_HELLO = b"llmgym-rendezvous-v1"
_NONCE = re.compile(r"[0-9a-f]{64}")
_JOINED = "\x00joined"  # a key no gloo key is (gloo's are printable)


class RendezvousError(LLMGymError, RuntimeError):
    """The rendezvous refused a peer or a request (wrong nonce, a bound passed, closed), or was cut."""


def new_nonce() -> str:
    """A fresh rendezvous nonce (64 hex characters: 256 random bits).

    Example:
        >>> from llmgym.fleet.rendezvous import new_nonce
        >>> len(new_nonce()), new_nonce() == new_nonce()
        (64, False)
    """
    return secrets.token_hex(32)


def _key(nonce: str) -> bytes:
    if not isinstance(nonce, str) or not _NONCE.fullmatch(nonce):
        raise RendezvousError("a weight-transfer rendezvous needs the learner's nonce (64 hex characters) from its "
                              "signed /init_weight_transfer_engine request: is the learner an older llmgym?")
    return bytes.fromhex(nonce)


def _proof(key: bytes, role: bytes, challenge: bytes) -> bytes:
    return hmac.new(key, _HELLO + role + challenge, hashlib.sha256).digest()


def _read(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """``n`` bytes from ``sock``; with a ``deadline`` (``time.monotonic()``), all of them by then (a peer that
    drips a byte at a time gets no more time than one that sends at once)."""
    data = bytearray()
    while len(data) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConnectionError("the rendezvous handshake took too long")
            sock.settimeout(left)
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the rendezvous connection closed")
        data += chunk
    return bytes(data)


def _cut(sock: socket.socket) -> None:
    """End a connection another thread may be reading (its read fails at once)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack(">I", len(payload)) + payload)


def _read_frame(sock: socket.socket, limit: int) -> bytes:
    (size,) = struct.unpack(">I", _read(sock, 4))
    if size > limit:
        raise RendezvousError(f"a rendezvous message of {size} bytes (at most {limit})")
    return _read(sock, size)


def _request(op: bytes, key: str, value: bytes = b"") -> bytes:
    raw = key.encode("utf-8")
    return op + struct.pack(">H", len(raw)) + raw + value


_FRAME_LIMIT = 1 + 2 + MAX_KEY_BYTES + MAX_VALUE_BYTES


class _Table:
    """The store's keys and values (bounded), shared by the host's own store and its peers' connections."""

    def __init__(self, budget: int, timeout_s: float) -> None:
        self.data: dict[str, bytes] = {}
        self.size, self.budget, self.timeout_s = 0, budget, timeout_s
        self.changed = threading.Condition()
        self.closed = False

    def set(self, key: str, value: bytes) -> None:
        if len(key.encode("utf-8")) > MAX_KEY_BYTES or len(value) > MAX_VALUE_BYTES:
            raise RendezvousError(f"a rendezvous key over {MAX_KEY_BYTES} bytes or value over {MAX_VALUE_BYTES}")
        with self.changed:
            self._open()
            grown = self.size + len(key) + len(value) - (len(key) + len(self.data[key]) if key in self.data else 0)
            if grown > self.budget:
                raise RendezvousError(f"the rendezvous holds at most {self.budget} bytes")
            self.data[key], self.size = bytes(value), grown
            self.changed.notify_all()

    def get(self, key: str, timeout_s: float | None = None) -> bytes:
        with self.changed:
            if not self.changed.wait_for(lambda: self.closed or key in self.data, timeout_s or self.timeout_s):
                raise RendezvousError(f"the rendezvous key {key[:80]!r} did not come within "
                                      f"{timeout_s or self.timeout_s:g} s")
            self._open()
            return self.data[key]

    def add(self, key: str, amount: int) -> int:
        with self.changed:
            self._open()
            value, new = int(self.data.get(key, b"0")) + int(amount), key not in self.data
            self.data[key] = str(value).encode()
            self.size += len(key) + 24 if new else 0
            if self.size > self.budget:
                raise RendezvousError(f"the rendezvous holds at most {self.budget} bytes")
            self.changed.notify_all()
            return value

    def _open(self) -> None:
        if self.closed:
            raise RendezvousError("the rendezvous is closed (its group has formed)")


class _Store(dist.Store):
    """The ``torch.distributed.Store`` gloo sees: ``call(op, key, value)`` does the work (locally or remotely)."""

    def __init__(self, call, timeout_s: float) -> None:
        super().__init__()
        self._call, self._timeout = call, timeout_s

    def set(self, key, value) -> None:
        self._call(b"S", key, value.encode() if isinstance(value, str) else bytes(value))

    def get(self, key) -> bytes:
        return self._call(b"G", key, b"")

    def add(self, key, amount) -> int:
        return int(self._call(b"A", key, str(int(amount)).encode()))

    def wait(self, keys, timeout=None) -> None:
        for key in keys:
            self._call(b"W", key, b"")

    def check(self, keys) -> bool:
        return all(self._call(b"C", key, b"") == b"1" for key in keys)

    def clone(self):
        return self

    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self._timeout)


class RendezvousHost:
    """The learner's end: serves the store on ``listener`` (a bound, listening socket it now owns) to ``peers``
    peers that prove they hold ``nonce``; :attr:`store` is the learner's own view of it (gloo's store at rank 0).

    :meth:`wait_joined` waits until every peer has reported its group whole; :meth:`close` stops serving."""

    def __init__(self, listener: socket.socket, nonce: str, *, peers: int, timeout_s: float) -> None:
        self._key, self.peers, self.timeout_s = _key(nonce), int(peers), float(timeout_s)
        self.table = _Table(MAX_STORE_BYTES * max(1, self.peers), self.timeout_s)
        self.store = _Store(self._local, self.timeout_s)
        self.listener, self.closed, self.refused = listener, False, 0
        self._lock, self._authenticated = threading.Lock(), 0
        self._connections: set[socket.socket] = set()
        self._waiting: list[socket.socket] = []  # not yet authenticated, oldest first
        self._thread = threading.Thread(target=self._accept, name="llmgym-rendezvous", daemon=True)
        self._thread.start()

    def _local(self, op: bytes, key: str, value: bytes) -> bytes:
        return _apply(self.table, op, key, value)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self.closed:
                    conn.close()
                    continue
                if len(self._waiting) >= _MAX_PENDING:  # the oldest stranger gives its slot up: connections that
                    _cut(self._waiting.pop(0))  # hold every slot (idle, or dripping) cannot keep a peer out
                self._waiting.append(conn)
                self._connections.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            deadline = time.monotonic() + AUTH_TIMEOUT_S  # for the whole handshake, not per byte
            conn.settimeout(AUTH_TIMEOUT_S)
            challenge = secrets.token_bytes(32)
            conn.sendall(_HELLO + challenge)
            answer = _read(conn, 64, deadline)  # the peer's proof, then its own challenge
            if not hmac.compare_digest(answer[:32], _proof(self._key, b"peer", challenge)):
                with self._lock:
                    self.refused += 1
                return
            with self._lock:
                if conn not in self._waiting:
                    return  # cut for a newcomer meanwhile
                self._waiting.remove(conn)
                admitted = self._authenticated < self.peers and not self.closed
                self._authenticated += admitted
            if not admitted:
                return
            conn.sendall(_proof(self._key, b"host", answer[32:]))
            conn.settimeout(None)
            while True:
                frame = _read_frame(conn, _FRAME_LIMIT)
                op, (size,) = frame[:1], struct.unpack(">H", frame[1:3])
                key, value = frame[3:3 + size].decode("utf-8"), frame[3 + size:]
                try:
                    _send_frame(conn, b"\x00" + _apply(self.table, op, key, value))
                except RendezvousError as exc:
                    _send_frame(conn, b"\x01" + str(exc).encode()[:300])
        except (OSError, ConnectionError, RendezvousError, UnicodeDecodeError, struct.error):
            pass
        finally:
            with self._lock:
                if conn in self._waiting:
                    self._waiting.remove(conn)
                self._connections.discard(conn)
            conn.close()

    def wait_joined(self, timeout_s: float | None = None) -> None:
        """Block until every peer has reported its group whole (raises :class:`RendezvousError` at the time-out)."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        with self.table.changed:
            while int(self.table.data.get(_JOINED, b"0")) < self.peers:
                left = deadline - time.monotonic()
                if left <= 0 or self.table.closed:
                    raise RendezvousError(f"{int(self.table.data.get(_JOINED, b'0'))} of {self.peers} peers reported "
                                          f"their weight-transfer group whole")
                self.table.changed.wait(left)

    def close(self) -> None:
        """Stop serving: the port closes, every connection is cut, the store refuses every request."""
        with self._lock:
            self.closed = True
            connections, self._connections = list(self._connections), set()
        with self.table.changed:
            self.table.closed = True
            self.table.data.clear()
            self.table.changed.notify_all()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()


def _apply(table: _Table, op: bytes, key: str, value: bytes) -> bytes:
    if op == b"S":
        table.set(key, value)
        return b""
    if op == b"G":
        return table.get(key)
    if op == b"W":
        table.get(key)
        return b""
    if op == b"A":
        if not re.fullmatch(rb"-?[0-9]{1,18}", value):
            raise RendezvousError("a rendezvous add takes a whole number")
        return str(table.add(key, int(value))).encode()
    if op == b"C":
        with table.changed:
            return b"1" if key in table.data else b"0"
    raise RendezvousError(f"unknown rendezvous request {op!r}")


class RendezvousClient(_Store):
    """A peer's end (a rollout server's worker): connects to the learner's rendezvous and proves it holds the
    nonce (and checks that the host does); then a ``torch.distributed.Store`` over that connection."""

    def __init__(self, address: str, port: int, nonce: str, *, timeout_s: float) -> None:
        super().__init__(self._remote, timeout_s)
        key = _key(nonce)
        self._lock = threading.Lock()
        try:
            self._sock = socket.create_connection((address, int(port)), timeout=min(timeout_s, AUTH_TIMEOUT_S))
            hello = _read(self._sock, len(_HELLO) + 32)
            if not hello.startswith(_HELLO):
                raise RendezvousError("what answers at the rendezvous address is not an llmgym learner")
            mine = secrets.token_bytes(32)
            self._sock.sendall(_proof(key, b"peer", hello[len(_HELLO):]) + mine)
            if not hmac.compare_digest(_read(self._sock, 32), _proof(key, b"host", mine)):
                raise RendezvousError("the rendezvous host does not hold the learner's nonce")
            self._sock.settimeout(timeout_s + 5)
        except (OSError, ConnectionError) as exc:
            raise RendezvousError(f"the rendezvous at {address}:{port} refused this peer or closed: "
                                  f"{type(exc).__name__}: {exc}") from None

    def _remote(self, op: bytes, key: str, value: bytes) -> bytes:
        with self._lock:
            try:
                _send_frame(self._sock, _request(op, key, value))
                reply = _read_frame(self._sock, _FRAME_LIMIT)
            except (OSError, ConnectionError) as exc:
                raise RendezvousError(f"the rendezvous connection broke: {type(exc).__name__}: {exc}") from None
        if reply[:1] != b"\x00":
            raise RendezvousError(reply[1:].decode("utf-8", "replace"))
        return reply[1:]

    def joined(self) -> None:
        """Report this peer's group whole (the host closes once every peer has), then disconnect."""
        try:
            self._remote(b"A", _JOINED, b"1")
        except RendezvousError:
            pass  # the host closes as soon as the last peer's report lands, maybe before its answer is sent
        finally:
            self.close()

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass
