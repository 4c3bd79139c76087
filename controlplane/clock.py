"""One way to read the time.

Shells take a ``Clock`` in their constructor; pure policy takes ``now`` as an argument.
Tests use ``FakeClock`` and assert exact virtual times instead of sleeping.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (for deadlines and intervals)."""


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self._now = start_s

    def monotonic(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes backwards")
        self._now += seconds
