"""The proxy under HTTP abuse, measured: a normal client's success and latency, and the
proxy's memory, while huge heads, 100 MB bodies, slow and idle clients and malformed
bytes arrive (issue 15).

    python -m release_tests.http_abuse [--duration-s 60] [--large-mb 48] [--large-count 16]
                                       [--limit-mb 64] [--header-timeout-s 30]
                                       [--quiet-s 10] [--settle-s 5] [--smoke]

Starts its own embedded Ray and a fleetplane instance with one proxy (``http_options``
defaults, or the limits given) and an app that answers a body's length. A normal client
sends 1 KiB POSTs on a kept connection through every phase:

1. ``quiet``: the normal client alone, ``--quiet-s``: its latency without abuse, the
   memory baseline.
2. ``large``: ``--large-count`` legitimate bodies of ``--large-mb`` (under the limit), 4 at
   a time: the proxy's memory at its peak, then once settled (the heap trim).
3. ``abuse``: for ``--duration-s``, rounds of every abuse in ``tests/abuse_clients.py``,
   16 connections at a time: a declared 100 MB body, a real 100 MB body sent as
   ``requests`` sends it, a chunked 100 MB body, a 1 MiB head, a slowloris head, an idle
   connection, malformed bytes; the status each got.
4. ``after``: ``--quiet-s`` more of the normal client alone, then the memory once settled.

"Settled" is ``--settle-s`` after a phase. Memory: ``own`` is the proxy's resident memory
without the shared-memory pages of Ray's object store it touched (``shmem``: where a
request over 100 KiB goes on its way to the replica; the node's store owns and reuses
them); ``uss`` is what no other process shares.

Prints a table per phase and the abuse outcomes with the machine, and records with
``release_tests.results.record`` a summary of ``table`` (per phase: seconds, normal
requests and answers, success, p50/p99 ms, peak and settled memory), ``abuse`` (per kind,
the answers seen, by status), ``expected`` and ``unexpected`` (the answers expected per
kind, and those seen that were not), ``params``, ``http_options``,
``normal_success_under_abuse``, ``own_mb`` and ``uss_mb`` (baseline and after), and
``phases`` (per phase, the normal client's latency percentiles and CDF, and the proxy's
memory every 0.25 s: the plots); the rows are the phases. Ends with one JSON line.
Exits 1 when the app never answered, a phase had no normal request answered, the normal
client's success under abuse was under 99%, the large bodies were not all answered 200,
or an abuse got no answer or another answer than expected (413, 431, 408, 400, or a
silent close for an idle connection). Memory is measured, not checked
(``tests/integration/test_http_abuse.py`` asserts it).

``--smoke``: every phase, each short (``--quiet-s 0.5 --settle-s 0.75 --duration-s 1
--large-mb 8 --large-count 2 --header-timeout-s 1``) unless given: the same code path,
what the test suite runs (about 20 s on 2 cores, most of it Ray's start). The
default run takes about 2 minutes.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import ray
import requests

from controlplane.config.schema import parse_deploy_config
from controlplane.instance import Client, start_local_ray
from controlplane.ingress.listener import proxy_actor_name
from release_tests.machine import describe, describe_line
from release_tests.plot_data import quantile, quantiles, thin
from release_tests.results import parse_args, record
from tests import abuse_clients as abuse

PATH = "/web?kind=size"
MIN_SUCCESS = 0.99  # the normal client's success under abuse, as the integration test asks
EXPECTED = {"declared_100MB": "413", "requests_100MB": "413", "chunked_100MB": "413",
            "header_1MiB": "431", "slowloris": "408", "idle": "None", "malformed": "400"}
SMOKE = {"quiet_s": 0.5, "settle_s": 0.75, "duration_s": 1.0, "large_mb": 8,
         "large_count": 2, "header_timeout_s": 1.0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(http_options: dict) -> Client:
    """Ray, the instance, the app."""
    start_local_ray(num_cpus=2)
    client = Client()
    client.start_controller()
    client.deploy(parse_deploy_config({
        "applications": [{"name": "web", "route_prefix": "/web",
                          "import_path": "tests.integration.apps:HttpModel",
                          "deployments": [{"name": "HttpModel",
                                           "ray_actor_options": {"num_cpus": 0}}]}],
        "http_options": {"host": "127.0.0.1", "proxies_per_node": 1, **http_options}}))
    return client


def proxy_pid(client: Client, url: str, timeout_s: float = 120.0) -> int:
    """Once the app answers through the proxy, the proxy's pid."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if requests.post(url, data=b"ab", timeout=5).text == "2":
                break
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the app did not answer at {url} within {timeout_s:.0f}s")
        time.sleep(0.5)
    node = ray.get_runtime_context().get_node_id()
    proxy = ray.get_actor(proxy_actor_name(node, 0), namespace=client.settings.namespace)
    return ray.get(proxy.describe.remote())["pid"]


