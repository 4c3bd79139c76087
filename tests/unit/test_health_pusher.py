"""Health pusher: what rides on reports, when a heartbeat goes out, and what is in flight."""

from __future__ import annotations

import pytest

from controlplane.wire import PushedHealth
from replicas.health_pusher import HealthPusher, to_pushed
from replicas.self_health import HealthSnapshot

T0 = 1000.0


def snap(checked_at: float | None, healthy: bool = True, failures: int = 0) -> HealthSnapshot:
    return HealthSnapshot(healthy, checked_at, failures if not healthy else 0,
                          latched=False, last_error="" if healthy else "bad")


def heartbeat_mode() -> HealthPusher:
    return HealthPusher(period_s=10.0, report_interval_s=30.0)


def report_mode() -> HealthPusher:
    return HealthPusher(period_s=10.0, report_interval_s=1.0)


def send(pusher: HealthPusher, s: HealthSnapshot, now: float) -> PushedHealth:
    payload = pusher.heartbeat_payload(s)
    pusher.on_heartbeat_sent(payload, now)
    return payload


# --- reports ---------------------------------------------------------------------------------


def test_a_report_carries_the_health_fields_once_a_check_completed():
    assert to_pushed(snap(None)) is None
    assert to_pushed(snap(T0, healthy=False, failures=2)) == PushedHealth(False, T0, 2, "bad")


def test_suppression_compares_report_interval_with_the_period_not_the_half_period():
    # Seed 000 review fix: under the stock config (10 s period, 10 s metric interval)
    # comparing against the 5 s evaluation cadence suppressed nothing.
    pusher = HealthPusher(period_s=10.0, report_interval_s=10.0)
    assert pusher.reports_carry_health
    pusher.on_report_sent(snap(T0), T0)
    for t in (T0 + 5, T0 + 9.9):
        assert not pusher.should_heartbeat(snap(t), t)
    assert not HealthPusher(period_s=10.0, report_interval_s=10.5).reports_carry_health


def test_reports_carrying_health_suppress_healthy_heartbeats():
    pusher = report_mode()
    assert not pusher.should_heartbeat(snap(T0), T0 + 100)  # even with no report for long


def test_an_unhealthy_flip_after_the_last_report_goes_out_at_once():
    # Seed 000 review fix: "An unhealthy self-check is never suppressed".
    pusher = report_mode()
    pusher.on_report_sent(snap(T0), T0)
    flipped = snap(T0 + 0.5, healthy=False, failures=1)
    assert pusher.should_heartbeat(flipped, T0 + 0.5)
    pusher.on_report_sent(flipped, T0 + 0.6)  # a report carried it: nothing left to send
    assert not pusher.should_heartbeat(flipped, T0 + 0.7)


# --- heartbeat mode ---------------------------------------------------------------------------


def test_heartbeats_fill_the_gap_about_once_per_period():
    pusher = heartbeat_mode()
    assert not pusher.reports_carry_health
    assert pusher.should_heartbeat(snap(T0), T0)  # nothing carried yet
    pusher.on_heartbeat_done(send(pusher, snap(T0), T0))
    assert not pusher.should_heartbeat(snap(T0), T0 + 1)  # same result: never sent twice
    assert not pusher.should_heartbeat(snap(T0 + 5), T0 + 5)  # half a period: not yet
    assert pusher.should_heartbeat(snap(T0 + 9.8), T0 + 9.8)  # a period, with jitter


def test_a_report_counts_as_a_carry_in_heartbeat_mode():
    pusher = heartbeat_mode()
    pusher.on_report_sent(snap(T0), T0)
    assert not pusher.should_heartbeat(snap(T0 + 5), T0 + 5)
    assert pusher.should_heartbeat(snap(T0 + 10), T0 + 10)


def test_at_most_one_healthy_heartbeat_in_flight():
    pusher = heartbeat_mode()
    first = send(pusher, snap(T0), T0)
    assert not pusher.should_heartbeat(snap(T0 + 10), T0 + 10)
    assert not pusher.should_heartbeat(snap(T0 + 30), T0 + 30)
    pusher.on_heartbeat_done(first)
    assert pusher.should_heartbeat(snap(T0 + 30), T0 + 30)


def test_unhealthy_jumps_a_healthy_heartbeat_in_flight():
    pusher = heartbeat_mode()
    send(pusher, snap(T0), T0)
    assert pusher.should_heartbeat(snap(T0 + 5, healthy=False, failures=1), T0 + 5)


def test_no_second_unhealthy_heartbeat_while_one_is_in_flight():
    # Seed 000 review fix: the bypass is bounded by what the outstanding heartbeat carries,
    # not by whether a bypass happened. Here the unhealthy heartbeat went out as an ordinary
    # one (nothing was in flight, so no bypass happened): keyed on "bypass used", a second
    # unhealthy heartbeat would still be allowed; keyed on the payload it is not.
    pusher = heartbeat_mode()
    out = send(pusher, snap(T0, healthy=False, failures=1), T0)
    assert not out.healthy
    for t, healthy in ((T0 + 5, False), (T0 + 10, True), (T0 + 15, False)):  # flapping
        assert not pusher.should_heartbeat(snap(t, healthy=healthy, failures=2), t)
    pusher.on_heartbeat_done(out)
    assert pusher.should_heartbeat(snap(T0 + 15, healthy=False, failures=2), T0 + 15)


def test_a_flapping_replica_queues_at_most_one_unhealthy_bypass():
    pusher = heartbeat_mode()
    send(pusher, snap(T0), T0)  # healthy, in flight
    sent = 1
    for i, healthy in enumerate([False, True, False, True, False], start=1):
        t = T0 + 5 * i
        if pusher.should_heartbeat(snap(t, healthy=healthy, failures=1), t):
            send(pusher, snap(t, healthy=healthy, failures=1), t)
            sent += 1
    assert sent == 2  # the first healthy one and one unhealthy bypass; none done yet


def test_done_for_an_unknown_payload_is_ignored_and_bad_settings_raise():
    pusher = heartbeat_mode()
    pusher.on_heartbeat_done(PushedHealth(True, T0, 0))
    with pytest.raises(ValueError):
        pusher.heartbeat_payload(snap(None))
    with pytest.raises(ValueError):
        HealthPusher(period_s=0.0, report_interval_s=1.0)


def test_a_new_period_changes_whether_reports_carry_health():
    pusher = HealthPusher(period_s=10.0, report_interval_s=5.0)
    assert pusher.reports_carry_health
    pusher.set_period(2.0)  # redeployed with a shorter period: heartbeats fill the gap
    assert not pusher.reports_carry_health
    assert pusher.should_heartbeat(snap(T0), T0)
    with pytest.raises(ValueError):
        pusher.set_period(0.0)
