"""A request body within ``wire.HTTPLimits.max_request_body_bytes``: read it, or refuse it.

Owns the body side of the limits (the head side, its size and read time, is the
connection's: ``http_connection``). Both listeners read bodies through here: the proxy,
which holds a body whole before routing it, and a direct-ingress replica.

Invariants:
- A declared ``Content-Length`` over the limit is refused before a byte of the body is
  read (uvicorn sends ``100 Continue`` only once the app reads, so a client that waits for
  it never sends the body).
- A body without a declared length (chunked) is refused as soon as it passes the limit:
  never more than the limit plus one received chunk is held.
- A refusal is a 413 (RFC 9110 §15.5.14) with ``connection: close``: the rest of the body
  is not read as a next request; the connection drops it while it closes.
"""

from __future__ import annotations

from typing import Any, Iterable

from controlplane.routing.asgi import header_value, respond


class BodyTooLarge(Exception):
    """A request body over the limit: answered 413."""

    status = 413

    def __init__(self, limit_bytes: int, declared_bytes: int | None = None) -> None:
        super().__init__(limit_bytes, declared_bytes)
        self.limit_bytes, self.declared_bytes = limit_bytes, declared_bytes

    def __str__(self) -> str:
        size = (f"a declared {self.declared_bytes} bytes" if self.declared_bytes is not None
                else "more")
        return (f"request body too large: {size}, over the limit of {self.limit_bytes} "
                f"bytes (http_options.max_request_body_bytes)")


def declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The request's ``Content-Length``, or None without one. The parser (llhttp) has
    already refused a malformed or conflicting one with a 400."""
    value = header_value(headers, b"content-length").strip()
    return int(value) if value.isdigit() else None


async def read_body(receive: Any, headers: Iterable[tuple[bytes, bytes]],
                    limit_bytes: int) -> bytes | None:
    """A request's whole body; None when the client disconnected first (never a truncated
    body). Raises ``BodyTooLarge`` when it is, or says it will be, over ``limit_bytes``."""
    declared = declared_length(headers)
    if declared is not None and declared > limit_bytes:
        raise BodyTooLarge(limit_bytes, declared)
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit_bytes:
            raise BodyTooLarge(limit_bytes)
        chunks.append(chunk)
        more = message.get("more_body", False)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def refuse_body(send: Any, error: BodyTooLarge) -> None:
    """The 413 answer; the connection closes after it."""
    await respond(send, error.status, str(error), [(b"connection", b"close")])
