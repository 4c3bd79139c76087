"""Metric window and autoscaling decision: pure logic, exact virtual times, no Ray."""

from __future__ import annotations

import pickle

import pytest

from controlplane.deployment.autoscaling import (AutoscalingPolicy, MetricWindow, ScalingState, decide,
                                      initial_target)
from controlplane.config.schema import AutoscalingConfig
from controlplane.wire import MetricReport, PushedHealth

T0 = 1000.0


def report(replica_id: str, ongoing: int, queued: int = 0) -> MetricReport:
    return MetricReport(replica_id, ongoing_requests=ongoing,
                        queued_requests=queued)


def policy(**overrides: object) -> AutoscalingPolicy:
    """Built directly, with the schema's defaults for what is not given."""
    cfg = {"min_replicas": 1, "max_replicas": 10, "target_ongoing_requests": 2.0,
           "upscale_delay_s": 30.0, "downscale_delay_s": 600.0, "look_back_period_s": 30.0}
    return AutoscalingPolicy(**{**cfg, **overrides})


# --- MetricReport -------------------------------------------------------------------


def test_report_load_and_old_senders_without_health_stay_valid():
    r = MetricReport("r1", ongoing_requests=2, queued_requests=3)
    assert r.health is None
    assert r.load == 5


def test_report_survives_pickle():
    r = MetricReport("r1", 0, 0, health=PushedHealth(False, 2.0, 1))
    assert pickle.loads(pickle.dumps(r)) == r


def test_report_rejects_negative_counts():
    with pytest.raises(ValueError):
        MetricReport("r1", -1, 0)


# --- MetricWindow -------------------------------------------------------------------
# (its O(reports) bookkeeping, checked against a recount: test_metric_window.py)


def window(look_back_period_s: float, *counted: str, **kwargs: int) -> MetricWindow:
    w = MetricWindow(look_back_period_s=look_back_period_s, **kwargs)
    w.include_only(counted)
    return w


def test_average_load_is_mean_per_replica_summed_over_replicas():
    w = window(30.0, "a", "b")
    w.record(report("a", 1, 1), received_at=T0)  # load 2
    w.record(report("a", 4, 0), received_at=T0 + 10)  # load 4 -> mean 3
    w.record(report("b", 0, 5), received_at=T0 + 5)  # load 5
    assert w.average_load(T0 + 10) == 8.0


def test_average_load_only_counts_samples_within_look_back():
    w = window(30.0, "a")
    w.record(report("a", 100), received_at=T0)
    w.record(report("a", 2), received_at=T0 + 20)
    assert w.average_load(T0 + 10) == 100.0  # a sample after `now` is not counted
    assert w.average_load(T0 + 30) == 51.0  # T0 is exactly on the window's edge
    assert w.average_load(T0 + 30.001) == 2.0  # T0 has just left it


def test_average_load_none_without_data_in_window():
    w = window(30.0, "a")
    assert w.average_load(T0) is None
    w.record(report("a", 3), received_at=T0)
    assert w.average_load(T0 + 31) is None
    assert window(30.0).average_load(T0) is None


def test_zero_load_is_data_not_none():
    w = window(30.0, "a")
    w.record(report("a", 0), received_at=T0)
    assert w.average_load(T0) == 0.0


def test_replicas_not_included_are_ignored():
    w = window(30.0, "a", "never-reported")
    w.record(report("a", 3), received_at=T0)
    w.record(report("stale", 50), received_at=T0)
    assert w.average_load(T0) == 3.0
    w = window(30.0, "never-reported")
    w.record(report("stale", 50), received_at=T0)
    assert w.average_load(T0) is None


def test_record_prunes_samples_older_than_look_back():
    w = window(10.0, "a")
    w.record(report("a", 100), received_at=T0)
    w.record(report("a", 2), received_at=T0 + 11)  # prunes T0 relative to T0 + 11
    # Asking about a `now` that would still cover T0 shows it is gone, not just filtered.
    assert w.average_load(T0 + 5) is None
    assert w.average_load(T0 + 11) == 2.0


