"""Retry-After on real HTTP: issue 14's setup through ``fleetplane run``, its proxy and a real
replica, to check the virtual-time harness (``retry_after_eval``) against the real thing.

    python -m release_tests.retry_after_http [--policies static arrival_aware cluster_informed
        ray-serve-2.60]
        [--rate 4] [--warmup-s 20] [--duration-s 60] [--seed 0]

Per policy, one fresh ``fleetplane run`` of one replica (max_ongoing_requests 2,
max_queued_requests 4, a 0.5 s handler: capacity 4 req/s, 429 with the policy's
Retry-After, static 5 s as its fallback) behind ``--proxies`` proxy listeners (2, the
default of ``http_options.proxies_per_node``: two routers, each with its own queue of 4,
as ``retry_after_eval --routers 2`` simulates). Open-loop Poisson arrivals at ``--rate`` (the
same seeded arrivals for every policy); a rejected request retries once, after exactly the
Retry-After it got. Arrivals go on after the window until every request that first arrived
in it has its outcome (a retry meets the load it would meet in a longer run). Measured, as
``retry_after_sim.metrics`` (the same function): first tries rejected, retries admitted,
finally rejected, attempts per admitted request, idle capacity (completions inside the
window x 0.5 s over its slot-seconds), goodput, p50/p99 latency of admitted requests from
their first arrival, the Retry-After values given.
Prints the table, writes Parquet under release_tests/results/, and as its last line one
JSON object keyed by policy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pyarrow as pa
import pyarrow.parquet as pq

from release_tests.http_bench import RESULTS, _start, _stop, _wait_ready
from release_tests.machine import describe, describe_line
from release_tests.retry_after_sim import Outcome, RunResult, SimConfig, metrics

HANDLER_S, SLOTS, MAX_QUEUED = 0.5, 2, 4
URL = "http://127.0.0.1:8000/noop"
# Ray Serve 2.60 on the same setup (``noop_app.ServeHalfSecondQueued``: 2 slots, a queue
# of 4, its 503 carries no Retry-After): the row "Ray Serve 2.60, static 5 s",
# clients waiting 5 s where no Retry-After came
SERVE = "ray-serve-2.60"
SERVE_URL = "http://127.0.0.1:8001/noop"
SERVE_CMD = [sys.executable, "-m", "release_tests.serve_baseline", "--port", "8001",
             "--app", "serve_half_second_queued_app"]
CONFIG = """\
http_options: {{host: 127.0.0.1, port: 8000, proxies_per_node: {proxies}}}
applications:
  - name: slow
    route_prefix: /noop
    import_path: release_tests.noop_app:HalfSecond
    deployments:
      - name: HalfSecond
        num_replicas: 1
        max_ongoing_requests: {slots}
        max_queued_requests: {queued}
        backpressure_config: {{status_code: 429, retry_after_s: 5,
                              retry_after_policy: {policy}}}
        ray_actor_options: {{num_cpus: 0}}
