"""The data a ``Router`` is built from and hands out: its config, its tunables, the
replicas it places onto, the transport it calls them through, its error types and its
statistics. No behaviour here beyond validation.

Error types decide behaviour (STYLE.md habit 7) and carry a status hint for the proxy;
each passes every field to ``super().__init__`` so it pickles across actors (a handle's
caller may be another replica, which re-raises it to its own caller through Ray).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from controlplane.retry_after import RetryAfterPolicy, check_policy


class BackpressureError(Exception):
    """Overloaded: the router's queue is full. Answer ``status_code`` with ``headers()``.

    ``retry_after_s`` is RFC 9110 delay-seconds (integer, already rounded up), or None
    when no value is known (then send no Retry-After header).
    """

    def __init__(self, status_code: int, retry_after_s: int | None, message: str) -> None:
        super().__init__(status_code, retry_after_s, message)
        self.status_code = status_code
        self.retry_after_s = retry_after_s
        self.message = message

    def __str__(self) -> str:
        return self.message

    def headers(self) -> dict[str, str]:
        """Response headers for an HTTP rejection (RFC 9110 section 10.2.3)."""
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


class ReplicaUnavailableError(Exception):
    """The replica's actor was gone (died, or unreachable) while it held the request.

    Not retried by the router: the request may have partly run, and a second run of a
    non-idempotent request is worse than a clear error. 502 because the gateway got no
    valid response from the server it forwarded to (RFC 9110 section 15.6.3); 503 stays
    reserved for backpressure, which is safe to retry.
    """

    status_code = 502

    def __init__(self, replica_id: str, reason: str, deployment: str = "") -> None:
        super().__init__(replica_id, reason, deployment)
        self.replica_id = replica_id
        self.reason = reason
        self.deployment = deployment

    def __str__(self) -> str:
        where = f" of deployment {self.deployment}" if self.deployment else ""
        return (f"replica {self.replica_id}{where} became unavailable while handling the "
                f"request ({self.reason}); the request was not retried because it may have "
                f"partly run")


class RouterClosedError(Exception):
    """The router was closed (deployment deleted, or the process is shutting down)."""

    status_code = 503

    def __init__(self, deployment: str, reason: str) -> None:
        super().__init__(deployment, reason)
        self.deployment = deployment
        self.reason = reason

    def __str__(self) -> str:
        return f"deployment {self.deployment} no longer takes requests: {self.reason}"


@dataclass(frozen=True)
class ReplicaInfo:
    """One RUNNING replica as pushed by the owning shard (``routing_update()`` entries)."""

    replica_id: str
    actor_name: str
    node_id: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplicaInfo:
        return cls(replica_id=data["replica_id"], actor_name=data["actor_name"],
                   node_id=data.get("node_id"))


@dataclass(frozen=True)
class RoutingConfig:
    """A deployment's routing limits, as validated by the config schema."""

    deployment: str  # "app/name", for messages
    max_ongoing_requests: int
    max_queued_requests: int = -1  # -1: unlimited (Serve's default)
    status_code: int = 503
    retry_after_s: float | None = None
    retry_after_policy: RetryAfterPolicy = "static"

    def __post_init__(self) -> None:
        if self.max_ongoing_requests < 1:
            raise ValueError(f"max_ongoing_requests must be >= 1, got {self.max_ongoing_requests}")
        if self.max_queued_requests < -1:
            raise ValueError("max_queued_requests must be -1 (unlimited) or >= 0, got "
                             f"{self.max_queued_requests}")
        check_policy(self.retry_after_policy)

    @classmethod
    def from_routing_update(cls, deployment: str, payload: Mapping[str, Any]) -> RoutingConfig:
        """From a shard's ``DeploymentState.routing_update()`` payload."""
        backpressure = payload.get("backpressure_config") or {}
        return cls(deployment=deployment,
                   max_ongoing_requests=int(payload["max_ongoing_requests"]),
                   max_queued_requests=int(payload["max_queued_requests"]),
                   status_code=int(backpressure.get("status_code", 503)),
                   retry_after_s=backpressure.get("retry_after_s"),
                   retry_after_policy=backpressure.get("retry_after_policy") or "static")


@dataclass(frozen=True)
class RouterSettings:
    """Operator tunables of every router (to join the ``Settings`` tree)."""

    probe_deadline_s: float = 0.1  # a probe slower than this counts as "unknown", not a wait
    # Others' share of a replica's queue is refreshed when older than this. Shorter than
    # Serve's 10 s because our replies do not piggyback queue lengths; only probes do.
    queue_len_ttl_s: float = 2.0
    # While requests wait and some slot may be held by another router, re-probe after
    # 25 ms, doubling to 100 ms. Serve 2.60 caps at 0.5 s, which leaves a 0.5 s replica
    # idle for most of a backoff; our own completions wake waiters with no backoff at all.
    backoff_initial_s: float = 0.025
    backoff_max_s: float = 0.1
    max_pairs: int = 3  # power-of-two-choices pairs tried per placement
    # Starvation guard: after this many fruitless backoffs (25+50+100 ms), queue one
    # request at a full replica where this router holds no slot (see Router._take_ticket).
    ticket_after_backoffs: int = 3


class ReplicaTransport(Protocol):
    """How a router reaches replicas; the proxy and handles implement it over Ray.

    ``send`` raises ``ReplicaUnavailableError`` when the replica's actor is gone (Ray's
    ActorDiedError / ActorUnavailableError for *this* call); any other exception is the
    user's and passes through the router unchanged. ``probe_queue_len`` answers the
    replica's ongoing + queued requests (``Replica.get_queue_len``), within ``deadline_s``,
    and must never wait for a request slot (DESIGN.md principle 3).
    """

    async def send(self, replica: ReplicaInfo, request: Any) -> Any: ...

    async def probe_queue_len(self, replica: ReplicaInfo, deadline_s: float) -> int: ...


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
