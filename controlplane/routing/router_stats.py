"""What a router counts (``RouterCounters``) and shows of itself (``RouterStatistics``: the
proxy's /metrics and status), apart from the router's decisions."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RouterStatistics:
    """A snapshot for /metrics and status."""

    deployment: str
    num_replicas: int
    queued: int  # requests waiting in this router for a slot
    in_flight: int  # this router's requests running on replicas (draining ones included)
    assigned_total: int
    rejected_total: int
    probe_failures_total: int
    tickets_total: int  # requests queued at a full replica by the starvation guard
    backoff_streak: int
    last_retry_after_s: int | None
    unreachable_replicas: int
    in_flight_by_replica: dict[str, int] = field(default_factory=dict)
    cold_held_total: int = 0  # requests held for a first replica (scale from zero)
    cold_hinted_total: int = 0  # requests answered 503 + Retry-After instead


class RouterCounters:
    """What a router has done since it started (the totals of ``RouterStatistics``)."""

    __slots__ = ("assigned", "rejected", "probe_failures", "tickets", "held", "hinted")

    def __init__(self) -> None:
        self.assigned = 0  # requests placed on a replica
        self.rejected = 0  # requests shed at admission
        self.probe_failures = 0
        self.tickets = 0  # requests queued at a full replica by the starvation guard
        self.held = 0  # requests that waited for a first replica (scale from zero)
        self.hinted = 0  # requests told when to come back instead (503 + Retry-After)
