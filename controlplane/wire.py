"""Every message that crosses an actor boundary, in one place.

Senders and receivers import their shapes from here and from nowhere else, so neither
package reaches into the other's modules: ``replicas/`` depends on the control plane only
through this module, the routing package and the kernel (``clock``, ``settings``,
``errors``); the control plane never imports ``replicas/`` (the shard starts the replica
actor by its import path, ``REPLICA_ACTOR_CLASS``; the controller the node reporters by
``START_REPORTERS``). ``tests/unit/test_layering.py``
keeps it so.

Every type is a frozen dataclass or a ``NamedTuple`` of plain values, so it pickles through
Ray. The ``NamedTuple``s are the messages made once per replica start or report
(``ReplicaInit``, ``ReplicaInfo``, ``ReportRow``): a tuple is built in one C call where a
frozen dataclass sets each field through ``object.__setattr__``. A new field gets a
default, so an older sender stays valid during a rolling upgrade.

| message | from -> to | carried by |
|---|---|---|
| ``ReplicaInit`` | shard -> replica | the replica actor's constructor |
| ``MetricReport`` | replica -> shard | ``ControllerShard.report_metrics`` |
| ``PushedHealth`` | replica -> shard | on a ``MetricReport``, or ``report_health`` |
| ``DeploymentRef`` | controller's build -> replica | a constructor argument |
| ``ReplicaDescription`` | replica -> a recovering shard | ``Replica.describe`` |
| ``RequestError`` | replica -> shard | ``ControllerShard.report_request_error`` |
| ``RoutingUpdate`` / ``ReplicaInfo`` | shard -> proxies, handles | ``listen_routing`` |
| ``Deltas`` of ``RoutingDelta`` | shard -> routers already holding a version | ``listen_routing`` |
| batch ``ReportRow``s | node reporter -> shard | ``ControllerShard.report_batch`` |
| ``RoutesUpdate`` | controller -> proxies, handles | ``listen_routes`` |
| ``HTTPRequestData`` | proxy -> replica | ``Replica.handle_http`` |
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# The replica actor the shard starts (``module:Class``), resolved when the shard's
# replica client is built: the control plane names it and never imports it.
REPLICA_ACTOR_CLASS = "replicas.replica:Replica"
# What the controller calls to create node reporters (``module:function``), the same way.
START_REPORTERS = "replicas.node_reporter:start_reporters"


@dataclass(frozen=True)
class HTTPLimits:
    """What one HTTP client may send, and how many may connect: ``http_options``' limits,
    as each listener (a proxy, or a direct-ingress replica) enforces them
    (``controlplane.routing.http_limits``, ``http_connection``). The defaults are stated
    here once; ``config.options.HTTPOptions`` takes them from here and explains each."""

    max_request_body_bytes: int = 64 * 2**20
    max_header_bytes: int = 64 * 2**10
    request_header_timeout_s: float = 30.0
    keep_alive_timeout_s: float = 90.0
    request_body_timeout_s: float = 60.0
    max_connections: int = 10_000


@dataclass(frozen=True)
class DirectIngressInit:
    """An ingress replica in ``http_options.ingress: haproxy`` mode serves HTTP itself,
    on an ephemeral port of ``host``, behind its node's HAProxy, through the same front
    door as a proxy (``controlplane.routing.front_door``)."""

    host: str
    route_prefix: str
    max_queued_requests: int
    status_code: int  # a backpressure rejection's status
    retry_after_s: float | None
    deregistration_window_s: float  # reachable after HAProxy stopped sending it work
    limits: HTTPLimits  # the same limits as the proxy's
    retry_after_policy: str = "static"  # computed at the replica as a router computes it
    deployment: str = ""  # "app/name", for a rejection's message
    show_error_messages: bool = False  # http_options': a 500 carries the exception's text


class ReplicaInit(NamedTuple):
    """Everything a replica needs to construct the user's code and report to its shard.
    Who the replica is comes first: the rest is what every replica started from one spec
    is told (``for_replica``)."""

    replica_id: str
    rank: int
    app_name: str
    deployment: str
    serialized_def: bytes
    user_config: Any
    max_ongoing_requests: int
    shard_name: str
    namespace: str
    metrics_report_interval_s: float
    code_version: str = ""  # the spec's, so a recovering shard can re-adopt the replica
    # Defaults are the stock DEPLOYMENT_DEFAULTS / ShardSettings values.
    health_check_period_s: float = 10.0
    health_check_timeout_s: float = 30.0
    unhealthy_threshold: int = 3
    drain_min_s: float = 1.0  # ReplicaSettings.drain_min_s
    direct_ingress: DirectIngressInit | None = None  # haproxy mode, ingress deployments
    world_size: int = 1  # the deployment's target replicas when this one was made (Serve's)
    # Reports go through the node's reporter in batches of this interval; 0: directly.
    report_batch_interval_s: float = 0.0

    def for_replica(self, replica_id: str, rank: int) -> ReplicaInit:
        """A copy with another replica's id and rank: the shard builds the rest once per
        spec, not per start."""
        return ReplicaInit(replica_id, rank, *self[2:])


@dataclass(frozen=True)
class PushedHealth:
    """A replica's self-health result as pushed to its shard (seed 000)."""

    healthy: bool
    checked_at: float  # replica's monotonic clock when the check completed
    consecutive_failures: int  # advances at most once per health period (replica side)
    error: str = ""  # an unhealthy result's cause, one short line (status shows it)

    def __post_init__(self) -> None:
        if self.consecutive_failures < 0:
            raise ValueError(f"consecutive_failures must be >= 0, got {self!r}")
        if not self.healthy and self.consecutive_failures == 0:
            raise ValueError(f"an unhealthy result has consecutive_failures >= 1: {self!r}")


