"""The controller's record of the health replicas push, one registry per deployment.

Owns:

- ``PushedHealth``: the three health fields a replica pushes, on its metric report or on a
  heartbeat (the wire shape, shared with ``replicas.health_pusher``).
- ``PushEntry``: the newest push of one replica and when it arrived (updated in place by
  the next newer push: a steady push allocates nothing here).
- ``HealthPushRegistry``: newest entry per replica, the dirty set of replicas whose
  newest entry the reconcile tick has not consumed yet, and rate-limited pruning.

Invariants:

- Newest wins by ``checked_at`` (the replica's own monotonic clock, so comparable only
  between entries of the same replica): an out-of-order or repeated arrival never replaces
  a newer entry, never marks the replica dirty and never moves ``received_at`` (seed 000:
  "out-of-order arrivals resolved by checked_at").
- ``received_at`` is the shard's monotonic time of the arrival that brought the entry;
  the probe gate anchors freshness on it, never on when a tick consumed the entry.
- Ingest is O(1) per push. Pruning walks the entries at most once per
  ``PRUNE_INTERVAL_S`` (seed 000 review fix: the over-threshold prune re-ran an O(N)
  rebuild on every record() once all entries were fresh).
- A replica is in the dirty set iff its newest entry arrived after the last
  ``take_dirty`` and the caller did not act on it at once (``take_steady``);
  ``forget`` and pruning remove it from both.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.health.stats import HealthTotals
from controlplane.wire import PushedHealth, ReportRow

# Seed 000 review fix: "Registry pruning is rate-limited to once per 30s".
PRUNE_INTERVAL_S = 30.0
# An entry not refreshed for this long belongs to a replica the shard forgot to
# ``forget``. Well past the 120 s stall-episode cap, so a lagging controller does not
# prune the very entries the stall guard counts as tracked; the owner raises it to a few
# health periods when the period is long.
DEFAULT_RETENTION_S = 300.0
_NONE: list = []  # no row refused (never appended to)


@dataclass(slots=True)
class PushEntry:
    """The pushed fields themselves, not a ``PushedHealth``: a steady push updates one in
    place and allocates nothing; ``health`` builds one for the slow path."""

    healthy: bool
    checked_at: float  # the replica's own clock
    consecutive_failures: int
    error: str
    received_at: float  # shard monotonic time of the arrival that brought this entry

    @classmethod
    def of(cls, health: PushedHealth, received_at: float) -> PushEntry:
        return cls(health.healthy, health.checked_at, health.consecutive_failures,
                   health.error, received_at)

    @property
    def health(self) -> PushedHealth:
        return PushedHealth(self.healthy, self.checked_at, self.consecutive_failures,
                            self.error)


@dataclass(frozen=True)
class RegistryStatistics:
    """One deployment's registry; the shard-wide counters live in ``HealthTotals``."""

    tracked: int  # replicas with an entry
    dirty: int  # entries not consumed by a tick yet
    prune_passes: int  # O(N) walks so far: at most one per PRUNE_INTERVAL_S


