"""Phase 1 of a direct-ingress replica's shutdown, from the shard's side: before the
replica is asked to stop, every node's HAProxy confirms that the server is in ``drain``
then ``maint`` in all of its workers, old ones included. Only then does the replica's
deregistration window start, after which it closes its listener (phase 2)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

import ray

from controlplane.ingress.listener import LISTENER_PREFIX

logger = logging.getLogger(__name__)


class IngressDeregistrar:
    def __init__(self, namespace: str, refresh_s: float = 5.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._namespace = namespace
        self._refresh_s = refresh_s
        self._monotonic = monotonic
        self._targets: list[Any] = []
        self._found_at = -refresh_s

    def _haproxies(self) -> list[Any]:
        """The nodes' ingress actors, looked up at most every ``refresh_s``."""
        now = self._monotonic()
        if now - self._found_at >= self._refresh_s:
            names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                     if a["namespace"] == self._namespace
                     and a["name"].startswith(LISTENER_PREFIX)]
            self._targets = [ray.get_actor(n, namespace=self._namespace) for n in names]
            self._found_at = now
        return self._targets

    async def deregister(self, deployment: str, replica_id: str,
                         joined: list[tuple[str, str]] = (), timeout_s: float = 5.0) -> None:
        """``joined``: replicas that started serving lately (id, address), added first
        where the routing long-poll has not brought them yet."""
        targets = self._haproxies()
        answers = await asyncio.gather(
            *(asyncio.wait_for(t.deregister.remote(deployment, replica_id, list(joined)),
                               timeout_s)
              for t in targets), return_exceptions=True)
        failed = [a for a in answers if isinstance(a, BaseException)]
        if failed:  # the deregistration window still covers that node's long-poll
            logger.warning("%d of %d HAProxies did not confirm that %s left: %r",
                           len(failed), len(targets), replica_id, failed[0])
