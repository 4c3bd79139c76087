"""Phase 1 of a direct-ingress replica's shutdown, from the shard's side: before the
replica is asked to stop, every node's HAProxy confirms that the server is in ``drain``
then ``maint`` in all of its workers, old ones included. Only then does the replica's
deregistration window start, after which it closes its listener (phase 2)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from controlplane.ingress.listener import LISTENER_PREFIX
from controlplane.routing.actor_lookup import LOOKUP_WAIT_S, ActorLookup, off_loop

logger = logging.getLogger(__name__)


def listener_names(namespace: str) -> list[str]:
    """The nodes' ingress actors' names (a blocking GCS call: run off the loop)."""
    import ray

    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == namespace and a["name"].startswith(LISTENER_PREFIX)]


class IngressDeregistrar:
    """The nodes' HAProxy managers, found off the shard's event loop (the listing and the
    lookups are GCS calls: while the head's GCS does not answer, a stop must not stall
    the shard), at most every ``refresh_s``; while the GCS does not answer, the last ones
    found are asked."""

    def __init__(self, namespace: str, refresh_s: float = 5.0,
                 monotonic: Callable[[], float] = time.monotonic,
                 list_names: Callable[[str], list[str]] = listener_names,
                 lookup: ActorLookup | None = None, wait_s: float = LOOKUP_WAIT_S) -> None:
        self._namespace = namespace
        self._wait_s = wait_s
        self._refresh_s = refresh_s
        self._monotonic = monotonic
        self._list_names = list_names
        # not cached: a node's manager that came back is a new actor under the same name
        self._lookup = lookup or ActorLookup(namespace, cache=False, wait_s=wait_s)
        self._targets: list[Any] = []
        self._found_at = -refresh_s
        self._finding: asyncio.Future | None = None  # one search at a time, shared

    async def _haproxies(self) -> list[Any]:
        if self._monotonic() - self._found_at >= self._refresh_s:
            if self._finding is None or self._finding.done():
                self._finding = asyncio.ensure_future(self._find())
            try:
                self._targets = await asyncio.shield(self._finding)
            except Exception as e:  # noqa: BLE001 - LookupTimeout, or the GCS's own error
                logger.warning("finding the nodes' HAProxies failed (%s); asking the %d "
                               "found before", e, len(self._targets))
        return self._targets

    async def _find(self) -> list[Any]:
        names = await off_loop(lambda: self._list_names(self._namespace),
                               "a listing of the nodes' HAProxy managers", self._wait_s)
        found = []
        for name in names:
            try:
                found.append(await self._lookup.get(name))
            except ValueError:  # gone since the listing
                continue
        self._found_at = self._monotonic()
        return found

    async def deregister(self, deployment: str, replica_id: str,
                         joined: list[tuple[str, str]] = (), timeout_s: float = 5.0) -> None:
        """``joined``: replicas that started serving lately (id, address), added first
        where the routing long-poll has not brought them yet."""
        targets = await self._haproxies()
        answers = await asyncio.gather(
            *(asyncio.wait_for(t.deregister.remote(deployment, replica_id, list(joined)),
                               timeout_s)
              for t in targets), return_exceptions=True)
        failed = [a for a in answers if isinstance(a, BaseException)]
        if failed:  # the deregistration window still covers that node's long-poll
            logger.warning("%d of %d HAProxies did not confirm that %s left: %r",
                           len(failed), len(targets), replica_id, failed[0])
