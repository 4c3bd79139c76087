"""The proxy's /metrics: its long-polls of the control plane are visible."""

from __future__ import annotations

from controlplane.proxy_metrics import ProxyMetrics
from controlplane.routing.subscriber import SubscriberStatistics


def test_long_poll_failures_and_unreachable_targets_are_exported_once_serving():
    metrics = ProxyMetrics()
    assert b"fleetplane_routing" not in metrics.render()[0]  # not serving yet
    metrics.routing.statistics = lambda: SubscriberStatistics(7, ("controller", "shard 1"))
    body = metrics.render()[0].decode()
    assert "fleetplane_routing_long_poll_failures_total 7.0" in body
    assert "fleetplane_routing_unreachable_targets 2.0" in body
