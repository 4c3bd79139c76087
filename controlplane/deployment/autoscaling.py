"""The autoscaling decision and the load window it decides from (a replica's report is
``wire.MetricReport``, its pushed health riding on it).

Owns:

- ``MetricWindow`` (``controlplane.deployment.metric_window``, re-exported here): per deployment,
  the recent reports of each replica and the load averaged over the look-back period,
  summed over the replicas the caller says count; kept up to date per report and per
  expiry, so a query never walks the replicas.
- ``AutoscalingPolicy`` / ``ScalingState`` / ``decide``: the pure decision of how many
  replicas a deployment should target, given that load and ``now``. The policy's
  defaults and checks are the deploy schema's (``config.schema.AutoscalingConfig``), not
  here.

Invariants:

- No I/O and no clock reads here: the shard shell passes ``received_at`` and ``now`` from
  its monotonic ``Clock`` (the window's own invariants: ``metric_window``).
- ``decide`` never returns a target outside ``[min_replicas, max_replicas]``; bounds apply
  at once, only load-driven changes wait out a delay.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from controlplane.config.schema import AutoscalingConfig
from controlplane.deployment.llm_scaling import LLMScaling
from controlplane.deployment.metric_window import MetricWindow, WindowStatistics

# The window is re-exported: the shard and the tests take it from here, with the decision.
__all__ = ["AutoscalingPolicy", "MetricWindow", "ScalingDecision", "ScalingState",
           "WindowStatistics", "decide", "desired_replicas", "initial_target"]

# A ratio within this of a whole number counts as that number: averaging samples adds
# float noise (2.0000000000000004 replicas' worth of load must not start a third).
_RATIO_TOLERANCE = 1e-9


@dataclass(frozen=True)
class AutoscalingPolicy:
    """A deployment's autoscaling settings, as the decision reads them.

    A plain value: the deploy schema (``config.schema.AutoscalingConfig``) is the one place
    their defaults and checks live, and ``from_config`` is the way in.
    """

    min_replicas: int
    max_replicas: int
    target_ongoing_requests: float  # load (ongoing + queued) each replica should carry
    upscale_delay_s: float  # an upscale must hold this long before it applies
    downscale_delay_s: float  # likewise a downscale; long, since cold starts are costly
    look_back_period_s: float  # window the load is averaged over
    initial_replicas: int | None = None  # first target; None means min_replicas
    downscale_to_zero_delay_s: float | None = None  # 1 -> 0; None: downscale_delay_s
    cold_start_hold_s: float = 30.0  # routers' bound on a wait for the first replica
    llm: LLMScaling | None = None  # scale on the engines' signals (``llm_scaling``)

    @property
    def to_zero_delay_s(self) -> float:
        zero = self.downscale_to_zero_delay_s
        return self.downscale_delay_s if zero is None else zero

    @classmethod
    def from_config(cls, cfg: AutoscalingConfig | Mapping[str, Any]) -> AutoscalingPolicy:
        """From the schema's ``AutoscalingConfig``, or a spec's ``autoscaling_config``
        mapping (validated and filled in at build). A mapping is read through the schema
        again, so a partial one gets the schema's defaults and a bad one raises its
        ``ValidationError`` (a ``ValueError``) naming the field, never a guess here.
        """
        model = cfg if isinstance(cfg, AutoscalingConfig) else AutoscalingConfig.model_validate(cfg)
        values = {f.name: getattr(model, f.name) for f in fields(cls)}
        if model.llm is not None:
            values["llm"] = LLMScaling(**model.llm.model_dump())
        return cls(**values)

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class ScalingState:
    """What the policy remembers between decisions: a change waiting out its delay."""

    pending_target: int | None = None  # newest proposed target, None when nothing waits
    pending_since: float | None = None  # when this direction of change was first seen

    def __post_init__(self) -> None:
        if (self.pending_target is None) != (self.pending_since is None):
            raise ValueError(f"pending_target and pending_since are set together: {self!r}")


_IDLE = ScalingState()


@dataclass(frozen=True)
class ScalingDecision:
    target_replicas: int
    state: ScalingState
    reason: str  # human readable, for status / logs


def initial_target(policy: AutoscalingPolicy) -> int:
    return policy.initial_replicas if policy.initial_replicas is not None else policy.min_replicas


def desired_replicas(policy: AutoscalingPolicy, total_load: float) -> int:
    """Replicas that carry ``total_load`` at the target per replica, within bounds."""
    wanted = max(0, math.ceil(total_load / policy.target_ongoing_requests - _RATIO_TOLERANCE))
    if total_load > 0:
        wanted = max(wanted, 1)  # any load needs a replica, even when min_replicas is 0
    return policy.clamp(wanted)


def decide(
    policy: AutoscalingPolicy,
    current_target: int,
    total_load: float | None,
    state: ScalingState,
    now: float,
) -> ScalingDecision:
    """The target replica count for now, and what to remember for the next call.

    A load-driven change applies only once its direction has held continuously for that
    direction's delay; the newest desired value is the one applied.
    """
    if total_load is not None and total_load < 0:
        raise ValueError(f"total_load must be >= 0, got {total_load}")
    current = policy.clamp(current_target)  # bounds apply at once, with no delay
    if total_load is None:
        return ScalingDecision(current, _IDLE, _no_data_reason(current_target, current))
    desired = desired_replicas(policy, total_load)
    load_note = f"load {total_load:g} / target {policy.target_ongoing_requests:g}"
    return decide_count(policy, current, desired, state, now, load_note)


def decide_count(policy: AutoscalingPolicy, current: int, desired: int, state: ScalingState,
                 now: float, note: str) -> ScalingDecision:
    """The delays applied to a ``desired`` count (within bounds) from ``current``: the
    same for every policy that proposes a count (``llm_scaling`` too)."""
    if desired == current:
        return ScalingDecision(current, _IDLE, f"{note}: steady at {current}")
    if current == 0:
        # Cold start: requests are blocked until a replica exists, so scaling from zero
        # skips the upscale delay (Ray Serve's replica_queue_length_autoscaling_policy).
        return ScalingDecision(desired, _IDLE, f"{note}: cold start 0 -> {desired}")
    return _after_delay(policy, current, desired, state, now, note)


def _after_delay(
    policy: AutoscalingPolicy,
    current: int,
    desired: int,
    state: ScalingState,
    now: float,
    load_note: str,
) -> ScalingDecision:
    upscale = desired > current
    delay_s = policy.upscale_delay_s if upscale else policy.downscale_delay_s
    direction = "upscale" if upscale else "downscale"
    if desired == 0:  # Serve's rule: down to one at the downscale delay, then 1 -> 0
        desired = 1 if current > 1 else 0
        if desired == 0:
            delay_s, direction = policy.to_zero_delay_s, "downscale to zero"
    since = now
    if state.pending_target is not None and (state.pending_target > current) == upscale:
        since = state.pending_since  # same direction as before: the clock keeps running
    waited_s = now - since
    if waited_s >= delay_s:
        reason = f"{load_note}: {direction} {current} -> {desired} after {waited_s:g}s"
        return ScalingDecision(desired, _IDLE, reason)
    reason = f"{load_note}: {direction} {current} -> {desired} in {delay_s - waited_s:g}s"
    return ScalingDecision(current, ScalingState(desired, since), reason)


def _no_data_reason(current_target: int, current: int) -> str:
    if current == current_target:
        return f"no metrics in window: keeping {current}"
    return f"no metrics in window: keeping {current_target}, clamped to {current}"
