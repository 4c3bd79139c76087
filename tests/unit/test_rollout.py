"""The rollout owner: code and config rollouts, proving windows and start backoff, told
of replica moves and of what went wrong."""

from __future__ import annotations

from controlplane.deployment.lifecycle import ReplicaState
from controlplane.deployment.replica_set import Moved, ReplicaRecord
from controlplane.deployment.rollout import Rollout
from controlplane.settings import ShardSettings
from tests.unit.shard_harness import make_spec

S = ReplicaState
SETTINGS = ShardSettings(rollout_proving_periods=2, unhealthy_threshold=3,
                         max_constructor_retries=1)
PERIOD = 10.0  # make_spec's health_check_period_s


def start(rollout: Rollout, rid: str, version: str, now: float) -> None:
    record = ReplicaRecord(rid, S.RUNNING, version, 0, rid, started_at=now - 1)
    rollout.replica_moved(Moved(rid, S.STARTING, record, now, started=True))


def rolled_to_v2() -> Rollout:
    rollout = Rollout(make_spec(2, code_version="v1"), SETTINGS)
    rollout.retarget(make_spec(2, code_version="v2"))
    assert rollout.version.rolling and rollout.serving.code_version == "v2"
    return rollout


def test_a_new_replica_that_turns_unhealthy_while_proving_rolls_the_rollout_back():
    rollout = rolled_to_v2()
    start(rollout, "r1", "v2", now=100.0)
    proving_s = (2 + 3) * PERIOD
    rollout.turned_unhealthy("r1", "check failed", now=100.0 + proving_s - 1)
    assert rollout.version.rolled_back and rollout.serving.code_version == "v1"
    assert "check failed" in rollout.message("DEPLOY_FAILED") and rollout.deploy_failed


def test_after_its_proving_window_an_unhealthy_replica_is_an_ordinary_failure():
    rollout = rolled_to_v2()
    start(rollout, "r1", "v2", now=100.0)
    rollout.turned_unhealthy("r1", "check failed", now=100.0 + 5 * PERIOD)
    assert rollout.version.rolling and not rollout.deploy_failed


def test_the_rollout_settles_once_on_target_and_past_the_last_proving_window():
    rollout = rolled_to_v2()
    start(rollout, "r1", "v2", now=100.0)
    start(rollout, "r2", "v2", now=120.0)
    rollout.settle(now=200.0, on_target=False)
    assert rollout.version.rolling  # an old replica still runs
    rollout.settle(now=120.0 + 5 * PERIOD - 1, on_target=True)
    assert rollout.version.rolling  # r2 is still proving
    rollout.settle(now=120.0 + 5 * PERIOD, on_target=True)
    assert not rollout.version.rolling
    rollout.turned_unhealthy("r2", "late", now=120.0 + 5 * PERIOD + 1)
    assert not rollout.deploy_failed  # nothing to roll back to any more


def test_a_proving_window_ends_with_its_replica():
    rollout = rolled_to_v2()
    start(rollout, "r1", "v2", now=100.0)
    gone = ReplicaRecord("r1", S.STOPPED, "v2", 0, "r1")
    rollout.replica_moved(Moved("r1", S.STOPPING, gone, 101.0))
    rollout.turned_unhealthy("r1", "check failed", now=102.0)
    assert rollout.version.rolling  # no window left for it: not a rollback


def test_the_start_budget_spent_during_a_rollout_rolls_back_and_lifts_the_backoff():
    rollout = rolled_to_v2()
    rollout.start_failed("boom", now=1.0, target_replicas=1)
    assert rollout.version.rolled_back and not rollout.starts_blocked(1.0)
    assert "boom" in rollout.message("DEPLOY_FAILED")


def test_start_failures_without_a_rollout_back_off_then_expire_once():
    rollout = Rollout(make_spec(3), ShardSettings(start_backoff_initial_s=2.0))
    rollout.start_failed("boom", now=10.0, target_replicas=3)
    assert rollout.starts_blocked(11.0) and not rollout.backoff_expired(11.0)
    assert rollout.backoff_expired(12.0) and not rollout.backoff_expired(12.5)
    assert not rollout.starts_blocked(12.5) and rollout.message("UPDATING") == "boom"
    start(rollout, "r1", "v1", now=13.0)  # a start ends the streak and its message
    assert rollout.backoff.failures == 0 and rollout.message("UPDATING") == ""


def test_a_failed_reconfigure_keeps_the_fallback_config_serving():
    rollout = Rollout(make_spec(2, user_config={"k": 1}), SETTINGS)
    old = rollout.serving_config
    rollout.retarget(make_spec(2, user_config={"k": 2}))
    new_version = rollout.serving_config[1]
    assert rollout.reconfigure_failed("r1", new_version, "reconfigure raised")
    assert rollout.serving_config == old and rollout.deploy_failed
    # the fallback itself failing leaves nothing to go back to: replace the replica
    assert not rollout.reconfigure_failed("r1", old[1], "again")
    assert "reconfigure of r1 failed" in rollout.backoff.last_error


def test_a_deploy_of_new_code_retries_what_failed():
    rollout = rolled_to_v2()
    rollout.start_failed("boom", now=1.0, target_replicas=1)
    rollout.retarget(make_spec(2, code_version="v3"))
    assert not rollout.deploy_failed and rollout.serving.code_version == "v3"
    assert rollout.version.fallback.code_version == "v1"
