"""VersionRollout: what replicas are started with, before and after a failed rollout."""

from __future__ import annotations

from controlplane.deployment.version_rollout import VersionRollout
from tests.unit.shard_harness import make_spec

V1 = make_spec(3, "v1", serialized_def=b"one", ray_actor_options={"num_cpus": 1})
V2 = make_spec(3, "v2", serialized_def=b"two", ray_actor_options={"num_cpus": 2})


def test_a_first_deploy_has_nothing_to_roll_back_to():
    rollout = VersionRollout(V1)
    assert not rollout.rolling and rollout.with_failure("boom") == rollout
    assert rollout.serving == V1


def test_new_code_rolls_with_the_old_as_fallback_and_rolls_back_on_failure():
    rollout = VersionRollout(V1).retarget(V2)
    assert rollout.rolling and rollout.serving == V2
    back = rollout.with_failure("replicas of v2 turned unhealthy")
    assert back.rolled_back and back.failed == "replicas of v2 turned unhealthy"
    assert (back.serving.code_version, back.serving.serialized_def) == ("v1", b"one")
    assert back.serving.ray_actor_options == {"num_cpus": 1}


def test_a_rollback_keeps_the_targets_other_fields():
    back = VersionRollout(V1).retarget(V2).with_failure("boom").retarget(
        make_spec(5, "v2", serialized_def=b"two", max_ongoing_requests=9))
    assert back.rolled_back
    assert back.serving.num_replicas == 5 and back.serving.max_ongoing_requests == 9
    assert back.serving.code_version == "v1"


def test_new_code_after_a_rollback_retries_from_what_serves():
    rollout = VersionRollout(V1).retarget(V2).with_failure("boom").retarget(
        make_spec(3, "v3", serialized_def=b"three"))
    assert rollout.rolling and rollout.serving.code_version == "v3"
    assert rollout.fallback.code_version == "v1"


def test_going_back_to_the_serving_code_clears_the_failure():
    rollout = VersionRollout(V1).retarget(V2).with_failure("boom").retarget(V1)
    assert rollout == VersionRollout(V1)


def test_going_back_to_the_fallback_during_a_rollout_has_nothing_to_prove():
    """A new version stuck starting, and the operator deploys the old one again."""
    assert VersionRollout(V1).retarget(V2).retarget(V1) == VersionRollout(V1)
