"""Node-batched reports on real replicas (issue 13): batches flow, an unhealthy result still
goes straight to the shard, a killed reporter costs no replica, shutdown removes it.

A 4 s health period, so batching fits the freshness window (1 s reports + 1 s batches <=
one period; the suite's usual 1 s period reports directly). An instance of its own, since
the test kills its reporter.
"""

from __future__ import annotations

import os

import pytest
import ray
from ray._private.state import actors

from controlplane.priority import (CONTROL_NICENESS, WORKER_NICENESS_ENV,
                                   may_take_control_priority)
from controlplane.settings import REPORTER_PREFIX, shard_actor_name
from tests.integration import conftest
from tests.integration.conftest import app, dep_status, deploy, own_fleet, settled, wait_for

pytestmark = pytest.mark.integration

APP, DEP, N = "batched", "Breakable", 3
NAMESPACE = "fleetplane_batched"
RAY_WORKER_NICENESS = 15  # Ray's worker_niceness when RAY_worker_niceness is not set


def health(status: dict) -> dict:
    return status["controller"]["health"]


def reporters() -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == NAMESPACE and a["name"].startswith(REPORTER_PREFIX)]


def niceness(actor_name: str) -> set[int]:
    """The niceness of every thread of the named actor's process."""
    handle = ray.get_actor(actor_name, namespace=NAMESPACE)
    pid = actors(handle._actor_id.hex())["Pid"]  # the GCS's table: no dashboard needed
    return {os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def expected_niceness() -> tuple[int, int]:
    """The niceness of the control plane's processes and a replica's threads in this
    session's Ray. A user who may renice (root, CAP_SYS_NICE, RLIMIT_NICE): the control plane
    at the raylet's, a replica at Ray's worker niceness (15 unless set). One who may not:
    ``start_local_ray`` started every worker at ``RAY_worker_niceness`` (0), so both run at
    it (``priority.embedded_worker_niceness``)."""
    workers = int(os.environ.get(WORKER_NICENESS_ENV, RAY_WORKER_NICENESS))
    if may_take_control_priority():
        return CONTROL_NICENESS, workers
    return workers, workers


def test_reports_travel_in_node_batches_and_survive_a_killed_reporter(fleet):
    with own_fleet(NAMESPACE) as client:
        deploy(client, app(APP, "tests.integration.health_apps:Breakable", deployments=[{
            "name": DEP, "num_replicas": N, "health_check_period_s": 4.0}]))
        status = wait_for(client, settled(APP, N, DEP), what=f"{N} replicas")
        original = {r["replica_id"]: r for r in dep_status(status, APP, DEP)["replicas"]}
        status = wait_for(client, lambda s: health(s)["report_batches_total"] >= 3,
                          what="batches from the node reporter")
        assert len(reporters()) == 1  # one node, one reporter, whichever replica made it
        control, replica = expected_niceness()
        assert niceness(reporters()[0]) == {control}
        assert niceness(shard_actor_name(0)) == {control}
        # a replica's threads run at Ray's worker niceness (a few of Ray's own may not)
        assert max(niceness(next(iter(original.values()))["actor_name"])) == replica

        # A flip to unhealthy does not wait for a batch: the shard shows it.
        victim = next(iter(original.values()))
        conftest.call(victim, "raise", method="set_health", namespace=NAMESPACE)
        wait_for(client, lambda s: any(
            r["replica_id"] == victim["replica_id"] and not r["healthy"]
            for r in dep_status(s, APP, DEP)["replicas"]), what="the unhealthy push")
        conftest.call(victim, "ok", method="set_health", namespace=NAMESPACE)

        # Kill the reporter: the replicas report directly, nobody is replaced.
        ray.kill(ray.get_actor(reporters()[0], namespace=NAMESPACE), no_restart=True)
        before = health(client.status())["pushes_total"]
        status = wait_for(client, lambda s: health(s)["pushes_total"] >= before + 3 * N,
                          what="pushes after the reporter died")
        assert set(original) == {r["replica_id"] for r in dep_status(status, APP, DEP)["replicas"]}
        assert health(status)["pull_probes_total"] <= N  # no probe storm
    assert reporters() == []  # the instance's shutdown removed what its replicas created