class Phase:
    """The normal client and a memory sampler over one phase."""

    def __init__(self, name: str, url: str, pid: int) -> None:
        self.name, self.pid = name, pid
        self.normal = abuse.NormalClient(url)
        self.peak = abuse.memory_mb(pid)
        self.samples: list[tuple[float, dict[str, float]]] = []  # (t from the start, MB)
        self._done = threading.Event()
        self._threads = [threading.Thread(target=self.normal.run, daemon=True),
                         threading.Thread(target=self._sample, daemon=True)]

    def _sample(self) -> None:
        while not self._done.wait(0.25):
            now = abuse.memory_mb(self.pid)
            self.samples.append((time.monotonic() - self.started, now))
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
                "normal_ok": self.normal.ok,
                "normal_success": round(self.normal.success, 5),
                "p50_ms": round(1000 * statistics.median(lat), 2),
                "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2),
                **{f"peak_{k}_mb": round(v, 1) for k, v in self.peak.items()},
                **{f"settled_{k}_mb": round(v, 1) for k, v in settled.items()}}

    def plot(self) -> dict:
        """What a plot of this phase wants: the normal client's latency (percentiles and
        a CDF, ms) and the proxy's memory over time (MB), a few hundred points at most."""
        lat = sorted(self.normal.latencies_s)
        samples = thin(self.samples, 200)
        return {"phase": self.name,
                "latency_ms": {name: _ms(quantile(lat, q, presorted=True)) for name, q
                               in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))},
                "latency_cdf_ms": [_ms(v) for v in quantiles(lat, 50)],
                "memory_mb": {"t_s": [round(t, 2) for t, _ in samples],
                              **{k: [round(m[k], 1) for _, m in samples]
                                 for k in ("own", "uss", "shmem", "rss")}}}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 2)


def settle(pid: int, seconds: float) -> dict[str, float]:
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
    """Every kind at once, each client once and then again until ``duration_s`` has
    passed (once at least: on a busy machine a client's thread may start after the
    deadline); per kind, the answers seen."""
    seen: dict[str, Counter] = {}
    deadline = time.monotonic() + duration_s

    def loop(kind: str, client) -> None:
        while True:
            outcome = client()
            seen[kind][str(getattr(outcome, "status", outcome))] += 1
            if time.monotonic() >= deadline:
                return
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
        return Counter(str(status) for status in pool.map(
            lambda _: requests.post(url, data=body, timeout=120).status_code, range(count)))


def measure(args: argparse.Namespace) -> tuple[list[Phase], list[dict], dict, dict]:
    """The four phases: each phase, its row, the answers seen, the http_options."""
    port = _free_port()
    options = {"port": port, "max_request_body_bytes": args.limit_mb << 20,
               "request_header_timeout_s": args.header_timeout_s}
    url = f"http://127.0.0.1:{port}{PATH}"
    client = start(options)
    phases, rows, outcomes = [], [], {}
    try:
        pid = proxy_pid(client, url)
        with Phase("quiet", url, pid) as quiet:
            time.sleep(args.quiet_s)
        phases.append(quiet)
        rows.append(quiet.row(abuse.memory_mb(pid)))
        with Phase("large", url, pid) as large:
            outcomes["large"] = dict(large_bodies(url, args.large_mb, args.large_count))
        phases.append(large)
        rows.append(large.row(settle(pid, args.settle_s)))
        with Phase("abuse", url, pid) as abused:
            outcomes.update(run_abuse(port, url, args.duration_s, args.header_timeout_s))
        phases.append(abused)
        rows.append(abused.row(settle(pid, args.settle_s)))
        with Phase("after", url, pid) as after:
            time.sleep(args.quiet_s)
        phases.append(after)
        rows.append(after.row(settle(pid, args.settle_s)))
    finally:
        client.shutdown(timeout_s=30)
        ray.shutdown()
    return phases, rows, outcomes, options


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


