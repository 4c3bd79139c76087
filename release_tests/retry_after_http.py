"""Retry-After on real HTTP: issue 14's setup through ``fleetplane run``, its proxy and a real
replica, beside Ray Serve 2.60 on the same setup, to check the virtual-time harness
(``retry_after_eval``) against the real thing.

    python -m release_tests.retry_after_http [--policies static arrival_aware cluster_informed
        ray-serve-2.60] [--rate 4] [--warmup-s 20] [--duration-s 60] [--seed 0]
        [--proxies 1] [--smoke]

The setup, equal on both systems: one replica (max_ongoing_requests 2, a 0.5 s handler:
capacity 4 req/s) behind ONE router with a queue of 4 (max_queued_requests 4): fleetplane
with ``http_options.proxies_per_node: 1`` (its default is 2), Ray Serve with its one proxy
per node. Per policy, one fresh system: ``fleetplane run`` with that
``retry_after_policy`` (429, static 5 s as its fallback), or ``ray-serve-2.60``
(``serve_baseline`` serving ``noop_app.ServeHalfSecondQueued`` with the same limits given
as flags). ``--proxies N`` shows fleetplane's default instead (N routers, each with its own
queue of 4: 4N queue slots against Serve's 4, as ``retry_after_eval --routers N``
simulates); such rows are labelled ``POLICY (N proxies)`` and the summary's ``proxies``
says N. Each system gets its own port (8040, 8041) and fleetplane its own state folder.

Asymmetries that remain (read from both code bases):

- status: fleetplane answers a rejection with 429 (``backpressure_config.status_code``);
  Serve with its default 503 (``BackpressureConfig.status_code``, 503 unless set to 429).
  The summary's ``rejection_status`` counts what came.
- Retry-After: fleetplane sends one with every rejection (``static``: 5; the computed
  policies: their value, jittered, 5 s while their estimator is cold); Serve's default
  sends none (``retry_after_s`` None), and the clients then wait 5 s, the issue's row
  "Ray Serve 2.60, static 5 s": the same retry time as fleetplane's ``static``, without a
  header (``none`` in ``retry_after_given``). Serve 2.60 could send ``429`` with
  ``Retry-After: 5`` (``backpressure_config``); not used: the issue compares its default.
- logging: neither writes an access line per request (fleetplane's uvicorn runs with
  ``access_log=False``; Serve gets ``--no-access-log``), but Serve's router still logs a
  warning per rejection (``router.py``: ``logger.warning(e.message)``); fleetplane's
  counts it in a metric.
- queue accounting: Serve counts a request as queued from its arrival at the router until
  it is assigned (its own comment: under concurrency it may reject a request a freed slot
  could have taken); fleetplane queues only a request no slot took at once (FIFO, a freed
  slot handed to the head waiter in the same callback). Both admit 2 running + 4 waiting.
- measured, not set up: the same handler class (``noop_app.HalfSecond``) in a Ray actor of
  0 CPUs on each, each system its own local Ray; where the replica is full, Serve's proxy
  backs off up to 0.5 s before it probes again, fleetplane's router hands a freed slot to
  its head waiter at once (``controlplane/routing/router.py``): idle capacity shows it.

Load: open-loop Poisson arrivals at ``--rate`` (the same seeded arrivals for every
policy); a rejected request retries once, after exactly the Retry-After it got. Arrivals go
on after the window until every request that first arrived in it has its outcome (a retry
meets the load it would meet in a longer run). Measured, as ``retry_after_sim.metrics``
(the same function): first tries rejected, retries admitted, finally rejected, attempts per
admitted request, idle capacity (completions inside the window x 0.5 s over its
slot-seconds), goodput, p50/p99 latency of admitted requests from their first arrival, the
Retry-After values given (and their histogram per policy). The default run takes about 2
minutes per policy (start-up 15-25 s, 20 s warm-up, 60 s window, the retries' tail, the
stop), some 8 minutes for the four.

``--smoke``: the same code path on a tiny bounded load, ``static`` only (each start-up
alone takes 15-25 s on 2 cores; Serve's start through ``serve_baseline`` is exercised by
``http_bench --smoke``), Poisson 12/s (3x capacity, so that rejections, their Retry-After
and a retry happen) for a 0.5 s warm-up and a 1 s window; about 25 s in all. Flags given win. Prints the table, records it with ``release_tests.results.record``
(``measured/retry_after_http.json``: the parameters, and per policy its row of the table,
the Retry-After values given and the rejections' statuses; the measured requests as
Parquet), ends with one JSON line keyed by policy; exits 1 when a policy admitted nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from release_tests.http_bench import _start, _stop, _wait_ready
from release_tests.machine import describe_line
from release_tests.results import parse_args, record
from release_tests.retry_after_sim import Outcome, RunResult, SimConfig, metrics

HANDLER_S, SLOTS, MAX_QUEUED = 0.5, 2, 4
NO_HEADER_WAIT_S = 5.0  # Serve's 503 carries no Retry-After: the "static 5 s"
FLEET_PORT, SERVE_PORT = 8040, 8041  # ports of their own: other release tests use 80xx
POLICIES = ("static", "arrival_aware", "cluster_informed")
SERVE = "ray-serve-2.60"
SERVE_CMD = [sys.executable, "-m", "release_tests.serve_baseline", "--port", str(SERVE_PORT),
             "--app", "ServeHalfSecondQueued", "--max-ongoing-requests", str(SLOTS),
             "--max-queued-requests", str(MAX_QUEUED), "--no-access-log"]
CONFIG = """\
http_options: {{host: 127.0.0.1, port: {port}, proxies_per_node: {proxies}}}
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
# One fleetplane policy and Serve (each start-up takes 15-25 s here); at 3x capacity, so
# that the window sees rejections and a retry.
SMOKE = {"policies": ["static"], "rate": 12.0, "warmup_s": 0.5, "duration_s": 1.0}


