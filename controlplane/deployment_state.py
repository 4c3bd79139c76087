"""One deployment inside a shard: desired spec, replica records, and the reconcile shell.

Observe, decide, act: ``tick`` builds a snapshot and calls the pure ``reconcile.plan`` only
when something changed (``_dirty``: a new spec, a replica transition, a new autoscaling
target, an expired start backoff); the actions run as owned asyncio tasks
(``replica_ops``) whose completions feed replica events back through the transition table.
A steady deployment costs O(1) per tick: no walk over its replicas.

Health is push first (``push_health.DeploymentHealth``: pushes on metric reports and
heartbeats, pull probes only for stale pushes, the stall guard); this shell carries out
its actions. The failure count and the health-check-failures counter follow the
observation that was acted on; at ``unhealthy_threshold`` the replica is replaced.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Coroutine

from controlplane.autoscaling import AutoscalingPolicy, MetricWindow, ScalingState, decide
from controlplane.health.health_gate import ProbeOutcome
from controlplane.health.health_stats import HealthTotals
from controlplane.health.push_health import (ApplyHealth, DeploymentHealth, HealthAction,
                                             ProbeReplica, ReplicaCrashed)
from controlplane.health.stall_guard import StallGuard
from controlplane.lifecycle import ACTIVE_STATES, SERVING_STATES, ReplicaEvent
from controlplane.ranks import RankConsistencyGate, RankManager, run_consistency_pass
from controlplane.reconcile import (DeploymentSnapshot, ReconfigureReplica, ReplicaView,
                                    StartReplica, StopReplica, deployment_status, plan)
from controlplane.replica_set import ReplicaRecord, ReplicaSet
from controlplane.settings import ShardSettings
from controlplane.specs import DeploymentSpec
from controlplane.wire import PushedHealth, ReplicaInfo, RoutingUpdate

logger = logging.getLogger(__name__)

Spawn = Callable[[Coroutine], Any]
_POLICY_KEYS = ("min_replicas", "max_replicas", "initial_replicas", "target_ongoing_requests",
                "upscale_delay_s", "downscale_delay_s", "look_back_period_s")


class DeploymentState:
    def __init__(self, spec: DeploymentSpec, settings: ShardSettings, spawn: Spawn,
                 ops_factory: Callable[["DeploymentState"], Any],
                 totals: HealthTotals | None = None) -> None:
        self.spec = spec
        self.settings = settings
        self.spawn = spawn
        self.replicas = ReplicaSet()
        self.ranks = RankManager()
        self.rank_gate = RankConsistencyGate(retry_after_error_s=settings.rank_error_retry_s)
        self.handles: dict[str, Any] = {}
        self.config_versions: dict[str, str] = {}
        self.health_totals = totals if totals is not None else HealthTotals()
        period = spec.health_check_period_s
        self.health = DeploymentHealth(period, self.health_totals, guard=StallGuard(
            period, self.health_totals, cap_s=settings.stall_episode_cap_s))
        self.deleting = False
        self.start_failures = 0
        self.deploy_failed = False
        self.backoff_until = 0.0
        self.last_error = ""
        self.unhealthy = False
        self.next_seq = 0
        self._dirty = True
        self.plans_run = 0  # observable: a steady deployment plans nothing
        self._metrics = MetricWindow(look_back_period_s=30.0)
        self._policy: AutoscalingPolicy | None = None
        self._scaling = ScalingState()
        self._next_autoscale_at = 0.0
        self.target_replicas = spec.num_replicas
        self._routing_key: tuple | None = None
        self.ops = ops_factory(self)
        self._set_policy(spec)

    # ---- desired state -------------------------------------------------------------
    def update_spec(self, spec: DeploymentSpec) -> None:
        code_changed = spec.code_version != self.spec.code_version
        if code_changed or spec.user_config_version != self.spec.user_config_version:
            self.deploy_failed, self.start_failures, self.backoff_until = False, 0, 0.0
            self.last_error = ""
        if self._policy is None or spec.autoscaling_config != self.spec.autoscaling_config:
            self.target_replicas = spec.num_replicas
        timings = (spec.health_check_period_s, spec.health_check_timeout_s)
        timings_changed = timings != (self.spec.health_check_period_s,
                                      self.spec.health_check_timeout_s)
        self.spec = spec
        self.health.set_period(spec.health_check_period_s)
        if timings_changed:  # O(N) on this redeploy only; self-checks run on the replicas
            for replica_id in self.replicas.running_ids():
                self.ops.update_health_timings(replica_id)
        self._set_policy(spec)
        self.deleting = False
        self.mark_dirty()

    def _set_policy(self, spec: DeploymentSpec) -> None:
        cfg = spec.autoscaling_config
        if cfg is None:
            self._policy = None
            return
        old = self._policy
        self._policy = AutoscalingPolicy.from_config({k: cfg[k] for k in _POLICY_KEYS if k in cfg})
        if old is None or old.look_back_period_s != self._policy.look_back_period_s:
            # Only a new look-back needs a new window: a redeploy keeps the load history.
            self._metrics = MetricWindow(look_back_period_s=self._policy.look_back_period_s)

    def delete(self) -> None:
        self.deleting = True
        self.mark_dirty()

    def mark_dirty(self) -> None:
        self._dirty = True

    @property
    def finished_deleting(self) -> bool:
        return self.deleting and len(self.replicas) == 0

    # ---- the tick --------------------------------------------------------------------
    def tick(self, now: float) -> None:
        if self.backoff_until and now >= self.backoff_until:
            self.backoff_until = 0.0
            self._dirty = True
        if self._policy is not None and now >= self._next_autoscale_at:
            self._autoscale(now)
        if self._dirty:
            self._dirty = False
            self.plans_run += 1
            self._act(plan(self.snapshot(now)), now)
        self._act_health(self.health.tick(now))
        for replica_id, _old, new in run_consistency_pass(self.rank_gate, self.ranks,
                                                          self.replicas, now):
            self._set_rank(replica_id, new)

    def snapshot(self, now: float) -> DeploymentSnapshot:
        views = tuple(ReplicaView(r.replica_id, r.state, r.version,
                                  self.config_versions.get(r.replica_id, ""), r.rank)
                      for r in self.replicas.records())
        surge = max(1, int(self.settings.rolling_surge_fraction * self.target_replicas))
        return DeploymentSnapshot(
            target_replicas=self.target_replicas, target_version=self.spec.code_version,
            target_config_version=self.spec.user_config_version, replicas=views,
            deleting=self.deleting, surge=surge,
            starts_blocked=self.deploy_failed or now < self.backoff_until)

    def _act(self, actions: list, now: float) -> None:
        for action in actions:
            if isinstance(action, StartReplica):
                self.ops.start(now)
            elif isinstance(action, StopReplica):
                self.ops.stop(action.replica_id, action.reason)
            elif isinstance(action, ReconfigureReplica):
                self.ops.reconfigure(action.replica_id)

    def _set_rank(self, replica_id: str, rank: int) -> None:
        record = self.replicas.get(replica_id)
        if record is not None:
            self.replicas.replace(record.with_state(record.state, rank=rank))
            self.ops.update_rank(replica_id, rank)

    # ---- health (push first, pull fallback) -----------------------------------------------
    def record_push(self, replica_id: str, health: PushedHealth, now: float,
                    via_heartbeat: bool = False) -> None:
        """A push from one of this deployment's live replicas; the next tick acts on it."""
        record = self.replicas.get(replica_id)
        if record is not None and record.state in ACTIVE_STATES:
            self.health.record_push(replica_id, health, now, via_heartbeat)

    def probe_resolved(self, replica_id: str, outcome: ProbeOutcome, now: float) -> None:
        self._act_health(self.health.probe_resolved(replica_id, outcome, now))

    def _act_health(self, actions: list[HealthAction]) -> None:
        for action in actions:
            if isinstance(action, ProbeReplica):
                self.ops.probe(action.replica_id)
            elif isinstance(action, ApplyHealth):
                self._apply_health(action)
            elif isinstance(action, ReplicaCrashed):
                self.ops.replica_died(action.replica_id, action.message)

    def _apply_health(self, verdict: ApplyHealth) -> None:
        record = self.replicas.get(verdict.replica_id)
        if record is None or record.state not in SERVING_STATES:
            return
        self.health_totals.health_check_failures_total += verdict.failures_counted
        message = verdict.message or (
            "" if verdict.healthy else
            f"self health check failed ({verdict.failures} consecutive, {verdict.source})")
        if verdict.failures >= self.settings.unhealthy_threshold:
            logger.warning("replica %s failed %d health checks (%s): %s", verdict.replica_id,
                           verdict.failures, verdict.source, message)
            self.unhealthy = True
            self.ops.stop(verdict.replica_id, f"unhealthy: {message}",
                          event=ReplicaEvent.UNHEALTHY)
        elif record.message != message:
            self.replicas.replace(record.with_state(record.state, message=message))

    # ---- autoscaling ---------------------------------------------------------------------
    def record_metrics(self, report: Any, now: float) -> None:
        if report.health is not None:  # before the policy check: health rides on every report
            self.record_push(report.replica_id, report.health, now)
        if self._policy is not None and report.replica_id in self.replicas:
            self._metrics.record(report, received_at=now)

    def forget_replica(self, replica_id: str) -> None:
        self.handles.pop(replica_id, None)
        self.config_versions.pop(replica_id, None)
        self.health.forget(replica_id)
        self.ranks.release(replica_id)
        self._metrics.forget(replica_id)

    def _autoscale(self, now: float) -> None:
        self._next_autoscale_at = now + 1.0
        load = self._metrics.average_load(now, self.replicas.running_ids())
        decision = decide(self._policy, self.target_replicas, load, self._scaling, now)
        self._scaling = decision.state
        if decision.target_replicas != self.target_replicas:
            logger.info("%s: autoscaling %d -> %d (%s)", self.spec.id, self.target_replicas,
                        decision.target_replicas, decision.reason)
            self.target_replicas = decision.target_replicas
            self.mark_dirty()

    # ---- routing ---------------------------------------------------------------------------
    def routing_update(self) -> RoutingUpdate | None:
        """What routers need, if it changed since the last call; else None, in O(1)
        (membership is keyed on the fingerprint, limits on the spec)."""
        spec = self.spec
        key = (self.replicas.fingerprint, spec.max_ongoing_requests, spec.max_queued_requests,
               tuple(sorted(spec.backpressure_config.items())))
        if key == self._routing_key:
            return None
        self._routing_key = key
        serving = [self.replicas.get(i) for i in sorted(self.replicas.running_ids())]
        backpressure = spec.backpressure_config
        return RoutingUpdate(
            replicas=tuple(ReplicaInfo(r.replica_id, r.actor_name, r.node_id) for r in serving),
            max_ongoing_requests=spec.max_ongoing_requests,
            max_queued_requests=spec.max_queued_requests,
            status_code=int(backpressure.get("status_code", 503)),
            retry_after_s=backpressure.get("retry_after_s"),
            retry_after_policy=backpressure.get("retry_after_policy") or "static")

    # ---- status ---------------------------------------------------------------------------
    def status(self, now: float) -> dict:
        snap = self.snapshot(now)
        status = deployment_status(snap, self.deploy_failed, self.unhealthy)
        return {
            "status": status,
            "message": self.last_error if status in ("DEPLOY_FAILED", "UPDATING") else "",
            "target_replicas": self.target_replicas,
            "version": self.spec.code_version,
            "autoscaling": self._policy is not None,
            "push_health": self._push_health_status(),
            "replicas": [self._replica_status(r) for r in sorted(
                self.replicas.records(), key=lambda r: (r.rank is None, r.rank, r.replica_id))],
        }

    def _push_health_status(self) -> dict:
        stall = self.health.guard.statistics()
        return {"tracked": self.health.registry.tracked, "stall_state": stall.state.value,
                "stall_held": stall.held}

    def _replica_status(self, r: ReplicaRecord) -> dict:
        healthy = r.state in SERVING_STATES and self.health.failures(r.replica_id) == 0
        return {"replica_id": r.replica_id, "state": r.state.value, "rank": r.rank,
                "healthy": healthy, "node_id": r.node_id, "actor_name": r.actor_name,
                "version": r.version, "message": r.message}
