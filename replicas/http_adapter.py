"""HTTP on the replica side: rebuild a Starlette ``Request`` from what the proxy sent, and
turn whatever user code returned into a response head plus body chunks.

User code may return str, bytes, a dict or list (JSON), a Starlette ``Response`` (streaming
ones included), None, or a sync/async generator (streamed chunk by chunk), as in Ray Serve;
an ``@serve.ingress`` app's response arrives as an ``AsgiResponse``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from controlplane.wire import HTTPRequestData
from replicas.asgi_ingress import AsgiResponse


def asgi_scope(data: HTTPRequestData) -> dict:
    """The ASGI scope Serve's proxy hands a replica: the full path, the application's
    route_prefix as root_path."""
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": data.method, "scheme": "http", "path": data.path,
        "raw_path": data.path.encode(), "query_string": data.query_string,
        "headers": data.headers, "client": data.client, "server": None,
        "root_path": "" if data.route_prefix == "/" else data.route_prefix,
    }


def to_starlette(data: HTTPRequestData) -> Request:
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": data.body, "more_body": False}

    return Request(asgi_scope(data), receive)


def _head(status: int, headers: list[tuple[bytes, bytes]]) -> dict:
    return {"status": status, "headers": headers}


def _encode(chunk: Any) -> bytes:
    if isinstance(chunk, bytes):
        return chunk
    if isinstance(chunk, str):
        return chunk.encode()
    return json.dumps(chunk).encode()


def is_streaming(result: Any) -> bool:
    """Whether the response needs more than one round trip (an ``AsgiResponse`` is
    prefetched first: it streams only if its app has not finished)."""
    if isinstance(result, AsgiResponse):
        return not result.finished
    return (isinstance(result, StreamingResponse) or inspect.isasyncgen(result)
            or inspect.isgenerator(result))


async def unary_response(result: Any) -> tuple[dict, bytes]:
    """(head, body) of a response that is not streamed."""
    parts = [part async for part in response_parts(result)]
    return parts[0], b"".join(parts[1:])


async def response_parts(result: Any) -> AsyncIterator[Any]:
    """Yields the response head (a dict) first, then body chunks (bytes)."""
    if isinstance(result, AsgiResponse):
        async for part in result.parts():
            yield part
    elif isinstance(result, StreamingResponse):
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
    """Anything else as Ray Serve encodes it (``convert_object_to_asgi_messages``): None
    an empty body, bytes and str as text, everything else through FastAPI's
    ``jsonable_encoder`` with Serve's encoders (pydantic models, numpy, Starlette's
    mappings), compact JSON."""
    from ray.serve._private.http_util import convert_object_to_asgi_messages

    start, body = convert_object_to_asgi_messages(result)
    headers = [tuple(h) for h in start["headers"]]
    yield _head(200, [*headers, (b"content-length", str(len(body["body"])).encode())])
    yield body["body"]
