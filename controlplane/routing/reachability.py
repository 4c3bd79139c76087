"""Which long-poll targets (the controller, shard i) a process reaches, and how long it
waits before calling one again that it does not.

A target that cannot be reached is retried with backoff (``ErrorBackoff``: 0.5 s doubling
to 10 s, with jitter so the proxies of a cluster do not retry in step, reset by one
answer). One WARNING when a target becomes unreachable, one INFO when it answers again;
every failure is counted (``statistics()``). The owner's logger says it, so the lines
name the component that follows the target.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass

from controlplane.clock import Clock
from controlplane.routing.backoff import ErrorBackoff

# A controller restart takes seconds: retry soon, then every 10 s at most.
RETRY_BACKOFF = ErrorBackoff(initial_s=0.5, max_s=10.0, jitter=0.2)


@dataclass(frozen=True)
class SubscriberStatistics:
    failures_total: int  # failed long-poll calls (actor lookup included), all targets
    unreachable: tuple[str, ...]  # targets whose last call failed, sorted


class Reachability:
    """``clock`` must be the running loop's clock (the waits are the loop's sleeps)."""

    def __init__(self, clock: Clock, rng: random.Random, logger: logging.Logger) -> None:
        self._clock, self._rng, self._logger = clock, rng, logger
        self._backoffs: dict[str, ErrorBackoff] = {}  # target -> backoff, once it failed
        self._failures_total = 0

    def statistics(self) -> SubscriberStatistics:
        return SubscriberStatistics(self._failures_total, tuple(sorted(
            target for target, backoff in self._backoffs.items() if backoff.failing)))

    async def wait_retry(self, target: str, error: Exception) -> None:
        """Count a failed call, log it if ``target`` just became unreachable, and wait
        out its backoff."""
        backoff = self._backoffs.get(target, RETRY_BACKOFF)
        now = self._clock.monotonic()
        failed = self._backoffs[target] = backoff.with_failure(now, repr(error), self._rng)
        self._failures_total += 1
        if not backoff.failing:
            self._logger.warning("routing: %s unreachable (%r); keeping the last routes, "
                                 "retrying with backoff up to %gs", target, error, failed.max_s)
        else:
            self._logger.debug("routing: %s still unreachable (%d failures): %r", target,
                               failed.failures, error)
        await asyncio.sleep(failed.retry_at - now)

    def reached(self, target: str) -> None:
        backoff = self._backoffs.get(target)
        if backoff is not None and backoff.failing:
            self._backoffs[target] = backoff.cleared()
            self._logger.info("routing: %s reachable again after %d failed calls", target,
                              backoff.failures)
