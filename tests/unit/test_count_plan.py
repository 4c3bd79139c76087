"""The planner's counts plan against its full plan: equal wherever it answers, and it
answers a rolling update without walking the replicas."""

from __future__ import annotations

import random

import pytest

from controlplane.deployment import reconcile
from controlplane.deployment.drains import NodeDrains
from controlplane.deployment.lifecycle import ReplicaState
from controlplane.deployment.planner import Planner
from controlplane.deployment.replica_book import ReplicaBook
from controlplane.deployment.replica_set import ReplicaRecord
from controlplane.deployment.rollout import Rollout
from controlplane.settings import ShardSettings
from controlplane.specs import DeploymentSpec
from tests.unit.shard_harness import make_spec

S = ReplicaState


class Planned:
    """A planner over a book and rollout of its own (no conductor, no replica operations)."""

    def __init__(self, spec: DeploymentSpec, settings: ShardSettings = ShardSettings()) -> None:
        self.spec, self.target = spec, spec.num_replicas
        self.book, self.rollout = ReplicaBook(spec.id, 30.0), Rollout(spec, settings)
        self.planner = Planner(self.book, self.rollout, NodeDrains(), settings)
        self.version = self.rollout.serving.code_version
        self.config = self.rollout.serving_config[1]

    def add(self, record: ReplicaRecord, config: str) -> None:
        self.book.replicas.add(record)
        self.book.config_versions[record.replica_id] = config

    def from_counts(self, cap: bool = False):
        return self.planner.from_counts(0.0, self.target, cap=cap)

    def full_plan(self) -> tuple[list, reconcile.DeploymentSnapshot]:
        snapshot = self.planner.snapshot(0.0, self.target, False, self.spec)
        return reconcile.plan(snapshot), snapshot


def random_state(rng: random.Random, transitions_per_slice: int = 0) -> Planned:
    settings = ShardSettings(max_starting_replicas=rng.choice([0, 2, 512]),
                             rolling_surge_fraction=rng.choice([0.2, 0.5]),
                             transitions_per_slice=transitions_per_slice)
    state = Planned(make_spec(rng.randrange(0, 12)), settings)
    version, config = state.version, state.config
    n = rng.randrange(0, 14)
    ranks = list(range(n)) if rng.random() < 0.8 else [rng.randrange(4) for _ in range(n)]
    replicas = state.book.replicas
    for i in range(n):
        rid = f"app#dep#{i}"
        state.add(ReplicaRecord(
            replica_id=rid, rank=ranks[i] if rng.random() < 0.95 else None, started_at=0.0,
            actor_name=rid, state=rng.choice([S.STARTING, S.RUNNING, S.RUNNING, S.STOPPING]),
            version=rng.choice([version, version, "old", "older"])),
            config if rng.random() < 0.95 else "old")
    for _ in range(rng.randrange(0, 6)):  # churn: rank moves and re-inserts leave garbage
        record = rng.choice(replicas.records()) if len(replicas) else None
        if record is not None:
            replicas.replace(record.with_state(record.state, rank=rng.randrange(n + 2)))
    return state


@pytest.mark.parametrize("seed", range(300))
def test_the_counts_plan_equals_the_full_plan_wherever_it_answers(seed):
    rng = random.Random(seed)
    state = random_state(rng)
    fast = state.from_counts()
    if fast is not None:
        plan, snapshot = state.full_plan()
        assert fast[0] == plan
        assert fast[1] == all(r.version == snapshot.target_version for r in snapshot.replicas
                              if r.state in (S.STARTING, S.RUNNING, S.UPDATING))
        assert state.from_counts() == fast  # asking does not consume


def test_a_rolling_update_of_many_replicas_is_answered_from_counts():
    state = Planned(make_spec(1000))
    for i in range(1000):
        rid = f"app#dep#{i}"
        state.add(ReplicaRecord(replica_id=rid, rank=i, actor_name=rid, state=S.RUNNING,
                                version="old"), state.config)
    actions, on_target = state.from_counts()
    assert (len(actions), on_target) == (200, False)  # 20% surge: 200 new ones start
    for i in range(150):  # 150 of them run now: 150 old ones retire, highest rank first
        rid = f"app#dep#new{i}"
        state.add(ReplicaRecord(replica_id=rid, rank=1000 + i, actor_name=rid,
                                state=S.RUNNING, version=state.version), state.config)
    actions, _ = state.from_counts()
    stops = [a.replica_id for a in actions if isinstance(a, reconcile.StopReplica)]
    assert stops == [f"app#dep#{i}" for i in range(999, 849, -1)]


@pytest.mark.parametrize("seed", range(100))
def test_a_capped_plan_is_the_first_actions_of_the_whole_one(seed):
    rng = random.Random(seed)
    cap = rng.randrange(1, 6)
    state = random_state(rng, transitions_per_slice=cap)
    whole = state.from_counts()
    if whole is not None:
        capped = state.from_counts(cap=True)
        assert capped == (whole[0][:cap + 1], whole[1])
