"""The load window autoscaling decides from: per deployment, the recent load reports of
each replica and the load averaged over the look-back period, summed over the replicas
the caller says count; kept up to date per report and per expiry, so a query never walks
the replicas (``controlplane.deployment.autoscaling`` re-exports it, with the decision).

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
- A load report should cost about what a health push does: every replica sends one per
  interval, so their cost bounds how many replicas one shard can hold. A report that
  repeats its replica's load stores nothing (``_Replica``), one that leaves its mean
  where it was does no big-int work, and a node batch's loads come in one call.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import repeat

from controlplane.wire import MetricReport

# Upper bound on max_samples_per_replica: the exact total is scaled by lcm(1..cap), an int
# of 90 bits at the default cap of 64 and of 1,479 at this bound.
_MAX_SAMPLES_CAP = 1024


@dataclass(frozen=True)
class WindowStatistics:
    """What a ``MetricWindow`` holds and the work it has done, for tests and profiles."""

    replicas: int  # known (reported or included) and not forgotten
    arrivals: int  # entries of the expiry queue, stale ones included
    entries_walked: int  # since creation: expiry-queue entries popped, plus held
    #                      samples read by a query that could not use the running total
    samples: int = 0  # held now, over every known replica
    stored: int = 0  # of those, stored one by one (not in their replica's newest run)
    shares_computed: int = 0  # since creation: a replica's mean scaled anew (big ints)


@functools.lru_cache(maxsize=None)
def _scales(cap: int) -> tuple[int, ...]:
    """lcm(1..cap) // n for n in 0..cap (0 for 0): a mean sum/n is sum * scale[n] / lcm,
    exactly. One table per cap, shared by every window."""
    lcm = math.lcm(*range(1, cap + 1))
    return (0, *(lcm // n for n in range(1, cap + 1)))


class _Replica:
    """One replica in a window: its held loads, oldest first, and what its mean adds.

    A replica's load seldom changes from one report to the next, so its newest run of
    equal loads is a count (``load``, ``count``): a report of that load stores nothing,
    and while the run is all it holds, no sample in or out moves its mean: a steady
    replica's reports and expiries do no big-int work.
    Older loads are stored one by one in ``older`` (None when there are none); the
    samples' times are the window's expiry queue."""

    __slots__ = ("replica_id", "load", "count", "older", "n", "skip", "total", "odd",
                 "counted", "last_at", "share", "live", "in_odd", "fast")

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self.load: float = 0  # the newest run: its load and how many held samples have it
        self.count = 0
        self.older: deque[float] | None = None
        self.n = 0  # held samples: ``count`` plus ``len(older)``
        self.skip = 0  # its next queue entries whose samples went first (cap, forget)
        self.total = 0  # sum of the held int loads: an int, so taking one out is exact
        self.odd = 0  # held loads that are not ints (a buggy sender's NaN), summed per query
        self.counted = False  # its mean is part of average_load
        self.last_at = -math.inf  # newest received_at it ever reported
        # What the window's totals hold for it, as of the last ``_refresh``:
        self.share = 0  # its mean times lcm, in the exact total
        self.live = False  # counted and holding a sample
        self.in_odd = False  # live with a non-int load: summed per query instead
        self.fast = False  # live and int-only: a report or an expiry is taken inline

    def add(self, load: float) -> None:
        """One more held sample, the newest (the caller keeps ``total`` / ``odd``)."""
        if self.count and load == self.load and \
                isinstance(load, int) == isinstance(self.load, int):
            self.count += 1
        else:
            self.end_run()
            self.load, self.count = load, 1
        self.n += 1

    def end_run(self) -> None:
        """The newest run's loads are stored one by one: a new load is coming."""
        if self.count:
            if self.older is None:
                self.older = deque()
            if self.count == 1:
                self.older.append(self.load)
            else:
                self.older.extend(repeat(self.load, self.count))

    def pop_oldest(self) -> float:
        """Drop the oldest held sample and take it out of ``total`` / ``odd``: its load."""
        older = self.older
        if older is None:
            load = self.load
            self.count -= 1
        else:
            load = older.popleft()
            if not older:
                self.older = None
        self.n -= 1
        if isinstance(load, int):
            self.total -= load
        else:
            self.odd -= 1
        return load

    def loads(self) -> list[float]:
        """Every held load, oldest first (O(held samples): for the rare exact recount)."""
        return [*(self.older or ()), *repeat(self.load, self.count)]


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
    replica's newer one costs O(reports since), a query about the past O(expiry-queue
    entries), and a replica holding a non-int load O(its samples) per query. Means are
    kept exact (int sums scaled by lcm(1..cap)), so the total never drifts from a
    recount.
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
        # Every held sample's replica, in received_at order (ties: arrival order), grouped
        # by received_at, to expire from the left: a replica's entries come in the order
        # of its samples, so the entry at the front is its oldest one's, or one whose
        # sample went first (``skip``). A batch's rows share a time: a report appends its
        # replica to the newest group (``_tail``) and makes no entry object: no allocation
        # per report.
        self._arrivals: deque[tuple[float, list[_Replica]]] = deque()
        self._tail_at, self._tail = -math.inf, []  # the newest group
        self._clock = -math.inf  # the newest time seen
        self._scaled = 0  # sum of the live int-only replicas' shares: exact
        self._with_data = 0  # live replicas
        self._odd: dict[str, _Replica] = {}  # live replicas holding a non-int load
        self._walked = 0
        self._shares = 0  # shares computed
        self.membership_known = False  # set by include_only: who counts, all at once

    # ---- who counts ----------------------------------------------------------------------
    def include(self, replica_id: str) -> None:
        """Count this replica's mean from now on (it serves), held samples included."""
        rep = self._replicas.get(replica_id)
        if rep is None:
            rep = self._replicas[replica_id] = _Replica(replica_id)
        rep.counted = True
        self._refresh(rep)

    def exclude(self, replica_id: str) -> None:
        """Stop counting this replica; its samples are kept (it may be included again)."""
        rep = self._replicas.get(replica_id)
        if rep is not None:
            rep.counted = False
            self._refresh(rep)

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
        rep = self._replicas.pop(replica_id, None)
        if rep is not None:  # a new report under its id starts a new _Replica
            rep.skip = math.inf  # its queue entries are skipped
            rep.older, rep.count, rep.n = None, 0, 0

    # ---- reports and the load --------------------------------------------------------------
    def record(self, report: MetricReport, received_at: float) -> None:
        self.record_load(report.replica_id, report.load, received_at)

    def record_load(self, replica_id: str, load: int, received_at: float) -> None:
        """``record`` of a report's replica and load (a batch row builds no report). The
        usual report, a counted replica's int load, is taken inline: it is nearly every
        report, so it skips the general case's calls."""
        rep = self._replicas.get(replica_id)
        if rep is None:
            rep = self._replicas[replica_id] = _Replica(replica_id)
        if received_at < rep.last_at:
            raise ValueError(f"received_at went backwards for {replica_id}: {received_at} "
                             f"< {rep.last_at}; pass the shard's monotonic time")
        rep.last_at = received_at
        if received_at != self._clock:  # the first of a batch (a batch shares its time)
            if received_at > self._clock:
                self._advance(received_at)
            elif received_at < self._clock - self._look_back_s:
                return  # already out of the window
        if rep.older is None and load == rep.load and rep.fast and type(load) is int:
            # Steady: one run grows, and its load stays the mean (no share to compute).
            if rep.n == self._max_samples:
                rep.skip += 1  # the cap: its oldest (this load too) goes, entry and all
            else:
                rep.count += 1
                rep.n += 1
                rep.total += load
        elif rep.fast and type(load) is int:
            self._record_int(rep, load)
        else:
            self._record_other(rep, load)
        if received_at == self._tail_at:
            self._tail.append(rep)
        else:
            self._enqueue(received_at, rep)

    def record_loads(self, loads: list[tuple[str, int]], received_at: float) -> None:
        """``record_load`` of each (replica id, load), all received at one time: a node
        batch's rows, after their health. One call per batch, not per row, and a steady
        report is taken in this loop (its time is the clock: no backwards check)."""
        if received_at != self._clock:
            if received_at < self._clock:  # never from one shard clock: one by one
                for replica_id, load in loads:
                    self.record_load(replica_id, load, received_at)
                return
            self._advance(received_at)
        if received_at != self._tail_at:
            self._open_group(received_at)
        get, cap, tail = self._replicas.get, self._max_samples, self._tail
        for replica_id, load in loads:
            rep = get(replica_id)
            if rep is not None and rep.older is None and load == rep.load and rep.fast \
                    and type(load) is int:  # as in ``record_load``
                rep.last_at = received_at
                if rep.n == cap:
                    rep.skip += 1
                else:
                    rep.count += 1
                    rep.n += 1
                    rep.total += load
                tail.append(rep)
            else:
                self.record_load(replica_id, load, received_at)

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
            self._walked += rep.n
            odd += self._mean_parts(rep.loads())[1]
        return self._scaled / self._scales[1] + odd

    def statistics(self) -> WindowStatistics:
        known = self._replicas.values()
        return WindowStatistics(
            len(known), sum(len(reps) for _, reps in self._arrivals), self._walked,
            sum(rep.n for rep in known), sum(len(rep.older or ()) for rep in known),
            self._shares)

    # ---- bookkeeping ------------------------------------------------------------------------
    def _record_int(self, rep: _Replica, load: int) -> None:
        """``record_load`` of an int load to a live int-only replica that is not steady (a
        new load, or one of several runs): exact, a new share only if the mean moved. Its
        own calls inlined: a varying load is common too."""
        n0, t0 = rep.n, rep.total
        if n0 == self._max_samples:
            rep.pop_oldest()
            rep.skip += 1  # its queue entry is skipped when it comes up
        if load == rep.load:  # the held loads are ints: no int / float mix-up here
            rep.count += 1
        else:
            rep.end_run()
            rep.load, rep.count = load, 1
        rep.n += 1
        rep.total = total = rep.total + load
        if total * n0 != t0 * rep.n:  # the mean moved (t0/n0 is the one it had)
            share = total * self._scales[rep.n]
            self._scaled += share - rep.share
            rep.share = share
            self._shares += 1

    def _record_other(self, rep: _Replica, load: float) -> None:
        """``record_load`` of a replica not counted, not holding a sample or holding a
        non-int load, or of a non-int load: the general case."""
        if rep.n == self._max_samples:
            rep.pop_oldest()
            rep.skip += 1
        rep.add(load)
        if isinstance(load, int):
            rep.total += load
        else:
            rep.odd += 1
        self._refresh(rep)

    def _reshare(self, rep: _Replica) -> None:
        """A live int-only replica's mean moved: its new share of the exact total."""
        share = rep.total * self._scales[rep.n]
        self._scaled += share - rep.share
        rep.share = share
        self._shares += 1

    def _refresh(self, rep: _Replica) -> None:
        """Bring the totals in line with ``rep`` after any change to it: O(1)."""
        live = rep.counted and rep.n > 0
        if live and not rep.odd:
            self._reshare(rep)
        elif rep.share:
            self._scaled -= rep.share
            rep.share = 0
        if live != rep.live:
            self._with_data += 1 if live else -1
            rep.live = live
        in_odd = live and rep.odd > 0
        if in_odd and not rep.in_odd:
            self._odd[rep.replica_id] = rep
        elif rep.in_odd and not in_odd:
            del self._odd[rep.replica_id]
        rep.in_odd = in_odd
        rep.fast = live and not in_odd

    def _advance(self, now: float) -> None:
        """Move the clock forward to ``now``; expire what it leaves behind, each once. A
        sample of a live int-only replica holding others is taken inline: nothing but a
        count when all it holds is one run, no share unless the mean moved (every sample
        expires once, so expiries are as many as reports)."""
        self._clock = now
        horizon, arrivals, walked = now - self._look_back_s, self._arrivals, 0
        while arrivals and arrivals[0][0] < horizon:
            reps = arrivals.popleft()[1]
            walked += len(reps)
            for rep in reps:
                if rep.skip:
                    rep.skip -= 1  # its sample went before its time (cap, forget)
                elif rep.fast and rep.n > 1:
                    older = rep.older
                    if older is None:  # one run: its load is the mean, at any count
                        rep.count -= 1
                        rep.n -= 1
                        rep.total -= rep.load
                        continue
                    load = older.popleft()
                    if not older:
                        rep.older = None
                    rep.n -= 1
                    rep.total = total = rep.total - load
                    if total != load * rep.n:  # the mean moved (it was not ``load``)
                        self._reshare(rep)
                else:
                    rep.pop_oldest()
                    self._refresh(rep)
        if not arrivals:  # the newest group went too: a report starts a new one
            self._tail_at = -math.inf
        self._walked += walked

    def _enqueue(self, at: float, rep: _Replica) -> None:
        """``rep``'s new sample, not of the newest group's time: a new group, or one
        received before another replica's newer one, into its place in the queue:
        O(groups received after it). One shard clock never does the latter."""
        arrivals = self._arrivals
        if at > self._tail_at:
            self._open_group(at)
            self._tail.append(rep)
            return
        i = len(arrivals)
        while i and arrivals[i - 1][0] > at:
            i -= 1
        if i and arrivals[i - 1][0] == at:
            arrivals[i - 1][1].append(rep)
        else:
            arrivals.insert(i, (at, [rep]))

    def _open_group(self, at: float) -> None:
        """A new newest group, for samples received at ``at`` (after every other)."""
        self._tail_at, self._tail = at, []
        self._arrivals.append((at, self._tail))

    def _recount(self, now: float) -> float | None:
        """``average_load`` for a ``now`` before the clock, from the held samples: their
        times from the queue (a replica's entries past its ``skip``, in order)."""
        times: dict[_Replica, list[float]] = {}
        for at, reps in self._arrivals:
            self._walked += len(reps)
            for rep in reps:
                times.setdefault(rep, []).append(at)
        start, scaled, odd, seen = now - self._look_back_s, 0, 0.0, False
        for rep in self._replicas.values():
            if not rep.counted or not rep.n:
                continue
            held = times[rep][-rep.n:]  # the entries before these are skipped ones
            loads = [load for t, load in zip(held, rep.loads()) if start <= t <= now]
            if loads:
                parts = self._mean_parts(loads)
                scaled, odd, seen = scaled + parts[0], odd + parts[1], True
        return scaled / self._scales[1] + odd if seen else None

    def _mean_parts(self, loads: list[float]) -> tuple[int, float]:
        """The mean of ``loads``: exact (times lcm) when all are ints, else a float."""
        if all(isinstance(load, int) for load in loads):
            return sum(loads) * self._scales[len(loads)], 0.0
        return 0, sum(loads) / len(loads)
