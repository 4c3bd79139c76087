"""Node drain (a spot interruption, a pod deletion): replacements start elsewhere first,
then the draining node's replicas drain; out of time, they drain whatever else runs.
The node watch's pure parts: the diff between two readings and status rows."""

from __future__ import annotations

import asyncio
import math

import pytest

from controlplane.deployment.lifecycle import ReplicaState
from controlplane.nodes import NodeChanges, NodeInfo, NodeWatch, changes, node_rows
from controlplane.deployment.reconcile import StartReplica, StopReplica, plan
from tests.unit.shard_harness import Shard, make_spec, run
from tests.unit.test_reconcile import running, snap, view

S = ReplicaState


def leaving(views, must_go: bool = False):
    return tuple(v.__class__(**{**v.__dict__, "leaving": True, "must_go": must_go})
                 for v in views)


# ---- the plan ------------------------------------------------------------------------
def test_every_replacement_starts_at_once_and_nothing_stops_before_it_serves():
    actions = plan(snap(*leaving(running(3)), target=3))
    assert actions == [StartReplica()] * 3


def test_a_leaving_replica_retires_as_a_replacement_serves():
    replacements = running(1, prefix="n") + (view("n1", S.STARTING), view("n2", S.STARTING))
    actions = plan(snap(*leaving(running(3)), *replacements, target=3))
    assert actions == [StopReplica("r2", "its node is draining")]  # highest rank first


def test_out_of_time_every_leaving_replica_drains_whatever_else_runs():
    starting = tuple(view(f"n{i}", S.STARTING) for i in range(3))
    actions = plan(snap(*leaving(running(3), must_go=True), *starting, target=3))
    assert sorted(a.replica_id for a in actions) == ["r0", "r1", "r2"]
    assert all(a.reason == "its node is draining" for a in actions)


def test_a_replica_still_starting_on_a_draining_node_stops_at_once():
    actions = plan(snap(*leaving((view("r0", S.STARTING),)), target=1))
    assert StopReplica("r0", "its node is draining") in actions
    assert StartReplica() in actions


def test_scaled_to_zero_a_draining_node_keeps_nothing():
    actions = plan(snap(*leaving(running(2)), target=0))
    assert sorted(a.replica_id for a in actions) == ["r0", "r1"]


def test_off_draining_nodes_the_plan_is_unchanged():
    assert plan(snap(*running(3), target=3)) == []


# ---- through the shard ----------------------------------------------------------------
def test_the_shard_moves_a_draining_nodes_replicas_before_draining_them():
    async def scenario():
        shard = Shard()
        await shard.deploy(make_spec(3))
        first = set(shard.client.created)
        shard.client.node_id = "node-b"  # where Ray places what starts from now on
        shard.client.hold("initialize")
        shard.core.set_node_drains({"node-a": shard.clock.monotonic() + 600})
        await shard.step(2)
        assert len(shard.client.created) == 6 and shard.client.ids("stop") == []
        assert shard.status()["status"] == "UPDATING"
        shard.client.release_all("initialize")
        await shard.step(3)
        assert set(shard.client.ids("stop")) == first
        await shard.step(3)
        nodes = {r["node_id"] for r in shard.replicas()}
        assert nodes == {"node-b"} and len(shard.replicas()) == 3
    run(scenario)


def test_near_the_deadline_the_replicas_drain_though_replacements_do_not_serve_yet():
    async def scenario():
        shard = Shard()
        await shard.deploy(make_spec(2))  # graceful_shutdown_timeout_s 20
        first = set(shard.client.created)
        shard.client.node_id = "node-b"
        shard.client.hold("initialize")
        shard.core.set_node_drains({"node-a": shard.clock.monotonic() + 30})
        await shard.step(2)
        assert shard.client.ids("stop") == []
        await shard.advance(8.0)  # 30 - 20 (drain) - 2 (margin) = 8 s to go
        assert set(shard.client.ids("stop")) == first
    run(scenario)


