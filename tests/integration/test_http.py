"""The data plane over real HTTP: routing, response kinds, composition, backpressure,
a replica dying mid-request, the proxy's own endpoints."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import ray
import requests
from ray._private.state import actors

from tests.integration.conftest import BASE_URL, app, dep_status, deploy, settled, wait_for

pytestmark = pytest.mark.integration
APPS = "tests.integration.apps"


# seed 002's policy with a static fallback it cannot compute: told "7" only while cold
COMPUTED = {"status_code": 429, "retry_after_s": 7, "retry_after_policy": "router_queue_drain_rate"}


def get(path: str, **kwargs) -> requests.Response:
    return requests.get(BASE_URL + path, timeout=30, **kwargs)


@pytest.fixture(scope="module")
def http_apps(fleet):
    deploy(fleet,
           app("web", f"{APPS}:HttpModel", deployments=[{"name": "HttpModel", "num_replicas": 2}]),
           app("serveweb", f"{APPS}:composed_app",
               deployments=[{"name": "Composer"}, {"name": "Doubler"}]),
           app("slow", f"{APPS}:Sleeper", deployments=[{
               "name": "Sleeper", "max_ongoing_requests": 1, "max_queued_requests": 1,
               "backpressure_config": {"status_code": 429, "retry_after_s": 1.5}}]),
           app("slow503", f"{APPS}:Sleeper", deployments=[{
               "name": "Sleeper", "max_ongoing_requests": 1, "max_queued_requests": 0}]),
           app("hangup", f"{APPS}:Sleeper", deployments=[{
               "name": "Sleeper", "max_ongoing_requests": 1}]),
           app("broken", f"{APPS}:BrokenModel", deployments=[{"name": "BrokenModel"}]),
           app("computed", f"{APPS}:Sleeper", deployments=[{
               "name": "Sleeper", "max_ongoing_requests": 1, "max_queued_requests": 0,
               "backpressure_config": COMPUTED}]))
    wait_for(fleet, lambda s: settled("web", 2, "HttpModel")(s) and settled("serveweb", 1, "Composer")(s)
             and settled("serveweb", 1, "Doubler")(s) and settled("slow", 1, "Sleeper")(s)
             and settled("slow503", 1, "Sleeper")(s) and settled("hangup", 1, "Sleeper")(s)
             and settled("computed", 1, "Sleeper")(s), what="http apps")
    wait_for(fleet, lambda s: get("/-/routes").json().get("/web") == "web/HttpModel",
             what="proxy routes")
    return fleet


def test_routing_json_bytes_text_response_and_404(http_apps):
    assert get("/web/a/b?kind=json").json() == {"path": "/web/a/b", "query": {"kind": "json"}}
    assert get("/web?kind=bytes").content == b"\x00\x01raw"
    teapot = get("/web?kind=response")
    assert (teapot.status_code, teapot.text) == (418, "teapot")
    assert get("/web/x").text == "hello from /web/x"
    missing = get("/webby")  # a prefix matches at segment boundaries only
    assert missing.status_code == 404


def test_streaming_response_arrives_in_chunks(http_apps):
    with requests.get(BASE_URL + "/web?kind=stream", stream=True, timeout=30) as r:
        chunks = [c for c in r.iter_content(chunk_size=None) if c]
    assert b"".join(chunks) == b"".join(f"chunk{i}\n".encode() for i in range(5))
    assert len(chunks) >= 2


def test_a_user_exception_is_a_500_naming_a_request_id_not_its_message(fleet, http_apps):
    r = get("/web?kind=error")
    assert r.status_code == 500
    request_id = r.headers["x-request-id"]
    assert r.text == f"Internal Server Error (request id {request_id})"  # the log has the rest
    shown = wait_for(fleet, lambda s: dep_status(s, "web", "HttpModel").get(
        "request_errors", {}).get("last", {}).get("request_id") == request_id,
        what="the error in status")  # the replica tells its shard; status names the id
    last = dep_status(shown, "web", "HttpModel")["request_errors"]["last"]
    assert "bad input from the user's code" in last["error"]


def test_serve_bind_app_with_handle_composition(http_apps):
    assert get("/serveweb?x=7").json() == {"double": 14, "triple": 21}


@pytest.mark.parametrize("route,code,retry_after", [("/slow", 429, "2"), ("/slow503", 503, None)])
def test_overload_rejects_with_retry_after_and_serves_admitted(http_apps, route, code,
                                                               retry_after):
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda _: get(f"{route}?s=1.0"), range(8)))
    codes = sorted(r.status_code for r in responses)
    assert codes.count(200) >= 1 and codes.count(code) >= 4
    assert set(codes) <= {200, code}
    for r in responses:
        if r.status_code == code:
            assert r.headers.get("Retry-After") == retry_after
    assert all(r.text == "done" for r in responses if r.status_code == 200)


def test_overload_after_traffic_is_told_the_retry_after_the_routers_compute(http_apps):
    """A router's drain rate warms with the traffic it placed (both proxies get some: each
    request opens a connection of its own); then what it rejects is told the computed
    value (no request queued ahead: the 1 s floor), not the static 7 of a cold router."""
    warm_until = time.monotonic() + 4.5
    while time.monotonic() < warm_until:
        assert get("/computed?s=0.05").text == "done"
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda _: get("/computed?s=1.0"), range(8)))
    rejected = [r for r in responses if r.status_code == 429]
    assert rejected and {r.status_code for r in responses} <= {200, 429}
    assert {r.headers.get("Retry-After") for r in rejected} == {"1"}


def test_replica_killed_mid_request_fails_fast_with_5xx(http_apps, fleet):
    actor = _replica_actor(fleet, "slow503")
    pid = actors(actor._actor_id.hex())["Pid"]  # the GCS's table: no dashboard needed
    result = {}

    def send() -> None:  # until admitted: a proxy's router may still see the replica busy
        deadline = time.monotonic() + 10  # from the overload test (two proxies, two views)
        # A rejection is a 503 that says "overloaded" (with or without Retry-After,
        # depending on whether the drain-rate estimator is warm).
        while "is overloaded" in (r := get("/slow503?s=20")).text and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        result.update(r=r)

    worker = threading.Thread(target=send)
    worker.start()
    wait_for(fleet, lambda s: _in_flight(actor) == 1, what="request in flight")
    os.kill(pid, signal.SIGKILL)
    worker.join(timeout=15)
    assert not worker.is_alive(), "the request hung after its replica died"
    assert result["r"].status_code == 502
    assert "became unavailable" in result["r"].text
    wait_for(fleet, settled("slow503", 1, "Sleeper"), what="replacement")


def test_healthz_and_metrics(http_apps):
    assert get("/-/healthz").text == "success"
    get("/web")
    metrics = get("/metrics").text
    assert 'fleetplane_http_requests_total{deployment="web/HttpModel"' in metrics
    assert "fleetplane_http_request_latency_seconds_bucket" in metrics
    # The controller's push-health figures ride along: one scrape shows both planes.
    assert "fleetplane_health_pushes_total" in metrics
    assert "fleetplane_health_pull_probes_total" in metrics
    assert 'fleetplane_health_self_check_interval_seconds{quantile="p50"}' in metrics
    # Either listener answers for both (http_options.proxies_per_node: 2).
    for listener in ("0", "1"):
        assert f'fleetplane_routing_long_poll_failures_total{{proxy="{listener}"}}' in metrics
        assert (f'fleetplane_router_replicas{{deployment="web/HttpModel",proxy="{listener}"}}'
                in metrics)


def test_no_running_replicas_is_an_immediate_503(http_apps):
    r = get("/broken")
    assert r.status_code == 503
    assert r.headers.get("Retry-After") == "1"
    assert "no running replicas" in r.text


def _replica_actor(fleet, app_name: str):
    replica = dep_status(fleet.status(), app_name, "Sleeper")["replicas"][0]
    return ray.get_actor(replica["actor_name"], namespace="fleetplane")


def _in_flight(actor) -> int:
    """Requests the replica holds, running or waiting for a slot, as routers probe it."""
    return ray.get(actor.get_queue_len.remote())


def test_client_disconnect_frees_the_slot(http_apps, fleet):
    with pytest.raises(requests.exceptions.Timeout):
        requests.get(BASE_URL + "/hangup?s=30", timeout=1.0)
    # The proxy cancels the request with its client: the replica's only slot frees long
    # before the 30 s handler would have ended, and the next request is served.
    wait_for(fleet, lambda s: _in_flight(_replica_actor(fleet, "hangup")) == 0, timeout_s=10,
             what="slot freed after the client left")
    assert get("/hangup?s=0").text == "done"
