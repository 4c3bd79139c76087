"""Keeps a process's view of routes and replica sets current, by long-polling the
controller (routes) and the shards (replica sets). Used by proxies and handles; nothing
here runs per request.

A target (the controller, or shard i) that cannot be reached keeps its last routes and
replica sets and is retried with backoff (``reachability``); every failure is counted
(``statistics()``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from typing import Any, Callable

import ray

from controlplane.clock import Clock, SystemClock
from controlplane.routing.actor_lookup import ActorLookup
from controlplane.routing.reachability import Reachability, SubscriberStatistics
from controlplane.settings import Settings, shard_actor_name
from controlplane.wire import (ROUTES_KEY, Deltas, RouterDemand, RoutesUpdate, RoutingUpdate,
                               apply_routing_delta)

logger = logging.getLogger(__name__)

CONTROLLER = "controller"
DEMAND_REPORT_S = 1.0  # cluster_informed: a router's reports, while it has demand


def shard_target(index: int) -> str:
    return f"shard {index}"


class RoutingSubscriber:
    """Calls ``on_routes(RoutesUpdate)`` and ``on_deployment(key, RoutingUpdate | None)``
    whenever the controller or an owning shard publishes a change. It follows every
    deployment of every shard: payloads are small and change only with membership.

    ``get_actor(name, namespace=...)`` finds the controller and shard actors
    (``ray.get_actor``; tests pass fakes), off the event loop (``actor_lookup``: a GCS
    that does not answer must not stop the proxy it runs in) unless ``threaded_lookups``
    is False (tests, on a virtual clock); ``clock`` must be the running loop's clock.
    """

    def __init__(self, settings: Settings, on_deployment: Callable[[str, RoutingUpdate | None], None],
                 on_routes: Callable[[RoutesUpdate], None] = lambda r: None, *,
                 get_actor: Callable[..., Any] = ray.get_actor, clock: Clock = SystemClock(),
                 rng: random.Random | None = None,
                 demands: Callable[[], dict[str, RouterDemand]] | None = None,
                 threaded_lookups: bool = True) -> None:
        self._settings = settings
        self._on_deployment = on_deployment
        self._on_routes = on_routes
        # looked up each round, as before: a controller or shard made anew is found
        self._lookup = ActorLookup(settings.namespace, get_actor, cache=False,
                                   threaded=threaded_lookups)
        self._reach = Reachability(clock, rng if rng is not None else random.Random(), logger)
        self._known: dict[int, dict[str, int]] = {}  # shard -> {deployment key: version}
        self._held: dict[int, dict[str, Any]] = {}  # shard -> {key: payload held}
        self._num_shards = 0
        self._tasks: list[asyncio.Task] = []
        # cluster_informed: this process's routers' demand, sent to the owning shards
        self._demands = demands
        self._router_id = uuid.uuid4().hex[:12]
        self._busy: set[str] = set()  # keys whose last report had demand
        self._shards: dict[int, Any] = {}  # shard index -> the handle its long-poll uses

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._follow_routes()))

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    def statistics(self) -> SubscriberStatistics:
        return self._reach.statistics()

    async def _follow_routes(self) -> None:
        s = self._settings
        version = 0
        while True:
            try:
                controller = await self._lookup.get(s.controller_name)
                changes = await controller.listen_routes.remote({ROUTES_KEY: version})
            except Exception as e:  # controller restarting: keep the last routes, retry
                await self._reach.wait_retry(CONTROLLER, e)
                continue
            self._reach.reached(CONTROLLER)
            if ROUTES_KEY in changes:
                version, payload = changes[ROUTES_KEY]
                self._apply_routes(payload)

    def _apply_routes(self, update: RoutesUpdate) -> None:
        # The shard count is fixed for an instance's life (the controller rejects a
        # change), so shards are followed once.
        if not self._num_shards and update.num_shards:
            self._num_shards = update.num_shards
            for i in range(self._num_shards):
                self._known.setdefault(i, {})
                self._held.setdefault(i, {})
                self._tasks.append(asyncio.get_running_loop().create_task(self._follow_shard(i)))
            if self._demands is not None:
                self._tasks.append(asyncio.get_running_loop().create_task(self._report_demand()))
        self._on_routes(update)

    async def _follow_shard(self, index: int) -> None:
        while True:
            try:
                shard = await self._lookup.get(shard_actor_name(index))
                self._shards[index] = shard  # demand reports go to the same handle
                known = dict(self._known[index])
                changes = await shard.listen_routing.remote(known, True)
            except Exception as e:
                await self._reach.wait_retry(shard_target(index), e)
                continue
            self._reach.reached(shard_target(index))
            for key, (version, payload) in changes.items():
                if isinstance(payload, Deltas):
                    payload = self._apply_deltas(index, key, payload)
                    if payload is None:
                        continue
                self._known[index][key] = version
                self._held[index][key] = payload
                try:
                    self._on_deployment(key, payload)
                except Exception:  # one bad update must not stop following the shard
                    logger.exception("routing update for %s failed", key)

    def _apply_deltas(self, index: int, key: str, changes: Deltas) -> RoutingUpdate | None:
        """The whole update after the deltas, from the one held at their base; None (and
        the whole update asked for next) if that is not the one held."""
        held = self._held[index].get(key)
        if held is None or self._known[index].get(key) != changes.base:
            self._known[index].pop(key, None)
            return None
        for delta in changes.deltas:
            held = apply_routing_delta(held, delta)
        return held

    async def _report_demand(self) -> None:
        """Every ``DEMAND_REPORT_S``: each router's demand to its deployment's shard, while
        it has any and once more when it drops to none (``demand_board``). Fire and
        forget: a shard that is restarting misses a report, and the next one follows."""
        while True:
            await asyncio.sleep(DEMAND_REPORT_S)
            try:
                self.report_demand_once()
            except Exception:  # never stop reporting over one bad round
                logger.exception("routing: reporting router demand failed")

    def report_demand_once(self) -> int:
        """One round of reports; how many were sent."""
        sent = 0
        for key, demand in self._demands().items():
            if demand.idle and key not in self._busy:
                continue
            if demand.idle:
                self._busy.discard(key)
            else:
                self._busy.add(key)
            index = next((i for i, known in self._known.items() if key in known), None)
            shard = self._shards.get(index)
            if shard is None:
                continue
            shard.report_router_demand.remote(tuple(key.split("/", 1)), self._router_id, demand)
            sent += 1
        return sent
