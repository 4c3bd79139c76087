"""Does the router keep a saturated replica busy? The issue's case, on real HTTP:
1 replica, max_ongoing_requests=2, a 0.5 s handler, 20 requests/s offered (open loop)
for --duration-s; utilisation = completed x 0.5 s / (2 slots x window). Ray Serve 2.60's
proxy was measured at about 62% (its backoff grows to 0.5 s); run side by side here.

    python -m release_tests.overload_idle [--duration-s 20] [--rate 20]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import aiohttp
import pyarrow as pa
import pyarrow.parquet as pq

from release_tests.http_bench import RESULTS, _start, _stop, _wait_ready
from release_tests.machine import describe, describe_line

HANDLER_S, SLOTS = 0.5, 2
SYSTEMS = {
    "fleetplane": ([sys.executable, "-m", "fleetplane.cli", "run", "release_tests/overload.yaml"],
                   "http://127.0.0.1:8000/noop"),
    "ray-serve-2.60": ([sys.executable, "-m", "release_tests.serve_baseline", "--port", "8001",
                        "--app", "serve_half_second_app"], "http://127.0.0.1:8001/noop"),
}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args()
    records = []
    for system, (cmd, url) in SYSTEMS.items():
        proc = _start(cmd)
        try:
            _wait_ready(url, timeout_s=180)
            time.sleep(HANDLER_S * 2)  # let the readiness request drain
            completed = asyncio.run(offer(url, args.rate, args.duration_s))
        finally:
            _stop(proc)
        # The first completion can come only after one handler time.
        window = args.duration_s - HANDLER_S
        utilisation = len(completed) * HANDLER_S / (SLOTS * window)
        records.append({"system": system, "offered_per_s": args.rate,
                        "duration_s": args.duration_s, "completed": len(completed),
                        "utilisation": utilisation, **describe()})
        print(f"{system:<15} completed {len(completed):4d}  utilisation {utilisation:6.1%}",
              flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"overload_idle_{int(time.time())}.parquet"
    pq.write_table(pa.Table.from_pylist(records), path)
    print(f"machine: {describe_line()}\nrecords: {path}")


if __name__ == "__main__":
    main()
