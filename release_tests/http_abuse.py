"""The proxy under HTTP abuse, measured: a normal client's success and latency, and the
proxy's memory, while huge heads, 100 MB bodies, slow and idle clients and malformed
bytes arrive (issue 15).

    python -m release_tests.http_abuse [--duration-s 60] [--large-mb 48] [--large-count 16]
                                       [--limit-mb 64] [--header-timeout-s 30]

Starts its own embedded Ray and a fleetplane instance with one proxy (``http_options``
defaults, or the limits given) and an app that answers a body's length. A normal client
sends 1 KiB POSTs on a kept connection through every phase:

1. ``quiet``: the normal client alone, 10 s: its latency without abuse, the memory baseline.
2. ``large``: ``--large-count`` legitimate bodies of ``--large-mb`` (under the limit), 4 at
   a time: the proxy's memory at its peak, then once settled (the heap trim).
3. ``abuse``: for ``--duration-s``, rounds of every abuse in ``tests/abuse_clients.py``,
   16 connections at a time: a declared 100 MB body, a real 100 MB body sent as
   ``requests`` sends it, a chunked 100 MB body, a 1 MiB head, a slowloris head, an idle
   connection, malformed bytes; the status each got.
4. ``after``: 10 s more of the normal client alone, then the memory once settled.

Memory: ``own`` is the proxy's resident memory without the shared-memory pages of Ray's
object store it touched (``shmem``: where a request over 100 KiB goes on its way to the
replica; the node's store owns and reuses them); ``uss`` is what no other process shares.
Prints a table per phase and the abuse outcomes with the machine, writes Parquet under
``release_tests/results/``, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import ray
import requests

from controlplane.config.schema import parse_deploy_config
from controlplane.instance import Client, start_local_ray
from controlplane.ingress.listener import proxy_actor_name
from release_tests.machine import describe, describe_line
from tests import abuse_clients as abuse

RESULTS = Path(__file__).resolve().parent / "results"
PATH = "/web?kind=size"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(http_options: dict) -> tuple[Client, str, int]:
    """Ray, the instance, the app; returns the client, the app's URL and the proxy pid."""
    start_local_ray(num_cpus=2)
    client = Client()
    client.start_controller()
    client.deploy(parse_deploy_config({
        "applications": [{"name": "web", "route_prefix": "/web",
                          "import_path": "tests.integration.apps:HttpModel",
                          "deployments": [{"name": "HttpModel",
                                           "ray_actor_options": {"num_cpus": 0}}]}],
        "http_options": {"host": "127.0.0.1", "proxies_per_node": 1, **http_options}}))
    url = f"http://127.0.0.1:{http_options['port']}{PATH}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if requests.post(url, data=b"ab", timeout=5).text == "2":
                break
        except requests.RequestException:
            pass
        time.sleep(0.5)
    node = ray.get_runtime_context().get_node_id()
    proxy = ray.get_actor(proxy_actor_name(node, 0), namespace=client.settings.namespace)
    return client, url, ray.get(proxy.describe.remote())["pid"]


class Phase:
    """The normal client and a memory sampler over one phase."""

    def __init__(self, name: str, url: str, pid: int) -> None:
        self.name, self.pid = name, pid
        self.normal = abuse.NormalClient(url)
        self.peak = abuse.memory_mb(pid)
        self._done = threading.Event()
        self._threads = [threading.Thread(target=self.normal.run, daemon=True),
                         threading.Thread(target=self._sample, daemon=True)]

    def _sample(self) -> None:
        while not self._done.wait(0.25):
            now = abuse.memory_mb(self.pid)
            self.peak = {k: max(v, now[k]) for k, v in self.peak.items()}

    def __enter__(self) -> Phase:
        self.started = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.normal.stop()
        self._done.set()
        for thread in self._threads:
            thread.join(timeout=15)
        self.seconds = time.monotonic() - self.started

    def row(self, settled: dict[str, float]) -> dict:
        lat = sorted(self.normal.latencies_s) or [0.0]
        return {"phase": self.name, "seconds": round(self.seconds, 1),
                "normal_requests": self.normal.ok + len(self.normal.failures),
                "normal_success": round(self.normal.success, 5),
                "p50_ms": round(1000 * statistics.median(lat), 2),
                "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2),
                **{f"peak_{k}_mb": round(v, 1) for k, v in self.peak.items()},
                **{f"settled_{k}_mb": round(v, 1) for k, v in settled.items()}}


def settle(pid: int, seconds: float = 5.0) -> dict[str, float]:
    """The memory once the trim after the last large body ran (0.5 s) and a margin."""
    time.sleep(seconds)
    return abuse.memory_mb(pid)


