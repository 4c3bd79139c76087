"""Kill control actors and replicas under steady HTTP load; count what it cost.

``python -m release_tests.chaos [--duration-s 300] [--rate 100] [--seed 1] [--haproxy]``
starts ``fleetplane run release_tests/chaos.yaml`` (``chaos_haproxy.yaml`` with
``--haproxy``: the per-node HAProxy manager is the "proxy" killed), its own embedded Ray,
and sends a steady open-loop load of GET requests to it, and every few seconds SIGKILLs
one actor at random: the controller, a shard, the proxy, a replica, or a node's metric
reporter. Per kind of kill
it reports the requests that failed in the window after the kill, the replicas restarted
beyond the killed one (compared by actor id), and the time until ``status`` answered
again with every replica RUNNING. Goal (issue 9): 0 failed requests for control actors; for a
replica, only the requests it held. Prints a table, writes Parquet under
``release_tests/results/``, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from collections import Counter
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

CONFIG = Path(__file__).with_name("chaos.yaml")
URL = "http://127.0.0.1:8011/chaos"
KINDS = ("controller", "shard", "proxy", "replica", "reporter")


@dataclass
class Kill:
    kind: str
    name: str
    at_s: float
    failed: int = 0
    sent: int = 0
    recovered_s: float | None = None
    replicas_restarted: int = 0
    failures: str = ""  # what the failed requests saw: "ConnectionResetError x2, 502 x1"


class Load:
    """Open-loop GETs at ``rate`` per second from a few threads; records (t, ok)."""

    def __init__(self, rate: float, threads: int = 8) -> None:
        self.rate, self.threads = rate, threads
        self.results: list[tuple[float, bool, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def start(self) -> None:
        for i in range(self.threads):
            threading.Thread(target=self._run, args=(i,), daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self, offset: int) -> None:
        period = self.threads / self.rate
        next_at = time.monotonic() + offset * period / self.threads
        while not self._stop.is_set():
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += period
            ok, why = _get()
            with self._lock:
                self.results.append((time.monotonic(), ok, why))

    def between(self, start: float, end: float) -> tuple[int, int, str]:
        """(sent, failed, what the failures were) for requests answered in the window."""
        with self._lock:
            window = [(ok, why) for t, ok, why in self.results if start <= t < end]
        failures = Counter(why for ok, why in window if not ok)
        return (len(window), sum(failures.values()),
                ", ".join(f"{why} x{n}" for why, n in failures.most_common()))


def _get() -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(URL, timeout=10) as reply:
            return reply.status == 200, str(reply.status)
    except urllib.error.HTTPError as e:
        return False, str(e.code)
    except Exception as e:  # refused, reset, timed out
        return False, type(e).__name__


def _actors() -> dict[str, dict]:
    """Alive named actors by name: pid and actor id, from GCS's actor table (the state API
    needs the dashboard, which the embedded Ray does not start)."""
    import ray._private.state as state

    return {a["Name"]: {"pid": a["Pid"], "actor_id": a["ActorID"]}
            for a in state.actors().values() if a["State"] == "ALIVE" and a["Name"]}


def _replicas(actors: dict[str, dict]) -> dict[str, str]:
    return {n: a["actor_id"] for n, a in actors.items() if n.startswith("fleetplane_replica::")}


def _victim(kind: str, actors: dict[str, dict], rng: random.Random) -> str | None:
    prefix = {"controller": "fleetplane_controller", "shard": "fleetplane_shard_",
              "proxy": "fleetplane_proxy::", "replica": "fleetplane_replica::",
              "reporter": "fleetplane_reporter_"}[kind]
    names = sorted(n for n in actors if n.startswith(prefix))
    return rng.choice(names) if names else None


def _all_running(timeout_s: float) -> bool:
    """``fleetplane status --json`` answers with every replica RUNNING and every control
    actor alive."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run([sys.executable, "-m", "fleetplane.cli", "status", "--json"],
                             capture_output=True, text=True)
        if out.returncode == 0:
            status = json.loads(out.stdout)
            reps = [r for a in status["applications"].values()
                    for d in a["deployments"].values() for r in d["replicas"]]
            actors = status["controller"].get("actors", {}).values()
            if reps and all(r["state"] == "RUNNING" for r in reps) and all(
                    a["alive"] for a in actors):
                return True
        time.sleep(0.5)
    return False


