"""The counts plan against the full plan: equal wherever it answers, and it answers a
rolling update without walking the replicas."""

from __future__ import annotations

import random

import pytest

from controlplane.deployment import reconcile
from controlplane.deployment.state import DeploymentState
from controlplane.deployment.lifecycle import ReplicaState
from controlplane.deployment.replica_set import ReplicaRecord
from controlplane.settings import ShardSettings
from tests.unit.shard_harness import make_spec

S = ReplicaState


def random_state(rng: random.Random) -> DeploymentState:
    settings = ShardSettings(max_starting_replicas=rng.choice([0, 2, 512]),
                             rolling_surge_fraction=rng.choice([0.2, 0.5]))
    state = DeploymentState(make_spec(rng.randrange(0, 12)), settings,
                            lambda coro: coro.close(), lambda d: None)
    version, config = state.rollout.serving.code_version, state.config.serving[1]
    n = rng.randrange(0, 14)
    ranks = list(range(n)) if rng.random() < 0.8 else [rng.randrange(4) for _ in range(n)]
    for i in range(n):
        rid = f"app#dep#{i}"
        state.replicas.add(ReplicaRecord(
            replica_id=rid, rank=ranks[i] if rng.random() < 0.95 else None, started_at=0.0,
            actor_name=rid, state=rng.choice([S.STARTING, S.RUNNING, S.RUNNING, S.STOPPING]),
            version=rng.choice([version, version, "old", "older"])))
        state._config_versions[rid] = config if rng.random() < 0.95 else "old"
    for _ in range(rng.randrange(0, 6)):  # churn: rank moves and re-inserts leave garbage
        record = rng.choice(state.replicas.records()) if len(state.replicas) else None
        if record is not None:
            state.replicas.replace(record.with_state(record.state, rank=rng.randrange(n + 2)))
    return state


@pytest.mark.parametrize("seed", range(300))
def test_the_counts_plan_equals_the_full_plan_wherever_it_answers(seed):
    rng = random.Random(seed)
    state = random_state(rng)
    fast = state._plan_from_counts(now=0.0)
    if fast is not None:
        snapshot = state.snapshot(0.0)
        assert fast[0] == reconcile.plan(snapshot)
        assert fast[1] == all(r.version == snapshot.target_version for r in snapshot.replicas
                              if r.state in (S.STARTING, S.RUNNING, S.UPDATING))
        assert state._plan_from_counts(now=0.0) == fast  # asking does not consume


def test_a_rolling_update_of_many_replicas_is_answered_from_counts():
    state = DeploymentState(make_spec(1000), ShardSettings(), lambda coro: coro.close(),
                            lambda d: None)
    config = state.config.serving[1]
    for i in range(1000):
        rid = f"app#dep#{i}"
        state.replicas.add(ReplicaRecord(replica_id=rid, rank=i, actor_name=rid,
                                         state=S.RUNNING, version="old"))
        state._config_versions[rid] = config
    actions, on_target = state._plan_from_counts(now=0.0)
    assert (len(actions), on_target) == (200, False)  # 20% surge: 200 new ones start
    for i in range(150):  # 150 of them run now: 150 old ones retire, highest rank first
        rid = f"app#dep#new{i}"
        state.replicas.add(ReplicaRecord(replica_id=rid, rank=1000 + i, actor_name=rid,
                                         state=S.RUNNING, version=state.rollout.serving.code_version))
        state._config_versions[rid] = config
    actions, _ = state._plan_from_counts(now=0.0)
    stops = [a.replica_id for a in actions if isinstance(a, reconcile.StopReplica)]
    assert stops == [f"app#dep#{i}" for i in range(999, 849, -1)]


@pytest.mark.parametrize("seed", range(100))
def test_a_capped_plan_is_the_first_actions_of_the_whole_one(seed):
    rng = random.Random(seed)
    state = random_state(rng)
    whole = state._plan_from_counts(now=0.0)
    if whole is not None:
        cap = rng.randrange(1, 6)
        state.settings = ShardSettings(**{**vars(state.settings), "transitions_per_slice": cap})
        capped = state._plan_from_counts(now=0.0, cap=True)
        assert capped == (whole[0][:cap + 1], whole[1])
