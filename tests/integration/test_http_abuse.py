"""Abuse against a live proxy (issue 15): while oversized bodies, huge heads, slow heads
and bodies, idle clients and malformed bytes arrive, a normal client keeps > 99% success,
each abuser gets its answer (413, 431, 408, 400, or a silent close) and the proxy's memory
comes back to within 20% of its baseline; past its cap of open connections a new one is
closed at once. On an instance of its own with small limits; the burst is bounded: 178
connections, 16 at a time, loopback, about 5 s (under 20 s asserted).
``release_tests/http_abuse.py`` is the longer measurement."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import ray
import requests

from controlplane.config.schema import parse_deploy_config
from controlplane.ingress.listener import proxy_actor_name
from tests import abuse_clients as abuse
from tests.integration.conftest import app, own_fleet, port_of, settled, wait_for

pytestmark = pytest.mark.integration

NAMESPACE = "fleetplane_abuse"
LIMITS = {"max_request_body_bytes": 1 << 20, "max_header_bytes": 16384,
          "request_header_timeout_s": 2.0, "request_body_timeout_s": 2.0,
          "keep_alive_timeout_s": 5.0, "max_connections": 100}


@pytest.fixture(scope="module")
def abused(fleet):
    with own_fleet(NAMESPACE) as client:
        port = port_of(client)
        client.deploy(parse_deploy_config({
            "applications": [app("web", "tests.integration.apps:HttpModel",
                                 deployments=[{"name": "HttpModel"}])],
            "controller_options": {"num_shards": 1},
            "http_options": {"host": "127.0.0.1", "port": port, "proxies_per_node": 1,
                             **LIMITS}}))
        wait_for(client, settled("web", 1, "HttpModel"), what="the app")
        url = f"http://127.0.0.1:{port}/web?kind=size"
        wait_for(client, lambda s: _answers(url), what="the proxy routes")
        node = ray.get_runtime_context().get_node_id()
        proxy = ray.get_actor(proxy_actor_name(node, 0), namespace=NAMESPACE)
        yield port, url, proxy


def _answers(url: str) -> bool:
    try:
        return requests.post(url, data=b"ab", timeout=5).text == "2"
    except requests.RequestException:
        return False


def _burst(port: int, url: str) -> dict[str, list]:
    """Every kind of abuse at once, 16 connections at a time; what each kind saw."""
    path = "/web?kind=size"
    kinds = {  # kind: (how many, one client)
        "declared_100MB": (20, lambda: abuse.declared_body(port, path, 100_000_000, 4 << 20)),
        "requests_100MB": (2, lambda: abuse.body_with_requests(url, 100_000_000)),
        "chunked_25MB": (4, lambda: abuse.chunked_body(port, path, 25 << 20)),
        "header_1MB": (20, lambda: abuse.huge_header(port, path, 1 << 20)),
        "slowloris": (16, lambda: abuse.slowloris(port, path, 0.2, timeout_s=8.0)),
        "slow_body": (8, lambda: abuse.slow_body(port, path, 0.2, timeout_s=8.0)),
        "idle": (8, lambda: abuse.idle(port, timeout_s=8.0)),
        "malformed": (40, lambda: abuse.malformed(port)),
        "near_limit_body": (60, lambda: abuse.body_with_requests(url, (1 << 20) - 1)),
    }
    with ThreadPoolExecutor(16) as pool:
        futures = {kind: [pool.submit(client) for _ in range(n)]
                   for kind, (n, client) in kinds.items()}
        return {kind: [f.result(timeout=60) for f in fs] for kind, fs in futures.items()}


def _bound_mb(baseline_mb: float) -> float:
    """What the proxy may keep after the burst: 20% over its baseline or 32 MiB, whichever
    is more. The bodies the proxy reads in full are 25-100 MB: holding on to one is past
    it; the floor absorbs what a burst of 16 client threads leaves in the allocator's
    arenas (CI once saw +17 MiB on a 71 MiB USS baseline, with the trim done)."""
    return baseline_mb + max(0.2 * baseline_mb, 32.0)


def _settled_memory(pid: int, baseline: dict, timeout_s: float = 10.0) -> dict:
    deadline, after = time.monotonic() + timeout_s, abuse.memory_mb(pid)
    while time.monotonic() < deadline and any(
            after[k] > _bound_mb(baseline[k]) for k in ("own", "uss")):
        time.sleep(0.5)  # the trim runs 0.5 s after the last large body
        after = abuse.memory_mb(pid)
    return after


def test_past_its_cap_of_open_connections_the_proxy_closes_a_new_one_at_once(abused):
    """max_connections 100: with 100 connections open a new one is closed before a byte
    of it is read; once they are gone, the proxy serves new connections again. First in
    the module: no connection of another test is still closing (lingering, up to 3 s)."""
    import socket

    port, url, _ = abused
    request = b"GET /web?kind=size HTTP/1.1\r\nhost: x\r\n\r\n"
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(100)]
    try:
        held[-1].sendall(request)  # answered: the proxy accepted it, and those before it
        assert held[-1].recv(65536).startswith(b"HTTP/1.1 200 OK")
        over = abuse.exchange(port, [request], timeout_s=5.0)
        assert (over.status, over.closed) == (None, True)  # not a byte of it was read
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while not _answers(url):
        assert time.monotonic() < deadline, "no new connection served after the cap"
        time.sleep(0.1)


def test_normal_clients_keep_being_served_and_memory_comes_back(abused):
    port, url, proxy = abused
    pid = ray.get(proxy.describe.remote())["pid"]
    for _ in range(30):  # warm: the connection, the router, the replica
        assert _answers(url)
    baseline = abuse.memory_mb(pid)

    normal = abuse.NormalClient(url)
    thread = threading.Thread(target=normal.run, daemon=True)
    thread.start()
    started = time.monotonic()
    seen = _burst(port, url)
    burst_s = time.monotonic() - started
    normal.stop()
    thread.join(timeout=15)

    assert burst_s < 20, burst_s
    assert normal.ok >= 20 and normal.success > 0.99, (normal.ok, normal.failures[:5])
    statuses = {kind: sorted({getattr(s, "status", s) for s in seen[kind]}) for kind in seen}
    assert statuses == {"declared_100MB": [413], "requests_100MB": [413],  # read, not reset
                        "chunked_25MB": [413], "header_1MB": [431], "slowloris": [408],
                        "slow_body": [408], "idle": [None], "malformed": [400],
                        "near_limit_body": [200]}
    answered_and_closed = [s for kind in ("declared_100MB", "chunked_25MB", "header_1MB",
                                          "malformed", "slowloris", "slow_body", "idle")
                           for s in seen[kind]]
    assert all(s.closed for s in answered_and_closed)
    # a head must be whole within 2 s of the connection's open, a body within 2 s of its
    # head (loaded machine: 5 s)
    assert all(s.seconds < 5 for s in seen["slowloris"] + seen["slow_body"] + seen["idle"])

    # the proxy's own memory back near its baseline (the object store's shared pages it
    # touched are the node store's, bounded by its size, and not counted)
    after = _settled_memory(pid, baseline)
    assert after["own"] <= _bound_mb(baseline["own"]), (baseline, after)
    assert after["uss"] <= _bound_mb(baseline["uss"]), (baseline, after)
    assert ray.get(proxy.describe.remote())["heap_trim"]["trims"] >= 1
