"""The per-deployment stall guard: mass push staleness reads as ingest lag, not failure.

Owns: the stall verdict of one deployment (a transition table, below), the window tally
of distinct stale replicas that drives it, and each replica's probe-deferral deadline.

Why (seed 000): when most of a deployment's pushes go stale at once the cause is the
controller lagging on ingest, not a mass replica failure, and probing thousands of
"stale" replicas at once drowns the already-lagging controller (reproduced at 16K). So
the guard defers fallback probes, but only for a capped episode, so that a genuine mass
outage still falls through to probes. Actor death detection never passes through here.

Invariants:

- The tally counts each replica at most once per window and accumulates across ticks
  (seed 000 review fixes: the per-dirty-slice tally only engaged above ~3200 replicas, and
  the undeduplicated one let a small failed cohort, revisited every tick, read as
  fleet-wide lag). ``STALL_MIN_TRACKED`` is 64 *distinct* tracked replicas.
- The window is the deployment's health-check period, or the stock period when the
  caller has none (seed 000 review fix: a deployment without target info must not misread
  every push as stale).
- A hold never outlasts ``episode start + STALL_EPISODE_CAP_S``; each replica's hold ends
  earlier by a deterministic per-replica offset, so the gates do not all open on one tick
  (the storm the deferral exists to avoid). The offset only shortens the hold.
- ``on_stale`` re-stamps the hold on every visit, with 0.0 outside an episode, and an
  episode that ends early returns every held replica from ``advance`` so the owner can
  wake it now: a retracted hold never makes a replica sit out a cap that no longer applies.
- Only replicas that have a registry entry are passed to ``on_stale``: a replica with no
  entry has probes as its only health signal and must not sway the verdict either way.
- ``advance`` is called once per tick, before that tick's ``on_stale`` calls: O(1) unless
  an episode ends early, then O(held) once.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from controlplane.errors import IllegalTransition
from controlplane.health.stats import HealthTotals
from controlplane.specs import DEPLOYMENT_DEFAULTS

# Seed 000: "If >=50% of >=64 tracked replicas are stale in one sweep, the sweep defers
# fallback probes, bounded at 120 s per episode".
STALL_STALE_FRACTION = 0.5
STALL_MIN_TRACKED = 64
STALL_EPISODE_CAP_S = 120.0
# Seed 000: holds are "staggered per replica ... The offset only shortens the hold". A
# quarter of the cap spreads the opening gates over 30 s at the stock cap.
STALL_STAGGER_FRACTION = 0.25
# Seed 000: "The stall window defaults to the stock health-check period".
STOCK_HEALTH_CHECK_PERIOD_S = float(DEPLOYMENT_DEFAULTS["health_check_period_s"])


class GuardState(str, Enum):
    IDLE = "IDLE"  # no verdict: stale replicas are probed as usual
    ENGAGED = "ENGAGED"  # stall verdict: fallback probes held, up to the episode cap
    EXHAUSTED = "EXHAUSTED"  # cap reached while still stalled: probes run until it clears


class GuardEvent(str, Enum):
    CROSSED = "CROSSED"  # >= 50 % of >= 64 tracked replicas stale in the current window
    CLEARED = "CLEARED"  # a window closed below that line
    CAPPED = "CAPPED"  # the episode reached STALL_EPISODE_CAP_S


_S, _E = GuardState, GuardEvent

TRANSITIONS: Mapping[tuple[GuardState, GuardEvent], GuardState] = MappingProxyType({
    (_S.IDLE, _E.CROSSED): _S.ENGAGED,  # a new episode starts
    (_S.IDLE, _E.CLEARED): _S.IDLE,
    (_S.ENGAGED, _E.CROSSED): _S.ENGAGED,  # the same episode goes on
    (_S.ENGAGED, _E.CLEARED): _S.IDLE,  # ended early: holds are retracted
    (_S.ENGAGED, _E.CAPPED): _S.EXHAUSTED,
    # Not straight back to ENGAGED, or a lasting mass outage would be deferred forever.
    (_S.EXHAUSTED, _E.CROSSED): _S.EXHAUSTED,
    (_S.EXHAUSTED, _E.CLEARED): _S.IDLE,
})


def next_state(state: GuardState, event: GuardEvent) -> GuardState:
    """The state ``event`` moves the guard in ``state`` to; raises ``IllegalTransition``."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition("stall-guard", state, event) from None


