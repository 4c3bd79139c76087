"""Giving the memory of large request bodies back to the OS (glibc ``malloc_trim``).

Why: a listener holds a body whole (uvicorn's chunks, the joined body, its pickled copy
for the replica call), and glibc keeps what is freed in its arenas instead of returning it
(past its first large frees, glibc's dynamic mmap threshold rises to 32 MiB, so bodies land
in arenas). Measured on the proxy, 16 bodies of 48 MB, 4 at a time: its unshared memory
went from 70 MB to 256 MB and stayed there; with this, back to 70 MB 0.5 s after the last
(README, "Limits on what a client sends"). ``malloc_trim(0)`` returns the free pages of
every arena (glibc >= 2.8 releases inside the heap, not only at its top).

Policy: after a request with a body of at least ``threshold_bytes`` (256 KiB: twice
glibc's initial mmap threshold), trim once, ``settle_s`` later (the body and its copies
are freed by then), and at most once per ``min_interval_s``. A trim walks every arena in
the event loop's thread: 0.5 ms measured on the proxy after such a burst; its duration is
kept in ``statistics``. Where malloc_trim does not exist (musl, macOS), nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from dataclasses import dataclass
from typing import Any, Callable

from controlplane.clock import Clock

logger = logging.getLogger(__name__)

Schedule = Callable[[float, Callable[[], None]], Any]  # loop.call_later's shape


def libc_malloc_trim() -> Callable[[], int] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


def trim_delay_s(now: float, last_trim_at: float | None, settle_s: float,
                 min_interval_s: float) -> float:
    """How long from ``now`` until the next trim may run."""
    earliest = now + settle_s
    if last_trim_at is not None:
        earliest = max(earliest, last_trim_at + min_interval_s)
    return earliest - now


@dataclass(frozen=True)
class TrimStatistics:
    trims: int
    released: int  # trims that gave memory back
    last_duration_s: float


class HeapTrimmer:
    """Schedules a trim after large bodies; one pending trim at a time."""

    def __init__(self, clock: Clock, trim: Callable[[], int] | None,
                 schedule: Schedule | None = None, threshold_bytes: int = 256 << 10,
                 settle_s: float = 0.5, min_interval_s: float = 2.0) -> None:
        self._clock, self._trim = clock, trim
        self._schedule = schedule  # None: the running loop's call_later
        self._threshold, self._settle_s = threshold_bytes, settle_s
        self._min_interval_s = min_interval_s
        self._last_at: float | None = None
        self._pending = False
        self._trims = self._released = 0
        self._last_duration_s = 0.0

    def note_body(self, size_bytes: int) -> None:
        """A request with a body of ``size_bytes`` is done (or about to be)."""
        if self._trim is None or self._pending or size_bytes < self._threshold:
            return
        now = self._clock.monotonic()
        schedule = self._schedule or asyncio.get_running_loop().call_later
        self._pending = True
        schedule(trim_delay_s(now, self._last_at, self._settle_s, self._min_interval_s),
                 self._run)

    def _run(self) -> None:
        self._pending = False
        started = self._clock.monotonic()
        try:
            released = self._trim()
        except Exception as e:  # never let memory housekeeping break serving
            logger.warning("malloc_trim failed: %r", e)
            self._trim = None
            return
        self._last_at = self._clock.monotonic()
        self._last_duration_s = self._last_at - started
        self._trims += 1
        self._released += 1 if released else 0

    def statistics(self) -> TrimStatistics:
        return TrimStatistics(self._trims, self._released, self._last_duration_s)
