"""Does the router keep a saturated replica busy? The issue's case, on real HTTP:
1 replica, max_ongoing_requests=2, a 0.5 s handler, 20 requests/s offered (open loop)
for --duration-s; utilisation = completed x 0.5 s / (2 slots x window). Ray Serve 2.60's
proxy backs off up to 0.5 s between probes of a full replica; run side by side here, one
proxy each (``overload.yaml`` sets ``proxies_per_node: 1``; fleetplane's default is 2).

    python -m release_tests.overload_idle [--duration-s 20] [--rate 20] [--systems ...]
                                          [--smoke]

Prints a line per system, records the table and the completions per second (the plot of
how busy the replica was kept) with ``release_tests.results.record``, ends with a JSON
line; exits 1 when a system completed nothing. ``--smoke``: fleetplane for 3 s (the suite's;
Serve's start is exercised by ``http_bench --smoke``, with the same ``serve_baseline``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time

import aiohttp

from release_tests.http_bench import _start, _stop, _wait_ready
from release_tests.machine import describe, describe_line
from release_tests.results import parse_args, record

HANDLER_S, SLOTS = 0.5, 2
# Ports of their own: http_bench serves on 8000-8003, retry_after_http on 8040-8041.
SYSTEMS = {  # name: (command, environment, URL)
    "fleetplane": ([sys.executable, "-m", "fleetplane.cli", "run", "release_tests/overload.yaml"],
                   {}, "http://127.0.0.1:8020/noop"),
    "ray-serve-2.60": ([sys.executable, "-m", "release_tests.serve_baseline", "--port", "8021",
                        "--app", "serve_half_second_app"], {}, "http://127.0.0.1:8021/noop"),
}
SMOKE = {"duration_s": 3.0, "systems": "fleetplane"}


async def offer(url: str, rate: float, duration_s: float) -> list[float]:
    """Open-loop load; returns completion times (relative) of 200 responses inside the
    window."""
    done: list[float] = []
    start = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=duration_s + 120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def one() -> None:
            async with session.get(url) as r:
                await r.read()
                if r.status == 200:
                    done.append(time.monotonic() - start)
        tasks = []
        for i in range(int(rate * duration_s)):
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(max(0.0, start + duration_s - time.monotonic()))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return [t for t in done if t <= duration_s]


def measure(system: str, args: argparse.Namespace) -> tuple[dict, list[int]]:
    """One system: its row of the table and its completions in each second of the window."""
    cmd, env, url = SYSTEMS[system]
    # its own instance record: another `fleetplane run` on this machine is not disturbed
    proc = _start(cmd, {**env, "FLEETPLANE_STATE_DIR": tempfile.mkdtemp(prefix="overload_")})
    try:
        _wait_ready(url, timeout_s=180)
        time.sleep(HANDLER_S * 2)  # let the readiness request drain
        completed = asyncio.run(offer(url, args.rate, args.duration_s))
    finally:
        _stop(proc)
    # The first completion can come only after one handler time.
    window = args.duration_s - HANDLER_S
    utilisation = len(completed) * HANDLER_S / (SLOTS * window)
    per_s = [0] * max(1, int(args.duration_s + 0.999))
    for t in completed:
        per_s[min(len(per_s) - 1, int(t))] += 1
    return ({"system": system, "offered_per_s": args.rate, "duration_s": args.duration_s,
             "completed": len(completed), "utilisation": round(utilisation, 4)}, per_s)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated, from: {', '.join(SYSTEMS)}")
    parser.add_argument("--smoke", action="store_true",
                        help="the same, fleetplane only, --duration-s 3 unless given (the suite's)")
    return parser


def main() -> int:
    parser = _parser()
    args = parse_args(parser, SMOKE)
    systems = args.systems.split(",")
    if set(systems) - set(SYSTEMS):
        parser.error(f"--systems: unknown {sorted(set(systems) - set(SYSTEMS))}")
    table, per_s = [], {}
    for system in systems:
        row, per_s[system] = measure(system, args)
        table.append(row)
        print(f"{system:<15} completed {row['completed']:4d}  utilisation "
              f"{row['utilisation']:6.1%}", flush=True)
    machine = describe()
    path = record("overload_idle", {"table": table, "completed_per_s": per_s,
                                    "handler_s": HANDLER_S, "slots": SLOTS, "proxies": 1},
                  [{**row, **machine} for row in table], smoke=args.smoke)
    print(f"machine: {describe_line()}\nresults: {path}")
    print(json.dumps({"overload_idle": {r["system"]: {"completed": r["completed"],
                                                      "utilisation": r["utilisation"]}
                                        for r in table}}))
    return 1 if any(r["completed"] == 0 for r in table) else 0


if __name__ == "__main__":
    sys.exit(main())
