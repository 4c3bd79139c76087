"""What a replica sends so its shard always holds fresh health: pure send decisions.

Owns: whether health rides on metric reports alone or also needs heartbeats, when a
heartbeat goes out, and the bookkeeping of what was carried and what is in flight. The
replica actor does the sending and calls back ``on_*``; no I/O and no clock reads here.

Invariants (seed 000, ray-project/ray#64913, and its review fixes):

- Every metric report carries the newest snapshot (three fields on a message that flows
  anyway). Heartbeats fill the gap only when the report interval is longer than the
  configured health-check period: compared with the period, not the half-period
  evaluation cadence, under which the stock config (10 s period, 10 s reports) suppressed
  nothing and every reporting replica heartbeated anyway.
- At most one heartbeat is in flight, with one exception: an unhealthy result that no
  push has carried goes out at once, even past a healthy heartbeat in flight, but never
  while an unhealthy heartbeat is in flight. That bound is keyed on what the outstanding
  heartbeat carries, not on whether a bypass happened: the payload is absolute, so a second
  unhealthy heartbeat adds nothing, and a flapping replica could otherwise queue many.
- An unhealthy result is never suppressed: suppression assumed a recent report carried
  current health, but a flip to unhealthy after the last carry would wait a full period.
- The same result (``checked_at``) is never sent twice by heartbeat.
"""

from __future__ import annotations

from controlplane.wire import PushedHealth
from replicas.self_health import EVAL_JITTER_SLACK, HealthSnapshot


_ERROR_CHARS = 300  # an unhealthy push carries its cause, kept short


def to_pushed(snapshot: HealthSnapshot) -> PushedHealth | None:
    """The wire form of a snapshot; None before the first check completed."""
    if snapshot.checked_at is None:
        return None
    lines = (snapshot.last_error or "").strip().splitlines()
    error = lines[0][:_ERROR_CHARS] if lines and not snapshot.healthy else ""
    return PushedHealth(snapshot.healthy, snapshot.checked_at, snapshot.consecutive_failures,
                        error)


class HealthPusher:
    def __init__(self, period_s: float, report_interval_s: float) -> None:
        if period_s <= 0 or report_interval_s <= 0:
            raise ValueError(f"period_s and report_interval_s must be > 0, got "
                             f"{period_s}, {report_interval_s}")
        self._period_s = period_s
        self._report_interval_s = report_interval_s
        self._carried_checked_at: float | None = None  # newest result any push carried
        self._last_carry_at: float | None = None  # when that push was sent
        self._in_flight: list[PushedHealth] = []  # heartbeats sent, not yet done

    def set_period(self, period_s: float) -> None:
        """A redeploy changed health_check_period_s in place."""
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self._period_s = period_s

    @property
    def reports_carry_health(self) -> bool:
        """True when metric reports alone keep the shard fresh (no routine heartbeats)."""
        return self._report_interval_s <= self._period_s

    # ---- metric reports -----------------------------------------------------------------
    def on_report_sent(self, snapshot: HealthSnapshot, now: float) -> None:
        self._carried(to_pushed(snapshot), now)

    # ---- heartbeats ------------------------------------------------------------------------
    def should_heartbeat(self, snapshot: HealthSnapshot, now: float) -> bool:
        pushed = to_pushed(snapshot)
        if pushed is None or self._was_carried(pushed):
            return False
        if any(not p.healthy for p in self._in_flight):
            return False  # an unhealthy payload is out: another one adds nothing
        if not pushed.healthy:
            return True  # never suppressed; jumps a healthy heartbeat in flight
        if self._in_flight or self.reports_carry_health:
            return False
        return (self._last_carry_at is None
                or now - self._last_carry_at >= (1 - EVAL_JITTER_SLACK) * self._period_s)

    def heartbeat_payload(self, snapshot: HealthSnapshot) -> PushedHealth:
        pushed = to_pushed(snapshot)
        if pushed is None:
            raise ValueError("no health check has completed yet")
        return pushed

    def on_heartbeat_sent(self, payload: PushedHealth, now: float) -> None:
        self._in_flight.append(payload)
        self._carried(payload, now)

    def on_heartbeat_done(self, payload: PushedHealth) -> None:
        """The heartbeat call returned or failed; unknown payloads are ignored."""
        if payload in self._in_flight:
            self._in_flight.remove(payload)

    def _was_carried(self, pushed: PushedHealth) -> bool:
        carried = self._carried_checked_at
        return carried is not None and pushed.checked_at <= carried

    def _carried(self, pushed: PushedHealth | None, now: float) -> None:
        if pushed is None:
            return
        if self._carried_checked_at is None or pushed.checked_at > self._carried_checked_at:
            self._carried_checked_at = pushed.checked_at
        self._last_carry_at = now
