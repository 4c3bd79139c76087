"""One small multi-node Ray for the multi-node tests: a head and two workers on this
machine, each raylet on its own loopback address (127.0.0.2 head, .3 a CPU worker with a
"pool" resource, .4 a GB10 worker), one fleetplane instance serving with
``http_options.host: node_ip`` so every node's listener binds the same port on its own
address. Tests may add a node (``add_node``: 127.0.0.5 and up) and must remove it again.
"""

from __future__ import annotations

import dataclasses
import itertools
import socket
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import pytest
import ray
from ray.cluster_utils import Cluster

from controlplane.config.schema import parse_deploy_config
from controlplane.instance import Client
from controlplane.settings import Settings
from tests import ray_session
from tests.waiting import wait_for  # noqa: F401 (the tests import it from here)

HEAD_IP = "127.0.0.2"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LocalCluster:
    cluster: Cluster
    client: Client
    port: int
    agent_ports: dict[str, int] = field(default_factory=dict)  # node ip -> agent port
    ingress: str = "proxy"
    _next_ip: Iterator[int] = field(default_factory=lambda: itertools.count(5))

    @contextmanager
    def own_instance(self, name: str, ingress: str) -> Iterator["LocalCluster"]:
        """A fleetplane instance of its own on this cluster (namespace, controller, port:
        http_options cannot change on a running instance), shut down afterwards."""
        client = Client(Settings(namespace=name, controller_name=f"{name}_controller",
                                 checkpoint_key=f"{name}/controller/checkpoint"))
        client.start_controller()
        try:
            yield dataclasses.replace(self, client=client, port=_free_port(), ingress=ingress)
        finally:
            client.shutdown(timeout_s=30)

    def url(self, ip: str = HEAD_IP) -> str:
        return f"http://{ip}:{self.port}"

    def add_node(self, **resources) -> tuple[object, str]:
        ip = f"127.0.0.{next(self._next_ip)}"
        node = self.cluster.add_node(**_node_args(ip, self.agent_ports, 1, resources))
        return node, ip

    def deploy(self, *apps: dict) -> dict:
        cfg = {"applications": list(apps), "controller_options": {"num_shards": 2},
               "http_options": {"host": "node_ip", "port": self.port, "ingress": self.ingress,
                                "proxies_per_node": 1}}
        return self.client.deploy(parse_deploy_config(cfg))


def _node_args(ip: str, agent_ports: dict, num_cpus: int, resources: dict) -> dict:
    agent_ports[ip] = _free_port()
    return {"node_ip_address": ip, "num_cpus": num_cpus, "resources": resources,
            "dashboard_agent_listen_port": agent_ports[ip]}


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    ray_session.release()  # the integration tests' single-node Ray, if it ran
    ports: dict[str, int] = {}
    c = Cluster(initialize_head=True, head_node_args={
        **_node_args(HEAD_IP, ports, 2, {}), "include_dashboard": False})
    c.add_node(**_node_args("127.0.0.3", ports, 1, {"pool": 8}))
    c.add_node(**_node_args("127.0.0.4", ports, 1, {"GB10": 1}))
    c.wait_for_nodes()  # all three registered, or the first SPREAD may see the head alone
    ray.init(address=c.head_node.gcs_address, namespace=Settings().namespace,
             log_to_driver=False)
    client = Client()
    client.start_controller()
    yield LocalCluster(c, client, _free_port(), ports)
    client.shutdown(timeout_s=30)
    ray.shutdown()
    c.shutdown()


def app(name: str, import_path: str = "tests.integration.apps:Model", **deployment) -> dict:
    dep = {"name": "Model", "ray_actor_options": {"num_cpus": 0},
           "health_check_period_s": 1.0, "health_check_timeout_s": 5.0,
           "graceful_shutdown_timeout_s": 1.0, **deployment}
    return {"name": name, "route_prefix": f"/{name}", "import_path": import_path,
            "deployments": [dep]}


def replicas_of(status: dict, app_name: str) -> list[dict]:
    return status["applications"].get(app_name, {}).get("deployments", {}).get(
        "Model", {}).get("replicas", [])


def running(app_name: str, n: int) -> Callable[[dict], bool]:
    def check(status: dict) -> bool:
        reps = replicas_of(status, app_name)
        return len(reps) == n and all(r["state"] == "RUNNING" for r in reps)
    return check


def node_row(status: dict, ip: str) -> dict | None:
    return next((n for n in status.get("nodes", []) if n["address"] == ip and n["alive"]), None)


@contextmanager
def extra_node(lc: LocalCluster, **resources) -> Iterator[tuple[object, str, str]]:
    """A node that joins for one test: (node, its ip, its node id); removed afterwards."""
    node, ip = lc.add_node(**resources)
    try:
        yield node, ip, node.node_id
    finally:
        try:
            lc.cluster.remove_node(node)
        except Exception:  # removed by the test already
            pass
