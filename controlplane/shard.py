"""ControllerShard: owns the deployments that hash to it and reconciles their replicas.

A thin actor shell: it receives desired specs from the controller (``apply``), metric
reports from its replicas (``report_rows``, one replica's, or ``report_batch``, a node
reporter's; they carry pushed health) and health heartbeats (``report_health``), and runs one reconcile loop that ticks each owned
deployment. Pushes are stamped with the shard's monotonic time on arrival. The push-health
counters (``HealthTotals``) are shard-wide, so a deleted deployment never takes its counts
with it. Every background task is owned by the shard (kept in ``_tasks``, errors
logged with the deployment they belong to), so nothing runs unowned.

The shard's own work (ticks, slices, and the bookkeeping steps that must stay rare) is
counted in one ``WorkTotals``, exported in status beside the health counters.

A deployment whose tick raises is backed off (``ErrorBackoff``: 0.1 s doubling to 30 s on
the shard's clock, reset by one clean tick) while the others keep ticking; each raise is
counted in ``tick_errors_total`` and its traceback logged only when the error changes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Coroutine

from controlplane.clock import Clock, SystemClock
from controlplane.deployment.replica_ops import OpsContext, ReplicaOps
from controlplane.deployment.state import DeploymentState
from controlplane.deployment.work import WorkTotals
from controlplane.ingress.haproxy.deregister import IngressDeregistrar
from controlplane.health.stats import HealthTotals
from controlplane.long_poll import LongPollHost
from controlplane.plan_freeze import NoFreeze, PlanFreeze
from controlplane.priority import take_control_priority
from controlplane.replica_client import RayReplicaClient, ReplicaClient
from controlplane.routing.backoff import ErrorBackoff
from controlplane.settings import Settings, shard_actor_name
from controlplane.specs import DeploymentId, DeploymentSpec
from controlplane.wire import (Batch, MetricReport, PushedHealth, ReportRow, RequestError,
                               RouterDemand, RoutingDelta, apply_routing_delta, report_row)

logger = logging.getLogger(__name__)

# A tick that raised is a bug, not load: retry soon, then rarely, never in a hot loop.
_TICK_BACKOFF = ErrorBackoff(initial_s=0.1, max_s=30.0)


class ShardCore:
    """Everything a shard does, without Ray: the actor below only wires the real client."""

    def __init__(self, index: int, settings: Settings, client: ReplicaClient,
                 clock: Clock, ingress: Any = None, collector: PlanFreeze | None = None) -> None:
        self.index = index
        # the garbage collector during a big plan (plan_freeze.py): the actor's process
        # freezes after slices; elsewhere (unit tests) Python's collector as it is
        self.collector = collector if collector is not None else NoFreeze()
        self._settings = settings
        self.work = WorkTotals()
        self.health_totals = HealthTotals()
        self._ops = OpsContext(client, clock, self._spawn, shard_actor_name(index), settings,
                               ingress, self.work)
        self._deployments: dict[DeploymentId, DeploymentState] = {}
        # The same states by the (app, name) tuple replicas report with: a C-level hash
        # per report, where a DeploymentId's is interpreted.
        self._by_key: dict[tuple[str, str], DeploymentState] = {}
        self._tasks: set[asyncio.Task] = set()  # every task the shard runs, the loop's too
        self._loop_task: asyncio.Task | None = None
        self.routing = LongPollHost()  # key: str(DeploymentId) -> routing payload
        self._tick_backoffs: dict[DeploymentId, ErrorBackoff] = {}  # ticks that raised
        self._drains: dict[str, float] = {}  # draining node -> deadline (this clock)
        self._slice: asyncio.Handle | None = None  # the next slice, when one is due
        self.slice_observer: Callable[[float], None] | None = None  # each slice's seconds

    def _spawn(self, coro: Coroutine) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("shard %d task failed", self.index, exc_info=task.exception())

    def _new_state(self, spec: DeploymentSpec) -> DeploymentState:
        return DeploymentState(spec, self._settings.shard,
                               lambda d: ReplicaOps(d, self._ops),
                               totals=self.health_totals, work=self.work)

    def apply(self, specs: list[DeploymentSpec], deleted: list[DeploymentId]) -> None:
        for spec in specs:
            state = self._deployments.get(spec.id)
            if state is None:  # new here: first take over its live replicas, if any
                self._deployments[spec.id] = state = self._new_state(spec)
                self._by_key[(spec.id.app, spec.id.name)] = state
                state.set_node_drains(self._drains)
                state.adopt_existing()
            else:
                state.update_spec(spec)
        for dep_id in deleted:
            if dep_id in self._deployments:
                self._deployments[dep_id].delete()
        self.ensure_running()

    def set_node_drains(self, drains: dict[str, float]) -> None:
        """Draining nodes -> deadline on this shard's clock (``math.inf``: none)."""
        self._drains = dict(drains)
        for state in self._deployments.values():
            state.set_node_drains(self._drains)

    def set_desired(self, specs: list[DeploymentSpec]) -> None:
        """The whole desired set of this shard: owned deployments not in it are deleted."""
        wanted = {spec.id for spec in specs}
        self.apply(specs, [dep_id for dep_id in self._deployments if dep_id not in wanted])

    def ensure_running(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run_forever())

    async def _run_forever(self) -> None:
        interval = self._settings.shard.tick_interval_s
        while True:
            try:
                self.tick()
            except Exception:  # outermost loop: log and keep reconciling the rest
                logger.exception("shard %d tick failed", self.index)
            await asyncio.sleep(interval)

    def tick(self) -> None:
        started = time.perf_counter()
        now = self._ops.clock.monotonic()
        for dep_id, state in list(self._deployments.items()):
            if not self._tick_deployment(dep_id, state, now):
                continue
            if state.finished_deleting:
                del self._deployments[dep_id]
                del self._by_key[(dep_id.app, dep_id.name)]
                self._tick_backoffs.pop(dep_id, None)
                self.routing.remove(str(dep_id))
                continue
            self._publish(dep_id, state)
        self.work.ticks += 1
        self.work.last_tick_s = time.perf_counter() - started
        self._schedule_slice()
        self.collector.at_tick(self._slice is not None, now)

    def _publish(self, dep_id: DeploymentId, state: DeploymentState) -> None:
        update = state.routing_update(self._ops.clock.monotonic())
        if isinstance(update, RoutingDelta):
            self.routing.publish_delta(str(dep_id), update, apply_routing_delta)
        elif update is not None:
            self.routing.publish(str(dep_id), update)

    # ---- slices: a big plan carried out a bounded piece at a time -------------------------
    def _schedule_slice(self) -> None:
        """Another slice right after the loop's ready work, if a deployment left planned
        transitions (``ShardSettings.transitions_per_slice``)."""
        if self._slice is None and any(s.more_now for s in self._deployments.values()):
            self._slice = asyncio.get_running_loop().call_soon(self._run_slice)

    def _run_slice(self) -> None:
        self._slice = None
        started = time.perf_counter()
        now = self._ops.clock.monotonic()
        for dep_id, state in list(self._deployments.items()):
            if not state.more_now:
                continue
            try:
                state.continue_slice(now)
            except Exception as e:  # as a failed tick: counted, logged, backed off
                state.end_slices()
                self._tick_failed(dep_id, self._tick_backoffs.get(dep_id, _TICK_BACKOFF), e, now)
                continue
            self._publish(dep_id, state)
        self.work.slices += 1
        self.collector.after_slice(now)
        if self.slice_observer is not None:
            self.slice_observer(time.perf_counter() - started)
        self._schedule_slice()

    def _tick_deployment(self, dep_id: DeploymentId, state: DeploymentState, now: float) -> bool:
        """Tick one deployment unless it is backing off; False when its tick raised."""
        backoff = self._tick_backoffs.get(dep_id)
        if backoff is not None and not backoff.due(now):
            return True  # skipped, not failed: its routing and deletion still move on
        try:
            state.tick(now)
        except Exception as e:  # one deployment's bug must not stall the others
            self._tick_failed(dep_id, backoff or _TICK_BACKOFF, e, now)
            return False
        if backoff is not None and backoff.failing:
            self._tick_backoffs[dep_id] = backoff.cleared()
            if backoff.logged:
                logger.info("shard %d: tick of %s succeeds again after %d failures",
                            self.index, dep_id, backoff.failures)
        return True

    def _tick_failed(self, dep_id: DeploymentId, backoff: ErrorBackoff, error: Exception,
                     now: float) -> None:
        text = f"{type(error).__name__}: {error}"
        failed = self._tick_backoffs[dep_id] = backoff.with_failure(now, text)
        self.health_totals.tick_errors_total += 1
        if backoff.is_new(text):
            logger.error("shard %d: tick of %s failed; retrying in %gs, backing off to %gs; "
                         "until the error changes, repeats are only counted "
                         "(tick_errors_total)", self.index, dep_id,
                         failed.retry_at - now, failed.max_s, exc_info=error)
        else:
            logger.debug("shard %d: tick of %s failed again (%d in a row): %s",
                         self.index, dep_id, failed.failures, text)

    def now(self) -> float:
        return self._ops.clock.monotonic()

    def deployment(self, dep_id: DeploymentId) -> DeploymentState | None:
        return self._deployments.get(dep_id)

    def _reported(self, key: tuple[str, str]) -> DeploymentState | None:
        """The deployment a report names, if this shard owns it."""
        try:
            return self._by_key.get(key)
        except TypeError:  # not a tuple (a list, say): slow but still answered
            return self._deployments.get(DeploymentId(*key))

    def report_rows(self, key: tuple[str, str], rows: list[ReportRow]) -> None:
        """Reports of one deployment's replicas: one replica's direct report (a batch of
        one) or a node batch's share. Rows of a deployment this shard does not own (any
        more) are dropped."""
        try:  # ``_reported``, inline: once per direct report
            state = self._by_key.get(key)
        except TypeError:
            state = self._reported(key)
        if state is not None:
            state.record_rows(rows, self._ops.clock.monotonic())

    def report_metrics(self, key: tuple[str, str], report: MetricReport) -> None:
        """One report as a ``MetricReport`` (a sender older than ``report_rows``)."""
        self.report_rows(key, [report_row(report)])

    def report_batch(self, batch: Batch) -> None:
        """A node reporter's batch: many replicas' reports, one call."""
        now = self._ops.clock.monotonic()
        self.health_totals.batches_total += 1
        for key, rows in batch.items():
            state = self._reported(key)
            if state is not None:
                state.record_rows(rows, now)

    def report_router_demand(self, key: tuple[str, str], router_id: str,
                             demand: RouterDemand) -> None:
        """A router's queue and rates (``cluster_informed``), at most once a second."""
        state = self._reported(key)
        if state is not None:
            state.record_router_demand(router_id, demand, self._ops.clock.monotonic())

    def report_request_error(self, key: tuple[str, str], replica_id: str,
                             error: RequestError) -> None:
        """The user's code raised on a replica's requests (at most one report every few
        seconds per replica)."""
        state = self._reported(key)
        if state is not None:
            state.record_request_error(replica_id, error)

    def report_model_ids(self, key: tuple[str, str], replica_id: str,
                         ids: tuple[str, ...]) -> None:
        state = self._reported(key)
        if state is not None:
            state.record_model_ids(replica_id, ids)

    def report_autoscaling_stats(self, key: tuple[str, str], replica_id: str,
                                 stats: dict) -> None:
        state = self._reported(key)
        if state is not None:
            state.record_engine_stats(replica_id, stats, self._ops.clock.monotonic())

    def report_start_progress(self, key: tuple[str, str], replica_id: str, text: str) -> None:
        state = self._reported(key)
        if state is not None:
            state.ops.note_start_progress(replica_id, text, self._ops.clock.monotonic())

    def report_health(self, key: tuple[str, str], replica_id: str, health: PushedHealth) -> None:
        """A heartbeat: pushed health without a metric report."""
        state = self._reported(key)
        if state is not None:
            state.record_heartbeat(replica_id, health, self._ops.clock.monotonic())

    def status(self, summary: bool = False, app: str | None = None,
               deployment: str | None = None) -> dict:
        """Owned deployments' entries; with ``app``/``deployment`` only those (no row is
        built for the others); ``summary``: without replica rows, O(1) each."""
        now = self._ops.clock.monotonic()
        chosen = [(k, s) for k, s in self._deployments.items()
                  if app in (None, k.app) and deployment in (None, k.name)]
        return {
            "index": self.index,
            "deployments": {str(k): s.summary(now) if summary else s.status(now)
                            for k, s in chosen},
            "ticks": self.work.ticks,
            "tick_errors_total": self.health_totals.tick_errors_total,
            "last_tick_ms": round(self.work.last_tick_s * 1000, 3),
            "health": self.health_totals.statistics(now),
            "work": self.work.as_json(),
            "deployments_owned": len(self._deployments),  # filtered or not
        }

    async def wait_drained(self, timeout_s: float) -> bool:
        """Delete everything, then wait until every replica is stopped."""
        for state in self._deployments.values():
            state.delete()
        self.ensure_running()
        deadline = self._ops.clock.monotonic() + timeout_s
        while self._deployments and self._ops.clock.monotonic() < deadline:
            await asyncio.sleep(self._settings.shard.tick_interval_s)
        drained = not self._deployments
        for state in self._deployments.values():  # past the deadline: no replica outlives us
            for handle in state.book.handles():
                self._ops.client.kill(handle)
        return drained


