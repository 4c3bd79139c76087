"""One client connection of an HTTP listener (the proxy, a direct-ingress replica):
uvicorn's httptools protocol with the limits uvicorn lacks.

uvicorn 0.54's httptools protocol bounds neither the size of a request head (llhttp has
no limit; httptools and uvicorn concatenate URL and header fragments without one) nor
the time to receive it (its keep-alive timer runs only between requests, so a connection
that trickles a head, or sends nothing, is held forever). Its h11 protocol has a size
bound but answers it 400, and is slower. This subclass adds, per ``HTTPLimits``:

- head size: a request's bytes are counted from its first one until its head is parsed;
  no byte past ``max_header_bytes`` reaches the parser, and a head that does not end
  within them is answered 431 (RFC 6585 §5).
- head time: from the connection's open, or a request's first byte after a keep-alive
  idle, its head must be whole within ``request_header_timeout_s``: else 408 (RFC 9110
  §15.5.9) when part of it came, a silent close when nothing did (an idle preconnect).
- body time: from its head's end, a request's body must be whole within
  ``request_body_timeout_s``: else 408 while nothing was answered (the app's ``receive``
  then says the client left, so it lets go of what it read), the connection dropped when
  an answer had started. A slow body would otherwise hold its connection, and up to
  ``max_request_body_bytes`` of memory, for as long as its client trickles.
- connections: past ``max_connections`` open on the listener, a new one is closed at once,
  before a byte of it is read (the cheapest refusal, as Node's ``server.maxConnections``:
  a client may retry, HAProxy retries another replica); one log line per 10 s counts them.
- idle between requests: uvicorn's own keep-alive timer (``keep_alive_timeout_s``).
- a refusal (431, 408, the parser's 400, an app's 413 while the body still arrives)
  closes lingering, as nginx's ``lingering_close`` and Go's ``closeWriteAndWait`` do:
  after the answer our side is shut (FIN) and what the client still sends is read and
  dropped for up to ``_LINGER_S``, so it reads the answer instead of a reset (a client
  that writes its whole body before reading, as ``requests`` and ``httpx`` do, would
  otherwise see "connection reset" and not the 413).

One timer per connection, never one per request: it checks the deadline in progress (the
head's, else the body's) when it fires and is armed again only while one is.

Depends on uvicorn's httptools protocol's hooks (``on_headers_complete``,
``on_message_complete``, ``on_response_complete``, ``send_400_response``), its
``connections`` set and ``pipeline``, and on its request cycle (closing
``cycle.transport``; ``disconnected`` and ``message_event`` as its ``connection_lost``
sets them); ``tests/unit/test_http_connection.py`` drives a real instance over a fake
transport and pins each behaviour.
"""

from __future__ import annotations

import asyncio
import http
import logging
import time
from typing import Any, Callable

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from controlplane.wire import HTTPLimits

_LINGER_S = 3.0  # nginx lingers up to 30 s, Go 0.5 s; a loopback 100 MB body drains in 0.1 s
logger = logging.getLogger(__name__)


