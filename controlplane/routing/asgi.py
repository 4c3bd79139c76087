"""The one ASGI response helper of the proxy and the data plane."""

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


async def read_body(receive: Any) -> bytes | None:
    """A request's whole body; None when the client disconnected first (never a
    truncated body)."""
    chunks, more = [], True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


def header_value(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str:
    """One request header's value (ASGI header names are lower-case), or ''."""
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return ""
