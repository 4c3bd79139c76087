"""Client errors per scale-down, rollout, replacement and reload in haproxy mode.

``python -m release_tests.drain_events [--events 100] [--rate 50] [--no-phase-1] [--smoke]``
starts an embedded Ray and a fleetplane instance in ``http_options.ingress: haproxy``
(a real HAProxy) with a 4-replica deployment, keeps a steady load of short requests on it
(POSTs, as LLM completions are) over keep-alive connections, and runs the events in
turn:

- ``scale``: 4 -> 2 -> 4 replicas;
- ``rollout``: a code change (new ``args``), a rolling replacement;
- ``replace``: one replica made to fail its health checks, replaced by the shard;
- ``reload``: a long stream opened, a route added or removed (HAProxy reloads; the old
  worker lives on for the stream), then 4 -> 3 -> 4 while that old worker is alive; the
  stream must arrive whole.

Every failed request is charged to the event running when it was answered. Afterwards
it times idle scale-downs (4 -> 2, no load): from the deploy to the two replicas gone.
``--no-phase-1`` turns phase 1 of a replica's stop off (``ReplicaSettings.
deregister_before_stop``) to show what it prevents. Prints a table per event kind,
records it with every event, the idle scale-down times and a timeline per kind (requests,
failures and latency per 0.25 s bin over its first event and its worst: the plot) with
``release_tests.results.record``, ends with a JSON line; exits 1 when an event got no
answer at all. ``--smoke``: one scale event and one idle scale-down.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass

from release_tests.plot_data import timeline
from release_tests.results import parse_args, record

KINDS = ("scale", "rollout", "replace", "reload")
APP, DEPLOYMENT = "drain", "DrainModel"
SMOKE = {"events": 1, "kinds": "scale", "idle_scale_downs": 1}


@dataclass
class Event:
    kind: str
    index: int
    at_s: float = 0.0  # its start, from the load's
    duration_s: float = 0.0
    sent: int = 0
    failed: int = 0
    failures: str = ""  # "502 x2, RemoteDisconnected x1"
    stream_ok: bool | None = None  # reload events: the long stream arrived whole


class Load:
    """``threads`` keep-alive connections, each sending POSTs at ``rate / threads``/s (as
    LLM completions are: HAProxy does not replay a POST a replica received). Records
    (t, ok, why, latency_s) per answer."""

    def __init__(self, port: int, rate: float, threads: int = 8, host: str = "127.0.0.1",
                 path: str = f"/{APP}") -> None:
        self._port, self._period, self._threads = port, threads / rate, threads
        self._host, self._path = host, path
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.results: list[tuple[float, bool, str, float]] = []
        self.started = 0.0

    def start(self) -> None:
        self.started = time.monotonic()
        for i in range(self._threads):
            threading.Thread(target=self._run, args=(i,), daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self, offset: int) -> None:
        conn = http.client.HTTPConnection(self._host, self._port, timeout=30)
        next_at = time.monotonic() + offset * self._period / self._threads
        while not self._stop.is_set():
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += self._period
            sent_at = time.monotonic()
            try:
                conn.request("POST", self._path, body=b'{"prompt": "x"}',
                             headers={"Content-Type": "application/json"})
                reply = conn.getresponse()
                reply.read()
                ok, why = reply.status == 200, str(reply.status)
            except Exception as e:  # reset, refused, closed: a client-visible error
                ok, why = False, type(e).__name__
                conn.close()
                conn = http.client.HTTPConnection(self._host, self._port, timeout=30)
            now = time.monotonic()
            with self._lock:
                self.results.append((now, ok, why, now - sent_at))

    def between(self, start: float, end: float) -> tuple[int, int, str]:
        with self._lock:
            window = [(ok, why) for t, ok, why, _ in self.results if start <= t < end]
        failures = Counter(why for ok, why in window if not ok)
        return (len(window), sum(failures.values()),
                ", ".join(f"{why} x{n}" for why, n in failures.most_common()))


class Stream(threading.Thread):
    """One long streamed GET; ``ok`` once every tick arrived."""

    def __init__(self, port: int, seconds: float) -> None:
        super().__init__(daemon=True)
        self._port, self._seconds, self.ok = port, seconds, False

    def run(self) -> None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=60)
            conn.request("GET", f"/{APP}/stream?s={self._seconds}")
            body = conn.getresponse().read().decode()
            ticks = max(1, int(self._seconds / 0.2))
            self.ok = body == "".join(f"tick{i}\n" for i in range(ticks))
        except Exception:
            self.ok = False


class Fleet:
    """The instance under test and the deploys the events send."""

    def __init__(self, client, port: int, window_s: float) -> None:
        self.client, self.port, self._window_s = client, port, window_s
        self.replicas, self.version, self.extra = 4, 1, False

    def deploy(self) -> None:
        from controlplane.config.schema import parse_deploy_config

        deps = [{"name": DEPLOYMENT, "num_replicas": self.replicas, "max_ongoing_requests": 32,
                 "health_check_period_s": 1.0, "graceful_shutdown_timeout_s": 10.0,
                 "ray_actor_options": {"num_cpus": 0}}]
        apps = [{"name": APP, "route_prefix": f"/{APP}", "deployments": deps,
                 "import_path": "release_tests.drain_app:DrainModel",
                 "args": {"version": f"v{self.version}"}}]
        if self.extra:
            apps.append({**apps[0], "name": "extra", "route_prefix": "/extra",
                         "deployments": [{**deps[0], "num_replicas": 1}]})
        self.client.deploy(parse_deploy_config({
            "applications": apps, "controller_options": {"num_shards": 2},
            "http_options": {"host": "127.0.0.1", "port": self.port, "ingress": "haproxy",
                             "deregistration_window_s": self._window_s}}))

    def replicas_now(self) -> list[dict]:
        status = self.client.status()
        dep = status["applications"].get(APP, {}).get("deployments", {}).get(DEPLOYMENT)
        return dep["replicas"] if dep else []

    def ids(self) -> frozenset[str]:
        return frozenset(r["replica_id"] for r in self.replicas_now())

    def wait_settled(self, gone: frozenset[str] = frozenset(), timeout_s: float = 120.0) -> None:
        """Exactly ``replicas`` RUNNING at one version, none of ``gone`` among them, and
        HAProxy serving exactly those (and the extra app's)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.client.status()
            dep = status["applications"].get(APP, {}).get("deployments", {}).get(DEPLOYMENT)
            reps = dep["replicas"] if dep else []
            nodes = status["controller"].get("haproxy") or [{}]
            if (len(reps) == self.replicas and all(r["state"] == "RUNNING" for r in reps)
                    and len({r["version"] for r in reps}) == 1
                    and not gone & {r["replica_id"] for r in reps}
                    and nodes[0].get("servers") == self.replicas + int(self.extra)):
                return
            time.sleep(0.1)
        raise TimeoutError(f"not settled at {self.replicas} replicas: {self.replicas_now()}")

    def workers(self) -> int:
        nodes = self.client.status()["controller"].get("haproxy") or [{}]
        return nodes[0].get("workers") or 0


# ---- the events -------------------------------------------------------------------------
def _scale(fleet: Fleet, low: int) -> None:
    fleet.replicas = low
    fleet.deploy()
    fleet.wait_settled()
    fleet.replicas = 4
    fleet.deploy()
    fleet.wait_settled()


def _rollout(fleet: Fleet) -> None:
    before = fleet.ids()
    fleet.version += 1
    fleet.deploy()
    fleet.wait_settled(gone=before)


def _replace(fleet: Fleet) -> None:
    before = fleet.ids()
    conn = http.client.HTTPConnection("127.0.0.1", fleet.port, timeout=30)
    conn.request("GET", f"/{APP}/sick")
    assert conn.getresponse().read() == b"sick"
    deadline = time.monotonic() + 60  # wait for the sick one to be replaced
    while not before - fleet.ids() and time.monotonic() < deadline:
        time.sleep(0.1)
    fleet.wait_settled(gone=before - fleet.ids())


def _reload(fleet: Fleet) -> bool:
    """A route change reloads HAProxy while a stream holds the old worker; a scale-down
    and back runs while that old worker lives. The stream's verdict."""
    stream = Stream(fleet.port, seconds=8.0)
    stream.start()
    time.sleep(0.5)  # the stream is on the current worker
    fleet.extra = not fleet.extra
    fleet.deploy()
    fleet.wait_settled()
    _scale(fleet, 3)
    stream.join(60)
    return stream.ok


def run_events(fleet: Fleet, load: Load, count: int, kinds: tuple[str, ...]) -> list[Event]:
    events = []
    for index in range(count):
        kind = kinds[index % len(kinds)]
        start = time.monotonic()
        event = Event(kind, index, at_s=round(start - load.started, 3))
        if kind == "scale":
            _scale(fleet, 2)
        elif kind == "rollout":
            _rollout(fleet)
        elif kind == "replace":
            _replace(fleet)
        else:
            event.stream_ok = _reload(fleet)
        time.sleep(0.5)  # replies to requests sent during the event still count
        end = time.monotonic()
        event.duration_s = end - start
        event.sent, event.failed, event.failures = load.between(start, end)
        events.append(event)
        print(f"  {index:3d} {kind:8s} {event.duration_s:5.1f}s failed {event.failed}/"
              f"{event.sent} {event.failures}"
              + ("" if event.stream_ok is None else f" stream {'ok' if event.stream_ok else 'BROKEN'}"),
              flush=True)
    return events


def idle_scale_downs(fleet: Fleet, times: int) -> list[float]:
    """No load: seconds from a 4 -> 2 deploy's return (the config is built and committed)
    until the two leaving replicas are gone and HAProxy serves the other two."""
    took = []
    for _ in range(times):
        fleet.replicas = 2
        fleet.deploy()
        start = time.monotonic()
        fleet.wait_settled()
        took.append(time.monotonic() - start)
        fleet.replicas = 4
        fleet.deploy()
        fleet.wait_settled()
    return took


# ---- report -----------------------------------------------------------------------------
def report(events: list[Event], idle_s: list[float], phase1: bool, window_s: float) -> dict:
    """Prints the table; returns it (the last line's JSON)."""
    from release_tests.machine import describe_line

    print(f"\ndrain_events: {len(events)} events, phase 1 {'on' if phase1 else 'OFF'}, "
          f"on {describe_line()}")
    print(f"{'event':8s} {'count':>5s} {'failed':>7s} {'sent':>7s} {'with errors':>11s} "
          f"{'duration s (median)':>20s}")
    summary: dict = {"phase1": phase1}
    for kind in KINDS:
        mine = [e for e in events if e.kind == kind]
        if not mine:
            continue
        row = {"events": len(mine), "failed": sum(e.failed for e in mine),
               "sent": sum(e.sent for e in mine),
               "events_with_errors": sum(1 for e in mine if e.failed),
               "duration_s_median": statistics.median(e.duration_s for e in mine)}
        if kind == "reload":
            row["streams_broken"] = sum(1 for e in mine if not e.stream_ok)
        summary[kind] = row
        print(f"{kind:8s} {row['events']:5d} {row['failed']:7d} {row['sent']:7d} "
              f"{row['events_with_errors']:11d} {row['duration_s_median']:20.1f}")
    summary["failed_total"] = sum(e.failed for e in events)
    if idle_s:
        summary["idle_scale_down_s_median"] = statistics.median(idle_s)
        print(f"idle scale-down 4 -> 2 (deploy returned -> both gone), median of "
              f"{len(idle_s)}: {statistics.median(idle_s):.2f} s "
              f"(deregistration_window_s {window_s}; goal <= {window_s + 1:.1f} s)")
    return summary


def timelines(events: list[Event], load: Load) -> list[dict]:
    """Per kind, the timeline of its first event and of its worst (most failed requests)
    when that is another: what a drain looks like to the clients, a few hundred points in
    all."""
    chosen = []
    for kind in KINDS:
        mine = [e for e in events if e.kind == kind]
        if not mine:
            continue
        worst = max(mine, key=lambda e: e.failed)
        for label, e in [("first", mine[0])] + ([("worst", worst)]
                                                 if worst is not mine[0] and worst.failed
                                                 else []):
            start = load.started + e.at_s
            chosen.append({"kind": kind, "index": e.index, "which": label,
                           "failed": e.failed, "sent": e.sent,
                           "timeline": timeline(load.results, start, start + e.duration_s,
                                                points=80)})
    return chosen


def broken(events: list[Event]) -> list[str]:
    """An event with no answer at all: the load (or the listener) is not there, so the
    event measured nothing."""
    return [f"{e.kind} event {e.index}: no request answered" for e in events if not e.sent]


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise SystemExit(f"--kinds: unknown event kind(s) {unknown}; choose from {KINDS}")
    return kinds


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=100)
    p.add_argument("--rate", type=float, default=50.0, help="requests per second")
    p.add_argument("--port", type=int, default=8012)
    p.add_argument("--window-s", type=float, default=2.0, help="deregistration_window_s")
    p.add_argument("--idle-scale-downs", type=int, default=5)
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"events to cycle through (default: {','.join(KINDS)})")
    p.add_argument("--no-phase-1", action="store_true",
                   help="turn phase 1 of a replica's stop off, to show what it prevents")
    p.add_argument("--smoke", action="store_true",
                   help="--events 1 --kinds scale --idle-scale-downs 1 unless given: what "
                   "the test suite runs")
    return p


