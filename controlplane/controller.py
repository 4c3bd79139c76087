"""The Controller: one named, detached actor holding the desired state.

It validates and builds a deploy config as a whole, and only then commits it: a config
that fails validation or whose code fails to import changes nothing that is running.
The accepted config is checkpointed in Ray's internal key-value store (GCS) before it is
pushed, so a restarted controller resumes from it. Each deployment belongs to the shard
its id hashes to (``specs.shard_of``); the controller pushes whole specs, shards converge.

Self-healing: every control actor runs with ``max_restarts=-1``. A restarted controller
resumes from the checkpoint as soon as anyone calls it (proxies long-poll it all the
time), adopting the shards and proxies it finds alive. The controller watches shards and
proxies (``supervision.Supervisor``): a restarted shard is sent its desired state again
and re-adopts its replicas; a restarted proxy is told to serve again.

The fleet follows the nodes (``nodes.NodeWatch``, one GCS reading a second): listeners
on every alive node, forgotten when it leaves; a draining node's listeners fail
readiness and the shards move its replicas before its deadline. Where a deployment
reports through node reporters, every node's reporter is created before replicas start
(at a deploy and when a node joins), not behind them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ray
import ray.cloudpickle as cloudpickle
from ray.exceptions import RayActorError
from ray.experimental import internal_kv

from controlplane.config.options import HTTPOptions
from controlplane.config.schema import config_to_dict, ignored_fields, parse_deploy_config
from controlplane.usercode.build_workers import build_all
from controlplane.capacity import node_resources, shortfall
from controlplane.control_placement import control_options
from controlplane.errors import DeployRejected
from controlplane.gcs import known_storage, read_storage
from controlplane.health.stats import merge_all
from controlplane.long_poll import LongPollHost
from controlplane.nodes import NodeChanges, NodeInfo, NodeWatch, node_rows, read_nodes
from controlplane.priority import take_control_priority
from controlplane.ingress.proxy_fleet import ProxyFleet
from controlplane.replica_client import load_plugin
from controlplane.serve_facade.host import ServeApiHost
from controlplane.settings import REPORTER_PREFIX, Settings, shard_actor_name, uses_reporter
from controlplane.shard import ControllerShard
from controlplane.specs import DeploymentId, DeploymentSpec, shard_of, with_direct_ingress
from controlplane.status import assemble_status, check_names
from controlplane.supervision import Supervisor, restarted_by_ray
from controlplane.wire import ROUTES_KEY, START_REPORTERS, RoutesUpdate

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Committed:
    """What the last deploy committed: its normalized config (checkpointed, shown by
    status), its ``http_options`` as validated, and the specs it built, by id."""

    config: dict
    http: HTTPOptions
    specs: dict[DeploymentId, DeploymentSpec]


class Controller:
    def __init__(self, settings: dict) -> None:
        take_control_priority("controller")
        self._settings = Settings.from_dict(settings)
        self._lock = asyncio.Lock()
        self._committed: Committed | None = None  # None until a deploy (or its checkpoint)
        self._shards: list[Any] = []
        self._generation = 0
        self._recovered = False
        self._routes = LongPollHost()
        self._supervisor = Supervisor()
        self._proxies = ProxyFleet(self._settings, self._supervisor)
        self._serve_api = ServeApiHost(self._settings, self._supervisor)
        self._nodes = NodeWatch(self._on_nodes)
        self._drains: dict[str, float] = {}  # draining node -> wall-clock deadline
        self._recovery: asyncio.Task | None = None
        self._deploying: tuple[str, float] | None = None  # (applications, since)
        self._restarts = _count_restart(self._settings.checkpoint_key)

    @property
    def _config(self) -> dict | None:
        return self._committed.config if self._committed is not None else None

    @property
    def _specs(self) -> dict[DeploymentId, DeploymentSpec]:
        return self._committed.specs if self._committed is not None else {}

    def _kick_recovery(self) -> None:
        """A restarted controller resumes on the first call that reaches it."""
        if not self._recovered and self._recovery is None:
            self._recovery = asyncio.get_running_loop().create_task(self.ready())
            self._recovery.add_done_callback(_log_failed_recovery)

    async def ready(self) -> dict:
        """Resume from the checkpoint once (a restarted controller re-applies it). Never
        waits for a deploy in progress once resumed: ``status`` answers throughout."""
        if self._recovered:
            return {"generation": self._generation, "num_shards": len(self._shards)}
        self._serve_api.ensure()  # Serve's tools find fleetplane (serve_facade)
        async with self._lock:
            if not self._recovered:
                read_storage()  # once: status says it (gcs.known_storage)
                saved = internal_kv._internal_kv_get(self._settings.checkpoint_key)
                if saved:
                    logger.info("controller: resuming from checkpoint")
                    config, specs = cloudpickle.loads(saved)
                    # validated when it was deployed; parsed again into its typed form
                    http = HTTPOptions.model_validate(config["http_options"])
                    await self._commit(config, http, specs)
                # only now: a status asked meanwhile waits here for the resumed state,
                # never answering "no applications" from a controller still resuming
                self._recovered = True
        return {"generation": self._generation, "num_shards": len(self._shards)}

    async def deploy(self, config: dict) -> dict:
        await self.ready()
        async with self._lock:
            return await self._apply(config)

    async def _apply(self, config: dict) -> dict:
        cfg = parse_deploy_config(config, source="<deploy request>")
        num_shards = cfg.controller_options.num_shards
        if self._shards and num_shards != len(self._shards):
            raise DeployRejected(
                f"controller_options.num_shards cannot change on a running instance "
                f"(running: {len(self._shards)}, requested: {num_shards}); keep "
                f"{len(self._shards)} or run `fleetplane shutdown` first")
        normalized = config_to_dict(cfg)
        timeout_s = normalized["controller_options"]["build_timeout_s"]
        self._deploying = (", ".join(a["name"] for a in normalized["applications"]),
                           time.monotonic())
        try:  # raises: nothing changed
            specs, warnings = await build_all(normalized["applications"], timeout_s)
            result = await self._commit(normalized, cfg.http_options, specs, checkpoint=True)
            result["warnings"] = [*ignored_fields(cfg), *warnings, *result["warnings"]]
            result["serve_api_address"] = await self._serve_api.address_within(10.0)
            return result
        finally:
            self._deploying = None

    def deploy_in_progress(self) -> str:
        """What the deploy that holds the lock is doing, or "" (a later deploy waits)."""
        if self._deploying is None:
            return ""
        apps, since = self._deploying
        return f"a deploy of {apps} started {time.monotonic() - since:.0f}s ago"

    async def _commit(self, normalized: dict, http: HTTPOptions, specs: list[DeploymentSpec],
                      checkpoint: bool = False) -> dict:
        num_shards = normalized["controller_options"]["num_shards"]
        specs = with_direct_ingress(specs, http)
        await self._proxies.ensure(http)  # raises: nothing changed
        if checkpoint:
            # The built specs are checkpointed, not only the config: a restarted controller
            # resumes exactly what was deployed, without re-importing code edited since.
            internal_kv._internal_kv_put(self._settings.checkpoint_key,
                                         cloudpickle.dumps((normalized, specs)), overwrite=True)
        self._ensure_shards(num_shards)
        # after the shards (their workers start first), before the replicas the push starts
        await self._ensure_reporters(specs)
        self._committed = Committed(normalized, http, {s.id: s for s in specs})
        self._generation += 1
        await self._push()
        self._nodes.start()
        self._routes.publish(ROUTES_KEY, RoutesUpdate(
            num_shards=num_shards, generation=self._generation,
            routes={s.route_prefix: str(s.id) for s in specs
                    if s.ingress and s.route_prefix is not None}))
        return {"generation": self._generation, "deployments": [str(s) for s in self._specs],
                "num_shards": num_shards, "http": self._proxies.addresses(),
                "warnings": self._placement_warnings()}

    def _placement_warnings(self) -> list[str]:
        """Deployments that ask for more than the alive nodes could ever hold (accepted:
        nodes may join), logged and returned to the deploy."""
        nodes = node_resources(ray.nodes())
        warnings = [f"{spec.id}: {text}" for spec in self._specs.values()
                    if (text := shortfall(spec.num_replicas, spec.ray_actor_options, nodes))]
        for warning in warnings:
            logger.warning("deploy accepted, but %s", warning)
        return warnings

    def _ensure_shards(self, num_shards: int) -> None:
        if self._shards:
            return
        remote_shard = ray.remote(ControllerShard)
        where = control_options(self._settings.control_plane_on)
        self._shards = [remote_shard.options(
            name=shard_actor_name(i), namespace=self._settings.namespace, lifetime="detached",
            num_cpus=0, get_if_exists=True, max_concurrency=10_000, max_restarts=-1, **where,
        ).remote(i, self._settings.to_dict()) for i in range(num_shards)]
        for i, shard in enumerate(self._shards):
            self._supervisor.watch(f"shard_{i}", shard, lambda i=i: self._recover_shard(i))

    async def _recover_shard(self, index: int) -> None:
        """A restarted shard gets its desired state; under the lock, so it can never
        overtake a newer deploy's push with an older set."""
        async with self._lock:
            await self._push_one(index)

    async def _push(self) -> None:
        """Level-based: each shard gets its whole desired set and deletes what is not in
        it, so a push that failed part-way is repaired by the next one. A shard that Ray is
        restarting gets it from its watch once it is back (``_recover_shard``)."""
        results = await asyncio.gather(*(self._push_one(i) for i in range(len(self._shards))),
                                       return_exceptions=True)
        for index, result in enumerate(results):
            if isinstance(result, RayActorError):
                logger.warning("shard %d is restarting; it gets this deploy when it is back",
                               index)
            elif isinstance(result, BaseException):
                raise result

    async def _push_one(self, index: int) -> None:
        """Shard ``index``'s whole desired set (also what a restarted shard recovers from)."""
        k = len(self._shards)
        specs = [s for s in self._specs.values() if shard_of(s.id, k) == index]
        # Drains only once the node watch has read the cluster: a restarted controller
        # knows none yet, and must not tell a shard that its draining nodes stopped.
        drains = self._drains if self._nodes.nodes else None
        await self._shards[index].set_desired.remote(specs, drains)

    async def _ensure_reporters(self, specs: list[DeploymentSpec]) -> None:
        """Every schedulable node's reporter created before replicas need it, if any
        deployment reports through one (``node_reporter.start_reporters``)."""
        replica = self._settings.replica
        if not any(uses_reporter(replica.report_batch_interval_s,
                                 replica.metrics_report_interval_s, s.health_check_period_s)
                   for s in specs):
            return

        def start() -> None:
            nodes = [n for n, info in read_nodes().items() if info.alive and not info.draining]
            load_plugin(START_REPORTERS)(self._settings.namespace, nodes,
                                         replica.report_batch_interval_s)
        try:  # never fails a deploy midway: replicas make a missing reporter themselves
            await asyncio.to_thread(start)
        except Exception as e:
            logger.warning("node reporters were not created ahead of the replicas: %r", e)

    async def _on_nodes(self, changes: NodeChanges, nodes: Mapping[str, NodeInfo]) -> None:
        """The fleet follows the nodes: listeners on a node that joined, none kept for one
        that left; a draining node's listeners fail readiness and the shards move its
        replicas (``deployment.reconcile``: replacements first, then the normal drain)."""
        if changes.left:
            logger.info("nodes left: %s", ", ".join(n[:12] for n in changes.left))
            await self._proxies.forget(list(changes.left))
        if changes.joined and self._committed is not None:
            await self._proxies.ensure(self._committed.http)
            await self._ensure_reporters(list(self._specs.values()))
        if changes.drains is not None:
            logger.info("draining nodes: %s", {n[:12]: d for n, d in changes.drains.items()})
            self._drains = dict(changes.drains)
            await self._proxies.set_draining(set(self._drains))
            results = await asyncio.gather(
                *(shard.set_node_drains.remote(self._drains) for shard in self._shards),
                return_exceptions=True)  # a restarting shard gets them with its recovery
            for error in (r for r in results if isinstance(r, BaseException)):
                logger.warning("a shard did not take the draining nodes: %r", error)

    async def listen_routes(self, known: dict, timeout_s: float = 30.0) -> dict:
        """Long-poll for proxies and handles: route prefixes and the shard count."""
        self._kick_recovery()
        return await self._routes.listen(known, watch_all=True, timeout_s=timeout_s)

    async def running_config(self) -> dict | None:
        """The committed config, normalized (``serve_facade``: what runs, to merge a
        Serve config into and to show as ``deployed_app_config``)."""
        await self.ready()
        return self._config

    async def ingress_of(self, app: str) -> str | None:
        """The name of an application's ingress deployment (``serve.get_app_handle``)."""
        return next((s.id.name for s in self._specs.values() if s.id.app == app and s.ingress),
                    None)

    async def health(self) -> dict:
        """``controller.health`` alone (for the proxies' /metrics)."""
        self._kick_recovery()
        stats = await asyncio.gather(*(s.health.remote() for s in self._shards))
        return merge_all(stats).as_json()

    async def status(self, summary: bool = False, app: str | None = None,
                     deployment: str | None = None) -> dict:
        """``fleetplane status``. ``summary``: replica counts instead of rows (O(1) per
        deployment, for pollers); ``app``/``deployment``: only those, filtered by the
        shards (``UnknownName`` when a filter names nothing known)."""
        await self.ready()
        answers = await asyncio.gather(*(asyncio.wait_for(
            s.status.remote(summary=summary, app=app, deployment=deployment), _SHARD_STATUS_S)
            for s in self._shards), return_exceptions=True)
        shard_status = [a if not isinstance(a, BaseException) else _restarting_shard(i, a)
                        for i, a in enumerate(answers)]
        status = assemble_status(self._config, shard_status, self._generation, app, deployment)
        if app is not None or deployment is not None:
            shown = [(a, n) for a, entry in status["applications"].items()
                     for n in entry["deployments"]]
            check_names(app, deployment, [(d.app, d.name) for d in self._specs] + shown,
                        status["applications"])
        nodes = self._nodes.nodes or await asyncio.to_thread(read_nodes)
        self._explain_placement(status, [dict(n.resources) for n in nodes.values() if n.alive])
        status["controller"]["proxies"] = self._proxies.addresses()
        ingress = self._committed.http.ingress if self._committed is not None else "proxy"
        status["controller"]["ingress"] = ingress
        status["controller"]["gcs_storage"] = known_storage()
        status.update(self._serve_api.describe())
        listeners = await self._proxies.describe()
        if ingress == "haproxy":
            status["controller"]["haproxy"] = listeners
        status["nodes"] = node_rows(nodes, listeners, {} if summary else status["applications"])
        if summary:  # no replica rows to place on nodes: no "replicas" list either
            status["nodes"] = [{k: v for k, v in row.items() if k != "replicas"}
                               for row in status["nodes"]]
        status["controller"]["actors"] = {
            "controller": {"alive": True, "restarts": self._restarts,
                           "last_restart_reason": "its process died; Ray restarted it"
                           if self._restarts else ""},
            **self._supervisor.statistics()}
        return status

    def _explain_placement(self, status: dict, nodes: list[dict[str, float]]) -> None:
        """A deployment short of room says so (``placement``, and its message if it has
        none), from the node watch's last reading of the alive nodes' resources."""
        for app, a in status["applications"].items():
            for name, dep in a["deployments"].items():
                spec = self._specs.get(DeploymentId(app, name))
                text = spec and shortfall(dep["target_replicas"], spec.ray_actor_options, nodes)
                if text:
                    dep["placement"] = text
                    dep["message"] = dep["message"] or text

    async def shutdown(self, timeout_s: float = 60.0) -> dict:
        """Drain and stop every replica and shard, and forget the checkpoint."""
        async with self._lock:
            self._supervisor.stop_all()  # what is stopped now must stay stopped
            self._nodes.stop()
            await self._serve_api.shutdown()  # first: its bridges route through the shards
            drained = await asyncio.gather(*(s.shutdown.remote(timeout_s) for s in self._shards),
                                           return_exceptions=True)
            for shard in self._shards:
                ray.kill(shard, no_restart=True)
            await self._proxies.shutdown()
            await asyncio.to_thread(_kill_reporters, self._settings.namespace)
            internal_kv._internal_kv_del(self._settings.checkpoint_key)
            internal_kv._internal_kv_del(f"{self._settings.checkpoint_key}/restarts")
            self._shards, self._committed = [], None
            return {"drained": all(d is True for d in drained)}


