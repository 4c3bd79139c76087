"""One deployment's push-based health, as the shard's tick drives it. No Ray, no I/O.

Owns: the ``GateState`` of each watched replica, the deadline queue of replica visits,
and the wiring of the push registry, the stall guard and the pure rules of
``gate``. The deployment's conductor feeds it pushes and probe results, tells it of each
replica's lifecycle moves (``replica_moved``: it watches serving replicas) and carries
out the actions it returns (``ProbeReplica``, ``ApplyHealth``, ``ReplaceUnhealthy``,
``ReplicaCrashed``). The health rules decide here, not in the conductor: a replica whose
consecutive failures reach ``unhealthy_threshold`` is replaced, and the deployment is
``unhealthy`` from a replacement for cause until it is back at its target.

Invariants:

- O(changes) per tick: a tick touches only replicas whose push arrived since the last
  tick (the registry's dirty set) and replicas whose visit is due (the deadline queue),
  plus, once per early-ended stall episode, the holds it retracts. A steady deployment
  whose pushes are fresh costs no visit at all: each steady push moves its replica's
  deadline to the end of the queue's in-order line (O(1)), so only a replica that went
  quiet for 1.5 periods is visited.
- Every watched replica has exactly one of: a pending visit, or a probe in flight (whose
  resolution schedules the next visit). At most one probe per replica is in flight.
- The stall guard hears only replicas that have a registry entry and whose push is stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from controlplane.deployment.lifecycle import SERVING_STATES
from controlplane.deployment.replica_set import Moved
from controlplane.health.deadline_wheel import DeadlineQueue
from controlplane.health.gate import (Apply, Defer, GateState, ProbeOutcome, StartProbe,
                                             UsePush, Wait, consume_push, decide, push_is_stale,
                                             resolve_probe, stale_after_s, start_probe)
from controlplane.health.stats import HealthTotals
from controlplane.health.push_registry import HealthPushRegistry
from controlplane.health.stall_guard import STOCK_HEALTH_CHECK_PERIOD_S, StallGuard
from controlplane.wire import PushedHealth, ReportRow


@dataclass(frozen=True)
class ProbeReplica:
    """Start a pull probe; report its outcome through ``probe_resolved`` exactly once."""

    replica_id: str


@dataclass(frozen=True)
class ApplyHealth:
    """A health observation below the unhealthy threshold: the shell shows ``text`` on
    the replica. (``failures_counted`` is already in the health-check-failures counter.)"""

    replica_id: str
    healthy: bool
    failures: int
    failures_counted: int
    source: str  # "push" or "probe"
    message: str = ""

    @property
    def text(self) -> str:
        if self.message or self.healthy:
            return self.message
        return f"self health check failed ({self.failures} consecutive, {self.source})"


@dataclass(frozen=True)
class ReplaceUnhealthy:
    """The replica failed ``unhealthy_threshold`` consecutive checks: replace it."""

    replica_id: str
    message: str


@dataclass(frozen=True)
class ReplicaCrashed:
    replica_id: str
    message: str


HealthAction = ProbeReplica | ApplyHealth | ReplaceUnhealthy | ReplicaCrashed


@dataclass(frozen=True)
class HealthView:
    """A deployment's health as its status entry shows it."""

    tracked: int  # replicas with a pushed entry (the stall guard's denominator)
    stall_state: str
    stall_held: int
    unhealthy: bool  # replaced a replica for cause and not back at its target since
    failing: int  # serving replicas whose last observation failed