def main() -> int:
    args = parse_args(_parser(), SMOKE)
    kinds = _kinds(args.kinds)

    from controlplane.instance import Client, start_local_ray
    from controlplane.settings import ReplicaSettings, Settings

    phase1 = not args.no_phase_1
    start_local_ray()
    client = Client(Settings(replica=ReplicaSettings(deregister_before_stop=phase1)))
    client.start_controller()
    fleet = Fleet(client, args.port, args.window_s)
    try:
        fleet.deploy()
        fleet.wait_settled()
        load = Load(args.port, args.rate)
        load.start()
        time.sleep(2.0)
        events = run_events(fleet, load, args.events, kinds)
        load.stop()
        time.sleep(1.0)
        idle = idle_scale_downs(fleet, args.idle_scale_downs)
    finally:
        client.shutdown(timeout_s=60)
    table = report(events, idle, phase1, args.window_s)
    summary = {"table": table, "rate": args.rate, "window_s": args.window_s,
               "events": [asdict(e) for e in events], "idle_scale_down_s": idle,
               "timelines": timelines(events, load)}
    name = "drain_events" if phase1 else "drain_events_nophase1"
    path = record(name, summary, [{**asdict(e), "phase1": phase1} for e in events],
                  smoke=args.smoke)
    print(f"results: {path}")
    failed = broken(events)
    for why in failed:
        print(f"BROKEN: {why}", file=sys.stderr)
    print(json.dumps({"drain_events": table}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
