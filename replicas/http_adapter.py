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
import sys
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
    """Anything else as Ray Serve encodes it. Code that uses Serve gets Serve's own
    function (pandas too); a plain class does not import Serve for it."""
    if "ray.serve" in sys.modules:
        from ray.serve._private.http_util import convert_object_to_asgi_messages

        start, body = convert_object_to_asgi_messages(result)
        kind, content = dict(start["headers"])[b"content-type"], body["body"]
    else:
        kind, content = encode_like_serve(result)
    yield _head(200, [(b"content-type", kind), (b"content-length", str(len(content)).encode())])
    yield content


def encode_like_serve(result: Any) -> tuple[bytes, bytes]:
    """(content type, body) by Serve's rules: None an empty body, bytes and str as text,
    everything else through FastAPI's ``jsonable_encoder`` (pydantic models, Starlette's
    mappings, dataclasses) with Serve's encoders for exceptions and numpy, compact JSON."""
    if result is None or isinstance(result, (bytes, bytearray)):
        return b"text/plain", bytes(result or b"")
    if isinstance(result, str):
        return b"text/plain; charset=utf-8", result.encode()
    from fastapi.encoders import jsonable_encoder

    return b"application/json", json.dumps(jsonable_encoder(result, custom_encoder=_encoders()),
                                           separators=(",", ":")).encode()


def _encoders() -> dict:
    """Serve's custom encoders (``ray.serve._private.utils.serve_encoders``)."""
    encoders: dict = {Exception: str}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        encoders[numpy.ndarray] = lambda a: a.astype(
            float if a.dtype.kind == "f" else int if a.dtype.kind in "iu" else a.dtype).tolist()
        encoders[numpy.generic] = lambda v: v.item()
    return encoders
