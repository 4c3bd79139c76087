"""fleetplane's side of ``release_tests.scale``: a real ``ShardCore`` at N replicas, in one
process, on virtual time.

What is real: ``ShardCore`` and everything its tick and ingest call (``DeploymentState``,
``ReplicaOps`` and their owned tasks, push health, the stall guard, autoscaling, ranks,
routing publication). What is fake: the replica actors (``InstantReplicaClient``: a
start succeeds at once, or after ``start_delay_s`` of virtual time; a stop ends at once;
probes succeed), the clock (a ``FakeClock`` that moves ``TICK_S`` per tick, only when
the harness says) and the event loop (``tests.unit.virtual_time.VirtualTimeLoop``, so a
timer costs no wall time). The shard's own reconcile loop is parked, as in the unit
tests' shard harness; the harness ticks it.

Reports (``PushSchedule``): every serving replica sends one report (its ``ReportRow``, as
the shard receives it) every ``report_interval_s``, by default the product's
``ReplicaSettings.metrics_report_interval_s`` (1 s), spread evenly over the ticks; its
health rides on it. The main deployment's replicas report no load; the autoscaled one's
report 2 ongoing requests each (its target).

Timing: ``perf_counter`` and ``process_time`` around each controller call only: the
tick, the ingest of one tick's pushes (``ShardCore.report_rows``), and the owned
tasks running until all are blocked. The harness's own work (making reports, reading
which replicas serve) is outside every timed section.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import psutil

from controlplane.clock import FakeClock
from controlplane.deployment.lifecycle import ReplicaState
from controlplane.plan_freeze import PlanFreeze
from controlplane.replica_client import ReplicaDied
from controlplane.settings import ReplicaSettings, Settings, ShardSettings
from controlplane.shard import ShardCore
from controlplane.specs import DeploymentId, DeploymentSpec
from controlplane.wire import ReplicaDescription, ReportRow
from release_tests.scale import Limits, PhaseResult, percentile
from tests.unit.virtual_time import loop_clock, run_virtual, wait_all_tasks_blocked

TICK_S = 0.1  # ShardSettings.tick_interval_s default: the shard's reconcile period
PERIOD_S = 10.0  # health_check_period_s (the stock period)
REPORT_S = ReplicaSettings().metrics_report_interval_s  # the product's report interval
PARKED_S = 1e9  # the shard's own loop ticks once, then waits past the run
MAIN = DeploymentId("bench", "main")
AUTO = DeploymentId("bench", "auto")
# A window with no pushes must end before the first replica's push goes stale
# (1.5 periods after it arrived), or probes would start and blur "the tick's own work".
NO_PUSH_TICKS_MAX = int(1.4 * PERIOD_S / TICK_S)


@dataclass
class _Handle:
    replica_id: str
    watch: asyncio.Future | None = None
    stopped: bool = False


class InstantReplicaClient:
    """The ``ReplicaClient`` protocol with nothing behind it (no call log, unlike the unit
    tests' ``FakeReplicaClient``: at 32K a log would be the harness's cost, not the shard's)."""

    def __init__(self, start_delay_s: float = 0.0) -> None:
        self._delay_s = start_delay_s
        self.probes = 0

    def create(self, init: Any, spec: DeploymentSpec) -> _Handle:
        return _Handle(init.replica_id)

    def find(self, app: str, deployment: str) -> dict:
        return {}  # nothing to re-adopt

    def start_phase(self, handle: _Handle) -> str:
        return ""

    async def describe(self, handle: _Handle, timeout_s: float) -> ReplicaDescription:
        raise ReplicaDied("nothing to re-adopt here")

    async def initialize(self, handle: _Handle, timeout_s: float) -> dict:
        if self._delay_s:
            await asyncio.sleep(self._delay_s)
        return {"actor_id": f"actor-{handle.replica_id}", "node_id": "node-a"}

    async def check_health(self, handle: _Handle, timeout_s: float) -> None:
        self.probes += 1

    async def update_health_timings(self, handle: _Handle, period_s: float,
                                    timeout_s: float) -> None:
        pass

    async def wait_until_stopped(self, handle: _Handle) -> None:
        if not handle.stopped:
            handle.watch = asyncio.get_running_loop().create_future()
            await handle.watch

    async def reconfigure(self, handle: _Handle, user_config: Any, timeout_s: float) -> None:
        pass

    async def update_rank(self, handle: _Handle, rank: int) -> None:
        pass

    async def stop(self, handle: _Handle, grace_s: float, extra_s: float) -> None:
        self.kill(handle)

    def kill(self, handle: _Handle) -> None:
        handle.stopped = True
        if handle.watch is not None and not handle.watch.done():
            handle.watch.set_result(None)


def make_spec(dep_id: DeploymentId, n: int, code_version: str = "v1",
              autoscaling: dict | None = None) -> DeploymentSpec:
    return DeploymentSpec(
        id=dep_id, ingress=dep_id == MAIN, code_version=code_version, serialized_def=b"",
        num_replicas=n, max_ongoing_requests=5, max_queued_requests=-1, user_config=None,
        autoscaling_config=autoscaling, health_check_period_s=PERIOD_S,
        health_check_timeout_s=30.0, graceful_shutdown_timeout_s=20.0,
        backpressure_config={"status_code": 503, "retry_after_s": None},
        ray_actor_options={"num_cpus": 1})


def autoscaled_spec(m: int) -> DeploymentSpec:
    """Reported load (2 per replica, the target) keeps it at ``m`` within [m, 2m]."""
    return make_spec(AUTO, m, autoscaling={
        "min_replicas": m, "max_replicas": 2 * m, "initial_replicas": m,
        "target_ongoing_requests": 2.0, "upscale_delay_s": 30.0,
        "downscale_delay_s": 600.0, "look_back_period_s": 30.0})


class PushSchedule:
    """Each serving replica of one deployment reports once per ``every_s``, spread evenly
    over the ticks: a tick sends the next slice of the replica list, round robin. The list
    is re-read when the deployment's membership fingerprint changes."""

    def __init__(self, dep_id: DeploymentId, every_s: float, load: int) -> None:
        self.key = (dep_id.app, dep_id.name)
        self._per_tick = TICK_S / every_s
        self._load = load
        self._ids: list[str] = []
        self._fingerprint: int | None = None
        self._cursor = 0
        self._owed = 0.0

    def refresh(self, replicas: Any) -> None:
        if replicas.fingerprint != self._fingerprint:
            self._ids = sorted(replicas.running_ids())
            self._fingerprint = replicas.fingerprint

    def _report(self, replica_id: str, now: float) -> ReportRow:
        """A healthy report as the shard receives it: its row."""
        return ReportRow(replica_id, self._load, 0, True, now, 0, "")

    def due(self, now: float) -> list[ReportRow]:
        self._owed += len(self._ids) * self._per_tick
        count, ids = int(self._owed), self._ids
        self._owed -= count
        start, self._cursor = self._cursor, self._cursor + count
        return [self._report(ids[i % len(ids)], now) for i in range(start, start + count)]

    def everyone(self, now: float) -> list[ReportRow]:
        return [self._report(replica_id, now) for replica_id in self._ids]


@dataclass
class Step:
    """One tick period, timed: wall seconds unless named ``cpu``."""

    tick_s: float
    tick_cpu_s: float
    tasks_s: float
    ingest_s: float
    ingest_cpu_s: float
    pushes: int
    cpu_s: float

    @property
    def controller_s(self) -> float:
        return self.tick_s + self.tasks_s + self.ingest_s


class FleetBench:
    """A ``ShardCore`` on fakes, stepped one tick at a time (inside ``run_virtual``)."""

    def __init__(self, surge_fraction: float, start_delay_s: float,
                 report_interval_s: float = REPORT_S) -> None:
        self.clock = loop_clock()
        shard = ShardSettings(tick_interval_s=PARKED_S, rolling_surge_fraction=surge_fraction)
        self.client = InstantReplicaClient(start_delay_s)
        # the collector as the shard actor runs it (PlanFreeze: frozen while slicing)
        self.core = ShardCore(0, Settings(shard=shard), self.client, self.clock,
                              collector=PlanFreeze())
        self.schedules = {MAIN: PushSchedule(MAIN, report_interval_s, load=0),
                          AUTO: PushSchedule(AUTO, report_interval_s, load=2)}
        self.samples: list[tuple] = []  # (phase, tick, tick ms, tick CPU ms)
        self.batched = False  # pushes as node batches (ShardCore.report_batch)
        self.report_interval_s = report_interval_s
        # (phase, ms) of each time the reconcile held the loop: a tick, or a later slice
        # of its plan (ShardSettings.transitions_per_slice)
        self.holds: list[tuple[str, float]] = []

    def replicas(self, dep_id: DeploymentId) -> Any:
        """The deployment's ``ReplicaSet`` (O(1) counts); ShardCore has no summary of its own
        short of ``status()``, which lists every replica."""
        state = self.core.deployment(dep_id)
        return state.book.replicas if state is not None else None

    def settled(self, dep_id: DeploymentId, n: int, version: str | None = None) -> bool:
        r = self.replicas(dep_id)
        return (r is not None and r.count(ReplicaState.RUNNING) == n and len(r) == n
                and (version is None or r.count_version(version) == n))

    def messages(self, everyone: bool = False) -> list[tuple[tuple[str, str], list]]:
        """This tick's messages per deployment, as the shard receives them (harness work:
        not timed): each replica's report as its row, in a list of one for a direct report
        (what the replica sends) or all of a deployment's rows in one list for a node
        batch. Only the messages are alive when the ingest starts, as in the shard."""
        now, messages = self.clock.monotonic(), []
        for dep_id, schedule in self.schedules.items():
            replicas = self.replicas(dep_id)
            if replicas is not None:
                schedule.refresh(replicas)
                rows = schedule.everyone(now) if everyone else schedule.due(now)
                messages.append((schedule.key, [rows] if self.batched else
                                 [[row] for row in rows]))
        return messages

    def ingest(self, messages: list) -> tuple[float, float, int]:
        """Deliver this tick's messages: one ``ShardCore.report_rows`` call per replica (a
        direct report: a batch of one) or, with ``batched``, one ``report_batch`` (a node
        reporter's call): (wall s, CPU s, reports)."""
        c0, t0 = time.process_time(), time.perf_counter()
        if self.batched:
            self.core.report_batch({key: rows for key, [rows] in messages})
        else:
            report = self.core.report_rows
            for key, calls in messages:
                for rows in calls:
                    report(key, rows)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return wall, cpu, sum(len(rows) for _, calls in messages for rows in calls)

    async def step(self, phase: str, i: int, pushing: bool = True) -> Step:
        """One shard period: this tick's pushes arrive, the shard ticks, its owned tasks
        run until all are blocked, and the clock moves one tick interval."""
        ingest_s, ingest_cpu, pushes = self.ingest(self.messages()) if pushing else (0, 0, 0)
        self.core.slice_observer = lambda held_s: self.holds.append((phase, held_s * 1e3))
        c0, t0 = time.process_time(), time.perf_counter()
        self.core.tick()
        t1, c1 = time.perf_counter(), time.process_time()
        self.holds.append((phase, (t1 - t0) * 1e3))
        await wait_all_tasks_blocked()
        t2, c2 = time.perf_counter(), time.process_time()
        self.clock.advance(TICK_S)
        self.samples.append((phase, i, (t1 - t0) * 1e3, (c1 - c0) * 1e3))
        return Step(t1 - t0, c1 - c0, t2 - t1, ingest_s, ingest_cpu, pushes, c2 - c0 + ingest_cpu)

    async def run_ticks(self, phase: str, ticks: int, pushing: bool = True) -> list[Step]:
        return [await self.step(phase, i, pushing) for i in range(ticks)]

    async def converge(self, phase: str, done: Callable[[], bool], limits: Limits,
                       pushing: bool = True) -> PhaseResult:
        """Tick until ``done()``: the controller's time (tick + tasks + ingest) and CPU."""
        wall = cpu = 0.0
        started, ticks = time.monotonic(), 0
        while not limits.reached(ticks, started):
            s = await self.step(phase, ticks, pushing)
            wall, cpu, ticks = wall + s.controller_s, cpu + s.cpu_s, ticks + 1
            if done():
                return PhaseResult(wall, cpu, ticks, True)
        return PhaseResult(wall, cpu, ticks, False)

    async def burst(self) -> None:
        """Every serving replica pushes now, consumed by one untimed tick: nothing is
        stale for the next 1.5 periods whatever the schedule did before."""
        self.ingest(self.messages(everyone=True))
        await self.step("burst", 0, pushing=False)


@dataclass(frozen=True)
class FleetOptions:
    steady_ticks: int
    start_delay_s: float = 0.0
    surge_fraction: float = 0.1  # "a 10% rolling update"
    limits: Limits = Limits()
    profile_s: float = 0.0  # > 0: py-spy the steady tick for this long
    profile_path: str = ""
    report_interval_s: float = REPORT_S  # each replica's reports (the product's default)


async def _steady(bench: FleetBench, n: int, opts: FleetOptions, log: Callable) -> dict:
    """Steady state with reports flowing at ``report_interval_s`` and an autoscaled
    deployment: first as node batches (the product's default path), then the tick's own
    work with no reports, then the same reports one call each (a replica's direct report).
    ``period_cpu_ms``: all the shard's work in one 0.1 s period (its tick, the ingest of the
    reports that arrived in it, the owned tasks), the figure to set beside Serve's
    ``update()``."""
    m = max(1, n // 16)
    bench.core.apply([autoscaled_spec(m)], [])
    await bench.converge("auto_up", lambda: bench.settled(AUTO, m), opts.limits)
    await bench.run_ticks("warmup", int(1.5 * PERIOD_S / TICK_S))  # every replica pushed
    probes0, stalls0 = bench.client.probes, bench.core.health_totals.stall_episodes_total
    bench.batched = True
    default = await bench.run_ticks("steady", opts.steady_ticks)
    probes = bench.client.probes - probes0
    stalls = bench.core.health_totals.stall_episodes_total - stalls0
    await bench.burst()
    quiet = await bench.run_ticks("own", min(opts.steady_ticks, NO_PUSH_TICKS_MAX), False)
    await bench.burst()
    bench.batched = False
    direct = await bench.run_ticks("steady_direct", opts.steady_ticks)
    bench.batched = True  # what follows (profile, rollout) reports as the product does
    own_cpu_ms = _mean([s.tick_cpu_s * 1e3 for s in quiet])
    result = {**_tick_figures("", default), **_tick_figures("own_", quiet),
              **_tick_figures("direct_", direct),
              "period_cpu_ms": percentile([s.cpu_s * 1e3 for s in default], 50),
              "period_cpu_p99_ms": percentile([s.cpu_s * 1e3 for s in default], 99),
              "period_cpu_direct_ms": percentile([s.cpu_s * 1e3 for s in direct], 50),
              "push_batched_us": _push_us(default, own_cpu_ms),
              "ingest_batched_us_per_push": _ingest_us(default),
              "push_us": _push_us(direct, own_cpu_ms), "ingest_us_per_push": _ingest_us(direct),
              "pushes_per_tick": sum(s.pushes for s in default) / len(default),
              "report_interval_s": bench.report_interval_s,
              "steady_probes": probes, "steady_stall_episodes": stalls,
              "auto_replicas": bench.replicas(AUTO).count(ReplicaState.RUNNING)}
    log(f"[fleetplane {n}] steady: reports every {bench.report_interval_s:g} s "
        f"({result['pushes_per_tick']:.0f} per 0.1 s period); all work per period p50 "
        f"{result['period_cpu_ms']:.2f} ms CPU ({result['period_cpu_direct_ms']:.2f} ms with "
        f"direct reports); the tick alone p50 {result['tick_p50_ms']:.3f} ms; "
        f"{result['push_batched_us']:.2f} us per batched report, {result['push_us']:.2f} "
        f"direct; own work p50 {result['own_tick_p50_ms']:.3f} ms")
    return result


async def collected(bench: FleetBench, up: PhaseResult, n: int) -> dict:
    """The scale-up's CPU per start with the collection its freeze deferred counted: one
    more tick (the collector thaws: ``plan_freeze``) and a full collection, as the next one
    the process runs over the new fleet would be."""
    c0 = time.process_time()
    await bench.step("scaleup_gc", 0, pushing=False)
    gc.collect()
    spent = time.process_time() - c0
    return {"cpu_us_per_start": (up.cpu_s + spent) / n * 1e6 if up.converged else None,
            "scaleup_collect_ms": spent * 1e3}


def _tick_figures(prefix: str, steps: list[Step]) -> dict:
    wall_ms, cpu_ms = [s.tick_s * 1e3 for s in steps], [s.tick_cpu_s * 1e3 for s in steps]
    return {f"{prefix}tick_p50_ms": percentile(wall_ms, 50),
            f"{prefix}tick_p99_ms": percentile(wall_ms, 99),
            f"{prefix}tick_cpu_p50_ms": percentile(cpu_ms, 50),
            f"{prefix}tick_cpu_p99_ms": percentile(cpu_ms, 99)}


def _push_us(steps: list[Step], own_cpu_ms: float) -> float:
    """CPU of the ingest, plus what the ticks with pushes cost beyond the tick's own work,
    per push. CPU rather than wall, so another process on the cores does not inflate it."""
    spent = sum(s.ingest_cpu_s + s.tick_cpu_s for s in steps) - len(steps) * own_cpu_ms / 1e3
    return spent / max(1, sum(s.pushes for s in steps)) * 1e6


def _ingest_us(steps: list[Step]) -> float:
    return sum(s.ingest_cpu_s for s in steps) / max(1, sum(s.pushes for s in steps)) * 1e6


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


async def _profile(bench: FleetBench, opts: FleetOptions, log: Callable) -> dict:
    """py-spy on this process while steady ticks (pushes flowing) run: a flame graph at
    ``opts.profile_path`` and ``profile_summary`` of a second, raw recording (both
    non-blocking, so neither pauses the shard). {} when py-spy cannot attach."""
    raw_path = opts.profile_path.rsplit(".", 1)[0] + ".txt"
    py_spy = shutil.which("py-spy", path=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    if py_spy is None:
        log("py-spy is not installed (pip install -e '.[dev]'); continuing without a profile")
        return {}
    Path(opts.profile_path).parent.mkdir(parents=True, exist_ok=True)
    procs = [subprocess.Popen(
        [py_spy, "record", "--pid", str(os.getpid()), "--duration", str(int(opts.profile_s)),
         "--nonblocking", "--format", fmt, "-o", path],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for fmt, path in (("flamegraph", opts.profile_path), ("raw", raw_path))]
    deadline, i = time.monotonic() + opts.profile_s + 60, 0
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        await bench.step("profile", i)
        i += 1
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        output = proc.communicate()[0].strip().splitlines()
        if proc.returncode != 0:
            log(f"py-spy failed (exit {proc.returncode}): {' / '.join(output[-3:])} "
                "(in a container py-spy needs CAP_SYS_PTRACE); continuing without a profile")
            return {}
    log(f"[profile] {i} ticks under py-spy; flame graph {opts.profile_path}")
    return profile_summary(raw_path)


_SHARD_ENTRIES = {"tick": ("ShardCore.tick ",),
                  "ingest": ("ShardCore.report_rows ", "ShardCore.report_batch ")}


def _function(frame: str) -> str:
    """py-spy's "func (file:line)" without the line: one row per function."""
    return re.sub(r":\d+\)$", ")", frame)


def _leaf(frames: list[str]) -> str:
    """The sampled function; a dataclass's generated ``__init__`` is named with its caller."""
    leaf = _function(frames[-1])
    if leaf.startswith("__create_fn__") and len(frames) > 1:
        return f"{_function(frames[-2])} > {leaf.split(' ')[0]}"
    return leaf


def profile_summary(raw_path: str, top: int = 15) -> dict:
    """From py-spy's raw (collapsed) stacks: where the samples were (the shard's tick, its
    ingest, or the harness making reports), and the shard's top functions by self time
    as shares of the shard's samples."""
    where = {"tick": 0, "ingest": 0, "harness": 0}
    counts: dict[str, int] = {}
    with open(raw_path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = stack.split(";")
            part = next((name for name, entries in _SHARD_ENTRIES.items()
                         if any(fr.startswith(entries) for fr in frames)), "harness")
            where[part] += int(count)
            if part != "harness":
                counts[_leaf(frames)] = counts.get(_leaf(frames), 0) + int(count)
    shard = sum(counts.values()) or 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
    return {"samples": where, "top": [(name, n / shard) for name, n in ranked]}


def _rss_mb() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


def _status_costs(core: ShardCore) -> dict:
    """One ``status()`` (every replica listed) and, where the shard has it, one summary."""
    costs = {}
    for key, kwargs in (("status_ms", {}), ("status_summary_ms", {"summary": True})):
        t0 = time.perf_counter()
        try:
            core.status(**kwargs)
        except TypeError:  # no summary here
            continue
        costs[key] = (time.perf_counter() - t0) * 1e3
    return costs


async def _run(n: int, opts: FleetOptions, log: Callable) -> tuple[dict, list]:
    rss0 = _rss_mb()
    bench = FleetBench(opts.surge_fraction, opts.start_delay_s, opts.report_interval_s)
    bench.core.apply([make_spec(MAIN, n)], [])
    up = await bench.converge("scaleup", lambda: bench.settled(MAIN, n), opts.limits,
                              pushing=False)
    result = {**up.as_dict("scaleup", n), **await collected(bench, up, n)}
    log(f"[fleetplane {n}] scale-up {up.text(n)}; {result['cpu_us_per_start']:.0f} us per "
        f"start with the deferred collection ({result['scaleup_collect_ms']:.0f} ms)")
    result.update(await _steady(bench, n, opts, log))
    result["shard_rss_mb"] = _rss_mb() - rss0
    result.update(_status_costs(bench.core))
    result["profile"] = await _profile(bench, opts, log) if opts.profile_s > 0 else {}
    await bench.burst()
    bench.core.apply([make_spec(MAIN, n, "v2")], [])
    roll = await bench.converge("rollout", lambda: bench.settled(MAIN, n, "v2"), opts.limits)
    result.update(roll.as_dict("replace", n))
    # The rollout's "tick": each hold of the loop, a tick or a slice of its plan; beside
    # it, all of the work per 0.1 s period (the figure to set beside Serve's update()).
    holds = [ms for p, ms in bench.holds if p == "rollout"]
    result["rollout_tick_ms"] = percentile(holds, 50)
    result["rollout_tick_p99_ms"] = percentile(holds, 99)
    result["rollout_holds"] = len(holds)
    result["rollout_tick_cpu_ms"] = percentile(
        [cpu_ms for p, _, _, cpu_ms in bench.samples if p == "rollout"], 50)
    result["rollout_period_cpu_ms"] = roll.cpu_s / max(1, roll.ticks) * 1e3
    log(f"[fleetplane {n}] rolling replacement {roll.text(n)}; the loop held p50 "
        f"{result['rollout_tick_ms']:.2f} ms, p99 {result['rollout_tick_p99_ms']:.2f} ms "
        f"({len(holds)} ticks and slices); all work per 0.1 s period "
        f"{result['rollout_period_cpu_ms']:.1f} ms CPU")
    small = max(1, n // 32)
    bench.core.apply([make_spec(MAIN, small, "v2")], [])
    down = await bench.converge("scaledown", lambda: bench.settled(MAIN, small, "v2"),
                                opts.limits)
    log(f"[fleetplane {n}] scale-down {down.text(n - small)}")
    result.update(down.as_dict("scaledown", n - small))
    result["tick_errors"] = bench.core.health_totals.tick_errors_total
    return result, bench.samples


def run_fleet(n: int, opts: FleetOptions, log: Callable) -> tuple[dict, list]:
    """Scale-up 0 -> n, steady state (pushes, an autoscaled deployment), the tick's own work,
    a 10% rolling replacement of all n, scale-down to n/32: one result dict and the
    per-tick samples."""
    return run_virtual(FakeClock(), lambda: _run(n, opts, log))


def run_fleet_scaleup(n: int, opts: FleetOptions) -> dict:
    """0 -> n alone, in a fresh process (``release_tests.scale --scaleup-runs``)."""
    async def scaleup() -> dict:
        bench = FleetBench(opts.surge_fraction, opts.start_delay_s)
        bench.core.apply([make_spec(MAIN, n)], [])
        up = await bench.converge("scaleup", lambda: bench.settled(MAIN, n), opts.limits,
                                  pushing=False)
        return {**up.as_dict("scaleup", n), **await collected(bench, up, n)}
    return run_virtual(FakeClock(), scaleup)
