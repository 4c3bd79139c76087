"""The proxy's Prometheus metrics (served on /metrics), per deployment."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# ``controller.health``'s counters, each ``fleetplane_health_<name>``; tick_errors counts
# deployment ticks that raised in a shard (the controller's own health, not a replica's).
_HEALTH_COUNTERS = ("pushes", "heartbeats", "pull_probes", "stall_episodes",
                    "health_check_failures", "tick_errors")


class ControllerHealthCollector:
    """The controller's push-health figures (``status --json``'s ``controller.health``),
    refreshed by the proxy on each scrape."""

    def __init__(self) -> None:
        self.snapshot: dict | None = None

    def collect(self):
        snap = self.snapshot
        if not snap:
            return
        for name in _HEALTH_COUNTERS:
            yield CounterMetricFamily(f"fleetplane_health_{name}", f"push health: {name}",
                                      value=snap.get(f"{name}_total", 0))
        gauge = GaugeMetricFamily("fleetplane_health_self_check_interval_seconds",
                                  "gap between fresh self-check results, last 1-2 windows",
                                  labels=["quantile"])
        for quantile, value in (snap.get("self_check_interval_s") or {}).items():
            gauge.add_metric([quantile], math.nan if value is None else value)
        yield gauge


class RoutingCollector:
    """This proxy's long-polls of the control plane (``RoutingSubscriber.statistics``):
    failed calls, and the targets it cannot reach now (it keeps serving their last
    routes and replica sets meanwhile)."""

    def __init__(self) -> None:
        self.statistics = None  # a callable returning SubscriberStatistics, once serving

    def collect(self):
        if self.statistics is None:
            return
        stats = self.statistics()
        yield CounterMetricFamily("fleetplane_routing_long_poll_failures",
                                  "failed long-poll calls to the controller and shards",
                                  value=stats.failures_total)
        yield GaugeMetricFamily("fleetplane_routing_unreachable_targets",
                                "control actors this proxy cannot reach now",
                                value=len(stats.unreachable))


_ROUTER_GAUGES = (("replicas", "num_replicas", "RUNNING replicas the router places on"),
                  ("queued", "queued", "requests waiting in the router for a slot"),
                  ("in_flight", "in_flight", "the router's requests running on replicas"),
                  ("unreachable_replicas", "unreachable_replicas",
                   "replicas a call found unreachable, until a probe answers"))
_ROUTER_COUNTERS = (("assigned", "assigned_total", "requests placed on a replica"),
                    ("probe_failures", "probe_failures_total", "queue-length probes that failed"),
                    ("tickets", "tickets_total", "requests queued at a full replica by the "
                     "starvation guard"))


class RouterCollector:
    """This proxy's routers, one per deployment (``RouterSet.statistics``)."""

    def __init__(self) -> None:
        self.statistics = None  # a callable returning [RouterStatistics], once serving

    def collect(self):
        if self.statistics is None:
            return
        stats = self.statistics()
        for kinds, family in ((_ROUTER_GAUGES, GaugeMetricFamily),
                              (_ROUTER_COUNTERS, CounterMetricFamily)):
            for name, field, help_text in kinds:
                metric = family(f"fleetplane_router_{name}", help_text, labels=["deployment"])
                for s in stats:
                    metric.add_metric([s.deployment], getattr(s, field))
                yield metric


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("fleetplane_http_requests", "HTTP requests by outcome",
                                ["deployment", "route", "status_code"], registry=self.registry)
        self.latency = Histogram("fleetplane_http_request_latency_seconds",
                                 "Time to the response head", ["deployment", "route"],
                                 registry=self.registry,
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5,
                                          5, 10, 30, 60))
        self.controller_health = ControllerHealthCollector()
        self.registry.register(self.controller_health)
        self.routing = RoutingCollector()
        self.registry.register(self.routing)
        self.routers = RouterCollector()
        self.registry.register(self.routers)
        self.rejections = Counter("fleetplane_backpressure_rejections",
                                  "Requests rejected by backpressure",
                                  ["deployment", "status_code"], registry=self.registry)

        self.retry_after = Histogram("fleetplane_backpressure_retry_after_seconds",
                                     "Retry-After suggested on rejections (seed 002: to compare "
                                     "with observed drain times)", ["deployment"],
                                     registry=self.registry, buckets=(1, 2, 3, 5, 8, 13, 21, 34, 60))

    def reject(self, deployment: str, status: int, retry_after_s: int | None) -> None:
        self.rejections.labels(deployment, str(status)).inc()
        if retry_after_s is not None:
            self.retry_after.labels(deployment).observe(retry_after_s)

    def observe(self, deployment: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(deployment, route, str(status)).inc()
        self.latency.labels(deployment, route).observe(seconds)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
