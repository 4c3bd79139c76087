"""The proxy's Prometheus metrics (served on /metrics), per deployment.

A node runs several proxies on one port (``http_options.proxies_per_node``), and a scrape
reaches one of them at random; so each answers for all: its own samples and its siblings'
(``ProxyMetrics.own_text``, fetched over Ray), merged into one family per metric with a
``proxy`` label naming the listener, and the controller's figures once.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

LISTENER_LABEL = "proxy"

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
                     "starvation guard"),
                    ("cold_held", "cold_held_total", "requests held for the first replica of a "
                     "deployment at zero"),
                    ("cold_hinted", "cold_hinted_total", "requests at zero answered 503 with a "
                     "Retry-After instead"))


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
        self.controller_health = ControllerHealthCollector()  # the same on every listener
        self._shared = CollectorRegistry()
        self._shared.register(self.controller_health)
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

    def own_text(self) -> str:
        """This listener's samples alone (what a sibling asks for)."""
        return generate_latest(self.registry).decode()

    def render(self, listener: str = "0", siblings: dict[str, str] | None = None
               ) -> tuple[bytes, str]:
        """The node's exposition: this listener's samples and ``siblings``' (listener ->
        ``own_text``), each labelled with its listener, then the controller's figures."""
        merged = merge_listeners({listener: self.own_text(), **(siblings or {})})
        return merged + generate_latest(self._shared), CONTENT_TYPE_LATEST


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self):
        return iter(self._families)


def merge_listeners(texts: dict[str, str]) -> bytes:
    """One exposition from several listeners' (listener -> Prometheus text): one family
    per metric name, every sample labelled ``proxy=<listener>``."""
    families: dict[str, Metric] = {}
    for listener, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text):
            merged = families.setdefault(family.name, Metric(
                family.name, family.documentation, family.type, family.unit))
            merged.samples.extend(
                sample._replace(labels={**sample.labels, LISTENER_LABEL: listener})
                for sample in family.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)