def unexpected(outcomes: dict) -> dict[str, dict]:
    """Per kind, the answers other than the one expected (large bodies: 200)."""
    expected = {**EXPECTED, "large": "200"}
    return {kind: odd for kind, counts in outcomes.items()
            if (odd := {s: n for s, n in counts.items() if s != expected.get(kind, s)})}


def broken(rows: list[dict], outcomes: dict) -> list[str]:
    """Why the run does not count: a phase measured nothing, the normal client was not
    served under abuse, or an abuse got no answer or an unexpected one."""
    why = [f"phase {r['phase']}: no normal request answered" for r in rows if not r["normal_ok"]]
    under = next((r for r in rows if r["phase"] == "abuse"), None)
    if under and under["normal_success"] < MIN_SUCCESS:
        why.append(f"normal success under abuse {under['normal_success']:.2%} < "
                   f"{MIN_SUCCESS:.0%}")
    why += [f"{kind}: no attempt finished" for kind, counts in outcomes.items() if not counts]
    why += [f"{kind}: unexpected answers {odd}" for kind, odd in unexpected(outcomes).items()]
    return why


def summarize(phases: list[Phase], rows: list[dict], outcomes: dict, options: dict,
              args: argparse.Namespace) -> dict:
    baseline, last = rows[0], rows[-1]
    under = next((r for r in rows if r["phase"] == "abuse"), {})
    return {"table": rows, "abuse": outcomes, "expected": {**EXPECTED, "large": "200"},
            "unexpected": unexpected(outcomes),
            "params": {k: getattr(args, k) for k in ("duration_s", "large_mb", "large_count",
                                                    "limit_mb", "header_timeout_s",
                                                    "quiet_s", "settle_s")},
            "http_options": options,
            "normal_success_under_abuse": under.get("normal_success"),
            "own_mb": {"baseline": baseline["settled_own_mb"], "after": last["settled_own_mb"]},
            "uss_mb": {"baseline": baseline["settled_uss_mb"], "after": last["settled_uss_mb"]},
            "phases": [phase.plot() for phase in phases]}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration-s", type=float, default=60.0, help="the abuse phase")
    p.add_argument("--large-mb", type=int, default=48, help="legitimate large bodies, MiB")
    p.add_argument("--large-count", type=int, default=16)
    p.add_argument("--limit-mb", type=int, default=64, help="max_request_body_bytes, MiB")
    p.add_argument("--header-timeout-s", type=float, default=30.0,
                   help="request_header_timeout_s")
    p.add_argument("--quiet-s", type=float, default=10.0,
                   help="the quiet phases (before and after), each")
    p.add_argument("--settle-s", type=float, default=5.0,
                   help="the wait before a phase's settled memory")
    p.add_argument("--smoke", action="store_true",
                   help="--quiet-s 0.5 --settle-s 0.75 --duration-s 1 --large-mb 8 "
                   "--large-count 2 --header-timeout-s 1 unless given: what the test suite "
                   "runs")
    return p


def main() -> int:
    args = parse_args(_parser(), SMOKE)
    phases, rows, outcomes, options = measure(args)
    report(rows, outcomes, args)
    summary = summarize(phases, rows, outcomes, options, args)
    machine = describe()
    path = record("http_abuse", summary,
                  [{**r, **options, "abuse": json.dumps(outcomes), **machine} for r in rows],
                  smoke=args.smoke)
    print(f"results: {path}")
    problems = broken(rows, outcomes)
    for why in problems:
        print(f"BROKEN: {why}", file=sys.stderr)
    print(json.dumps({"http_abuse": {
        "normal_success_under_abuse": summary["normal_success_under_abuse"],
        "own_mb": summary["own_mb"], "uss_mb": summary["uss_mb"], "abuse": outcomes}}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
