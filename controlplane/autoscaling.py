"""Replica metric reports and the autoscaling decision.

Owns:

- ``MetricReport``: the shape of the periodic report a replica sends its shard, with the
  replica's pushed health (``PushedHealth``) riding on it.
- ``MetricWindow``: per deployment, the recent reports of each replica and the load
  averaged over the look-back period, summed over the replicas the caller says count;
  kept up to date per report and per expiry, so a query never walks the replicas.
- ``AutoscalingPolicy`` / ``ScalingState`` / ``decide``: the pure decision of how many
  replicas a deployment should target, given that load and ``now``. The policy's
  defaults and checks are the deploy schema's (``config.AutoscalingConfig``), not here.

Invariants:

- No I/O and no clock reads here: the shard shell passes ``received_at`` and ``now`` from
  its monotonic ``Clock``. The window is keyed on ``received_at``, never on a replica's
  clock: replica clocks drift, the shard's clock is the one every sample shares.
- A window holds at most ``max_samples_per_replica`` samples per replica, so its memory
  is bounded by the replicas it has not been told to ``forget`` (plus expiry-queue
  entries of the last look-back period).
- The window's total is exact: per-replica load sums are ints, and the sum of their
  means is an int scaled by lcm(1..cap), so no float error accumulates however long it
  runs; the one rounding is the final division.
- ``decide`` never returns a target outside ``[min_replicas, max_replicas]``; bounds apply
  at once, only load-driven changes wait out a delay.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from controlplane.config import AutoscalingConfig
from controlplane.wire import MetricReport

# A ratio within this of a whole number counts as that number: averaging samples adds
# float noise (2.0000000000000004 replicas' worth of load must not start a third).
_RATIO_TOLERANCE = 1e-9


# Upper bound on max_samples_per_replica: the exact total is scaled by lcm(1..cap), an int
# of 90 bits at the default cap of 64 and of 1,479 at this bound.
_MAX_SAMPLES_CAP = 1024

# A held sample: (received_at, seq, replica id, load). The same tuple sits in its
# replica's deque and in the window's expiry queue, so "is it still held?" is identity.
_Sample = tuple[float, int, str, float]


@dataclass(frozen=True)
class WindowStatistics:
    """What a ``MetricWindow`` holds and the work it has done, for tests and profiles."""

    replicas: int  # known (reported or included) and not forgotten
    arrivals: int  # entries of the expiry queue, stale ones included
    entries_walked: int  # since creation: expiry-queue entries popped, plus held
    #                      samples read by a query that could not use the running total


@functools.lru_cache(maxsize=None)
def _scales(cap: int) -> tuple[int, ...]:
    """lcm(1..cap) // n for n in 0..cap (0 for 0): a mean sum/n is sum * scale[n] / lcm,
    exactly. One table per cap, shared by every window."""
    lcm = math.lcm(*range(1, cap + 1))
    return (0, *(lcm // n for n in range(1, cap + 1)))


class _Replica:
    """One replica in a window: its held samples, oldest first, and what its mean adds."""

    __slots__ = ("samples", "total", "odd", "counted", "last_at", "share", "live", "in_odd")

    def __init__(self) -> None:
        self.samples: deque[_Sample] = deque()
        self.total = 0  # sum of the held int loads: an int, so taking one out is exact
        self.odd = 0  # held loads that are not ints (a buggy sender's NaN), summed per query
        self.counted = False  # its mean is part of average_load
        self.last_at = -math.inf  # newest received_at it ever reported
        # What the window's totals hold for it, as of the last ``_refresh``:
        self.share = 0  # its mean times lcm, in the exact total
        self.live = False  # counted and holding a sample
        self.in_odd = False  # live with a non-int load: summed per query instead


def _drop_oldest(rep: _Replica) -> None:
    load = rep.samples.popleft()[3]
    if isinstance(load, int):
        rep.total -= load
    else:
        rep.odd -= 1


class MetricWindow:
    """Recent reports per replica of one deployment, over ``look_back_period_s``, and the
    sum of the mean load of the replicas that count, kept up to date as reports arrive.

    Which replicas count is the caller's to say (``include`` / ``exclude``; the shard
    counts serving replicas): reports of the others are held, and count from the moment
    they are included. Time is the shard's monotonic clock: ``received_at`` never goes
    backwards for a replica, and the window drops every sample older than the newest
    time it has seen (a report or a query) minus the look-back.

    Cost: ``record`` O(1), plus the samples it expires; ``average_load(now)`` O(1), plus
    the samples expired since the last call, when ``now`` is not before a time already
    seen. The rare rest is exact but walks what is held: a report received before another
    replica's newer one costs O(reports since), a query about the past O(held samples),
    and a replica holding a non-int load O(its samples) per query. Means are kept exact
    (int sums scaled by lcm(1..cap)), so the total never drifts from a recount.
    """

    def __init__(self, look_back_period_s: float, max_samples_per_replica: int = 64) -> None:
        if look_back_period_s < 0:
            raise ValueError(f"look_back_period_s must be >= 0, got {look_back_period_s}")
        if not 1 <= max_samples_per_replica <= _MAX_SAMPLES_CAP:
            raise ValueError(f"max_samples_per_replica must be in [1, {_MAX_SAMPLES_CAP}], "
                             f"got {max_samples_per_replica}")
        self._look_back_s = look_back_period_s
        self._max_samples = max_samples_per_replica
        self._scales = _scales(max_samples_per_replica)
        self._replicas: dict[str, _Replica] = {}
        # Every held sample in received_at order (ties: arrival order), to expire from
        # the left; one whose replica dropped it first (cap, forget) is skipped then.
        self._arrivals: deque[_Sample] = deque()
        self._seq = 0
        self._clock = -math.inf  # the newest time seen
        self._scaled = 0  # sum of the live int-only replicas' shares: exact
        self._with_data = 0  # live replicas
        self._odd: dict[str, _Replica] = {}  # live replicas holding a non-int load
        self._walked = 0
        self.membership_known = False  # set by include_only: who counts, all at once

    # ---- who counts ----------------------------------------------------------------------
    def include(self, replica_id: str) -> None:
        """Count this replica's mean from now on (it serves), held samples included."""
        rep = self._replicas.get(replica_id)
        if rep is None:
            rep = self._replicas[replica_id] = _Replica()
        rep.counted = True
        self._refresh(replica_id, rep)

    def exclude(self, replica_id: str) -> None:
        """Stop counting this replica; its samples are kept (it may be included again)."""
        rep = self._replicas.get(replica_id)
        if rep is not None:
            rep.counted = False
            self._refresh(replica_id, rep)

    def include_only(self, replica_ids: Iterable[str]) -> None:
        """Exactly these count: O(known + given), once, for a window new to its caller."""
        for replica_id in list(self._replicas):
            self.exclude(replica_id)
        for replica_id in replica_ids:
            self.include(replica_id)
        self.membership_known = True

    def forget(self, replica_id: str) -> None:
        """Drop a replica's samples (it stopped); unknown ids are ignored."""
        self.exclude(replica_id)
        self._replicas.pop(replica_id, None)

    # ---- reports and the load --------------------------------------------------------------
    def record(self, report: MetricReport, received_at: float) -> None:
        self.record_load(report.replica_id, report.load, received_at)

    def record_load(self, replica_id: str, load: int, received_at: float) -> None:
        """``record`` of a report's replica and load (a batch row builds no report)."""
        rep = self._replicas.get(replica_id)
        if rep is None:
            rep = self._replicas[replica_id] = _Replica()
        if received_at < rep.last_at:
            raise ValueError(
                f"received_at went backwards for {replica_id}: "
                f"{received_at} < {rep.last_at}; pass the shard's monotonic time"
            )
        rep.last_at = received_at
        if received_at > self._clock:
            self._advance(received_at)
        elif received_at < self._clock - self._look_back_s:
            return  # already out of the window
        if len(rep.samples) == self._max_samples:
            _drop_oldest(rep)  # its queue entry is skipped when it comes up
        sample = (received_at, self._seq, replica_id, load)
        self._seq += 1
        rep.samples.append(sample)
        if isinstance(load, int):
            rep.total += load
        else:
            rep.odd += 1
        self._refresh(replica_id, rep)
        if self._arrivals and self._arrivals[-1][0] > received_at:
            self._enqueue_late(sample)
        else:
            self._arrivals.append(sample)

    def average_load(self, now: float) -> float | None:
        """Sum over the counted replicas of each one's mean load within [now - look-back,
        now]. Replicas with no sample there add nothing; None when none has one, so the
        caller can tell "no data" from "no load"."""
        if now < self._clock:
            return self._recount(now)
        if now > self._clock:
            self._advance(now)  # every held sample is now within the window
        if not self._with_data:
            return None
        odd = 0.0
        for rep in self._odd.values():
            self._walked += len(rep.samples)
            odd += self._mean_parts([sample[3] for sample in rep.samples])[1]
        return self._scaled / self._scales[1] + odd

    def statistics(self) -> WindowStatistics:
        return WindowStatistics(len(self._replicas), len(self._arrivals), self._walked)

    # ---- bookkeeping ------------------------------------------------------------------------
    def _refresh(self, replica_id: str, rep: _Replica) -> None:
        """Bring the totals in line with ``rep`` after any change to it: O(1)."""
        n = len(rep.samples)
        # The usual change: it stays counted, held and int-only; only its mean moved.
        if n and rep.live and rep.counted and not (rep.odd or rep.in_odd):
            share = rep.total * self._scales[n]
            self._scaled += share - rep.share
            rep.share = share
            return
        live = rep.counted and n > 0
        share = rep.total * self._scales[n] if live and not rep.odd else 0
        self._scaled += share - rep.share
        rep.share = share
        if live != rep.live:
            self._with_data += 1 if live else -1
            rep.live = live
        in_odd = live and rep.odd > 0
        if in_odd and not rep.in_odd:
            self._odd[replica_id] = rep
        elif rep.in_odd and not in_odd:
            del self._odd[replica_id]
        rep.in_odd = in_odd

    def _advance(self, now: float) -> None:
        """Move the clock forward to ``now``; expire what it leaves behind, each once."""
        self._clock = now
        horizon, arrivals, replicas = now - self._look_back_s, self._arrivals, self._replicas
        walked = 0
        while arrivals and arrivals[0][0] < horizon:
            sample = arrivals.popleft()
            walked += 1
            rep = replicas.get(sample[2])
            if rep is not None and rep.samples and rep.samples[0] is sample:
                _drop_oldest(rep)
                self._refresh(sample[2], rep)
        self._walked += walked

    def _enqueue_late(self, sample: _Sample) -> None:
        """A report received before another replica's newer one: into its place in the
        queue, O(samples received after it). One shard clock never comes here."""
        arrivals, i = self._arrivals, len(self._arrivals)
        while i and arrivals[i - 1][0] > sample[0]:
            i -= 1
        arrivals.insert(i, sample)

    def _recount(self, now: float) -> float | None:
        """``average_load`` for a ``now`` before the clock, from the held samples."""
        start, scaled, odd, seen = now - self._look_back_s, 0, 0.0, False
        for rep in self._replicas.values():
            if not rep.counted:
                continue
            self._walked += len(rep.samples)
            loads = [load for t, _, _, load in rep.samples if start <= t <= now]
            if loads:
                parts = self._mean_parts(loads)
                scaled, odd, seen = scaled + parts[0], odd + parts[1], True
        return scaled / self._scales[1] + odd if seen else None

    def _mean_parts(self, loads: list[float]) -> tuple[int, float]:
        """The mean of ``loads``: exact (times lcm) when all are ints, else a float."""
        if all(isinstance(load, int) for load in loads):
            return sum(loads) * self._scales[len(loads)], 0.0
        return 0, sum(loads) / len(loads)


