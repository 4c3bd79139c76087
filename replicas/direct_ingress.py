"""Direct ingress: a replica serving HTTP itself, behind its node's HAProxy.

Through the same front door as a proxy (``controlplane.routing.front_door``): the route
prefix at a segment boundary (404 outside it), the same HTTP limits (``http_options``'
body and head sizes and times, the connection cap), a Starlette ``Request`` for user
code, streamed responses, a user exception as a 500 that names a request id,
backpressure as the configured status with the Retry-After its policy computes (this
replica's own ``SlotAdmission``: its slots are ``max_ongoing_requests``, up to
``max_queued_requests`` more wait), and ``/-/healthz`` for HAProxy's checks (503 once the
replica is leaving or unhealthy, so HAProxy stops choosing it). WebSockets go to an
``@serve.ingress`` app (HAProxy passes the upgraded connection through).

Shutdown is the replica's phase 2: ``close`` stops accepting (a late connection from a
stale HAProxy worker is refused, and HAProxy retries it elsewhere) while the requests in
flight finish.
"""

from __future__ import annotations

import socket
from typing import Any, Awaitable, Callable

from controlplane.clock import Clock, SystemClock
from controlplane.routing.admission import SlotAdmission
from controlplane.routing.asgi import respond
from controlplane.routing.bind import bind_host
from controlplane.routing.front_door import FrontDoor
from controlplane.routing.http_connection import server_config
from controlplane.routing.listen import Served
from controlplane.routing.route_table import RouteTable
from controlplane.routing.routing_config import RoutingConfig
from controlplane.wire import DirectIngressInit, HTTPRequestData

Serve = Callable[[HTTPRequestData, Any], Awaitable[None]]
WebSocketApp = Callable[[dict, Any, Any], Awaitable[None]]


class ReplicaSlots:
    """The front door's backend on a replica: admission by its own slots, then the
    replica's ``serve`` (the user's code in a slot, the response sent as it is made)."""

    def __init__(self, admission: SlotAdmission, serve: Serve,
                 websocket: WebSocketApp | None, leaving: Callable[[], bool]) -> None:
        self._admission, self._serve = admission, serve
        self._websocket, self._leaving = websocket, leaving

    async def serve_http(self, key: str, data: HTTPRequestData, send: Any) -> int:
        self._admission.admit()  # raises BackpressureError: the front door answers it
        await self._serve(data, send)
        return 0  # the user's response went out as it was made; its status is not seen

    async def serve_websocket(self, key: str, data: HTTPRequestData, scope: dict,
                              receive: Any, send: Any) -> None:
        if self._websocket is None or self._leaving() or self._admission.full():
            await send({"type": "websocket.close", "code": 1013})  # try again later: 403
            return
        root = "" if data.route_prefix == "/" else data.route_prefix
        await self._websocket({**scope, "root_path": root}, receive, send)


class DirectIngressApp(FrontDoor):
    """The replica's front door; ``serve(data, send)`` runs the request on the replica,
    ``load()`` is its ongoing + queued requests, ``capacity`` its ``max_ongoing_requests``."""

    def __init__(self, config: DirectIngressInit, serve: Serve, load: Callable[[], int],
                 capacity: int, healthy: Callable[[], bool],
                 websocket: WebSocketApp | None = None, clock: Clock | None = None) -> None:
        admission = SlotAdmission(
            RoutingConfig(deployment=config.deployment or config.route_prefix,
                          max_ongoing_requests=capacity,
                          max_queued_requests=config.max_queued_requests,
                          status_code=config.status_code, retry_after_s=config.retry_after_s,
                          retry_after_policy=config.retry_after_policy),
            load, clock if clock is not None else SystemClock())
        super().__init__(ReplicaSlots(admission, serve, websocket, lambda: self.leaving),
                         config.limits, show_error_messages=config.show_error_messages,
                         routes=RouteTable({config.route_prefix: config.deployment}),
                         endpoints={"/-/healthz": self._healthz})
        self._healthy = healthy
        self.leaving = False

    async def _healthz(self, send: Any) -> None:
        ok = self._healthy() and not self.leaving
        await respond(send, 200 if ok else 503, b"success" if ok else b"leaving")


class DirectIngress:
    """The listener: uvicorn on an ephemeral port, in the replica's event loop."""

    def __init__(self, app: DirectIngressApp, host: str) -> None:
        self.app, self._host = app, bind_host(host)
        self._served: Served | None = None
        self.address = ""

    async def start(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((self._host, 0))
        self.address = f"{self._host}:{sock.getsockname()[1]}"
        self._served = await Served.start(server_config(self.app, self.app.limits), sock,
                                          "direct ingress")
        return self.address

    def close(self) -> None:
        """Stop accepting; requests in flight finish (uvicorn's graceful shutdown)."""
        self.app.leaving = True
        if self._served is not None:
            self._served.stop()
