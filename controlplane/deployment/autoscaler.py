"""A deployment's autoscaler: its policy, its load window and the cadence of decisions.

Owns the ``AutoscalingPolicy`` read from the spec's ``autoscaling_config`` (None: not
autoscaled), the ``MetricWindow`` the serving replicas' loads go to, the ``ScalingState``
a delayed change waits in, and when the next decision is due. The decision itself is the
pure ``autoscaling.decide``.

Invariants:
- Only serving replicas' loads count: a replica joins the window's membership when it
  starts serving and leaves it when it stops (``replica_moved``), so a query never walks
  the replicas. A new window (first policy, new look-back) learns the membership once,
  in O(replicas), at its first decision.
- A redeploy that keeps the look-back keeps the window (and the load history in it).
- One decision per ``DECIDE_EVERY_S`` at most, on the shard's tick.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from controlplane.config.schema import AutoscalingConfig
from controlplane.deployment.autoscaling import (AutoscalingPolicy, MetricWindow,
                                                 ScalingDecision, ScalingState,
                                                 WindowStatistics, decide, decide_count)
from controlplane.deployment.llm_scaling import DemandTrend, EngineBoard, llm_desired
from controlplane.deployment.lifecycle import SERVING_STATES, TERMINAL_STATES
from controlplane.deployment.replica_set import Moved

DECIDE_EVERY_S = 1.0
_DEFAULT_LOOK_BACK_S = 30.0


class Autoscaler:
    def __init__(self, config: Mapping[str, Any] | None) -> None:
        self.policy: AutoscalingPolicy | None = None
        self._window = MetricWindow(look_back_period_s=_DEFAULT_LOOK_BACK_S)
        self._scaling = ScalingState()
        self._next_at = 0.0
        self.engines = EngineBoard()  # ``autoscaling_config.llm``: the engines' stats
        self._trend: DemandTrend | None = None
        self.configure(config)

    @property
    def active(self) -> bool:
        return self.policy is not None

    def configure(self, config: Mapping[str, Any] | None) -> None:
        """The spec's ``autoscaling_config`` (None: not autoscaled)."""
        if config is None:
            self.policy = None
            return
        old = self.policy
        # Only the schema's fields: a spec checkpointed by an older build may carry Serve
        # knobs set in code that fleetplane does not implement.
        known = AutoscalingConfig.model_fields
        self.policy = AutoscalingPolicy.from_config({k: v for k, v in config.items()
                                                     if k in known})
        if old is None or old.look_back_period_s != self.policy.look_back_period_s:
            self._window = MetricWindow(look_back_period_s=self.policy.look_back_period_s)
            self._trend = DemandTrend()

    # ---- loads -------------------------------------------------------------------------
    def replica_moved(self, moved: Moved) -> None:
        state = moved.record[1]
        if state not in SERVING_STATES:
            self.engines.forget(moved.replica_id)
        if state in TERMINAL_STATES:
            self._window.forget(moved.replica_id)
        elif self.policy is not None:
            if state in SERVING_STATES:
                self._window.include(moved.replica_id)
            else:
                self._window.exclude(moved.replica_id)

    def serving_only(self, replica_ids: Iterable[str]) -> None:
        """Exactly these replicas serve now: O(known + given), for a caller that hears no
        lifecycle events (``release_tests.llm_autoscale_sim``); the shard uses
        ``replica_moved``."""
        self._window.include_only(replica_ids)

    def record_load(self, replica_id: str, load: int, now: float) -> None:
        self._window.record_load(replica_id, load, now)

    def record_engine_stats(self, replica_id: str, stats: dict, now: float) -> None:
        """A serving replica's engine stats (``autoscaling_config.llm`` only; raises
        ValueError on a malformed one)."""
        if self.policy is not None and self.policy.llm is not None:
            self.engines.record(replica_id, stats, now, self.policy.llm.ttft_target_s)

    def record_loads(self, loads: list[tuple[str, int]], now: float) -> None:
        """A node batch's loads, in one call."""
        self._window.record_loads(loads, now)

    # ---- decisions ---------------------------------------------------------------------
    def due(self, now: float) -> bool:
        return self.policy is not None and now >= self._next_at

    def decide(self, now: float, target: int, serving: Iterable[str],
               held: Callable[[float], int] | None = None,
               start_s: float | None = None) -> ScalingDecision | None:
        """A new target replica count (and why), or None to keep ``target``. ``serving``:
        the serving replicas' ids, read only by a window that does not know them yet.
        ``held``: the requests the routers hold now; a deployment that scales to zero
        counts them as load (read only then), so the first request at zero wakes it."""
        self._next_at = now + DECIDE_EVERY_S
        window = self._window
        if not window.membership_known:
            window.include_only(serving)
        if self.policy.llm is not None:
            return self._kept(self._decide_llm(now, target, held, start_s), target)
        load = window.average_load(now)
        if self.policy.min_replicas == 0 and held is not None:
            waiting = held(now)
            if waiting:
                load = (load or 0.0) + waiting
        return self._kept(decide(self.policy, target, load, self._scaling, now), target)

    def _kept(self, decision: ScalingDecision, target: int) -> ScalingDecision | None:
        self._scaling = decision.state
        return None if decision.target_replicas == target else decision

    def _decide_llm(self, now: float, target: int, held: Callable[[float], int] | None,
                    start_s: float | None) -> ScalingDecision:
        """``llm_scaling``'s count from the replicas' loads and the engines' signals,
        through the same delays. With no engine reporting and nothing held, nothing is
        known: the target stays (replicas still loading are not scaled away for want of
        stats)."""
        policy = self.policy
        held_now = held(now) if held is not None and policy.min_replicas == 0 else 0
        signals = self.engines.signals(now, held_now, self._window.average_load(now))
        trend = self._trend.add(now, signals.demand)
        current = policy.clamp(target)
        if not signals.engines and not held_now:
            return ScalingDecision(current, ScalingState(), "no engine stats: keeping "
                                   f"{current}")
        desired, why = llm_desired(policy.llm, signals, current, policy.min_replicas,
                                   policy.max_replicas, trend, start_s)
        if not signals.engines and self.engines.last_slots is None:
            desired = policy.clamp(1)  # from zero, slots unknown: one, then measure
        return decide_count(policy, current, desired, self._scaling, now, why)

    def statistics(self) -> WindowStatistics:
        return self._window.statistics()

    def average_load(self, now: float) -> float | None:
        return self._window.average_load(now)
