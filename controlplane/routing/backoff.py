"""Exponential backoff after errors that repeat, and what of them is worth a log line.

``ErrorBackoff`` is a frozen value with three transitions: ``with_failure(now, text)``
after an attempt fails, ``cleared()`` after one succeeds, and ``due(now)`` asked before
the next attempt. It is pure: the caller passes ``now`` from its own clock, and an
``rng`` when it wants jitter. Two users: the shard, for a deployment whose tick raises
(``shard.py``), and ``RoutingSubscriber``, for a long-poll target it cannot reach. It
lives in ``routing`` because that package may import only itself and the kernel, and
the shard may import routing.

Invariants:

- After ``n`` consecutive failures the next attempt waits ``initial_s * 2**(n - 1)``,
  capped at ``max_s``; jitter only shortens a wait (by up to the ``jitter`` fraction),
  so ``max_s`` is a true bound. One success resets the wait to ``initial_s``.
- ``last_error`` outlives a success, so an error that comes and goes is new (logged)
  only when its text differs from the previous failure's: an error that returns every
  few seconds is logged once, not once per return. ``logged`` marks a streak that had
  such a new error, so its end is worth a line as well.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

_MAX_DOUBLINGS = 60  # 2**60 times any sane initial_s is past any cap: no float overflow


@dataclass(frozen=True)
class ErrorBackoff:
    initial_s: float = 0.1  # wait after the first failure
    max_s: float = 30.0  # the wait never exceeds this
    jitter: float = 0.0  # each wait is scaled by a uniform factor in [1 - jitter, 1]
    failures: int = 0  # consecutive failed attempts; 0 after a success
    retry_at: float = 0.0  # no attempt before this (the caller's monotonic time)
    last_error: str | None = None  # the latest failure's text, kept across successes
    logged: bool = False  # this streak had a new error (the caller logged it)

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got {self.initial_s}, {self.max_s}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def delay_s(self, failures: int) -> float:
        """The nominal wait after ``failures`` consecutive failures (before jitter)."""
        if failures <= 0:
            return 0.0
        return min(self.max_s, self.initial_s * 2.0 ** min(failures - 1, _MAX_DOUBLINGS))

    def is_new(self, error_text: str) -> bool:
        """Whether a failure with this text is a change worth logging."""
        return error_text != self.last_error

    def with_failure(self, now: float, error_text: str,
                     rng: random.Random | None = None) -> ErrorBackoff:
        failures = self.failures + 1
        delay = self.delay_s(failures)
        if self.jitter:
            if rng is None:
                raise ValueError("an ErrorBackoff with jitter needs an rng")
            delay *= rng.uniform(1 - self.jitter, 1)
        return replace(self, failures=failures, retry_at=now + delay, last_error=error_text,
                       logged=self.logged or self.is_new(error_text))

    def cleared(self) -> ErrorBackoff:
        """After a success: no wait, and a new streak (the last error is remembered)."""
        return replace(self, failures=0, retry_at=0.0, logged=False)

    def due(self, now: float) -> bool:
        return now >= self.retry_at
