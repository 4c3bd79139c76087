"""The replica's self-health: the user's check_health on the replica's own clock.

Owns: when the user check runs (every half health period, each run bounded by the
timeout), the cached result remote probes are answered from, the period-based failure
count and the unhealthy latch. No Ray here; the replica actor owns the task.

Invariants (seed 000, ray-project/ray#64913, and its review fixes):

- The check runs at half the configured period, so a result is always fresh within one
  period despite scheduling jitter. Runs are deadline-scheduled (no drift from the check's
  own duration) and never overlap: a check that outlived its timeout and ignores
  cancellation is not run again beside itself; it counts as another failure.
- ``consecutive_failures`` advances at most once per configured period, not once per
  evaluation: the controller weighs it against a threshold calibrated to the period, and
  counting both half-period evaluations replaced replicas in half the configured time.
- At ``unhealthy_threshold`` the result latches: the user check stops running, unhealthy
  is reported from then on, and nothing un-latches it (parity with pull probes, after
  which the controller replaces the replica).
- A timed-out or cancelled check is a failure with a logged cause. CancelledError is not
  an Exception: a check cancelled by its timeout (or raising CancelledError itself) used
  to leave the cached result healthy, so a fallback probe answered healthy for a wedged
  check. Only the self-health task's own cancellation (shutdown) propagates, unrecorded.
- While the task runs, remote probes get the cached result and never re-run the user
  check. Initialization runs a fresh check, never the cache (the seed's High Severity
  finding: a recent failure in the cache failed a live replica that a fresh check passes).
- Waits are ``asyncio.sleep`` on the running loop, so the injected clock must read the
  loop's time: ``SystemClock`` and the default loop both read ``time.monotonic``; tests
  run on a virtual-time loop over their ``FakeClock``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from controlplane.clock import Clock

# Evaluations are half a period apart and jitter; a failure counts when it is at least
# this fraction of a period after the last counted one, so two evaluations one period apart
# always count twice, and two half a period apart never do.
EVAL_JITTER_SLACK = 0.25

Check = Callable[[], Awaitable[object]]


class HealthCheckFailed(Exception):
    """The replica is unhealthy; what a remote check_health raises."""

    def __init__(self, message: str) -> None:
        super().__init__(message)  # all fields to super() so it pickles across actors
        self.message = message


@dataclass(frozen=True)
class HealthSnapshot:
    healthy: bool
    checked_at: float | None  # clock.monotonic() when the check completed; None: never
    consecutive_failures: int
    latched: bool
    last_error: str


class SelfHealth:
    def __init__(self, check: Check, *, period_s: float, timeout_s: float, clock: Clock,
                 unhealthy_threshold: int = 3, logger: logging.Logger | None = None,
                 on_result: Callable[[HealthSnapshot], None] | None = None) -> None:
        if period_s <= 0 or timeout_s <= 0 or unhealthy_threshold < 1:
            raise ValueError(f"need period_s > 0, timeout_s > 0, unhealthy_threshold >= 1; got "
                             f"{period_s}, {timeout_s}, {unhealthy_threshold}")
        self._check = check
        self._period_s = period_s
        self._timeout_s = timeout_s
        self._threshold = unhealthy_threshold
        self._clock = clock
        self._log = logger or logging.getLogger(__name__)
        self._on_result = on_result
        self._snapshot = HealthSnapshot(True, None, 0, False, "")
        self._last_counted_at: float | None = None  # start of the last counted failure
        self._inflight: asyncio.Task | None = None  # the periodic check, if still running
        self._running = False

    def set_timings(self, period_s: float, timeout_s: float) -> None:
        """A redeploy changed health_check_period_s / _timeout_s in place: both apply from
        the next evaluation (the failure count and the latch are kept)."""
        if period_s <= 0 or timeout_s <= 0:
            raise ValueError(f"need period_s > 0, timeout_s > 0; got {period_s}, {timeout_s}")
        self._period_s, self._timeout_s = period_s, timeout_s

    @property
    def running(self) -> bool:
        """True while ``run_forever`` is active: remote probes are answered from cache."""
        return self._running

    def snapshot(self) -> HealthSnapshot:
        return self._snapshot

    # ---- the periodic task -------------------------------------------------------------
    async def run_forever(self) -> None:
        """Evaluate every half period until cancelled (the replica owns this task)."""
        self._running = True
        try:
            next_at = self._clock.monotonic()
            while True:
                await self.evaluate_once(self._clock.monotonic())
                next_at += self._period_s / 2
                now = self._clock.monotonic()
                next_at = max(next_at, now)  # a slow check delays, never bunches, the next
                await asyncio.sleep(next_at - now)
        finally:
            self._running = False

    async def evaluate_once(self, now: float) -> HealthSnapshot:
        """One evaluation started at ``now``; a latched result does not run the check."""
        if self._snapshot.latched:
            return self._snapshot
        if self._inflight is not None and not self._inflight.done():
            self._fail(now, f"health check still running {self._timeout_s}s past its "
                            "timeout (it ignores cancellation)")
            return self._snapshot
        task = asyncio.get_running_loop().create_task(self._call_check())
        self._inflight = task
        await self._settle(task, now)
        return self._snapshot

    # ---- remote probes and initialization ----------------------------------------------
    async def check_fresh(self) -> None:
        """Run the user check now, bypassing the cache; raise ``HealthCheckFailed`` if it
        fails. For replica initialization, and for probes while the task is not running."""
        started = self._clock.monotonic()
        task = asyncio.get_running_loop().create_task(self._call_check())
        error = await self._settle(task, started)
        if error is not None:
            raise HealthCheckFailed(error)

    def check_cached(self) -> None:
        """The cached verdict: raise ``HealthCheckFailed`` if unhealthy. Never runs the
        user check."""
        snap = self._snapshot
        if snap.checked_at is None:
            raise HealthCheckFailed("no health check has completed yet")
        if not snap.healthy:
            raise HealthCheckFailed(snap.last_error or "replica self health check failed")

    async def check_for_probe(self) -> None:
        """What a remote check_health answers: the cache while the task runs, else a fresh
        check (before the task started or after it stopped)."""
        if self._running:
            self.check_cached()
        else:
            await self.check_fresh()

    # ---- internals --------------------------------------------------------------------------
    async def _call_check(self) -> None:
        await self._check()

    async def _settle(self, task: asyncio.Task, started: float) -> str | None:
        """Await ``task`` up to the timeout and record its outcome; returns the error."""
        timer = asyncio.get_running_loop().create_task(asyncio.sleep(self._timeout_s))
        try:
            await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # our own task is cancelled: shutdown, not a verdict
            task.cancel()
            raise
        finally:
            timer.cancel()
        if not task.done():
            task.cancel()  # not awaited: a check that ignores cancellation cannot wedge us
            task.add_done_callback(_consume_outcome)
            error = f"health check timed out after {self._timeout_s}s and was cancelled"
        elif task.cancelled():
            error = "health check was cancelled (CancelledError)"
        elif task.exception() is not None:
            error = f"health check failed: {task.exception()!r}"
        else:
            self._succeed()
            return None
        self._log.warning("replica self health check: %s", error)
        self._fail(started, error)
        return error

    def _succeed(self) -> None:
        if self._snapshot.latched:
            return
        self._publish(HealthSnapshot(True, self._clock.monotonic(), 0, False, ""))

    def _fail(self, started: float, error: str) -> None:
        snap = self._snapshot
        if snap.latched:
            return
        failures = snap.consecutive_failures
        last = self._last_counted_at
        a_period_on = last is not None and started - last >= (1 - EVAL_JITTER_SLACK) * self._period_s
        if failures == 0 or a_period_on:
            failures += 1
            self._last_counted_at = started
        latched = failures >= self._threshold
        if latched:
            self._log.error("replica self health check latched unhealthy after %d failures: %s",
                            failures, error)
        self._publish(HealthSnapshot(False, self._clock.monotonic(), failures, latched, error))

    def _publish(self, snapshot: HealthSnapshot) -> None:
        self._snapshot = snapshot
        if self._on_result is not None:
            self._on_result(snapshot)


def _consume_outcome(task: asyncio.Task) -> None:
    """Retrieve an abandoned check's outcome so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()
