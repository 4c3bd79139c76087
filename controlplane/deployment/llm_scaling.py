"""Autoscaling an LLM deployment on what its engines report (``autoscaling_config.llm``).

Serve's policy scales on ongoing requests per replica. An LLM engine's capacity is its
batch (vLLM's ``max_num_seqs`` slots) and its KV cache, and what its users feel is the
time to their first token, so LLM fleets scale on waiting requests, KV-cache pressure and
TTFT (Dynamo's planner, llm-d's variant autoscaler, KEDA on ``vllm:num_requests_waiting``).
This policy takes exactly what the LLM health check already reads from each engine's
``/metrics`` (``VLLMServer.record_autoscaling_stats``): no request to the engine.

Owns:

- ``EngineBoard``: per deployment, each serving replica's latest engine stats and their
  running sums, kept per report (O(1)), so a decision never walks the replicas; and the
  mean time a request holds a slot (``slot_s``: vLLM's
  ``vllm:request_inference_time_seconds``, its finished requests' time RUNNING), decayed
  over reports;
- ``DemandTrend``: the demand, one sample per decision: its level (an exponential mean
  over ``LEVEL_OVER_S``) and its growth (a least-squares slope over ``SLOPE_OVER_S``);
- ``llm_desired``: the pure decision of how many replicas the demand needs:

  * demand = the requests at the replicas (their load reports, each second, averaged over
    the look-back; the engines' running + waiting where none came) + requests held by the
    routers (a deployment at zero has no engine: its held requests are its demand);
  * needed = the fewest replicas for which at most ``LATE_SHARE`` of requests would wait
    longer than ``ttft_target_s`` for a slot (``erlang.engines_for``, on the demand's
    level and the measured ``slot_s``), and at least ceil(level / (slots x
    ``target_fill``)) (the only rule until ``slot_s`` is measured); near capacity the level
    adds its growth over one measured start time (a replica that takes minutes to load is
    asked for early); elsewhere a noisy slope would only reset a downscale's delay; the
    replicas' reported requests ``JUMP_SIGMAS`` over the level are a surge, sized for at
    once;
  * pressure (requests waiting while the KV cache is over ``kv_cache_high``, or an
    engine's TTFT p90 over ``ttft_target_s``) asks for one more than serve now;
  * never below the replicas the running streams need (ceil(running / slots)), to zero
    only with no demand at all.

Why a level and a bound, not a fill: a fixed fill (Serve's ``target_ongoing_requests``) is
too little headroom for a few engines and too much for many (``erlang``), and scaling on
each second's demand follows every Poisson peak up and holds it for the downscale delay.
On the day trace (``release_tests.llm_autoscale``) the fill rule (0.75, the look-back's
peak, a 0.8 band to go down) held a fleet 36% busy and started 119 replicas a day.

Invariants: starting replicas count in the current target, and the decision is an
absolute count from demand, so a demand that holds while a slow replica loads does not
ask for it twice; the delays (``upscale_delay_s``, ``downscale_delay_s``,
``downscale_to_zero_delay_s``) are ``autoscaling.decide``'s, applied to this count.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Mapping

from controlplane.deployment.erlang import engines_for

NEAR_CAPACITY = 0.8  # the growth counts once the level is over 80% of what serves it
STALE_AFTER_S = 120.0  # an engine's stats older than this no longer count
# The demand's growth is fitted over this long (or the look-back, if longer): about one
# large model's start, and long enough that the 40 s steps of the engines' stats do not
# read as a surge.
SLOPE_OVER_S = 300.0
# The level's time constant: five minutes of Poisson arrivals at a few a second average
# out, a morning ramp's hour does not; a rise faster than it is a surge (JUMP_SIGMAS). The
# level's noise is what a long downscale delay holds on to: an upscale on a chance high
# keeps its replica for the delay. On the day trace (release_tests.llm_autoscale, seeds
# 7,1,2,3, LATE_SHARE 1e-4), 300 s against 120 s: -1.6% to +0.4% replica-seconds and as
# many windows met or one more each day (earlier, at LATE_SHARE 1e-3, replicas started a
# day: 60 s 69, 120 s 42-55, 300 s 25-39).
LEVEL_OVER_S = 300.0
# The share of requests allowed to wait longer than ttft_target_s for a slot, were the
# engines one queue. They are not one queue: each engine queues its own requests (routers
# place by queue length, not perfectly), far worse than the pooled model says. Calibrated
# with foresight (``release_tests.llm_autoscale --foresight-late-share X``: this bound on
# the day's true rate, nothing estimated; seed 7): at 1e-3 it met the TTFT target as a
# p99 in 94% of 10-minute windows, at 1e-4 in 96%, at 1e-5 in 99% for 16% more
# replica-seconds than 1e-4 (each engine queueing 4 beyond its 4 slots; 2e-4 met 94% on
# one of four days). With max_ongoing_requests at the engine's slots the router's queue is
# the one queue and foresight at 1e-4 meets every window; the bound stays, since a
# reactive policy's headroom for a burst faster than a start is what it holds for chance:
# at 1e-3 the policy held 5 replicas through the peak and met 93-94% (exploratory).
LATE_SHARE = 0.0001
# Past this many busy slots the count is the fill rule's (target_fill 0.75 asks for more
# than Erlang C well before it), and the O(slots) recursion is not run each second.
ERLANG_MAX_LOAD = 4096.0
# The replicas' reported requests (a look-back's average) this many standard deviations
# over the level (requests in service are about Poisson: a variance of the level) are a
# surge, not chance: sized for at once, where the mean would take minutes to follow.
JUMP_SIGMAS = 3.0
# A level under this many busy slots with no request now is idle (an exponential mean
# reaches 0 only in the limit): to zero after downscale_to_zero_delay_s of it.
IDLE_LEVEL = 0.05
SLOT_DECAY = 0.95  # per report: the slot time's running sums forget the old
_TOLERANCE = 1e-9


@dataclass(frozen=True)
class LLMScaling:
    """``autoscaling_config.llm``: the policy's own settings (the schema checks them)."""

    target_fill: float = 0.75  # the most of its slots a replica is planned to fill
    kv_cache_high: float = 0.9  # KV-cache use that, with requests waiting, is pressure
    ttft_target_s: float | None = 10.0  # sized for (Erlang C); a TTFT p90 over it is pressure
    waiting_high: float | None = None  # requests waiting for a slot (all engines): pressure
    surge: float = 0.0  # sized for the level x (1 + surge): a burst faster than a start