"""


@dataclass
class Run:
    """What the clients saw, times relative to the first arrival."""

    window: tuple[float, float]
    outcomes: list[Outcome] = field(default_factory=list)  # the measured requests'
    completions: list[float] = field(default_factory=list)  # every 200, measured or not


@dataclass(frozen=True)
class Target:
    """Where the clients go, and how long they wait when no Retry-After came."""

    url: str = URL
    no_header_wait_s: float = 1.0


async def _client(session: aiohttp.ClientSession, run: Run, t0: float, request_id: int,
                  measured: bool, target: Target) -> None:
    first_at, given, done_at = time.monotonic() - t0, [], None
    for attempt in range(2):
        async with session.get(target.url) as r:
            await r.read()
            if r.status == 200:
                done_at = time.monotonic() - t0
                run.completions.append(done_at)
                break
            header = r.headers.get("Retry-After")
            given.append(int(header) if header and header.isdigit() else None)
        if attempt == 0:
            await asyncio.sleep(given[-1] if given[-1] is not None else target.no_header_wait_s)
    if measured:
        attempts = len(given) + (done_at is not None)
        run.outcomes.append(Outcome(request_id, first_at, attempts, tuple(given), done_at))


async def drive(rate: float, warmup_s: float, duration_s: float, seed: int,
                target: Target = Target()) -> Run:
    """Poisson arrivals until every request first arriving in the window has its outcome."""
    rng, run = random.Random(f"{seed}/arrivals"), Run((warmup_s, warmup_s + duration_s))
    w0, w1 = run.window
    measured: list[asyncio.Task] = []
    background: set[asyncio.Task] = set()
    timeout = aiohttp.ClientTimeout(total=180)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        t0, at, request_id = time.monotonic(), 0.0, 0
        while at < w1 or not all(t.done() for t in measured):
            at += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            task = asyncio.create_task(_client(session, run, t0, request_id, w0 <= at < w1,
                                                 target))
            (measured.append if w0 <= at < w1 else background.add)(task)
            request_id += 1
        for task in background:
            task.cancel()
        await asyncio.gather(*measured, *background, return_exceptions=True)
    return run


def measures(run: Run) -> dict:
    """``retry_after_sim.metrics`` of what the clients saw: the replica's work inside the
    window is its completions there times the handler time."""
    w0, w1 = run.window
    in_window = sum(1 for t in run.completions if w0 <= t < w1)
    result = RunResult(tuple(run.outcomes), in_window * HANDLER_S, in_window, frozenset(),
                       0, 0, SLOTS * (w1 - w0))
    return metrics(result, SimConfig(max_ongoing=SLOTS, max_queued=MAX_QUEUED,
                                     handler_s=HANDLER_S, warmup_s=w0, duration_s=w1 - w0))


def measure_policy(policy: str, args: argparse.Namespace) -> dict:
    """One fresh system per policy: ``fleetplane run`` with it, or Ray Serve (``SERVE``)."""
    with tempfile.TemporaryDirectory() as tmp:
        if policy == SERVE:
            cmd, target = SERVE_CMD, Target(SERVE_URL, no_header_wait_s=5.0)
        else:
            config = Path(tmp) / "retry_after_http.yaml"
            config.write_text(CONFIG.format(policy=policy, slots=SLOTS, queued=MAX_QUEUED,
                                            proxies=args.proxies))
            cmd, target = [sys.executable, "-m", "fleetplane.cli", "run", str(config)], Target()
        proc = _start(cmd, {})
        try:
            _wait_ready(target.url, timeout_s=180)
            time.sleep(2 * HANDLER_S)  # let the readiness request drain
            run = asyncio.run(drive(args.rate, args.warmup_s, args.duration_s, args.seed,
                                    target))
        finally:
            _stop(proc)
    return measures(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", nargs="+",
                        default=["static", "arrival_aware", "cluster_informed", SERVE],
                        help=f"fleetplane's retry_after_policy values, and {SERVE} (Ray "
                             "Serve 2.60 on the same setup, its own proxy: one router)")
    parser.add_argument("--rate", type=float, default=4.0, help="arrivals per s (capacity 4)")
    parser.add_argument("--warmup-s", type=float, default=20.0)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--proxies", type=int, default=2,
                        help="http_options.proxies_per_node: routers, each with its own queue")
    args = parser.parse_args()
    print(f"machine: {describe_line()}\nPoisson {args.rate}/s, capacity "
          f"{SLOTS / HANDLER_S:g}/s, {args.proxies} router(s) with a queue of {MAX_QUEUED} each, "
          f"warm-up {args.warmup_s:g} s, "
          f"window {args.duration_s:g} s, seed {args.seed}", flush=True)
    results = {}
    for policy in args.policies:
        results[policy] = measure_policy(policy, args)
        print(f"{policy}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                        for k, v in results[policy].items()), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"retry_after_http_{int(time.time())}.parquet"
    pq.write_table(pa.Table.from_pylist([{"policy": p, "rate": args.rate, "seed": args.seed,
                                          "proxies": args.proxies, **m, **describe()}
                                         for p, m in results.items()]), path)
    print(f"records: {path}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
