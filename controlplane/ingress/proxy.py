"""The HTTP proxy actor: ``http_options.proxies_per_node`` per node, sharing the port
(SO_REUSEPORT: the kernel spreads new connections over the live listeners, so while Ray
restarts a killed one the others take every new connection), serving with uvicorn.

Requests are matched to an application's ingress deployment by longest route prefix and
handed to that deployment's ``Router`` (power of two choices, backpressure). Routes and
replica sets arrive by long-poll (``RoutingSubscriber``): no controller call per request.
The response head is awaited before answering, so a backpressure rejection or a dead
replica becomes a clean status code; the body then streams as the replica yields it.

What a client may send is bounded by ``http_options`` (``HTTPLimits``): the head's size
and read time and malformed bytes by the connection (``routing/http_connection``: 431,
408, 400), the body by ``routing/http_limits`` (413, before routing); after a large body
the freed heap goes back to the OS (``routing/heap_trim``).

Endpoints of its own: ``/-/healthz`` ("success" once it holds a route table, 503 while its
node drains: readiness, not liveness; it keeps serving),
``/-/routes`` (JSON prefix -> app), ``/metrics`` (Prometheus text).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import socket
import time
from typing import Any

import ray
import uvicorn

from controlplane.clock import SystemClock
from controlplane.priority import take_control_priority
from controlplane.ingress.proxy_fleet import proxy_actor_name
from controlplane.ingress.proxy_metrics import ProxyMetrics
from controlplane.routing.asgi import respond
from controlplane.routing.bind import bind_host
from controlplane.routing.heap_trim import HeapTrimmer, libc_malloc_trim
from controlplane.routing.http_connection import server_config
from controlplane.routing.http_limits import BodyTooLarge, read_body, refuse_body
from controlplane.routing.route_table import RouteTable
from controlplane.routing.router_set import RouterSet
from controlplane.routing.subscriber import RoutingSubscriber
from controlplane.routing.transport import StreamAborted
from controlplane.settings import Settings
from controlplane.supervision import restarted_by_ray
from controlplane.wire import HTTPLimits, HTTPRequestData, RoutesUpdate

logger = logging.getLogger(__name__)
_RESTART_ROUTES_WAIT_S = 5.0  # a restarted proxy waits this long at most for its routes


class ClientGone(Exception):
    """The client disconnected before its response was complete."""


async def _read_body(receive: Any, scope: dict, limit_bytes: int) -> bytes:
    body = await read_body(receive, scope["headers"], limit_bytes)
    if body is None:
        raise ClientGone()  # never forward a truncated body
    return body


async def _wait_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(work: Any, receive: Any) -> Any:
    """Run ``work``; if the client disconnects first, cancel it (freeing its router and
    replica slots) and raise ClientGone. uvicorn does not cancel the app by itself."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientGone()
    return task.result()


