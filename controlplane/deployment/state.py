"""One deployment inside a shard: desired spec, replica records, and the reconcile shell.

Observe, decide, act: ``tick`` plans only when something changed (``_dirty``: a new
spec, a replica transition, a new autoscaling target, an expired start backoff): from
counts where that answers exactly (``count_plan``: scale-up, scale-down, rolling update),
else with the pure ``reconcile.plan`` over a snapshot; the actions run as owned asyncio tasks
(``replica_ops``) whose completions feed replica events back through the transition table.
A steady deployment costs O(1) per tick: no walk over its replicas.

Health is push first (``push_health.DeploymentHealth``: pushes on metric reports and
heartbeats, pull probes only for stale pushes, the stall guard, and the rule that
replaces a replica at ``unhealthy_threshold``); this shell carries out its actions.

Re-adoption: a deployment new to this shard first takes over the live replicas a previous
shard actor started (``adopting``; this shard was restarted), so a control-plane restart
restarts no replica. Until that is done it neither plans nor publishes routing: routers
keep the replica set they had.

One writer per field: ``ReplicaOps`` runs the remote calls and reports each outcome
through the outcome methods (``replica_outcomes.ReplicaOutcomes``, this class's base:
``replica_created``, ``replica_started``, ``start_failed``...); only this class and its
base assign its fields. Start backoff and the
DEPLOY_FAILED budget are the frozen ``StartBackoff`` value.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Coroutine

from controlplane.deployment.autoscaling import AutoscalingPolicy, MetricWindow, ScalingState, decide
from controlplane.config.schema import AutoscalingConfig
from controlplane.deployment.config_rollout import ConfigRollout
from controlplane.deployment.count_plan import CountTargets, plan_from_counts
from controlplane.deployment.demand_board import DemandBoard
from controlplane.deployment.report import deployment_report, deployment_summary
from controlplane.health.gate import ProbeOutcome
from controlplane.health.stats import HealthTotals
from controlplane.health.push_health import (ApplyHealth, DeploymentHealth, HealthAction,
                                             ProbeReplica, ReplaceUnhealthy, ReplicaCrashed)
from controlplane.health.stall_guard import StallGuard
from controlplane.deployment.lifecycle import ACTIVE_STATES, SERVING_STATES, ReplicaEvent
from controlplane.deployment.ranks import RankConsistencyGate, RankManager, run_consistency_pass
from controlplane.deployment.reconcile import (DeploymentSnapshot, ReconfigureReplica, ReplicaView,
                                    StartReplica, StopReplica, plan)
from controlplane.deployment.routing import DeploymentRouting
from controlplane.deployment.replica_outcomes import ReplicaOutcomes
from controlplane.deployment.replica_set import CountedMap, ReplicaSet
from controlplane.settings import ShardSettings
from controlplane.specs import DeploymentSpec
from controlplane.deployment.start_backoff import StartBackoff, StartBackoffPolicy
from controlplane.deployment.version_rollout import VersionRollout
from controlplane.wire import (MetricReport, PushedHealth, ReportRow, RouterDemand, RoutingDelta,
                              RoutingUpdate)

if TYPE_CHECKING:
    from controlplane.deployment.replica_ops import ReplicaOps

logger = logging.getLogger(__name__)

Spawn = Callable[[Coroutine], Any]

# A replica on a draining node starts its drain this long before the drain could no
# longer finish by the node's deadline.
_DRAIN_MARGIN_S = 2.0


class DeploymentState(ReplicaOutcomes):
    def __init__(self, spec: DeploymentSpec, settings: ShardSettings, spawn: Spawn,
                 ops_factory: Callable[[DeploymentState], ReplicaOps],
                 totals: HealthTotals | None = None) -> None:
        self.spec = spec
        self.settings = settings
        self.spawn = spawn
        self.replicas = ReplicaSet()
        self.ranks = RankManager()
        self.rank_gate = RankConsistencyGate(retry_after_error_s=settings.rank_error_retry_s)
        self._handles: dict[str, Any] = {}  # replica id -> the client's actor handle
        self._config_versions = CountedMap()  # replica id -> user_config version
        # Serving replicas whose last health observation failed (status counts them in
        # O(1)); a replica leaves it when it passes again or stops serving.
        self.failing: set[str] = set()
        self.config = ConfigRollout((spec.user_config, spec.user_config_version))
        self.rollout = VersionRollout(spec)
        self._proving: dict[str, float] = {}  # new-version replica id -> end of its proving
        self._proving_until = 0.0  # the latest of those ends
        self._on_target = True  # at the last plan: every active replica runs the target code
        self.health_totals = totals if totals is not None else HealthTotals()
        period = spec.health_check_period_s
        self.health = DeploymentHealth(
            period, self.health_totals, unhealthy_threshold=settings.unhealthy_threshold,
            guard=StallGuard(period, self.health_totals, cap_s=settings.stall_episode_cap_s))
        self.deleting = False
        self.adopting = False  # taking over live replicas; no plan, no routing until done
        self.backoff = StartBackoff()
        self._backoff_policy = StartBackoffPolicy(settings.start_backoff_initial_s,
                                                  settings.start_backoff_max_s,
                                                  settings.max_constructor_retries)
        self._next_seq = 0  # replica ids are never reused within a shard's life
        self._id_prefix = f"{spec.id.app}#{spec.id.name}#"  # a redeploy keeps the id
        self._dirty = True
        self._metrics = MetricWindow(look_back_period_s=30.0)
        self._policy: AutoscalingPolicy | None = None
        self._scaling = ScalingState()
        self._next_autoscale_at = 0.0
        self.target_replicas = spec.num_replicas
        self.routing = DeploymentRouting()
        self.demand = DemandBoard()  # cluster_informed: the routers' reports, start times
        self.plans_from_counts = 0  # ticks planned in O(1) (tests count them)
        self._counted_plan = False  # the last plan came from counts (cheap to redo)
        self.more_now = False  # a slice left planned transitions for the next one
        self._drains: dict[str, float] = {}  # draining node -> its deadline (shard clock)
        self._drain_due = float("inf")  # when the next leaving replica must go
        self._recent: deque[tuple[float, str]] = deque()  # (started at, id), oldest first
        self.ops = ops_factory(self)
        self._set_policy(spec)

    # ---- desired state -------------------------------------------------------------
    def update_spec(self, spec: DeploymentSpec) -> None:
        code_changed = spec.code_version != self.spec.code_version
        if code_changed or spec.user_config_version != self.spec.user_config_version:
            self.backoff = StartBackoff()
        if self._policy is None or spec.autoscaling_config != self.spec.autoscaling_config:
            self.target_replicas = spec.num_replicas
        timings = (spec.health_check_period_s, spec.health_check_timeout_s)
        timings_changed = timings != (self.spec.health_check_period_s,
                                      self.spec.health_check_timeout_s)
        self.config = self.config.retarget((spec.user_config, spec.user_config_version),
                                           code_changed)
        self.rollout = self.rollout.retarget(spec)
        if code_changed:  # proving windows belong to the rollout they were opened for
            self._proving.clear()
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
        # Only the schema's fields: a spec checkpointed by an older build may carry Serve
        # knobs set in code that fleetplane does not implement.
        known = AutoscalingConfig.model_fields
        self._policy = AutoscalingPolicy.from_config({k: v for k, v in cfg.items() if k in known})
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
        if self.adopting:
            return
        if self.backoff.expired(now):
            self.backoff = self.backoff.with_expired()
            self._dirty = True
        if now >= self._drain_due:
            self._dirty = True
        if self._policy is not None and now >= self._next_autoscale_at:
            self._autoscale(now)
        if self._dirty:
            self._act_slice(now)
        if self.rollout.rolling and self._on_target and now >= self._proving_until:
            self.rollout = self.rollout.settled()  # proven: later failures are ordinary
            self._proving.clear()
        self._act_health(self.health.tick(now), now)
        for replica_id, _old, new in run_consistency_pass(self.rank_gate, self.ranks,
                                                          self.replicas, now):
            self._set_rank(replica_id, new)

    def _act_slice(self, now: float) -> None:
        """Plan and act, at most ``transitions_per_slice`` actions of a plan from counts;
        the rest waits for ``continue_slice`` (the shard calls it once the loop has run
        other work). A full plan (rare: deletion, drains) is carried out whole, since
        re-planning it costs a snapshot of every replica."""
        self._dirty = False
        actions = self._plan(now)
        limit = self.settings.transitions_per_slice
        self.more_now = bool(limit) and len(actions) > limit and self._counted_plan
        if self.more_now:
            actions = actions[:limit]
            self._dirty = True  # re-planned from counts by the next slice
        self._act(actions, now)

    def continue_slice(self, now: float) -> None:
        """The next slice of a plan cut short by ``_act_slice``."""
        self.more_now = False
        if self._dirty and not self.adopting:
            self._act_slice(now)

    def set_node_drains(self, drains: dict[str, float]) -> None:
        """The draining nodes and their deadlines: replicas there are replaced elsewhere,
        then drained (``reconcile``). O(replicas), once per change of the draining set."""
        changed = {n for n in drains.keys() | self._drains.keys()
                   if drains.get(n) != self._drains.get(n)}
        self._drains = dict(drains)
        if any(r.node_id in changed for r in self.replicas.records()):
            self.mark_dirty()

    def _must_go_at(self, node_id: str | None) -> float | None:
        """When a replica on ``node_id`` must start its drain; None off draining nodes.
        The drain itself takes up to the graceful timeout and the deregistration window."""
        deadline = self._drains.get(node_id) if node_id is not None else None
        if deadline is None:
            return None
        window = self.spec.direct_ingress.deregistration_window_s \
            if self.spec.direct_ingress is not None else 0.0
        return deadline - self.spec.graceful_shutdown_timeout_s - window - _DRAIN_MARGIN_S

    def _plan(self, now: float) -> list:
        """This tick's actions: from counts where that answers exactly as the full plan
        would (a scale-up, a rolling code update, steady state: ``count_plan``), else
        ``plan`` over a snapshot of every replica."""
        fast = self._plan_from_counts(now, cap=True)
        if fast is not None:
            actions, self._on_target = fast
            self._drain_due = float("inf")
            self.plans_from_counts += 1
            self._counted_plan = True
            return actions
        self._counted_plan = False
        snapshot = self.snapshot(now)
        self._on_target = all(r.version == snapshot.target_version for r in
                              snapshot.replicas if r.state in ACTIVE_STATES)
        return plan(snapshot)

    def _plan_from_counts(self, now: float, cap: bool = False) -> tuple[list, bool] | None:
        """``cap``: one action more than a slice carries out, so it knows more are due."""
        if self.deleting or self._drains:
            return None
        return plan_from_counts(self.replicas, self._config_versions, CountTargets(
            replicas=self.target_replicas, version=self.rollout.serving.code_version,
            config_version=self.config.serving[1], surge=self._surge(),
            max_starting=self.settings.max_starting_replicas,
            starts_blocked=self.backoff.blocked(now)),
            cap=limit + 1 if cap and (limit := self.settings.transitions_per_slice) else 0)

    def _surge(self) -> int:
        return max(1, int(self.settings.rolling_surge_fraction * self.target_replicas))

    def snapshot(self, now: float) -> DeploymentSnapshot:
        self._drain_due = float("inf")
        views = []
        for r in self.replicas.records():
            go_at = self._must_go_at(r.node_id) if self._drains else None
            if go_at is not None and now < go_at:
                self._drain_due = min(self._drain_due, go_at)
            views.append(ReplicaView(r.replica_id, r.state, r.version,
                                     self._config_versions.get(r.replica_id, ""), r.rank,
                                     leaving=go_at is not None,
                                     must_go=go_at is not None and now >= go_at))
        return DeploymentSnapshot(
            target_replicas=self.target_replicas,
            target_version=self.rollout.serving.code_version,
            target_config_version=self.config.serving[1], replicas=tuple(views),
            deleting=self.deleting, surge=self._surge(),
            starts_blocked=self.backoff.blocked(now),
            max_starting=self.settings.max_starting_replicas)

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
        """A push from one of this deployment's live replicas; the next tick acts on it,
        unless it is steady (healthy, to a watched replica: so a serving one, no record
        lookup needed), taken at once."""
        if not via_heartbeat and health.healthy is True and \
                self.health.record_steady(replica_id, health.checked_at, now):
            return
        record = self.replicas.get(replica_id)
        if record is not None and record.state in ACTIVE_STATES:
            self.health.record_push(replica_id, health, now, via_heartbeat)

    def probe_resolved(self, replica_id: str, outcome: ProbeOutcome, now: float) -> None:
        self._act_health(self.health.probe_resolved(replica_id, outcome, now), now)

    def _act_health(self, actions: list[HealthAction], now: float) -> None:
        for action in actions:
            if isinstance(action, ProbeReplica):
                self.ops.probe(action.replica_id)
            elif isinstance(action, ApplyHealth):
                self._show_health(action)
            elif isinstance(action, ReplaceUnhealthy):
                logger.warning("replica %s is unhealthy: %s", action.replica_id, action.message)
                if now < self._proving.get(action.replica_id, now) and self.rollout.rolling:
                    self._roll_back(f"replica {action.replica_id} of the new version turned "
                                    f"unhealthy soon after starting: {action.message}")
                self.ops.stop(action.replica_id, f"unhealthy: {action.message}",
                              event=ReplicaEvent.UNHEALTHY)
            elif isinstance(action, ReplicaCrashed):
                self.ops.replica_died(action.replica_id, action.message)

    def _show_health(self, observed: ApplyHealth) -> None:
        record = self.replicas.get(observed.replica_id)
        if record is None or record.state not in SERVING_STATES:
            return
        if observed.failures:
            self.failing.add(observed.replica_id)
        else:
            self.failing.discard(observed.replica_id)
        if record.message != observed.text:
            self.replicas.replace(record.with_state(record.state, message=observed.text))

    # ---- autoscaling ---------------------------------------------------------------------
    def record_rows(self, rows: list[ReportRow], now: float) -> None:
        """A node batch's rows of this deployment: what ``record_metrics`` does per
        report, without a report object per row.
        A malformed row is logged and skipped; it never costs the rest of the batch.
        Issue 13: the steady pushes are taken first, in one loop (``take_steady``); they
        come from watched, so serving, replicas: their loads need no record lookup. The
        loads go to the window in one call, after the batch's health."""
        policy = self._policy
        if policy is None:
            self._record_rest(self.health.take_steady(rows, now), now, None)
            return
        taken: list[ReportRow] = []
        rest = self.health.take_steady(self._counts_checked(rows), now, taken)
        loads = [(row[0], row[1] + row[2]) for row in taken]
        self._record_rest(rest, now, loads)
        if loads:
            self._metrics.record_loads(loads, now)

    def _counts_checked(self, rows: list[ReportRow]) -> list[ReportRow]:
        """The rows whose request counts are >= 0 (an autoscaled deployment's: checked
        before anything is taken from a row); the others logged and dropped."""
        good = []
        for row in rows:
            try:
                if row[1] < 0 or row[2] < 0:
                    raise ValueError(f"request counts must be >= 0, got {row!r}")
                good.append(row)
            except (TypeError, ValueError, IndexError, KeyError) as e:
                logger.warning("%s: dropped a malformed report row %.200r: %s",
                               self.spec.id, row, e)
        return good

    def _record_rest(self, rows: list[ReportRow], now: float,
                     loads: list[tuple[str, int]] | None) -> None:
        """The rows ``take_steady`` left: each through the general path, its load (with
        ``loads``: an autoscaled deployment) for a replica this deployment has."""
        get, push = self.replicas.get, self.health.record_values
        for row in rows:
            try:
                replica_id, ongoing, queued, healthy, checked_at, failures, error = row
                record = get(replica_id)
                if loads is not None and record is not None:
                    loads.append((replica_id, ongoing + queued))
                if healthy is None:
                    continue
                if healthy is not True:  # checked as the wire type checks it
                    PushedHealth(healthy, checked_at, failures, error)
                if record is not None and record.state in ACTIVE_STATES:
                    push(replica_id, healthy, checked_at, failures, error, now)
            except (TypeError, ValueError) as e:
                logger.warning("%s: dropped a malformed report row %.200r: %s",
                               self.spec.id, row, e)

    def record_metrics(self, report: MetricReport, now: float) -> None:
        if report.health is not None:  # before the policy check: health rides on every report
            self.record_push(report.replica_id, report.health, now)
        if self._policy is not None and report.replica_id in self.replicas:
            # the window's ``record`` without its call layer, once per report (issue 13)
            self._metrics.record_load(report.replica_id, report.load, now)

    def _forget_replica(self, replica_id: str) -> None:
        self._handles.pop(replica_id, None)
        self._config_versions.pop(replica_id, None)
        self._proving.pop(replica_id, None)
        self.health.forget(replica_id)
        self.ranks.release(replica_id)
        self._metrics.forget(replica_id)

    def _autoscale(self, now: float) -> None:
        self._next_autoscale_at = now + 1.0
        if not self._metrics.membership_known:
            # A new window (first policy, new look-back): who counts, once, in O(N); from
            # then on ``transition`` tells it, and a query is O(1). Re-adoption adds RUNNING
            # replicas without a transition, but it is over before a tick autoscales.
            self._metrics.include_only(self.replicas.running_ids())
        load = self._metrics.average_load(now)
        decision = decide(self._policy, self.target_replicas, load, self._scaling, now)
        self._scaling = decision.state
        if decision.target_replicas != self.target_replicas:
            logger.info("%s: autoscaling %d -> %d (%s)", self.spec.id, self.target_replicas,
                        decision.target_replicas, decision.reason)
            self.target_replicas = decision.target_replicas
            self.mark_dirty()

    # ---- routing ---------------------------------------------------------------------------
    def model_ids(self, replica_id: str) -> tuple[str, ...]:
        return self.routing.model_ids(replica_id)

    def record_model_ids(self, replica_id: str, ids: tuple[str, ...]) -> None:
        self.routing.record_model_ids(self.replicas, replica_id, ids)

    def routing_update(self, now: float = 0.0) -> RoutingUpdate | RoutingDelta | None:
        """What routers need, if it changed since the last call (``DeploymentRouting``),
        with the routers' total demand when due (``cluster_informed`` only); nothing
        while re-adopting."""
        if self.adopting:
            return None
        informed = self.spec.backpressure_config.get("retry_after_policy") == "cluster_informed"
        demand = self.demand.to_publish(now, self.replicas) if informed else None
        return self.routing.update(self.spec, self.replicas, demand)

    def record_router_demand(self, router_id: str, demand: RouterDemand, now: float) -> None:
        self.demand.record(router_id, demand, now)

    # ---- status ---------------------------------------------------------------------------
    @property
    def autoscaled(self) -> bool:
        return self._policy is not None

    @property
    def config_versions(self) -> CountedMap:
        """Replica id -> the user_config version it runs (read-only for the report)."""
        return self._config_versions

    def status(self, now: float) -> dict:
        return deployment_report(self, now)

    def summary(self, now: float) -> dict:
        """The status entry without replica rows, in O(1) (``deployment_summary``)."""
        return deployment_summary(self, now)
