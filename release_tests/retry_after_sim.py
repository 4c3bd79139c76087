"""Open-loop clients against fleetplane's real ``Router``, in virtual time (issue 14).

One run drives one load shape through one Retry-After policy: ``routers`` real
``controlplane.routing.router.Router`` objects share ``SimReplicas`` (the replicas as the
real one behaves: a FIFO semaphore of ``max_ongoing`` slots, a fixed handler time, probes
answering ongoing + queued without taking a slot, a 1 ms network hop each way, as in
``tests/unit/test_router_overload.py``). Every first arrival picks a router at random, as
behind several proxies; so does every retry. Ray Serve itself is not simulated.

A fixed handler time makes completions periodic (every 0.25 s with 2 slots of 0.5 s), and
an integer Retry-After brings a retry back at the point of that cycle where it was
rejected, late in it, where it tends to be rejected again; real handlers drift and break
this. ``handler_jitter`` (each handler time x U(1 - j, 1 + j)) models the drift. It
matters under sustained overload (static 5 s, retries admitted, median of 3 runs:
const2x 11% fixed, 17% at j = 0.05, 23% at j = 0.1) less at capacity (poisson1x 66%,
72%, 68%).

Clients honour the Retry-After of a rejection (``BackpressureError.retry_after_s``; 1 s
when the rejection has none): mode ``once`` retries once, mode ``until`` retries until
admitted, giving up when the next attempt would start more than ``give_up_after_s`` after
the first arrival.

Timeline, from 0: ``warmup_s`` of the shape's opening load (so the window starts in steady
state: the drain-rate EWMA is warm and the retries of earlier requests arrive in it, as
they would in production), then the measured window of ``duration_s``, then the shape's
closing load for as long as a request that first arrived in the window still retries: a
retry after the window meets the load it would meet in a longer run, not an empty replica.
Only requests that first arrived in the window are measured; idle capacity and goodput
are the replicas' work inside the window.

The loop is ``tests.unit.virtual_time``'s: time jumps to the next timer, so a simulated
minute costs milliseconds. Deterministic for a seed: every random choice comes from an rng
seeded from it (arrivals, the router split, each router's own rng, handler times).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator

from controlplane.clock import FakeClock
from controlplane.deployment.demand_board import DemandBoard
from controlplane.errors import BackpressureError
from controlplane.deployment.lifecycle import ReplicaState
from controlplane.routing.router import Router
from controlplane.routing.routing_config import RoutingConfig
from controlplane.routing.subscriber import DEMAND_REPORT_S
from controlplane.wire import ReplicaInfo, RoutingUpdate
from release_tests.retry_after_shapes import Shape, seeded_arrivals
from release_tests.scale import percentile
from tests.unit.virtual_time import run_virtual

DEPLOYMENT = "app/model"
NO_HEADER_RETRY_S = 1.0  # a rejection without Retry-After: the client waits 1 s
# A 0 s Retry-After (static 0) would let an until-admitted client retry without time ever
# passing; the client waits at least this long instead.
MIN_RETRY_S = 0.001


@dataclass(frozen=True)
class PolicyRow:
    """One row of the results: a policy with the static value it is configured with (the
    value itself for ``static``, the fallback for a computed policy)."""

    label: str
    policy: str
    retry_after_s: float | None


@dataclass(frozen=True)
class SimConfig:
    replicas: int = 1
    max_ongoing: int = 2
    max_queued: int = 4
    handler_s: float = 0.5
    handler_jitter: float = 0.0  # each handler time is handler_s x U(1 - j, 1 + j)
    status_code: int = 429
    routers: int = 1
    mode: str = "once"  # "once" or "until"
    # The window must meet the retries of requests that arrived before it: at least the
    # longest Retry-After (60 s, the clamp) or until-mode life (60 s), plus the
    # drain-rate EWMA's warm-up. With 10 s, a policy answering "60" was measured on a
    # window that never saw its own retries (const2x first tries rejected: 53% instead
    # of the steady state's ~67%).
    warmup_s: float = 70.0
    duration_s: float = 60.0
    give_up_after_s: float = 60.0  # mode "until": from the first arrival
    hop_s: float = 0.001

    def __post_init__(self) -> None:
        if self.mode not in ("once", "until"):
            raise ValueError(f"mode must be 'once' or 'until', got {self.mode!r}")

    @property
    def capacity_per_s(self) -> float:
        return self.replicas * self.max_ongoing / self.handler_s

    @property
    def window(self) -> tuple[float, float]:
        return self.warmup_s, self.warmup_s + self.duration_s


class SimReplicas:
    """The replicas every router shares; a ``ReplicaTransport`` (send and probe)."""

    def __init__(self, clock: FakeClock, config: SimConfig, rng: random.Random) -> None:
        self._clock = clock
        self._config = config
        self._rng = rng
        self._sems: dict[str, asyncio.Semaphore] = {}
        self.ready_at: dict[str, float] = {}  # replica -> when it began to serve
        self.add(config.replicas, 0.0)
        self.load: Counter[str] = Counter()  # ongoing + queued at the replica, per replica
        self.busy_slot_s = 0.0  # slot-seconds of handler time inside the window
        self.completed_in_window = 0
        self.completed: set[Any] = set()  # request ids whose handler finished
        self.started = 0  # requests that reached a replica
        self.cancelled = 0  # of those, cancelled (only when the run is torn down)

    def infos(self) -> list[ReplicaInfo]:
        return [ReplicaInfo(rid, f"fleetplane_replica::{rid}") for rid in self._sems]

    def add(self, n: int, now: float) -> None:
        """``n`` more replicas, serving from ``now``."""
        for i in range(len(self._sems), len(self._sems) + n):
            self._sems[f"r{i}"] = asyncio.Semaphore(self._config.max_ongoing)
            self.ready_at[f"r{i}"] = now

    def slot_s(self) -> float:
        """Slot-seconds the replicas could work inside the window (idle capacity's base)."""
        w0, w1 = self._config.window
        return self._config.max_ongoing * sum(max(0.0, w1 - max(w0, at))
                                              for at in self.ready_at.values())

    async def send(self, replica: ReplicaInfo, request: Any) -> Any:
        rid = replica.replica_id
        await asyncio.sleep(self._config.hop_s)
        self.started += 1
        self.load[rid] += 1
        try:
            async with self._sems[rid]:
                await self._handle(request)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.load[rid] -= 1
        await asyncio.sleep(self._config.hop_s)
        return request

    async def _handle(self, request: Any) -> None:
        start = self._clock.monotonic()
        try:
            await asyncio.sleep(self._handler_s())
        finally:  # a handler cut short by the teardown was busy until then
            end = self._clock.monotonic()
            w0, w1 = self._config.window
            self.busy_slot_s += max(0.0, min(end, w1) - max(start, w0))
        self.completed.add(request)
        if w0 <= end < w1:
            self.completed_in_window += 1

    def _handler_s(self) -> float:
        jitter = self._config.handler_jitter
        if not jitter:
            return self._config.handler_s
        return self._config.handler_s * self._rng.uniform(1 - jitter, 1 + jitter)

    async def probe_queue_len(self, replica: ReplicaInfo, deadline_s: float) -> int:
        await asyncio.sleep(self._config.hop_s)
        answer = self.load[replica.replica_id]
        await asyncio.sleep(self._config.hop_s)
        return answer


@dataclass(frozen=True)
class Outcome:
    """What happened to one measured request, as its client saw it."""

    request_id: int
    first_at: float
    attempts: int
    retry_afters: tuple[int | None, ...]  # the value of every rejection, in order
    done_at: float | None  # completion of the admitted attempt; None: finally rejected


@dataclass(frozen=True)
class RunResult:
    outcomes: tuple[Outcome, ...]
    busy_slot_s: float
    completed_in_window: int
    completed_ids: frozenset
    started: int
    cancelled: int
    slot_s: float  # what the replicas could have worked inside the window


class Clients:
    """Spawns one task per first arrival; records the measured ones' outcomes."""

    def __init__(self, routers: list[Router], config: SimConfig, clock: FakeClock,
                 rng: random.Random) -> None:
        self._routers = routers
        self._config = config
        self._clock = clock
        self._rng = rng
        self.outcomes: list[Outcome] = []
        self.measured: list[asyncio.Task] = []
        self.background: set[asyncio.Task] = set()
        self.window_closed = asyncio.Event()

    async def drive(self, arrivals: Iterator[float]) -> None:
        """Start a client at each arrival, forever (the run cancels it)."""
        w0, w1 = self._config.window
        loop = asyncio.get_running_loop()
        for request_id, at in enumerate(arrivals):
            await asyncio.sleep(at - self._clock.monotonic())
            if at >= w1:
                self.window_closed.set()
            task = loop.create_task(self._client(request_id, w0 <= at < w1))
            if w0 <= at < w1:
                self.measured.append(task)
            else:
                self.background.add(task)
                task.add_done_callback(self.background.discard)

    def _router(self) -> Router:
        if len(self._routers) == 1:
            return self._routers[0]
        return self._routers[self._rng.randrange(len(self._routers))]

    async def _client(self, request_id: int, measured: bool) -> None:
        first_at = self._clock.monotonic()
        given: list[int | None] = []
        done_at: float | None = None
        while done_at is None:
            try:
                await self._router().assign(request_id)
            except BackpressureError as e:
                given.append(e.retry_after_s)
                delay = NO_HEADER_RETRY_S if e.retry_after_s is None else e.retry_after_s
                delay = max(MIN_RETRY_S, delay)
                if not self._may_retry(len(given), first_at, delay):
                    break
                await asyncio.sleep(delay)
            else:
                done_at = self._clock.monotonic()
        if measured:
            attempts = len(given) + (done_at is not None)
            self.outcomes.append(Outcome(request_id, first_at, attempts, tuple(given), done_at))

    def _may_retry(self, rejections: int, first_at: float, delay: float) -> bool:
        if self._config.mode == "once":
            return rejections < 2
        return self._clock.monotonic() + delay - first_at <= self._config.give_up_after_s


def simulate(shape: Shape, row: PolicyRow, config: SimConfig, seed: int) -> RunResult:
    """One run in virtual time; returns once every measured request has its outcome."""
    clock = FakeClock(0.0)
    return run_virtual(clock, lambda: _simulate(shape, row, config, seed, clock))


async def _simulate(shape: Shape, row: PolicyRow, config: SimConfig, seed: int,
                    clock: FakeClock) -> RunResult:
    replicas = SimReplicas(clock, config, random.Random(f"{seed}/handler"))
    routing = RoutingConfig(DEPLOYMENT, config.max_ongoing, config.max_queued,
                            config.status_code, row.retry_after_s, row.policy)
    routers = [Router(routing, replicas, clock, random.Random(f"{seed}/router/{i}"))
               for i in range(config.routers)]
    for router in routers:
        router.update_replicas(replicas.infos())
    clients = Clients(routers, config, clock, random.Random(f"{seed}/split"))
    driver = asyncio.get_running_loop().create_task(
        clients.drive(seeded_arrivals(shape, config, seed)))
    scale_up = ScaleUp(shape, config)
    loop = asyncio.get_running_loop()
    clients.background.add(loop.create_task(scale_up.run(replicas, routers, clock)))
    if row.policy == "cluster_informed":
        clients.background.add(loop.create_task(
            _shard_demand(routers, replicas, routing, clock, scale_up)))
    await clients.window_closed.wait()
    await asyncio.gather(*clients.measured)
    # Teardown: the background load is no longer needed; nothing measured is cut short.
    driver.cancel()
    for task in clients.background:
        task.cancel()
    await asyncio.gather(driver, *clients.background, return_exceptions=True)
    for router in routers:
        router.close("the run ended")
    return RunResult(tuple(sorted(clients.outcomes, key=lambda o: o.request_id)),
                     replicas.busy_slot_s, replicas.completed_in_window,
                     frozenset(replicas.completed), replicas.started, replicas.cancelled,
                     replicas.slot_s())


class ScaleUp:
    """The shape's scale-up, if any: more replicas start as the window opens and serve
    ``start_s`` later; meanwhile the shard's replica set shows them STARTING (what
    ``DemandBoard``'s outlook reads: ``records_in`` and ``count``)."""

    def __init__(self, shape: Shape, config: SimConfig) -> None:
        self.added = max(0, shape.scale_to - config.replicas)
        self.start_s = shape.start_s
        self._config = config
        self._starting: list[Any] = []
        self._running = config.replicas

    async def run(self, replicas: SimReplicas, routers: list[Router], clock: FakeClock) -> None:
        if not self.added:
            return
        w0, _ = self._config.window
        await asyncio.sleep(w0 - clock.monotonic())
        self._starting = [_Starting(w0)] * self.added
        await asyncio.sleep(self.start_s)
        self._starting, self._running = [], self._running + self.added
        replicas.add(self.added, clock.monotonic())
        for router in routers:  # what the routing long-poll brings them
            router.update_replicas(replicas.infos())

    def records_in(self, state: ReplicaState) -> list[Any]:
        return self._starting if state == ReplicaState.STARTING else []

    def count(self, state: ReplicaState) -> int:
        return self._running if state == ReplicaState.RUNNING else 0


@dataclass(frozen=True)
class _Starting:
    started_at: float


async def _shard_demand(routers: list[Router], replicas: SimReplicas, routing: RoutingConfig,
                        clock: FakeClock, scale_up: ScaleUp) -> None:
    """``cluster_informed``'s control-plane half, as the shard runs it: each router reports
    its demand once a second (``RoutingSubscriber``), the real ``DemandBoard`` sums them,
    adds the scale-up outlook and publishes at most once a second, and each router applies
    the total as it applies a routing update from the long-poll (a publication reaches
    routers 50 ms later). With a scale-up, the shard has seen earlier starts take as long
    as this one will (``note_start``)."""
    board = DemandBoard()
    if scale_up.added:
        board.note_start(scale_up.start_s)
    while True:
        await asyncio.sleep(DEMAND_REPORT_S)
        for i, router in enumerate(routers):
            board.record(f"router-{i}", router.demand(), clock.monotonic())
        total = board.to_publish(clock.monotonic(), scale_up)
        if total is not None:
            await asyncio.sleep(0.05)
            update = RoutingUpdate(tuple(replicas.infos()), routing.max_ongoing_requests,
                                   routing.max_queued_requests, routing.status_code,
                                   routing.retry_after_s, routing.retry_after_policy, demand=total)
            for router in routers:
                router.apply_routing_update(update)


def metrics(result: RunResult, config: SimConfig) -> dict[str, float | None]:
    """The issue's measures of one run; None where a measure has no sample."""
    outcomes = result.outcomes
    rejected_first = [o for o in outcomes if o.retry_afters]
    admitted = [o for o in outcomes if o.done_at is not None]
    retried_in = [o for o in rejected_first if o.done_at is not None]
    latencies = [o.done_at - o.first_at for o in admitted]
    given = [v for o in outcomes for v in o.retry_afters if v is not None]
    slot_s = result.slot_s
    return {
        "arrivals": len(outcomes),
        "first_try_rejected_pct": _pct(len(rejected_first), len(outcomes)),
        "retries_admitted_pct": _pct(len(retried_in), len(rejected_first)),
        "finally_rejected_pct": _pct(len(outcomes) - len(admitted), len(outcomes)),
        # every attempt the measured requests made, over those admitted: the load a
        # policy's advice generates per success (wasted attempts of clients that gave up
        # included)
        "attempts_per_admitted": (sum(o.attempts for o in outcomes) / len(admitted)
                                  if admitted else None),
        "idle_capacity_pct": 100.0 * (1.0 - result.busy_slot_s / slot_s),
        "goodput_per_s": result.completed_in_window / config.duration_s,
        "latency_p50_s": percentile(latencies, 50),
        "latency_p99_s": percentile(latencies, 99),
        "retry_after_p10_s": percentile(given, 10),
        "retry_after_p50_s": percentile(given, 50),
        "retry_after_p90_s": percentile(given, 90),
    }


def _pct(part: int, whole: int) -> float | None:
    return 100.0 * part / whole if whole else None
