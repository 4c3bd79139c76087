"""The controller's watch over control actors, and ``run``'s report of it, without Ray.

A fake actor handle stands in for a shard or proxy: its ``wait_until_stopped`` stays
pending until the test "kills" the actor (Ray then fails the pending call) or stops it.
"""

from __future__ import annotations

import asyncio

import pytest
from ray.exceptions import RayActorError

from controlplane.clock import FakeClock
from controlplane.errors import ControllerGone, ControllerUnavailable
from controlplane.supervision import Supervisor
from fleetplane import cli_supervise
from fleetplane.cli_supervise import Supervision
from tests.unit.virtual_time import run_virtual, wait_all_tasks_blocked


class FakeActor:
    def __init__(self) -> None:
        self.wait_until_stopped = self  # handle.wait_until_stopped.remote()
        self._pending: asyncio.Future | None = None

    def remote(self) -> asyncio.Future:
        self._pending = asyncio.get_running_loop().create_future()
        return self._pending

    def die(self) -> None:
        if not self._pending.done():  # a cancelled watch no longer waits on it
            self._pending.set_exception(RayActorError())

    def stop(self) -> None:
        self._pending.set_result(None)


class Recovery:
    """``recover()``: fails while the actor is still restarting, then succeeds."""

    def __init__(self, failures: int = 0) -> None:
        self.failures, self.calls = failures, 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise RayActorError()


def test_a_death_is_recovered_counted_and_watched_again():
    async def main():
        supervisor, actor, recover = Supervisor(), FakeActor(), Recovery(failures=2)
        supervisor.watch("shard_0", actor, recover)
        await wait_all_tasks_blocked()
        assert supervisor.statistics()["shard_0"] == {
            "alive": True, "restarts": 0, "last_restart_reason": ""}
        actor.die()
        await asyncio.sleep(5.0)  # retries back off on the virtual clock
        assert recover.calls == 3
        stats = supervisor.statistics()["shard_0"]
        assert stats["alive"] and stats["restarts"] == 1
        assert "before finishing this task" in stats["last_restart_reason"]
        actor.die()  # watched again after the recovery
        await asyncio.sleep(1.0)
        assert supervisor.statistics()["shard_0"]["restarts"] == 2 and recover.calls == 4
    run_virtual(FakeClock(), main)


def test_a_stopped_actor_is_not_recovered_and_stop_all_ends_every_watch():
    async def main():
        supervisor, stopped, other = Supervisor(), FakeActor(), FakeActor()
        recover = Recovery()
        supervisor.watch("proxy_a", stopped, recover)
        supervisor.watch("shard_0", other, recover)
        await wait_all_tasks_blocked()
        stopped.stop()
        await wait_all_tasks_blocked()
        supervisor.stop_all()
        await wait_all_tasks_blocked()
        other.die()  # after stop_all: nobody recovers it (shutdown kills it for good)
        await asyncio.sleep(1.0)
        assert recover.calls == 0
    run_virtual(FakeClock(), main)


class FakeClient:
    def __init__(self) -> None:
        self.answers: list = []
        self.asked: list[dict] = []

    def status(self, **filters) -> dict:
        self.asked.append(filters)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def status(restarts: int, alive: bool = True) -> dict:
    return {"controller": {"actors": {"shard_0": {
        "alive": alive, "restarts": restarts, "last_restart_reason": "killed"}}}}


def test_run_reports_each_outage_and_restart_once():
    said: list[str] = []
    client, watch = FakeClient(), Supervision(said.append)
    client.answers = [status(0), ControllerUnavailable("restarting"), RuntimeError("odd"),
                      status(0), status(1, alive=False), status(1), status(1), status(0)]
    results = [watch.status(client) for _ in range(len(client.answers))]
    assert [r is None for r in results] == [False, True, True, False, False, False, False,
                                            False]
    assert said == [
        "control plane: restarting",
        "control plane: the controller answers again",
        "control plane: shard_0 died (killed); Ray is restarting it",
        "control plane: shard_0 restarted by Ray and recovered (1 restart(s); last: killed)",
    ]  # a count back at 0 (the controller itself restarted) is not news
    assert all(asked == {"summary": True} for asked in client.asked)  # never every replica