@dataclass(frozen=True)
class LLMSignals:
    """A deployment's engines now, as the board sums them."""

    engines: int  # serving replicas with fresh stats
    running: float
    waiting: float
    slots: float  # per engine (the mean of what they report)
    kv_cache_usage: float | None  # the mean over engines that serve the gauge
    ttft_over: int  # engines whose last TTFT p90 was over the target
    held: int = 0  # requests the routers hold (a deployment at zero)
    slot_s: float | None = None  # mean seconds a request holds a slot (None: not measured)
    load: float | None = None  # the replicas' reported requests (None: the engines' count)

    @property
    def demand(self) -> float:
        at_replicas = self.running + self.waiting if self.load is None else self.load
        return at_replicas + self.held


class EngineBoard:
    """Each serving replica's latest engine stats, and their sums."""

    def __init__(self) -> None:
        self._stats: dict[str, tuple[tuple[float, float, float, float | None, bool], float]] = {}
        self._sums = [0.0, 0.0, 0.0, 0.0, 0]  # running, waiting, slots, kv, kv engines
        self._over = 0
        self.last_slots: float | None = None  # an engine's slots, kept through zero
        self._slot_sums = [0.0, 0.0]  # decayed: finished x their mean slot time, finished

    def record(self, replica_id: str, stats: Mapping[str, float], now: float,
               ttft_target_s: float | None) -> None:
        """A replica's stats (``record_autoscaling_stats``); a malformed one raises
        ValueError and changes nothing."""
        row = _row(stats, ttft_target_s)
        finished, slot_s = _slot_time(stats)
        self.last_slots = row[2]
        if finished:
            sums = self._slot_sums
            sums[0] = sums[0] * SLOT_DECAY + finished * slot_s
            sums[1] = sums[1] * SLOT_DECAY + finished
        self._remove(replica_id)
        self._stats[replica_id] = (row, now)
        self._add(row, +1)

    def reporting(self) -> list[str]:
        """The replicas whose stats count now."""
        return list(self._stats)

    def forget(self, replica_id: str) -> None:
        """It stopped serving: its engine no longer counts."""
        self._remove(replica_id)

    @property
    def slot_s(self) -> float | None:
        """The mean time a request held a slot, recent reports weighing most; None before
        any engine reported a finished request (kept through zero, as the slots are)."""
        total, finished = self._slot_sums
        return total / finished if finished > _TOLERANCE else None

    def signals(self, now: float, held: int = 0, load: float | None = None) -> LLMSignals:
        """The sums now. Stale stats (a replica that stopped sending) are dropped here,
        at most one per call (each at O(1)), so a decision stays O(1). With no engine,
        slots are the last engine's (1 before any reported)."""
        self._drop_one_stale(now)
        running, waiting, slots, kv, kv_engines = self._sums
        engines = len(self._stats)
        return LLMSignals(engines, running, waiting,
                          slots / engines if engines else (self.last_slots or 1.0),
                          kv / kv_engines if kv_engines else None, self._over, held,
                          self.slot_s, load)

    def _add(self, row: tuple, sign: int) -> None:
        running, waiting, slots, kv, over = row
        sums = self._sums
        sums[0] += sign * running
        sums[1] += sign * waiting
        sums[2] += sign * slots
        if kv is not None:
            sums[3] += sign * kv
            sums[4] += sign
        self._over += sign * int(over)

    def _remove(self, replica_id: str) -> None:
        old = self._stats.pop(replica_id, None)
        if old is not None:
            self._add(old[0], -1)
            if not self._stats:  # no float residue once empty
                self._sums, self._over = [0.0, 0.0, 0.0, 0.0, 0], 0

    def _drop_one_stale(self, now: float) -> None:
        if self._stats:
            replica_id, (_, at) = next(iter(self._stats.items()))  # oldest first
            if now - at > STALE_AFTER_S:
                self._remove(replica_id)


