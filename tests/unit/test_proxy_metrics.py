"""The proxy's /metrics: its long-polls of the control plane are visible."""

from __future__ import annotations

from controlplane.ingress.proxy_metrics import ProxyMetrics
from controlplane.routing.reachability import SubscriberStatistics


def test_long_poll_failures_and_unreachable_targets_are_exported_once_serving():
    metrics = ProxyMetrics()
    assert b"fleetplane_routing" not in metrics.render()[0]  # not serving yet
    metrics.routing.statistics = lambda: SubscriberStatistics(7, ("controller", "shard 1"))
    body = metrics.render()[0].decode()
    assert 'fleetplane_routing_long_poll_failures_total{proxy="0"} 7.0' in body
    assert 'fleetplane_routing_unreachable_targets{proxy="0"} 2.0' in body


def test_each_deployment_router_is_exported():
    from controlplane.routing.router_stats import RouterStatistics

    metrics = ProxyMetrics()
    metrics.routers.statistics = lambda: [RouterStatistics(
        "app/model", num_replicas=3, queued=2, in_flight=5, assigned_total=40, rejected_total=1,
        probe_failures_total=4, tickets_total=0, backoff_streak=0, last_retry_after_s=None,
        unreachable_replicas=1)]
    body = metrics.render()[0].decode()
    for line in ('fleetplane_router_replicas{deployment="app/model",proxy="0"} 3.0',
                 'fleetplane_router_queued{deployment="app/model",proxy="0"} 2.0',
                 'fleetplane_router_in_flight{deployment="app/model",proxy="0"} 5.0',
                 'fleetplane_router_unreachable_replicas{deployment="app/model",proxy="0"} 1.0',
                 'fleetplane_router_assigned_total{deployment="app/model",proxy="0"} 40.0',
                 'fleetplane_router_probe_failures_total{deployment="app/model",proxy="0"} 4.0'):
        assert line in body, line


def test_a_scrape_of_any_listener_shows_the_whole_node_once():
    """Two listeners on one port: each answers for both, one family per metric, every
    sample labelled with its listener, the controller's figures once and unlabelled."""
    from prometheus_client.parser import text_string_to_metric_families

    first, second = ProxyMetrics(), ProxyMetrics()
    first.observe("app/model", "/app", 200, 0.01)
    second.observe("app/model", "/app", 200, 0.02)
    second.observe("app/model", "/app", 503, 0.001)
    first.controller_health.snapshot = {"pushes_total": 12}
    body = first.render("0", {"1": second.own_text()})[0].decode()

    families = list(text_string_to_metric_families(body))  # valid text, names unique
    names = [f.name for f in families]
    assert len(names) == len(set(names))
    [requests] = [f for f in families if f.name == "fleetplane_http_requests"]
    counts = {(s.labels["proxy"], s.labels["status_code"]): s.value
              for s in requests.samples if s.name.endswith("_total")}
    assert counts == {("0", "200"): 1.0, ("1", "200"): 1.0, ("1", "503"): 1.0}
    assert body.count("fleetplane_health_pushes_total 12.0") == 1
    [latency] = [f for f in families if f.name == "fleetplane_http_request_latency_seconds"]
    sums = {s.labels["proxy"]: s.value for s in latency.samples if s.name.endswith("_sum")}
    assert sums == {"0": 0.01, "1": 0.021}