def test_run_ends_once_two_polls_in_a_row_find_no_controller_at_all():
    """``fleetplane shutdown`` removed the controller (a restarting one keeps its name):
    ``run`` stops instead of polling a dead instance for ever; one miss is not enough."""
    client, watch = FakeClient(), Supervision(lambda _: None)
    client.answers = [ControllerGone("none"), status(0), ControllerGone("none"),
                      ControllerGone("none")]
    assert watch.status(client) is None and watch.status(client) is not None
    assert watch.status(client) is None
    with pytest.raises(ControllerGone):
        watch.status(client)


class Gcs:
    """The joined cluster's GCS, as ``run``'s connection check sees it."""

    def __init__(self, monkeypatch) -> None:
        self.down = False
        monkeypatch.setattr(cli_supervise, "unreachable",
                            lambda address, timeout_s: "Connection refused" if self.down
                            else None)


def test_run_waits_for_a_silent_gcs_and_joins_the_cluster_again_when_it_answers(monkeypatch):
    """The head node down: ``run`` says once what that means for this cluster (its GCS
    keeps its state in Redis), asks the controller nothing meanwhile (a GCS call would
    wait), and on the GCS's return joins again (its raylet may have died with the head)."""
    said, joins, gcs = [], [], Gcs(monkeypatch)
    client = FakeClient()
    watch = Supervision(said.append, "127.0.0.2:6379", "redis", lambda: joins.append(1))
    client.answers = [status(0), status(0)]
    assert watch.status(client) is not None
    gcs.down = True
    assert [watch.status(client) for _ in range(3)] == [None, None, None]
    assert len(said) == 1 and "127.0.0.2:6379 does not answer (Connection refused)" in said[0]
    assert "kept in redis" in said[0] and "keeps supervising" in said[0]
    assert joins == [] and len(client.answers) == 1  # the controller was not asked
    gcs.down = False
    assert watch.status(client) is not None and joins == [1]
    assert said[1] == "control plane: the GCS answers again; joining the cluster again"


def test_a_controller_silent_while_the_gcs_answers_makes_run_join_again(monkeypatch):
    said, joins, gcs = [], [], Gcs(monkeypatch)
    watch = Supervision(said.append, "127.0.0.2:6379", "redis", lambda: joins.append(1))
    client = FakeClient()
    client.answers = [ControllerUnavailable("not answering")] * 3 + [status(0)]
    assert [watch.status(client) for _ in range(3)] == [None, None, None]
    assert joins == [1] and "joining the cluster again" in said[-1]
    assert watch.status(client) is not None and gcs.down is False


def test_a_failed_join_is_tried_again_at_the_next_poll_and_the_controller_not_asked(
        monkeypatch):
    """Between a failed join and the next one this process has no connection: asking the
    controller then would make Ray start a cluster of its own."""
    said, gcs, tries = [], Gcs(monkeypatch), []

    def join() -> None:
        tries.append(1)
        if len(tries) == 1:
            raise ConnectionError("the head is not ready")

    watch, client = Supervision(said.append, "127.0.0.2:6379", "memory", join), FakeClient()
    gcs.down = True
    assert watch.status(client) is None and "no GCS fault tolerance" in said[0]
    gcs.down = False
    client.answers = [status(0)]
    assert watch.status(client) is None and "joining again failed" in said[-1]
    assert watch.status(client) is not None and len(tries) == 2


def test_the_embedded_ray_is_never_joined_again(monkeypatch):
    """Without an address the GCS is this process's own: nothing to wait for or join."""
    gcs, said = Gcs(monkeypatch), []
    gcs.down = True
    client, watch = FakeClient(), Supervision(said.append)
    client.answers = [ControllerUnavailable("x")] * 5
    assert [watch.status(client) for _ in range(5)] == [None] * 5 and said == ["control plane: x"]


def test_an_unwatched_actor_is_neither_recovered_nor_listed():
    """A node that left: Ray will not restart its listeners, so recovering them would
    retry for ever; ``unwatch`` ends the watch and drops it from status."""
    async def main():
        supervisor, gone, recover = Supervisor(), FakeActor(), Recovery(failures=10**6)
        supervisor.watch("proxy_node_0", gone, recover)
        await wait_all_tasks_blocked()
        supervisor.unwatch("proxy_node_0")
        gone.die()
        await asyncio.sleep(10.0)
        assert recover.calls == 0 and "proxy_node_0" not in supervisor.statistics()
    run_virtual(FakeClock(), main)
