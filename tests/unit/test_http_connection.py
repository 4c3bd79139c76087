"""A listener's connection (``http_connection.LimitedHTTPProtocol``): the head's size
(431) and read time (408, or a silent close of an idle connection), the body's read time
(408), a malformed request (400), a body over the limit (413), each closed lingering; and
the listener's cap on open connections. A real protocol instance (uvicorn's parser, our
ASGI body limit) over a fake transport, on a virtual clock that the test moves: exact
deadlines, never a wait."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from uvicorn.server import ServerState

from controlplane.routing.asgi import respond
from controlplane.routing.http_connection import _LINGER_S, server_config
from controlplane.routing.http_limits import BodyTooLarge, read_body, refuse_body
from controlplane.wire import HTTPLimits

LIMITS = HTTPLimits(max_request_body_bytes=4096, max_header_bytes=1024,
                    request_header_timeout_s=7.0, keep_alive_timeout_s=60.0,
                    request_body_timeout_s=20.0, max_connections=3)


async def size_app(scope: dict, receive: Any, send: Any) -> None:
    """Answers the body's length; 413 over the limit (as the proxy does); nothing when
    the client left."""
    try:
        body = await read_body(receive, scope["headers"], LIMITS.max_request_body_bytes)
    except BodyTooLarge as e:
        await refuse_body(send, e)
        return
    if body is not None:
        await respond(send, 200, str(len(body)))


async def early_app(scope: dict, receive: Any, send: Any) -> None:
    """Answers its head before it reads the body (a streaming upload's echo)."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await read_body(receive, scope["headers"], LIMITS.max_request_body_bytes)
    await send({"type": "http.response.body", "body": b""})


class Timer:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class TimerLoop:
    """The running loop, except for time: ``time`` and ``call_later`` follow a virtual
    clock that only ``advance`` moves."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.now = 0.0
        self.timers: list[Timer] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> Timer:
        self.timers.append(Timer(self.now + delay, lambda: callback(*args)))
        return self.timers[-1]

    def create_task(self, coro: Any, **kwargs: Any) -> asyncio.Task:
        return self._loop.create_task(coro, **kwargs)

    def advance(self, seconds: float) -> None:
        """Move the clock by ``seconds``, running each timer due by then at its time."""
        target = self.now + seconds
        while due := [t for t in self.timers if not t.cancelled and t.when <= target]:
            timer = min(due, key=lambda t: t.when)
            self.timers.remove(timer)
            self.now = timer.when
            timer.callback()
        self.now = target


class Transport:
    def __init__(self) -> None:
        self.written, self.closed, self.eof, self.protocol = bytearray(), False, False, None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default)

    def write(self, data: bytes) -> None:
        assert not self.closed and not self.eof, "written after close"
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_protocol(self) -> Any:
        return self.protocol

    def take(self) -> bytes:
        out, self.written = bytes(self.written), bytearray()
        return out


class Connection:
    def __init__(self, app: Any = size_app, config: Any = None,
                 state: ServerState | None = None) -> None:
        """A connection to a listener serving ``app`` (or of ``config``: another
        connection's listener, with its ``state``)."""
        if config is None:
            config = server_config(app, LIMITS)
            config.load()
        self.config, self.state = config, state if state is not None else ServerState()
        self.loop, self.transport = TimerLoop(), Transport()
        self.protocol = config.http_protocol_class(
            config=config, server_state=self.state, app_state={}, _loop=self.loop)
        self.transport.protocol = self.protocol
        self.protocol.connection_made(self.transport)

    def another(self) -> Connection:
        """A new connection to the same listener."""
        return Connection(config=self.config, state=self.state)

    async def send(self, *chunks: bytes) -> bytes:
        """Feed ``chunks``, let the app run, return what was answered."""
        for chunk in chunks:
            self.protocol.data_received(chunk)
        for _ in range(20):  # the app's task and its sends: a few loop turns, no time passes
            await asyncio.sleep(0)
        return self.transport.take()


def run(scenario: Callable[[Connection], Any], app: Any = size_app) -> None:
    async def main() -> None:
        await scenario(Connection(app))
    asyncio.run(main())


def get(padding: int = 0) -> bytes:
    return b"GET /a HTTP/1.1\r\nhost: x\r\nx-pad: " + b"p" * padding + b"\r\n\r\n"


def head_of(size: int) -> bytes:
    """A GET whose head is exactly ``size`` bytes."""
    return get(size - len(get()))


def post(body: bytes) -> bytes:
    return b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def lingering(c: Connection) -> bool:
    """Our side shut after the answer, the client's bytes still read (and dropped)."""
    return c.transport.eof and not c.transport.closed


# ---- within the limits ----------------------------------------------------------------------

def test_requests_within_the_limits_are_answered_on_a_kept_connection():
    async def scenario(c: Connection) -> None:
        assert (await c.send(head_of(1024))).endswith(b"\r\n\r\n0")
        answer = await c.send(post(b"x" * 4096))  # head and body in one read: only the head counts
        assert status(answer) == 200 and answer.endswith(b"4096")
        assert not c.transport.eof and not c.transport.closed
    run(scenario)


def test_pipelined_requests_each_count_their_own_head():
    async def scenario(c: Connection) -> None:
        answers = await c.send(head_of(1000) + head_of(1000) + head_of(1000))
        assert answers.count(b"HTTP/1.1 200 OK") == 3
    run(scenario)


# ---- the head's size ------------------------------------------------------------------------

def test_a_head_one_byte_over_the_limit_is_a_431_in_one_read_or_many():
    async def one_read(c: Connection) -> None:
        answer = await c.send(head_of(1025))
        assert status(answer) == 431 and b"connection: close" in answer
        assert b"http_options.max_header_bytes" in answer
        assert lingering(c)

    async def many_reads(c: Connection) -> None:
        request = head_of(1025)
        answer = await c.send(*(request[i:i + 100] for i in range(0, len(request), 100)))
        assert status(answer) == 431 and lingering(c)
    run(one_read)
    run(many_reads)


def test_an_endless_header_is_refused_without_being_held():
    async def scenario(c: Connection) -> None:
        answer = await c.send(b"GET /a HTTP/1.1\r\nx-big: ", *(b"b" * 65536 for _ in range(16)))
        assert status(answer) == 431
        assert c.protocol._head_bytes == 1024  # the rest never reached the parser
    run(scenario)


# ---- the head's time -------------------------------------------------------------------------

def test_a_head_not_whole_in_time_is_a_408_at_the_deadline():
    async def scenario(c: Connection) -> None:
        assert await c.send(b"GET /a HTTP/1.1\r\nhost") == b""
        c.loop.advance(6.99)
        assert c.transport.take() == b"" and not c.transport.eof
        c.loop.advance(0.01)  # 7 s after the connection opened
        answer = c.transport.take()
        assert status(answer) == 408 and b"request_header_timeout_s" in answer
        assert lingering(c)
    run(scenario)


def test_a_connection_that_sends_nothing_is_closed_silently():
    async def scenario(c: Connection) -> None:
        c.loop.advance(7.0)
        assert c.transport.closed and c.transport.take() == b""
    run(scenario)


def test_each_request_has_its_own_deadline_from_its_first_byte():
    async def scenario(c: Connection) -> None:
        assert status(await c.send(get())) == 200
        c.loop.advance(5.0)  # an idle keep-alive, shorter than keep_alive_timeout_s
        await c.send(b"GET /a HTTP/1.1\r\n")  # at 5 s: due at 12 s
        c.loop.advance(6.99)
        assert not c.transport.eof and c.transport.take() == b""
        c.loop.advance(0.01)
        assert status(c.transport.take()) == 408 and c.loop.now == 12.0
    run(scenario)


def test_an_idle_kept_connection_is_closed_by_the_keep_alive_timer():
    async def scenario(c: Connection) -> None:
        await c.send(get())
        c.loop.advance(59.99)
        assert not c.transport.closed
        c.loop.advance(0.01)
        assert c.transport.closed and c.transport.take() == b""
    run(scenario)


# ---- the body's time -------------------------------------------------------------------------

def test_a_body_not_whole_in_time_is_a_408_and_the_app_hears_the_client_left():
    async def scenario(c: Connection) -> None:
        head = b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n"
        assert await c.send(head, b"x" * 10) == b""  # at 0 s: due at 20 s
        c.loop.advance(19.99)
        assert await c.send(b"x" * 10) == b"" and not c.transport.eof
        c.loop.advance(0.01)
        answer = await c.send()  # the app's turn: it read a disconnect, answers nothing
        assert status(answer) == 408 and b"http_options.request_body_timeout_s" in answer
        assert answer.count(b"HTTP/1.1") == 1 and lingering(c)
    run(scenario)


def test_a_slow_body_whole_in_time_is_answered_and_the_next_request_has_its_own_time():
    async def scenario(c: Connection) -> None:
        head = b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 30\r\n\r\n"
        await c.send(head)
        answers = []
        for _ in range(3):
            c.loop.advance(6.0)
            answers.append(await c.send(b"x" * 10))
        assert answers[:2] == [b"", b""] and answers[2].endswith(b"30")  # whole at 18 s
        c.loop.advance(3.0)  # past the first body's due time: nothing of a body pending
        assert (await c.send(head, b"y" * 30)).endswith(b"30")
        c.loop.advance(30.0)
        assert not c.transport.eof
    run(scenario)


def test_a_body_late_after_its_answer_started_drops_the_connection():
    async def scenario(c: Connection) -> None:
        head = b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n"
        assert status(await c.send(head)) == 200  # its head went out at once
        c.loop.advance(20.0)
        assert c.transport.closed and c.transport.take() == b""  # no second answer
    run(scenario, early_app)


# ---- the listener's connections ---------------------------------------------------------------

def test_a_connection_over_the_cap_is_closed_at_once_and_one_is_taken_when_another_ends(
        caplog):
    async def scenario(c: Connection) -> None:
        second, third = c.another(), c.another()
        with caplog.at_level(logging.WARNING, logger="controlplane.routing.http_connection"):
            fourth = c.another()
        assert fourth.transport.closed and fourth.transport.take() == b""
        fourth.protocol.connection_lost(None)
        assert [r.getMessage() for r in caplog.records] == [
            "refused 1 connection(s) at the cap of 3 open on this listener "
            "(http_options.max_connections) since the last such line (at most one per 10 s)"]
        for kept in (c, second, third):  # the three within the cap are served
            assert status(await kept.send(get())) == 200
        third.transport.close()
        third.protocol.connection_lost(None)
        fifth = c.another()
        assert status(await fifth.send(get())) == 200
    run(scenario)


def test_refused_connections_are_logged_once_per_interval_with_their_count(caplog):
    from controlplane.clock import FakeClock
    from controlplane.routing.http_connection import RefusalLog

    clock = FakeClock()
    log = RefusalLog(every_s=10.0, clock=clock.monotonic)
    with caplog.at_level(logging.WARNING, logger="controlplane.routing.http_connection"):
        for _ in range(300):
            log.refused(100)
        clock.advance(10.0)
        log.refused(100)
    assert [r.getMessage().split(" at the")[0] for r in caplog.records] == [
        "refused 1 connection(s)", "refused 300 connection(s)"]


# ---- malformed requests, bodies over the limit, and lingering ---------------------------------

def test_a_malformed_request_is_a_400_and_what_follows_is_dropped():
    async def scenario(c: Connection) -> None:
        answer = await c.send(b"\x16\x03\x01 not http\r\n\r\n")
        assert status(answer) == 400 and b"connection: close" in answer
        assert await c.send(get()) == b""  # never parsed, never answered
        assert lingering(c)
    run(scenario)


def test_a_declared_body_over_the_limit_is_a_413_and_the_body_is_dropped_while_closing():
    async def scenario(c: Connection) -> None:
        head = b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 100000000\r\n\r\n"
        answer = await c.send(head, b"x" * 65536)
        assert status(answer) == 413 and b"connection: close" in answer
        assert lingering(c)
        assert await c.send(*(b"x" * 65536 for _ in range(8))) == b""
        c.loop.advance(_LINGER_S - 0.01)
        assert not c.transport.closed
        c.loop.advance(0.01)
        assert c.transport.closed
    run(scenario)


def test_a_chunked_body_over_the_limit_is_a_413_as_it_passes():
    async def scenario(c: Connection) -> None:
        head = b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        chunk = b"%x\r\n%s\r\n" % (1000, b"y" * 1000)
        answer = await c.send(head, *(chunk for _ in range(5)))
        assert status(answer) == 413 and lingering(c)
    run(scenario)


def test_a_client_that_closes_its_side_ends_the_lingering():
    async def scenario(c: Connection) -> None:
        await c.send(b"\x00garbage\r\n\r\n")
        assert lingering(c)
        assert not c.protocol.eof_received()  # falsy: asyncio closes the transport
    run(scenario)


def test_a_flood_of_malformed_requests_logs_one_line_per_interval():
    from controlplane.clock import FakeClock
    from controlplane.routing.http_connection import InvalidRequestLogFilter

    clock = FakeClock()
    log_filter = InvalidRequestLogFilter(every_s=10.0, clock=clock.monotonic)

    def passes(msg: str) -> bool:
        return log_filter.filter(logging.LogRecord("uvicorn.error", logging.WARNING, "", 0,
                                                   msg, (), None))
    assert passes(InvalidRequestLogFilter.MESSAGE)
    assert [passes(InvalidRequestLogFilter.MESSAGE) for _ in range(500)] == [False] * 500
    assert passes("Unsupported upgrade request.")  # other lines are untouched
    clock.advance(10.0)
    record = logging.LogRecord("uvicorn.error", logging.WARNING, "", 0,
                               InvalidRequestLogFilter.MESSAGE, (), None)
    assert log_filter.filter(record) and "501 since the last such line" in record.msg
