"""The ``Retry-After`` value a router sends with a backpressure rejection.

Owns the two policies of seed 002 ("Computed Retry-After for backpressure rejections"),
and two of fleetplane's own: ``arrival_aware`` (below: ``RetrySchedule``) and
``cluster_informed``:

- ``static``: the operator's ``retry_after_s``, rounded up, or no header.
- ``router_queue_drain_rate``: ``ceil(own_queue_depth / drain_rate * saturation_factor)``,
  jittered +-20%, clamped to [1, 60] s; falls back to ``static`` while the drain-rate EWMA
  is cold, then to no header.

Invariants (the seed's goals): everything here is pure and O(1), so the rejection path
stays as cheap as a static header (no RPC, no lock, no walk over replicas); a policy never
raises and never delays a rejection, it only downgrades along the fallback ladder. Time
(``now``) and randomness (``rng``) are passed in.

Values are RFC 9110 section 10.2.3 ``delay-seconds``: a non-negative integer, so a
fractional estimate is rounded *up* (a client that retries early meets another rejection).
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Callable, Literal, get_args

if TYPE_CHECKING:
    from controlplane.wire import ClusterDemand

RetryAfterPolicy = Literal["static", "router_queue_drain_rate", "arrival_aware",
                           "cluster_informed"]
POLICIES: tuple[str, ...] = get_args(RetryAfterPolicy)

# Seed 002's implementation constants: the factor is bounded to [1, 1.5].
SATURATION_STREAK_B = 5
SATURATION_W_OCCUPANCY = 0.25
SATURATION_W_BACKOFF = 0.25
# Common client SDKs ignore Retry-After above 60 s and fall back to their own backoff, so
# larger values communicate nothing (seed 002, "Clamp to [1, 60] seconds").
MIN_RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 60
# Server-side jitter: equal values across routers would make clients retry in sync, a
# thundering herd one Retry-After later; AWS documents jitter as the service's job.
JITTER_FRACTION = 0.2


def check_policy(name: str) -> RetryAfterPolicy:
    """``name`` if it is a known policy; else ValueError naming the field and the choices."""
    if name not in POLICIES:
        raise ValueError(f"backpressure_config.retry_after_policy: unknown policy {name!r}; "
                         f"use one of {', '.join(POLICIES)}")
    return name  # type: ignore[return-value]


class DrainRateEstimator:
    """EWMA of this router's assignment throughput, in requests per second.

    Fed with ``record_assignment(now)`` at each assignment, O(1). Time is cut into
    ``interval_s`` intervals; when one closes, ``rate = alpha * count / interval_s +
    (1 - alpha) * rate``, and k empty intervals decay the rate by ``(1 - alpha) ** k`` in
    one step (no per-interval loop after an idle spell). The first interval with traffic
    seeds the EWMA with its own sample instead of averaging against zero, so a warm
    estimate is not biased low. Warm (``rate_per_s`` not None) once ``min_warm_intervals``
    intervals had traffic; cold again after ``stale_after_s`` without an assignment, so a
    burst after a long idle spell gets the static fallback instead of a rate decayed to ~0.
    """

    def __init__(self, alpha: float = 0.3, interval_s: float = 1.0, min_warm_intervals: int = 3,
                 stale_after_s: float = 10.0) -> None:
        if not 0 < alpha <= 1 or interval_s <= 0 or min_warm_intervals < 1:
            raise ValueError("DrainRateEstimator needs 0 < alpha <= 1, interval_s > 0 and "
                             "min_warm_intervals >= 1")
        self._alpha = alpha
        self._interval_s = interval_s
        self._min_warm = min_warm_intervals
        self._stale_after_s = stale_after_s
        self._reset()

    def _reset(self) -> None:
        self._interval_start: float | None = None
        self._count = 0  # assignments in the open interval
        self._rate: float | None = None  # None until the first interval with traffic closed
        self._traffic_intervals = 0
        self._last_assignment_at: float | None = None

    def record_assignment(self, now: float) -> None:
        if self._last_assignment_at is not None and self._is_stale(now):
            self._reset()
        self._roll(now)
        if self._interval_start is None:
            self._interval_start = now
        self._count += 1
        self._last_assignment_at = now

    def rate_per_s(self, now: float) -> float | None:
        """The smoothed drain rate, or None while cold (too little or too old traffic)."""
        self._roll(now)
        if self._last_assignment_at is None or self._is_stale(now):
            return None
        if self._traffic_intervals < self._min_warm:
            return None
        return self._rate

    def _is_stale(self, now: float) -> bool:
        return now - self._last_assignment_at > self._stale_after_s

    def _roll(self, now: float) -> None:
        """Close every interval that ended before ``now``."""
        if self._interval_start is None:
            return
        closed = int((now - self._interval_start) // self._interval_s)
        if closed <= 0:
            return
        sample = self._count / self._interval_s
        if self._rate is None:
            self._rate = sample if self._count else None
        else:
            self._rate = self._alpha * sample + (1 - self._alpha) * self._rate
        if self._count:
            self._traffic_intervals += 1
        if self._rate is not None:
            self._rate *= (1 - self._alpha) ** (closed - 1)  # the empty intervals after it
        self._interval_start += closed * self._interval_s
        self._count = 0


def saturation_factor(occupancy: float, backoff_streak: int) -> float:
    """``1 + w1 * occupancy + w2 * min(streak / B, 1)``, in [1, 1.5] (seed 002).

    ``occupancy`` is the sum of known replica queue lengths over fleet capacity; it reads
    "full" whenever backpressure fires, so it only nudges; the drain rate carries the
    estimate.
    """
    occupancy = min(1.0, max(0.0, occupancy))
    backoff = min(max(backoff_streak, 0) / SATURATION_STREAK_B, 1.0)
    return 1.0 + SATURATION_W_OCCUPANCY * occupancy + SATURATION_W_BACKOFF * backoff


def static_retry_after_s(static_s: float | None) -> int | None:
    """The operator's value as RFC 9110 delay-seconds (rounded up), or None: no header."""
    if static_s is None:
        return None
    return max(0, math.ceil(static_s))