class DeploymentHealth:
    """Push-first health of one deployment's serving replicas."""

    def __init__(self, period_s: float | None, totals: HealthTotals | None = None, *,
                 registry: HealthPushRegistry | None = None,
                 guard: StallGuard | None = None, unhealthy_threshold: int = 3) -> None:
        self._totals = totals if totals is not None else HealthTotals()
        self._threshold = unhealthy_threshold
        # True from a replacement for cause (failed checks, a crash) until a replica
        # start brings the deployment back to its target (``note_capacity``).
        self.unhealthy = False
        self.registry = registry if registry is not None else HealthPushRegistry(self._totals)
        self.guard = guard if guard is not None else StallGuard(period_s, self._totals)
        self._period_s = self._stale_s = STOCK_HEALTH_CHECK_PERIOD_S
        self.set_period(period_s)
        self._states: dict[str, GateState] = {}
        self._due = DeadlineQueue()
        self._steady: list[ReportRow] = []  # take_steady's scratch: a batch's steady rows
        self._ids: list[str] = []  # ... and their replica ids
        # Watched replicas whose last observation failed (status counts them in O(1)); a
        # replica leaves it when it passes again or is no longer watched.
        self._failing: set[str] = set()

    def set_period(self, period_s: float | None) -> None:
        """The deployment's health_check_period_s; None when unknown (stock period)."""
        self._period_s = STOCK_HEALTH_CHECK_PERIOD_S if period_s is None else period_s
        self._stale_s = stale_after_s(period_s)
        self.guard.set_window(period_s)
        self.registry.set_retention(4 * stale_after_s(period_s))

    # ---- inputs ------------------------------------------------------------------------
    def record_push(self, replica_id: str, health: PushedHealth, received_at: float,
                    via_heartbeat: bool = False) -> None:
        """One push (on a metric report or a heartbeat): a batch of one through
        ``take_steady``, else the general path (the next tick acts on it)."""
        if not via_heartbeat and health.healthy is True and not self.take_steady(
                [ReportRow(replica_id, 0, 0, True, health.checked_at, 0, "")], received_at):
            return
        self.record_values(replica_id, health.healthy, health.checked_at,
                           health.consecutive_failures, health.error, received_at,
                           via_heartbeat)

    def take_steady(self, rows: Sequence[ReportRow], received_at: float,
                    taken: list[ReportRow] | None = None) -> Sequence[ReportRow]:
        """The one fast path of pushes, for a node batch (all received at once) or a single
        push (a batch of one). A push is steady when it is healthy, to a replica whose last
        observation was healthy, with no probe in flight, and newer than what was acted
        on: then it is acted on here, as the tick's ``consume_push`` would (a healthy
        ``UsePush`` that counts nothing and shows nothing new) with the visit ``decide``
        would re-arm (``Wait(stale_at)``), in O(1) per push, without the tick seeing it.
        The gate's test is this object's, the entry's the registry's (``take_steady``).
        Returns the rows not taken, in batch order, for the general path (malformed ones
        among them); ``taken``: the rows taken are appended to it. Once a replica's row is
        left, so are its later ones: each replica's rows apply in the batch's order."""
        # the batch's scratch lists are this object's, reused: a report allocates no
        # container here (each would cost the collector, on every report)
        states, steady, rest, left = self._states, self._steady, None, None
        for row in rows:
            try:
                replica_id = row.replica_id
                state = states.get(replica_id)
                if (row.healthy is not True or state is None
                        or (left is not None and replica_id in left)
                        or state.failures or state.probe_started_at is not None
                        or state.push_received_at is None
                        or received_at <= state.push_received_at
                        or (state.applied_probe_started_at is not None
                            and received_at <= state.applied_probe_started_at)):
                    if rest is None:
                        rest, left = [], set()
                    rest.append(row)
                    left.add(replica_id)
                    continue
            except (AttributeError, TypeError):  # not a ReportRow, or an unhashable id
                if rest is None:
                    rest, left = [], set()
                rest.append(row)
                continue
            steady.append(row)
        if rest is None:
            rest = ()  # every row taken
        if not steady:
            return rest
        refused = self.registry.take_steady(steady, received_at)
        if refused:  # rare (the registry disagreed with the gate): back in batch order
            kept, rest = _without(rows, steady, refused, rest)
            steady.clear()
            steady = kept
        ids = self._ids
        for row in steady:
            replica_id = row.replica_id
            states[replica_id].push_received_at = received_at
            ids.append(replica_id)
        self._due.schedule_all_in_order(ids, received_at + self._stale_s)
        ids.clear()
        if taken is not None:
            taken += steady
        steady.clear()  # no row outlives its batch here
        return rest

    def record_values(self, replica_id: str, healthy: bool, checked_at: float, failures: int,
                      error: str, received_at: float, via_heartbeat: bool = False) -> None:
        """The general path of one push's fields: the registry takes it and the next tick
        acts on it."""
        self.registry.record_values(replica_id, healthy, checked_at, failures, error,
                                    received_at, via_heartbeat)

    def watch(self, replica_id: str, now: float) -> None:
        """Start watching a replica that became serving: first visit one period out (the
        pull schedule), and a push that arrived before now is acted on next tick."""
        if replica_id in self._states:
            return
        self._states[replica_id] = GateState()
        # in order while a scale-up's starts come one after another: the line's O(1)
        self._due.schedule_in_order(replica_id, now + self._period_s)
        self.registry.mark_dirty(replica_id)

    def replica_moved(self, moved: Moved) -> None:
        """A replica that starts serving (a start, a re-adoption) is watched; one that
        stops serving is forgotten."""
        if moved.record[1] in SERVING_STATES:
            if moved.was not in SERVING_STATES:
                self.watch(moved.replica_id, moved.now)
        else:
            self.forget(moved.replica_id)

    def forget(self, replica_id: str) -> None:
        """Stop watching (the replica left the serving states); idempotent."""
        self._failing.discard(replica_id)
        self._states.pop(replica_id, None)
        self._due.cancel(replica_id)
        self.registry.forget(replica_id)
        self.guard.forget(replica_id)

    # ---- the tick -------------------------------------------------------------------------
    def tick(self, now: float) -> list[HealthAction]:
        actions: list[HealthAction] = []
        for replica_id in self.guard.advance(now, self.registry.tracked):
            if replica_id in self._states:
                self._due.schedule(replica_id, now)  # hold retracted: revisit now
        for replica_id in self.registry.take_dirty():
            if replica_id in self._states:
                self._consume(replica_id, actions)
        for replica_id in self._due.pop_due(now):
            if replica_id in self._states:
                self._visit(replica_id, now, actions)
        return actions

    def _consume(self, replica_id: str, actions: list[HealthAction]) -> None:
        entry = self.registry.get(replica_id)
        state, verdict = consume_push(self._states[replica_id], entry)
        self._states[replica_id] = state
        if isinstance(verdict, UsePush):
            error = entry.error
            message = (f"self health check failed ({verdict.failures} consecutive, push): "
                       f"{error}" if error and not verdict.healthy else "")
            actions.append(self._judge(ApplyHealth(replica_id, verdict.healthy, verdict.failures,
                                                   verdict.failures_counted, "push", message)))

    def _visit(self, replica_id: str, now: float, actions: list[HealthAction]) -> None:
        state = self._states[replica_id]
        entry = self.registry.get(replica_id)
        hold_until = 0.0
        if entry is not None and state.probe_started_at is None and push_is_stale(
                state, now, self._period_s):
            hold_until = self.guard.on_stale(replica_id, now, self.registry.tracked)
        action = decide(state, entry, hold_until, now, self._period_s)
        if isinstance(action, StartProbe):
            self._states[replica_id] = start_probe(state, now)
            self._totals.pull_probes_total += 1
            actions.append(ProbeReplica(replica_id))
        elif isinstance(action, Defer) or (isinstance(action, Wait) and action.until is not None):
            self._due.schedule(replica_id, action.until)

    def probe_resolved(self, replica_id: str, outcome: ProbeOutcome,
                       now: float) -> list[HealthAction]:
        """A probe this object asked for finished; its result is acted on or dropped."""
        state = self._states.get(replica_id)
        if state is None or state.probe_started_at is None:
            return []  # forgotten meanwhile
        entry = self.registry.get(replica_id)
        state, verdict = resolve_probe(state, outcome, entry.received_at if entry else None, now)
        self._states[replica_id] = state
        if not isinstance(verdict, Apply):
            self._due.schedule(replica_id, now)  # the newer push decides; next tick sees it
            return []
        self._due.schedule(replica_id, now + self._period_s)  # the pull cadence
        if verdict.crashed:
            self.unhealthy = True
            return [ReplicaCrashed(replica_id, verdict.message)]
        return [self._judge(ApplyHealth(replica_id, verdict.healthy, verdict.failures,
                                        verdict.failures_counted, "probe", verdict.message))]

    def _judge(self, observed: ApplyHealth) -> ApplyHealth | ReplaceUnhealthy:
        """Count the failures an observation adds; replace at the threshold."""
        self._totals.health_check_failures_total += observed.failures_counted
        if observed.failures < self._threshold:
            if observed.failures:
                self._failing.add(observed.replica_id)
            else:
                self._failing.discard(observed.replica_id)
            return observed
        self.unhealthy = True
        return ReplaceUnhealthy(observed.replica_id, observed.text)

    # ---- the deployment's condition -------------------------------------------------------
    def note_crashed(self) -> None:
        """A serving replica died outside a probe (the death watch saw it)."""
        self.unhealthy = True

    def note_capacity(self, running: int, target: int) -> None:
        """A replica started: back at the target, the deployment is healthy again."""
        if running >= target:
            self.unhealthy = False

    # ---- reads -----------------------------------------------------------------------------
    def failures(self, replica_id: str) -> int:
        state = self._states.get(replica_id)
        return state.failures if state is not None else 0

    def view(self) -> HealthView:
        stall = self.guard.statistics()
        return HealthView(self.registry.tracked, stall.state.value, stall.held, self.unhealthy,
                          len(self._failing))


def _without(rows: Sequence[ReportRow], steady: list[ReportRow], refused: list[ReportRow],
             rest: Sequence[ReportRow]) -> tuple[list[ReportRow], list[ReportRow]]:
    """(``steady`` less ``refused``, the rows left for the general path in batch order)."""
    out = {id(row) for row in refused}
    steady = [row for row in steady if id(row) not in out]
    out.update(id(row) for row in rest)
    return steady, [row for row in rows if id(row) in out]
