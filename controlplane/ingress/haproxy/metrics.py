"""``/metrics`` in haproxy mode: HAProxy's Prometheus exporter and fleetplane's figures in
one scrape.

HAProxy's frontend sends ``/metrics`` to the node's ingress actor, which listens on a unix
socket of the runtime directory (the same path after the actor restarts, so HAProxy
needs no reload). The actor reads HAProxy's exporter (``haproxy_*``: per backend and
server, i.e. per deployment and replica) on a second unix socket and appends:

- ``fleetplane_haproxy_backend_info{backend, deployment, route}``: which deployment and
  route prefix each HAProxy backend serves, to join the ``haproxy_*`` series on;
- the controller's push-health figures (``fleetplane_health_*``, as the proxies export);
- the actor's own long-polls of the control plane (``fleetplane_routing_*``).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Awaitable, Callable

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from controlplane.ingress.haproxy.membership import backend_name
from controlplane.ingress.proxy_metrics import ControllerHealthCollector, RoutingCollector
from controlplane.routing.asgi import respond

logger = logging.getLogger(__name__)


class BackendInfoCollector:
    def __init__(self, routes: Callable[[], dict[str, str] | None]) -> None:
        self._routes = routes  # prefix -> "app/deployment"

    def collect(self):
        info = GaugeMetricFamily("fleetplane_haproxy_backend_info",
                                 "the deployment and route prefix an HAProxy backend serves",
                                 labels=["backend", "deployment", "route"])
        for prefix, key in sorted((self._routes() or {}).items()):
            info.add_metric([backend_name(key), key, prefix], 1)
        yield info


class IngressMetrics:
    """The ASGI app behind HAProxy's ``/metrics`` (served by the ingress actor)."""

    def __init__(self, exporter_socket: Path, fetch_health: Callable[[], Awaitable[dict]],
                 routes: Callable[[], dict[str, str] | None]) -> None:
        self._exporter_socket = exporter_socket
        self._fetch_health = fetch_health
        self.health = ControllerHealthCollector()
        self.routing = RoutingCollector()
        self.registry = CollectorRegistry()
        for collector in (BackendInfoCollector(routes), self.health, self.routing):
            self.registry.register(collector)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await respond(send, 200, await self.render(), content_type=CONTENT_TYPE_LATEST.encode())

    async def render(self) -> bytes:
        """HAProxy's exposition, then fleetplane's (each part left out, and logged, when
        it cannot be read: a scrape never fails for one of them)."""
        try:
            self.health.snapshot = await asyncio.wait_for(self._fetch_health(), 2.0)
        except Exception as e:  # keep the last figures
            logger.info("controller health for /metrics unavailable: %r", e)
        try:
            haproxy = await self._exporter()
        except Exception as e:
            logger.warning("HAProxy's exporter unavailable for /metrics: %r", e)
            haproxy = b""
        return haproxy + generate_latest(self.registry)

    async def _exporter(self) -> bytes:
        connector = aiohttp.UnixConnector(path=str(self._exporter_socket))
        timeout = aiohttp.ClientTimeout(total=5.0)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            async with session.get("http://haproxy/metrics") as response:
                response.raise_for_status()
                return await response.read()
