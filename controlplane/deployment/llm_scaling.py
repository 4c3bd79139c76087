"""Autoscaling an LLM deployment on what its engines report (``autoscaling_config.llm``).

Serve's policy scales on ongoing requests per replica. An LLM engine's capacity is its
batch (vLLM's ``max_num_seqs`` slots) and its KV cache, and what its users feel is the
time to their first token, so LLM fleets scale on waiting requests, KV-cache pressure and
TTFT (Dynamo's planner, llm-d's variant autoscaler, KEDA on ``vllm:num_requests_waiting``).
This policy takes exactly what the LLM health check already reads from each engine's
``/metrics`` (``VLLMServer.record_autoscaling_stats``): no request to the engine.

Owns:

- ``EngineBoard``: per deployment, each serving replica's latest engine stats and their
  running sums, kept per report (O(1)), so a decision never walks the replicas;
- ``llm_desired``: the pure decision of how many replicas the engines' demand needs:

  * demand = running + waiting at the engines + requests held by the routers (a
    deployment at zero has no engine: its held requests are its demand);
  * needed = ceil(projected demand / (slots x ``target_fill``)); near capacity (demand
    over ``DOWN_BAND`` of it) the projection adds the demand's growth over one measured
    start time (a replica that takes minutes to load is asked for early); elsewhere a
    noisy slope would only reset a downscale's delay;
  * pressure (requests waiting while the KV cache is over ``kv_cache_high``, or an
    engine's TTFT p90 over ``ttft_target_s``) asks for one more than serve now;
  * down: only at a fill ``DOWN_BAND`` lower (hysteresis), never below the replicas
    the running streams need (ceil(running / slots)), to zero only with no demand at all.

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

DOWN_BAND = 0.8  # scale down only to a count that would be <= 80% of the target fill
STALE_AFTER_S = 120.0  # an engine's stats older than this no longer count
# The demand's growth is fitted over this long (or the look-back, if longer): about one
# large model's start, and long enough that the 40 s steps of the engines' stats do not
# read as a surge.
SLOPE_OVER_S = 300.0
_TOLERANCE = 1e-9


@dataclass(frozen=True)
class LLMScaling:
    """``autoscaling_config.llm``: the policy's own settings (the schema checks them)."""

    target_fill: float = 0.75  # (running + waiting) / slots each replica should carry
    kv_cache_high: float = 0.9  # KV-cache use that, with requests waiting, is pressure
    ttft_target_s: float | None = None  # an engine's TTFT p90 above this is pressure
    waiting_high: float | None = None  # requests waiting for a slot (all engines): pressure


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

    @property
    def demand(self) -> float:
        return self.running + self.waiting + self.held


class EngineBoard:
    """Each serving replica's latest engine stats, and their sums."""

    def __init__(self) -> None:
        self._stats: dict[str, tuple[tuple[float, float, float, float | None, bool], float]] = {}
        self._sums = [0.0, 0.0, 0.0, 0.0, 0]  # running, waiting, slots, kv, kv engines
        self._over = 0
        self.last_slots: float | None = None  # an engine's slots, kept through zero

    def record(self, replica_id: str, stats: Mapping[str, float], now: float,
               ttft_target_s: float | None) -> None:
        """A replica's stats (``record_autoscaling_stats``); a malformed one raises
        ValueError and changes nothing."""
        row = _row(stats, ttft_target_s)
        self.last_slots = row[2]
        self._remove(replica_id)
        self._stats[replica_id] = (row, now)
        self._add(row, +1)

    def reporting(self) -> list[str]:
        """The replicas whose stats count now."""
        return list(self._stats)

    def forget(self, replica_id: str) -> None:
        """It stopped serving: its engine no longer counts."""
        self._remove(replica_id)

    def signals(self, now: float, held: int = 0) -> LLMSignals:
        """The sums now. Stale stats (a replica that stopped sending) are dropped here,
        at most one per call (each at O(1)), so a decision stays O(1). With no engine,
        slots are the last engine's (1 before any reported)."""
        self._drop_one_stale(now)
        running, waiting, slots, kv, kv_engines = self._sums
        engines = len(self._stats)
        return LLMSignals(engines, running, waiting,
                          slots / engines if engines else (self.last_slots or 1.0),
                          kv / kv_engines if kv_engines else None, self._over, held)

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


