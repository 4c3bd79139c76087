"""The HTTP proxy actor: ``http_options.proxies_per_node`` per node, sharing the port
(SO_REUSEPORT: the kernel spreads new connections over the live listeners, so while Ray
restarts a killed one the others take every new connection), serving with uvicorn.

Requests go through the front door every listener shares (``routing.front_door``:
route -> limits -> admit -> answer): matched to an application's ingress deployment by
longest route prefix and admitted by that deployment's ``Router`` (power of two choices,
backpressure with a computed Retry-After). Routes and replica sets arrive by long-poll
(``RoutingSubscriber``): no controller call per request. The response head is awaited
before answering, so a rejection or a dead replica becomes a clean status code; the body
then streams as the replica yields it. After a large body the freed heap goes back to the
OS (``routing/heap_trim``).

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
import time
from typing import Any

import ray

from controlplane.clock import SystemClock
from controlplane.config.options import HTTPOptions
from controlplane.ingress.listener import Listener, proxy_actor_name
from controlplane.ingress.proxy_metrics import ProxyMetrics
from controlplane.priority import take_control_priority
from controlplane.routing.actor_lookup import ActorLookup, LookupTimeout
from controlplane.routing.asgi import respond
from controlplane.routing.bind import bind_host
from controlplane.routing.front_door import FrontDoor
from controlplane.routing.heap_trim import HeapTrimmer, libc_malloc_trim
from controlplane.routing.http_connection import server_config
from controlplane.routing.listen import Served, listen_socket
from controlplane.routing.route_table import RouteTable
from controlplane.routing.router_set import RouterSet
from controlplane.routing.subscriber import RoutingSubscriber
from controlplane.settings import Settings
from controlplane.supervision import restarted_by_ray
from controlplane.wire import HTTPLimits, RoutesUpdate

logger = logging.getLogger(__name__)
_RESTART_ROUTES_WAIT_S = 5.0  # a restarted proxy waits this long at most for its routes


class ProxyApp(FrontDoor):
    """The proxy's front door and its own endpoints; separate from the actor so it can be
    served in tests. ``fetch_health``: async () -> the controller's health;
    ``fetch_siblings``: async () -> {listener: its own samples} (each optional)."""

    def __init__(self, routers: RouterSet, metrics: ProxyMetrics, limits: HTTPLimits, *,
                 fetch_health: Any = None, fetch_siblings: Any = None, listener: str = "0",
                 trimmer: HeapTrimmer | None = None,
                 show_error_messages: bool = False) -> None:
        super().__init__(routers, limits, show_error_messages=show_error_messages,
                         endpoints={"/-/healthz": self._healthz, "/-/routes": self._routes,
                                    "/metrics": self._metrics},
                         observer=metrics,
                         note_body=trimmer.note_body if trimmer is not None else None)
        self.metrics = metrics
        self._fetch_health, self._fetch_siblings = fetch_health, fetch_siblings
        self._listener = listener
        self.has_routes = False
        self.draining = False  # its node is draining: not ready, still serving

    def set_routes(self, update: RoutesUpdate) -> None:
        self.table = RouteTable(update.routes)
        self.has_routes = True

    async def _healthz(self, send: Any) -> None:
        ok = self.has_routes and not self.draining
        await respond(send, 200 if ok else 503, b"success" if ok else
                      b"node draining" if self.draining else b"no route table yet")

    async def _routes(self, send: Any) -> None:
        await respond(send, 200, json.dumps(self.table.routes),
                      content_type=b"application/json")

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


class Proxy(Listener):
    """The Ray actor: binds the socket, runs uvicorn in the actor's event loop.

    ``index`` of ``listeners`` on its node; ``exclusive`` (the first listener of a new
    node) checks that the port is free before sharing it."""

    def __init__(self, settings: dict, http: HTTPOptions, index: int = 0,
                 listeners: int = 1, exclusive: bool = True) -> None:
        super().__init__()
        take_control_priority(f"proxy listener {index}")
        self._settings = Settings.from_dict(settings)
        self._http = http
        self._index, self._listeners = index, listeners
        self._exclusive = exclusive and not restarted_by_ray()  # its siblings hold the port
        self._siblings: dict[int, Any] = {}
        # off the event loop: a scrape while the GCS does not answer must not stop serving
        self._actors = ActorLookup(self._settings.namespace, cache=False)
        self._routers = RouterSet(self._settings.namespace, SystemClock(),
                                  settings=self._settings.router)
        self._trimmer = HeapTrimmer(SystemClock(), libc_malloc_trim())
        self._app = ProxyApp(self._routers, ProxyMetrics(), http.limits(),
                             fetch_health=self._controller_health,
                             fetch_siblings=self._sibling_metrics, listener=str(index),
                             trimmer=self._trimmer,
                             show_error_messages=http.show_error_messages)
        self._app.metrics.routers.statistics = self._routers.statistics
        self._started: asyncio.Future | None = None  # the first ready's start, shared

    async def _controller_health(self) -> dict:
        controller = await self._actors.get(self._settings.controller_name)
        return await controller.health.remote()

    async def _sibling_metrics(self) -> dict[str, str]:
        node_id = ray.get_runtime_context().get_node_id()
        calls = {}
        for i in range(self._listeners):
            if i == self._index:
                continue
            try:
                handle = self._siblings.get(i) or await self._actors.get(
                    proxy_actor_name(node_id, i))
            except (ValueError, LookupTimeout):  # not created yet, or being shut down
                continue
            self._siblings[i] = handle
            calls[str(i)] = asyncio.wait_for(handle.metrics_text.remote(), 1.0)
        texts = await asyncio.gather(*calls.values(), return_exceptions=True)
        return {i: t for i, t in zip(calls, texts) if isinstance(t, str)}

    async def metrics_text(self) -> str:
        """This listener's own samples, for a sibling's /metrics."""
        return self._app.metrics.own_text()

    async def ready(self) -> str:
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)
        return f"http://{self._address()}"

    async def _start(self) -> None:
        subscriber = RoutingSubscriber(self._settings, self._routers.update,
                                       self._app.set_routes, demands=self._routers.demands)
        subscriber.start()
        self._stops_with(subscriber.stop)
        self._app.metrics.routing.statistics = subscriber.statistics
        if restarted_by_ray():
            await self._wait_routable(_RESTART_ROUTES_WAIT_S)
        sock = listen_socket(bind_host(self._http.host), self._http.port,
                             exclusive=self._exclusive)
        served = await Served.start(server_config(self._app, self._app.limits), sock, "uvicorn")
        self._stops_with(served.stop)

    def _address(self) -> str:
        return f"{bind_host(self._http.host)}:{self._http.port}"

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
        return {"address": self._address(),
                "ready": self._app.has_routes and not self._app.draining,
                "draining": self._app.draining, "pid": os.getpid(),
                "heap_trim": dataclasses.asdict(self._trimmer.statistics())}
