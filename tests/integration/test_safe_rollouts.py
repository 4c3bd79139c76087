"""Safe rollouts under steady load (issue 17): no deploy takes serving capacity away or
freezes the control plane. On an instance of its own (a hanging build holds its deploy
lock). Each case: 0 failed requests, the old version serving throughout, status saying
what happened.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests

from controlplane.config.schema import parse_deploy_config
from controlplane.errors import BuildError
from tests.integration.conftest import app, dep_status, own_fleet, port_of, wait_for
from tests.integration.test_self_healing import Load

pytestmark = pytest.mark.integration

NAMESPACE, APP, DEP, N = "fleetplane_rollout", "picky", "PickyModel", 3


def picky(user_config: dict | None = None, **changes) -> dict:
    deployment = {"name": DEP, "num_replicas": N, "user_config": user_config or {"greeting": "hi"},
                  **changes}
    return app(APP, "tests.integration.apps:PickyModel", deployments=[deployment])


def send(client, *apps: dict, build_timeout_s: float = 120.0) -> dict:
    return client.deploy(parse_deploy_config({
        "applications": list(apps),
        "controller_options": {"num_shards": 2, "build_timeout_s": build_timeout_s},
        "http_options": {"host": "127.0.0.1", "port": port_of(client)}}))


def healthy(status: dict) -> bool:
    d = status["applications"].get(APP, {}).get("deployments", {}).get(DEP)
    return (d is not None and d["status"] == "HEALTHY" and len(d["replicas"]) == N
            and all(r["state"] == "RUNNING" for r in d["replicas"]))


@pytest.fixture(scope="module")
def rollout(fleet):
    with own_fleet(NAMESPACE) as client:
        send(client, picky())
        wait_for(client, healthy, what=f"{N} replicas")
        yield client


def url(client) -> str:
    return f"http://127.0.0.1:{port_of(client)}/{APP}"


def replica_ids(client) -> set[str]:
    return {r["replica_id"] for r in dep_status(client.status(), APP, DEP)["replicas"]}


def all_ok(load: Load) -> None:
    assert len(load.results) > 10 and set(load.outcomes()) == {200}, load.outcomes()


def test_a_raising_reconfigure_keeps_every_replica_serving_the_old_config(rollout):
    before = replica_ids(rollout)
    with Load(url(rollout)) as load:
        send(rollout, picky({"greeting": "hi", "fail": True}))
        status = wait_for(rollout, lambda s: dep_status(s, APP, DEP)["status"] == "DEPLOY_FAILED",
                          what="the rollout reported failed")
        message = dep_status(status, APP, DEP)["message"]
        assert "previous config keeps serving" in message
        assert "threshold out of range" in message  # the user's traceback
        assert status["applications"][APP]["status"] == "DEPLOY_FAILED"
        time.sleep(1.0)
        greetings = {requests.get(url(rollout), timeout=10).json()["text"].split(",")[0]
                     for _ in range(6)}
        assert greetings == {"hi"}  # the old config, on every replica
        send(rollout, picky({"greeting": "hello again"}))  # a good config rolls through
        wait_for(rollout, healthy, what="the fixed config rolled out")
    all_ok(load)
    assert replica_ids(rollout) == before  # nobody was replaced


def test_user_config_for_a_class_without_reconfigure_is_refused_up_front(rollout):
    other = app("plain", "tests.integration.apps:Doubler",
                deployments=[{"name": "Doubler", "user_config": {"k": 1}}])
    with Load(url(rollout)) as load:
        with pytest.raises(BuildError, match="sets user_config but its class has no "
                                             "reconfigure"):
            send(rollout, picky({"greeting": "hello again"}), other)
    all_ok(load)
    assert "plain" not in rollout.status()["applications"]


def test_a_hanging_import_fails_its_deploy_and_status_answers_meanwhile(rollout):
    hanging = app("hang", "tests.integration.hanging_import:Model")
    outcome: dict = {}

    def deploy_it() -> None:
        try:
            send(rollout, picky({"greeting": "hello again"}), hanging, build_timeout_s=4)
        except Exception as e:
            outcome["error"] = e

    with Load(url(rollout)) as load:
        worker = threading.Thread(target=deploy_it)
        worker.start()
        while not rollout.deploy_in_progress():  # the build is under way
            assert worker.is_alive(), outcome
            time.sleep(0.05)
        assert healthy(rollout.status())  # answered while the build hangs
        assert "hang" in rollout.deploy_in_progress()
        worker.join(60)
    assert isinstance(outcome.get("error"), BuildError), outcome
    assert "application 'hang'" in str(outcome["error"])
    assert "did not finish within 4s (controller_options.build_timeout_s)" in str(outcome["error"])
    all_ok(load)
    assert set(rollout.status()["applications"]) == {APP}


def test_a_hanging_constructor_keeps_the_old_version_serving_and_says_so(rollout):
    before = replica_ids(rollout)
    with Load(url(rollout)) as load:
        send(rollout, picky({"greeting": "hello again"}) | {"args": {"hang_s": 3600}})
        status = wait_for(rollout, lambda s: any(
            r["state"] == "STARTING" and r["message"].startswith(
                "constructor and first health check running for")
            for r in dep_status(s, APP, DEP)["replicas"]), what="a STARTING replica explained")
        serving = {r["replica_id"] for r in dep_status(status, APP, DEP)["replicas"]
                   if r["state"] == "RUNNING"}
        assert serving == before
        send(rollout, picky({"greeting": "hello again"}))  # back to the version that works
        wait_for(rollout, healthy, what="the stuck start replaced by the old version")
    all_ok(load)
    assert replica_ids(rollout) == before


def test_a_new_version_turning_unhealthy_after_starting_is_rolled_back(rollout):
    with Load(url(rollout)) as load:
        send(rollout, picky({"greeting": "hello again"}) | {"args": {"sick_after_s": 1.0}})
        status = wait_for(rollout, rolled_back, timeout_s=90, what="rolled back")
        dep = dep_status(status, APP, DEP)
        assert "turned unhealthy soon after starting" in dep["message"]
        assert "GPU memory corrupted" in dep["message"]  # the user's health check error
        assert dep["serving_version"] != dep["version"]
        send(rollout, picky({"greeting": "hello again"}))  # the version that serves
        wait_for(rollout, healthy, what="HEALTHY on the old version")
    all_ok(load)


def rolled_back(status: dict) -> bool:
    """DEPLOY_FAILED, and every replica a healthy, RUNNING one of the previous version."""
    dep = dep_status(status, APP, DEP)
    return dep["status"] == "DEPLOY_FAILED" and len(dep["replicas"]) == N and all(
        r["state"] == "RUNNING" and r["healthy"] and r["version"] == dep["serving_version"]
        for r in dep["replicas"])


def test_more_replicas_than_the_cluster_can_place_is_accepted_with_a_warning(rollout):
    gpus = app("gb10", "tests.integration.apps:PickyModel", deployments=[{
        "name": DEP, "num_replicas": 2,
        "ray_actor_options": {"num_cpus": 0, "resources": {"GB10": 1}}}])
    with Load(url(rollout)) as load:
        result = send(rollout, picky({"greeting": "hello again"}), gpus)
        [warning] = result["warnings"]
        assert warning.startswith("gb10/PickyModel: none of 2 replicas can be placed")
        assert "no node has GB10" in warning
        status = wait_for(rollout, lambda s: "placement" in dep_status(s, "gb10", DEP),
                          what="the shortfall in status")
        assert dep_status(status, "gb10", DEP)["placement"] in warning
        send(rollout, picky({"greeting": "hello again"}))  # forget it
        wait_for(rollout, lambda s: "gb10" not in s["applications"], what="gb10 deleted")
    all_ok(load)
