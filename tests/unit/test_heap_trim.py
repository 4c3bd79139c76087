"""Giving a large body's memory back: one trim after large bodies, ``settle_s`` later and
at most once per ``min_interval_s``; never for small bodies, never where there is no
malloc_trim. A fake clock and a recording scheduler."""

from __future__ import annotations

from controlplane.clock import FakeClock
from controlplane.routing.heap_trim import HeapTrimmer, libc_malloc_trim, trim_delay_s


class Scheduled:
    def __init__(self) -> None:
        self.calls: list[tuple[float, object]] = []

    def __call__(self, delay: float, callback) -> None:
        self.calls.append((delay, callback))

    def run_next(self, clock: FakeClock | None = None) -> None:
        """The first scheduled call, once its delay has passed on ``clock``."""
        delay, callback = self.calls.pop(0)
        if clock is not None:
            clock.advance(delay)
        callback()


def trimmer(clock: FakeClock, trims: list[float], schedule: Scheduled) -> HeapTrimmer:
    def trim() -> int:
        trims.append(clock.monotonic())
        return 1
    return HeapTrimmer(clock, trim, schedule, threshold_bytes=1000, settle_s=0.5,
                       min_interval_s=2.0)


def test_the_delay_is_the_settle_time_then_the_interval_since_the_last_trim():
    assert trim_delay_s(10.0, None, 0.5, 2.0) == 0.5
    assert trim_delay_s(10.0, 9.0, 0.5, 2.0) == 1.0
    assert trim_delay_s(10.0, 5.0, 0.5, 2.0) == 0.5


def test_a_large_body_is_trimmed_after_once_and_the_next_waits_for_the_interval():
    clock, trims, schedule = FakeClock(), [], Scheduled()
    t = trimmer(clock, trims, schedule)
    t.note_body(999)
    assert schedule.calls == []  # under the threshold
    t.note_body(1000)
    t.note_body(5000)  # one trim pending covers both
    assert len(schedule.calls) == 1
    schedule.run_next(clock)
    assert trims == [1000.5]
    clock.advance(0.25)
    t.note_body(1000)
    assert schedule.calls[0][0] == 1.75  # 2 s after the last trim
    schedule.run_next(clock)
    assert trims == [1000.5, 1002.5]
    assert (t.statistics().trims, t.statistics().released) == (2, 2)


def test_without_malloc_trim_nothing_is_scheduled():
    schedule = Scheduled()
    HeapTrimmer(FakeClock(), None, schedule, threshold_bytes=1).note_body(10)
    assert schedule.calls == []


def test_a_failing_trim_is_logged_and_not_tried_again():
    schedule = Scheduled()

    def broken() -> int:
        raise OSError("no")
    t = HeapTrimmer(FakeClock(), broken, schedule, threshold_bytes=1)
    t.note_body(10)
    schedule.run_next()
    t.note_body(10)
    assert schedule.calls == [] and t.statistics().trims == 0


def test_glibc_malloc_trim_is_found_and_runs():
    trim = libc_malloc_trim()
    assert trim is not None  # the proxy runs on glibc Linux
    assert trim() in (0, 1)
