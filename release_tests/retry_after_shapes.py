"""The load shapes of issue 14's Retry-After harness and their open-loop arrivals.

A shape is a multiple of the capacity of the replicas a run starts with, over time from
the start of the measured window; ``scaleup`` also grows the deployment during the window,
so ``cluster_informed``'s scale-up outlook meets the capacity it promises.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    from release_tests.retry_after_sim import SimConfig


@dataclass(frozen=True)
class Shape:
    """An open-loop load: ``multiple(t, duration_s)`` x capacity at ``t`` s from the start
    of the measured window (negative in the warm-up, past ``duration_s`` after it)."""

    name: str
    poisson: bool  # False: one arrival in each 1 / rate slot (see arrival_times)
    peak: float  # the largest multiple, for thinning
    multiple: Callable[[float, float], float]
    description: str
    # A scale-up: as the window opens, the deployment starts ``scale_to`` minus the
    # configured replicas more, which serve ``start_s`` later (0: no scale-up).
    scale_to: int = 0
    start_s: float = 0.0


def _burst(t: float, duration_s: float) -> float:
    return 10.0 if 0.0 <= t < 5.0 else 0.5


def _ramp(t: float, duration_s: float) -> float:
    """0.5x -> 3x at mid-window -> 0.5x, linear; 0.5x outside the window."""
    half = duration_s / 2
    if t <= 0.0 or t >= duration_s:
        return 0.5
    return 0.5 + 2.5 * (t / half if t <= half else (duration_s - t) / half)


SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("const2x", False, 2.0, lambda t, d: 2.0, "2x capacity, one arrival per 1/rate slot"),
    Shape("const5x", False, 5.0, lambda t, d: 5.0, "5x capacity, one arrival per 1/rate slot"),
    Shape("poisson1x", True, 1.0, lambda t, d: 1.0, "Poisson at capacity"),
    Shape("burst", True, 10.0, _burst, "Poisson, 0.5x; 10x for the window's first 5 s"),
    Shape("ramp", True, 3.0, _ramp, "Poisson, 0.5x -> 3x at mid-window -> 0.5x"),
    Shape("scaleup", True, 1.5, lambda t, d: 1.5,
          "Poisson, 1.5x of the replicas there at the start; as many more start with "
          "the window and serve 10 s into it", scale_to=2, start_s=10.0),
)}


def arrival_times(shape: Shape, config: SimConfig, rng: random.Random) -> Iterator[float]:
    """First arrivals from 0, endless (the caller stops when it has seen enough).

    Poisson shapes by thinning a process at the peak rate (Lewis and Shedler, 1979).
    Constant shapes are stratified: one arrival at a uniformly random point of each
    ``1 / rate`` slot, so the rate is exact over any second. With exact spacing every
    retry after an integer Retry-After would tie with a first arrival (the spacing divides
    1 s), and the loop's tie order, not the policy, would decide who takes a free queue
    place (retries admitted at 5x, static 5 s: 18% with exact spacing, 6% stratified)."""
    capacity, start, duration = config.capacity_per_s, config.warmup_s, config.duration_s
    t = 0.0
    if not shape.poisson:
        while True:  # one arrival at a random point of each 1 / rate slot
            spacing = 1.0 / (capacity * shape.multiple(t - start, duration))
            yield t + rng.uniform(0.0, spacing)
            t += spacing
    while True:
        t += rng.expovariate(capacity * shape.peak)
        if rng.random() * shape.peak < shape.multiple(t - start, duration):
            yield t


def seeded_arrivals(shape: Shape, config: SimConfig, seed: int) -> Iterator[float]:
    """The arrivals of run ``seed``: the same for every policy, so policies meet the same
    load."""
    return arrival_times(shape, config, random.Random(f"{seed}/arrivals/{shape.name}"))