def _row(stats: Mapping[str, float], ttft_target_s: float | None) -> tuple:
    try:
        running, waiting = float(stats["running"]), float(stats["waiting"])
        slots = float(stats["slots"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"engine stats need running, waiting and slots: {e!r}") from None
    if not (running >= 0 and waiting >= 0 and slots >= 1):
        raise ValueError(f"engine stats out of range: {dict(stats)!r}")
    kv = stats.get("kv_cache_usage")
    ttft = stats.get("ttft_p90_s")
    over = ttft_target_s is not None and ttft is not None and float(ttft) > ttft_target_s
    return running, waiting, slots, None if kv is None else float(kv), over


def _slot_time(stats: Mapping[str, float]) -> tuple[float, float]:
    """(requests finished, their mean slot seconds) of a report; (0, 0) without them."""
    try:
        finished, slot_s = float(stats.get("finished", 0.0)), float(stats.get("slot_s", 0.0))
    except (TypeError, ValueError):
        raise ValueError(f"engine stats' finished and slot_s must be numbers: "
                         f"{dict(stats)!r}") from None
    if not (finished >= 0 and slot_s >= 0):
        raise ValueError(f"engine stats out of range: {dict(stats)!r}")
    return finished, slot_s


@dataclass(frozen=True)
class Trend:
    level: float  # the demand's exponential mean over LEVEL_OVER_S (what is sized for)
    growth_per_s: float  # its least-squares slope, >= 0 (what a slow start must meet)


class DemandTrend:
    """The demand, one sample per decision: its level and its growth. The level is an
    exponential mean (a Poisson peak moves it a little, an hour's ramp fully); the slope a
    least-squares fit over its window, not two points. Both O(1) per decision."""

    def __init__(self, slope_over_s: float = SLOPE_OVER_S,
                 level_over_s: float = LEVEL_OVER_S) -> None:
        self._slope_over_s = slope_over_s
        self._level_over_s = level_over_s
        self._samples: deque[tuple[float, float]] = deque()
        self._sums = [0.0, 0.0, 0.0, 0.0]  # t, d, t*t, t*d (t relative to the origin)
        self._origin: float | None = None
        self._level: float | None = None
        self._at = 0.0

    def add(self, now: float, demand: float) -> Trend:
        if self._origin is None:
            self._origin, self._level, self._at = now, demand, now
        weight = 1.0 - math.exp(-max(0.0, now - self._at) / self._level_over_s)
        self._level += weight * (demand - self._level)
        self._at = now
        self._push(now, demand)
        while self._samples and now - self._samples[0][0] > self._slope_over_s:
            self._pop()
        return Trend(self._level, self._slope())

    def _push(self, now: float, demand: float) -> None:
        t = now - self._origin
        self._samples.append((now, demand))
        for i, v in enumerate((t, demand, t * t, t * demand)):
            self._sums[i] += v

    def _pop(self) -> None:
        at, demand = self._samples.popleft()
        t = at - self._origin
        for i, v in enumerate((t, demand, t * t, t * demand)):
            self._sums[i] -= v

    def _slope(self) -> float:
        n = len(self._samples)
        st, sd, stt, std = self._sums
        spread = n * stt - st * st
        if n < 2 or spread <= _TOLERANCE:
            return 0.0
        return max(0.0, (n * std - st * sd) / spread)


def llm_desired(scaling: LLMScaling, signals: LLMSignals, current: int, min_replicas: int,
                max_replicas: int, trend: Trend | None = None,
                start_s: float | None = None) -> tuple[int, str]:
    """How many replicas the demand needs now, and why (before any delay): sized for the
    demand's level (``trend``; the demand now without one, or with no engine serving),
    plus its growth over one measured start once near capacity."""
    level = trend.level if trend is not None and signals.engines else signals.demand
    if signals.load is not None and signals.demand - level > JUMP_SIGMAS * math.sqrt(
            max(level, 1.0)):
        level = signals.demand  # a rise past chance: the new rate, not the mean's lag
    if level < IDLE_LEVEL and not signals.demand:
        level = 0.0
    level *= 1.0 + scaling.surge
    projected, why = level, f"demand {signals.demand:g} (level {level:.3g}, " + \
        f"running {signals.running:g}, waiting {signals.waiting:g}, held {signals.held})"
    growth = trend.growth_per_s if trend is not None else 0.0
    if growth and start_s and level >= current * signals.slots * NEAR_CAPACITY:
        projected += growth * start_s
        why += f", {projected:.3g} in one start ({start_s:g}s)"
    needed, sized = _sized(scaling, signals, projected, max(1, max_replicas))
    why += f": {sized}"
    pressure = _pressure(scaling, signals)
    if pressure:
        needed = max(needed, signals.engines + 1)
        why += f"; {pressure}"
    streams = math.ceil(signals.running / max(1.0, signals.slots) - _TOLERANCE)
    needed = max(needed, streams, 1 if signals.demand > 0 else 0)
    return max(min_replicas, min(max_replicas, needed)), why


def _sized(scaling: LLMScaling, signals: LLMSignals, load: float,
           most: int) -> tuple[int, str]:
    """The replicas ``load`` busy slots need: Erlang C on the measured slot time, at least
    the target fill's count."""
    slots = signals.slots
    by_fill = math.ceil(load / max(_TOLERANCE, slots * scaling.target_fill) - _TOLERANCE)
    slot_s, wait_s = signals.slot_s, scaling.ttft_target_s
    if load <= 0 or slot_s is None or wait_s is None or load > ERLANG_MAX_LOAD \
            or by_fill >= most:
        return by_fill, f"{by_fill} at fill {scaling.target_fill:g} of {slots:g} slots"
    n = engines_for(load, max(1, round(slots)), max(slot_s, _TOLERANCE), wait_s, LATE_SHARE,
                    by_fill, most)
    return n, (f"{n} for <= {LATE_SHARE:g} waiting over {wait_s:g}s ({slots:g} slots, "
               f"{slot_s:.3g}s a request)")


def _pressure(scaling: LLMScaling, signals: LLMSignals) -> str:
    if not signals.engines:
        return ""
    kv = signals.kv_cache_usage
    if signals.waiting > 0 and kv is not None and kv >= scaling.kv_cache_high:
        return f"KV cache {kv:.0%} full with {signals.waiting:g} waiting"
    if signals.ttft_over:
        return f"TTFT p90 over {scaling.ttft_target_s:g}s on {signals.ttft_over} engine(s)"
    if scaling.waiting_high is not None and signals.waiting >= scaling.waiting_high:
        return f"{signals.waiting:g} requests waiting for an engine slot"
    return ""
