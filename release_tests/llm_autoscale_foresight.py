"""A fleet sized with foresight of the day: what the Erlang bound costs and meets when the
arrival rate is known ahead (``llm_autoscale``'s ``foresight`` row; no policy has this).

Each second it asks for the replicas that ``erlang.engines_for`` gives, at the bound the LLM
policy uses (``llm_scaling.LATE_SHARE``, ``ttft_target_s``), for the highest rate of the day
trace (``llm_autoscale_sim.day_rate``: the rate the arrivals were drawn at, bursts
included) over the next ``lookahead_s`` (the longest load, so a replica asked for is up
before the rate it is for), with the mean time a request holds a slot known exactly. It
has no estimate to make and nothing to react to: between it and the ``fleetplane`` row is
what estimating and reacting cost; the share of windows it misses is what the bound itself
misses with per-engine queues behind power of two choices. It runs on the same simulated
fleet and data plane, without the policies' delays: a target it sets applies at once.
"""

from __future__ import annotations

from typing import Any

from controlplane.deployment.erlang import engines_for
from controlplane.deployment.llm_scaling import LATE_SHARE, LLMScaling
from release_tests.llm_autoscale_sim import day_rate

LOOK_EVERY_S = 10.0  # the look-ahead's sampling of the rate


def foresight_settings(first_hour: int, hour_s: float, peak_rps: float, max_replicas: int,
                       lookahead_s: float, late_share: float | None = None) -> dict[str, Any]:
    return {"max_replicas": max_replicas, "first_hour": first_hour, "hour_s": hour_s,
            "peak_rps": peak_rps, "lookahead_s": lookahead_s,
            "late_share": LATE_SHARE if late_share is None else late_share,
            "ttft_target_s": LLMScaling().ttft_target_s}


class ForesightPolicy:
    def __init__(self, day: dict[str, Any], slots: int, slot_s: float) -> None:
        self._day, self._slots, self._slot_s = day, slots, slot_s

    def engine_stats(self, replica_id: str, stats: dict, now: float) -> None:
        pass  # it knows the rate

    def rate(self, at_s: float) -> float:
        day = self._day
        hour_s = day["hour_s"]
        hour = day["first_hour"] + int(at_s // hour_s)
        return 0.0 if hour >= 24 else day_rate(hour, at_s % hour_s, hour_s, day["peak_rps"])

    def __call__(self, fleet: Any, now: float, serving: list) -> int:
        day = self._day
        steps = int(day["lookahead_s"] // LOOK_EVERY_S)
        busiest = max(self.rate(now + k * LOOK_EVERY_S) for k in range(steps + 1))
        if busiest <= 0:
            return 0
        return engines_for(busiest * self._slot_s, self._slots, self._slot_s,
                           day["ttft_target_s"], day["late_share"], 1, day["max_replicas"])
