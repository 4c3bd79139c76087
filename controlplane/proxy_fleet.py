"""The controller's side of the proxies: ``http_options.proxies_per_node`` proxy actors
on each alive node, sharing ``http_options``'s port; created before a deploy commits, so a
port that cannot be bound rejects the deploy with nothing changed.

A node's first listener is started alone and checks that the port is free; the others then
join it on the shared port. A restarted controller adopts the listeners it finds alive.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from controlplane.errors import DeployRejected
from controlplane.settings import Settings
from controlplane.supervision import Supervisor


def proxy_actor_name(node_id: str, index: int) -> str:
    return f"fleetplane_proxy::{node_id}::{index}"


class ProxyFleet:
    def __init__(self, settings: Settings, supervisor: Supervisor) -> None:
        self._settings = settings
        self._supervisor = supervisor
        self._http: dict | None = None
        self._proxies: dict[str, list[Any]] = {}  # node_id -> its listeners, by index

    def addresses(self) -> list[str]:
        if not self._http:
            return []
        return [f"http://{self._http['host']}:{self._http['port']}"] * len(self._proxies)

    async def ensure(self, http_options: dict) -> None:
        if self._http is not None and http_options != self._http:
            raise DeployRejected(
                f"http_options cannot change on a running instance (running: {self._http}, "
                f"requested: {http_options}); keep them or run `fleetplane shutdown` first")
        nodes = [n["NodeID"] for n in ray.nodes()
                 if n["Alive"] and n["NodeID"] not in self._proxies]
        listeners = _listeners(http_options)
        started: dict[str, list[Any]] = {node: [] for node in nodes}
        created: list[Any] = []
        for indexes in ([0], range(1, listeners)):  # the port checked free, then shared
            batch = {(node, i): self._start(node, i, http_options) for node in nodes
                     for i in indexes}
            created += [proxy for proxy, new in batch.values() if new]
            await self._ready(batch, created)
            for (node, _), (proxy, _) in batch.items():
                started[node].append(proxy)
        self._proxies.update(started)
        self._http = dict(http_options)
        for node_id, proxies in started.items():  # a restarted proxy is told to serve again
            for i, proxy in enumerate(proxies):
                self._supervisor.watch(f"proxy_{node_id[:12]}_{i}", proxy, proxy.ready.remote)

    def _start(self, node_id: str, index: int, http_options: dict) -> tuple[Any, bool]:
        """(the listener, whether it was created now): a restarted controller adopts the
        listeners that kept serving."""
        name = proxy_actor_name(node_id, index)
        try:
            return ray.get_actor(name, namespace=self._settings.namespace), False
        except ValueError:
            pass
        if http_options.get("ingress") == "haproxy":
            from controlplane.haproxy.ingress import HAProxyIngress as actor_class
        else:
            from controlplane.proxy import Proxy as actor_class

        listeners = _listeners(http_options)
        return ray.remote(actor_class).options(
            name=name, namespace=self._settings.namespace,
            lifetime="detached", num_cpus=0, max_concurrency=100_000, get_if_exists=True,
            max_restarts=-1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(self._settings.to_dict(), http_options, index, listeners, index == 0), True

    async def _ready(self, batch: dict, created: list[Any]) -> None:
        """Wait for ``batch``'s listeners to serve; if one cannot, kill every listener
        ``created`` by this ``ensure`` (never an adopted one: it is serving) and reject."""
        results = await asyncio.gather(*(p.ready.remote() for p, _ in batch.values()),
                                       return_exceptions=True)
        failed = [(key, r) for key, r in zip(batch, results) if isinstance(r, BaseException)]
        if not failed:
            return
        for proxy in created:
            ray.kill(proxy, no_restart=True)
        (node, _), error = failed[0]
        cause = getattr(error, "cause", None) or error
        raise DeployRejected(f"the HTTP proxy on node {node[:12]} could not start: {cause}")

    async def describe(self) -> list[dict]:
        """Per node, what its ingress says of itself (haproxy mode: address, pid,
        workers); a node whose actor does not answer within 2 s says so."""
        nodes = list(self._proxies)
        answers = await asyncio.gather(
            *(asyncio.wait_for(self._proxies[n][0].describe.remote(), 2.0) for n in nodes),
            return_exceptions=True)
        return [{"node_id": n, **(a if isinstance(a, dict) else
                                  {"error": f"{type(a).__name__}: not answering"})}
                for n, a in zip(nodes, answers)]

    async def shutdown(self) -> None:
        proxies = [p for listeners in self._proxies.values() for p in listeners]
        await asyncio.gather(*(p.shutdown.remote() for p in proxies), return_exceptions=True)
        for proxy in proxies:
            ray.kill(proxy, no_restart=True)
        self._proxies, self._http = {}, None


def _listeners(http_options: dict) -> int:
    """Proxies per node; one HAProxy manager per node in haproxy mode (HAProxy's own
    master keeps its workers)."""
    if http_options.get("ingress") == "haproxy":
        return 1
    return http_options.get("proxies_per_node", 1)