def abusers(port: int, url: str, header_timeout_s: float) -> dict[str, tuple[int, object]]:
    """Each kind of abuse: (connections at a time, one client)."""
    wait_s = header_timeout_s + 5
    return {
        "declared_100MB": (2, lambda: abuse.declared_body(port, PATH, 100_000_000, 4 << 20)),
        "requests_100MB": (1, lambda: abuse.body_with_requests(url, 100_000_000)),
        "chunked_100MB": (1, lambda: abuse.chunked_body(port, PATH, 100_000_000)),
        "header_1MiB": (2, lambda: abuse.huge_header(port, PATH, 1 << 20)),
        "slowloris": (4, lambda: abuse.slowloris(port, PATH, 0.5, timeout_s=wait_s)),
        "idle": (2, lambda: abuse.idle(port, timeout_s=wait_s)),
        "malformed": (2, lambda: abuse.malformed(port)),
    }


def run_abuse(port: int, url: str, duration_s: float, header_timeout_s: float) -> dict:
    """Every kind at once, each client starting again until ``duration_s`` has passed;
    per kind, the answers seen."""
    seen: dict[str, Counter] = {}
    deadline = time.monotonic() + duration_s

    def loop(kind: str, client) -> None:
        while time.monotonic() < deadline:
            outcome = client()
            seen[kind][str(getattr(outcome, "status", outcome))] += 1
    kinds = abusers(port, url, header_timeout_s)
    seen.update({kind: Counter() for kind in kinds})
    with ThreadPoolExecutor(sum(n for n, _ in kinds.values())) as pool:
        futures = [pool.submit(loop, kind, client)
                   for kind, (n, client) in kinds.items() for _ in range(n)]
        for future in futures:
            future.result()  # a client that raised is a failed measurement
    return {kind: dict(counts) for kind, counts in seen.items()}


def large_bodies(url: str, size_mb: int, count: int) -> Counter:
    body = b"L" * (size_mb << 20)
    with ThreadPoolExecutor(4) as pool:
        return Counter(pool.map(
            lambda _: requests.post(url, data=body, timeout=120).status_code, range(count)))


def measure(args: argparse.Namespace) -> tuple[list[dict], dict, dict]:
    port = _free_port()
    options = {"port": port, "max_request_body_bytes": args.limit_mb << 20,
               "request_header_timeout_s": args.header_timeout_s}
    client, url, pid = start(options)
    rows, outcomes = [], {}
    try:
        with Phase("quiet", url, pid) as quiet:
            time.sleep(10)
        rows.append(quiet.row(abuse.memory_mb(pid)))
        with Phase("large", url, pid) as large:
            outcomes["large"] = dict(large_bodies(url, args.large_mb, args.large_count))
        rows.append(large.row(settle(pid)))
        with Phase("abuse", url, pid) as abused:
            outcomes.update(run_abuse(port, url, args.duration_s, args.header_timeout_s))
        rows.append(abused.row(settle(pid)))
        with Phase("after", url, pid) as after:
            time.sleep(10)
        rows.append(after.row(settle(pid)))
    finally:
        client.shutdown(timeout_s=30)
        ray.shutdown()
    return rows, outcomes, options


def report(rows: list[dict], outcomes: dict, args: argparse.Namespace) -> None:
    print(f"\nhttp_abuse: one proxy, max_request_body_bytes {args.limit_mb} MiB, "
          f"request_header_timeout_s {args.header_timeout_s:g}; machine: {describe_line()}")
    print("| phase | s | normal requests | success | p50 ms | p99 ms | peak own MB | "
          "settled own MB | settled uss MB | settled shmem MB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['phase']} | {r['seconds']} | {r['normal_requests']} | "
              f"{100 * r['normal_success']:.2f}% | {r['p50_ms']} | {r['p99_ms']} | "
              f"{r['peak_own_mb']} | {r['settled_own_mb']} | {r['settled_uss_mb']} | "
              f"{r['settled_shmem_mb']} |")
    print("\n| abuse | answers seen |\n|---|---|")
    for kind, counts in outcomes.items():
        print(f"| {kind} | {', '.join(f'{status}: {n}' for status, n in counts.items())} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration-s", type=float, default=60.0, help="the abuse phase")
    p.add_argument("--large-mb", type=int, default=48, help="legitimate large bodies, MiB")
    p.add_argument("--large-count", type=int, default=16)
    p.add_argument("--limit-mb", type=int, default=64, help="max_request_body_bytes, MiB")
    p.add_argument("--header-timeout-s", type=float, default=30.0,
                   help="request_header_timeout_s")
    args = p.parse_args()
    rows, outcomes, options = measure(args)
    report(rows, outcomes, args)
    machine = describe()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"http_abuse_{int(time.time())}.parquet"
    pq.write_table(pa.Table.from_pylist(
        [{**r, **options, "abuse": json.dumps(outcomes), **machine} for r in rows]), path)
    print(f"records: {path}")
    baseline, last = rows[0], rows[-1]
    print(json.dumps({"http_abuse": {
        "normal_success_under_abuse": rows[2]["normal_success"],
        "own_mb": {"baseline": baseline["settled_own_mb"], "after": last["settled_own_mb"]},
        "uss_mb": {"baseline": baseline["settled_uss_mb"], "after": last["settled_uss_mb"]},
        "abuse": outcomes}}))


if __name__ == "__main__":
    main()
