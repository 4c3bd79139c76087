"""The per-node Ray actor of the ``haproxy`` ingress mode.

It runs the node's HAProxy (``process``), follows routes and replica sets with the same
long-polls as a proxy (``RoutingSubscriber``), and keeps HAProxy's servers equal to the
RUNNING replicas' direct-ingress addresses (``desired``: what is wanted, what is loaded)
through the runtime API (``membership``): a scale event needs no reload; a route change
reloads through the master CLI. A replica
that leaves is put in ``drain`` then ``maint`` in the current worker (an old worker, kept
by a reload for the responses it is still sending, takes no new request and refuses
runtime commands).

Supervised like a proxy (the controller's watch, ``max_restarts=-1``). HAProxy runs in a
process session of its own, so when this actor dies its HAProxy keeps serving; the
restarted actor adopts it (same master socket) and re-reads its servers. A crashed
HAProxy is started again with the current membership.

Sticky policies keep a stick table per backend, one for the fleet: every node's HAProxy is
a peer of the others (``peers``), the list pushed by the controller (``set_peers``) as
nodes come and go.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

import ray

from controlplane.config.options import HTTPOptions
from controlplane.ingress.haproxy import membership
from controlplane.ingress.haproxy.cold_door import ColdDoor
from controlplane.ingress.haproxy.config import Paths, render
from controlplane.ingress.haproxy.desired import LateLeaving, Loaded, Wanted
from controlplane.ingress.haproxy.guard import start_guard
from controlplane.ingress.haproxy.metrics import IngressMetrics
from controlplane.ingress.haproxy.peers import PeerSet, peer_name
from controlplane.ingress.haproxy.process import HAProxyProcess
from controlplane.ingress.haproxy.runtime_dirs import prune, runtime_dir
from controlplane.ingress.listener import Listener
from controlplane.priority import take_control_priority
from controlplane.routing.actor_lookup import ActorLookup
from controlplane.routing.bind import bind_host
from controlplane.routing.listen import listen_socket, serve_unix
from controlplane.routing.subscriber import RoutingSubscriber
from controlplane.settings import Settings
from controlplane.wire import RoutesUpdate, RoutingUpdate

logger = logging.getLogger(__name__)
_SWEEP_S = 1.0  # crash check and deletion of servers that left


class HAProxyIngress(Listener):
    """A node's listener in haproxy mode: the ``listener`` contract, as ``Proxy`` keeps
    it, so the proxy fleet starts either."""

    def __init__(self, settings: dict, http: HTTPOptions, index: int = 0,
                 listeners: int = 1, exclusive: bool = True) -> None:
        super().__init__()
        take_control_priority("haproxy ingress")  # before HAProxy starts: it inherits it
        self._settings = Settings.from_dict(settings)
        self._http = http
        self._actors = ActorLookup(self._settings.namespace, cache=False)  # off the loop
        node_id = ray.get_runtime_context().get_node_id()
        self._process = HAProxyProcess(Paths(runtime_dir(self._settings.namespace, node_id)))
        # stopped even when ready failed midway: a started HAProxy would hold the port
        self._stops_with(lambda: asyncio.to_thread(self._process.stop))
        self._peers = PeerSet(peer_name(node_id))
        self._wanted, self._loaded = Wanted(self._peers), Loaded()
        self._leaving: set[tuple[str, str]] = set()  # in maint, to delete once idle
        self._late = None if self._settings.replica.deregister_before_stop else \
            LateLeaving(http.deregistration_window_s)
        self._changed = asyncio.Event()
        self._mutex = threading.Lock()  # _sync and deregister run in threads
        self._started: asyncio.Future | None = None  # the first ready's start, shared
        self._cold = ColdDoor(self._settings, http)  # deployments at zero: held here
        self._metrics = IngressMetrics(self._process.paths.exporter_socket,
                                       self._controller_health, lambda: self._wanted.routes)

    async def ready(self) -> str:
        if self._started is None:
            self._started = asyncio.ensure_future(self._start_serving())
        await asyncio.shield(self._started)
        return f"http://{self._address()}"

    async def _start_serving(self) -> None:
        metrics = await serve_unix(self._metrics, self._process.paths.metrics_socket,
                                   "/metrics listener")
        self._stops_with(metrics.stop)
        await self._cold.start(self._process.paths.cold_socket)
        self._stops_with(self._cold.stop)
        await asyncio.to_thread(self._start)
        subscriber = RoutingSubscriber(self._settings, self._on_deployment, self._on_routes,
                                       demands=self._cold.demands)
        subscriber.start()
        self._stops_with(subscriber.stop)
        self._metrics.routing.statistics = subscriber.statistics
        syncing = asyncio.get_running_loop().create_task(self._sync_forever())
        self._stops_with(syncing.cancel)  # held here until then: a task needs an owner

    def _serving(self) -> bool:
        started = self._started
        return started is not None and started.done() and not started.cancelled() and \
            started.exception() is None

    def _address(self) -> str:
        return f"{bind_host(self._http.host)}:{self._http.port}"

    async def _controller_health(self) -> dict:
        """For /metrics scrapes: looked up off the event loop (``actor_lookup``)."""
        controller = await self._actors.get(self._settings.controller_name)
        return await controller.health.remote()

    def _start(self) -> None:
        prune(keep=self._process.paths.root)  # stopped HAProxies' directories, a day old
        node_ip = ray.util.get_node_ip_address()
        if self._process.adopt():
            loaded = self._loaded
            loaded.servers = self._process.servers()
            text = _read(self._process.paths.config)
            self._peers.listen_on(node_ip, text)
            loaded.routes = _routes_of(text)
            loaded.draining = self._wanted.draining = '"node draining"' in text
            logger.info("adopted the running HAProxy (pid %s) with %d backend(s)",
                        self._process.pid, len(loaded.servers))
            return
        # HAProxy's listeners share their port (SO_REUSEPORT): check first that nobody
        # holds it, or a stale HAProxy would silently take half the connections.
        listen_socket(bind_host(self._http.host), self._http.port, exclusive=True).close()
        self._peers.listen_on(node_ip)
        self._load(self._process.start)
        start_guard(self._process.pid)  # it must not outlive its node

    def _load(self, start_or_reload) -> None:
        """(Re)load with the current routes and members written in: the new worker
        serves every RUNNING replica from its first request."""
        wanted, loaded = self._wanted, self._loaded
        routes = dict(wanted.routes or {})
        servers = wanted.servers(loaded.servers, time.monotonic())
        draining, balances, cold = wanted.draining, wanted.balances(), wanted.cold()
        peers = wanted.rendered_peers(balances)
        start_or_reload(render(self._process.paths, bind_host(self._http.host),
                               self._http.port, routes, servers, wanted.maxconn(),
                               draining=draining, limits=self._http.limits(),
                               balances=balances, cold=cold, peers=peers))
        loaded.servers, loaded.routes, loaded.draining = servers, routes, draining
        loaded.balances, loaded.cold, loaded.peers = balances, cold, peers

    # ---- desired state, from the long-polls ------------------------------------------
    def _on_routes(self, update: RoutesUpdate) -> None:
        self._wanted.routes = dict(update.routes)
        self._cold.set_routes(update)
        self._changed.set()

    def _on_deployment(self, key: str, update: RoutingUpdate | None) -> None:
        self._wanted.set_deployment(key, update)
        self._cold.update(key, update)
        self._changed.set()

    # ---- applying it -----------------------------------------------------------------
    async def _sync_forever(self) -> None:
        while not self._stopping:
            try:
                await asyncio.wait_for(self._changed.wait(), _SWEEP_S)
            except asyncio.TimeoutError:
                pass
            self._changed.clear()
            try:
                await asyncio.to_thread(self._sync)
            except Exception:
                logger.exception("HAProxy membership update failed; retrying")
                self._changed.set()
                await asyncio.sleep(0.5)

    def _sync(self) -> None:
        with self._mutex:
            self._sync_locked()

    def _sync_locked(self) -> None:
        if not self._process.alive():
            logger.warning("HAProxy is not running; starting it with the current membership")
            self._load(self._process.start)
            start_guard(self._process.pid)
        if self._loaded.differs(self._wanted):
            self._load(self._process.reload)
        servers = self._loaded.servers
        self._apply(membership.diff(servers, self._wanted.servers(servers, time.monotonic())))
        self._sweep()

    def _apply(self, plan: membership.Plan) -> None:
        workers = self._process.workers()
        current = [w for w in workers if w.reloads == 0]
        now = time.monotonic()
        for backend, server in plan.removed:  # phase 1: every worker, old ones too
            if self._late is not None and self._late.not_yet(backend, server, now):
                continue
            self._leave(backend, server, workers)
        maxconn = self._wanted.maxconn()
        for backend, server, address in plan.added:
            self._add(backend, server, address, current, maxconn.get(backend, 1))

    def _add(self, backend: str, server: str, address: str, current: list,
             maxconn: int) -> None:
        for worker in current:
            if not self._added(worker, membership.add_commands(backend, server, address,
                                                               maxconn)):
                # most likely another server's id (1 in 2e9 a pair): HAProxy numbers it
                self._added(worker, membership.add_commands(backend, server, address,
                                                            maxconn, with_id=False))
        self._loaded.servers.setdefault(backend, {})[server] = address
        self._leaving.discard((backend, server))

    def _added(self, worker: Any, commands: list[str]) -> bool:
        """Run a server's add commands on a worker; False when HAProxy refused the add."""
        for i, command in enumerate(commands):
            answer = self._process.on_worker(worker, command).strip()
            if answer and "registered" not in answer:
                logger.warning("HAProxy: %s: %s", command, answer)
                if i == 0:
                    return False
        return True

    def _leave(self, backend: str, server: str, workers: list) -> None:
        for worker in workers:
            for command in membership.leave_commands(backend, server):
                answer = self._process.on_worker(worker, command).strip()
                # an old worker answers "Proxy is disabled": it takes no new request
                if answer and "disabled" not in answer and "No such" not in answer:
                    logger.warning("HAProxy worker %d: %s: %s", worker.pid, command, answer)
        self._loaded.servers.get(backend, {}).pop(server, None)
        self._leaving.add((backend, server))

    async def deregister(self, deployment: str, replica_id: str,
                         joined: list[tuple[str, str]] = ()) -> bool:
        """Phase 1, on the shard's request before it stops the replica: the server is in
        drain, then maint, in every worker when this returns. ``joined`` (replicas that
        just started serving) are added first if the routing long-poll has not brought
        them yet, so that the backend is never left with no server (a 503)."""
        backend = membership.backend_name(deployment)
        server = membership.server_name(replica_id)

        def leave() -> bool:
            with self._mutex:
                have = self._loaded.servers.get(backend, {})
                if server not in have:
                    return False
                workers = self._process.workers()
                maxconn = self._wanted.maxconn().get(backend, 1)
                for rid, address in joined:
                    name = membership.server_name(rid)
                    if name not in have:
                        self._add(backend, name, address,
                                  [w for w in workers if w.reloads == 0], maxconn)
                        self._wanted.joined_early(backend, name, address, time.monotonic())
                self._leave(backend, server, workers)
                return True
        return await asyncio.to_thread(leave)

    def _sweep(self) -> None:
        """Delete servers that left, once HAProxy lets go of them (no connection left)."""
        current = [w for w in self._process.workers() if w.reloads == 0]
        for backend, server in sorted(self._leaving):
            answers = [self._process.on_worker(w, membership.delete_command(backend, server))
                       for w in current]
            # a server written in the config cannot be deleted: it stays in maint until
            # the next reload leaves it out
            if all("deleted" in a or "No such" in a or "dynamic" in a for a in answers):
                self._leaving.discard((backend, server))

    # ---- the fleet's peers (sticky policies' tables) -----------------------------------
    async def peer(self) -> list[str]:
        """[this node's peer name, the address its HAProxy serves peers on] (once
        ``ready``)."""
        await self.ready()
        return [self._peers.name, self._peers.address]

    async def set_peers(self, peers: dict[str, str]) -> None:
        """Every node's HAProxy, name -> address (the controller's, as nodes change): a
        reload where a backend keeps a stick table and the list changed."""
        self._peers.set(peers)
        self._changed.set()

    # ---- status and lifecycle --------------------------------------------------------
    async def set_draining(self, draining: bool) -> None:
        """Its node is draining: HAProxy's /-/healthz answers 503 (one reload, done when
        this returns); every other request is still served."""
        self._wanted.draining = draining
        if self._serving():  # apply it now, not at the next sync
            await asyncio.to_thread(self._sync)

    async def describe(self) -> dict:
        try:
            workers = len(await asyncio.to_thread(self._process.workers))
        except OSError:  # the master is reloading or restarting
            workers = None
        return {"address": self._address(), "pid": self._process.pid, "workers": workers,
                "ready": self._wanted.routes is not None and not self._loaded.draining,
                "draining": self._wanted.draining,
                "servers": sum(len(s) for s in self._loaded.servers.values())}


def _routes_of(config: str) -> dict[str, str] | None:
    """The routes an adopted HAProxy's config was rendered with (its /-/routes JSON)."""
    for line in config.splitlines():
        if "path /-/routes" in line and " string " in line:
            quoted = line.split(" string ", 1)[1].rsplit(" if ", 1)[0]
            try:
                return json.loads(json.loads(quoted))
            except ValueError:
                return None
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