def server_config(app: Any, limits: HTTPLimits) -> uvicorn.Config:
    """uvicorn's config for a listener serving ``app`` within ``limits``."""
    protocol = type("LimitedHTTPProtocol", (LimitedHTTPProtocol,),
                    {"limits": limits, "refusals": RefusalLog()})
    config = uvicorn.Config(app, http=protocol, log_level="warning", lifespan="off",
                            access_log=False, timeout_keep_alive=limits.keep_alive_timeout_s)
    uvicorn_log = logging.getLogger("uvicorn.error")  # after Config: it configures logging
    if not any(isinstance(f, InvalidRequestLogFilter) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(InvalidRequestLogFilter())
    return config


class InvalidRequestLogFilter(logging.Filter):
    """uvicorn logs each malformed request as a warning: a flood of them would flood the
    log. One line per ``every_s`` passes, saying how many there were."""

    MESSAGE = "Invalid HTTP request received."  # uvicorn's httptools_impl.data_received

    def __init__(self, every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._every_s, self._clock = every_s, clock
        self._last: float | None = None
        self._count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != self.MESSAGE:
            return True
        self._count += 1
        now = self._clock()
        if self._last is not None and now - self._last < self._every_s:
            return False
        record.msg = (f"Invalid HTTP request received: {self._count} since the last such "
                      f"line, each answered 400 (at most one line per {self._every_s:g} s)")
        self._last, self._count = now, 0
        return True


class RefusalLog:
    """Connections refused over the cap, said once per ``every_s`` with their count (a
    line each would flood the log exactly when the listener is busiest)."""

    def __init__(self, every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._every_s, self._clock = every_s, clock
        self._last: float | None = None
        self._count = 0

    def refused(self, cap: int) -> None:
        self._count += 1
        now = self._clock()
        if self._last is not None and now - self._last < self._every_s:
            return
        logger.warning("refused %d connection(s) at the cap of %d open on this listener "
                       "(http_options.max_connections) since the last such line (at most "
                       "one per %g s)", self._count, cap, self._every_s)
        self._last, self._count = now, 0


class _CycleTransport:
    """The transport as uvicorn's request cycle sees it: its ``close`` (after an answer
    with ``connection: close``, or to abort one) closes lingering; the rest is the
    transport's own (``write`` and ``is_closing`` bound once: no lookup per write)."""

    def __init__(self, transport: asyncio.Transport, close: Callable[[], None]) -> None:
        self._transport, self.close = transport, close
        self.write, self.is_closing = transport.write, transport.is_closing

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class LimitedHTTPProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol within ``limits`` (the module's docstring says how)."""

    limits: HTTPLimits  # each listener's own, with its RefusalLog: server_config
    refusals: RefusalLog

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # from a request's first byte (or the open) to its parsed head
        self._head_bytes = 0
        self._heads = 0  # heads parsed on this connection
        self._head_deadline: float | None = None  # loop time the head in progress is due
        self._body_deadline: float | None = None  # loop time the body in progress is due
        self._timer: asyncio.TimerHandle | None = None  # checks the deadlines (docstring)
        self._linger_timer: asyncio.TimerHandle | None = None
        self._lingering = False  # answered and closing: what the client still sends is dropped

    # ---- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # counted in ``connections`` from here
        if len(self.connections) > self.limits.max_connections:
            self.refusals.refused(self.limits.max_connections)
            transport.close()
            return
        self._head_starts()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        while data:
            if self._lingering or self.transport.is_closing():
                return  # dropped: the connection is closing
            if self.transport.get_protocol() is not self:  # upgraded (a WebSocket)
                self.transport.get_protocol().data_received(data)
                return
            if not self._in_head:
                super().data_received(data)
                return
            data = self._receive_head(data)

    def _receive_head(self, data: bytes) -> bytes:
        """Parse what fits the head limit; return what is left for the body or the next
        request (b"" when all was parsed or the head was refused). A next request that
        starts within what is parsed counts from the next read: at most one read (256 KiB
        in asyncio) more than the limit reaches the parser."""
        if self._head_deadline is None:
            self._head_starts()
        room = self.limits.max_header_bytes - self._head_bytes
        if len(data) <= room:
            self._head_bytes += len(data)
            super().data_received(data)
            return b""
        self._head_bytes += room
        heads = self._heads
        super().data_received(data[:room])
        if self._heads == heads and not self._lingering and not self.transport.is_closing():
            self._refuse(431, f"request head over {self.limits.max_header_bytes} bytes "
                              f"(http_options.max_header_bytes)")
            return b""
        return data[room:]

    # ---- uvicorn's hooks ------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self._in_head, self._head_deadline = False, None
        self._heads += 1
        # the body's deadline, inline: a GET's is set and cleared within this one read
        self._body_deadline = self.loop.time() + self.limits.request_body_timeout_s
        if self._timer is None:
            self._arm(self.limits.request_body_timeout_s)
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and not isinstance(cycle.transport, _CycleTransport):
            cycle.transport = _CycleTransport(self.transport, self._close_lingering)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes = True, 0  # the next request's head starts
        self._body_deadline = None

    def on_response_complete(self) -> None:
        if self._lingering:  # no keep-alive, no next pipelined request
            self.server_state.total_requests += 1
            return
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, msg)

    # ---- refusing and closing ------------------------------------------------------------

    def _head_starts(self) -> None:
        self._head_deadline = self.loop.time() + self.limits.request_header_timeout_s
        self._arm(self.limits.request_header_timeout_s)

    def _arm(self, delay_s: float) -> None:
        """Arm the connection's timer unless it is armed: a pending one checks again."""
        if self._timer is None:
            self._timer = self.loop.call_later(delay_s, self._check_deadlines)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_deadlines(self) -> None:
        self._timer = None
        if self._lingering or self.transport.is_closing() or \
                self.transport.get_protocol() is not self:  # upgraded: no HTTP to time
            return
        if self._head_deadline is not None:
            self._check_head(self._head_deadline)
        elif self._body_deadline is not None:
            self._check_body(self._body_deadline)
        # else nothing in progress: the next head or body arms the timer again

    def _check_head(self, deadline: float) -> None:
        left_s = deadline - self.loop.time()
        if left_s > 0 or self._answering():  # a later head; or one pipelined behind an answer
            self._arm(left_s if left_s > 0 else self.limits.request_header_timeout_s / 10)
        elif self._head_bytes == 0:
            self.transport.close()  # nothing of a request came: no one to answer
        else:
            self._refuse(408, "request head not complete in time "
                              "(http_options.request_header_timeout_s)")

    def _check_body(self, deadline: float) -> None:
        left_s = deadline - self.loop.time()
        if left_s > 0 or self.pipeline:  # a later body; or one queued (unread) behind another
            self._arm(left_s if left_s > 0 else self.limits.request_body_timeout_s / 10)
            return
        cycle = self.cycle
        if cycle is None or cycle.response_started:  # an answer is out: it cannot change
            self.transport.close()
            return
        # The app waits in ``receive`` for the rest: tell it the client left, as uvicorn's
        # connection_lost does (its sends are dropped from now on), then answer for it.
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.write(_answer(408, "request body not complete in time "
                                          "(http_options.request_body_timeout_s)",
                                     self.server_state.default_headers))
        self._close_lingering()

    def _answering(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` and close lingering; inside another answer (a pipelined
        request), drop the connection instead of corrupting that answer."""
        if self._answering():
            self.transport.close()
            return
        self.transport.write(_answer(status, message, self.server_state.default_headers))
        self._close_lingering()

    def _close_lingering(self) -> None:
        if self._lingering or self.transport.is_closing():
            return
        self._lingering = True
        self._cancel_timer()
        self._unset_keepalive_if_required()
        if self.transport.can_write_eof():
            self.transport.write_eof()  # after what is buffered: the client sees the answer end
        self.flow.resume_reading()  # a paused body: read it now, to drop it
        self._linger_timer = self.loop.call_later(_LINGER_S, self.transport.close)


def _answer(status: int, message: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    body = message.encode()
    head = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n".encode()]
    head += [name + b": " + value + b"\r\n" for name, value in default_headers]
    head += [b"content-type: text/plain; charset=utf-8\r\n",
             b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n"]
    return b"".join(head) + body
