"""The routers of one process (a proxy, or a replica holding handles).

``RouterSet`` keeps one ``Router`` per deployment, fed by ``RoutingSubscriber`` pushes,
and answers handle calls and HTTP requests through them: a proxy's ``front_door.Backend``.
HTTP requests hold their router slot for the whole streamed response.
"""

from __future__ import annotations

import random
from typing import Any, AsyncIterator

from controlplane.clock import Clock
from controlplane.errors import BackpressureError, ReplicaUnavailableError, RouterClosedError
from controlplane.routing.asgi import MODEL_ID_HEADER, header_value, respond
from controlplane.routing.router import Router
from controlplane.routing.router_stats import RouterStatistics
from controlplane.routing.routing_config import RoutingConfig
from controlplane.routing.transport import RayTransport, ReplicaTransport, relay_websocket
from controlplane.settings import RouterSettings
from controlplane.wire import HTTPRequestData, RequestMeta, RouterDemand, RoutingUpdate

# Safe methods (RFC 9110 section 9.2.1): asked again of another replica when theirs died
# before answering; a POST may have had effects and is not
_REPLAYABLE = frozenset({"GET", "HEAD", "OPTIONS"})


class RouterSet:
    def __init__(self, namespace: str, clock: Clock, rng: random.Random | None = None,
                 settings: RouterSettings = RouterSettings(),
                 transport: ReplicaTransport | None = None) -> None:
        self.transport = transport if transport is not None else RayTransport(namespace)
        self._settings = settings
        self._clock = clock
        self._rng = rng or random.Random()
        self._routers: dict[str, Router] = {}

    def update(self, key: str, update: RoutingUpdate | None) -> None:
        router = self._routers.get(key)
        if update is None:
            if router is not None:
                router.close("the deployment was deleted")
                del self._routers[key]
            return
        if router is None:
            config = RoutingConfig.from_update(key, update)
            router = self._routers[key] = Router(config, self.transport, self._clock, self._rng,
                                                 self._settings)
        router.apply_routing_update(update)

    def demands(self) -> dict[str, RouterDemand]:
        """The demand of each router whose deployment uses ``cluster_informed``."""
        return {key: router.demand() for key, router in self._routers.items()
                if router.informed}

    def statistics(self) -> list[RouterStatistics]:
        """One snapshot per deployment router (for the proxy's /metrics)."""
        return [router.statistics() for router in self._routers.values()]

    def routable(self, key: str) -> bool:
        """The deployment has a router with a running replica to place on."""
        return self._placeable(key) is not None

    def _placeable(self, key: str) -> Router | None:
        """The deployment's router, or None while it has no running replica: waiting
        would hang the caller for as long as none run (starting, failed to deploy, all
        dead), so HTTP and handle callers alike are answered at once."""
        router = self._routers.get(key)
        if router is None or not (router.num_replicas > 0 or router.waits_cold):
            return None
        return router  # with a replica, or scaling from zero: a request waits a bound

    async def call(self, key: str, method: str, args: tuple, kwargs: dict,
                   meta: RequestMeta | None = None) -> Any:
        """A handle call: the user's result, or their exception."""
        meta = meta or RequestMeta()
        router = self._router_for_call(key)
        return await router.assign((method, args, kwargs, meta), meta.model_id,
                                   router.policy.of_call(args, kwargs))

    async def stream(self, key: str, method: str, args: tuple, kwargs: dict,
                     meta: RequestMeta | None = None) -> AsyncIterator[Any]:
        """A handle call with ``stream=True``: the items the user's generator yields,
        in one slot held until the stream ends."""
        meta = meta or RequestMeta()
        router = self._router_for_call(key)
        async with router.slot(meta.model_id, router.policy.of_call(args, kwargs)) as replica:
            async for item in self.transport.stream(replica, (method, args, kwargs, meta)):
                yield item

    async def serve_websocket(self, key: str, data: HTTPRequestData, scope: dict,
                              receive: Any, send: Any) -> None:
        """Relay one WebSocket to a replica of the deployment, in one slot held for the
        socket's life. No replica, a full queue or a dead replica: closed before accept
        (the client sees 403), as Serve's proxy answers."""
        subprotocols = list(scope.get("subprotocols", []))
        try:
            async with self._router_for_call(key).slot() as replica:
                handle = await self.transport.handle(replica)
                await relay_websocket(handle, data, subprotocols, receive, send)
        except (BackpressureError, ReplicaUnavailableError, RouterClosedError) as e:
            await send({"type": "websocket.close", "code": 1013, "reason": str(e)[:120]})

    def _router_for_call(self, key: str) -> Router:
        router = self._placeable(key)
        if router is None:
            raise RouterClosedError(key, "it has no running replicas")
        return router

    async def serve_http(self, key: str, data: HTTPRequestData, send: Any) -> int:
        """Answer one HTTP request through the deployment's router; the status sent.
        Raises, having sent nothing, what the front door answers (``BackpressureError``,
        ``ReplicaUnavailableError``, ``RouterClosedError``, ``DeploymentRaised``), or
        ``StreamAborted`` when the replica failed after the response head went out."""
        router = self._placeable(key)
        if router is None:  # with the same hint a rejection gives
            await respond(send, 503, f"deployment {key} has no running replicas",
                          [(b"retry-after", b"1")])
            return 503
        affinity = router.policy.of_http(data.headers, data.body)  # None for p2c: no parse
        model_id = header_value(data.headers, MODEL_ID_HEADER)
        try:
            async with router.slot(model_id, affinity) as replica:
                return await self.transport.send_http(replica, data, send)
        except ReplicaUnavailableError as died:
            # its replica died before a byte of the answer went out (a node lost: the
            # head's replicas die with it): a safe method is asked again, once, of another
            # replica (the slot marked the dead one unreachable), as HAProxy replays it in
            # haproxy mode; any other method, no other replica, or no room: the 502
            if data.method not in _REPLAYABLE or router.num_replicas < 2:
                raise
            try:
                async with router.slot(model_id, affinity) as replica:
                    return await self.transport.send_http(replica, data, send)
            except (ReplicaUnavailableError, BackpressureError):
                raise died from None
