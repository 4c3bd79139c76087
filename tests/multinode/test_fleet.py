"""A fleet on a real multi-node Ray (head + 2 workers on loopback addresses, see
conftest): listeners follow nodes, GB10 placement, a killed node, a drained node under
load, and the probe commands against live nodes."""

from __future__ import annotations

import threading
import time

import pytest
import ray
import requests
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from fleetplane.cli import main
from tests.multinode.conftest import (HEAD_IP, app, extra_node, node_row, replicas_of,
                                      running, wait_for)

_PREEMPTION = 2  # Ray's DrainNodeReason: what a spot interruption notice sends


def listener_ready(ip: str):
    def check(status: dict) -> bool:
        row = node_row(status, ip)
        return bool(row and row["proxy"] and row["proxy"]["ready"])
    return check


def serves(url: str, timeout_s: float = 30.0) -> None:
    """``url`` answers 200 within ``timeout_s`` (a listener that just became ready may
    still be hearing of the replicas behind its routes)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if requests.get(url, timeout=10).status_code == 200:
                return
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, f"{url} did not answer 200"
        time.sleep(0.2)


def test_every_node_serves_and_the_listeners_follow_nodes_joining_and_leaving(cluster):
    client = cluster.client
    cluster.deploy(app("spread", num_replicas=3))
    ips = [HEAD_IP, "127.0.0.3", "127.0.0.4"]
    wait_for(client, lambda s: running("spread", 3)(s) and all(
        listener_ready(ip)(s) for ip in ips), what="3 replicas and a listener per node")
    # Where the replicas land is Ray's best-effort SPREAD (a per-raylet round robin that
    # other leases interleave with), so it is not asserted here: a unit test pins that
    # replicas ask for SPREAD (test_replica_client_protocol).
    for ip in ips:
        serves(f"{cluster.url(ip)}/spread")
    with extra_node(cluster) as (node, ip, node_id):
        wait_for(client, listener_ready(ip), timeout_s=30, what=f"a listener on {ip}")
        serves(f"{cluster.url(ip)}/spread")
        cluster.cluster.remove_node(node)
        status = wait_for(client, lambda s: node_row(s, ip) is None, timeout_s=60,
                          what=f"{ip} gone")
        assert not any(name.startswith(f"proxy_{node_id[:12]}")
                       for name in status["controller"]["actors"])


def test_gb10_replicas_go_only_where_gb10_is_and_the_rest_is_reported(cluster):
    client = cluster.client
    cluster.deploy(app("gb10", num_replicas=2,
                       ray_actor_options={"num_cpus": 0, "resources": {"GB10": 1}}))
    gb10_node = next(n["node_id"] for n in client.status()["nodes"]
                     if n["resources"].get("GB10"))

    def one_placed(status: dict) -> bool:
        reps = replicas_of(status, "gb10")
        return sum(r["state"] == "RUNNING" for r in reps) == 1
    status = wait_for(client, one_placed, what="the GB10 replica")
    dep = status["applications"]["gb10"]["deployments"]["Model"]
    [placed] = [r for r in dep["replicas"] if r["state"] == "RUNNING"]
    assert placed["node_id"] == gb10_node
    assert "at most 1 of 2 replicas can be placed" in dep["placement"]
    assert "GB10" in dep["placement"]


@ray.remote(num_cpus=0)
class PoolHolder:
    """Holds what is free of the CPU worker's "pool" while replicas are placed, so that
    they all land on the node a test is about to kill or drain; killed before that."""

    def ready(self) -> bool:
        return True


def place_on_extra_node(cluster, name: str, n: int) -> dict:
    cpu_worker = next(n["NodeID"] for n in ray.nodes()
                      if n["Alive"] and n["NodeManagerAddress"] == "127.0.0.3")
    free = ray._private.state.state.available_resources_per_node()[cpu_worker].get("pool", 0)
    holder = PoolHolder.options(resources={"pool": free}, scheduling_strategy=(
        NodeAffinitySchedulingStrategy(cpu_worker, soft=False))).remote()
    ray.get(holder.ready.remote(), timeout=60)
    cluster.deploy(app(name, num_replicas=n,
                       ray_actor_options={"num_cpus": 0, "resources": {"pool": 1}}))
    status = wait_for(cluster.client, running(name, n), what=f"{n} pool replicas")
    ray.kill(holder)  # room on the CPU worker again, for the replacements
    return status


def test_a_killed_nodes_replicas_are_replaced_on_other_nodes_with_compact_ranks(cluster):
    client = cluster.client
    with extra_node(cluster, pool=8) as (node, ip, node_id):
        status = place_on_extra_node(cluster, "churn", 2)
        assert {r["node_id"] for r in replicas_of(status, "churn")} == {node_id}
        cluster.cluster.remove_node(node, allow_graceful=False)
        status = wait_for(client, lambda s: running("churn", 2)(s) and node_id not in
                          {r["node_id"] for r in replicas_of(s, "churn")}, timeout_s=90,
                          what="replacements on the surviving pool node")
    assert sorted(r["rank"] for r in replicas_of(status, "churn")) == [0, 1]
    assert requests.get(f"{cluster.url()}/churn", timeout=10).status_code == 200


class Load:
    """Steady GETs through the head's listener from a few threads; counts failures."""

    def __init__(self, url: str, threads: int = 4) -> None:
        self.url, self.sent, self.failed = url, 0, []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True)
                         for _ in range(threads)]

    def _run(self) -> None:
        session = requests.Session()
        while not self._stop.is_set():
            try:
                r = session.get(self.url, timeout=10)
                ok, why = r.status_code == 200, r.status_code
            except requests.RequestException as e:
                ok, why = False, type(e).__name__
            self.sent += 1
            if not ok:
                self.failed.append(why)
            time.sleep(0.02)

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def probe(*args: str) -> int:
    return main(["probe", *args])


