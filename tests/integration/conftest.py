"""One real local Ray per test session. Tests talk to the session's fleetplane instance
(``fleet``), except those that break replicas on purpose: they get an instance of their
own on the same Ray (``own_fleet``: its own namespace, controller, shards and proxy port),
so what they break cannot reach another test."""

from __future__ import annotations

import socket
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import pytest
import ray

from controlplane.config.schema import parse_deploy_config
from controlplane.instance import Client, start_local_ray
from controlplane.settings import Settings
from tests import ray_session
from tests.waiting import wait_for  # noqa: F401 (the tests import it from here)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# One proxy port for the whole session (http_options cannot change on a running instance).
HTTP_PORT = _free_port()
BASE_URL = f"http://127.0.0.1:{HTTP_PORT}"
# Where the session fleet answers Serve's REST API (not 8265: a dashboard may hold it)
SERVE_API_PORT = _free_port()
SERVE_API = f"http://127.0.0.1:{SERVE_API_PORT}"


@pytest.fixture(scope="session")
def fleet() -> Client:
    start_local_ray(num_cpus=2)
    client = Client(Settings(serve_api_port=SERVE_API_PORT))
    client.start_controller()

    def stop() -> None:
        client.shutdown(timeout_s=30)
        ray.shutdown()
    stop_once = ray_session.on_release(stop)  # the multi-node tests stop it before theirs
    yield client
    stop_once()


def app(name: str, import_path: str = "tests.integration.apps:Model", *,
        deployments: list[dict] | None = None, **extra) -> dict:
    """An application entry; replicas use num_cpus=0 and a 1 s health period."""
    deps = deployments if deployments is not None else [{"name": "Model"}]
    for d in deps:
        d.setdefault("ray_actor_options", {"num_cpus": 0})
        d.setdefault("health_check_period_s", 1.0)
        d.setdefault("health_check_timeout_s", 5.0)
        d.setdefault("graceful_shutdown_timeout_s", 1.0)
    return {"name": name, "route_prefix": f"/{name}", "import_path": import_path,
            "deployments": deps, **extra}


@contextmanager
def own_fleet(name: str) -> Iterator[Client]:
    """A fleetplane instance of its own on the session's Ray; ``deploy`` gives it a proxy
    port of its own."""
    client = Client(Settings(namespace=name, controller_name=f"{name}_controller",
                             checkpoint_key=f"{name}/controller/checkpoint",
                             serve_api_port=-1))  # Serve's name is the session fleet's
    client.start_controller()
    try:
        yield client
    finally:
        client.shutdown(timeout_s=30)


_PORTS: dict[str, int] = {"fleetplane": HTTP_PORT}  # namespace -> its proxy port


def port_of(client: Client) -> int:
    """The proxy port of ``client``'s instance."""
    return _PORTS.setdefault(client.settings.namespace, _free_port())


def deploy(client: Client, *apps: dict, num_shards: int = 2) -> dict:
    port = port_of(client)
    cfg = {"applications": list(apps), "controller_options": {"num_shards": num_shards},
           "http_options": {"host": "127.0.0.1", "port": port}}
    return client.deploy(parse_deploy_config(cfg))


def dep_status(status: dict, app_name: str, dep: str = "Model") -> dict:
    return status["applications"][app_name]["deployments"][dep]


def settled(app_name: str, n: int, dep: str = "Model") -> Callable[[dict], bool]:
    """HEALTHY with exactly n RUNNING replicas."""
    def check(status: dict) -> bool:
        d = status["applications"].get(app_name, {}).get("deployments", {}).get(dep)
        return (d is not None and d["status"] == "HEALTHY" and len(d["replicas"]) == n
                and all(r["state"] == "RUNNING" for r in d["replicas"]))
    return check


def call(replica: dict, *args, method: str = "__call__", namespace: str = "fleetplane"):
    handle = ray.get_actor(replica["actor_name"], namespace=namespace)
    return ray.get(handle.handle_request.remote(method, args, {}), timeout=30)


def wait_actor_gone(name: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace="fleetplane")
        except ValueError:
            return
        time.sleep(0.1)
    raise AssertionError(f"actor {name} still alive after {timeout_s}s")


def zero_app(name: str) -> dict:
    """A Sleeper that scales to zero 2 s after it goes idle and holds a request up to 30 s
    for its first replica."""
    return app(name, "tests.integration.apps:Sleeper", deployments=[{
        "name": "Sleeper", "max_ongoing_requests": 4,
        "autoscaling_config": {"min_replicas": 0, "max_replicas": 2, "initial_replicas": 1,
                               "target_ongoing_requests": 4, "upscale_delay_s": 0,
                               "downscale_delay_s": 1, "downscale_to_zero_delay_s": 2,
                               "look_back_period_s": 1, "cold_start_hold_s": 30}}])


def burst_at_zero(client: Client, url: str, name: str, requests_n: int = 6,
                  meanwhile: Callable[[], None] = lambda: None) -> list[tuple[int, str]]:
    """Once ``zero_app(name)`` answers at ``url`` and has gone to zero replicas, a burst of
    concurrent requests (``meanwhile`` runs while they are out): their status codes, and
    the start of each answer's text."""
    import threading

    import requests

    wait_for(client, lambda s: requests.get(f"{url}?s=0", timeout=10).ok, what="served")
    wait_for(client, lambda s: dep_status(s, name, "Sleeper")["target_replicas"] == 0
             and not dep_status(s, name, "Sleeper")["replicas"], timeout_s=60,
             what="idle to zero replicas")
    codes: list[tuple[int, str]] = []

    def one() -> None:
        answer = requests.get(f"{url}?s=0.2", timeout=60)
        codes.append((answer.status_code, answer.text[:300]))

    burst = [threading.Thread(target=one) for _ in range(requests_n)]
    for t in burst:
        t.start()
    meanwhile()
    for t in burst:
        t.join()
    return codes