@dataclass(frozen=True)
class MetricReport:
    """One replica's periodic load report to its shard."""

    replica_id: str
    ongoing_requests: int  # executing now
    queued_requests: int  # accepted, waiting for a slot
    # Push health (seed 000): the replica's newest self-check result rides on the report it
    # sends anyway; None before its first check completed, or from a non-pushing sender.
    health: PushedHealth | None = None

    def __post_init__(self) -> None:
        if self.ongoing_requests < 0 or self.queued_requests < 0:
            raise ValueError(f"request counts must be >= 0, got {self!r}")

    @property
    def load(self) -> int:
        """Requests this replica holds: the quantity autoscaling targets per replica."""
        return self.ongoing_requests + self.queued_requests


@dataclass(frozen=True)
class ReplicaDescription:
    """What a recovering shard needs to re-adopt a live replica without restarting it:
    who it is, its rank and versions as the replica itself knows them, where it runs, and
    the result of a fresh self-check run for this answer (never a cached one)."""

    replica_id: str
    rank: int
    code_version: str
    user_config: Any
    actor_id: str
    node_id: str
    initialized: bool  # False: its constructor or first check has not finished
    stopping: bool  # the previous shard already asked it to stop
    healthy: bool
    message: str = ""  # why the fresh check failed
    http_address: str | None = None  # its direct ingress, in haproxy mode


@dataclass(frozen=True)
class RequestError:
    """The user's code raised on requests of one replica (``DeploymentRaised``): the newest
    error, and how many were raised since the replica last said so. The traceback stays
    in the replica's log, under ``request_id``."""

    request_id: str
    error: str  # "Type: message", one line
    at_s: float  # wall-clock time of the newest
    count: int = 1


@dataclass(frozen=True)
class DeploymentRef:
    """Stands in for a bound deployment passed as a constructor argument (composition);
    the replica turns it into a handle."""

    app: str
    name: str


class ReplicaInfo(NamedTuple):
    """One RUNNING replica, as routers see it."""

    replica_id: str
    actor_name: str
    node_id: str | None = None
    http_address: str | None = None  # "host:port" of its direct ingress (haproxy mode)
    model_ids: tuple[str, ...] = ()  # multiplexed models it holds (Serve's @serve.multiplexed)


@dataclass(frozen=True)
class RequestMeta:
    """What a handle call carries besides its arguments (``handle.options(...)``)."""

    model_id: str = ""  # multiplexed_model_id: routed to a replica holding it, if any


@dataclass(frozen=True)
class RoutingUpdate:
    """What routers need of one deployment: its serving replicas and its limits.

    Published by the owning shard whenever membership or limits change; a router applies
    the replica set as a whole (replicas not in it are gone or stopping).
    """

    replicas: tuple[ReplicaInfo, ...]
    max_ongoing_requests: int
    max_queued_requests: int = -1  # -1: unlimited (Serve's default)
    status_code: int = 503  # backpressure_config
    retry_after_s: float | None = None
    retry_after_policy: str = "static"
    demand: ClusterDemand | None = None  # cluster_informed only: the latest total
    # the routing policy (routing.policies.RoutingPolicy's fields, sorted); () is p2c
    request_router: tuple[tuple[str, Any], ...] = ()
    # scale from zero (autoscaling min_replicas 0): seconds a request may wait for the
    # first replica (autoscaling_config.cold_start_hold_s); None: never scaled to zero
    cold_hold_s: float | None = None


