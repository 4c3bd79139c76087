"""reconcile.plan and reconcile.deployment_status: pure functions over frozen snapshots."""

from __future__ import annotations

import itertools

import pytest

from controlplane.deployment.lifecycle import ReplicaState
from controlplane.deployment.reconcile import (
    DeploymentSnapshot,
    ReconfigureReplica,
    ReplicaView,
    StartReplica,
    StopReplica,
    deployment_status,
    plan,
)

S = ReplicaState
ALL_STATES = (S.STARTING, S.RUNNING, S.UPDATING, S.STOPPING)


def view(rid: str, state: ReplicaState = S.RUNNING, version: str = "v1",
         config: str = "c1", rank: int | None = None) -> ReplicaView:
    return ReplicaView(replica_id=rid, state=state, version=version, config_version=config,
                       rank=rank)


def running(n: int, version: str = "v1", config: str = "c1", prefix: str = "r",
            first_rank: int = 0) -> tuple[ReplicaView, ...]:
    return tuple(view(f"{prefix}{i}", S.RUNNING, version, config, first_rank + i)
                 for i in range(n))


def snap(*replicas: ReplicaView, target: int = 1, version: str = "v1", config: str = "c1",
         **kw) -> DeploymentSnapshot:
    return DeploymentSnapshot(target_replicas=target, target_version=version,
                              target_config_version=config, replicas=tuple(replicas), **kw)


def starts(actions: list) -> int:
    return sum(isinstance(a, StartReplica) for a in actions)


def stopped(actions: list) -> list[str]:
    return [a.replica_id for a in actions if isinstance(a, StopReplica)]


def reconfigured(actions: list) -> list[str]:
    return [a.replica_id for a in actions if isinstance(a, ReconfigureReplica)]


def status(s: DeploymentSnapshot, deploy_failed: bool = False, unhealthy: bool = False) -> str:
    return deployment_status(s, deploy_failed, unhealthy)


# -- scale up / expectations -------------------------------------------------------------


@pytest.mark.parametrize("target", [1, 3, 7])
def test_scale_up_from_zero_starts_exactly_the_target(target):
    assert plan(snap(target=target)) == [StartReplica()] * target


def test_starting_replicas_count_toward_the_target():
    s = snap(view("a", S.STARTING, rank=0), view("b", S.STARTING, rank=1), target=3)
    assert plan(s) == [StartReplica()]


def test_all_starting_means_nothing_more_to_start():
    s = snap(*(view(f"r{i}", S.STARTING, rank=i) for i in range(3)), target=3)
    assert plan(s) == []


def test_updating_replica_counts_toward_the_target():
    s = snap(view("a", S.UPDATING, rank=0), view("b", S.RUNNING, rank=1), target=2)
    assert plan(s) == []


def test_stopping_replica_does_not_count_toward_the_target():
    s = snap(view("a", S.RUNNING, rank=0), view("b", S.STOPPING, rank=1), target=2)
    assert plan(s) == [StartReplica()]


def test_stopping_replica_is_not_stopped_again():
    s = snap(view("a", S.STOPPING, rank=0), target=0)
    assert plan(s) == []


def test_steady_state_plans_nothing():
    assert plan(snap(*running(3), target=3)) == []


# -- scale down ---------------------------------------------------------------------------


def test_scale_down_stops_highest_ranks_first():
    actions = plan(snap(*running(4), target=2))
    assert stopped(actions) == ["r3", "r2"]
    assert all(a.reason == "scaled down" for a in actions)
    assert starts(actions) == 0


def test_scale_down_order_follows_rank_not_replica_id():
    replicas = (view("z", rank=0), view("a", rank=2), view("m", rank=1))
    assert stopped(plan(snap(*replicas, target=1))) == ["a", "m"]


def test_scale_down_stops_starting_before_running():
    replicas = (*running(2), view("s1", S.STARTING, rank=2), view("s0", S.STARTING, rank=3))
    assert stopped(plan(snap(*replicas, target=2))) == ["s0", "s1"]


def test_scale_down_stops_starting_even_if_it_holds_a_low_rank():
    replicas = (view("s", S.STARTING, rank=0), view("a", rank=1), view("b", rank=2))
    assert stopped(plan(snap(*replicas, target=2))) == ["s"]


