"""Deploy, scale, reconfigure in place, roll out new code, replace a killed replica."""

from __future__ import annotations

import os
import signal

import pytest

from tests.integration.conftest import app, call, dep_status, deploy, settled, wait_for

pytestmark = pytest.mark.integration


def ranks(status: dict, app_name: str) -> list[int]:
    return sorted(r["rank"] for r in dep_status(status, app_name)["replicas"])


def test_deploy_reports_contract_and_scales_up_and_down(fleet):
    deploy(fleet, app("scale", deployments=[{"name": "Model", "num_replicas": 2}]))
    status = wait_for(fleet, settled("scale", 2), what="2 replicas")
    assert status["applications"]["scale"]["status"] == "RUNNING"
    assert status["controller"]["num_shards"] == 2
    for replica in dep_status(status, "scale")["replicas"]:
        assert {"replica_id", "state", "rank", "healthy", "node_id"} <= replica.keys()
        assert replica["healthy"] is True and replica["node_id"]
    assert ranks(status, "scale") == [0, 1]

    deploy(fleet, app("scale", deployments=[{"name": "Model", "num_replicas": 4}]))
    status = wait_for(fleet, settled("scale", 4), what="scale up to 4")
    assert ranks(status, "scale") == [0, 1, 2, 3]

    deploy(fleet, app("scale", deployments=[{"name": "Model", "num_replicas": 1}]))
    status = wait_for(fleet, settled("scale", 1), what="scale down to 1")
    assert ranks(status, "scale") == [0]


def test_user_config_change_reconfigures_without_restart(fleet):
    entry = {"name": "Model", "num_replicas": 2, "user_config": {"greeting": "hello"}}
    deploy(fleet, app("recfg", deployments=[dict(entry)]))
    before = dep_status(wait_for(fleet, settled("recfg", 2)), "recfg")["replicas"]
    pids = {r["replica_id"]: call(r)["pid"] for r in before}

    deploy(fleet, app("recfg", deployments=[{**entry, "user_config": {"greeting": "hi"}}]))
    status = wait_for(fleet, lambda s: settled("recfg", 2)(s) and all(
        call(r)["text"] == "hi, world" for r in dep_status(s, "recfg")["replicas"]),
        what="reconfigured replicas")
    after = dep_status(status, "recfg")["replicas"]
    assert {r["replica_id"]: call(r)["pid"] for r in after} == pids  # same processes
    assert all(call(r)["reconfigures"] == 2 for r in after)


def test_code_change_rolls_out_new_replicas(fleet):
    deploy(fleet, app("roll", deployments=[{"name": "Model", "num_replicas": 2}],
                      args={"tag": "v1"}))
    old = dep_status(wait_for(fleet, settled("roll", 2)), "roll")
    deploy(fleet, app("roll", deployments=[{"name": "Model", "num_replicas": 2}],
                      args={"tag": "v2"}))
    status = wait_for(fleet, lambda s: settled("roll", 2)(s)
                      and dep_status(s, "roll")["version"] != old["version"]
                      and all(r["version"] == dep_status(s, "roll")["version"]
                              for r in dep_status(s, "roll")["replicas"]),
                      what="rolling update to v2")
    new = dep_status(status, "roll")["replicas"]
    assert not {r["replica_id"] for r in new} & {r["replica_id"] for r in old["replicas"]}
    assert {call(r)["tag"] for r in new} == {"v2"}
    assert ranks(status, "roll") == [0, 1]


def test_killed_replica_is_replaced_with_compact_ranks(fleet):
    deploy(fleet, app("kill", deployments=[{"name": "Model", "num_replicas": 3}]))
    replicas = dep_status(wait_for(fleet, settled("kill", 3)), "kill")["replicas"]
    victim = next(r for r in replicas if r["rank"] == 1)
    os.kill(call(victim)["pid"], signal.SIGKILL)

    status = wait_for(fleet, lambda s: settled("kill", 3)(s) and victim["replica_id"] not in
                      {r["replica_id"] for r in dep_status(s, "kill")["replicas"]},
                      what="replacement of the killed replica")
    assert ranks(status, "kill") == [0, 1, 2]
    survivors = {r["replica_id"] for r in replicas} - {victim["replica_id"]}
    assert survivors <= {r["replica_id"] for r in dep_status(status, "kill")["replicas"]}
