"""The per-node Ray actor of the ``haproxy`` ingress mode.

It runs the node's HAProxy (``process``), follows routes and replica sets with the same
long-polls as a proxy (``RoutingSubscriber``), and keeps HAProxy's servers equal to the
RUNNING replicas' direct-ingress addresses through the runtime API (``membership``): a
scale event needs no reload; a route change reloads through the master CLI. A replica
that leaves is put in ``drain`` then ``maint`` in the current worker (an old worker, kept
by a reload for the responses it is still sending, takes no new request and refuses
runtime commands).

Supervised like a proxy (the controller's watch, ``max_restarts=-1``). HAProxy runs in a
process session of its own, so when this actor dies its HAProxy keeps serving; the
restarted actor adopts it (same master socket) and re-reads its servers. A crashed
HAProxy is started again with the current membership.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

import ray
import uvicorn

from controlplane.ingress.haproxy import membership
from controlplane.ingress.haproxy.config import Paths, render
from controlplane.ingress.haproxy.guard import start_guard
from controlplane.ingress.haproxy.metrics import IngressMetrics
from controlplane.ingress.haproxy.process import HAProxyProcess
from controlplane.priority import take_control_priority
from controlplane.ingress.proxy import listen_socket
from controlplane.routing.bind import bind_host
from controlplane.routing.subscriber import RoutingSubscriber
from controlplane.settings import Settings
from controlplane.wire import HTTPLimits, RoutesUpdate, RoutingUpdate

logger = logging.getLogger(__name__)
_SWEEP_S = 1.0  # crash check and deletion of servers that left
_EARLY_S = 10.0  # how long a replica added by a deregistration waits for the long-poll


def runtime_dir(namespace: str, node_id: str) -> Path:
    return Path(tempfile.gettempdir()) / f"fleetplane-{os.getuid()}" / namespace / \
        f"haproxy-{node_id[:12]}"


class HAProxyIngress:
    """Same constructor as ``Proxy``, so the proxy fleet starts either."""

    def __init__(self, settings: dict, http_options: dict, index: int = 0,
                 listeners: int = 1, exclusive: bool = True) -> None:
        take_control_priority("haproxy ingress")  # before HAProxy starts: it inherits it
        self._settings = Settings.from_dict(settings)
        self._http = http_options
        node_id = ray.get_runtime_context().get_node_id()
        self._process = HAProxyProcess(Paths(runtime_dir(self._settings.namespace, node_id)))
        self._routes: dict[str, str] | None = None  # prefix -> deployment key
        self._loaded_routes: dict[str, str] | None = None  # what HAProxy's config has
        self._draining = False  # the node drains: readiness fails (a reload renders it)
        self._loaded_draining = False
        self._deployments: dict[str, RoutingUpdate] = {}
        self._servers: membership.Servers = {}  # what the current worker has
        self._leaving: set[tuple[str, str]] = set()  # in maint, to delete once idle
        # added by a deregistration before the long-poll brought them: (address, until)
        self._early: dict[tuple[str, str], tuple[str, float]] = {}
        # Phase 1 off (``ReplicaSettings.deregister_before_stop``, only to show what it
        # prevents): HAProxy hears that a replica left a deregistration window late, as
        # membership applied by a later reload would be.
        self._phase1 = self._settings.replica.deregister_before_stop
        self._late: dict[tuple[str, str], float] = {}  # (backend, server) -> when to tell
        self._changed = asyncio.Event()
        self._mutex = threading.Lock()  # _sync and deregister run in threads
        self._subscriber: RoutingSubscriber | None = None
        self._task: asyncio.Task | None = None
        self._stopped = asyncio.Event()
        self._metrics = IngressMetrics(self._process.paths.exporter_socket,
                                       self._controller_health, lambda: self._routes)
        self._metrics_server: uvicorn.Server | None = None

    async def ready(self) -> str:
        if self._task is None:
            self._metrics_server = await _serve_unix(self._metrics,
                                                     self._process.paths.metrics_socket)
            await asyncio.to_thread(self._start)
            self._subscriber = RoutingSubscriber(self._settings, self._on_deployment,
                                                 self._on_routes)
            self._subscriber.start()
            self._metrics.routing.statistics = self._subscriber.statistics
            self._task = asyncio.get_running_loop().create_task(self._sync_forever())
        return f"http://{bind_host(self._http['host'])}:{self._http['port']}"

    async def _controller_health(self) -> dict:
        s = self._settings
        return await ray.get_actor(s.controller_name, namespace=s.namespace).health.remote()

    def _start(self) -> None:
        if self._process.adopt():
            self._servers = self._process.servers()
            loaded = _read(self._process.paths.config)
            self._loaded_routes = _routes_of(loaded)
            self._loaded_draining = self._draining = '"node draining"' in loaded
            logger.info("adopted the running HAProxy (pid %s) with %d backend(s)",
                        self._process.pid, len(self._servers))
            return
        # HAProxy's listeners share their port (SO_REUSEPORT): check first that nobody
        # holds it, or a stale HAProxy would silently take half the connections.
        listen_socket(bind_host(self._http["host"]), self._http["port"], exclusive=True).close()
        self._load(self._process.start)
        start_guard(self._process.pid)  # it must not outlive its node

    def _load(self, start_or_reload) -> None:
        """(Re)load with the current routes and members written in: the new worker
        serves every RUNNING replica from its first request."""
        routes, servers = dict(self._routes or {}), self._desired()
        maxconn = self._maxconn()
        draining = self._draining
        start_or_reload(render(self._process.paths, bind_host(self._http["host"]),
                               self._http["port"], routes, servers, maxconn, draining=draining,
                               limits=HTTPLimits.from_http_options(self._http)))
        self._servers, self._loaded_routes, self._loaded_draining = servers, routes, draining

    # ---- desired state, from the long-polls ------------------------------------------
    def _on_routes(self, update: RoutesUpdate) -> None:
        self._routes = dict(update.routes)
        self._changed.set()

    def _on_deployment(self, key: str, update: RoutingUpdate | None) -> None:
        if update is None:
            self._deployments.pop(key, None)
        else:
            self._deployments[key] = update
        self._changed.set()

    # ---- applying it -----------------------------------------------------------------
    async def _sync_forever(self) -> None:
        while not self._stopped.is_set():
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
        if (self._routes is not None and self._routes != self._loaded_routes) or \
                self._draining != self._loaded_draining:
            self._load(self._process.reload)
        self._apply(membership.diff(self._servers, self._desired()))
        self._sweep()

    # The long-poll callbacks write these dicts on the event loop while _sync reads them in
    # a thread: each read starts from a copy (``dict(...)`` copies under the GIL).
    def _desired(self) -> membership.Servers:
        """The members to serve. A deployment whose replica set this actor has not heard
        yet (it just restarted and adopted a running HAProxy) keeps the servers it has:
        unknown is not empty."""
        keys, deployments = set(dict(self._routes or {}).values()), dict(self._deployments)
        desired = membership.desired_servers({
            key: [(r.replica_id, r.http_address) for r in update.replicas if r.http_address]
            for key, update in deployments.items() if key in keys})
        for key in keys - set(deployments):
            backend = membership.backend_name(key)
            desired[backend] = dict(self._servers.get(backend, {}))
        now = time.monotonic()
        for (backend, server), (address, until) in list(self._early.items()):
            if now >= until or server in desired.get(backend, {}):
                del self._early[(backend, server)]  # the long-poll has it (or never will)
            elif backend in desired:
                desired[backend][server] = address
        return desired

    def _maxconn(self) -> dict[str, int]:
        return {membership.backend_name(k): u.max_ongoing_requests
                for k, u in dict(self._deployments).items()}

    def _apply(self, plan: membership.Plan) -> None:
        workers = self._process.workers()
        current = [w for w in workers if w.reloads == 0]
        for backend, server in plan.removed:  # phase 1: every worker, old ones too
            if not self._phase1 and self._not_yet(backend, server):
                continue
            self._leave(backend, server, workers)
        maxconn = self._maxconn()
        for backend, server, address in plan.added:
            self._add(backend, server, address, current, maxconn.get(backend, 1))

    def _add(self, backend: str, server: str, address: str, current: list,
             maxconn: int) -> None:
        for worker in current:
            for command in membership.add_commands(backend, server, address, maxconn):
                answer = self._process.on_worker(worker, command).strip()
                if answer and "registered" not in answer:
                    logger.warning("HAProxy: %s: %s", command, answer)
        self._servers.setdefault(backend, {})[server] = address
        self._leaving.discard((backend, server))

    def _not_yet(self, backend: str, server: str) -> bool:
        """Phase 1 off: HAProxy is told a deregistration window after the replica left."""
        now = time.monotonic()
        due = self._late.setdefault((backend, server),
                                    now + self._http.get("deregistration_window_s", 2.0))
        if due > now:
            return True
        del self._late[(backend, server)]
        return False

    def _leave(self, backend: str, server: str, workers: list) -> None:
        for worker in workers:
            for command in membership.leave_commands(backend, server):
                answer = self._process.on_worker(worker, command).strip()
                # an old worker answers "Proxy is disabled": it takes no new request
                if answer and "disabled" not in answer and "No such" not in answer:
                    logger.warning("HAProxy worker %d: %s: %s", worker.pid, command, answer)
        self._servers.get(backend, {}).pop(server, None)
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
                if server not in self._servers.get(backend, {}):
                    return False
                workers = self._process.workers()
                have = self._servers.get(backend, {})
                maxconn = self._maxconn().get(backend, 1)
                for rid, address in joined:
                    name = membership.server_name(rid)
                    if name not in have:
                        self._add(backend, name, address,
                                  [w for w in workers if w.reloads == 0], maxconn)
                        # kept until the long-poll brings it, not removed as unknown
                        self._early[(backend, name)] = (address, time.monotonic() + _EARLY_S)
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

    # ---- status and lifecycle --------------------------------------------------------
    async def set_draining(self, draining: bool) -> None:
        """Its node is draining: HAProxy's /-/healthz answers 503 (one reload, done when
        this returns); every other request is still served."""
        self._draining = draining
        if self._task is not None:  # serving: apply it now, not at the next sync
            await asyncio.to_thread(self._sync)

    async def describe(self) -> dict:
        try:
            workers = len(await asyncio.to_thread(self._process.workers))
        except OSError:  # the master is reloading or restarting
            workers = None
        return {"address": f"{bind_host(self._http['host'])}:{self._http['port']}",
                "pid": self._process.pid, "workers": workers,
                "ready": self._routes is not None and not self._loaded_draining,
                "draining": self._draining,
                "servers": sum(len(s) for s in self._servers.values())}

    async def wait_until_stopped(self) -> None:
        await self._stopped.wait()

    async def shutdown(self) -> None:
        self._stopped.set()
        if self._subscriber is not None:
            self._subscriber.stop()
        if self._metrics_server is not None:
            self._metrics_server.should_exit = True
        await asyncio.to_thread(self._process.stop)


async def _serve_unix(app, path: Path) -> uvicorn.Server:
    """uvicorn on a unix socket at ``path`` (a stale one from a previous actor replaced)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                           access_log=False))
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            raise RuntimeError(f"/metrics listener stopped: {task.exception()!r}")
        await asyncio.sleep(0.01)
    return server


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