class ProxyApp:
    """The ASGI application; separate from the actor so it can be served in tests."""

    def __init__(self, routers: RouterSet, metrics: ProxyMetrics,
                 fetch_health: Any = None, fetch_siblings: Any = None,
                 listener: str = "0", limits: HTTPLimits = HTTPLimits(),
                 trimmer: HeapTrimmer | None = None) -> None:
        self.routers = routers
        self.metrics = metrics
        self.limits = limits
        self._trimmer = trimmer  # gives a large body's memory back once it is freed
        self._fetch_health = fetch_health  # async () -> controller.health, or None
        self._fetch_siblings = fetch_siblings  # async () -> {listener: own_text}, or None
        self._listener = listener
        self.table = RouteTable()
        self.has_routes = False
        self.draining = False  # its node is draining: not ready, still serving

    def set_routes(self, update: RoutesUpdate) -> None:
        self.table = RouteTable(update.routes)
        self.has_routes = True

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/-/healthz":
            ok = self.has_routes and not self.draining
            await respond(send, 200 if ok else 503, b"success" if ok else
                          b"node draining" if self.draining else b"no route table yet")
        elif path == "/-/routes":
            await respond(send, 200, json.dumps(self.table.routes), content_type=b"application/json")
        elif path == "/metrics":
            await self._metrics(send)
        else:
            await self._forward(scope, receive, send)

    async def _metrics(self, send: Any) -> None:
        """A few small RPCs per scrape, never per request: the controller's health and the
        node's other listeners' samples (a listener that does not answer is left out)."""
        if self._fetch_health is not None:
            try:
                self.metrics.controller_health.snapshot = await asyncio.wait_for(
                    self._fetch_health(), 2.0)
            except Exception as e:  # keep the last figures; the rest still renders
                logger.info("controller health for /metrics unavailable: %r", e)
        siblings = await self._fetch_siblings() if self._fetch_siblings is not None else {}
        body, kind = self.metrics.render(self._listener, siblings)
        await respond(send, 200, body, content_type=kind.encode())

    async def _websocket(self, scope: dict, receive: Any, send: Any) -> None:
        """A WebSocket to an ``@serve.ingress`` app: relayed to one replica."""
        match = self.table.match(scope["path"])
        if match is None:
            await send({"type": "websocket.close", "code": 1008})
            return
        prefix, dep_key = match
        data = _request_data(scope, b"", prefix)
        await self.routers.serve_websocket(dep_key, data, list(scope.get("subprotocols", [])),
                                           receive, send)

    async def _forward(self, scope: dict, receive: Any, send: Any) -> None:
        started = time.perf_counter()
        match = self.table.match(scope["path"])
        if match is None:
            await respond(send, 404, f"no route for {scope['path']}".encode())
            self.metrics.observe("", "", 404, time.perf_counter() - started)
            return
        prefix, dep_key = match
        try:
            body = await _read_body(receive, scope, self.limits.max_request_body_bytes)
        except ClientGone:
            return
        except BodyTooLarge as e:
            await refuse_body(send, e)
            self.metrics.observe(dep_key, prefix, e.status, time.perf_counter() - started)
            self._note_body(e.limit_bytes if e.declared_bytes is None else 0)
            return
        try:
            await self._route(receive, send, dep_key, _request_data(scope, body, prefix),
                              started)
        finally:
            self._note_body(len(body))

    def _note_body(self, size_bytes: int) -> None:
        if self._trimmer is not None:
            self._trimmer.note_body(size_bytes)

    async def _route(self, receive: Any, send: Any, dep_key: str, data: HTTPRequestData,
                     started: float) -> None:
        prefix = data.route_prefix
        try:
            result = await _unless_disconnected(
                self.routers.serve_http(dep_key, data, send), receive)
        except ClientGone:  # the queued or running request was cancelled with it
            self.metrics.observe(dep_key, prefix, 499, time.perf_counter() - started)
            return
        except StreamAborted as e:
            logger.warning("response from replica %s aborted mid-stream: %s", e.replica_id,
                           e.reason)
            self.metrics.observe(dep_key, prefix, 502, time.perf_counter() - started)
            raise  # uvicorn drops the connection: the client sees the failure
        status, rejected = result
        self.metrics.observe(dep_key, prefix, status, time.perf_counter() - started)
        if rejected is not None:
            self.metrics.reject(dep_key, status, rejected.retry_after_s)


def _request_data(scope: dict, body: bytes, prefix: str) -> HTTPRequestData:
    return HTTPRequestData(
        method=scope.get("method", "GET"), path=scope["path"],
        query_string=scope["query_string"], headers=list(scope["headers"]), body=body,
        route_prefix=prefix, client=tuple(scope["client"]) if scope.get("client") else None)


def listen_socket(host: str, port: int, *, exclusive: bool) -> socket.socket:
    """A socket bound to host:port that the node's other listeners can share
    (SO_REUSEPORT). ``exclusive``: first check that nobody holds the port, not even
    another instance's proxies (which would share it silently)."""
    if exclusive:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            _bind(probe, host, port)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        _bind(sock, host, port)
    except BaseException:
        sock.close()
        raise
    return sock


def _bind(sock: socket.socket, host: str, port: int) -> None:
    try:
        sock.bind((host, port))
    except OSError as e:
        raise RuntimeError(f"cannot listen on {host}:{port}: {e.strerror}; free the port or "
                           f"set http_options.port") from None


