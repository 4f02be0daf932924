"""An HTTP client whose every request attempt is bounded: one deadline and one size cap, on the socket reads.

httpx's own timeouts are per read (a server dripping a byte at a time would hold a call open
indefinitely) and it inflates a compressed reply whatever its size. :func:`bounded_http_client` gives
each attempt one deadline from sending to the last byte and a cap on the bytes read, both enforced in
httpcore's network backend, asks for ``identity`` encoding and refuses a compressed reply before it is
inflated, and follows no redirects. A :class:`RequestBudget` holds the current thread's attempt:
:class:`~llmgym.engines.openai_api.OpenAIEngine` keeps its own, to size each request's cap by the tokens
asked for and to tell which bound stopped an attempt.

Example:
    >>> from llmgym.engines.bounded_http import RequestBudget, bounded_http_client
    >>> budget = RequestBudget()
    >>> client = bounded_http_client(5.0, budget=budget)
    >>> budget.max_bytes, client.follow_redirects
    (1048576, False)
    >>> client.close()
"""

from __future__ import annotations

import threading
import time
from typing import Any

from llmgym.runtime.install import install_hint

try:
    import httpcore
    import httpx
except ImportError as err:  # pragma: no cover - exercised where the openai extra is absent
    raise ImportError(f"llmgym.engines.bounded_http needs httpx: {install_hint('openai')}") from err

from llmgym.engines.served_replies import one_line

__all__ = ["REPLY_BASE_BYTES", "REPLY_BYTES_PER_TOKEN", "RequestBudget", "bounded_http_client"]

#: Bytes a reply may take beyond its tokens (headers, ids, fields); each token adds REPLY_BYTES_PER_TOKEN.
REPLY_BASE_BYTES = 1 << 20
REPLY_BYTES_PER_TOKEN = 4096


# -- one deadline and one size cap per request attempt, on the socket reads themselves ---------------------

class RequestBudget(threading.local):
    """The current thread's request attempt: its deadline and the bytes it may still read.

    :func:`bounded_http_client` sets ``deadline`` and clears ``read`` and ``why`` at each attempt; ``max_bytes``
    is the caller's to set (by the reply it expects); ``why`` says which bound stopped the attempt, if one did.

    Example:
        >>> from llmgym.engines.bounded_http import RequestBudget
        >>> budget = RequestBudget()
        >>> budget.clamp(3.0), budget.why  # no attempt under way: nothing to clamp to
        (3.0, None)
    """

    deadline: float | None = None
    max_bytes: int = REPLY_BASE_BYTES
    read: int = 0
    why: str | None = None

    def clamp(self, timeout: float | None) -> float | None:
        if self.deadline is None:
            return timeout
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.why = "deadline"
            raise httpcore.ReadTimeout("the request's deadline passed")
        return left if timeout is None else min(timeout, left)

    def count(self, n: int) -> None:
        self.read += n
        if self.deadline is not None and self.read > self.max_bytes:
            self.why = f"the reply ran over {self.max_bytes} bytes"
            raise httpcore.ReadError(self.why)


class _BudgetedStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, budget: RequestBudget):
        self._inner, self._budget = inner, budget

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = self._inner.read(max_bytes, self._budget.clamp(timeout))
        self._budget.count(len(data))
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._budget.clamp(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        inner = self._inner.start_tls(ssl_context, server_hostname, self._budget.clamp(timeout))
        return _BudgetedStream(inner, self._budget)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _BudgetedBackend(httpcore.NetworkBackend):
    """httpcore's network backend with every connect, read and write bounded by the thread's budget."""

    def __init__(self, inner: httpcore.NetworkBackend, budget: RequestBudget):
        self._inner, self._budget = inner, budget

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        stream = self._inner.connect_tcp(host, port, self._budget.clamp(timeout), local_address, socket_options)
        return _BudgetedStream(stream, self._budget)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _BudgetedStream(self._inner.connect_unix_socket(path, self._budget.clamp(timeout), socket_options),
                               self._budget)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def bounded_http_client(timeout: float, connections: int = 4, *,
                        budget: RequestBudget | None = None) -> httpx.Client:
    """An ``httpx.Client`` for a server's other routes, bounded as
    :class:`~llmgym.engines.openai_api.OpenAIEngine`'s requests are.

    Each request gets one deadline from sending to the last byte (its own ``timeout=`` where given, else
    ``timeout``; httpx's are per read), at most 1 MiB of reply counted on the wire, ``Accept-Encoding:
    identity`` (a compressed reply is refused before it is inflated), and no redirects. A bound that
    trips is an ``httpx.HTTPError`` (``ReadTimeout``, ``ReadError``, ``DecodingError``). ``budget``: the
    :class:`RequestBudget` its attempts run under (the caller's own, to set ``max_bytes`` per request and read
    ``why``), else a new one.

    Example:
        >>> from llmgym.engines.bounded_http import bounded_http_client
        >>> client = bounded_http_client(5.0)
        >>> client.follow_redirects, client.headers["accept-encoding"]
        (False, 'identity')
        >>> client.close()
    """
    budget = RequestBudget() if budget is None else budget
    transport = httpx.HTTPTransport(limits=httpx.Limits(max_connections=connections,
                                                        max_keepalive_connections=connections))
    pool = getattr(transport, "_pool", None)  # httpcore's ConnectionPool: its backend is the extension point
    if not isinstance(getattr(pool, "_network_backend", None), httpcore.NetworkBackend):
        raise ImportError(f"llmgym.engines.openai_api cannot bound requests with httpx {httpx.__version__} / "
                          f"httpcore {httpcore.__version__}: install httpx 0.27 or 0.28")
    pool._network_backend = _BudgetedBackend(pool._network_backend, budget)

    def start_attempt(request: httpx.Request) -> None:  # every attempt, the retries' too
        # the request's own timeout where the caller gave one (a long control-plane call), else the client's
        own = (request.extensions.get("timeout") or {}).get("read")
        seconds = own if isinstance(own, (int, float)) and own > 0 else timeout
        budget.deadline, budget.read, budget.why = time.monotonic() + seconds, 0, None

    def plain_body(response: httpx.Response) -> None:
        # the size cap counts bytes on the wire: a compressed reply (asked for or not) could expand a
        # few hundred kilobytes into gigabytes when httpx decodes it
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            budget.why = f"the reply is compressed ({one_line(encoding, 40)}) though identity was asked for"
            raise httpx.DecodingError(budget.why, request=response.request)

    # redirects are not followed: each hop was a new attempt with a new deadline (21 hops of a slow server held a
    # call with timeout=2 for 25 s); an OpenAI-compatible API root answers where it is asked
    return httpx.Client(transport=transport, timeout=timeout, follow_redirects=False,
                        headers={"Accept-Encoding": "identity"},
                        event_hooks={"request": [start_attempt], "response": [plain_body]})