def test_scale_down_ignores_already_stopping_replicas():
    replicas = (*running(2), view("x", S.STOPPING, rank=5))
    assert stopped(plan(snap(*replicas, target=1))) == ["r1"]


# -- user_config --------------------------------------------------------------------------


def test_config_change_reconfigures_as_many_replicas_at_once_as_the_surge():
    actions = plan(snap(*running(3, config="c1"), target=3, config="c2", surge=3))
    assert actions == [ReconfigureReplica("r0"), ReconfigureReplica("r1"),
                       ReconfigureReplica("r2")]
    assert reconfigured(plan(snap(*running(3, config="c1"), target=3, config="c2",
                                  surge=2))) == ["r0", "r1"]


def test_replicas_reconfiguring_now_count_against_the_surge():
    replicas = (view("busy", S.UPDATING, "v1", "c1", 0), *running(2, config="c1"))
    assert reconfigured(plan(snap(*replicas, target=3, config="c2", surge=1))) == []
    assert reconfigured(plan(snap(*replicas, target=3, config="c2", surge=2))) == ["r0"]


def test_config_change_reconfigures_only_running_same_version_with_other_config():
    replicas = (
        view("stale", S.RUNNING, "v1", "c1", 0),
        view("fresh", S.RUNNING, "v1", "c2", 1),
        view("updating", S.UPDATING, "v1", "c1", 2),
        view("starting", S.STARTING, "v1", "c1", 3),
        view("stopping", S.STOPPING, "v1", "c1", 4),
    )
    assert reconfigured(plan(snap(*replicas, target=4, config="c2", surge=4))) == ["stale"]


def test_config_change_does_not_reconfigure_old_version_replicas():
    replicas = (*running(2, "v0", "c1", prefix="old"), *running(1, "v1", "c1", prefix="new"))
    assert reconfigured(plan(snap(*replicas, target=2, config="c2", surge=2))) == ["new0"]


def test_config_change_starts_and_stops_nothing():
    actions = plan(snap(*running(3, config="c1"), target=3, config="c2"))
    assert starts(actions) == 0 and stopped(actions) == []


def test_scale_down_with_config_change_does_not_reconfigure_the_replicas_it_stops():
    # at 699ab2b the plan reconfigured replicas it also stopped, racing their drain
    actions = plan(snap(*running(3, config="c1"), target=1, config="c2"))
    assert stopped(actions) == ["r2", "r1"]
    assert reconfigured(actions) == ["r0"]


# -- rolling update -----------------------------------------------------------------------


def test_rolling_update_starts_one_new_while_old_serve():
    actions = plan(snap(*running(2, "v1", prefix="old"), target=2, version="v2", surge=1))
    assert actions == [StartReplica()]


def test_rolling_update_waits_while_the_new_replica_starts():
    replicas = (*running(2, "v1", prefix="old"), view("new0", S.STARTING, "v2", rank=2))
    assert plan(snap(*replicas, target=2, version="v2", surge=1)) == []


def test_rolling_update_retires_one_old_per_running_new():
    replicas = (*running(2, "v1", prefix="old"), view("new0", S.RUNNING, "v2", rank=2))
    actions = plan(snap(*replicas, target=2, version="v2", surge=1))
    assert actions == [StopReplica("old1", "replaced by new version")]


def test_rolling_update_starts_the_next_once_an_old_has_retired():
    replicas = (view("old0", S.RUNNING, "v1", rank=0), view("old1", S.STOPPING, "v1", rank=1),
                view("new0", S.RUNNING, "v2", rank=2))
    assert plan(snap(*replicas, target=2, version="v2", surge=1)) == [StartReplica()]


def test_rolling_update_retires_the_last_old_when_new_reach_the_target():
    replicas = (view("old0", S.RUNNING, "v1", rank=0), *running(2, "v2", prefix="new"))
    actions = plan(snap(*replicas, target=2, version="v2", surge=1))
    assert actions == [StopReplica("old0", "replaced by new version")]


def test_rolling_update_surge_bounds_the_starts():
    actions = plan(snap(*running(10, "v1"), target=10, version="v2", surge=3))
    assert actions == [StartReplica()] * 3


def test_rolling_update_updating_old_replica_counts_as_serving():
    replicas = (view("old0", S.RUNNING, "v1", rank=0), view("old1", S.UPDATING, "v1", rank=1))
    assert plan(snap(*replicas, target=2, version="v2", surge=1)) == [StartReplica()]


