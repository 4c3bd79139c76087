"""A simulated fleet pushing health through a real shard's ingest path.

Thousands of replicas cannot be real Ray actors on a 2-core machine, so each
``SimHost`` actor process hosts many simulated replicas. Everything on the controller
side is the real code: ``SimShard`` *is* a ``ControllerShard`` (same ``report_rows`` /
``report_health`` actor methods, same ``ShardCore``, reconcile loop, ``DeploymentHealth``,
stall guard and ``ReplicaOps``); only its replica client is swapped for
``SimReplicaClient``, the seam the unit tests use for ``FakeReplicaClient``, which places
replicas on hosts and sends probes to them as actor calls.

A simulated replica does what a real one does on the wire: a ``MetricReport`` every
``metrics_report_interval_s``, at most one in flight, carrying its newest self-check
result (evaluated every half health period) in push mode and no health in pull mode.
It does not run a user check (there is none), and it does not heartbeat: the harness
requires the report interval to be at most the health period, where a real replica sends
no routine heartbeats either (``HealthPusher.reports_carry_health``).

Test-only seams, here and nowhere in the product: ``SimShard.set_ingest_paused`` holds
every arriving report and heartbeat before it reaches the shard's state, as a controller
whose event loop lags does; ``SimHost.set_down`` makes replicas stop pushing and fail
their probes (a genuine outage).
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import itertools
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from controlplane.clock import SystemClock
from controlplane.health.gate import stale_after_s
from controlplane.deployment.lifecycle import SERVING_STATES
from controlplane.plan_freeze import PlanFreeze
from controlplane.priority import take_control_priority
from controlplane.replica_client import ReplicaCallFailed, ReplicaDied, call_replica
from controlplane.settings import ReplicaSettings, Settings, ShardSettings, shard_actor_name
from controlplane.shard import ControllerShard, ShardCore
from controlplane.specs import DeploymentId, DeploymentSpec
from controlplane.wire import (MetricReport, PushedHealth, ReplicaDescription, ReplicaInit,
                               report_row)
from release_tests.health_records import UpdateRecorder
from replicas.report_batch import ReportBatcher
from replicas.self_health import HealthCheckFailed

logger = logging.getLogger(__name__)

SIM_DEPLOYMENT = DeploymentId("sim", "Sim")


# ---- replica side -----------------------------------------------------------------------
@dataclass
class _SimReplica:
    init: ReplicaInit
    started_at: float  # time.monotonic(): the replica's own clock, as SelfHealth uses
    down: bool = False

    def newest_result(self, now: float) -> PushedHealth:
        """The newest half-period self-check result (healthy: the sim's replicas are)."""
        half = self.init.health_check_period_s / 2
        checked_at = self.started_at + half * int((now - self.started_at) / half)
        return PushedHealth(True, checked_at, 0)


class SimHost:
    """One process hosting many simulated replicas (a Ray actor).

    One scheduler loop sends every replica's reports: a replica's next report is due one
    interval after its previous one completed (what ``await report; sleep(interval)`` does
    in a real replica), so at most one is in flight per replica. Completions are collected
    with one ``ray.wait`` per loop turn instead of an awaited ObjectRef per report: on 2
    cores the senders share the CPUs with the shard being measured, and awaiting 1,600
    refs a second cost the hosts a whole core (what the shard receives is the same).
    """

    TURN_S = 0.05  # scheduler resolution; adds at most this to a report's interval

    def __init__(self, push: bool, seed: int = 0, batch_interval_s: float = 0.0) -> None:
        # It is its replicas' node reporter, and they stand for replicas on other nodes,
        # whose CPUs a busy controller machine does not take: not Ray's niceness 15.
        take_control_priority("sim host")
        self._push = push
        # Batched: this host stands for a node and its reporter (``NodeReporter``): its
        # replicas' rows go into the same ``ReportBatcher``, one batch per interval.
        self._batch_interval_s = batch_interval_s
        self._batcher = ReportBatcher(stuck_after_s=60.0) if batch_interval_s > 0 else None
        self._next_flush = 0.0
        self._batches: dict[Any, str] = {}  # ObjectRef -> shard name
        self._rng = random.Random(seed)
        self._replicas: dict[str, _SimReplica] = {}
        self._due: list[tuple[float, str]] = []  # heap of (send at, replica id)
        self._in_flight: dict[Any, str] = {}  # ObjectRef -> replica id
        self._shard: Any = None
        self._loop_task: asyncio.Task | None = None
        self._report_errors = 0

    async def start_replica(self, init: ReplicaInit) -> dict:
        if self._shard is None:  # the real replica's lookup: the shard by name
            self._shard = ray.get_actor(init.shard_name, namespace=init.namespace)
            self._loop_task = asyncio.get_running_loop().create_task(self._send_forever())
        now = time.monotonic()
        self._replicas[init.replica_id] = _SimReplica(init, now)
        first = now + self._rng.uniform(0, init.metrics_report_interval_s)  # not in lockstep
        heapq.heappush(self._due, (first, init.replica_id))
        return {"node_id": ray.get_runtime_context().get_node_id(),
                "actor_id": f"sim:{init.replica_id}"}

    async def _send_forever(self) -> None:
        while True:
            self._collect(time.monotonic())
            self._send_due(time.monotonic())
            self._flush(time.monotonic())
            await asyncio.sleep(self.TURN_S)

    def _flush(self, now: float) -> None:
        if self._batcher is None:
            return
        if self._batches:
            done, _ = ray.wait(list(self._batches), num_returns=len(self._batches), timeout=0,
                               fetch_local=False)
            for ref in done:
                self._batcher.sent(self._batches.pop(ref))
        if now < self._next_flush:
            return
        self._next_flush = now + self._batch_interval_s
        for shard, batch in self._batcher.take_ready(now):
            self._batches[self._shard.report_batch.remote(batch, sent_at=time.time())] = shard

    def _collect(self, now: float) -> None:
        if not self._in_flight:
            return
        refs = list(self._in_flight)
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        for ref in done:
            replica_id = self._in_flight.pop(ref)
            replica = self._replicas.get(replica_id)
            if replica is not None:
                heapq.heappush(self._due, (now + replica.init.metrics_report_interval_s,
                                           replica_id))

    def _send_due(self, now: float) -> None:
        while self._due and self._due[0][0] <= now:
            _, replica_id = heapq.heappop(self._due)
            r = self._replicas.get(replica_id)
            if r is None:
                continue  # stopped
            if r.down:  # a genuine outage sends nothing; look again next interval
                heapq.heappush(self._due, (now + r.init.metrics_report_interval_s, replica_id))
                continue
            health = r.newest_result(now) if self._push else None
            report = TimedReport(replica_id, 0, 0, health=health, sent_at=time.time())
            key = (r.init.app_name, r.init.deployment)
            if self._batcher is not None:  # a local hand-off: done at once
                self._batcher.add(r.init.shard_name, key, report_row(report))
                heapq.heappush(self._due, (now + r.init.metrics_report_interval_s, replica_id))
                continue
            try:
                self._in_flight[self._shard.report_rows.remote(
                    key, [report_row(report)], report.sent_at)] = replica_id
            except Exception:
                self._report_errors += 1
                heapq.heappush(self._due, (now + r.init.metrics_report_interval_s, replica_id))

    async def check_health(self, replica_id: str) -> None:
        replica = self._replicas.get(replica_id)
        if replica is None or replica.down:
            raise HealthCheckFailed(f"simulated outage of {replica_id}")

    async def stop_replica(self, replica_id: str) -> None:
        self._replicas.pop(replica_id, None)

    async def set_down(self, replica_ids: list[str], down: bool = True) -> int:
        """Test-only: a genuine outage (no pushes, failing probes) of these replicas."""
        hit = [self._replicas[r] for r in replica_ids if r in self._replicas]
        for replica in hit:
            replica.down = down
        return len(hit)

    async def stats(self) -> dict:
        return {"replicas": len(self._replicas), "report_errors": self._report_errors,
                "in_flight": len(self._in_flight), "cpu_s": time.process_time()}


# ---- controller side ----------------------------------------------------------------------
@dataclass(frozen=True)
class TimedReport(MetricReport):
    """A metric report stamped when the simulated replica sent it, so the harness can
    measure how long the shard took to take it in (hosts and shard share this machine's
    wall clock)."""

    sent_at: float = 0.0


@dataclass
class SimHandle:
    init: ReplicaInit
    host: Any
    stopped: asyncio.Event = field(default_factory=asyncio.Event)


class SimReplicaClient:
    """A ``ReplicaClient`` for simulated replicas: the same error mapping as the real
    one (``call_replica``), calls addressed to the replica's host. Hosts are not killed by
    the harness, so the death watch only waits for a requested stop."""

    def __init__(self, namespace: str, hosts: list, recorder: UpdateRecorder) -> None:
        self._hosts = hosts
        self._placement = itertools.cycle(range(len(hosts)))
        self._recorder = recorder
        self._live: dict[str, SimHandle] = {}

    def create(self, init: ReplicaInit, spec: DeploymentSpec) -> SimHandle:
        handle = SimHandle(init, self._hosts[next(self._placement)])
        self._live[init.replica_id] = handle
        return handle

    def start_phase(self, handle: SimHandle) -> str:
        return ""  # simulated replicas start at once

    def find(self, app: str, deployment: str) -> dict[str, SimHandle]:
        prefix = f"{app}#{deployment}#"
        return {rid: h for rid, h in self._live.items() if rid.startswith(prefix)}

    async def describe(self, handle: SimHandle, timeout_s: float) -> ReplicaDescription:
        init = handle.init  # simulated replicas keep their init rank, config and health
        return ReplicaDescription(
            replica_id=init.replica_id, rank=init.rank, code_version=init.code_version,
            user_config=init.user_config, actor_id=f"sim-{init.replica_id}", node_id="sim",
            initialized=True, stopping=False, healthy=True)

    def end_all(self) -> None:
        """Release every death watch (before the harness kills the shard)."""
        for handle in list(self._live.values()):
            self._end(handle)

    async def initialize(self, handle: SimHandle, timeout_s: float) -> dict:
        info = await call_replica(handle.host.start_replica.remote(handle.init), timeout_s)
        self._recorder.on_started(handle.init.replica_id, time.monotonic())
        return info

    async def check_health(self, handle: SimHandle, timeout_s: float) -> None:
        replica_id, started = handle.init.replica_id, time.monotonic()
        try:
            await call_replica(handle.host.check_health.remote(replica_id), timeout_s)
        except (ReplicaCallFailed, ReplicaDied):
            now = time.monotonic()
            self._recorder.on_probe(replica_id, False, now, now - started)
            raise
        now = time.monotonic()
        self._recorder.on_probe(replica_id, True, now, now - started)

    async def wait_until_stopped(self, handle: SimHandle) -> None:
        await handle.stopped.wait()

    async def reconfigure(self, handle: SimHandle, user_config: Any, timeout_s: float) -> None:
        return None

    async def update_rank(self, handle: SimHandle, rank: int) -> None:
        return None

    async def update_health_timings(self, handle: SimHandle, period_s: float,
                                    timeout_s: float) -> None:
        return None

    async def stop(self, handle: SimHandle, grace_s: float, extra_s: float) -> None:
        self._end(handle)
        try:
            await call_replica(handle.host.stop_replica.remote(handle.init.replica_id), extra_s)
        except (ReplicaDied, ReplicaCallFailed):
            pass

    def kill(self, handle: SimHandle) -> None:
        self._end(handle)
        handle.host.stop_replica.remote(handle.init.replica_id)

    def _end(self, handle: SimHandle) -> None:
        self._live.pop(handle.init.replica_id, None)
        handle.stopped.set()
        self._recorder.forget(handle.init.replica_id)


class SimShard(ControllerShard):
    """A real ``ControllerShard`` over simulated replicas, with the harness's recorder."""

    def __init__(self, index: int, settings: dict, hosts: list, period_s: float) -> None:
        take_control_priority(f"shard {index}")  # as ControllerShard.__init__ does
        parsed = Settings.from_dict(settings)
        self._recorder = UpdateRecorder(stale_after_s(period_s))
        self._client = SimReplicaClient(parsed.namespace, hosts, self._recorder)
        self._core = ShardCore(index, parsed, self._client, SystemClock(),
                               collector=PlanFreeze())  # as ControllerShard's
        self._ingest_open = asyncio.Event()
        self._ingest_open.set()
        self._measure: tuple[float, float, Any] | None = None
        self._gc_pauses: list[float] = []  # full (gen 2) collections: the loop stands still
        self._harness_cpu_s = 0.0  # the recorder's own CPU in this process (not the shard's)
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_pauses.append(time.perf_counter() - self._gc_started)

    async def report_rows(self, key: tuple[str, str], rows: Any, sent_at: float = 0.0) -> None:
        """A replica's direct report (a batch of one), timed from when it was sent."""
        if not self._ingest_open.is_set():
            await self._ingest_open.wait()
        await super().report_rows(key, rows)
        self._record(rows, time.time() - sent_at)

    async def report_batch(self, batch: Any, sent_at: float = 0.0) -> None:
        if not self._ingest_open.is_set():
            await self._ingest_open.wait()
        await super().report_batch(batch)
        delay = time.time() - sent_at
        for rows in batch.values():
            self._record(rows, delay)

    def _record(self, rows: Any, delay_s: float) -> None:
        cpu, now = time.process_time(), time.monotonic()
        for row in rows:
            if row.healthy is not None:
                self._recorder.on_push(row.replica_id, row.checked_at, now, delay_s)
        self._harness_cpu_s += time.process_time() - cpu

    async def report_health(self, key: tuple[str, str], replica_id: str,
                            health: PushedHealth) -> None:
        if not self._ingest_open.is_set():
            await self._ingest_open.wait()
        await super().report_health(key, replica_id, health)
        self._recorder.on_push(replica_id, health.checked_at, time.monotonic(), 0.0)

    async def set_ingest_paused(self, paused: bool) -> None:
        """Test-only: hold arriving pushes (controller ingest lag) until un-paused."""
        if paused:
            self._ingest_open.clear()
        else:
            self._ingest_open.set()

    async def measure_start(self) -> None:
        now = time.monotonic()
        self._recorder.start(now)
        self._gc_pauses = []
        self._harness_cpu_s = 0.0
        self._measure = (now, time.process_time(), self._core.health_totals.statistics(now))

    async def measure_stop(self) -> dict:
        now, cpu_now = time.monotonic(), time.process_time()
        started, cpu_started, health_before = self._measure
        measured = self._recorder.stop(now)
        health = self._core.health_totals.statistics(time.monotonic())
        return {"wall_s": now - started, "cpu_s": cpu_now - cpu_started - self._harness_cpu_s,
                "harness_cpu_s": self._harness_cpu_s,
                "updates": measured.updates, "misses": measured.misses, "rows": measured.rows,
                "pull_probes": health.pull_probes_total - health_before.pull_probes_total,
                "pushes": health.pushes_total - health_before.pushes_total,
                "stall_episodes": health.stall_episodes_total - health_before.stall_episodes_total,
                "gc_full_collections": len(self._gc_pauses),
                "gc_max_pause_s": max(self._gc_pauses, default=0.0)}

    async def release_watches(self) -> None:
        self._client.end_all()

    async def summary(self) -> dict:
        """O(1)-sized view for polling (status() lists every replica)."""
        state = self._core.deployment(SIM_DEPLOYMENT)
        if state is None:
            return {}
        return {"running": state.book.replicas.count(*SERVING_STATES),
                "created": state.book.ids_issued,
                "health": self._core.health_totals.statistics(time.monotonic()),
                "stall": state.health.guard.statistics()}


# ---- driver side ----------------------------------------------------------------------------
@dataclass(frozen=True)
class SimConfig:
    replicas: int
    push: bool = True
    period_s: float = 10.0
    timeout_s: float = 30.0
    report_interval_s: float = 10.0
    per_host: int = 2048
    stall_cap_s: float = 120.0
    batch_interval_s: float = 0.0  # > 0: each host sends node batches (NodeReporter's way)
    namespace: str = "fleetplane_sim"

    def __post_init__(self) -> None:
        if self.report_interval_s > self.period_s:
            raise ValueError("the simulated replicas do not heartbeat: keep "
                             "report_interval_s <= period_s")


class SimFleet:
    """Driver-side handle: hosts, the shard, and the simulated deployment."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        n_hosts = max(1, -(-cfg.replicas // cfg.per_host))
        host_cls = ray.remote(SimHost).options(num_cpus=0, max_concurrency=100_000,
                                               namespace=cfg.namespace)
        self.hosts = [host_cls.remote(cfg.push, seed=i, batch_interval_s=cfg.batch_interval_s)
                      for i in range(n_hosts)]
        settings = Settings(
            namespace=cfg.namespace, shard=ShardSettings(stall_episode_cap_s=cfg.stall_cap_s),
            replica=ReplicaSettings(metrics_report_interval_s=cfg.report_interval_s))
        self.shard = ray.remote(SimShard).options(
            name=shard_actor_name(0), namespace=cfg.namespace, num_cpus=0,
            max_concurrency=100_000).remote(0, settings.to_dict(), self.hosts, cfg.period_s)

    def spec(self, num_replicas: int | None = None) -> DeploymentSpec:
        c = self.cfg
        return DeploymentSpec(
            id=SIM_DEPLOYMENT, ingress=False, code_version="sim", serialized_def=b"",
            num_replicas=c.replicas if num_replicas is None else num_replicas,
            max_ongoing_requests=5, max_queued_requests=-1, user_config=None,
            autoscaling_config=None, health_check_period_s=c.period_s,
            health_check_timeout_s=c.timeout_s, graceful_shutdown_timeout_s=0.0,
            backpressure_config={"status_code": 503, "retry_after_s": None},
            ray_actor_options={})

    def deploy(self) -> None:
        ray.get(self.shard.apply.remote([self.spec()], []))

    def summary(self) -> dict:
        return ray.get(self.shard.summary.remote())

    def replica_ids(self) -> list[str]:
        status = ray.get(self.shard.status.remote())["deployments"][str(SIM_DEPLOYMENT)]
        return [r["replica_id"] for r in status["replicas"] if r["state"] == "RUNNING"]

    def wait(self, predicate, timeout_s: float, what: str, poll_s: float = 0.2) -> dict:
        """Poll the summary until predicate(summary) holds (a deadline, not an assertion)."""
        deadline = time.monotonic() + timeout_s
        while True:
            summary = self.summary()
            if summary and predicate(summary):
                return summary
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}; last: {summary}")
            time.sleep(poll_s)

    def set_down(self, replica_ids: list[str], down: bool = True) -> int:
        return sum(ray.get([h.set_down.remote(replica_ids, down) for h in self.hosts]))

    def shutdown(self) -> None:
        ray.get(self.shard.release_watches.remote())
        for actor in [self.shard, *self.hosts]:
            ray.kill(actor, no_restart=True)
