"""``http_options``' body limit: the config fields, reading a body within the limit (a
declared Content-Length refused before a byte is read, a chunked body as soon as it
passes), and the proxy's 413. Plain ASGI messages; no server, no Ray."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controlplane.config.schema import ConfigError, HTTPOptions, parse_deploy_config
from controlplane.ingress.proxy import ProxyApp
from controlplane.ingress.proxy_metrics import ProxyMetrics
from controlplane.routing.http_limits import BodyTooLarge, read_body, refuse_body
from controlplane.wire import HTTPLimits, RoutesUpdate


class Receive:
    """The request messages uvicorn would give, counting how many were taken."""

    def __init__(self, *chunks: bytes, disconnect: bool = False) -> None:
        self.messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                         for i, c in enumerate(chunks)]
        if disconnect:
            self.messages[-1]["more_body"] = True
            self.messages.append({"type": "http.disconnect"})
        self.taken = 0

    async def __call__(self) -> dict:
        self.taken += 1
        return self.messages[self.taken - 1]


def read(receive: Receive, limit: int, content_length: int | None = None) -> bytes | None:
    headers = [] if content_length is None else [(b"content-length", b"%d" % content_length)]
    return asyncio.run(read_body(receive, headers, limit))


# ---- the config fields ------------------------------------------------------------------

def test_the_defaults_are_the_same_in_the_config_and_on_the_wire():
    assert HTTPOptions().limits() == HTTPLimits()
    assert HTTPLimits().max_request_body_bytes == 64 * 2**20  # refuses a 100 MB body
    assert HTTPOptions(host="h", max_header_bytes=2048).limits() == \
        HTTPLimits(max_header_bytes=2048)
    assert HTTPOptions(max_connections=5, request_body_timeout_s=2).limits() == \
        HTTPLimits(max_connections=5, request_body_timeout_s=2.0)


@pytest.mark.parametrize("field,value,message", [
    ("max_request_body_bytes", True, "valid integer"),
    ("max_request_body_bytes", 1.5, "valid integer"),
    ("max_request_body_bytes", "1MB", "valid integer"),
    ("max_request_body_bytes", 100, "greater than or equal to 1024"),
    ("max_request_body_bytes", 2**40, "less than or equal to 4294967296"),
    ("max_header_bytes", False, "valid integer"),
    ("max_header_bytes", 2**30, "less than or equal to 16777216"),
    ("request_header_timeout_s", True, "valid number"),
    ("request_header_timeout_s", 1e-9, "greater than or equal to 0.1"),
    ("request_header_timeout_s", float("inf"), "finite number"),
    ("keep_alive_timeout_s", True, "valid number"),
    ("keep_alive_timeout_s", 0, "greater than or equal to 1"),
    ("keep_alive_timeout_s", 1e308, "less than or equal to 3600"),
    ("request_body_timeout_s", True, "valid number"),
    ("request_body_timeout_s", 0.5, "greater than or equal to 1"),
    ("max_connections", 0, "greater than or equal to 1"),
    ("max_connections", 1.5, "valid integer"),
    ("show_error_messages", "yes", "valid boolean"),
    ("port", True, "valid integer"),
    ("proxies_per_node", True, "valid integer"),
])
def test_a_bad_limit_is_one_error_naming_the_field_and_the_bound(field, value, message):
    with pytest.raises(ConfigError) as raised:
        parse_deploy_config({"http_options": {field: value}})
    [line] = [line for line in str(raised.value).splitlines() if field in line]
    assert line.strip().startswith(f"- http_options.{field}: ") and message in line


def test_whole_numbers_are_taken_for_the_timeouts():
    cfg = parse_deploy_config({"http_options": {"keep_alive_timeout_s": 5,
                                                "request_header_timeout_s": 2}})
    assert (cfg.http_options.keep_alive_timeout_s, cfg.http_options.request_header_timeout_s) \
        == (5.0, 2.0)


# ---- reading a body within the limit ----------------------------------------------------

def test_a_body_at_the_limit_is_read_whole():
    assert read(Receive(b"ab", b"cd"), limit=4) == b"abcd"
    assert read(Receive(b"abcd"), limit=4, content_length=4) == b"abcd"
    assert read(Receive(b""), limit=4) == b""


def test_a_declared_length_over_the_limit_is_refused_before_a_byte_is_read():
    receive = Receive(b"x" * 10)
    with pytest.raises(BodyTooLarge) as raised:
        read(receive, limit=4, content_length=100_000_000)
    assert receive.taken == 0
    assert (raised.value.limit_bytes, raised.value.declared_bytes) == (4, 100_000_000)
    assert "a declared 100000000 bytes, over the limit of 4 bytes" in str(raised.value)


def test_a_chunked_body_is_refused_at_the_chunk_that_passes_the_limit():
    receive = Receive(b"ab", b"cd", b"e", b"never read")
    with pytest.raises(BodyTooLarge, match="over the limit of 4 bytes"):
        read(receive, limit=4)
    assert receive.taken == 3


def test_a_client_gone_mid_body_gives_none_never_a_truncated_body():
    assert read(Receive(b"ab", disconnect=True), limit=4) is None


def test_the_refusal_is_a_413_that_closes_the_connection():
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)
    asyncio.run(refuse_body(send, BodyTooLarge(4)))
    assert sent[0]["status"] == 413
    assert (b"connection", b"close") in sent[0]["headers"]
    assert b"http_options.max_request_body_bytes" in sent[1]["body"]


# ---- the proxy ----------------------------------------------------------------------------

class Routers:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def serve_http(self, key, data, send):
        self.bodies.append(data.body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return 200


class Trimmer:
    def __init__(self) -> None:
        self.noted: list[int] = []

    def note_body(self, size_bytes: int) -> None:
        self.noted.append(size_bytes)


def post(app: Any, receive: Receive, content_length: int | None = None) -> list[dict]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)
    headers = [] if content_length is None else [(b"content-length", b"%d" % content_length)]
    scope = {"type": "http", "method": "POST", "path": "/a", "query_string": b"",
             "headers": headers, "client": ("127.0.0.1", 1)}
    asyncio.run(app(scope, receive, send))
    return sent


def proxy(limit: int) -> tuple[ProxyApp, Routers, Trimmer]:
    routers, trimmer = Routers(), Trimmer()
    app = ProxyApp(routers, ProxyMetrics(), HTTPLimits(max_request_body_bytes=limit),
                   trimmer=trimmer)
    app.set_routes(RoutesUpdate(num_shards=1, generation=1, routes={"/a": "a/M"}))
    return app, routers, trimmer


def test_the_proxy_forwards_a_body_within_the_limit_and_notes_its_size():
    app, routers, trimmer = proxy(limit=4)
    assert post(app, Receive(b"ab", b"cd"))[0]["status"] == 200
    assert (routers.bodies, trimmer.noted) == ([b"abcd"], [4])


def test_the_proxy_answers_413_and_routes_nothing_for_a_body_over_the_limit():
    app, routers, trimmer = proxy(limit=4)
    assert post(app, Receive(b"abcdef"), content_length=6)[0]["status"] == 413
    assert post(app, Receive(b"abc", b"def"))[0]["status"] == 413
    assert routers.bodies == []
    assert trimmer.noted == [0, 4]  # a streamed refusal held up to the limit
    assert 'status_code="413"' in app.metrics.own_text()


# ---- a direct-ingress replica (haproxy mode) -------------------------------------------------

def test_a_direct_ingress_replica_gets_the_limits_and_answers_413_itself():
    from controlplane.specs import with_direct_ingress
    from replicas.direct_ingress import DirectIngressApp
    from tests.unit.shard_harness import make_spec

    http = HTTPOptions(host="127.0.0.1", port=8000, ingress="haproxy",
                       max_request_body_bytes=4096, max_header_bytes=2048)
    [spec] = with_direct_ingress([make_spec(1, route_prefix="/a")], http)
    assert spec.direct_ingress.limits == HTTPLimits(max_request_body_bytes=4096,
                                                    max_header_bytes=2048)
    served: list[bytes] = []

    async def serve(data, send) -> None:
        served.append(data.body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
    app = DirectIngressApp(spec.direct_ingress, serve, load=lambda: 0, capacity=1,
                           healthy=lambda: True)
    assert post(app, Receive(b"x" * 4097), content_length=4097)[0]["status"] == 413
    assert post(app, Receive(b"x" * 4096))[0]["status"] == 200
    assert served == [b"x" * 4096]