def is_stall(stale: int, tracked: int) -> bool:
    """The verdict line: at least half of at least 64 distinct tracked replicas stale."""
    return tracked >= STALL_MIN_TRACKED and stale >= STALL_STALE_FRACTION * tracked


def stagger_offset_s(replica_id: str, cap_s: float = STALL_EPISODE_CAP_S) -> float:
    """How much earlier than the cap this replica's hold ends, in [0, cap/4).

    crc32, not hash(): str hashes are salted per process, and a hold must not move when
    the shard restarts.
    """
    return STALL_STAGGER_FRACTION * cap_s * (zlib.crc32(replica_id.encode()) / 2**32)


@dataclass(frozen=True)
class StallStatistics:
    state: GuardState
    episode_started_at: float | None
    stale_in_window: int  # distinct replicas seen stale in the current window
    held: int  # replicas holding a deferral in the current episode
    window_s: float


class StallGuard:
    """The stall verdict and the probe holds of one deployment."""

    def __init__(self, window_s: float | None = None, totals: HealthTotals | None = None,
                 cap_s: float = STALL_EPISODE_CAP_S) -> None:
        self._totals = totals if totals is not None else HealthTotals()
        self._cap_s = cap_s
        self._window_s = STOCK_HEALTH_CHECK_PERIOD_S
        self.set_window(window_s)
        self._state = GuardState.IDLE
        self._window_start: float | None = None
        self._stale: set[str] = set()
        self._held: set[str] = set()
        self._episode_started_at: float | None = None

    def set_window(self, window_s: float | None) -> None:
        """The deployment's health-check period; None (unknown) means the stock one."""
        if window_s is not None and window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self._window_s = STOCK_HEALTH_CHECK_PERIOD_S if window_s is None else window_s

    @property
    def window_s(self) -> float:
        return self._window_s

    @property
    def state(self) -> GuardState:
        return self._state

    def advance(self, now: float, tracked: int) -> tuple[str, ...]:
        """Once per tick: enforce the cap and close the window if it ended.

        Returns the replicas whose holds were retracted because the episode ended early.
        """
        self._cap_if_due(now)
        if self._window_start is None:
            self._window_start = now
            return ()
        if now - self._window_start < self._window_s:
            return ()
        crossed = is_stall(len(self._stale), tracked)
        self._stale.clear()
        self._window_start = now
        return self._fire(GuardEvent.CROSSED if crossed else GuardEvent.CLEARED, now)

    def on_stale(self, replica_id: str, now: float, tracked: int) -> float:
        """Tally a stale replica (one with a registry entry) and return its hold deadline:
        probes wait until then; 0.0 when nothing is held."""
        if self._window_start is None:
            self._window_start = now
        self._stale.add(replica_id)
        self._cap_if_due(now)
        if self._state is GuardState.IDLE and is_stall(len(self._stale), tracked):
            self._fire(GuardEvent.CROSSED, now)  # engage mid-window, not a window late
        if self._state is not GuardState.ENGAGED:
            return 0.0
        self._held.add(replica_id)
        return self._episode_started_at + self._cap_s - stagger_offset_s(replica_id, self._cap_s)

    def forget(self, replica_id: str) -> None:
        self._stale.discard(replica_id)
        self._held.discard(replica_id)

    def statistics(self) -> StallStatistics:
        return StallStatistics(self._state, self._episode_started_at, len(self._stale),
                               len(self._held), self._window_s)

    def _cap_if_due(self, now: float) -> None:
        if (self._state is GuardState.ENGAGED
                and now >= self._episode_started_at + self._cap_s):
            self._fire(GuardEvent.CAPPED, now)

    def _fire(self, event: GuardEvent, now: float) -> tuple[str, ...]:
        old, new = self._state, next_state(self._state, event)
        self._state = new
        if old is not GuardState.ENGAGED and new is GuardState.ENGAGED:
            self._episode_started_at = now
            self._totals.stall_episodes_total += 1
            return ()
        if new is GuardState.ENGAGED:
            return ()
        # Not ENGAGED now. At the cap every hold has already ended (none is later than the
        # cap); ending early is the one case that must hand the holds back.
        ended_early = old is GuardState.ENGAGED and new is GuardState.IDLE
        retracted = tuple(sorted(self._held)) if ended_early else ()
        self._held.clear()
        if new is GuardState.IDLE:
            self._episode_started_at = None
        return retracted
