"""Admission at an admission point, and the Retry-After of its rejections.

An admission point is where a request is let in or shed: a router (per process and
deployment: it queues and places requests on replicas) or a direct-ingress replica in
haproxy mode (its own slots: it lets a request in while its ongoing + queued requests are
under ``max_ongoing_requests + max_queued_requests``). Both shed the same way: the
deployment's ``status_code`` and the Retry-After of its ``retry_after_policy``
(``retry_after``), computed from this point's own drain and arrival rates, and for
``cluster_informed`` from the total the owning shard publishes (a direct-ingress replica
hears none, so it computes ``arrival_aware``, as a router does without a fresh total).

- ``RetryAdvisor``: the rates, the retries already promised per second, the cluster
  total; O(1) per call, time passed in, never raises on the rejection path.
- ``SlotAdmission``: a direct-ingress replica's gate over its slot count.
"""

from __future__ import annotations

import heapq
import math
import random
from typing import Callable

from controlplane.clock import Clock
from controlplane.errors import BackpressureError
from controlplane.routing.retry_after import DrainRateEstimator, RetrySchedule, retry_after_s
from controlplane.routing.routing_config import RoutingConfig
from controlplane.wire import ClusterDemand, RouterDemand


class RetryAdvisor:
    """The Retry-After state of one admission point."""

    def __init__(self) -> None:
        self.drain = DrainRateEstimator()  # admissions per second: how fast the queue drains
        self.arrivals = DrainRateEstimator()  # every request reaching this point
        self._schedule = RetrySchedule()  # retries promised per second (arrival_aware)
        self._cluster: ClusterDemand | None = None  # cluster_informed: the shard's total
        self._cluster_at = -math.inf
        self.last_s: int | None = None  # the last value told, for statistics
        # when each request told to come back from zero is due back (a heap): demand
        # until then (its deployment must wake for it as for one held)
        self._returning: list[float] = []

    def heard_total(self, demand: ClusterDemand, now: float) -> None:
        """The owning shard published the deployment's total (a new one restarts its age)."""
        if demand is not self._cluster:
            self._cluster, self._cluster_at = demand, now

    def cold_eta_s(self, now: float) -> float | None:
        """Seconds until the first replica of a deployment at zero should be RUNNING, from
        the shard's latest total (its measured start time, less the age of the start and
        of the total); None when the shard has said nothing of one."""
        cluster = self._cluster
        if cluster is None or cluster.scaleup_eta_s is None:
            return None
        return max(0.0, cluster.scaleup_eta_s - (now - self._cluster_at))

    def reject_cold(self, config: RoutingConfig, eta_s: float | None, held_s: float,
                    queued: int, now: float) -> BackpressureError:
        """A request at a deployment with no replica yet: told when to come back: half a
        hold before the replica is expected (a start runs longer or shorter than the
        measured average; back a little early, the request is held until the replica
        answers, where one back late would wait for nothing); a quarter of a hold while no
        start is measured yet (the first ever: back soon, to be held again)."""
        hold = config.cold_hold_s or 0.0
        due = eta_s - hold / 2 if eta_s is not None else hold / 4
        value = max(1, math.ceil(due))
        self.last_s = value
        heapq.heappush(self._returning, now + value)
        waited = f"waited {held_s:.0f} s; " if held_s > 0 else ""
        return BackpressureError(
            config.status_code, value,
            f"deployment {config.deployment} is starting from zero replicas ({waited}"
            f"{queued} requests waiting for it); retry after {value} s")

    def demand(self, queued: int, now: float) -> RouterDemand:
        """What this point reports toward the total (``demand_board``): its queued
        requests and those it told to come back from zero that are not due yet (a
        deployment at zero that counted only the held would size its wake for the few
        that arrived since the last hint; on the day trace it woke with one replica for
        thirteen requests)."""
        returning = self._returning
        while returning and returning[0] <= now:
            heapq.heappop(returning)
        return RouterDemand(queued + len(returning), self.drain.rate_per_s(now) or 0.0,
                            self.arrivals.rate_per_s(now) or 0.0)

    def reject(self, config: RoutingConfig, queued: int, occupancy: float,
               backoff_streak: int, rng: random.Random, now: float) -> BackpressureError:
        """The rejection of a request that found ``queued`` requests ahead of it."""
        value = retry_after_s(
            config.retry_after_policy, queue_depth=queued, estimator=self.drain,
            occupancy=occupancy, backoff_streak=backoff_streak, static_s=config.retry_after_s,
            rng=rng, now=now, arrivals=self.arrivals, schedule=self._schedule,
            demand=self._cluster, demand_age_s=now - self._cluster_at)
        self.last_s = value
        hint = "" if value is None else f"; retry after {value} s"
        return BackpressureError(
            config.status_code, value,
            f"deployment {config.deployment} is overloaded: {queued} requests already "
            f"queued (max_queued_requests={config.max_queued_requests}){hint}")


class SlotAdmission:
    """A direct-ingress replica's admission: ``max_ongoing_requests`` slots run, up to
    ``max_queued_requests`` more wait for one (-1: unlimited); a request beyond them is
    rejected at once, as a router rejects. ``load()`` is the replica's ongoing + queued
    requests; ``rng`` jitters the computed Retry-After."""

    def __init__(self, config: RoutingConfig, load: Callable[[], int], clock: Clock,
                 rng: random.Random | None = None) -> None:
        self._config, self._load, self._clock = config, load, clock
        self._rng = rng if rng is not None else random.Random()
        self.retry = RetryAdvisor()

    def full(self) -> bool:
        queued = self._config.max_queued_requests
        return 0 <= queued and self._load() >= self._config.max_ongoing_requests + queued

    def admit(self) -> None:
        """Count the request in; raise ``BackpressureError`` when there is no room."""
        now = self._clock.monotonic()
        self.retry.arrivals.record_assignment(now)
        if self.full():
            config, load = self._config, self._load()
            raise self.retry.reject(config, max(0, load - config.max_ongoing_requests),
                                    min(1.0, load / config.max_ongoing_requests), 0,
                                    self._rng, now)
        self.retry.drain.record_assignment(now)
