"""A day of an LLM deployment in virtual time: the trace, the simulated fleet, two policies.

What is real and what is simulated (the asymmetries are the same for both systems):

- the engines: ``tests.llm_sim.engine.SimEngine`` (slots, a waiting queue, one output
  token per running sequence per step), stepped at ``STEP_HZ`` = 8 steps/s: a GB10
  serving one request at about 8 tokens/s (seed 001), 4 slots (vLLM's DGX Spark guide's
  ``--max-num-seqs 4`` for the 120B model, as ``llm_routing``'s calibration); a prompt is
  read at ``PREFILL_TOKENS_PER_STEP`` tokens a step;
- a replica takes a load time drawn from 120-300 s (weights loading, seed 001's minutes)
  and costs replica-seconds from the moment it is asked for until it has drained;
- the data plane, for both: fleetplane's own ``Router`` (power of two choices, FIFO
  queue, ``max_ongoing_requests`` per replica: by default the engine's 4 slots, so a
  request beyond the fleet's batch waits in the router's one queue for the first free
  slot, not in one engine's queue behind 4 long answers while another engine has a free
  slot; ``llm_autoscale --max-ongoing-requests 8`` lets each engine queue 4 more) in
  virtual time; fleetplane's deployment
  sets ``cold_hold_s`` (scale from zero: hold up to the bound, else 503 + Retry-After,
  which the client honours), Serve's holds a request at zero until a replica runs, as
  Serve's handles do;
- the policies, both real code: fleetplane's ``Autoscaler`` with ``autoscaling_config.llm``
  fed each serving replica's load (its requests) every second, as replicas report it
  (``metrics_report_interval_s`` 1), the engines' stats at each health-check read
  (``VLLMServer``'s ``health_interval_s``: running, waiting, KV-cache use, TTFT, the time
  finished requests held a slot) and the routers' held requests (and those told to come
  back from zero, until due); Serve 2.60's own default policy
  (``ray.serve.autoscaling_policy``: ``replica_queue_length_autoscaling_policy`` under
  ``_apply_autoscaling_config``, the wrapping Serve's controller applies) fed
  ``total_num_requests`` averaged over ``look_back_period_s`` of (ongoing at replicas +
  queued at routers), sampled every second (Serve's replicas push every 10 s by default:
  this favours Serve);
- both decide once per second (Serve's controller loop runs every 0.1 s).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from controlplane.clock import FakeClock
from controlplane.deployment.autoscaler import Autoscaler
from controlplane.deployment.demand_board import DemandBoard
from controlplane.errors import BackpressureError
from controlplane.routing.router import Router
from controlplane.routing.routing_config import RoutingConfig
from controlplane.wire import ClusterDemand, ReplicaInfo
from replicas.llm_metrics import MetricsSnapshot, engine_stats, parse_metrics
from tests.llm_sim.engine import SimEngine
from tests.unit.virtual_time import run_virtual

STEP_HZ = 8.0
SLOTS = 4
PREFILL_TOKENS_PER_STEP = 2048
LOAD_S = (120.0, 300.0)


@dataclass(frozen=True)
class Request:
    at_s: float
    prompt_tokens: int
    max_tokens: int


SHAPE = (0, 0, 0, 0, 0, 0, .1, .4, .8, 1, 1, 1, .9, 1, 1, 1, .9, .7, .5, .35, .25, .15, .05, 0)
BURSTS = {10: 0.3, 14: 0.6, 16: 0.1}  # hour: where in it a 10-minute burst starts (fraction)
BURST_S = 600.0
OUTPUT_TOKENS = (40, 300)
# the mean time a request holds a slot: its prompt read in one step, its answer a token a step
SLOT_S = (1 + sum(OUTPUT_TOKENS) / 2) / STEP_HZ


def day_rate(hour: int, into_s: float, hour_s: float, peak_rps: float) -> float:
    """The day's arrival rate ``into_s`` seconds into ``hour`` (0-23)."""
    start = BURSTS.get(hour)
    in_burst = start is not None and start <= into_s / hour_s < start + BURST_S / hour_s
    return SHAPE[hour] * peak_rps * (2.0 if in_burst else 1.0)


