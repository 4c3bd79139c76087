"""Kill control actors and replicas under steady HTTP load; count what it cost.

``python -m release_tests.chaos [--duration-s 300] [--rate 100] [--seed 1] [--haproxy]
[--kinds controller,shard,...] [--smoke]`` starts ``fleetplane run release_tests/chaos.yaml``
(``chaos_haproxy.yaml`` with ``--haproxy``: the per-node HAProxy manager is the "proxy"
killed), its own embedded Ray (and its own instance record, so another ``fleetplane run``
on the machine is neither joined nor disturbed), sends a steady open-loop load of GET
requests to it, and every few seconds SIGKILLs one actor at random of ``--kinds``: the
controller, a shard, the proxy, a replica, a node's metric reporter, or the facade Serve's
tools call (``SERVE_CONTROLLER_ACTOR``); with ``head`` among the kinds (not by default),
on a 3-node cluster with GCS fault tolerance, the head node itself (``chaos_head``: the
load then goes to a worker node's listener). Per kind of kill it reports the requests that
failed in the window after the kill, the replicas restarted
beyond the killed one (compared by actor id), and the time until ``status`` answered
again with every replica RUNNING. Goal (issue 9): 0 failed requests for control actors; for a
replica, only the requests it held.

Prints a table, records it with every kill and the load's timeline (requests and failures
per bin, kills marked: the plot) with ``release_tests.results.record``, ends with one JSON
line; exits 1 when a kill did not recover or the load got no answer. ``--smoke``: one
replica kill after 2 s of load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from release_tests import chaos_head, local_cluster
from release_tests.plot_data import timeline
from release_tests.results import parse_args, record

CONFIG = Path(__file__).with_name("chaos.yaml")
URL = "http://127.0.0.1:8011/chaos"
KINDS = ("controller", "shard", "proxy", "replica", "reporter", "serve_api")
ALL_KINDS = (*KINDS, "head")  # head: on a 3-node cluster with Redis (chaos_head), on request
SMOKE = {"duration_s": 1.0, "every_s": 2.0, "kinds": "replica"}


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
    """Open-loop GETs at ``rate`` per second from a few threads; records (t, ok, why,
    latency_s) per answer."""

    def __init__(self, rate: float, threads: int = 8, url: str = URL) -> None:
        self.rate, self.threads, self.url = rate, threads, url
        self.results: list[tuple[float, bool, str, float]] = []
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
            sent_at = time.monotonic()
            ok, why = _get(self.url)
            now = time.monotonic()
            with self._lock:
                self.results.append((now, ok, why, now - sent_at))

    def between(self, start: float, end: float) -> tuple[int, int, str]:
        """(sent, failed, what the failures were) for requests answered in the window."""
        with self._lock:
            window = [(ok, why) for t, ok, why, _ in self.results if start <= t < end]
        failures = Counter(why for ok, why in window if not ok)
        return (len(window), sum(failures.values()),
                ", ".join(f"{why} x{n}" for why, n in failures.most_common()))


def _get(url: str) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
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
              "reporter": "fleetplane_reporter_",
              "serve_api": "SERVE_CONTROLLER_ACTOR"}[kind]  # Serve's tools' facade
    names = sorted(n for n in actors if n.startswith(prefix))
    return rng.choice(names) if names else None


def _all_running(timeout_s: float, gone: str = "", count: int = 0) -> bool:
    """``status`` (what ``fleetplane status --json`` prints, asked in this process: a new
    CLI process per poll costs seconds of start-up on a small machine, which the recovery
    time would include) answers with every replica RUNNING and every control actor
    alive; ``gone``: a killed replica's id, which must have left status (until the shard
    hears of the death, status still shows it RUNNING), with ``count`` replicas again."""
    from controlplane.instance import Client

    client = Client()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status = client.status()
        except Exception:  # the controller restarting, or not found yet: not recovered
            status = None
        if status is not None:
            reps = [r for a in status["applications"].values()
                    for d in a["deployments"].values() for r in d["replicas"]]
            actors = status["controller"].get("actors", {}).values()
            if reps and all(r["state"] == "RUNNING" for r in reps) and all(
                    a["alive"] for a in actors) and gone not in {r["replica_id"] for r in reps} \
                    and len(reps) >= count:
                return True
        time.sleep(0.25)
    return False


def _start_instance(config: Path, cluster: bool) -> subprocess.Popen:
    """``fleetplane run CONFIG`` with an instance record of its own (the state directory
    chosen in ``run``), joined once all its replicas run; the address comes from that
    record, never Ray's "auto" (the Ray started last on this machine, which may be
    another one). ``cluster``: on the 3-node cluster of ``chaos_head``."""
    extra = chaos_head.RUN_ARGS if cluster else ()
    runner = subprocess.Popen([sys.executable, "-m", "fleetplane.cli", "run", str(config),
                               *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in runner.stdout:
        print("  run:", line.rstrip())
        if "Ctrl-C to stop" in line:
            break
    else:
        raise SystemExit(f"fleetplane run {config} exited ({runner.wait()}) before serving")
    threading.Thread(target=lambda: [print("  run:", x.rstrip()) for x in runner.stdout],
                     daemon=True).start()
    from controlplane.instance_record import resolve_target

    target = resolve_target(None)  # before Ray is imported: it may set RAY_AUTH_MODE
    import ray

    ray.init(address=target, namespace="fleetplane", log_to_driver=False)
    return runner


def run(duration_s: float, rate: float, seed: int, every_s: float, config: Path,
        kinds: tuple[str, ...]) -> tuple[list[Kill], Load, float]:
    """The kills, the load (its answers) and when it started (monotonic)."""
    rng = random.Random(seed)
    os.environ["FLEETPLANE_STATE_DIR"] = tempfile.mkdtemp(prefix="chaos_")  # run inherits it
    cluster = "head" in kinds
    if cluster:
        local_cluster.start()
        config = chaos_head.cluster_config(config)
    try:
        runner = _start_instance(config, cluster)
    except BaseException:  # never leave the cluster behind (it holds the addresses)
        if cluster:
            local_cluster.stop()
        raise
    load = Load(rate, url=chaos_head.URL if cluster else URL)
    load.start()
    kills: list[Kill] = []
    started = time.monotonic()
    try:
        while time.monotonic() - started < duration_s:
            time.sleep(every_s)
            kills.append(_kill_one(rng, started, kinds))
            kill = kills[-1]
            t0 = started + kill.at_s
            gone = kill.name.removeprefix("fleetplane_replica::") if kill.kind == "replica" else ""
            back = _all_running(60, gone, len(_BEFORE) if gone else 0)
            kill.recovered_s = time.monotonic() - t0 if back else None
            time.sleep(1.0)  # requests sent right after recovery still count
            kill.sent, kill.failed, kill.failures = load.between(t0, time.monotonic())
            kill.replicas_restarted = _restarted(kill)
            print(f"  {kill.kind:10s} {kill.name[:44]:44s} failed {kill.failed}/{kill.sent}"
                  f" ({kill.failures or 'none'}) recovered in {kill.recovered_s}")
    finally:
        load.stop()
        runner.send_signal(signal.SIGINT)
        runner.wait(60)
        if cluster:
            local_cluster.stop()
    return kills, load, started


_BEFORE: dict[str, str] = {}


def _kill_one(rng: random.Random, started: float, kinds: tuple[str, ...]) -> Kill:
    actors = _actors()
    _BEFORE.clear()
    _BEFORE.update(_replicas(actors))
    kind = rng.choice(kinds)
    if kind == "head":
        at_s = time.monotonic() - started
        chaos_head.kill_head()
        return Kill(kind, f"head {local_cluster.ADDRESS}", at_s)
    name = _victim(kind, actors, rng)
    if name is None:  # e.g. no node reporter yet: kill something that exists
        present = [k for k in kinds if k != "head" and _victim(k, actors, random.Random(0))]
        if not present:  # the actors' names changed: the harness no longer finds them
            raise RuntimeError(f"no actor of kind {', '.join(kinds)} among {sorted(actors)}")
        kind = rng.choice(present)
        name = _victim(kind, actors, rng)
    os.kill(actors[name]["pid"], signal.SIGKILL)
    return Kill(kind, name, time.monotonic() - started)


def _restarted(kill: Kill) -> int:
    """Replicas alive before the kill that are gone or have a new actor now."""
    now = _replicas(_actors())
    return sum(1 for name, actor_id in _BEFORE.items()
               if name != kill.name and now.get(name) != actor_id)


def report(kills: list[Kill]) -> dict:
    """Prints the table; returns it, by kind."""
    from release_tests.machine import describe_line

    print(f"\nchaos: {len(kills)} kills on {describe_line()}")
    print(f"{'killed':10s} {'kills':>5s} {'failed':>7s} {'sent':>6s} {'replicas restarted':>19s}"
          f" {'recovery s (median)':>20s}")
    summary = {}
    for kind in ALL_KINDS:
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
    return summary


def broken(kills: list[Kill], load: Load) -> list[str]:
    """What says the measured path broke: no kill, a kill not recovered from, no answer."""
    why = [] if kills else ["no kill happened"]
    why += [f"{k.kind} {k.name}: not recovered within 60 s" for k in kills
            if k.recovered_s is None]
    if not any(ok for _, ok, _, _ in load.results):
        why.append("the load got no successful answer")
    return why


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k for k in text.split(",") if k)
    if not kinds or set(kinds) - set(ALL_KINDS):
        raise SystemExit(f"--kinds: unknown {sorted(set(kinds) - set(ALL_KINDS))}; "
                         f"choose from {', '.join(ALL_KINDS)}")
    return kinds


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=300.0)
    p.add_argument("--rate", type=float, default=100.0, help="requests per second")
    p.add_argument("--every-s", type=float, default=8.0, help="seconds between kills")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--haproxy", action="store_true", help="http_options.ingress: haproxy")
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"what may be killed, comma-separated (default: {','.join(KINDS)}; "
                   "head: on a 3-node cluster with Redis, the load on a worker's listener)")
    p.add_argument("--smoke", action="store_true",
                   help="one replica kill after 2 s of load (--duration-s 1 --every-s 2 "
                   "--kinds replica unless given): what the test suite runs")
    return p


def main() -> int:
    args = parse_args(_parser(), SMOKE)
    kinds = _kinds(args.kinds)
    config = CONFIG.with_name("chaos_haproxy.yaml") if args.haproxy else CONFIG
    kills, load, started = run(args.duration_s, args.rate, args.seed, args.every_s, config,
                               kinds)
    by_kind = report(kills)
    end = max([r[0] for r in load.results], default=started)
    summary = {"by_kind": by_kind, "config": config.name, "rate": args.rate,
               "every_s": args.every_s, "seed": args.seed, "kinds": list(kinds),
               "kills": [asdict(k) for k in kills],
               # the plot: requests answered and failed per bin from the load's start,
               # with the kills' at_s above
               "timeline": timeline(load.results, started, end, points=300)}
    name = "chaos_head" if "head" in kinds else "chaos"  # a cluster run: its own record
    path = record(name, summary, [asdict(k) for k in kills], smoke=args.smoke)
    print(f"results: {path}")
    failed = broken(kills, load)
    for why in failed:
        print(f"BROKEN: {why}", file=sys.stderr)
    print(json.dumps({"chaos": by_kind}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