def test_rolling_update_stops_old_version_starting_replicas_at_once():
    replicas = (*running(2, "v1", prefix="old"), view("olds", S.STARTING, "v1", rank=2))
    actions = plan(snap(*replicas, target=3, version="v2", surge=1))
    assert StopReplica("olds", "outdated version") in actions
    # the starting one did not serve, so it does not hold the surge room
    assert starts(actions) == 2


def test_rolling_update_with_no_old_serving_starts_all_at_once():
    replicas = (view("olds", S.STARTING, "v1", rank=0),)
    actions = plan(snap(*replicas, target=3, version="v2", surge=1))
    assert stopped(actions) == ["olds"] and starts(actions) == 3


def _simulate_rollout(target: int, surge: int) -> list[DeploymentSnapshot]:
    """Drive plan to convergence: a start appears STARTING, then RUNNING next step;
    a stop goes STOPPING, then disappears next step."""
    replicas = list(running(target, "v1", prefix="old"))
    seq = itertools.count()
    seen = []
    for _ in range(100):
        s = snap(*replicas, target=target, version="v2", surge=surge)
        seen.append(s)
        actions = plan(s)
        if not actions and all(r.state == S.RUNNING for r in replicas):
            return seen
        # progress the previous step: STARTING -> RUNNING, STOPPING -> gone
        replicas = [r if r.state != S.STARTING else view(r.replica_id, S.RUNNING, r.version,
                                                        r.config_version, r.rank)
                    for r in replicas if r.state != S.STOPPING]
        for a in actions:
            if isinstance(a, StopReplica):
                replicas = [view(r.replica_id, S.STOPPING, r.version, r.config_version, r.rank)
                            if r.replica_id == a.replica_id else r for r in replicas]
            elif isinstance(a, StartReplica):
                replicas.append(view(f"new{next(seq)}", S.STARTING, "v2", "c1", None))
    raise AssertionError("rollout did not converge")


@pytest.mark.parametrize("target,surge", [(1, 1), (2, 1), (3, 1), (5, 2), (10, 3)])
def test_rolling_update_never_drops_serving_below_target_and_converges(target, surge):
    seen = _simulate_rollout(target, surge)
    for s in seen:
        serving = sum(r.state in (S.RUNNING, S.UPDATING) for r in s.replicas)
        active = sum(r.state in (S.STARTING, S.RUNNING, S.UPDATING) for r in s.replicas)
        assert serving >= target
        assert active <= target + surge
    final = seen[-1].replicas
    assert len(final) == target and all(r.version == "v2" for r in final)


def test_starts_blocked_prevents_starts_and_old_version_keeps_serving():
    s = snap(*running(2, "v1", prefix="old"), target=2, version="v2", starts_blocked=True)
    assert plan(s) == []


def test_starts_blocked_still_scales_down():
    s = snap(*running(3), target=1, starts_blocked=True)
    assert stopped(plan(s)) == ["r2", "r1"]


def test_starts_blocked_from_zero_starts_nothing():
    assert plan(snap(target=3, starts_blocked=True)) == []


def test_starts_blocked_still_stops_old_version_starting():
    replicas = (*running(1, "v1", prefix="old"), view("olds", S.STARTING, "v1", rank=1))
    s = snap(*replicas, target=2, version="v2", starts_blocked=True)
    assert plan(s) == [StopReplica("olds", "outdated version")]


# -- target 0 and delete -----------------------------------------------------------------


def test_target_zero_stops_everything_active():
    replicas = (view("a", S.RUNNING, rank=0), view("b", S.STARTING, rank=1),
                view("c", S.UPDATING, rank=2), view("d", S.STOPPING, rank=3))
    assert sorted(stopped(plan(snap(*replicas, target=0)))) == ["a", "b", "c"]


def test_target_zero_during_rollout_retires_every_old_replica():
    replicas = (*running(2, "v1", prefix="old"), view("new0", S.STARTING, "v2", rank=2))
    actions = plan(snap(*replicas, target=0, version="v2"))
    assert sorted(stopped(actions)) == ["new0", "old0", "old1"]
    assert starts(actions) == 0


