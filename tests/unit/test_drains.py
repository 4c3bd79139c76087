"""The node drains owner: when a replica on a draining node must start its drain, and
which changes of the draining set make a deployment re-plan (shard-level behaviour:
test_node_drain.py)."""

from __future__ import annotations

import math

from controlplane.deployment.drains import DRAIN_MARGIN_S, NodeDrains
from controlplane.deployment.lifecycle import ReplicaState
from controlplane.deployment.replica_set import ReplicaRecord
from controlplane.wire import DirectIngressInit, HTTPLimits
from tests.unit.shard_harness import make_spec

SPEC = make_spec(2)  # graceful_shutdown_timeout_s 20


def on(node: str) -> ReplicaRecord:
    return ReplicaRecord(f"r-{node}", ReplicaState.RUNNING, "v1", node_id=node)


def test_a_replica_must_go_in_time_for_its_drain_to_end_before_the_deadline():
    drains = NodeDrains()
    drains.set({"n1": 100.0}, [])
    assert drains.must_go_at("n1", SPEC) == 100.0 - 20.0 - DRAIN_MARGIN_S
    assert drains.must_go_at("n2", SPEC) is None and drains.must_go_at(None, SPEC) is None
    behind_haproxy = make_spec(2, direct_ingress=DirectIngressInit(
        "127.0.0.1", "/", -1, 503, None, 2.0, HTTPLimits()))
    assert drains.must_go_at("n1", behind_haproxy) == 100.0 - 20.0 - 2.0 - DRAIN_MARGIN_S


def test_a_plan_s_look_sets_when_the_next_leaving_replica_must_go():
    drains = NodeDrains()
    drains.set({"n1": 100.0, "n2": 50.0}, [])
    drains.begin()
    assert drains.leaving("n1", SPEC, now=0.0) == (True, False)
    assert drains.leaving("n2", SPEC, now=0.0) == (True, False)
    assert drains.due == 50.0 - 20.0 - DRAIN_MARGIN_S
    assert drains.leaving("n2", SPEC, now=40.0) == (True, True)
    assert drains.leaving("n3", SPEC, now=0.0) == (False, False)
    drains.begin()
    assert drains.due == math.inf


def test_only_a_change_on_a_node_that_holds_a_replica_asks_for_a_new_plan():
    drains = NodeDrains()
    records = [on("n1"), on("n2")]
    assert drains.set({"n1": 100.0}, records)
    assert not drains.set({"n1": 100.0}, records)  # nothing changed
    assert not drains.set({"n1": 100.0, "n9": 80.0}, records)  # no replica there
    assert drains.set({"n9": 80.0}, records)  # n1's drain ended
    assert bool(drains) and not NodeDrains()
