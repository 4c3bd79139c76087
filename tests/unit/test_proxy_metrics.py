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


def test_each_deployment_router_is_exported():
    from controlplane.routing.router import RouterStatistics

    metrics = ProxyMetrics()
    metrics.routers.statistics = lambda: [RouterStatistics(
        "app/model", num_replicas=3, queued=2, in_flight=5, assigned_total=40, rejected_total=1,
        probe_failures_total=4, tickets_total=0, backoff_streak=0, last_retry_after_s=None,
        unreachable_replicas=1)]
    body = metrics.render()[0].decode()
    for line in ('fleetplane_router_replicas{deployment="app/model"} 3.0',
                 'fleetplane_router_queued{deployment="app/model"} 2.0',
                 'fleetplane_router_in_flight{deployment="app/model"} 5.0',
                 'fleetplane_router_unreachable_replicas{deployment="app/model"} 1.0',
                 'fleetplane_router_assigned_total{deployment="app/model"} 40.0',
                 'fleetplane_router_probe_failures_total{deployment="app/model"} 4.0'):
        assert line in body, line