@dataclass
class Run:
    """What the clients saw, times relative to the first arrival."""

    window: tuple[float, float]
    outcomes: list[Outcome] = field(default_factory=list)  # the measured requests'
    completions: list[float] = field(default_factory=list)  # every 200, measured or not
    rejection_status: Counter = field(default_factory=Counter)  # measured requests'
    client_errors: int = 0  # measured requests that raised (no HTTP answer)


@dataclass(frozen=True)
class Target:
    """Where the clients go, and how long they wait when no Retry-After came."""

    url: str = f"http://127.0.0.1:{FLEET_PORT}/noop"
    no_header_wait_s: float = 1.0


async def _client(session: aiohttp.ClientSession, run: Run, t0: float, request_id: int,
                  measured: bool, target: Target) -> None:
    first_at, given, statuses, done_at = time.monotonic() - t0, [], [], None
    for attempt in range(2):
        async with session.get(target.url) as r:
            await r.read()
            if r.status == 200:
                done_at = time.monotonic() - t0
                run.completions.append(done_at)
                break
            header = r.headers.get("Retry-After")
            given.append(int(header) if header and header.isdigit() else None)
            statuses.append(r.status)
        if attempt == 0:
            await asyncio.sleep(given[-1] if given[-1] is not None else target.no_header_wait_s)
    if measured:
        attempts = len(given) + (done_at is not None)
        run.outcomes.append(Outcome(request_id, first_at, attempts, tuple(given), done_at))
        run.rejection_status.update(statuses)


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
        done = await asyncio.gather(*measured, return_exceptions=True)
        await asyncio.gather(*background, return_exceptions=True)
    run.client_errors = sum(isinstance(d, BaseException) for d in done)
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


def given_histogram(run: Run) -> dict[str, int]:
    """How often each Retry-After value came to the measured requests (``none``: a
    rejection without the header), in increasing order."""
    counts = Counter(v for o in run.outcomes for v in o.retry_afters)
    keys = sorted((k for k in counts if k is not None)) + ([None] if None in counts else [])
    return {("none" if k is None else str(k)): counts[k] for k in keys}


def label(policy: str, proxies: int) -> str:
    """A policy's row: fleetplane's with more than one router says how many."""
    return policy if policy == SERVE or proxies == 1 else f"{policy} ({proxies} proxies)"


def _system(policy: str, proxies: int, tmp: str) -> tuple[list[str], dict, Target]:
    """The command, environment and target of one policy's system."""
    if policy == SERVE:
        return SERVE_CMD, {}, Target(f"http://127.0.0.1:{SERVE_PORT}/noop", NO_HEADER_WAIT_S)
    config = Path(tmp) / "retry_after_http.yaml"
    config.write_text(CONFIG.format(policy=policy, slots=SLOTS, queued=MAX_QUEUED,
                                    proxies=proxies, port=FLEET_PORT))
    # its own instance record: another `fleetplane run` on this machine is not disturbed
    env = {"FLEETPLANE_STATE_DIR": str(Path(tmp) / "state")}
    return [sys.executable, "-m", "fleetplane.cli", "run", str(config)], env, Target()


