"""The controller's side of the proxies: ``http_options.proxies_per_node`` proxy actors
on each alive node, sharing ``http_options``'s port; created before a deploy commits, so a
port that cannot be bound rejects the deploy with nothing changed.

A node's first listener is started alone and checks that the port is free; the others then
join it on the shared port. A restarted controller adopts the listeners it finds alive.

The fleet follows the nodes (``controller``'s ``NodeWatch``): a node that joins gets its
listeners (``ensure`` again), a node that left is forgotten (its watch ended, its actors
killed), and a draining node's listeners fail their readiness (``/-/healthz``) while they
keep serving what they are sent; a listener Ray restarts on a draining node is told again.

In haproxy mode the nodes' HAProxies are peers (their stick tables are one: sticky routing
policies agree on every node): each is told every node's peer address whenever a node's
HAProxy joins, leaves or is restarted (``_share_peers``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from controlplane.config.options import HTTPOptions
from controlplane.errors import DeployRejected
from controlplane.ingress.listener import proxy_actor_name
from controlplane.nodes import read_nodes
from controlplane.settings import Settings
from controlplane.supervision import Supervisor

logger = logging.getLogger(__name__)
PEER_CALL_S = 10.0  # a node's HAProxy manager that does not answer is not waited for longer


class ProxyFleet:
    def __init__(self, settings: Settings, supervisor: Supervisor) -> None:
        self._settings = settings
        self._supervisor = supervisor
        self._http: HTTPOptions | None = None
        self._proxies: dict[str, list[Any]] = {}  # node_id -> its listeners, by index
        self._addresses: dict[str, str] = {}  # node_id -> the URL its listeners serve
        self._draining: set[str] = set()
        self._peers: dict[str, tuple[str, str]] = {}  # node_id -> its HAProxy's (name, address)
        self._lock = asyncio.Lock()  # a deploy and the node watch may both ensure

    def addresses(self) -> list[str]:
        return [self._addresses[n] for n in sorted(self._addresses)]

    async def ensure(self, http: HTTPOptions) -> None:
        async with self._lock:
            await self._ensure(http)

    async def _ensure(self, http: HTTPOptions) -> None:
        if self._http is not None and http != self._http:
            raise DeployRejected(
                f"http_options cannot change on a running instance (running: "
                f"{self._http.model_dump(exclude_defaults=True)}, requested: "
                f"{http.model_dump(exclude_defaults=True)}); keep them or run "
                f"`fleetplane shutdown` first")
        # not on a draining node: Ray places nothing new there (ready would never answer)
        nodes = [n for n, info in (await asyncio.to_thread(read_nodes)).items()
                 if info.alive and not info.draining and n not in self._proxies]
        listeners = _listeners(http)
        started: dict[str, list[Any]] = {node: [] for node in nodes}
        addresses: dict[str, str] = {}
        created: list[Any] = []
        for indexes in ([0], range(1, listeners)):  # the port checked free, then shared
            batch = {(node, i): self._start(node, i, http) for node in nodes
                     for i in indexes}
            created += [proxy for proxy, new in batch.values() if new]
            answers = await self._ready(batch, created)
            for (node, _), (proxy, _), address in zip(batch, batch.values(), answers):
                started[node].append(proxy)
                addresses[node] = address
        self._proxies.update(started)
        self._addresses.update(addresses)
        self._http = http
        for node_id, proxies in started.items():  # a restarted proxy is told to serve again
            for i, proxy in enumerate(proxies):
                self._supervisor.watch(_watch_name(node_id, i), proxy,
                                       lambda n=node_id, p=proxy: self._recover(n, p))
        if started:
            await self._share_peers(list(started))

    async def _recover(self, node_id: str, proxy: Any) -> None:
        self._addresses[node_id] = await proxy.ready.remote()
        if node_id in self._draining:
            await proxy.set_draining.remote(True)
        await self._share_peers([node_id])

    async def _share_peers(self, learn: list[str]) -> None:
        """haproxy mode: ask the nodes in ``learn`` for their peer address, then tell every
        node's HAProxy the whole list (a node that does not answer keeps its last one)."""
        if self._http is None or self._http.ingress != "haproxy":
            return
        asked = [n for n in learn if n in self._proxies]
        answers = await asyncio.gather(*(asyncio.wait_for(self._proxies[n][0].peer.remote(),
                                                          PEER_CALL_S) for n in asked),
                                       return_exceptions=True)
        for node_id, answer in zip(asked, answers):
            if isinstance(answer, BaseException):
                logger.warning("node %s's HAProxy did not give its peer address: %r",
                               node_id[:12], answer)
            else:
                self._peers[node_id] = (answer[0], answer[1])
        peers = dict(self._peers.values())
        told = await asyncio.gather(*(asyncio.wait_for(p[0].set_peers.remote(peers),
                                                       PEER_CALL_S)
                                      for p in self._proxies.values()), return_exceptions=True)
        for error in (r for r in told if isinstance(r, BaseException)):
            logger.warning("a node's HAProxy was not told its peers: %r", error)

    async def forget(self, node_ids: list[str]) -> None:
        """Nodes that left: end their watches and kill what may be left of their actors."""
        async with self._lock:
            for node_id in node_ids:
                proxies = self._proxies.pop(node_id, [])
                self._addresses.pop(node_id, None)
                self._peers.pop(node_id, None)
                self._draining.discard(node_id)
                for i, proxy in enumerate(proxies):
                    self._supervisor.unwatch(_watch_name(node_id, i))
                    try:
                        ray.kill(proxy, no_restart=True)
                    except Exception:  # already gone with its node
                        pass
            await self._share_peers([])

    async def set_draining(self, node_ids: set[str]) -> None:
        """The listeners of draining nodes fail readiness from now on (and those of a
        node no longer draining pass again); each call tells only the changed nodes."""
        changed = (node_ids ^ self._draining) & set(self._proxies)
        self._draining = set(node_ids)
        calls = [p.set_draining.remote(n in node_ids) for n in changed for p in self._proxies[n]]
        results = await asyncio.gather(*calls, return_exceptions=True)
        for error in (r for r in results if isinstance(r, BaseException)):
            logger.warning("a draining node's listener was not told: %r", error)
    def _start(self, node_id: str, index: int, http: HTTPOptions) -> tuple[Any, bool]:
        """(the listener, whether it was created now): a restarted controller adopts the
        listeners that kept serving. Either kind keeps the contract of ``listener``."""
        name = proxy_actor_name(node_id, index)
        try:
            return ray.get_actor(name, namespace=self._settings.namespace), False
        except ValueError:
            pass
        # Imported here: the controller's process never serves HTTP, so it loads uvicorn
        # and the listeners' code only once it starts one.
        if http.ingress == "haproxy":
            from controlplane.ingress.haproxy.ingress import HAProxyIngress as actor_class
        else:
            from controlplane.ingress.proxy import Proxy as actor_class

        return ray.remote(actor_class).options(
            name=name, namespace=self._settings.namespace,
            lifetime="detached", num_cpus=0, max_concurrency=100_000, get_if_exists=True,
            max_restarts=-1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(self._settings.to_dict(), http, index, _listeners(http), index == 0), True

    async def _ready(self, batch: dict, created: list[Any]) -> list[str]:
        """Wait for ``batch``'s listeners to serve; if one cannot, kill every listener
        ``created`` by this ``ensure`` (never an adopted one: it is serving) and reject."""
        results = await asyncio.gather(*(p.ready.remote() for p, _ in batch.values()),
                                       return_exceptions=True)
        failed = [(key, r) for key, r in zip(batch, results) if isinstance(r, BaseException)]
        if not failed:
            return results
        # told to stop first: an HAProxy ingress stops its HAProxy, which would hold the port
        await asyncio.gather(*(asyncio.wait_for(p.shutdown.remote(), 10.0) for p in created),
                             return_exceptions=True)
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
        self._proxies, self._http, self._addresses, self._draining = {}, None, {}, set()
        self._peers = {}


def _watch_name(node_id: str, index: int) -> str:
    return f"proxy_{node_id[:12]}_{index}"


def _listeners(http: HTTPOptions) -> int:
    """Proxies per node; one HAProxy manager per node in haproxy mode (HAProxy's own
    master keeps its workers)."""
    return 1 if http.ingress == "haproxy" else http.proxies_per_node
