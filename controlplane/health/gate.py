"""Per-replica health decisions of the controller: pushes first, pull probes as fallback.

Owns the pure rules, over a frozen ``GateState`` per replica with ``now`` passed in:

- ``consume_push``: whether a newly arrived push is acted on (``UsePush``) or is older
  than what was already acted on (``Skip``).
- ``decide``: on a replica's due visit, ``StartProbe``, ``Wait`` (a push is fresh, a probe
  is in flight, or the pull cadence has not come round) or ``Defer`` (stall-guard hold).
- ``resolve_probe``: whether a finished probe is acted on (``Apply``) or ``Drop``-ped.

Invariants (each a review fix of seed 000, ray-project/ray#64913):

- A fresh push stands in for a pull probe. A push is stale once it ARRIVED
  ``STALE_AFTER_PERIODS`` x the health period ago: anchored to its ``received_at``, never
  to when a tick consumed it, or a slow reconcile stretches the window on exactly the
  ticks the controller is behind.
- Precedence is symmetric and decided by arrival vs probe start: a probe started before a
  newer push arrived is dropped when it resolves (its result predates the push; applying it
  would flap the failure count across pull-to-push transitions), and a push that arrived
  before a probe started never overwrites that probe's result. A tie goes to the probe.
- ``ACTOR_CRASHED`` is always applied: a crash is authoritative and a dead replica pushes
  nothing.
- A stall-guard hold is its own deadline, never read as an observation: a probe resolving
  during an episode is applied, and a hold ends at its deadline, not a freshness window
  after it. A replica with no registry entry is never held.
- ``failures`` follows the observation acted on (the replica's period-based count for a
  push, +1 per failed probe), and ``failures_counted`` says how much the
  health-check-failures counter advances: acted-on failures count, dropped ones never.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum

from controlplane.health.push_registry import PushEntry
from controlplane.health.stall_guard import STOCK_HEALTH_CHECK_PERIOD_S

# Seed 000: the pull path is the fallback "for replicas whose push has gone stale (1.5x
# the health-check period)": one period plus half of one for the replica's half-period
# self-check cadence, report jitter and ingest delay.
STALE_AFTER_PERIODS = 1.5
# A held replica is revisited at least this often (in periods) so the stall tally, whose
# window is one period, sees it in every window and its hold is re-stamped (or retracted).
HOLD_REVISIT_PERIODS = 0.5


@dataclass(slots=True)
class GateState:
    """What the controller remembers about one replica's health.

    The rules below never mutate one: they return a new state. Not frozen for one reason:
    the steady path (``DeploymentHealth.take_steady``: a healthy push to a replica whose
    last observation was healthy) moves ``push_received_at`` in place, which is exactly
    what ``consume_push`` would return, without an allocation per push.
    """

    failures: int = 0  # consecutive failures of the observation acted on last
    push_received_at: float | None = None  # arrival of the newest push acted on
    probe_started_at: float | None = None  # the probe in flight; None when none
    applied_probe_started_at: float | None = None  # start of the newest probe acted on
    applied_probe_resolved_at: float | None = None  # when it resolved: the pull cadence

    @property
    def healthy(self) -> bool:
        return self.failures == 0


class ProbeResult(str, Enum):
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"  # check raised or timed out: one failed observation
    ACTOR_CRASHED = "ACTOR_CRASHED"  # the actor is gone: authoritative


@dataclass(frozen=True)
class ProbeOutcome:
    result: ProbeResult
    message: str = ""


@dataclass(frozen=True)
class UsePush:
    healthy: bool
    failures: int
    failures_counted: int


@dataclass(frozen=True)
class Skip:
    reason: str


@dataclass(frozen=True)
class StartProbe:
    pass


@dataclass(frozen=True)
class Wait:
    until: float | None  # None: a probe is in flight and its resolution re-arms the visit


@dataclass(frozen=True)
class Defer:
    until: float  # next visit; the hold itself may end later


@dataclass(frozen=True)
class Apply:
    healthy: bool
    failures: int
    failures_counted: int
    crashed: bool
    message: str


@dataclass(frozen=True)
class Drop:
    reason: str


def stale_after_s(period_s: float | None) -> float:
    """Push age at which pull probes take over; the stock period when none is known."""
    return STALE_AFTER_PERIODS * (STOCK_HEALTH_CHECK_PERIOD_S if period_s is None else period_s)


def stale_at(state: GateState, period_s: float | None) -> float | None:
    """When the newest push acted on goes stale; None when no push was ever acted on."""
    if state.push_received_at is None:
        return None
    return state.push_received_at + stale_after_s(period_s)


def push_is_stale(state: GateState, now: float, period_s: float | None) -> bool:
    deadline = stale_at(state, period_s)
    return deadline is None or now >= deadline


def consume_push(state: GateState, entry: PushEntry) -> tuple[GateState, UsePush | Skip]:
    """Act on the replica's newest registry entry, unless something newer was acted on."""
    if state.push_received_at is not None and entry.received_at <= state.push_received_at:
        return state, Skip("already acted on")
    probe_start = state.applied_probe_started_at
    if probe_start is not None and entry.received_at <= probe_start:
        return state, Skip("arrived before the probe whose result was applied")
    failures = 0 if entry.healthy else entry.consecutive_failures
    counted = max(0, failures - state.failures)
    new = dataclasses.replace(state, failures=failures, push_received_at=entry.received_at)
    return new, UsePush(entry.healthy, failures, counted)


def decide(state: GateState, entry: PushEntry | None, hold_until: float, now: float,
           period_s: float | None) -> StartProbe | Wait | Defer:
    """What a replica's due visit does. ``hold_until`` is the stall guard's deadline
    (0.0 for none), asked only when the push is stale and ``entry`` exists."""
    period = STOCK_HEALTH_CHECK_PERIOD_S if period_s is None else period_s
    if state.probe_started_at is not None:
        return Wait(None)
    fresh_until = stale_at(state, period)
    if fresh_until is not None and now < fresh_until:
        return Wait(fresh_until)
    resolved = state.applied_probe_resolved_at
    if resolved is not None and now < resolved + period:
        return Wait(resolved + period)  # the pull cadence: one probe per period
    if entry is not None and hold_until > now:
        return Defer(min(hold_until, now + HOLD_REVISIT_PERIODS * period))
    return StartProbe()


def start_probe(state: GateState, now: float) -> GateState:
    if state.probe_started_at is not None:
        raise ValueError(f"a probe is already in flight since {state.probe_started_at}")
    return dataclasses.replace(state, probe_started_at=now)


def resolve_probe(state: GateState, outcome: ProbeOutcome, newest_push_received_at: float | None,
                  now: float) -> tuple[GateState, Apply | Drop]:
    """Act on a finished probe unless a push arrived after it started.

    ``newest_push_received_at`` is the registry's newest arrival, consumed or not: a push
    that arrived during the probe wins even if the tick that applies it is the next one.
    """
    started = state.probe_started_at
    if started is None:
        raise ValueError("no probe in flight")
    state = dataclasses.replace(state, probe_started_at=None)
    crashed = outcome.result is ProbeResult.ACTOR_CRASHED
    if not crashed and newest_push_received_at is not None and newest_push_received_at > started:
        return state, Drop("a newer push arrived while the probe was in flight")
    healthy = outcome.result is ProbeResult.HEALTHY
    failures = 0 if healthy else state.failures + 1
    state = dataclasses.replace(state, failures=failures, applied_probe_started_at=started,
                                applied_probe_resolved_at=now)
    return state, Apply(healthy, failures, 0 if healthy else 1, crashed, outcome.message)