def measure_policy(policy: str, args: argparse.Namespace) -> Run:
    """One fresh system per policy: ``fleetplane run`` with it, or Ray Serve (``SERVE``)."""
    with tempfile.TemporaryDirectory(prefix="retry_after_http_") as tmp:
        cmd, env, target = _system(policy, args.proxies, tmp)
        proc = _start(cmd, env)
        try:
            _wait_ready(target.url, timeout_s=180)
            time.sleep(2 * HANDLER_S)  # let the readiness request drain
            return asyncio.run(drive(args.rate, args.warmup_s, args.duration_s, args.seed,
                                     target))
        finally:
            _stop(proc)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", nargs="+", default=[*POLICIES, SERVE],
                   choices=[*POLICIES, "router_queue_drain_rate", SERVE], metavar="POLICY",
                   help=f"fleetplane's retry_after_policy values, and {SERVE} (Ray Serve "
                        "2.60 on the same setup, its own proxy: one router)")
    p.add_argument("--rate", type=float, default=4.0, help="arrivals per s (capacity 4)")
    p.add_argument("--warmup-s", type=float, default=20.0)
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--proxies", type=int, default=1,
                   help="fleetplane's http_options.proxies_per_node: routers, each with its "
                        "own queue (1: as Serve; 2 is fleetplane's default); Serve keeps 1")
    p.add_argument("--smoke", action="store_true",
                   help="--policies static ray-serve-2.60 --rate 12 --warmup-s 0.5 "
                        "--duration-s 1 unless given: what the test suite runs")
    return p


def _line(name: str, row: dict) -> str:
    return f"{name}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                   for k, v in row.items())


def summarise(runs: dict[str, Run], args: argparse.Namespace) -> tuple[dict, list[dict]]:
    """The recorded summary: the parameters (scalars) and, per policy, its row of the table
    with the Retry-After values given (a histogram) and the rejections' statuses; and the
    raw rows (one per measured request)."""
    policies, rows = {}, []
    for policy, run in runs.items():
        routers, name = 1 if policy == SERVE else args.proxies, label(policy, args.proxies)
        policies[name] = {"routers": routers, **measures(run),
                          "client_errors": run.client_errors,
                          "retry_after_given": given_histogram(run),
                          "rejection_status": {str(s): c for s, c
                                               in sorted(run.rejection_status.items())}}
        rows += [{"policy": name, "routers": routers, "seed": args.seed, **asdict(o)}
                 for o in run.outcomes]
    summary = {"rate_per_s": args.rate, "warmup_s": args.warmup_s,
               "duration_s": args.duration_s, "seed": args.seed, "proxies": args.proxies,
               "serve_proxies": 1, "slots": SLOTS, "queue": MAX_QUEUED, "handler_s": HANDLER_S,
               "capacity_per_s": SLOTS / HANDLER_S, "no_header_wait_s": NO_HEADER_WAIT_S,
               "policies": policies}
    return summary, rows


def main() -> int:
    p = _parser()
    args = parse_args(p, SMOKE)
    if args.proxies < 1:
        p.error("--proxies: at least 1")
    print(f"machine: {describe_line()}\nPoisson {args.rate:g}/s, capacity "
          f"{SLOTS / HANDLER_S:g}/s; fleetplane: {args.proxies} router(s), Serve: 1 router; "
          f"a queue of {MAX_QUEUED} per router; warm-up {args.warmup_s:g} s, "
          f"window {args.duration_s:g} s, seed {args.seed}", flush=True)
    runs = {}
    for policy in args.policies:
        runs[policy] = measure_policy(policy, args)
        print(_line(label(policy, args.proxies), measures(runs[policy])), flush=True)
    summary, rows = summarise(runs, args)
    path = record("retry_after_http", summary, rows, smoke=args.smoke)
    print(f"results: {path}")
    print(json.dumps(summary["policies"]))
    return 1 if any(not any(o.done_at is not None for o in run.outcomes)
                    for run in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
