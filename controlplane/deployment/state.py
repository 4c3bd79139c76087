"""One deployment inside a shard: the conductor over the owners that keep its state.

Observe, decide, act. The conductor holds the desired state (the spec, the target
replica count, whether the deployment is being deleted or its replicas re-adopted) and
composes one owner per concern, each with its own module and tests:

| owner | owns |
|---|---|
| ``ReplicaBook`` | records, ranks, handles, config versions, ids, recent starts |
| ``DeploymentHealth`` | push-first health: gate states, visits, registry, stall guard |
| ``Rollout`` | code and config rollouts, proving windows, start backoff |
| ``Autoscaler`` | policy, load window, decision cadence |
| ``NodeDrains`` | draining nodes' deadlines |
| ``DeploymentRouting`` | what routers are told, and the routers' demand |
| ``Planner`` | when to plan, plans from counts or a snapshot, slices |
| ``ReplicaOps`` | the remote calls: start, stop, reconfigure, probe |

A replica's state changes only in the book (``ReplicaBook.apply``), which tells every
owner of the move with one ``Moved`` event (this conductor last: it marks the deployment
for a new plan). ``ReplicaOps`` reports the outcomes of its calls here
(``replica_started``, ``start_failed``...), and the conductor hands each to the owners it
concerns. A steady deployment costs O(1) per tick: no walk over its replicas.

Re-adoption: a deployment new to this shard first takes over the live replicas a previous
shard actor started (``adopting``; this shard was restarted), so a control-plane restart
restarts no replica. Until that is done it neither plans nor publishes routing: routers
keep the replica set they had.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Callable

from controlplane.deployment.autoscaler import Autoscaler
from controlplane.deployment.drains import NodeDrains
from controlplane.deployment.lifecycle import (ACTIVE_STATES, SERVING_STATES, ReplicaEvent,
                                               ReplicaState)
from controlplane.deployment.planner import Planner
from controlplane.deployment.reconcile import (DeploymentSnapshot, ReconfigureReplica,
                                               StartReplica, StopReplica)
from controlplane.deployment.replica_book import ReplicaBook
from controlplane.deployment.replica_set import Moved
from controlplane.deployment.report import deployment_report, deployment_summary
from controlplane.deployment.rollout import Rollout
from controlplane.deployment.routing import DeploymentRouting
from controlplane.deployment.work import WorkTotals
from controlplane.health.gate import ProbeOutcome
from controlplane.health.push_health import (ApplyHealth, DeploymentHealth, HealthAction,
                                             ProbeReplica, ReplaceUnhealthy, ReplicaCrashed)
from controlplane.health.stall_guard import StallGuard
from controlplane.health.stats import HealthTotals
from controlplane.settings import ShardSettings
from controlplane.specs import DeploymentSpec, stable_hash
from controlplane.wire import (PushedHealth, ReplicaDescription, ReportRow, RequestError,
                               RouterDemand, RoutingDelta, RoutingUpdate)

logger = logging.getLogger(__name__)

STARTING, RUNNING, UPDATING = ReplicaState.STARTING, ReplicaState.RUNNING, ReplicaState.UPDATING
STARTED = ReplicaEvent.STARTED


class DeploymentState:
    def __init__(self, spec: DeploymentSpec, settings: ShardSettings,
                 ops_factory: Callable[[DeploymentState], Any],
                 totals: HealthTotals | None = None, work: WorkTotals | None = None) -> None:
        self.spec = spec
        self.target_replicas = spec.num_replicas
        self.deleting = False
        self.adopting = False  # taking over live replicas; no plan, no routing until done
        self.book = ReplicaBook(spec.id, settings.rank_error_retry_s, work)
        totals = totals if totals is not None else HealthTotals()
        period = spec.health_check_period_s
        self.health = DeploymentHealth(
            period, totals, unhealthy_threshold=settings.unhealthy_threshold,
            guard=StallGuard(period, totals, cap_s=settings.stall_episode_cap_s))
        self.rollout = Rollout(spec, settings)
        self.autoscaler = Autoscaler(spec.autoscaling_config)
        self.drains = NodeDrains()
        self.routing = DeploymentRouting()
        self.planner = Planner(self.book, self.rollout, self.drains, settings)
        self.book.listen(self.health, self.autoscaler, self.rollout, self.routing, self)
        self.ops = ops_factory(self)

    # ---- desired state -------------------------------------------------------------
    def update_spec(self, spec: DeploymentSpec) -> None:
        old = self.spec
        if not self.autoscaler.active or spec.autoscaling_config != old.autoscaling_config:
            self.target_replicas = spec.num_replicas
        timings_changed = (spec.health_check_period_s, spec.health_check_timeout_s) != (
            old.health_check_period_s, old.health_check_timeout_s)
        self.rollout.retarget(spec)
        self.spec = spec
        self.health.set_period(spec.health_check_period_s)
        if timings_changed:  # O(N) on this redeploy only; self-checks run on the replicas
            for replica_id in self.book.replicas.running_ids():
                self.ops.update_health_timings(replica_id)
        self.autoscaler.configure(spec.autoscaling_config)
        self.deleting = False
        self.planner.mark_dirty()

    def delete(self) -> None:
        self.deleting = True
        self.planner.mark_dirty()

    @property
    def finished_deleting(self) -> bool:
        return self.deleting and len(self.book.replicas) == 0

    def set_node_drains(self, drains: dict[str, float]) -> None:
        """The draining nodes and their deadlines: replicas there are replaced elsewhere,
        then drained. O(replicas), once per change of the draining set."""
        if self.drains.set(drains, self.book.replicas.records()):
            self.planner.mark_dirty()

    # ---- the tick --------------------------------------------------------------------
    def tick(self, now: float) -> None:
        if self.adopting:
            return
        planner = self.planner
        if self.rollout.backoff_expired(now):
            planner.mark_dirty()
        if now >= self.drains.due:
            planner.mark_dirty()
        if self.autoscaler.due(now):
            self._autoscale(now)
        if planner.dirty:
            self._act(planner.next_slice(now, self.target_replicas, self.deleting, self.spec),
                      now)
        self.rollout.settle(now, planner.on_target)
        self._act_health(self.health.tick(now), now)
        for replica_id, _old, new in self.book.rank_moves(now):
            self.ops.update_rank(replica_id, new)

    @property
    def more_now(self) -> bool:
        """A slice left planned transitions for ``continue_slice``."""
        return self.planner.more_now

    def continue_slice(self, now: float) -> None:
        """The next slice of a plan cut short (the shard calls it once the loop has run
        other work)."""
        self.planner.more_now = False
        if self.planner.dirty and not self.adopting:
            self._act(self.planner.next_slice(now, self.target_replicas, self.deleting,
                                              self.spec), now)

    def end_slices(self) -> None:
        """No more slices now (one raised): the next tick re-plans."""
        self.planner.more_now = False

    def snapshot(self, now: float) -> DeploymentSnapshot:
        return self.planner.snapshot(now, self.target_replicas, self.deleting, self.spec)

    def _act(self, actions: list, now: float) -> None:
        for action in actions:
            if isinstance(action, StartReplica):
                self.ops.start(now)
            elif isinstance(action, StopReplica):
                self.ops.stop(action.replica_id, action.reason)
            elif isinstance(action, ReconfigureReplica):
                self.ops.reconfigure(action.replica_id)

    def _autoscale(self, now: float) -> None:
        decision = self.autoscaler.decide(now, self.target_replicas,
                                          self.book.replicas.running_ids(),
                                          held=self.routing.demand.queued,
                                          start_s=self.routing.demand.start_s)
        if decision is not None:
            logger.info("%s: autoscaling %d -> %d (%s)", self.spec.id, self.target_replicas,
                        decision.target_replicas, decision.reason)
            self.target_replicas = decision.target_replicas
            self.planner.mark_dirty()

    # ---- replica transitions and the outcomes of replica operations --------------------
    def replica_moved(self, moved: Moved) -> None:
        """The book's event, heard last: the deployment re-plans."""
        self.planner.mark_dirty()
        if moved.started and self.health.unhealthy:  # else nothing to end: no count per start
            self.health.note_capacity(self.book.replicas.count(RUNNING), self.target_replicas)

    def replica_created(self, replica_id: str, handle: Any, actor_name: str,
                        now: float) -> None:
        """The client accepted the actor; it is STARTING until ``replica_started``."""
        self.book.add_starting(replica_id, handle, actor_name, self.rollout.serving.code_version,
                               self.rollout.serving_config[1], now)

    def replica_started(self, replica_id: str, info: dict, now: float) -> bool:
        """Initialized and healthy: RUNNING. False when the replica moved on meanwhile
        (the start is then ignored)."""
        get = info.get
        return self.book.apply(replica_id, STARTED, now, STARTING, {
            "actor_id": get("actor_id"), "node_id": get("node_id"),
            "http_address": get("http_address"), "message": ""}) is not None

    def transition(self, replica_id: str, event: ReplicaEvent, now: float,
                   expect: ReplicaState | None = None, **changes: Any) -> Moved | None:
        return self.book.apply(replica_id, event, now, expect, changes)

    def replica_adopted(self, found: ReplicaDescription, handle: Any, actor_name: str,
                        now: float) -> bool:
        """A live replica a previous shard started; False (the caller kills it) when it
        cannot be taken over. Replaced at once when its fresh self-check failed."""
        config = (found.user_config, stable_hash(found.user_config))
        if not self.book.adopt(found, handle, actor_name, config[1], now):
            return False
        self.rollout.adopted(config)
        if not found.healthy:
            self.ops.stop(found.replica_id, f"unhealthy when re-adopted: {found.message}",
                          event=ReplicaEvent.UNHEALTHY)
        return True

    def adopt_existing(self) -> None:
        """Before anything else, take over the live replicas of this deployment."""
        self.adopting = True
        self.ops.adopt_existing()

    def adoption_done(self) -> None:
        self.adopting = False
        self.planner.mark_dirty()

    def start_failed(self, replica_id: str, message: str, now: float,
                     created: bool = True) -> None:
        """A start failed (``created=False``: the client refused the actor, so there is no
        record). Counts one failure toward backoff and the DEPLOY_FAILED budget, unless the
        replica was stopped while starting (scale-down or redeploy: not a failure)."""
        if created and self.book.apply(replica_id, ReplicaEvent.START_FAILED, now,
                                       STARTING) is None:
            return
        self.rollout.start_failed(f"replica {replica_id} failed to start:\n{message}", now,
                                  self.target_replicas)
        self.planner.mark_dirty()

    def reconfigured(self, replica_id: str, version: str, now: float) -> None:
        if self.book.apply(replica_id, ReplicaEvent.RECONFIGURED, now, UPDATING):
            self.book.set_config_version(replica_id, version)

    def reconfigure_failed(self, replica_id: str, version: str, message: str,
                           now: float) -> None:
        """The user's reconfigure raised (or timed out): the rollout stops and the replica
        keeps serving, told the fallback config again; only when the fallback itself
        failed is it replaced."""
        if self.book.apply(replica_id, ReplicaEvent.RECONFIGURE_FAILED, now, UPDATING) is None:
            return
        if self.rollout.reconfigure_failed(replica_id, version, message):
            self.book.set_config_version(replica_id, "")  # unknown: the plan re-sends it
        else:
            logger.error("%s: replica %s could not take the serving config back; replacing "
                         "it:\n%s", self.spec.id, replica_id, message)
            self.ops.stop(replica_id, "reconfigure failed")

    def replica_died(self, replica_id: str, message: str, now: float) -> bool:
        """A serving replica's actor is gone: replace it now. False when it was stopping
        anyway or already handled."""
        record = self.book.get(replica_id)
        if record is None or record.state not in SERVING_STATES:
            return False
        logger.warning("replica %s died: %s", replica_id, message)
        self.health.note_crashed()
        self.book.apply(replica_id, ReplicaEvent.DIED, now, changes={"message": message})
        return True

    # ---- health: push first, pull fallback ---------------------------------------------
    def probe_resolved(self, replica_id: str, outcome: ProbeOutcome, now: float) -> None:
        self._act_health(self.health.probe_resolved(replica_id, outcome, now), now)

    def _act_health(self, actions: list[HealthAction], now: float) -> None:
        for action in actions:
            if isinstance(action, ProbeReplica):
                self.ops.probe(action.replica_id)
            elif isinstance(action, ApplyHealth):
                self.book.set_message(action.replica_id, action.text)
            elif isinstance(action, ReplaceUnhealthy):
                logger.warning("replica %s is unhealthy: %s", action.replica_id, action.message)
                self.rollout.turned_unhealthy(action.replica_id, action.message, now)
                self.ops.stop(action.replica_id, f"unhealthy: {action.message}",
                              event=ReplicaEvent.UNHEALTHY)
            elif isinstance(action, ReplicaCrashed):
                self.ops.replica_died(action.replica_id, action.message)

    # ---- reports: loads and pushed health ------------------------------------------------
    def record_rows(self, rows: list[ReportRow], now: float) -> None:
        """Reports of this deployment's replicas (a node batch, or one report): the steady
        pushes taken first, in one loop (``DeploymentHealth.take_steady``: watched, so
        serving, replicas, whose loads need no record lookup), the rest one by one; an
        autoscaled deployment's loads go to its window in one call, after the health.
        A malformed row is logged and skipped; it never costs the rest of the batch."""
        if self.autoscaler.policy is None:
            rest = self.health.take_steady(rows, now)
            if rest:
                self._record_rest(rest, now, None)
            return
        taken: list[ReportRow] = []
        rest = self.health.take_steady(_counts_checked(rows, self.spec), now, taken)
        loads = [(replica_id, ongoing + queued)
                 for replica_id, ongoing, queued, _, _, _, _ in taken]
        self._record_rest(rest, now, loads)
        if loads:
            self.autoscaler.record_loads(loads, now)

    def _record_rest(self, rows: Sequence[ReportRow], now: float,
                     loads: list[tuple[str, int]] | None) -> None:
        """The rows ``take_steady`` left: each through the general path, its load (with
        ``loads``: an autoscaled deployment) for a replica this deployment has."""
        get, push = self.book.replicas.get, self.health.record_values
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

    def record_heartbeat(self, replica_id: str, health: PushedHealth, now: float) -> None:
        """Pushed health without a metric report: always the general path."""
        record = self.book.get(replica_id)
        if record is not None and record.state in ACTIVE_STATES:
            self.health.record_values(replica_id, health.healthy, health.checked_at,
                                      health.consecutive_failures, health.error, now,
                                      via_heartbeat=True)

    # ---- routing and status ----------------------------------------------------------------
    def record_model_ids(self, replica_id: str, ids: tuple[str, ...]) -> None:
        self.routing.record_model_ids(self.book.replicas, replica_id, ids)

    def record_engine_stats(self, replica_id: str, stats: dict, now: float) -> None:
        """A serving replica's engine stats, for ``autoscaling_config.llm``; a malformed
        one is logged and dropped; an empty one (the replica's check has not read its
        engine yet) says nothing."""
        record = self.book.get(replica_id)
        if not stats or record is None or record.state not in SERVING_STATES:
            return
        try:
            self.autoscaler.record_engine_stats(replica_id, stats, now)
        except (TypeError, ValueError) as e:
            logger.warning("%s: dropped engine stats of %s: %s", self.spec.id, replica_id, e)

    def record_router_demand(self, router_id: str, demand: RouterDemand, now: float) -> None:
        self.routing.record_router_demand(router_id, demand, now)

    def record_request_error(self, replica_id: str, error: RequestError) -> None:
        self.routing.errors.record(replica_id, error)

    def routing_update(self, now: float = 0.0) -> RoutingUpdate | RoutingDelta | None:
        """What routers need, if it changed since the last call; nothing while
        re-adopting."""
        if self.adopting:
            return None
        return self.routing.update(self.spec, self.book.replicas, now)

    def status(self, now: float) -> dict:
        return deployment_report(self, now)

    def summary(self, now: float) -> dict:
        """The status entry without replica rows, in O(1) (``deployment_summary``)."""
        return deployment_summary(self, now)


def _counts_checked(rows: list[ReportRow], spec: DeploymentSpec) -> list[ReportRow]:
    """The rows whose request counts are >= 0 (an autoscaled deployment's: checked before
    anything is taken from a row); the others logged and dropped."""
    good = []
    for row in rows:
        try:
            _, ongoing, queued, _, _, _, _ = row
            if ongoing < 0 or queued < 0:
                raise ValueError(f"request counts must be >= 0, got {row!r}")
            good.append(row)
        except (TypeError, ValueError) as e:
            logger.warning("%s: dropped a malformed report row %.200r: %s", spec.id, row, e)
    return good