def day_trace(seed: int, hours: tuple[int, int], hour_s: float, peak_rps: float) -> list[Request]:
    """Poisson arrivals at an hourly rate shaped like a working day: an idle night (none
    from 0 to 6), a morning ramp (6-9), a day at the peak with three 10-minute bursts at
    twice it, an evening decline and a quiet late hour. Prompts of 200-2000 tokens, answers
    of 40-300 tokens (5-38 s at 8 tokens/s)."""
    rng, out = random.Random(seed), []
    for hour in range(*hours):
        t = 0.0
        while day_rate(hour, t, hour_s, peak_rps) > 0:
            t += rng.expovariate(day_rate(hour, t, hour_s, peak_rps))
            if t >= hour_s:
                break
            out.append(Request((hour - hours[0]) * hour_s + t, rng.randint(200, 2000),
                               rng.randint(*OUTPUT_TOKENS)))
    return out


@dataclass
class Outcome:
    arrived_s: float
    ttft_s: float | None = None  # from the first arrival (holds and retries included)
    failed: bool = False
    held: bool = False  # waited for a first replica, or was told to come back
    hinted: int = 0  # 503s with a Retry-After it honoured


@dataclass
class Replica:
    replica_id: str
    asked_at: float
    ready_at: float
    engine: SimEngine | None = None
    stopping: bool = False
    last_read: MetricsSnapshot | None = None
    info: ReplicaInfo | None = None


class EngineTransport:
    """The router's transport onto simulated engines: a send submits ``(request, first)``
    to the engine, sets ``first`` (a future) at its first token, and holds the slot until
    the answer is whole; a cancelled send (the client left) aborts it, as vLLM does."""

    def __init__(self, fleet: "Fleet") -> None:
        self._fleet = fleet

    async def send(self, replica: ReplicaInfo, sent: tuple) -> None:
        request, first = sent
        engine = self._fleet.replicas[replica.replica_id].engine
        done = asyncio.get_running_loop().create_future()
        sim = engine.submit(request.max_tokens, max(1, request.prompt_tokens //
                                                    PREFILL_TOKENS_PER_STEP),
                            on_finish=lambda r: done.done() or done.set_result(r))
        self._fleet.first_token[id(sim)] = first
        try:
            await done
        except asyncio.CancelledError:
            engine.abort(sim)
            raise
        finally:
            self._fleet.first_token.pop(id(sim), None)

    async def probe_queue_len(self, replica: ReplicaInfo, deadline_s: float) -> int:
        engine = self._fleet.replicas[replica.replica_id].engine
        return len(engine.running) + len(engine.waiting)


@dataclass
class Settings:
    system: str  # "fleetplane", "serve" or "foresight" (llm_autoscale_foresight)
    max_replicas: int
    initial_replicas: int
    health_interval_s: float
    client_timeout_s: float
    cold_hold_s: float
    autoscaling: dict[str, Any] = field(default_factory=dict)
    max_ongoing_requests: int = SLOTS  # the engine's batch: the router holds the rest