def _kill_reporters(namespace: str) -> None:
    """The node reporters of this namespace (replicas create them; nothing else ends them)."""
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == namespace and actor["name"].startswith(REPORTER_PREFIX):
            try:
                ray.kill(ray.get_actor(actor["name"], namespace=namespace), no_restart=True)
            except ValueError:  # gone meanwhile
                pass


def _log_failed_recovery(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("controller: resuming from the checkpoint failed; deploy again to "
                     "recover", exc_info=task.exception())


_SHARD_STATUS_S = 5.0  # a shard slower than this is restarting (or stuck): say so


def _restarting_shard(index: int, error: BaseException) -> dict:
    """The status row of a shard that did not answer: Ray is restarting it; its
    deployments keep serving and show again once it re-adopted them."""
    return {"index": index, "deployments": {}, "ticks": 0, "tick_errors_total": 0,
            "last_tick_ms": 0.0, "unavailable": f"{type(error).__name__}: restarting"}


def _count_restart(checkpoint_key: str) -> int:
    """How often Ray restarted this controller (kept beside the checkpoint in GCS)."""
    key = f"{checkpoint_key}/restarts"
    restarts = int(internal_kv._internal_kv_get(key) or 0)
    if restarted_by_ray():
        restarts += 1
        internal_kv._internal_kv_put(key, str(restarts).encode(), overwrite=True)
    return restarts
