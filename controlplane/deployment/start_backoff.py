"""Start backoff and the DEPLOY_FAILED budget of one deployment: a frozen value, pure.

A replica that fails to start (its constructor raised, its first health check failed,
or the scheduler refused the actor) counts one failure. Each failure holds further
starts back, ``initial_s`` doubling per consecutive failure up to ``max_s``; after
``max_retries`` failures per target replica (Serve's budget: one batch of starts can
fail together before any backoff applies) the deployment is DEPLOY_FAILED and starts no
more until the next deploy of new code or config (``StartBackoff()`` again).

Invariants: ``failures`` counts consecutive start failures (a started replica resets it,
never ``deploy_failed``); ``blocked(now)`` holds from a failure until ``until``, and for
good once ``deploy_failed``; ``last_error`` is the newest failure's message, for status.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from controlplane.routing.backoff import ErrorBackoff


@dataclass(frozen=True)
class StartBackoffPolicy:
    initial_s: float = 0.5  # ShardSettings.start_backoff_initial_s
    max_s: float = 30.0  # ShardSettings.start_backoff_max_s
    max_retries: int = 3  # ShardSettings.max_constructor_retries, per target replica


@dataclass(frozen=True)
class StartBackoff:
    failures: int = 0
    until: float = 0.0  # monotonic time before which no replica is started; 0: none
    deploy_failed: bool = False
    last_error: str = ""

    def with_failure(self, message: str, now: float, target_replicas: int,
                     policy: StartBackoffPolicy) -> StartBackoff:
        failures = self.failures + 1
        return StartBackoff(
            failures=failures, until=now + self.delay_s(policy, failures),
            deploy_failed=self.deploy_failed or
            failures >= policy.max_retries * max(1, target_replicas),
            last_error=message)

    @staticmethod
    def delay_s(policy: StartBackoffPolicy, failures: int) -> float:
        """The hold after the ``failures``-th consecutive failure (the doubling rule of
        every backoff here, ``ErrorBackoff``)."""
        return ErrorBackoff(policy.initial_s, policy.max_s).delay_s(failures)

    def with_started(self) -> StartBackoff:
        """A replica started: the streak and its message end (a running backoff and a
        DEPLOY_FAILED verdict stand until they expire or the next deploy)."""
        if self.failures == 0 and not self.last_error:
            return self  # nothing to end: no new object per start of a scale-up
        return replace(self, failures=0, last_error="")

    def with_error(self, message: str) -> StartBackoff:
        """An error to show in status that is not a start failure (a reconfigure)."""
        return replace(self, last_error=message)

    def blocked(self, now: float) -> bool:
        return self.deploy_failed or now < self.until

    def expired(self, now: float) -> bool:
        """A hold that ended by ``now`` (the caller re-plans once, then ``with_expired``)."""
        return bool(self.until) and now >= self.until

    def with_expired(self) -> StartBackoff:
        return replace(self, until=0.0)