@dataclass(frozen=True)
class AutoscalingPolicy:
    """A deployment's autoscaling settings, as the decision reads them.

    A plain value: the deploy schema (``config.AutoscalingConfig``) is the one place
    their defaults and checks live, and ``from_config`` is the way in.
    """

    min_replicas: int
    max_replicas: int
    target_ongoing_requests: float  # load (ongoing + queued) each replica should carry
    upscale_delay_s: float  # an upscale must hold this long before it applies
    downscale_delay_s: float  # likewise a downscale; long, since cold starts are costly
    look_back_period_s: float  # window the load is averaged over
    initial_replicas: int | None = None  # first target; None means min_replicas

    @classmethod
    def from_config(cls, cfg: AutoscalingConfig | Mapping[str, Any]) -> AutoscalingPolicy:
        """From the schema's ``AutoscalingConfig``, or a spec's ``autoscaling_config``
        mapping (validated and filled in at build). A mapping is read through the schema
        again, so a partial one gets the schema's defaults and a bad one raises its
        ``ValidationError`` (a ``ValueError``) naming the field, never a guess here.
        """
        model = cfg if isinstance(cfg, AutoscalingConfig) else AutoscalingConfig.model_validate(cfg)
        return cls(**{f.name: getattr(model, f.name) for f in fields(cls)})

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class ScalingState:
    """What the policy remembers between decisions: a change waiting out its delay."""

    pending_target: int | None = None  # newest proposed target, None when nothing waits
    pending_since: float | None = None  # when this direction of change was first seen

    def __post_init__(self) -> None:
        if (self.pending_target is None) != (self.pending_since is None):
            raise ValueError(f"pending_target and pending_since are set together: {self!r}")