def test_a_drain_with_no_deadline_waits_for_the_replacements():
    async def scenario():
        shard = Shard()
        await shard.deploy(make_spec(1))
        shard.client.node_id = "node-b"
        shard.client.hold("initialize")
        shard.core.set_node_drains({"node-a": math.inf})
        await shard.advance(3600.0)
        assert shard.client.ids("stop") == []
    run(scenario)


# ---- the node watch ---------------------------------------------------------------------
def node(node_id: str, alive: bool = True, until: float | None = None) -> NodeInfo:
    return NodeInfo(node_id, f"127.0.0.{len(node_id)}", alive, {"CPU": 1.0}, until)


def test_changes_name_joined_left_and_a_new_draining_set():
    before = {"a": node("a"), "b": node("b")}
    after = {"a": node("a", until=100.0), "b": node("b", alive=False), "c": node("c")}
    diff = changes(before, after)
    assert diff == NodeChanges(joined=("c",), left=("b",), drains={"a": 100.0})
    assert not changes(after, after)


def test_the_watch_hands_over_each_diff_once_and_again_if_handling_failed():
    readings = [{"a": node("a")}, {"a": node("a")}, {"a": node("a"), "b": node("b")}]
    seen, fail = [], [True]

    async def on_change(diff, nodes):
        seen.append(diff.joined)
        if diff.joined == ("b",) and fail:
            fail.clear()
            raise RuntimeError("ensure failed")

    async def scenario():
        watch = NodeWatch(on_change, read=lambda: readings[0])
        await watch.poll_once()
        await watch.poll_once()
        readings[0] = readings[2]
        try:
            await watch.poll_once()
        except RuntimeError:
            pass
        await watch.poll_once()
    asyncio.run(scenario())
    assert seen == [("a",), ("b",), ("b",)]


def test_a_silent_gcs_changes_nothing_and_the_head_back_is_the_only_news():
    """The head node's GCS down (issue 32): every reading fails; the watch keeps the last
    one, so no node is taken as gone and no listener is forgotten. When the GCS is back,
    the killed head is a dead node and its restart a new one: the workers are no news."""
    readings: list = [{"head": node("head"), "w1": node("w1"), "w2": node("w2")}]
    seen: list[NodeChanges] = []

    async def on_change(diff, nodes):
        seen.append(diff)

    def read():
        if isinstance(readings[0], Exception):
            raise readings[0]
        return readings[0]

    async def scenario():
        watch = NodeWatch(on_change, read=read)
        await watch.poll_once()
        readings[0] = ConnectionError("GCS at 127.0.0.2:6379 unreachable")
        for _ in range(30):
            with pytest.raises(ConnectionError):
                await watch.poll_once()
        assert set(watch.nodes) == {"head", "w1", "w2"}
        readings[0] = {"head": node("head", alive=False), "head2": node("head2"),
                       "w1": node("w1"), "w2": node("w2")}
        await watch.poll_once()
    asyncio.run(scenario())
    assert seen[1:] == [NodeChanges(joined=("head2",), left=("head",), drains=None)]


def test_status_rows_carry_the_listener_and_the_replicas_of_each_node():
    nodes = {"a": node("a"), "b": node("b", until=math.inf), "c": node("c", alive=False)}
    listeners = [{"node_id": "a", "address": "127.0.0.1:8000", "ready": True},
                 {"node_id": "b", "address": "127.0.0.2:8000", "ready": False}]
    apps = {"app": {"deployments": {"M": {"replicas": [
        {"replica_id": "app#M#1", "node_id": "b"}, {"replica_id": "app#M#0", "node_id": "a"}]}}}}
    rows = node_rows(nodes, listeners, apps)
    assert [r["node_id"] for r in rows] == ["a", "b", "c"]
    assert rows[1]["draining"] and rows[1]["drain_deadline_s"] is None
    assert rows[1]["proxy"] == {"address": "127.0.0.2:8000", "ready": False}
    assert rows[0]["replicas"] == ["app#M#0"] and rows[2]["proxy"] is None
