"""The one ASGI response helper of the proxy and the data plane (a request body is read
within its limit by ``http_limits.read_body``)."""

from __future__ import annotations

from typing import Any, Iterable

# Ray Serve's header naming the multiplexed model a request is for.
MODEL_ID_HEADER = b"serve_multiplexed_model_id"


async def respond(send: Any, status: int, body: bytes | str,
                  headers: list[tuple[bytes, bytes]] = (),
                  content_type: bytes = b"text/plain; charset=utf-8") -> None:
    """A complete, non-streamed ASGI response."""
    body = body.encode() if isinstance(body, str) else body
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


def rejection_headers(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """``BackpressureError.headers()`` as ASGI header pairs."""
    return [(k.lower().encode(), v.encode()) for k, v in headers.items()]


def header_value(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str:
    """One request header's value (ASGI header names are lower-case), or ''."""
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return ""