class Fleet:
    """One system's fleet for one day: replicas, a router, a policy, the books."""

    def __init__(self, settings: Settings, clock: FakeClock, seed: int) -> None:
        self.s, self.clock, self.rng = settings, clock, random.Random(seed)
        self.replicas: dict[str, Replica] = {}
        self.first_token: dict[int, asyncio.Future] = {}
        self.outcomes: list[Outcome] = []
        self.replica_seconds = 0.0
        self.cold_starts = 0
        self.starts: deque[float] = deque()
        self.board = DemandBoard()  # measured start times (fleetplane's own EWMA)
        config = RoutingConfig("llm/VLLMServer", settings.max_ongoing_requests,
                               cold_hold_s=settings.cold_hold_s
                               if settings.system == "fleetplane" else None)
        self.router = Router(config, EngineTransport(self), clock, random.Random(seed))
        self.target = settings.initial_replicas
        self._ids = 0
        self._policy = make_policy(settings, clock)
        self.timeline: list[tuple[float, int, int, int, float]] = []
        self.wakes: list[tuple[float, float]] = []  # (asked at, first replica up at)

    # ---- replicas ------------------------------------------------------------------
    def reconcile(self, now: float) -> None:
        live = [r for r in self.replicas.values() if not r.stopping]
        wake = not live and self.target > 0
        for _ in range(self.target - len(live)):
            self._ids += 1
            rid = f"r{self._ids}"
            self.replicas[rid] = Replica(rid, now, now + self.rng.uniform(*LOAD_S))
        if wake:  # a cold start: when it was asked for, and when its first replica is up
            self.cold_starts += 1
            self.wakes.append((now, min(r.ready_at for r in self.replicas.values()
                                        if not r.stopping)))
        if len(live) > self.target:  # stop the least loaded, loading ones first
            victims = sorted(live, key=lambda r: (r.engine is not None, _load(r)))
            for r in victims[:len(live) - self.target]:
                r.stopping = True
            self._publish()

    def step(self, now: float, dt: float) -> None:
        """One engine step everywhere; replicas that finished loading join; drained
        stopping replicas leave; replica-seconds accrue."""
        changed = False
        for rid, r in list(self.replicas.items()):
            self.replica_seconds += dt
            if r.engine is None and now >= r.ready_at and not r.stopping:
                r.engine = SimEngine(rid, SLOTS, self.clock.monotonic)
                r.info = ReplicaInfo(rid, f"fleetplane_replica::{rid}", "node")
                self.board.note_start(now - r.asked_at)
                changed = True
            elif r.stopping and (r.engine is None or not r.engine.busy):
                del self.replicas[rid]
                changed = True
                continue
            if r.engine is not None:
                r.engine.step()
                self._first_tokens(r.engine)
        if changed:
            self._publish()

    def _first_tokens(self, engine: SimEngine) -> None:
        for sim in engine.running:
            waiter = self.first_token.get(id(sim))
            if waiter is not None and sim.output_tokens >= 1 and not waiter.done():
                waiter.set_result(self.clock.monotonic())
                del self.first_token[id(sim)]

    def _publish(self) -> None:
        self.router.update_replicas([r.info for r in self.replicas.values()
                                     if r.engine is not None and not r.stopping])

    # ---- the policy ----------------------------------------------------------------
    def decide(self, now: float) -> None:
        serving = [r for r in self.replicas.values() if r.engine is not None and not r.stopping]
        self.target = self._policy(self, now, serving)
        self.reconcile(now)
        if int(now) % 60 == 0:  # the timeline, once a minute
            self.timeline.append((now, self.target, len(serving), len(self.replicas),
                                  self.load_now()))

    def read_engines(self, now: float) -> None:
        """Every health interval: what VLLMServer's check reads of /metrics, as stats."""
        for r in self.replicas.values():
            if r.engine is not None and not r.stopping:
                read = parse_metrics(r.engine.metrics_text(), now)
                self._policy.engine_stats(r.replica_id, engine_stats(r.last_read, read, SLOTS),
                                          now)
                r.last_read = read

    def load_now(self) -> float:
        return sum(_load(r) for r in self.replicas.values()) + self.router.demand().queued


def _load(r: Replica) -> int:
    return 0 if r.engine is None else len(r.engine.running) + len(r.engine.waiting)


class FleetplanePolicy:
    def __init__(self, settings: Settings) -> None:
        self.scaler = Autoscaler(settings.autoscaling)

    def engine_stats(self, replica_id: str, stats: dict, now: float) -> None:
        self.scaler.record_engine_stats(replica_id, stats, now)

    def __call__(self, fleet: Fleet, now: float, serving: list[Replica]) -> int:
        serving_ids = {r.replica_id for r in serving}
        for rid in self.scaler.engines.reporting():  # left serving: forget (replica_moved)
            if rid not in serving_ids:
                self.scaler.engines.forget(rid)
        # each serving replica's load report (its requests), every second as replicas send
        # them (metrics_report_interval_s 1), to the load window
        self.scaler.serving_only(serving_ids)
        self.scaler.record_loads([(r.replica_id, _load(r)) for r in serving], now)
        decision = self.scaler.decide(now, fleet.target, serving_ids,
                                      held=lambda _: fleet.router.demand().queued,
                                      start_s=fleet.board.start_s)
        self._tell_routers(fleet, now)
        return fleet.target if decision is None else decision.target_replicas

    @staticmethod
    def _tell_routers(fleet: Fleet, now: float) -> None:
        """The shard's published outlook (``DemandBoard._outlook``): when the first
        replica of a deployment at zero should answer."""
        loading = [r for r in fleet.replicas.values() if r.engine is None and not r.stopping]
        serving = any(r.engine is not None for r in fleet.replicas.values())
        eta = None
        if loading and not serving and fleet.board.start_s is not None:
            eta = max(0.0, fleet.board.start_s - (now - min(r.asked_at for r in loading)))
        fleet.router._retry.heard_total(ClusterDemand(fleet.router.demand().queued, 0.0, 0.0,
                                                      1, eta), now)