@dataclass(frozen=True)
class RouterDemand:
    """One router's report: requests queued at it, assignments and arrivals per second."""

    queued: int
    drain_per_s: float
    arrivals_per_s: float

    @property
    def idle(self) -> bool:
        return self.queued == 0 and self.arrivals_per_s == 0


@dataclass(frozen=True)
class ClusterDemand:
    """A deployment's demand over all its routers, as its shard publishes it
    (``deployment.demand_board``; read by the ``cluster_informed`` Retry-After policy,
    ``routing.retry_after``)."""

    queued: int
    drain_per_s: float
    arrivals_per_s: float
    routers: int
    # A scale-up in progress: seconds until the replicas now starting are expected to be
    # RUNNING (None: none starting), and (running + starting) / running.
    scaleup_eta_s: float | None = None
    capacity_growth: float = 1.0


@dataclass(frozen=True)
class RoutingDelta:
    """A change of a deployment's serving set since one version, sent instead of the whole
    set (a start or a stop costs routers that replica, not all thousands): replicas that
    joined or changed what routers see of them, and ids that left. Limits do not change
    in a delta (a limit change is a full ``RoutingUpdate``)."""

    added: tuple[ReplicaInfo, ...] = ()
    removed: tuple[str, ...] = ()
    demand: ClusterDemand | None = None  # a new total (cluster_informed), if any


@dataclass(frozen=True)
class Deltas:
    """What a long-poll host sends a listener that holds version ``base`` of a payload:
    the changes since then, in order (for routing: ``RoutingDelta``s). The listener
    applies them to the payload it holds at ``base``."""

    base: int
    deltas: tuple[Any, ...]


def apply_routing_delta(update: RoutingUpdate, delta: RoutingDelta) -> RoutingUpdate:
    """The full update after ``delta``: replicas sorted by id, as a full build makes it."""
    if delta.demand is not None:
        update = dataclasses.replace(update, demand=delta.demand)
    if not delta.added and not delta.removed:
        return update  # the same replicas tuple: routers need not rebuild their set
    replicas = {r.replica_id: r for r in update.replicas}
    for replica_id in delta.removed:
        replicas.pop(replica_id, None)
    for info in delta.added:
        replicas[info.replica_id] = info
    return dataclasses.replace(update, replicas=tuple(replicas[i] for i in sorted(replicas)))


ROUTES_KEY = "routes"  # the controller's long-poll key for ``RoutesUpdate``


@dataclass(frozen=True)
class RoutesUpdate:
    """The controller's route table: prefix -> "app/deployment" of the ingress, and the
    shard count (fixed for an instance's life) that subscribers follow."""

    num_shards: int
    generation: int
    routes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HTTPRequestData:
    """What crosses from the proxy to a replica: small, picklable, no sockets."""

    method: str
    path: str
    query_string: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    route_prefix: str = "/"
    client: tuple[str, int] | None = None


class ReportRow(NamedTuple):
    """One replica's report in a node reporter's batch: a ``MetricReport`` flattened, so a
    steady row is a few dozen bytes and loads without a dataclass per row. ``healthy`` is
    None for a report without health (then the three health fields are unused)."""

    replica_id: str
    ongoing: int
    queued: int
    healthy: bool | None
    checked_at: float
    failures: int
    error: str


# A node reporter sends a shard one ``Batch`` per interval: rows grouped by (app, deployment).
DeploymentKey = tuple[str, str]
Batch = dict[DeploymentKey, list[ReportRow]]


def report_row(report: MetricReport) -> ReportRow:
    """The row of a report (``_make``: built from one tuple, not seven arguments)."""
    h = report.health
    if h is None:
        return _make_row((report.replica_id, report.ongoing_requests, report.queued_requests,
                          None, 0.0, 0, ""))
    return _make_row((report.replica_id, report.ongoing_requests, report.queued_requests,
                      h.healthy, h.checked_at, h.consecutive_failures, h.error))


_make_row = ReportRow._make