class Proxy:
    """The Ray actor: binds the socket, runs uvicorn in the actor's event loop.

    ``index`` of ``listeners`` on its node; ``exclusive`` (the first listener of a new
    node) checks that the port is free before sharing it."""

    def __init__(self, settings: dict, http_options: dict, index: int = 0,
                 listeners: int = 1, exclusive: bool = True) -> None:
        take_control_priority(f"proxy listener {index}")
        self._settings = Settings.from_dict(settings)
        self._http = http_options
        self._index, self._listeners = index, listeners
        self._exclusive = exclusive and not restarted_by_ray()  # its siblings hold the port
        self._siblings: dict[int, Any] = {}
        self._routers = RouterSet(self._settings.namespace, SystemClock(),
                                  settings=self._settings.router)
        self._limits = HTTPLimits.from_http_options(http_options)
        self._trimmer = HeapTrimmer(SystemClock(), libc_malloc_trim())
        self._app = ProxyApp(self._routers, ProxyMetrics(), self._controller_health,
                             self._sibling_metrics, str(index), self._limits, self._trimmer)
        self._app.metrics.routers.statistics = self._routers.statistics
        self._server: uvicorn.Server | None = None
        self._subscriber: RoutingSubscriber | None = None
        self._stopped = asyncio.Event()

    async def _controller_health(self) -> dict:
        s = self._settings
        controller = ray.get_actor(s.controller_name, namespace=s.namespace)
        return await controller.health.remote()

    async def _sibling_metrics(self) -> dict[str, str]:
        node_id = ray.get_runtime_context().get_node_id()
        calls = {}
        for i in range(self._listeners):
            if i == self._index:
                continue
            try:
                handle = self._siblings.get(i) or ray.get_actor(
                    proxy_actor_name(node_id, i), namespace=self._settings.namespace)
            except ValueError:  # not created yet, or being shut down
                continue
            self._siblings[i] = handle
            calls[str(i)] = asyncio.wait_for(handle.metrics_text.remote(), 1.0)
        texts = await asyncio.gather(*calls.values(), return_exceptions=True)
        return {i: t for i, t in zip(calls, texts) if isinstance(t, str)}

    async def metrics_text(self) -> str:
        """This listener's own samples, for a sibling's /metrics."""
        return self._app.metrics.own_text()

    async def ready(self) -> str:
        if self._subscriber is None:
            self._subscriber = RoutingSubscriber(self._settings, self._routers.update,
                                                 self._app.set_routes,
                                                 demands=self._routers.demands)
            self._subscriber.start()
            self._app.metrics.routing.statistics = self._subscriber.statistics
            if restarted_by_ray():
                await self._wait_routable(_RESTART_ROUTES_WAIT_S)
        if self._server is None:
            sock = listen_socket(bind_host(self._http["host"]), self._http["port"],
                                 exclusive=self._exclusive)
            self._server = uvicorn.Server(server_config(self._app, self._limits))
            self._serving = asyncio.get_running_loop().create_task(
                self._server.serve(sockets=[sock]))
        while not self._server.started:  # uvicorn has no started event to await
            if self._serving.done():
                raise RuntimeError(f"uvicorn stopped: {self._serving.exception()!r}")
            await asyncio.sleep(0.01)
        return f"http://{bind_host(self._http['host'])}:{self._http['port']}"

    async def _wait_routable(self, timeout_s: float) -> None:
        """A restarted proxy listens only once it knows the routes and the replicas behind
        them (its long-polls answer at once), so it answers no request it cannot route."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._app.has_routes and all(self._routers.routable(key)
                                            for key in self._app.table.routes.values()):
                return
            await asyncio.sleep(0.02)
        logger.warning("restarted proxy: routes not all known after %.1fs; serving anyway",
                       timeout_s)

    async def set_draining(self, draining: bool) -> None:
        """Its node is draining: /-/healthz fails from now on; requests are still served."""
        self._app.draining = draining

    async def describe(self) -> dict:
        return {"address": f"{bind_host(self._http['host'])}:{self._http['port']}",
                "ready": self._app.has_routes and not self._app.draining,
                "draining": self._app.draining, "pid": os.getpid(),
                "heap_trim": dataclasses.asdict(self._trimmer.statistics())}

    async def wait_until_stopped(self) -> None:
        """The controller's watch: pending until ``shutdown``; Ray fails it when this
        actor's process dies (Ray restarts it; the controller then calls ``ready``)."""
        await self._stopped.wait()

    async def shutdown(self) -> None:
        self._stopped.set()
        if self._subscriber is not None:
            self._subscriber.stop()
        if self._server is not None:
            self._server.should_exit = True
