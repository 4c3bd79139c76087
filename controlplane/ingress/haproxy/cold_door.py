"""Scale from zero in haproxy mode: where HAProxy sends a request no replica can take.

A deployment at zero replicas has no server in its HAProxy backend, so HAProxy alone
would answer 503 at once, with no hint and no wake-up. Each backend of a deployment that
scales to zero (``autoscaling_config.min_replicas: 0``) therefore has one ``backup``
server: this door, on a unix socket of the node's ingress actor. HAProxy uses a backup
only while the backend has no usable server, so the door sees exactly the requests that
found none. It is the proxy's own front door and routers (``RouterSet`` over Ray calls):
a request waits for the first replica up to ``cold_start_hold_s`` and is then sent to it
through Ray, or is answered 503 with a Retry-After from the measured start time; its
routers report what they hold to the shard, which wakes the deployment
(``routing/router.py``: ``_wait_cold``). Once replicas run, HAProxy has servers again and
the door sees nothing.

Only deployments that scale to zero get routers here (others never reach the door).
"""

from __future__ import annotations

from pathlib import Path

from controlplane.clock import SystemClock
from controlplane.config.options import HTTPOptions
from controlplane.routing.front_door import FrontDoor
from controlplane.routing.listen import Served, serve_unix
from controlplane.routing.route_table import RouteTable
from controlplane.routing.router_set import RouterSet
from controlplane.settings import Settings
from controlplane.wire import RouterDemand, RoutesUpdate, RoutingUpdate


class ColdDoor:
    def __init__(self, settings: Settings, http: HTTPOptions) -> None:
        self.routers = RouterSet(settings.namespace, SystemClock(), settings=settings.router)
        self.app = FrontDoor(self.routers, http.limits(),
                             show_error_messages=http.show_error_messages)
        self._keys: set[str] = set()  # deployments that scale to zero
        self._served: Served | None = None

    def update(self, key: str, update: RoutingUpdate | None) -> None:
        """A deployment's routing update: kept only while it scales to zero."""
        cold = update is not None and getattr(update, "cold_hold_s", None) is not None
        if cold or key in self._keys:
            self.routers.update(key, update if cold else None)
        if cold:
            self._keys.add(key)
        else:
            self._keys.discard(key)

    def set_routes(self, update: RoutesUpdate) -> None:
        self.app.table = RouteTable(update.routes)

    def demands(self) -> dict[str, RouterDemand]:
        return self.routers.demands()

    async def start(self, path: Path) -> None:
        self._served = await serve_unix(self.app, path, "cold-start door")

    def stop(self) -> None:
        if self._served is not None:
            self._served.stop()
