"""HTTP on the replica side: rebuild a Starlette ``Request`` from what the proxy sent, and
turn whatever user code returned into a response head plus body chunks.

User code may return str, bytes, a dict or list (JSON), a Starlette ``Response`` (streaming
ones included), None, or a sync/async generator (streamed chunk by chunk), as in Ray Serve.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from controlplane.wire import HTTPRequestData


def to_starlette(data: HTTPRequestData) -> Request:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": data.method, "scheme": "http", "path": data.path,
        "raw_path": data.path.encode(), "query_string": data.query_string,
        "headers": data.headers, "client": data.client, "server": None,
        "root_path": "" if data.route_prefix == "/" else data.route_prefix,
    }
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": data.body, "more_body": False}

    return Request(scope, receive)


def _head(status: int, headers: list[tuple[bytes, bytes]]) -> dict:
    return {"status": status, "headers": headers}


def _encode(chunk: Any) -> bytes:
    if isinstance(chunk, bytes):
        return chunk
    if isinstance(chunk, str):
        return chunk.encode()
    return json.dumps(chunk).encode()


def is_streaming(result: Any) -> bool:
    return (isinstance(result, StreamingResponse) or inspect.isasyncgen(result)
            or inspect.isgenerator(result))


async def unary_response(result: Any) -> tuple[dict, bytes]:
    """(head, body) of a response that is not streamed."""
    parts = [part async for part in response_parts(result)]
    return parts[0], b"".join(parts[1:])


async def response_parts(result: Any) -> AsyncIterator[Any]:
    """Yields the response head (a dict) first, then body chunks (bytes)."""
    if isinstance(result, StreamingResponse):
        yield _head(result.status_code, list(result.raw_headers))
        async for chunk in result.body_iterator:
            yield _encode(chunk)
    elif isinstance(result, Response):
        yield _head(result.status_code, list(result.raw_headers))
        yield bytes(result.body)
    elif inspect.isasyncgen(result):
        yield _head(200, [(b"content-type", b"text/plain; charset=utf-8")])
        async for chunk in result:
            yield _encode(chunk)
    elif inspect.isgenerator(result):  # each next() in a thread: user code may block
        yield _head(200, [(b"content-type", b"text/plain; charset=utf-8")])
        done = object()
        while (chunk := await asyncio.to_thread(next, result, done)) is not done:
            yield _encode(chunk)
    else:
        async for part in _plain(result):
            yield part


async def _plain(result: Any) -> AsyncIterator[Any]:
    if isinstance(result, (bytes, bytearray)):
        kind, body = b"application/octet-stream", bytes(result)
    elif isinstance(result, str):
        kind, body = b"text/plain; charset=utf-8", result.encode()
    elif result is None:
        kind, body = b"text/plain; charset=utf-8", b""
    else:
        kind, body = b"application/json", json.dumps(result).encode()
    yield _head(200, [(b"content-type", kind), (b"content-length", str(len(body)).encode())])
    yield body