@pytest.mark.parametrize("ingress", ["proxy", "haproxy"])
def test_a_drained_node_loses_no_request_and_its_replicas_move_before_the_deadline(
        cluster, ingress):
    if ingress == "proxy":
        _drain_under_load(cluster)
        return
    with cluster.own_instance("fleetplane_haproxy_fleet", "haproxy") as instance:
        _drain_under_load(instance)


def _drain_under_load(cluster) -> None:
    client = cluster.client
    with extra_node(cluster, pool=8) as (node, ip, node_id):
        status = place_on_extra_node(cluster, "drain", 2)
        assert {r["node_id"] for r in replicas_of(status, "drain")} == {node_id}
        wait_for(client, listener_ready(ip), what="the new node's listener")
        port, agent = str(cluster.port), str(cluster.agent_ports[ip])
        assert probe("readiness", "--host", ip, "--port", port, "--agent-port", agent) == 0
        with Load(f"{cluster.url()}/drain") as load:
            time.sleep(1.0)  # load flowing before the notice
            deadline = time.time() + 40
            ray._private.worker.global_worker.gcs_client.drain_node(
                node_id, _PREEMPTION, "spot interruption (test)", int(deadline * 1000))
            wait_for(client, lambda s: (node_row(s, ip) or {}).get("draining"),
                     timeout_s=10, what="the drain seen")
            assert probe("readiness", "--host", ip, "--port", port,
                         "--agent-port", agent) == 1
            assert probe("liveness", "--host", ip, "--agent-port", agent) == 0
            assert requests.get(f"{cluster.url(ip)}/drain", timeout=10).status_code == 200
            wait_for(client, lambda s: running("drain", 2)(s) and node_id not in
                     {r["node_id"] for r in replicas_of(s, "drain")}, timeout_s=60,
                     what="the replicas moved off the draining node")
            moved_at = time.time()
            time.sleep(1.0)
        assert moved_at < deadline
        assert load.sent > 50 and load.failed == []
        head = str(cluster.agent_ports[HEAD_IP])
        assert probe("readiness", "--host", HEAD_IP, "--port", port, "--agent-port", head) == 0


def test_every_nodes_haproxy_sends_a_conversation_to_the_replica_it_first_went_to(cluster):
    """haproxy mode, the prefix policy: the nodes' HAProxies are peers, so a conversation
    started through the head's goes on, through any node's, on the replica it reached."""
    from controlplane.ingress.haproxy.config import Paths, backend_name
    from controlplane.ingress.haproxy.runtime_dirs import runtime_dir
    from controlplane.ingress.haproxy.process import HAProxyProcess

    with cluster.own_instance("fleetplane_haproxy_peers", "haproxy") as instance:
        affine = app("peers", "tests.integration.apps:Affine", num_replicas=4,
                     request_router_config={"request_router_class": "prefix"})
        affine["deployments"][0]["name"] = "Affine"
        instance.deploy(affine)
        wait_for(instance.client, lambda s: [r["state"] for r in s["applications"].get(
            "peers", {}).get("deployments", {}).get("Affine", {}).get("replicas", [])] ==
            ["RUNNING"] * 4, what="4 replicas")
        ips = [HEAD_IP, "127.0.0.3", "127.0.0.4"]
        for ip in ips:
            serves(f"{instance.url(ip)}/-/healthz")
        node_of = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
        haproxies = {ip: HAProxyProcess(Paths(runtime_dir("fleetplane_haproxy_peers",
                                                          node_of[ip]))) for ip in ips}

        def keys(ip: str) -> int:
            process = haproxies[ip]
            head = process.on_worker(process.workers()[0],
                                     f"show table {backend_name('peers/Affine')}")
            return int(head.split("\n")[0].rsplit("used:", 1)[1])

        def turn(ip: str, session: int, *later: str) -> int:
            messages = [{"role": "system", "content": "you help"},
                        {"role": "user", "content": f"session {session}"},
                        *({"role": "user", "content": text} for text in later)]
            answer = requests.post(f"{instance.url(ip)}/peers/v1/chat/completions",
                                   json={"model": "m", "messages": messages}, timeout=10)
            return answer.json()["pid"]

        first = {i: turn(HEAD_IP, i) for i in range(12)}
        assert len(set(first.values())) >= 3  # new conversations by load
        deadline = time.monotonic() + 30
        while not all(keys(ip) >= 12 for ip in ips):  # every node learnt them
            assert time.monotonic() < deadline, {ip: keys(ip) for ip in ips}
            time.sleep(0.1)
        for i in range(12):
            assert {turn(ip, i, "and then?") for ip in ips} == {first[i]}
