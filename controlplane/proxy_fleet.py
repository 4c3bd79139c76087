"""The controller's side of the proxies: one proxy actor per alive node, bound to
``http_options``; created before a deploy commits, so a port that cannot be bound
rejects the deploy with nothing changed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from controlplane.errors import DeployRejected
from controlplane.settings import Settings
from controlplane.supervision import Supervisor


def proxy_actor_name(node_id: str) -> str:
    return f"fleetplane_proxy::{node_id}"


class ProxyFleet:
    def __init__(self, settings: Settings, supervisor: Supervisor) -> None:
        self._settings = settings
        self._supervisor = supervisor
        self._http: dict | None = None
        self._proxies: dict[str, Any] = {}  # node_id -> proxy actor

    def addresses(self) -> list[str]:
        if not self._http:
            return []
        return [f"http://{self._http['host']}:{self._http['port']}"] * len(self._proxies)

    async def ensure(self, http_options: dict) -> None:
        if self._http is not None and http_options != self._http:
            raise DeployRejected(
                f"http_options cannot change on a running instance (running: {self._http}, "
                f"requested: {http_options}); keep them or run `fleetplane shutdown` first")
        from controlplane.proxy import Proxy

        remote_proxy = ray.remote(Proxy)
        created, adopted = {}, {}
        for node in ray.nodes():
            node_id = node["NodeID"]
            if not node["Alive"] or node_id in self._proxies:
                continue
            try:  # a restarted controller adopts the proxies that kept serving
                adopted[node_id] = ray.get_actor(proxy_actor_name(node_id),
                                                 namespace=self._settings.namespace)
                continue
            except ValueError:
                pass
            created[node_id] = remote_proxy.options(
                name=proxy_actor_name(node_id), namespace=self._settings.namespace,
                lifetime="detached", num_cpus=0, max_concurrency=100_000, get_if_exists=True,
                max_restarts=-1,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(self._settings.to_dict(), http_options)
        starting = {**adopted, **created}
        results = await asyncio.gather(*(p.ready.remote() for p in starting.values()),
                                       return_exceptions=True)
        failed = [(n, r) for n, r in zip(starting, results) if isinstance(r, BaseException)]
        if failed:
            for proxy in created.values():  # never the adopted ones: they are serving
                ray.kill(proxy, no_restart=True)
            node, error = failed[0]
            cause = getattr(error, "cause", None) or error
            raise DeployRejected(f"the HTTP proxy on node {node[:12]} could not start: {cause}")
        self._proxies.update(starting)
        self._http = dict(http_options)
        for node_id, proxy in starting.items():  # a restarted proxy is told to serve again
            self._supervisor.watch(f"proxy_{node_id[:12]}", proxy, proxy.ready.remote)

    async def shutdown(self) -> None:
        await asyncio.gather(*(p.shutdown.remote() for p in self._proxies.values()),
                             return_exceptions=True)
        for proxy in self._proxies.values():
            ray.kill(proxy, no_restart=True)
        self._proxies, self._http = {}, None