def test_record_caps_samples_per_replica():
    w = window(1000.0, "a", max_samples_per_replica=3)
    for i, load in enumerate([100, 1, 2, 3]):
        w.record(report("a", load), received_at=T0 + i)
    assert w.average_load(T0 + 3) == 2.0  # the 100 was dropped by the cap


def test_default_cap_is_64():
    w = window(1000.0, "a")
    w.record(report("a", 6500), received_at=T0)
    for i in range(1, 65):
        w.record(report("a", 1), received_at=T0 + i)
    assert w.average_load(T0 + 64) == 1.0


def test_forget_drops_a_replicas_samples():
    w = window(30.0, "a")
    w.record(report("a", 1), received_at=T0)
    w.record(report("a", 2), received_at=T0 + 1)
    assert w.average_load(T0 + 1) == 1.5
    w.forget("a")
    w.forget("never-seen")
    w.include("a")  # counted again, but its samples are gone
    assert w.average_load(T0 + 1) is None


def test_received_at_going_backwards_is_rejected():
    w = window(30.0, "a")
    w.record(report("a", 1), received_at=T0)
    with pytest.raises(ValueError, match="backwards"):
        w.record(report("a", 1), received_at=T0 - 1)


# --- AutoscalingPolicy --------------------------------------------------------------


def test_from_config_defaults_are_the_schemas():
    p = AutoscalingPolicy.from_config({})
    assert p == AutoscalingPolicy(min_replicas=1, max_replicas=1, target_ongoing_requests=2.0,
                                  upscale_delay_s=30.0, downscale_delay_s=600.0,
                                  look_back_period_s=30.0, initial_replicas=None)
    assert p == AutoscalingPolicy.from_config(AutoscalingConfig())


def test_from_config_takes_given_keys():
    p = AutoscalingPolicy.from_config({"min_replicas": 1, "max_replicas": 4,
                                       "initial_replicas": 2, "look_back_period_s": 5.0})
    assert (p.min_replicas, p.max_replicas, p.initial_replicas, p.look_back_period_s) == (
        1, 4, 2, 5.0)
    assert p.target_ongoing_requests == 2.0


def test_from_config_takes_a_validated_model_or_its_dump_alike():
    model = AutoscalingConfig(min_replicas=2, max_replicas=6, upscale_delay_s=3.0)
    assert AutoscalingPolicy.from_config(model) == AutoscalingPolicy.from_config(
        model.model_dump())
    assert AutoscalingPolicy.from_config(model).upscale_delay_s == 3.0


@pytest.mark.parametrize("cfg", [
    {"max_replica": 3},  # misspelt key
    {"min_replicas": -1},
    {"min_replicas": 3, "max_replicas": 2},
    {"min_replicas": 0, "max_replicas": 0},
    {"target_ongoing_requests": 0},
    {"upscale_delay_s": -1.0},
    {"max_replicas": 4, "initial_replicas": 5},
])
def test_from_config_rejects_bad_config_through_the_schema(cfg):
    with pytest.raises(ValueError):  # pydantic's ValidationError, naming the field
        AutoscalingPolicy.from_config(cfg)


def test_initial_target():
    assert initial_target(policy(min_replicas=2)) == 2
    assert initial_target(policy(min_replicas=2, initial_replicas=5)) == 5
    assert initial_target(policy(min_replicas=0, initial_replicas=0)) == 0


# --- decide -------------------------------------------------------------------------

IDLE = ScalingState()


def test_steady_load_keeps_target_and_clears_pending():
    pending = ScalingState(pending_target=5, pending_since=T0)
    d = decide(policy(), current_target=3, total_load=6.0, state=pending, now=T0 + 1)
    assert (d.target_replicas, d.state) == (3, IDLE)


def test_desired_rounds_up():
    p = policy(upscale_delay_s=0.0)
    assert decide(p, 1, 6.1, IDLE, T0).target_replicas == 4
    assert decide(p, 1, 6.0, IDLE, T0).target_replicas == 3


