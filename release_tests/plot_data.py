"""What a release test hands ``release_tests.results.record`` for a plot: its raw samples
reduced to at most a few hundred points, so a summary stays tens of KB.

- ``timeline``: requests answered per time bin (sent, failed, latency p50/max), from the
  ``(t, ok, why, latency_s)`` tuples the load generators of ``chaos``, ``drain_events`` and
  ``node_churn`` record;
- ``quantiles``: a CDF as ``points`` evenly spaced quantiles of a sample;
- ``thin``: every k-th element of a series, so at most ``points`` are left.
"""

from __future__ import annotations

import math
from typing import Any, Sequence


def timeline(results: Sequence[tuple], start: float, end: float, points: int = 100,
             min_bin_s: float = 0.25) -> dict[str, Any]:
    """Per bin of ``[start, end)`` (at most ``points`` bins, none under ``min_bin_s``): the
    requests answered in it, those that failed, and the answered latencies' p50 and max (ms;
    None in an empty bin). Times are seconds from ``start``."""
    span = max(end - start, min_bin_s)
    bins = max(1, min(points, int(span / min_bin_s)))
    width = span / bins
    sent, failed = [0] * bins, [0] * bins
    latencies: list[list[float]] = [[] for _ in range(bins)]
    for t, ok, _why, *rest in results:
        if start <= t < end:
            i = min(bins - 1, int((t - start) / width))
            sent[i] += 1
            failed[i] += not ok
            if rest:
                latencies[i].append(rest[0])
    return {"bin_s": round(width, 3), "t_s": [round(i * width, 3) for i in range(bins)],
            "sent": sent, "failed": failed,
            "p50_ms": [_ms(quantile(v, 0.5)) for v in latencies],
            "max_ms": [_ms(max(v) if v else None) for v in latencies]}


def quantiles(values: Sequence[float], points: int = 50) -> list[float]:
    """``points`` + 1 quantiles, 0 to 1, of ``values`` (empty without samples)."""
    ordered = sorted(values)
    if not ordered:
        return []
    return [quantile(ordered, i / points, presorted=True) for i in range(points + 1)]


def quantile(values: Sequence[float], q: float, presorted: bool = False) -> float | None:
    """The nearest-rank ``q`` quantile; None without samples."""
    if not values:
        return None
    ordered = values if presorted else sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def thin(series: Sequence[Any], points: int = 300) -> list[Any]:
    """Every k-th element (the last one kept), at most about ``points`` of them."""
    step = max(1, math.ceil(len(series) / points))
    kept = list(series[::step])
    if series and (len(series) - 1) % step:
        kept.append(series[-1])
    return kept


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 2)
