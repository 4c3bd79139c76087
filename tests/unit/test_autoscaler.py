"""The autoscaler owner: who counts (told by replica moves), its cadence, and a redeploy
that keeps its load history. The decision itself is ``autoscaling.decide``
(test_autoscaling.py); the window, ``MetricWindow`` (test_metric_window.py)."""

from __future__ import annotations

from controlplane.config.schema import AutoscalingConfig
from controlplane.deployment.autoscaler import DECIDE_EVERY_S, Autoscaler
from controlplane.deployment.lifecycle import ReplicaState
from controlplane.deployment.replica_set import Moved, ReplicaRecord

S = ReplicaState


def config(**fields) -> dict:
    return AutoscalingConfig(**{"min_replicas": 1, "max_replicas": 10,
                                "target_ongoing_requests": 2, "upscale_delay_s": 0,
                                "look_back_period_s": 10, **fields}).model_dump()


def move(scaler: Autoscaler, rid: str, was: S | None, state: S, now: float = 0.0) -> None:
    scaler.replica_moved(Moved(rid, was, ReplicaRecord(rid, state, "v1"), now))


def test_only_serving_replicas_loads_count():
    scaler = Autoscaler(config())
    move(scaler, "a", S.STARTING, S.RUNNING)
    move(scaler, "b", S.STARTING, S.RUNNING)
    scaler.decide(0.0, 1, ["a", "b"])  # the window learns who counts
    scaler.record_loads([("a", 4), ("b", 4), ("stranger", 100)], 1.0)
    assert scaler.average_load(1.5) == 8  # the stranger is not counted
    move(scaler, "b", S.RUNNING, S.STOPPING)
    assert scaler.average_load(1.5) == 4


def test_a_decision_is_due_once_a_second_and_says_why():
    scaler = Autoscaler(config())
    move(scaler, "a", S.STARTING, S.RUNNING)
    assert scaler.due(0.0)
    assert scaler.decide(0.0, 1, ["a"]) is None  # no load yet: keep the target
    assert not scaler.due(DECIDE_EVERY_S - 0.01) and scaler.due(DECIDE_EVERY_S)
    scaler.record_load("a", 8, 1.0)
    decision = scaler.decide(DECIDE_EVERY_S, 1, ["a"])
    assert decision.target_replicas == 4 and "load 8" in decision.reason


def test_not_autoscaled_it_is_never_due_and_forgets_what_ends():
    scaler = Autoscaler(None)
    assert not scaler.active and not scaler.due(100.0)
    move(scaler, "a", S.STARTING, S.RUNNING)  # nothing to count without a policy
    move(scaler, "a", S.RUNNING, S.STOPPED)


def test_a_redeploy_keeps_the_window_unless_the_look_back_changes():
    scaler = Autoscaler(config())
    move(scaler, "a", S.STARTING, S.RUNNING)
    scaler.decide(0.0, 1, ["a"])
    scaler.record_load("a", 6, 1.0)
    scaler.configure(config(max_replicas=20))
    assert scaler.average_load(1.5) == 6  # the history stands
    scaler.configure(config(look_back_period_s=30))
    assert scaler.average_load(1.5) is None  # a new window learns again
    scaler.configure(None)
    assert not scaler.active