def compute_retry_after_s(queue_depth: int, estimator: DrainRateEstimator, occupancy: float,
                          backoff_streak: int, static_s: float | None, rng: random.Random,
                          now: float) -> int | None:
    """``router_queue_drain_rate``, with seed 002's fallback ladder.

    computed (estimator warm, rate > 0) -> static ``retry_after_s`` -> None (no header).
    ``queue_depth`` is the number of requests already queued at this router, ahead of the
    rejected one. Jitter is applied before rounding up and clamping.
    """
    rate = estimator.rate_per_s(now)
    if rate is None or not rate > 0 or not math.isfinite(rate):
        return static_retry_after_s(static_s)
    estimate = max(queue_depth, 0) / rate * saturation_factor(occupancy, backoff_streak)
    jittered = estimate * rng.uniform(1 - JITTER_FRACTION, 1 + JITTER_FRACTION)
    if not math.isfinite(jittered):
        return MAX_RETRY_AFTER_S
    return min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, math.ceil(jittered)))


# ---- arrival_aware -----------------------------------------------------------------
# A Retry-After that books each rejected client a future second with room for it.
#
# Why: seed 002's ``router_queue_drain_rate`` estimates when *this queue* drains and tells
# every rejected client about the same small number, so under sustained overload they all
# come back into the same full queue. Here the router also knows its arrival rate, and it
# remembers how many retries it has already sent to each of the next 60 seconds:
#
# - the room a second has for retries is what the drain rate leaves after the fresh
#   arrivals expected in it (arrivals minus the retries already due then), never less than
#   ``MIN_SPARE_FRACTION`` of the drain rate, so some retries are always placed;
# - a rejected client gets the first second, from when its place in the queue would have
#   come up (queue depth / drain rate, jittered), whose booked retries are below that room;
# - when every second up to the 60 s clamp is booked, it is told 60: "later", honestly.
#
# Seed 002's invariants hold for it too: pure, O(1) (at most 61 slots per rejection), no
# RPC, no lock, never raises, the same fallback ladder while the drain rate is cold.

MIN_SPARE_FRACTION = 0.25  # of the drain rate: room always left for retries, per second


class RetrySchedule:
    """Retries promised to each of the next ``MAX_RETRY_AFTER_S`` seconds (a ring)."""

    def __init__(self) -> None:
        self._slots = [0] * (MAX_RETRY_AFTER_S + 1)
        self._base: int | None = None  # the absolute second slot 0 stands for

    def _roll(self, now: float) -> int:
        second = math.floor(now)
        if self._base is None or second - self._base > MAX_RETRY_AFTER_S:
            self._slots = [0] * (MAX_RETRY_AFTER_S + 1)
        else:
            for _ in range(second - self._base):  # at most 61: seconds that passed
                self._slots.pop(0)
                self._slots.append(0)
        self._base = second
        return second

    def due_now(self, now: float) -> int:
        """Retries told to come back in the current second."""
        self._roll(now)
        return self._slots[0]

    def book(self, now: float, earliest_s: int, room: float | Callable[[int], float]) -> int:
        """The first delay >= ``earliest_s`` whose second has fewer than ``room`` (or
        ``room(delay)``) retries booked, booked; the clamp when none has."""
        self._roll(now)
        room_at = room if callable(room) else (lambda _delay: room)
        for delay in range(max(earliest_s, MIN_RETRY_AFTER_S), MAX_RETRY_AFTER_S + 1):
            if self._slots[delay] < room_at(delay):
                self._slots[delay] += 1
                return delay
        self._slots[MAX_RETRY_AFTER_S] += 1
        return MAX_RETRY_AFTER_S