class ServePolicy:
    """Serve 2.60's default policy, its own code, in virtual time."""

    def __init__(self, settings: Settings, clock: FakeClock) -> None:
        from ray.serve import autoscaling_policy as serve_policy
        from ray.serve.config import AutoscalingConfig as ServeConfig

        serve_policy.time = _VirtualTime(clock)  # its delays read time.time()
        self._policy = serve_policy._apply_autoscaling_config(
            serve_policy.replica_queue_length_autoscaling_policy)
        self._config = ServeConfig(**settings.autoscaling)
        self._state: dict = {}
        self._samples: deque[tuple[float, float]] = deque()

    def engine_stats(self, replica_id: str, stats: dict, now: float) -> None:
        pass  # Serve's default policy reads ongoing requests only

    def __call__(self, fleet: Fleet, now: float, serving: list[Replica]) -> int:
        from ray.serve.config import AutoscalingContext

        self._samples.append((now, fleet.load_now()))
        while now - self._samples[0][0] > self._config.look_back_period_s:
            self._samples.popleft()
        total = sum(v for _, v in self._samples) / len(self._samples)
        ctx = AutoscalingContext(
            deployment_id=None, deployment_name="VLLMServer", app_name="llm",
            current_num_replicas=len(serving), target_num_replicas=fleet.target,
            running_replicas=[], total_num_requests=total, total_queued_requests=None,
            aggregated_metrics={}, raw_metrics={},
            capacity_adjusted_min_replicas=self._config.min_replicas,
            capacity_adjusted_max_replicas=self._config.max_replicas,
            policy_state=self._state, last_scale_up_time=None, last_scale_down_time=None,
            current_time=now, config=self._config)
        target, self._state = self._policy(ctx)
        return max(self._config.min_replicas, min(self._config.max_replicas, math.ceil(target)))


class _VirtualTime:
    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock

    def time(self) -> float:
        return self._clock.monotonic()


def make_policy(settings: Settings, clock: FakeClock):
    if settings.system == "foresight":
        from release_tests.llm_autoscale_foresight import ForesightPolicy

        return ForesightPolicy(settings.autoscaling, SLOTS, SLOT_S)
    return FleetplanePolicy(settings) if settings.system == "fleetplane" else \
        ServePolicy(settings, clock)


def simulate(settings: Settings, trace: list[Request], seed: int,
             duration_s: float) -> Fleet:
    """The day, in virtual time: the fleet and its books after it."""
    clock = FakeClock(start_s=0.0)
    fleet_box: list[Fleet] = []

    async def main() -> None:
        fleet = Fleet(settings, clock, seed)
        fleet_box.append(fleet)
        fleet.reconcile(0.0)
        clients = [asyncio.get_running_loop().call_at(req.at_s, _start_client, fleet, req)
                   for req in trace]
        dt, next_decide, next_read = 1.0 / STEP_HZ, 0.0, 0.0
        while clock.monotonic() < duration_s:
            now = clock.monotonic()
            if now >= next_decide:
                fleet.decide(now)
                next_decide = now + 1.0
            if now >= next_read:
                fleet.read_engines(now)
                next_read = now + settings.health_interval_s
            fleet.step(now, dt)
            await asyncio.sleep(dt)
        for handle in clients:
            handle.cancel()
    run_virtual(clock, main)
    return fleet_box[0]


def _start_client(fleet: Fleet, request: Request) -> None:
    asyncio.get_running_loop().create_task(_client(fleet, request))


async def _client(fleet: Fleet, request: Request) -> None:
    """One user: sends, honours a Retry-After, gives up when no first token came within
    ``client_timeout_s`` of its first try (then its request is cancelled)."""
    outcome = Outcome(request.at_s, held=not fleet.router.num_replicas)
    fleet.outcomes.append(outcome)
    loop, clock = asyncio.get_running_loop(), fleet.clock
    deadline = request.at_s + fleet.s.client_timeout_s
    while True:
        first = loop.create_future()
        sending = loop.create_task(fleet.router.assign((request, first)))
        await asyncio.wait({first, sending}, timeout=max(0.0, deadline - clock.monotonic()),
                           return_when=asyncio.FIRST_COMPLETED)
        if first.done():
            outcome.ttft_s = first.result() - request.at_s
            return  # the answer streams on in ``sending``
        if not sending.done():  # no first token in time: the client leaves
            sending.cancel()
            outcome.failed = True
            return
        error = sending.exception()
        if not isinstance(error, BackpressureError):
            outcome.failed = True
            return
        outcome.held, outcome.hinted = True, outcome.hinted + 1
        wait = float(error.retry_after_s or 1)
        if clock.monotonic() + wait >= deadline:
            outcome.failed = True
            return
        await asyncio.sleep(wait)
