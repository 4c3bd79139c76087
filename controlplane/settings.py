"""Operator tunables: one documented tree of frozen dataclasses, passed explicitly.

Nothing here is read from the environment at import time. The CLI builds a ``Settings``
and hands it to the controller, which hands each part to the actors that need it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


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


@dataclass(frozen=True)
class ShardSettings:
    tick_interval_s: float = 0.1            # reconcile loop period of a shard
    unhealthy_threshold: int = 3            # consecutive failed checks before replacement
    replica_start_timeout_s: float = 300.0  # constructor + first health check
    max_constructor_retries: int = 3        # then DEPLOY_FAILED until the next deploy
    start_backoff_initial_s: float = 0.5    # doubles per consecutive start failure...
    start_backoff_max_s: float = 30.0       # ...up to this
    rank_error_retry_s: float = 30.0        # seed 000: back off an erroring rank pass
    rolling_surge_fraction: float = 0.2     # extra replicas a rolling update may start
    # Starts in flight per deployment (0: no bound): a scale-up to 32K asks Ray for this
    # many actors at once, not 32K, and starts the next as each one is RUNNING.
    max_starting_replicas: int = 512
    # Starts and stops carried out per slice of the loop (0: no bound). A tick that plans
    # more (a scale-up or rollout of thousands) does this many, then yields the event loop
    # (reports, probes, routing polls run) and does the next slice at once: the loop is
    # never blocked for a whole rollout step, and the rollout is not slowed.
    transitions_per_slice: int = 32
    # A new-version replica whose health checks start failing within this many health
    # periods of starting (declared unhealthy at unhealthy_threshold) rolls the rollout back.
    rollout_proving_periods: float = 3.0
    stop_grace_extra_s: float = 5.0         # on top of graceful_shutdown_timeout_s
    stall_episode_cap_s: float = 120.0      # seed 000: longest a stall verdict defers probes


@dataclass(frozen=True)
class ReplicaSettings:
    metrics_report_interval_s: float = 1.0  # replica -> shard metric reports
    # Reports travel through one reporter per node, which sends each shard one batch per
    # this interval (one Ray call per report cost a shard ~555 us of CPU: see
    # ``replicas.report_batch``). Unhealthy results always go directly. 0: every report
    # goes directly to the shard.
    report_batch_interval_s: float = 1.0
    # A stopping replica keeps serving this long first: routers learn it is leaving by
    # long-poll, and requests already sent to it still arrive (no 502 on scale-down).
    drain_min_s: float = 1.0
    # haproxy mode, phase 1 of a direct-ingress replica's stop: every node's HAProxy puts
    # it in drain then maint before it is asked to stop, and it stays reachable for
    # http_options.deregistration_window_s. False only to show what phase 1 prevents
    # (``release_tests.drain_events --no-phase-1``): the replica closes its listener as
    # soon as it is asked to stop, and HAProxy hears that it left a window later (as
    # membership applied by a reload would be), so it may still send it work.
    deregister_before_stop: bool = True


@dataclass(frozen=True)
class Settings:
    namespace: str = "fleetplane"
    controller_name: str = "fleetplane_controller"
    checkpoint_key: str = "fleetplane/controller/checkpoint"
    shard: ShardSettings = field(default_factory=ShardSettings)
    replica: ReplicaSettings = field(default_factory=ReplicaSettings)
    router: RouterSettings = field(default_factory=RouterSettings)
    # Serve's REST API (``serve_facade``): where fleetplane answers it when the cluster
    # has no Ray dashboard to (the embedded Ray of ``fleetplane run``). 8265 is the
    # dashboard's port, so Ray's ``serve`` CLI finds it with no ``-a``; 0: no listener
    # of ours (a dashboard, drivers and RayService still work); -1: no facade at all.
    serve_api_host: str = "127.0.0.1"
    serve_api_port: int = 8265
    # Where the controller, its shards and Serve's facade run (``control_placement``):
    # "head" (default), "workers" (off the head while a worker can take them) or "any"
    # (Ray's choice).
    control_plane_on: str = "head"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Settings":
        return cls(namespace=data["namespace"], controller_name=data["controller_name"],
                   checkpoint_key=data["checkpoint_key"],
                   shard=ShardSettings(**data["shard"]), replica=ReplicaSettings(**data["replica"]),
                   router=RouterSettings(**data.get("router", {})),
                   serve_api_host=data.get("serve_api_host", "127.0.0.1"),
                   serve_api_port=data.get("serve_api_port", 8265),
                   control_plane_on=data.get("control_plane_on", "head"))


def shard_actor_name(index: int) -> str:
    return f"fleetplane_shard_{index}"


# Node reporters (``replicas.node_reporter``): one per node, named after the node.
REPORTER_PREFIX = "fleetplane_reporter_"


def reporter_actor_name(node_id: str) -> str:
    return f"{REPORTER_PREFIX}{node_id}"


def uses_reporter(batch_interval_s: float, report_interval_s: float,
                  health_period_s: float) -> bool:
    """Whether a replica's reports go through its node's reporter: batching is on and its
    delay fits the freshness window. A push goes stale 1.5 periods after the previous one
    arrived; through a reporter arrivals are up to one report interval plus one batch
    interval apart, so batching is used only where that sum is at most one health period
    (the stock 10 s period with 1 s reports and 1 s batches: yes; a 1 s period: no, those
    replicas report directly)."""
    return 0 < batch_interval_s and batch_interval_s + report_interval_s <= health_period_s