def test_float_noise_does_not_add_a_replica():
    p = policy(upscale_delay_s=0.0, target_ongoing_requests=0.1)
    assert decide(p, 1, 0.1 + 0.2, IDLE, T0).target_replicas == 3  # 0.30000000000000004


def test_upscale_applies_exactly_after_delay():
    p = policy(upscale_delay_s=30.0)
    d = decide(p, 1, 8.0, IDLE, now=T0)
    assert (d.target_replicas, d.state) == (1, ScalingState(4, T0))
    d = decide(p, 1, 8.0, d.state, now=T0 + 29.999)
    assert (d.target_replicas, d.state) == (1, ScalingState(4, T0))
    d = decide(p, 1, 8.0, d.state, now=T0 + 30.0)
    assert (d.target_replicas, d.state) == (4, IDLE)


def test_upscale_applies_newest_desired_and_keeps_clock():
    p = policy(upscale_delay_s=30.0)
    d = decide(p, 1, 8.0, IDLE, now=T0)  # wants 4
    d = decide(p, 1, 12.0, d.state, now=T0 + 20)  # still up, now wants 6
    assert d.state == ScalingState(6, T0)
    d = decide(p, 1, 4.0, d.state, now=T0 + 30)  # still up, wants 2
    assert (d.target_replicas, d.state) == (2, IDLE)


def test_downscale_applies_exactly_after_delay():
    p = policy(downscale_delay_s=600.0)
    d = decide(p, 5, 2.0, IDLE, now=T0)
    assert (d.target_replicas, d.state) == (5, ScalingState(1, T0))
    d = decide(p, 5, 2.0, d.state, now=T0 + 599.999)
    assert d.target_replicas == 5
    d = decide(p, 5, 2.0, d.state, now=T0 + 600.0)
    assert (d.target_replicas, d.state) == (1, IDLE)


def test_direction_flip_resets_the_timer():
    p = policy(upscale_delay_s=30.0, downscale_delay_s=30.0)
    d = decide(p, 3, 10.0, IDLE, now=T0)  # up to 5
    d = decide(p, 3, 2.0, d.state, now=T0 + 20)  # flips to down to 1
    assert d.state == ScalingState(1, T0 + 20)
    d = decide(p, 3, 10.0, d.state, now=T0 + 30)  # flips back up: the old T0 clock is gone
    assert (d.target_replicas, d.state) == (3, ScalingState(5, T0 + 30))
    d = decide(p, 3, 10.0, d.state, now=T0 + 59.999)
    assert d.target_replicas == 3
    d = decide(p, 3, 10.0, d.state, now=T0 + 60)
    assert d.target_replicas == 5


def test_return_to_current_resets_the_timer():
    p = policy(upscale_delay_s=30.0)
    d = decide(p, 2, 8.0, IDLE, now=T0)
    d = decide(p, 2, 4.0, d.state, now=T0 + 10)  # back to steady
    assert d.state == IDLE
    d = decide(p, 2, 8.0, d.state, now=T0 + 30)
    assert (d.target_replicas, d.state) == (2, ScalingState(4, T0 + 30))


def test_zero_delay_applies_at_once():
    p = policy(upscale_delay_s=0.0, downscale_delay_s=0.0)
    assert decide(p, 1, 8.0, IDLE, T0).target_replicas == 4
    assert decide(p, 4, 2.0, IDLE, T0).target_replicas == 1


def test_desired_is_clamped_to_bounds():
    p = policy(min_replicas=2, max_replicas=5, upscale_delay_s=0.0, downscale_delay_s=0.0)
    assert decide(p, 3, 100.0, IDLE, T0).target_replicas == 5
    assert decide(p, 3, 0.0, IDLE, T0).target_replicas == 2


def test_at_max_with_more_load_is_steady():
    p = policy(max_replicas=5)
    d = decide(p, 5, 100.0, IDLE, T0)
    assert (d.target_replicas, d.state) == (5, IDLE)


