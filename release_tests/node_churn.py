"""Failed requests while nodes drain and rejoin, on a local multi-node Ray.

``python -m release_tests.node_churn [--events 20] [--rate 50] [--ingress proxy|haproxy]
[--drain-timeout-s 15] [--smoke]`` starts a 3-node Ray on this machine
(``fleetplane.cli_cluster``: head 127.0.0.2 without the "pool" resource, workers 127.0.0.3
and 127.0.0.4 with it), deploys a 2-replica deployment that needs "pool" (so its replicas
live on the workers), keeps a steady POST load on the head's listener, and per event sends
SIGTERM to one worker's ``ray start --block`` process, as a spot interruption or a pod
deletion does (Ray drains the node for ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S``), then
starts that worker again once it is gone. Workers alternate, so every event moves every
replica that is on the drained node.

Per event: requests failed (goal 0), time from SIGTERM to the drained node holding no
replica with 2 RUNNING elsewhere, and to the rejoined node's listener ready. A node whose
start fails is started once more (Ray 2.60's raylet gives up when its dashboard agent is
not up within 15 s, which CPU contention can cause); the attempts are recorded.

Prints a table and records it with ``release_tests.results.record``: the summary holds
``table`` (events, ingress, rate, drain timeout, requests sent and failed, events with
errors, events not recovered, median moved and rejoined times), ``events`` (each: node,
replicas on it, at_s, duration_s, moved_s, rejoined_s, sent, failed, failures,
start_attempts, recovered, error), ``timelines`` (per event, requests, failures and
latency per bin from its SIGTERM to its end: the plot), ``phases_s`` (seconds to start
the cluster, deploy, run the events, shut down, stop the nodes), ``http_port``,
``replicas`` and ``workers``; the rows are the events. Ends with a JSON line. Exits 1
when an event did not recover (replicas not moved, or the node not back, within its
bound; the run stops there), an event got no answer at all, or no event ran. Failed
requests are measured, not checked: the exit status does not depend on them.

``--smoke``: one drain (``--events 1``), at 20 POST/s, with a 5 s drain timeout, unless
given: the same code path, what the test suite runs (about 40 s on 2 cores: three Ray
nodes start one after the other, and one restarts). The default run takes about 25 s per
event (the drained node's 15 s drain included), about 9 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from fleetplane.cli_cluster import forget_ray_address, start_node, wait_ready
from release_tests.drain_events import Load
from release_tests.plot_data import timeline
from release_tests.results import parse_args, record

HEAD_IP, WORKERS, GCS_PORT, APP = "127.0.0.2", ("127.0.0.3", "127.0.0.4"), 6391, "churn"
SMOKE = {"events": 1, "rate": 20.0, "drain_timeout_s": 5.0}


@dataclass
class Event:
    index: int
    node: str
    replicas_on_node: int
    at_s: float = 0.0  # its SIGTERM, from the load's start
    duration_s: float = 0.0  # SIGTERM -> the end of its window (rejoined + 0.5 s)
    moved_s: float = 0.0  # SIGTERM -> none left on the node, 2 RUNNING elsewhere
    rejoined_s: float = 0.0  # SIGTERM -> the restarted node's listener ready
    sent: int = 0
    failed: int = 0
    failures: str = ""
    start_attempts: int = 0  # starts of the node until one came up (Ray's, not ours)
    recovered: bool = False  # replicas moved and the node back, each within its bound
    error: str = ""  # what did not recover


class LocalNodes:
    """The cluster's ``ray start --block`` processes, by ip."""

    def __init__(self, logs: Path, drain_timeout_s: float) -> None:
        self._logs, self.procs, self.starts = logs, {}, {}
        self._env = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(drain_timeout_s)}
        self.agent_ports = {ip: 52400 + i for i, ip in enumerate((HEAD_IP, *WORKERS))}

    def start(self, ip: str, attempts: int = 2) -> int:
        """Start this node; return once it is healthy, with the attempts it took. A start
        that failed is tried again, ``attempts`` times in all: under CPU contention Ray
        2.60's raylet gives up when its dashboard agent is not up within 15 s. (One node
        at a time: two nodes starting together on one machine can race for the same
        socket name.)"""
        head = None if ip == HEAD_IP else f"{HEAD_IP}:{GCS_PORT}"
        for attempt in range(1, attempts + 1):
            self.starts[ip] = self.starts.get(ip, 0) + 1
            proc = self.procs[ip] = start_node(
                ip, head, GCS_PORT, 2, {} if head is None else {"pool": 4},
                self.agent_ports[ip], self._log(ip), env=self._env)
            if wait_ready(ip, self.agent_ports[ip], proc, self._log(ip)):
                return attempt
            if proc.poll() is None:  # not healthy in time: stop it
                proc.send_signal(signal.SIGTERM)
            self._end(proc)
            print(f"  node {ip} did not start (attempt {attempt}; see {self._log(ip)})",
                  flush=True)
        raise RuntimeError(f"node {ip} did not start in {attempts} attempts; see "
                           f"{self._log(ip)}")

    def _log(self, ip: str) -> Path:
        """This start's log: every start of a node has its own."""
        return self._logs / f"{ip}.{self.starts.get(ip, 1)}.log"

    def drain(self, ip: str) -> None:
        self.procs[ip].send_signal(signal.SIGTERM)

    def wait_gone(self, ip: str, timeout_s: float = 120.0) -> None:
        self.procs[ip].wait(timeout_s)

    def stop_all(self) -> None:
        """SIGTERM to the workers together, then to the head."""
        for group in (WORKERS, (HEAD_IP,)):
            running = [p for p in map(self.procs.get, group) if p is not None and p.poll() is None]
            for proc in running:
                proc.send_signal(signal.SIGTERM)
            for proc in running:
                self._end(proc)

    @staticmethod
    def _end(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
        """Wait for a node's process to end (SIGTERM sent, or it failed); killed after
        ``timeout_s``."""
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _deploy(client, http_port: int, ingress: str) -> None:
    from controlplane.config.schema import parse_deploy_config

    dep = {"name": "DrainModel", "num_replicas": 2, "max_ongoing_requests": 32,
           "health_check_period_s": 1.0, "graceful_shutdown_timeout_s": 5.0,
           "ray_actor_options": {"num_cpus": 0, "resources": {"pool": 1}}}
    client.deploy(parse_deploy_config({
        "applications": [{"name": APP, "route_prefix": f"/{APP}", "deployments": [dep],
                          "import_path": "release_tests.drain_app:DrainModel"}],
        "http_options": {"host": "node_ip", "port": http_port, "ingress": ingress,
                         "proxies_per_node": 2}}))


def _poll(client, predicate, timeout_s: float, what: str) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = client.status()
        if predicate(status):
            return status
        time.sleep(0.1)
    raise TimeoutError(f"{what} within {timeout_s}s")


def _replicas(status: dict) -> list[dict]:
    return status["applications"].get(APP, {}).get("deployments", {}).get(
        "DrainModel", {}).get("replicas", [])


def _node_id(status: dict, ip: str) -> str | None:
    return next((n["node_id"] for n in status["nodes"] if n["address"] == ip and n["alive"]),
                None)


def _listener_ready(ip: str):
    def check(status: dict) -> bool:
        return any(n["address"] == ip and n["alive"] and n["proxy"] and n["proxy"]["ready"]
                   for n in status["nodes"])
    return check


def _drain_and_rejoin(event: Event, node_id: str | None, client, nodes: LocalNodes,
                      start: float) -> None:
    nodes.drain(event.node)
    _poll(client, lambda s: len(_replicas(s)) == 2 and all(
        r["state"] == "RUNNING" and r["node_id"] != node_id for r in _replicas(s)),
        90, "replicas moved off the drained node")
    event.moved_s = round(time.monotonic() - start, 3)
    nodes.wait_gone(event.node)
    event.start_attempts = nodes.start(event.node)
    _poll(client, _listener_ready(event.node), 90, "the rejoined node's listener ready")
    event.rejoined_s = round(time.monotonic() - start, 3)
    event.recovered = True


def run_event(index: int, client, nodes: LocalNodes, load: Load) -> Event:
    ip = WORKERS[index % 2]
    status = client.status()
    node_id = _node_id(status, ip)
    event = Event(index, ip, sum(r["node_id"] == node_id for r in _replicas(status)))
    start = time.monotonic()
    event.at_s = round(start - load.started, 3)
    try:
        _drain_and_rejoin(event, node_id, client, nodes, start)
    except (TimeoutError, RuntimeError, subprocess.TimeoutExpired) as e:
        event.error = f"{type(e).__name__}: {e}"
    time.sleep(0.5)  # replies to requests sent during the event still count
    event.duration_s = round(time.monotonic() - start, 3)
    event.sent, event.failed, event.failures = load.between(start, start + event.duration_s)
    print(f"  {index:3d} drain {ip} ({event.replicas_on_node} replica(s)): moved in "
          f"{event.moved_s:5.1f}s, rejoined in {event.rejoined_s:5.1f}s, failed "
          f"{event.failed}/{event.sent} {event.failures}"
          + ("" if event.recovered else f" NOT RECOVERED: {event.error}"), flush=True)
    return event


def churn(args: argparse.Namespace, nodes: LocalNodes, took: dict) -> tuple[list[Event], Load]:
    """The cluster up, the deployment on it, the load on, the events in turn; stops at
    the first event that did not recover. Ray is shut down before it returns. ``took``:
    seconds per phase (cluster, deploy, events, shutdown)."""
    mark = time.monotonic()
    for ip in (HEAD_IP, *WORKERS):
        nodes.start(ip)
    os.environ["RAY_AUTH_MODE"] = "token"  # before Ray is imported: it joins
    import ray

    from controlplane.instance import Client

    ray.init(address=f"{HEAD_IP}:{GCS_PORT}", namespace="fleetplane", log_to_driver=False)
    client = Client()
    client.start_controller()
    mark = _took(took, "cluster_s", mark)
    try:
        _deploy(client, args.http_port, args.ingress)
        _poll(client, lambda s: len(_replicas(s)) == 2 and all(
            r["state"] == "RUNNING" for r in _replicas(s)) and all(
            _listener_ready(ip)(s) for ip in (HEAD_IP, *WORKERS)), 120, "deployed")
        mark = _took(took, "deploy_s", mark)
        load = Load(args.http_port, args.rate, host=HEAD_IP, path=f"/{APP}")
        load.start()
        time.sleep(2.0)
        events: list[Event] = []
        while len(events) < args.events and (not events or events[-1].recovered):
            events.append(run_event(len(events), client, nodes, load))
        load.stop()
        mark = _took(took, "events_s", mark)
    finally:
        client.shutdown(timeout_s=30)
        ray.shutdown()  # before the nodes stop: a driver whose GCS is gone may be ended
        _took(took, "shutdown_s", mark)
    return events, load


def _took(took: dict, phase: str, since: float) -> float:
    now = time.monotonic()
    took[phase] = round(now - since, 2)
    return now


def report(events: list[Event], args: argparse.Namespace) -> dict:
    """Prints the table; returns it."""
    from release_tests.machine import describe_line

    moved = [e.moved_s for e in events if e.replicas_on_node and e.recovered]
    rejoined = [e.rejoined_s for e in events if e.recovered]
    table = {"events": len(events), "ingress": args.ingress, "rate": args.rate,
             "drain_timeout_s": args.drain_timeout_s,
             "failed": sum(e.failed for e in events), "sent": sum(e.sent for e in events),
             "events_with_errors": sum(1 for e in events if e.failed),
             "events_not_recovered": sum(1 for e in events if not e.recovered),
             "moved_s_median": statistics.median(moved) if moved else None,
             "rejoined_s_median": statistics.median(rejoined) if rejoined else None}
    print(f"\nnode_churn: {len(events)} drains ({args.ingress} ingress, {args.rate:g} POST/s, "
          f"drain timeout {args.drain_timeout_s:g} s) on {describe_line()}\n"
          f"failed {table['failed']} of {table['sent']} requests "
          f"({table['events_with_errors']} event(s) with errors, "
          f"{table['events_not_recovered']} not recovered); drain notice -> replicas moved: "
          f"median {_s(table['moved_s_median'], 2)}; -> node back and ready: median "
          f"{_s(table['rejoined_s_median'], 1)}")
    return table


def _s(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f} s"


def timelines(events: list[Event], load: Load) -> list[dict]:
    """Per event, what the clients saw from its SIGTERM to its end (at most 60 bins)."""
    return [{"index": e.index, "node": e.node, "failed": e.failed, "sent": e.sent,
             "moved_s": e.moved_s, "rejoined_s": e.rejoined_s,
             "timeline": timeline(load.results, load.started + e.at_s,
                                  load.started + e.at_s + e.duration_s, points=60)}
            for e in events]


def broken(events: list[Event], wanted: int) -> list[str]:
    """Why the run does not count: nothing ran, an event measured nothing, or did not
    recover."""
    why = [] if events else [f"no event ran (--events {wanted})"]
    why += [f"event {e.index} ({e.node}): no request answered" for e in events if not e.sent]
    why += [f"event {e.index} ({e.node}) did not recover: {e.error}" for e in events
            if not e.recovered]
    return why


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=20)
    p.add_argument("--rate", type=float, default=50.0, help="POSTs per second")
    p.add_argument("--ingress", choices=["proxy", "haproxy"], default="proxy")
    p.add_argument("--drain-timeout-s", type=float, default=15.0,
                   help="RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S of the workers")
    p.add_argument("--http-port", type=int, default=8013)
    p.add_argument("--smoke", action="store_true",
                   help="--events 1 --rate 20 --drain-timeout-s 5 unless given: what the "
                   "test suite runs")
    return p


def main() -> int:
    args = parse_args(_parser(), SMOKE)
    nodes = LocalNodes(Path(tempfile.mkdtemp(prefix="node_churn_")), args.drain_timeout_s)
    took: dict[str, float] = {}
    try:
        events, load = churn(args, nodes, took)
    except BaseException:  # said before the nodes stop: Ray may exit the process then
        traceback.print_exc()
        sys.stdout.flush()
        raise
    finally:
        mark = time.monotonic()
        nodes.stop_all()
        forget_ray_address(f"{HEAD_IP}:{GCS_PORT}")
        _took(took, "nodes_stop_s", mark)
    table = report(events, args)
    summary = {"table": table, "events": [asdict(e) for e in events],
               "timelines": timelines(events, load), "phases_s": took,
               "http_port": args.http_port, "replicas": 2, "workers": list(WORKERS)}
    path = record("node_churn", summary,
                  [{**asdict(e), "ingress": args.ingress, "rate": args.rate} for e in events],
                  smoke=args.smoke)
    print(f"results: {path}")
    problems = broken(events, args.events)
    for why in problems:
        print(f"BROKEN: {why}", file=sys.stderr)
    print(json.dumps({"node_churn": table}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
