"""A deployment's routing limits as a router uses them, validated once when they arrive
from the owning shard (``wire.RoutingUpdate``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.routing.policies import RoutingPolicy
from controlplane.routing.retry_after import RetryAfterPolicy, check_policy
from controlplane.wire import RoutingUpdate


@dataclass(frozen=True)
class RoutingConfig:
    """A deployment's routing limits, as validated by the config schema."""

    deployment: str  # "app/name", for messages
    max_ongoing_requests: int
    max_queued_requests: int = -1  # -1: unlimited (Serve's default)
    status_code: int = 503
    retry_after_s: float | None = None
    retry_after_policy: RetryAfterPolicy = "static"
    policy: RoutingPolicy = field(default_factory=RoutingPolicy)  # request_router_config
    # scales to zero: a request may wait this long for the first replica, else 503 with a
    # Retry-After from the measured start time (``Router._wait_cold``); None: it never does
    cold_hold_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_ongoing_requests < 1:
            raise ValueError(f"max_ongoing_requests must be >= 1, got {self.max_ongoing_requests}")
        if self.max_queued_requests < -1:
            raise ValueError("max_queued_requests must be -1 (unlimited) or >= 0, got "
                             f"{self.max_queued_requests}")
        check_policy(self.retry_after_policy)

    @classmethod
    def from_update(cls, deployment: str, update: RoutingUpdate) -> RoutingConfig:
        """From the owning shard's routing update."""
        return cls(deployment=deployment, max_ongoing_requests=update.max_ongoing_requests,
                   max_queued_requests=update.max_queued_requests,
                   status_code=update.status_code, retry_after_s=update.retry_after_s,
                   retry_after_policy=update.retry_after_policy,
                   policy=RoutingPolicy.from_wire(dict(update.request_router)),
                   cold_hold_s=getattr(update, "cold_hold_s", None))