def test_bounds_change_applies_immediately():
    lowered = policy(max_replicas=4)
    d = decide(lowered, 8, 16.0, IDLE, T0)  # load wants 8, max is now 4
    assert (d.target_replicas, d.state) == (4, IDLE)
    raised = policy(min_replicas=6)
    d = decide(raised, 2, 2.0, IDLE, T0)  # load wants 1, min is now 6
    assert (d.target_replicas, d.state) == (6, IDLE)


def test_bounds_change_applies_at_once_while_load_change_still_waits():
    p = policy(max_replicas=6, downscale_delay_s=600.0)
    d = decide(p, 9, 2.0, IDLE, T0)  # clamp 9 -> 6 now; load wants 1, which waits
    assert (d.target_replicas, d.state) == (6, ScalingState(1, T0))


def test_no_data_keeps_current_target_and_clears_pending():
    pending = ScalingState(pending_target=5, pending_since=T0)
    d = decide(policy(), 3, None, pending, now=T0 + 100)
    assert (d.target_replicas, d.state) == (3, IDLE)
    assert "no metrics" in d.reason


def test_no_data_still_clamps_to_bounds():
    assert decide(policy(max_replicas=2), 3, None, IDLE, T0).target_replicas == 2
    assert decide(policy(min_replicas=4), 3, None, IDLE, T0).target_replicas == 4


def test_no_data_at_zero_stays_at_zero():
    d = decide(policy(min_replicas=0), 0, None, IDLE, T0)
    assert d.target_replicas == 0


def test_cold_start_from_zero_skips_upscale_delay():
    p = policy(min_replicas=0, upscale_delay_s=300.0)
    d = decide(p, 0, 0.5, IDLE, T0)  # tiny load still needs one replica
    assert (d.target_replicas, d.state) == (1, IDLE)
    d = decide(p, 0, 7.0, IDLE, T0)
    assert d.target_replicas == 4
    assert "cold start" in d.reason


def test_zero_load_at_zero_stays_at_zero():
    d = decide(policy(min_replicas=0), 0, 0.0, IDLE, T0)
    assert (d.target_replicas, d.state) == (0, IDLE)


def test_scale_to_zero_goes_to_one_at_the_downscale_delay_then_to_zero_at_its_own():
    """Serve's rule: many -> 1 after downscale_delay_s, 1 -> 0 after
    downscale_to_zero_delay_s (downscale_delay_s when unset)."""
    p = policy(min_replicas=0, downscale_delay_s=600.0, downscale_to_zero_delay_s=60.0)
    d = decide(p, 2, 0.0, IDLE, T0)
    assert (d.target_replicas, d.state) == (2, ScalingState(1, T0))
    d = decide(p, 2, 0.0, d.state, T0 + 600)
    assert d.target_replicas == 1 and "downscale 2 -> 1" in d.reason
    d = decide(p, 1, 0.0, IDLE, T0 + 600)
    assert d.target_replicas == 1 and "downscale to zero 1 -> 0 in 60s" in d.reason
    assert decide(p, 1, 0.0, d.state, T0 + 660).target_replicas == 0
    unset = policy(min_replicas=0, downscale_delay_s=600.0)
    assert decide(unset, 1, 0.0, ScalingState(0, T0), T0 + 599).target_replicas == 1
    assert decide(unset, 1, 0.0, ScalingState(0, T0), T0 + 600).target_replicas == 0


def test_small_load_never_scales_to_zero():
    p = policy(min_replicas=0, downscale_delay_s=0.0, target_ongoing_requests=100.0)
    assert decide(p, 3, 0.001, IDLE, T0).target_replicas == 1
    assert decide(p, 3, 1e-12, IDLE, T0).target_replicas == 1  # below the float tolerance
    assert decide(p, 0, 1e-12, IDLE, T0).target_replicas == 1  # and from cold


def test_negative_load_is_rejected():
    with pytest.raises(ValueError):
        decide(policy(), 1, -1.0, IDLE, T0)


def test_half_set_state_is_rejected():
    with pytest.raises(ValueError):
        ScalingState(pending_target=3)