def test_deleting_stops_every_active_replica_and_nothing_else():
    replicas = (view("a", S.RUNNING, rank=0), view("b", S.STARTING, "v0", rank=1),
                view("c", S.UPDATING, config="c0", rank=2), view("d", S.STOPPING, rank=3))
    actions = plan(snap(*replicas, target=5, version="v1", config="c1", deleting=True))
    assert actions == [StopReplica("a", "application deleted"),
                       StopReplica("b", "application deleted"),
                       StopReplica("c", "application deleted")]


def test_deleting_with_nothing_active_plans_nothing():
    assert plan(snap(view("d", S.STOPPING, rank=0), target=3, deleting=True)) == []


# -- idempotence -------------------------------------------------------------------------


IDEMPOTENCE_CASES = [
    snap(target=3),
    snap(*running(4), target=2),
    snap(*running(3, config="c0"), target=3, config="c1"),
    snap(*running(2, "v1", prefix="old"), view("n", S.RUNNING, "v2", rank=2), target=2,
         version="v2"),
    snap(*running(2), view("s", S.STARTING, "v0", rank=2), target=2),
    snap(*running(2), target=2, deleting=True),
]


@pytest.mark.parametrize("s", IDEMPOTENCE_CASES)
def test_same_snapshot_gives_the_same_plan(s):
    first = plan(s)
    assert plan(s) == first
    assert plan(DeploymentSnapshot(**{f: getattr(s, f) for f in s.__dataclass_fields__})) == first


def test_plan_does_not_depend_on_replica_order():
    replicas = (*running(3, "v1", prefix="old"), view("s", S.STARTING, "v0", rank=9))
    forward = plan(snap(*replicas, target=1, version="v1"))
    backward = plan(snap(*reversed(replicas), target=1, version="v1"))
    assert sorted(map(repr, forward)) == sorted(map(repr, backward))


# -- deployment_status ------------------------------------------------------------------


def test_status_healthy_when_settled():
    assert status(snap(*running(3), target=3)) == "HEALTHY"


def test_status_healthy_with_zero_target_and_nothing_active():
    assert status(snap(view("x", S.STOPPING, rank=0), target=0)) == "HEALTHY"


@pytest.mark.parametrize("s", [
    snap(target=1),
    snap(*running(2), target=1),
    snap(view("a", S.STARTING, rank=0), target=1),
    snap(view("a", S.UPDATING, rank=0), target=1),
    snap(*running(1, config="c0"), target=1),
    snap(*running(1, "v0"), target=1),
])
def test_status_updating_while_not_settled(s):
    assert status(s) == "UPDATING"


def test_status_unhealthy_replaces_updating_when_flagged():
    assert status(snap(*running(1), target=2), unhealthy=True) == "UNHEALTHY"


def test_status_settled_is_healthy_even_if_flag_is_still_set():
    assert status(snap(*running(2), target=2), unhealthy=True) == "HEALTHY"


def test_status_deploy_failed_beats_everything_but_deleting():
    s = snap(*running(2, "v0"), target=2)
    assert status(s, deploy_failed=True, unhealthy=True) == "DEPLOY_FAILED"
    assert status(snap(*running(2), target=2), deploy_failed=True) == "DEPLOY_FAILED"


def test_status_deleting_beats_everything():
    s = snap(*running(2), target=2, deleting=True)
    assert status(s, deploy_failed=True, unhealthy=True) == "DELETING"


@pytest.mark.parametrize("state", ALL_STATES)
def test_status_healthy_only_when_all_active_running(state):
    s = snap(view("a", rank=0), view("b", state, rank=1), target=2)
    # a STOPPING one is not active, which leaves the deployment one replica short
    assert status(s) == ("HEALTHY" if state == S.RUNNING else "UPDATING")


def test_starts_in_flight_are_bounded_and_the_rest_follow():
    """Issue 16: a scale-up asks Ray for at most max_starting actors at once."""
    assert starts(plan(snap(target=10, max_starting=3))) == 3
    three_starting = [view(f"s{i}", S.STARTING) for i in range(3)]
    assert starts(plan(snap(*three_starting, target=10, max_starting=3))) == 0
    one_started = [view("s0", S.RUNNING), *three_starting[1:]]
    assert starts(plan(snap(*one_started, target=10, max_starting=3))) == 1
    assert starts(plan(snap(target=10, max_starting=0))) == 10  # 0: no bound