@dataclass(frozen=True)
class Trend:
    peak: float  # the highest demand within the look-back (what a downscale must hold)
    growth_per_s: float  # its least-squares slope, >= 0 (what a slow start must meet)


class DemandTrend:
    """The demand over the look-back, one sample per decision: its peak and its growth.
    The slope is a least-squares fit over the window, not two points, so one Poisson
    spike neither asks for replicas nor holds back a downscale. Its sums are kept per
    sample (O(1) per decision); the peak is a monotonic deque (amortised O(1))."""

    def __init__(self, look_back_s: float, slope_over_s: float = 0.0) -> None:
        self._look_back_s = look_back_s  # the peak's window
        self._slope_over_s = max(look_back_s, slope_over_s)  # the slope's (longer: smoother)
        self._samples: deque[tuple[float, float]] = deque()
        self._peaks: deque[tuple[float, float]] = deque()  # decreasing demands
        self._sums = [0.0, 0.0, 0.0, 0.0]  # t, d, t*t, t*d (t relative to the origin)
        self._origin: float | None = None

    def add(self, now: float, demand: float) -> Trend:
        if self._origin is None:
            self._origin = now
        self._push(now, demand)
        while self._samples and now - self._samples[0][0] > self._slope_over_s:
            self._pop()
        while self._peaks and now - self._peaks[0][0] > self._look_back_s:
            self._peaks.popleft()
        return Trend(self._peaks[0][1], self._slope())

    def _push(self, now: float, demand: float) -> None:
        t = now - self._origin
        self._samples.append((now, demand))
        for i, v in enumerate((t, demand, t * t, t * demand)):
            self._sums[i] += v
        while self._peaks and self._peaks[-1][1] <= demand:
            self._peaks.pop()
        self._peaks.append((now, demand))

    def _pop(self) -> None:
        at, demand = self._samples.popleft()
        t = at - self._origin
        for i, v in enumerate((t, demand, t * t, t * demand)):
            self._sums[i] -= v
        if self._peaks and self._peaks[0][0] <= at:
            self._peaks.popleft()

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
    """How many replicas the engines' demand needs now, and why (before any delay).
    Up: the demand now plus its growth over one measured start. Down: only to what the
    look-back's peak needs at a ``DOWN_BAND`` lower fill (the growth never holds a
    downscale back, and one quiet read does not start one)."""
    per_replica = max(_TOLERANCE, signals.slots * scaling.target_fill)
    growth = trend.growth_per_s if trend is not None else 0.0
    projected = signals.demand
    if signals.demand >= current * per_replica * DOWN_BAND:  # near capacity: look ahead
        projected += growth * (start_s or 0.0)
    needed = math.ceil(projected / per_replica - _TOLERANCE)
    why = (f"demand {signals.demand:g} (running {signals.running:g}, waiting "
           f"{signals.waiting:g}, held {signals.held}) over {per_replica:g} per replica")
    if projected > signals.demand:
        why += f", {projected:.3g} in one start ({start_s:g}s)"
    if needed <= current:  # not up: down only to what the window's peak needs, banded
        peak = max(signals.demand, trend.peak if trend is not None else 0.0)
        needed = min(current, math.ceil(peak / (per_replica * DOWN_BAND) - _TOLERANCE))
    pressure = _pressure(scaling, signals)
    if pressure:
        needed = max(needed, signals.engines + 1)
        why += f"; {pressure}"
    streams = math.ceil(signals.running / max(1.0, signals.slots) - _TOLERANCE)
    needed = max(needed, streams, 1 if signals.demand > 0 else 0)
    return max(min_replicas, min(max_replicas, needed)), why


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