class HealthPushRegistry:
    """Newest pushed health per replica of one deployment."""

    def __init__(self, totals: HealthTotals | None = None,
                 retention_s: float = DEFAULT_RETENTION_S) -> None:
        if retention_s <= 0:
            raise ValueError(f"retention_s must be > 0, got {retention_s}")
        self._totals = totals if totals is not None else HealthTotals()
        self._retention_s = retention_s
        self._entries: dict[str, PushEntry] = {}
        self._dirty: dict[str, None] = {}  # insertion-ordered set
        self._last_prune_at: float | None = None
        self._prune_passes = 0
        self._intervals: list[float] = []  # take_steady's scratch, reused: no list per batch

    @property
    def tracked(self) -> int:
        """Replicas with an entry: the stall guard's denominator."""
        return len(self._entries)

    def statistics(self) -> RegistryStatistics:
        return RegistryStatistics(len(self._entries), len(self._dirty), self._prune_passes)

    def set_retention(self, retention_s: float) -> None:
        self._retention_s = max(retention_s, DEFAULT_RETENTION_S)

    def record(self, replica_id: str, health: PushedHealth, received_at: float,
               via_heartbeat: bool = False) -> bool:
        """Take one push; True when it became the replica's newest entry."""
        return self.record_values(replica_id, health.healthy, health.checked_at,
                                  health.consecutive_failures, health.error, received_at,
                                  via_heartbeat)

    def record_values(self, replica_id: str, healthy: bool, checked_at: float,
                      failures: int, error: str, received_at: float,
                      via_heartbeat: bool = False) -> bool:
        """``record`` of a push's fields (a batch row carries no ``PushedHealth``)."""
        totals = self._totals
        totals.pushes_total += 1
        if via_heartbeat:
            totals.heartbeats_total += 1
        if self._last_prune_at is None or received_at - self._last_prune_at >= PRUNE_INTERVAL_S:
            self._prune(received_at)
        old = self._entries.get(replica_id)
        if old is None:
            self._entries[replica_id] = PushEntry(healthy, checked_at, failures, error,
                                                  received_at)
        elif checked_at <= old.checked_at:
            return False  # out of order, or the same result carried twice
        else:  # in place: one push, no allocation
            # Arrival-to-arrival of fresh results: what the 1.5x freshness window is
            # measured against, and it widens with controller ingest lag.
            totals.intervals.record(max(0.0, received_at - old.received_at), received_at)
            old.healthy, old.checked_at, old.consecutive_failures = healthy, checked_at, failures
            old.error, old.received_at = error, received_at
        self._dirty[replica_id] = None
        return True

    def take_steady(self, rows: list[ReportRow], received_at: float) -> list[ReportRow]:
        """The steady path of pushes that ``DeploymentHealth`` found steady for its gate
        (healthy, at most one row per replica): each whose entry is healthy and older is
        advanced in place and its interval recorded, as ``record_values`` would, but not
        marked dirty (the caller acts on it at once). Returns the rows refused, untouched,
        for the general path (usually none)."""
        entries, intervals, refused = self._entries, self._intervals, None
        for row in rows:
            checked_at = row.checked_at
            entry = entries.get(row.replica_id)
            try:
                steady = entry is not None and entry.healthy and checked_at > entry.checked_at
            except TypeError:  # a malformed time: the general path says why
                steady = False
            if not steady:
                if refused is None:
                    refused = []
                refused.append(row)
                continue
            interval = received_at - entry.received_at
            intervals.append(interval if interval > 0.0 else 0.0)
            entry.checked_at, entry.received_at = checked_at, received_at
        if intervals:
            if received_at - self._last_prune_at >= PRUNE_INTERVAL_S:  # as any push prunes
                self._prune(received_at)
            self._totals.pushes_total += len(intervals)
            self._totals.intervals.record_many(intervals, received_at)
            intervals.clear()
        return refused if refused is not None else _NONE

    def get(self, replica_id: str) -> PushEntry | None:
        return self._entries.get(replica_id)

    def take_dirty(self) -> list[str]:
        """Replicas whose newest entry arrived since the last call, in arrival order."""
        dirty, self._dirty = list(self._dirty), {}
        return dirty

    def mark_dirty(self, replica_id: str) -> None:
        """Offer an existing entry to the next tick again (a replica just started to be
        watched); no-op without an entry."""
        if replica_id in self._entries:
            self._dirty[replica_id] = None

    def forget(self, replica_id: str) -> None:
        self._entries.pop(replica_id, None)
        self._dirty.pop(replica_id, None)

    def _prune(self, now: float) -> None:
        self._last_prune_at = now
        self._prune_passes += 1
        horizon = now - self._retention_s
        for replica_id in [r for r, e in self._entries.items() if e.received_at < horizon]:
            self.forget(replica_id)