def run(duration_s: float, rate: float, seed: int, every_s: float, config: Path) -> list[Kill]:
    import ray

    rng = random.Random(seed)
    runner = subprocess.Popen([sys.executable, "-m", "fleetplane.cli", "run", str(config)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in runner.stdout:
        print("  run:", line.rstrip())
        if "Ctrl-C to stop" in line:
            break
    threading.Thread(target=lambda: [print("  run:", x.rstrip()) for x in runner.stdout],
                     daemon=True).start()
    ray.init(address="auto", namespace="fleetplane", log_to_driver=False)
    load = Load(rate)
    load.start()
    kills: list[Kill] = []
    started = time.monotonic()
    try:
        while time.monotonic() - started < duration_s:
            time.sleep(every_s)
            kills.append(_kill_one(rng, started))
            kill = kills[-1]
            t0 = started + kill.at_s
            kill.recovered_s = time.monotonic() - t0 if _all_running(60) else None
            time.sleep(1.0)  # requests sent right after recovery still count
            kill.sent, kill.failed, kill.failures = load.between(t0, time.monotonic())
            kill.replicas_restarted = _restarted(kill)
            print(f"  {kill.kind:10s} {kill.name[:44]:44s} failed {kill.failed}/{kill.sent}"
                  f" ({kill.failures or 'none'}) recovered in {kill.recovered_s}")
    finally:
        load.stop()
        runner.send_signal(signal.SIGINT)
        runner.wait(60)
    return kills


_BEFORE: dict[str, str] = {}


def _kill_one(rng: random.Random, started: float) -> Kill:
    actors = _actors()
    _BEFORE.clear()
    _BEFORE.update(_replicas(actors))
    kind = rng.choice(KINDS)
    name = _victim(kind, actors, rng)
    while name is None:  # e.g. no node reporter yet: kill something that exists
        kind = rng.choice(KINDS)
        name = _victim(kind, actors, rng)
    os.kill(actors[name]["pid"], signal.SIGKILL)
    return Kill(kind, name, time.monotonic() - started)


def _restarted(kill: Kill) -> int:
    """Replicas alive before the kill that are gone or have a new actor now."""
    now = _replicas(_actors())
    return sum(1 for name, actor_id in _BEFORE.items()
               if name != kill.name and now.get(name) != actor_id)


def report(kills: list[Kill]) -> dict:
    from release_tests.machine import describe_line

    print(f"\nchaos: {len(kills)} kills on {describe_line()}")
    print(f"{'killed':10s} {'kills':>5s} {'failed':>7s} {'sent':>6s} {'replicas restarted':>19s}"
          f" {'recovery s (median)':>20s}")
    summary = {}
    for kind in KINDS:
        mine = [k for k in kills if k.kind == kind]
        if not mine:
            continue
        times = sorted(k.recovered_s for k in mine if k.recovered_s is not None)
        median = times[len(times) // 2] if times else None
        summary[kind] = {"kills": len(mine), "failed": sum(k.failed for k in mine),
                         "sent": sum(k.sent for k in mine),
                         "replicas_restarted": sum(k.replicas_restarted for k in mine),
                         "recovery_s_median": median}
        s = summary[kind]
        print(f"{kind:10s} {s['kills']:5d} {s['failed']:7d} {s['sent']:6d} "
              f"{s['replicas_restarted']:19d} {f'{median:.2f}' if median is not None else '-':>20}")
    _write_parquet(kills)
    return summary


def _write_parquet(kills: list[Kill]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(__file__).with_name("results")
    out.mkdir(exist_ok=True)
    path = out / f"chaos_{int(time.time())}.parquet"
    pq.write_table(pa.Table.from_pylist([asdict(k) for k in kills]), path)
    print(f"records: {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration-s", type=float, default=300.0)
    p.add_argument("--rate", type=float, default=100.0, help="requests per second")
    p.add_argument("--every-s", type=float, default=8.0, help="seconds between kills")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--haproxy", action="store_true", help="http_options.ingress: haproxy")
    args = p.parse_args()
    config = CONFIG.with_name("chaos_haproxy.yaml") if args.haproxy else CONFIG
    kills = run(args.duration_s, args.rate, args.seed, args.every_s, config)
    print(json.dumps({"chaos": report(kills)}))


if __name__ == "__main__":
    main()
