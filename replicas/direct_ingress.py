"""Direct ingress: a replica serving HTTP itself, behind its node's HAProxy.

The same semantics as through the proxy: the route prefix (404 outside it), the same
HTTP limits (``http_options``' body and head sizes and timeouts), a Starlette
``Request`` for user code, streamed responses, WebSockets to an ``@serve.ingress`` app
(HAProxy passes the upgraded connection through), a user exception as a 500 with its
message, backpressure (``max_ongoing_requests`` + ``max_queued_requests``) as the
configured status with ``Retry-After``, and ``/-/healthz`` for HAProxy's checks (503 once
the replica is leaving or unhealthy, so HAProxy stops choosing it).

Shutdown is the replica's phase 2: ``close`` stops accepting (a late connection from a
stale HAProxy worker is refused, and HAProxy retries it elsewhere) while the requests in
flight finish.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from typing import Any, Awaitable, Callable

import uvicorn

from controlplane.routing.asgi import respond
from controlplane.routing.bind import bind_host
from controlplane.routing.http_connection import server_config
from controlplane.routing.http_limits import BodyTooLarge, read_body, refuse_body
from controlplane.wire import DirectIngressInit, HTTPRequestData

logger = logging.getLogger(__name__)

Serve = Callable[[HTTPRequestData, Any], Awaitable[None]]


def in_prefix(prefix: str, path: str) -> bool:
    return prefix == "/" or path == prefix or path.startswith(prefix.rstrip("/") + "/")


class DirectIngressApp:
    """The ASGI app; ``serve(data, send)`` runs the request on the replica (its slot)."""

    def __init__(self, config: DirectIngressInit, serve: Serve, load: Callable[[], int],
                 capacity: int, healthy: Callable[[], bool],
                 websocket: Callable[[dict, Any, Any], Awaitable[None]] | None = None) -> None:
        self._config, self._serve, self._load = config, serve, load
        self._capacity, self._healthy = capacity, healthy
        self._websocket = websocket  # an @serve.ingress app's WebSockets, or None
        self.limits = config.limits  # http_options' limits, as the proxy's
        self.leaving = False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            if self._websocket is None or self.leaving or self._full() or \
                    not in_prefix(self._config.route_prefix, scope["path"]):
                await send({"type": "websocket.close", "code": 1013})  # refused: 403
                return
            root = "" if self._config.route_prefix == "/" else self._config.route_prefix
            await self._websocket({**scope, "root_path": root}, receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/-/healthz":
            ok = self._healthy() and not self.leaving
            await respond(send, 200 if ok else 503, b"success" if ok else b"leaving")
        elif not in_prefix(self._config.route_prefix, path):
            await respond(send, 404, f"no route for {path}".encode())
        elif self._full():
            await self._reject(send)
        else:
            try:
                body = await read_body(receive, scope["headers"],
                                       self._config.limits.max_request_body_bytes)
            except BodyTooLarge as e:
                await refuse_body(send, e)
                return
            if body is None:
                return
            await self._serve(HTTPRequestData(
                method=scope["method"], path=path, query_string=scope["query_string"],
                headers=list(scope["headers"]), body=body,
                route_prefix=self._config.route_prefix,
                client=tuple(scope["client"]) if scope.get("client") else None), send)

    def _full(self) -> bool:
        queued = self._config.max_queued_requests
        return queued >= 0 and self._load() >= self._capacity + queued

    async def _reject(self, send: Any) -> None:
        retry = self._config.retry_after_s
        headers = [(b"retry-after", str(math.ceil(retry)).encode())] if retry else []
        await respond(send, self._config.status_code,
                      b"the replica's queue is full; retry later", headers)


class DirectIngress:
    """The listener: uvicorn on an ephemeral port, in the replica's event loop."""

    def __init__(self, app: DirectIngressApp, host: str) -> None:
        self.app, self._host = app, bind_host(host)
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Task | None = None
        self.address = ""

    async def start(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((self._host, 0))
        self.address = f"{self._host}:{sock.getsockname()[1]}"
        self._server = uvicorn.Server(server_config(self.app, self.app.limits))
        self._serving = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._serving.done():
                raise RuntimeError(f"direct ingress stopped: {self._serving.exception()!r}")
            await asyncio.sleep(0.01)
        return self.address

    def close(self) -> None:
        """Stop accepting; requests in flight finish (uvicorn's graceful shutdown)."""
        self.app.leaving = True
        if self._server is not None:
            self._server.should_exit = True
