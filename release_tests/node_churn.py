"""Failed requests while nodes drain and rejoin, on a local multi-node Ray.

``python -m release_tests.node_churn [--events 20] [--rate 50] [--ingress proxy|haproxy]
[--drain-timeout-s 15]`` starts a 3-node Ray on this machine (``fleetplane.cli_cluster``:
head 127.0.0.2 without the "pool" resource, workers 127.0.0.3 and 127.0.0.4 with it),
deploys a 2-replica deployment that needs "pool" (so its replicas live on the workers),
keeps a steady POST load on the head's listener, and per event sends SIGTERM to one
worker's ``ray start --block`` process, as a spot interruption or a pod deletion does
(Ray drains the node for ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S``), then starts that
worker again once it is gone. Workers alternate, so every event moves every replica that
is on the drained node.

Per event: requests failed (goal 0), time from SIGTERM to the drained node holding no
replica with 2 RUNNING elsewhere, and to the rejoined node's listener ready. Prints a
table, writes Parquet under ``release_tests/results/``, ends with a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import traceback
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fleetplane.cli_cluster import forget_ray_address, start_node, wait_ready
from release_tests.drain_events import Load

HEAD_IP, WORKERS, GCS_PORT, APP = "127.0.0.2", ("127.0.0.3", "127.0.0.4"), 6391, "churn"


@dataclass
class Event:
    index: int
    node: str
    replicas_on_node: int
    moved_s: float = 0.0  # SIGTERM -> none left on the node, 2 RUNNING elsewhere
    rejoined_s: float = 0.0  # SIGTERM -> the restarted node's listener ready
    sent: int = 0
    failed: int = 0
    failures: str = ""


class LocalNodes:
    """The cluster's ``ray start --block`` processes, by ip."""

    def __init__(self, logs: Path, drain_timeout_s: float) -> None:
        self._logs, self.procs = logs, {}
        self._env = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(drain_timeout_s)}
        self.agent_ports = {ip: 52400 + i for i, ip in enumerate((HEAD_IP, *WORKERS))}

    def start(self, ip: str) -> None:
        head = None if ip == HEAD_IP else f"{HEAD_IP}:{GCS_PORT}"
        log = self._logs / f"{ip}.log"
        proc = start_node(ip, head, GCS_PORT, 2, {} if head is None else {"pool": 4},
                          self.agent_ports[ip], log, env=self._env)
        self.procs[ip] = proc
        if not wait_ready(ip, self.agent_ports[ip], proc, log):
            raise SystemExit(f"node {ip} did not start; see {log}")

    def drain(self, ip: str) -> None:
        self.procs[ip].send_signal(signal.SIGTERM)

    def wait_gone(self, ip: str, timeout_s: float = 120.0) -> None:
        self.procs[ip].wait(timeout_s)

    def stop_all(self) -> None:
        for ip in (*WORKERS, HEAD_IP):
            proc = self.procs.get(ip)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except Exception:
                    proc.kill()


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


def run_event(index: int, client, nodes: LocalNodes, load: Load) -> Event:
    ip = WORKERS[index % 2]
    status = client.status()
    node_id = _node_id(status, ip)
    event = Event(index, ip, sum(r["node_id"] == node_id for r in _replicas(status)))
    start = time.monotonic()
    nodes.drain(ip)
    _poll(client, lambda s: len(_replicas(s)) == 2 and all(
        r["state"] == "RUNNING" and r["node_id"] != node_id for r in _replicas(s)),
        90, "replicas moved off the drained node")
    event.moved_s = time.monotonic() - start
    nodes.wait_gone(ip)
    nodes.start(ip)
    _poll(client, _listener_ready(ip), 90, "the rejoined node's listener ready")
    event.rejoined_s = time.monotonic() - start
    time.sleep(0.5)  # replies to requests sent during the event still count
    event.sent, event.failed, event.failures = load.between(start, time.monotonic())
    print(f"  {index:3d} drain {ip} ({event.replicas_on_node} replica(s)): moved in "
          f"{event.moved_s:5.1f}s, rejoined in {event.rejoined_s:5.1f}s, failed "
          f"{event.failed}/{event.sent} {event.failures}", flush=True)
    return event


def report(events: list[Event], ingress: str, rate: float) -> dict:
    from release_tests.machine import describe_line

    moved = [e.moved_s for e in events if e.replicas_on_node]
    summary = {"events": len(events), "ingress": ingress, "rate": rate,
               "failed": sum(e.failed for e in events), "sent": sum(e.sent for e in events),
               "events_with_errors": sum(1 for e in events if e.failed),
               "moved_s_median": statistics.median(moved) if moved else None,
               "rejoined_s_median": statistics.median(e.rejoined_s for e in events)}
    print(f"\nnode_churn: {len(events)} drains ({ingress} ingress, {rate:g} POST/s) on "
          f"{describe_line()}\nfailed {summary['failed']} of {summary['sent']} requests "
          f"({summary['events_with_errors']} event(s) with errors); drain notice -> "
          f"replicas moved: median {summary['moved_s_median']:.2f} s; -> node back and "
          f"ready: median {summary['rejoined_s_median']:.1f} s")
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(__file__).with_name("results")
    out.mkdir(exist_ok=True)
    path = out / f"node_churn_{ingress}_{int(time.time())}.parquet"
    pq.write_table(pa.Table.from_pylist([asdict(e) for e in events]), path)
    print(f"records: {path}")
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=20)
    p.add_argument("--rate", type=float, default=50.0, help="POSTs per second")
    p.add_argument("--ingress", choices=["proxy", "haproxy"], default="proxy")
    p.add_argument("--drain-timeout-s", type=float, default=15.0,
                   help="RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S of the workers")
    p.add_argument("--http-port", type=int, default=8013)
    args = p.parse_args()
    nodes = LocalNodes(Path(tempfile.mkdtemp(prefix="node_churn_")), args.drain_timeout_s)
    try:
        for ip in (HEAD_IP, *WORKERS):
            nodes.start(ip)
        os.environ["RAY_AUTH_MODE"] = "token"  # before Ray is imported: it joins
        import ray

        from controlplane.instance import Client

        ray.init(address=f"{HEAD_IP}:{GCS_PORT}", namespace="fleetplane", log_to_driver=False)
        client = Client()
        client.start_controller()
        _deploy(client, args.http_port, args.ingress)
        _poll(client, lambda s: len(_replicas(s)) == 2 and all(
            r["state"] == "RUNNING" for r in _replicas(s)) and all(
            _listener_ready(ip)(s) for ip in (HEAD_IP, *WORKERS)), 120, "deployed")
        load = Load(args.http_port, args.rate, host=HEAD_IP, path=f"/{APP}")
        load.start()
        time.sleep(2.0)
        events = [run_event(i, client, nodes, load) for i in range(args.events)]
        load.stop()
        summary = report(events, args.ingress, args.rate)
        client.shutdown(timeout_s=30)
        print(json.dumps({"node_churn": summary}))
    except BaseException:  # said before the nodes stop: Ray may exit the process then
        traceback.print_exc()
        sys.stdout.flush()
        raise
    finally:
        nodes.stop_all()
        forget_ray_address(f"{HEAD_IP}:{GCS_PORT}")


if __name__ == "__main__":
    main()
