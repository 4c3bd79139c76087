"""Keeps a process's view of routes and replica sets current, by long-polling the
controller (routes) and the shards (replica sets). Used by proxies and handles; nothing
here runs per request.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

import ray

from controlplane.settings import Settings, shard_actor_name
from controlplane.wire import ROUTES_KEY, RoutesUpdate, RoutingUpdate

logger = logging.getLogger(__name__)

RETRY_S = 0.5


class RoutingSubscriber:
    """Calls ``on_routes(RoutesUpdate)`` and ``on_deployment(key, RoutingUpdate | None)``
    whenever the controller or an owning shard publishes a change. It follows every
    deployment of every shard: payloads are small and change only with membership."""

    def __init__(self, settings: Settings, on_deployment: Callable[[str, RoutingUpdate | None], None],
                 on_routes: Callable[[RoutesUpdate], None] = lambda r: None) -> None:
        self._settings = settings
        self._on_deployment = on_deployment
        self._on_routes = on_routes
        self._known: dict[int, dict[str, int]] = {}  # shard -> {deployment key: version}
        self._num_shards = 0
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._follow_routes()))

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    async def _follow_routes(self) -> None:
        s = self._settings
        version = 0
        while True:
            try:
                controller = ray.get_actor(s.controller_name, namespace=s.namespace)
                changes = await controller.listen_routes.remote({ROUTES_KEY: version})
            except Exception as e:  # controller restarting: keep the last routes, retry
                logger.info("routes long-poll failed (%r); retrying", e)
                await asyncio.sleep(RETRY_S)
                continue
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
                self._tasks.append(asyncio.get_running_loop().create_task(self._follow_shard(i)))
        self._on_routes(update)

    async def _follow_shard(self, index: int) -> None:
        s = self._settings
        while True:
            try:
                shard = ray.get_actor(shard_actor_name(index), namespace=s.namespace)
                known = dict(self._known[index])
                changes = await shard.listen_routing.remote(known, True)
            except Exception as e:
                logger.info("shard %d long-poll failed (%r); retrying", index, e)
                await asyncio.sleep(RETRY_S)
                continue
            for key, (version, payload) in changes.items():
                self._known[index][key] = version
                try:
                    self._on_deployment(key, payload)
                except Exception:  # one bad update must not stop following the shard
                    logger.exception("routing update for %s failed", key)
