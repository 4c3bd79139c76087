"""``cluster_informed`` (seed 002's future policy): what every router of a
deployment learns from the control plane to advise its rejected clients.

One router sees only its own queue and its own share of the traffic. Behind several
proxies (or handles in several processes) the queue that a retry meets is everyone's,
and during a scale-up the capacity it meets grows when the new replicas come up. So:

- each router reports, at most once per second (``RoutingSubscriber``) and only while it has
  demand (plus one report when it drops to none), its queue depth, its drain rate and
  its arrival rate to the deployment's shard (``RouterDemand``, one small call, never on
  the request path);
- the shard sums the fresh reports (``DemandBoard``), adds what it knows of a scale-up (the
  expected seconds until the replicas now starting are RUNNING, from the start times it
  observed, and the capacity they add), and publishes the total (``ClusterDemand``) over
  the routing long-poll at most once per ``PUBLISH_INTERVAL_S``, only when it changed;
- a router folds it into ``arrival_aware``'s booking
  (``retry_after.cluster_informed_retry_after_s``).

Everything on the rejection path stays pure and O(1) (seed 002's invariants).
"""

from __future__ import annotations

import math

from controlplane.deployment.lifecycle import ReplicaState
from controlplane.deployment.replica_set import ReplicaSet
from controlplane.wire import ClusterDemand, RouterDemand

PUBLISH_INTERVAL_S = 1.0  # the shard's publications, while the total changes
REPORT_TTL_S = 3.0  # a router silent this long has no demand (it stopped, or died)
START_ALPHA = 0.2  # EWMA weight of the latest start duration
EMPTY = ClusterDemand(0, 0.0, 0.0, 0)


class DemandBoard:
    """The shard's side, one per deployment: the latest report of each of its routers, and
    how long its replicas took to start."""

    def __init__(self) -> None:
        self._reports: dict[str, tuple[RouterDemand, float]] = {}
        self._published: ClusterDemand | None = None
        self._checked_at = -math.inf
        self.start_s: float | None = None  # EWMA of observed start durations

    def record(self, router_id: str, demand: RouterDemand, now: float) -> None:
        self._reports[router_id] = (demand, now)

    def note_start(self, duration_s: float) -> None:
        """A replica went from created to RUNNING in ``duration_s``."""
        if math.isfinite(duration_s) and duration_s >= 0:
            self.start_s = duration_s if self.start_s is None else \
                (1 - START_ALPHA) * self.start_s + START_ALPHA * duration_s

    def queued(self, now: float) -> int:
        """Requests queued at the routers now (fresh reports only): for a deployment at
        zero, the load that wakes it. O(routers), once per autoscaling decision."""
        return sum(d.queued for d, at in self._reports.values() if now - at <= REPORT_TTL_S)

    def total(self, now: float, replicas: ReplicaSet | None = None) -> ClusterDemand | None:
        """The sum of fresh reports (stale ones are dropped), with the scale-up outlook of
        ``replicas``; None when no router has reported."""
        for router_id in [r for r, (_, at) in self._reports.items() if now - at > REPORT_TTL_S]:
            del self._reports[router_id]
        live = [d for d, _ in self._reports.values()]
        if not live:
            return None
        eta, growth = self._outlook(now, replicas) if replicas is not None else (None, 1.0)
        return ClusterDemand(sum(d.queued for d in live),
                             _rounded(sum(d.drain_per_s for d in live)),
                             _rounded(sum(d.arrivals_per_s for d in live)), len(live), eta,
                             growth)

    def to_publish(self, now: float, replicas: ReplicaSet | None = None) -> ClusterDemand | None:
        """The total when it changed since it was last published; looked at once per
        ``PUBLISH_INTERVAL_S`` at most (the shard asks every tick); None otherwise. The
        routers' demand dropping to none is published once, as an empty total."""
        if (not self._reports and self._published is None) or \
                now - self._checked_at < PUBLISH_INTERVAL_S:
            return None  # nothing ever reported (O(1)), or looked at within the interval
        self._checked_at = now
        total = self.total(now, replicas) or EMPTY
        if not (total.queued or total.drain_per_s or total.arrivals_per_s):
            total = EMPTY  # idle routers and silent ones say the same: no demand
        if total == (self._published or EMPTY):
            return None
        self._published = total
        return total

    def _outlook(self, now: float, replicas: ReplicaSet) -> tuple[float | None, float]:
        """(seconds until the replicas now starting should be RUNNING, the capacity
        factor they bring), from the observed start times; (None, 1) without a scale-up.
        O(starting replicas), at most once per publication."""
        starting = replicas.records_in(ReplicaState.STARTING)
        running = replicas.count(ReplicaState.RUNNING)
        if self.start_s is None or not starting:
            return None, 1.0
        oldest_age = now - min(r.started_at for r in starting)
        eta = round(max(0.0, self.start_s - oldest_age), 1)
        # from zero: when the first should answer (``Router._wait_cold``), no growth factor
        return eta, round((running + len(starting)) / running, 2) if running else 1.0


def _rounded(rate: float) -> float:
    """Two significant digits: a total that wobbles in its third digit is not news."""
    if not rate > 0 or not math.isfinite(rate):
        return 0.0
    return round(rate, 1 - int(math.floor(math.log10(rate))))
