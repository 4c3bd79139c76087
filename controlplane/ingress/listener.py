"""The listener-actor contract, written once for a node's HTTP listeners (``proxy.Proxy``,
``haproxy.ingress.HAProxyIngress``): what the controller's ``ProxyFleet`` relies on.

A listener actor

- is named ``proxy_actor_name(node_id, index)``: the fleet finds, adopts and watches it
  by that name;
- is built as ``cls(settings: dict, http: HTTPOptions, index, listeners, exclusive)``;
- serves once ``ready()`` returns its URL, and a second ``ready`` (a restarted actor told
  again, an adopted one) only waits for the first;
- answers ``set_draining(bool)`` (readiness fails, serving goes on) and ``describe()``;
- keeps ``wait_until_stopped()`` pending until ``shutdown``: the controller's watch (Ray
  fails the call when the actor's process dies, so a death is seen at once, never polled);
- on ``shutdown()`` stops what it started, the last started first, and ends the watch.

``Listener`` is the base that holds the last two and the stops they run.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any, Callable

logger = logging.getLogger(__name__)


LISTENER_PREFIX = "fleetplane_proxy::"  # every listener actor's name starts so


def proxy_actor_name(node_id: str, index: int) -> str:
    return f"{LISTENER_PREFIX}{node_id}::{index}"


class Listener:
    def __init__(self) -> None:
        self._stopped = asyncio.Event()
        self._stops: list[Callable[[], Any]] = []  # sync or async, run last-in first

    def _stops_with(self, stop: Callable[[], Any]) -> None:
        """Run ``stop`` on shutdown (``stop`` may return an awaitable)."""
        self._stops.append(stop)

    @property
    def _stopping(self) -> bool:
        return self._stopped.is_set()

    async def wait_until_stopped(self) -> None:
        """The controller's watch: pending until ``shutdown``; Ray fails it when this
        actor's process dies (Ray restarts it; the controller then calls ``ready``)."""
        await self._stopped.wait()

    async def shutdown(self) -> None:
        self._stopped.set()
        while self._stops:
            stop = self._stops.pop()
            try:
                result = stop()
                if inspect.isawaitable(result):
                    await result
            except Exception:  # the outermost frame of a stop: the others still run
                logger.exception("stopping a listener: %r failed", stop)
