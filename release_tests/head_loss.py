"""The head node dies under load and comes back: GCS fault tolerance on a real Redis (issue 32).

    python -m release_tests.head_loss [--down-s 30] [--rate 40] [--haproxy]
        [--control-plane-on head|workers] [--smoke]

Starts ``fleetplane start-local-cluster --nodes 3 --redis`` (head 127.0.0.2, workers .3 and
.4, a Redis the head's GCS keeps its state in), ``fleetplane run`` of a 3-replica
deployment on it with a listener per node, and an open-loop load (GET and POST in turn,
``--rate`` per second per listener) on every node's listener. Then the drill:
``start-local-cluster --restart-head --down-s S`` (SIGKILL to the head's Ray processes, S
seconds down, the head started again on the same Redis). Counts, per listener, the requests
that failed while the head was down and after; which replicas were restarted (ids before
and after, by node: one on the head dies with it); the time from the head's return until
``status`` shows the deployment HEALTHY with the replicas that lived; and whether reconcile
acts again (a worker's replica SIGKILLed afterwards is replaced; the requests it held
count in a phase of their own). ``--control-plane-on`` is ``fleetplane run``'s: where the
controller, shards and facade run (recorded as found). Prints a table, records it, exit 1
on a failed bar.
``--smoke``: 5 s down, 10 requests/s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from release_tests.head_loss_load import OpenLoop
from release_tests.local_cluster import ADDRESS, fleetplane
from release_tests import local_cluster
from release_tests.machine import describe_line
from release_tests.results import ROOT, folders, parse_args, record
from release_tests.soak import serving

LISTENERS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


def status() -> dict | None:
    done = fleetplane("status", "--json", "--address", ADDRESS, timeout_s=60)
    return json.loads(done.stdout) if done.returncode == 0 else None


def replicas(s: dict | None) -> dict[str, str]:
    """replica id -> node id, the RUNNING ones."""
    return {r["replica_id"]: r["node_id"] for a in (s or {}).get("applications", {}).values()
            for d in a["deployments"].values() for r in d["replicas"]
            if r["state"] == "RUNNING"}


def healthy(s: dict | None) -> bool:
    deps = [d for a in (s or {}).get("applications", {}).values()
            for d in a["deployments"].values()]
    return bool(deps) and all(d["status"] == "HEALTHY" for d in deps)


def config(haproxy: bool) -> Path:
    path = Path(tempfile.mkdtemp(prefix="head_loss_")) / "head_loss.yaml"
    http = {"host": "node_ip", "port": 8000, "proxies_per_node": 1,
            **({"ingress": "haproxy"} if haproxy else {})}
    path.write_text(json.dumps({"http_options": http, "controller_options": {"num_shards": 2},
                                "applications": [{
                                    "name": "greeter", "route_prefix": "/greet",
                                    "import_path": "deployments.demo_app:echo_app",
                                    "deployments": [{"name": "Echo", "num_replicas": 3,
                                                     "health_check_period_s": 2,
                                                     "ray_actor_options": {"num_cpus": 0}}]}]}))
    return path


def wait_until(check, timeout_s: float) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if check():
            return round(time.monotonic() - started, 1)
        time.sleep(1.0)
    return None


def kill_a_worker_replica(before: dict[str, str], head_node: str) -> str | None:
    code = ("import sys, os, signal, ray\n"
            "ray.init(address=sys.argv[1], log_to_driver=False)\n"
            "for a in ray._private.state.state.actor_table(None).values():\n"
            "    if a['State'] == 'ALIVE' and a['Name'].endswith(sys.argv[2]):\n"
            "        os.kill(a['Pid'], signal.SIGKILL); print('KILLED')\n")
    for replica_id, node in before.items():
        if node != head_node:
            done = subprocess.run([sys.executable, "-c", code, ADDRESS, replica_id],
                                  capture_output=True, text=True, timeout=60, cwd=ROOT)
            return replica_id if "KILLED" in done.stdout else None
    return None


def drill(args: argparse.Namespace, folder: Path) -> dict:
    # soak.serving: `fleetplane run` until every replica runs, stopped as by Ctrl-C after
    with serving(config(args.haproxy), folder / "run.log",
                 args=("--address", ADDRESS, "--serve-api-port", "0",
                       "--control-plane-on", args.control_plane_on)):
        if wait_until(lambda: healthy(status()), 180) is None:
            raise RuntimeError("the deployment did not become HEALTHY")
        s = status()
        before = replicas(s)
        head_node = next(n["node_id"] for n in s["nodes"] if n["address"] == "127.0.0.2")
        placement = control_placement()
        load = OpenLoop([f"http://{ip}:8000/greet" for ip in LISTENERS], args.rate)
        load.start()
        time.sleep(5)
        load.phase("head down")
        restart = local_cluster.restart_head(args.down_s)
        load.phase("head back")
        recovered_s = wait_until(lambda: healthy(st := status()) and set(
            r for r, n in before.items() if n != head_node) <= set(replicas(st)), 120)
        time.sleep(5)
        after = replicas(status())
        load.phase("replica killed")  # its own in-flight POSTs fail (502): not the head's
        killed = kill_a_worker_replica(after, head_node)
        replaced_s = wait_until(lambda: healthy(st := status()) and killed not in replicas(st)
                                and len(replicas(st)) == len(before), 90) if killed else None
        load.stop()
        return {"restart_ok": restart.returncode == 0, "recovered_s": recovered_s,
                "replaced_after_s": replaced_s, "killed_after": killed,
                "replicas_before": before, "replicas_after": after, "head_node": head_node,
                "control_actors_on": placement, "failed": load.failed(),
                "sent": load.sent(), "errors": load.errors()}


def control_placement() -> dict[str, list[str]]:
    """The node address each control actor runs on (Ray places them)."""
    code = ("import sys, ray\n"
            "ray.init(address=sys.argv[1], log_to_driver=False)\n"
            "nodes = {n['NodeID']: n['NodeManagerAddress'] for n in ray.nodes()}\n"
            "for a in ray._private.state.state.actor_table(None).values():\n"
            "    if a['State'] == 'ALIVE' and a['ActorClassName'] in sys.argv[2:]:\n"
            "        print('AT', a['ActorClassName'], nodes.get(a['Address']['NodeID']))\n")
    done = subprocess.run([sys.executable, "-c", code, ADDRESS, "Controller",
                           "ControllerShard", "ServeFacade"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    placement: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("AT "):
            _, name, ip = line.split()
            placement.setdefault(name, []).append(ip)
    return placement


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--down-s", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=40.0, help="requests/s per listener")
    p.add_argument("--haproxy", action="store_true", help="ingress: haproxy")
    p.add_argument("--control-plane-on", choices=("head", "workers"), default="head",
                   help="fleetplane run's placement of the control actors (default head)")
    p.add_argument("--smoke", action="store_true", help="5 s down, 10 requests/s")
    args = parse_args(p, {"down_s": 5.0, "rate": 10.0}, argv)
    folder = folders(args.smoke)[1] / "head_loss"
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["FLEETPLANE_STATE_DIR"] = tempfile.mkdtemp(prefix="head_loss_state_")
    local_cluster.start()
    try:
        out = drill(args, folder)
    finally:
        local_cluster.stop()
    return report(args, out, argv)


def report(args: argparse.Namespace, out: dict, argv: list[str] | None) -> int:
    mode = "haproxy" if args.haproxy else "proxy"
    print(f"\nhead loss, {mode} mode, control plane on {args.control_plane_on}, "
          f"{args.down_s:g} s down, {args.rate:g} req/s per listener; "
          f"{describe_line()}")
    for phase, by_listener in out["failed"].items():
        print(f"  {phase:10s} " + ", ".join(f"{ip}: {n} failed of {out['sent'][phase][ip]}"
                                            for ip, n in by_listener.items()))
    lived = {r for r, n in out["replicas_before"].items() if n != out["head_node"]}
    restarted = sorted(lived - set(out["replicas_after"]))
    print(f"  replicas that lived, restarted: {restarted or 'none'}; HEALTHY with them "
          f"{out['recovered_s']} s after the head's return; a worker replica killed after: "
          f"replaced in {out['replaced_after_s']} s; control actors on "
          f"{out['control_actors_on']}")
    workers_failed = sum(n for name, phase in out["failed"].items() if name != "replica killed"
                         for ip, n in phase.items() if ip != "127.0.0.2")
    summary = {"mode": mode, "control_plane_on": args.control_plane_on,
               "down_s": args.down_s, "rate": args.rate,
               "worker_listener_failures": workers_failed, "restarted": restarted, **out}
    name = "head_loss" + ("_haproxy" if args.haproxy else "") + (
        "_workers" if args.control_plane_on == "workers" else "")
    path = record(name, summary,
                  smoke=args.smoke, argv=argv)
    print(f"results: {path}")
    print(json.dumps({"head_loss": {"mode": mode, "control_plane_on": args.control_plane_on,
                                    "worker_listener_failures": workers_failed,
                                    "restarted": restarted,
                                    "recovered_s": out["recovered_s"],
                                    "replaced_after_s": out["replaced_after_s"]}}))
    ok = (out["restart_ok"] and out["recovered_s"] is not None and not restarted
          and out["replaced_after_s"] is not None)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