class ControllerShard:
    """The Ray actor. Created by the controller as a named, detached actor."""

    def __init__(self, index: int, settings: dict) -> None:
        take_control_priority(f"shard {index}")
        parsed = Settings.from_dict(settings)
        self._core = ShardCore(index, parsed, RayReplicaClient(parsed.namespace), SystemClock(),
                               IngressDeregistrar(parsed.namespace), PlanFreeze())
        self._stopped = asyncio.Event()

    async def apply(self, specs: list[DeploymentSpec], deleted: list[DeploymentId]) -> None:
        self._core.apply(specs, deleted)

    async def set_desired(self, specs: list[DeploymentSpec],
                          drains: dict[str, float] | None = None) -> None:
        """The desired set (and, from a restarted controller's push, the draining nodes)."""
        self._core.set_desired(specs)
        if drains is not None:
            await self.set_node_drains(drains)

    async def set_node_drains(self, drains: dict[str, float]) -> None:
        """Draining nodes with wall-clock deadlines (seconds; ``inf`` for none), kept on
        this shard's own monotonic clock."""
        now, wall = self._core.now(), time.time()
        self._core.set_node_drains({node: now + (until - wall) for node, until in drains.items()})

    async def report_rows(self, key: tuple[str, str], rows: list[ReportRow]) -> None:
        """A replica's direct report (``ReportSender``): a batch of one row."""
        self._core.report_rows(key, rows)

    async def report_metrics(self, key: tuple[str, str], report: MetricReport) -> None:
        self._core.report_metrics(key, report)

    async def report_batch(self, batch: Batch) -> None:
        """Reports of many replicas from their node's reporter (``NodeReporter``)."""
        self._core.report_batch(batch)

    async def report_model_ids(self, key: tuple[str, str], replica_id: str,
                               ids: tuple[str, ...]) -> None:
        """Serve's multiplexer on a replica loaded or evicted a model."""
        self._core.report_model_ids(key, replica_id, ids)

    async def report_request_error(self, key: tuple[str, str], replica_id: str,
                                   error: RequestError) -> None:
        self._core.report_request_error(key, replica_id, error)

    async def report_autoscaling_stats(self, key: tuple[str, str], replica_id: str,
                                       stats: dict) -> None:
        """A replica's ``record_autoscaling_stats()`` (an LLM engine's running, waiting,
        KV-cache use, TTFT), sent when it changed: the LLM autoscaling policy's input."""
        self._core.report_autoscaling_stats(key, replica_id, stats)

    async def report_start_progress(self, key: tuple[str, str], replica_id: str,
                                    text: str) -> None:
        """A starting replica says what its constructor is doing (an LLM engine loading)."""
        self._core.report_start_progress(key, replica_id, text)

    async def report_health(self, key: tuple[str, str], replica_id: str,
                            health: PushedHealth) -> None:
        self._core.report_health(key, replica_id, health)

    async def report_router_demand(self, key: tuple[str, str], router_id: str,
                                   demand: RouterDemand) -> None:
        """A router's demand (``cluster_informed``; ``RoutingSubscriber`` sends it)."""
        self._core.report_router_demand(key, router_id, demand)

    async def status(self, summary: bool = False, app: str | None = None,
                     deployment: str | None = None) -> dict:
        return self._core.status(summary, app, deployment)

    async def health(self) -> Any:
        """Push-health figures alone: cheap, for /metrics scrapes."""
        return self._core.health_totals.statistics(self._core.now())

    async def listen_routing(self, known: dict, watch_all: bool = False,
                             timeout_s: float = 30.0) -> dict:
        """Long-poll: replica sets and limits of owned deployments that changed."""
        self._core.ensure_running()
        return await self._core.routing.listen(known, watch_all, timeout_s)

    async def wait_until_stopped(self) -> None:
        """The controller's watch: pending until ``shutdown``; Ray fails it when this
        actor's process dies (then Ray restarts it and the controller re-sends its
        desired state, which it re-adopts its replicas from)."""
        await self._stopped.wait()

    async def shutdown(self, timeout_s: float) -> bool:
        self._stopped.set()
        return await self._core.wait_drained(timeout_s)