def _earliest_s(wait_s: float, rng: random.Random) -> int:
    """The first second a retry may be booked in: ``wait_s`` jittered, rounded up, clamped."""
    wait_s *= rng.uniform(1 - JITTER_FRACTION, 1 + JITTER_FRACTION)
    return min(MAX_RETRY_AFTER_S, math.ceil(wait_s)) if math.isfinite(wait_s) else \
        MAX_RETRY_AFTER_S


def arrival_aware_retry_after_s(queue_depth: int, drain: DrainRateEstimator,
                                arrivals: DrainRateEstimator, schedule: RetrySchedule,
                                static_s: float | None, rng: random.Random,
                                now: float) -> int | None:
    rate = drain.rate_per_s(now)
    if rate is None or not rate > 0 or not math.isfinite(rate):
        return static_retry_after_s(static_s)
    arriving = arrivals.rate_per_s(now) or 0.0
    fresh = max(0.0, arriving - schedule.due_now(now)) if math.isfinite(arriving) else rate
    room = max(rate - fresh, MIN_SPARE_FRACTION * rate)
    earliest = _earliest_s(max(queue_depth, 0) / rate, rng)
    return schedule.book(now, earliest, room)


# ---- cluster_informed (the totals: ``controlplane.deployment.demand_board``) ---------
FRESH_FOR_S = 5.0  # a router trusts a published total this long, then its own figures


def cluster_informed_retry_after_s(queue_depth: int, drain: DrainRateEstimator,
                                   arrivals: DrainRateEstimator, schedule: RetrySchedule,
                                   demand: ClusterDemand | None, demand_age_s: float,
                                   static_s: float | None, rng: random.Random,
                                   now: float) -> int | None:
    """``arrival_aware`` over the whole deployment: the wait is everyone's queue over
    everyone's drain rate (shortened by a scale-up that completes before it ends), and
    this router books its share (its arrivals over everyone's) of each second's room.
    Without a fresh total, exactly ``arrival_aware`` on this router's own figures."""
    if demand is None or demand_age_s > FRESH_FOR_S or not demand.drain_per_s > 0:
        return arrival_aware_retry_after_s(queue_depth, drain, arrivals, schedule, static_s,
                                           rng, now)
    rate = demand.drain_per_s
    own = arrivals.rate_per_s(now)
    share = min(1.0, own / demand.arrivals_per_s) if own and demand.arrivals_per_s > 0 \
        else 0.0
    if not share > 0:  # this router's arrivals unknown: an equal share
        share = 1.0 / max(1, demand.routers)
    wait = max(demand.queued, queue_depth, 0) / rate
    eta, growth = demand.scaleup_eta_s, max(1.0, demand.capacity_growth)
    if eta is not None and wait > eta:  # the queue left at eta drains faster
        wait = eta + (wait - eta) / growth
    earliest = _earliest_s(wait, rng)
    fresh = max(0.0, demand.arrivals_per_s - schedule.due_now(now) / share)

    def room(delay: int) -> float:
        capacity = rate * (growth if eta is not None and delay >= eta else 1.0)
        return share * max(capacity - fresh, MIN_SPARE_FRACTION * capacity)
    return schedule.book(now, earliest, room)


def retry_after_s(policy: RetryAfterPolicy, queue_depth: int, estimator: DrainRateEstimator,
                  occupancy: float, backoff_streak: int, static_s: float | None,
                  rng: random.Random, now: float, arrivals: DrainRateEstimator | None = None,
                  schedule: RetrySchedule | None = None, demand: ClusterDemand | None = None,
                  demand_age_s: float = math.inf) -> int | None:
    """The value for ``policy``; the rejection path's single entry point. Never raises:
    an estimator in a state nobody foresaw downgrades to the static value."""
    try:
        if policy == "router_queue_drain_rate":
            return compute_retry_after_s(queue_depth, estimator, occupancy, backoff_streak,
                                         static_s, rng, now)
        if policy == "arrival_aware" and arrivals is not None and schedule is not None:
            return arrival_aware_retry_after_s(queue_depth, estimator, arrivals, schedule,
                                               static_s, rng, now)
        if policy == "cluster_informed" and arrivals is not None and schedule is not None:
            return cluster_informed_retry_after_s(queue_depth, estimator, arrivals, schedule,
                                                  demand, demand_age_s, static_s, rng, now)
    except Exception:  # the rejection path must answer, whatever the estimators hold
        pass
    return static_retry_after_s(static_s)