_IDLE = ScalingState()


@dataclass(frozen=True)
class ScalingDecision:
    target_replicas: int
    state: ScalingState
    reason: str  # human readable, for status / logs


def initial_target(policy: AutoscalingPolicy) -> int:
    return policy.initial_replicas if policy.initial_replicas is not None else policy.min_replicas


def desired_replicas(policy: AutoscalingPolicy, total_load: float) -> int:
    """Replicas that carry ``total_load`` at the target per replica, within bounds."""
    wanted = max(0, math.ceil(total_load / policy.target_ongoing_requests - _RATIO_TOLERANCE))
    if total_load > 0:
        wanted = max(wanted, 1)  # any load needs a replica, even when min_replicas is 0
    return policy.clamp(wanted)


def decide(
    policy: AutoscalingPolicy,
    current_target: int,
    total_load: float | None,
    state: ScalingState,
    now: float,
) -> ScalingDecision:
    """The target replica count for now, and what to remember for the next call.

    A load-driven change applies only once its direction has held continuously for that
    direction's delay; the newest desired value is the one applied.
    """
    if total_load is not None and total_load < 0:
        raise ValueError(f"total_load must be >= 0, got {total_load}")
    current = policy.clamp(current_target)  # bounds apply at once, with no delay
    if total_load is None:
        return ScalingDecision(current, _IDLE, _no_data_reason(current_target, current))
    desired = desired_replicas(policy, total_load)
    load_note = f"load {total_load:g} / target {policy.target_ongoing_requests:g}"
    if desired == current:
        return ScalingDecision(current, _IDLE, f"{load_note}: steady at {current}")
    if current == 0:
        # Cold start: requests are blocked until a replica exists, so scaling from zero
        # skips the upscale delay (Ray Serve's replica_queue_length_autoscaling_policy).
        return ScalingDecision(desired, _IDLE, f"{load_note}: cold start 0 -> {desired}")
    return _after_delay(policy, current, desired, state, now, load_note)


def _after_delay(
    policy: AutoscalingPolicy,
    current: int,
    desired: int,
    state: ScalingState,
    now: float,
    load_note: str,
) -> ScalingDecision:
    upscale = desired > current
    delay_s = policy.upscale_delay_s if upscale else policy.downscale_delay_s
    direction = "upscale" if upscale else "downscale"
    since = now
    if state.pending_target is not None and (state.pending_target > current) == upscale:
        since = state.pending_since  # same direction as before: the clock keeps running
    waited_s = now - since
    if waited_s >= delay_s:
        reason = f"{load_note}: {direction} {current} -> {desired} after {waited_s:g}s"
        return ScalingDecision(desired, _IDLE, reason)
    reason = f"{load_note}: {direction} {current} -> {desired} in {delay_s - waited_s:g}s"
    return ScalingDecision(current, ScalingState(desired, since), reason)


def _no_data_reason(current_target: int, current: int) -> str:
    if current == current_target:
        return f"no metrics in window: keeping {current}"
    return f"no metrics in window: keeping {current_target}, clamped to {current}"
