"""Ray Serve's own tools against fleetplane, through both doors Serve's REST API has (issue 31).

    python -m release_tests.serve_tools [--doors own,dashboard] [--calls 300] [--smoke]

- ``own``: ``fleetplane run deployments/demo.yaml`` on its embedded Ray (no dashboard):
  fleetplane's own listener answers Serve's API on 127.0.0.1:8265;
- ``dashboard``: a ``ray start --head`` with Ray's dashboard (as KubeRay runs it), then
  ``fleetplane run deployments/demo.yaml --address``: Ray's dashboard answers, through the
  facade.

On each, in order: Ray's ``serve status`` (the demo's applications RUNNING), ``serve deploy
deployments/demo_serve.yaml`` (applied: the next generation, RUNNING), a ``serve deploy``
whose code does not import (refused, nothing changed), driver handle calls from a driver
without fleetplane (through a bridge) and with ``import fleetplane`` (direct): their
latency, KubeRay's RayService call sequence, ``serve shutdown`` (the applications stop,
fleetplane stays), and no real Serve controller on the cluster. Then the reference: the same
driver loop on Ray Serve 2.60 itself (the demo's api app, its own local Ray). Prints a
table, writes ``measured/serve_tools.json``; exit 1 if a step failed. ``--smoke``: the own
door, 20 calls, no Ray Serve.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from release_tests import serve_tools_steps as steps
from release_tests.machine import describe_line
from release_tests.results import ROOT, folders, parse_args, record
from release_tests.soak import serving

DEMO = ROOT / "deployments" / "demo.yaml"
HTTP = "http://127.0.0.1:8000"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def own_door(log: Path) -> Iterator[tuple[str, str]]:
    """(the Serve API's address, the cluster's address for fleetplane's CLI: the record)."""
    from controlplane.instance_record import recorded_instance

    port = _free_port()
    os.environ["FLEETPLANE_STATE_DIR"] = tempfile.mkdtemp(prefix="serve_tools_")
    with serving(DEMO, log, args=("--serve-api-port", str(port))):
        yield f"http://127.0.0.1:{port}", recorded_instance()["address"]


@contextmanager
def dashboard_door(log: Path) -> Iterator[tuple[str, str]]:
    """A head with Ray's dashboard (ended with SIGTERM to its ``ray start --block``)."""
    gcs, dashboard = _free_port(), _free_port()
    env = {**steps.env(), "FLEETPLANE_STATE_DIR": tempfile.mkdtemp(prefix="serve_tools_")}
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
         "--port", str(gcs), "--dashboard-host", "127.0.0.1", "--dashboard-port",
         str(dashboard), "--include-dashboard", "true", "--num-cpus", "2",
         "--disable-usage-stats"], stdout=open(log.with_suffix(".head.log"), "w"),
        stderr=subprocess.STDOUT, start_new_session=True, env=env)
    door, address = f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{gcs}"
    try:
        _wait_dashboard(door, head)
        with serving(DEMO, log, env={**env, "RAY_AUTH_MODE": "token"},
                     args=("--address", address)):
            yield door, address
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)


def _wait_dashboard(door: str, head: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray start --head exited {head.returncode}")
        try:
            if steps.api(door)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"Ray's dashboard at {door} did not answer in {timeout_s:.0f}s")


def run_door(name: str, calls: int, folder: Path) -> list[dict]:
    door_of = {"own": own_door, "dashboard": dashboard_door}[name]
    rows: list[dict] = []

    def step(label: str, call) -> None:
        started = time.monotonic()
        try:
            ok, seen = call()
        except Exception as e:  # a step that raised failed; the next ones still run
            ok, seen = False, f"{type(e).__name__}: {e}"[:300]
        rows.append({"door": name, "step": label, "ok": ok, "seen": seen,
                     "wall_s": round(time.monotonic() - started, 2)})
        print(f"  {name:9s} {'ok ' if ok else 'FAILED'} {label:34s} {seen}", flush=True)

    with door_of(folder / f"{name}.log") as (door, address):
        step("serve status", lambda: steps.serve_status(door, address))
        step("serve deploy (changed)", lambda: steps.serve_deploy(door, address))
        step("serve deploy (bad code)", lambda: steps.serve_deploy_bad(door, address, folder))
        for path in ("bridge", "direct"):
            step(f"driver handle, {path}", lambda path=path: _latency(address, path, calls,
                                                                      folder))
        step("KubeRay RayService sequence", lambda: steps.kuberay_sequence(door, HTTP))
        step("serve shutdown", lambda: steps.serve_shutdown(door, address))
        step("no real Serve controller", lambda: steps.no_real_serve(address))
    return rows


def _latency(cluster: str, path: str, calls: int, folder: Path) -> tuple[bool, str]:
    out = steps.driver_latency(cluster, path, calls, folder)
    if not out["ok"]:
        return False, out["error"]
    return True, f"{out['calls']} calls: p50 {out['p50_ms']} ms, p99 {out['p99_ms']} ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--doors", default="own,dashboard", help="own, dashboard or both")
    p.add_argument("--calls", type=int, default=300, help="driver handle calls per path")
    p.add_argument("--no-serve-reference", dest="serve_reference", action="store_false",
                   help="skip the reference: the same driver loop on Ray Serve itself")
    p.add_argument("--smoke", action="store_true", help="the own door, 20 calls, no Serve")
    args = parse_args(p, {"doors": "own", "calls": 20, "serve_reference": False}, argv)
    folder = folders(args.smoke)[1] / "serve_tools"
    folder.mkdir(parents=True, exist_ok=True)
    rows = [row for door in args.doors.split(",") for row in run_door(door, args.calls, folder)]
    if args.serve_reference:
        started = time.monotonic()
        out = steps.driver_latency("", "serve", args.calls, folder)
        seen = (f"{out['calls']} calls: p50 {out['p50_ms']} ms, p99 {out['p99_ms']} ms"
                if out["ok"] else out["error"])
        rows.append({"door": "Ray Serve", "step": "driver handle, Serve itself",
                     "ok": out["ok"], "seen": seen,
                     "wall_s": round(time.monotonic() - started, 2)})
        print(f"  Ray Serve {'ok ' if out['ok'] else 'FAILED'} driver handle, Serve itself"
              f"       {seen}", flush=True)
    failed = [f"{r['door']}: {r['step']}" for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} steps ok; {describe_line()}")
    summary = {"doors": args.doors.split(","), "calls": args.calls, "steps": rows,
               "failed": failed}
    path = record("serve_tools", summary, rows, smoke=args.smoke, argv=argv)
    print(f"results: {path}")
    print(json.dumps({"serve_tools": {"ok": len(rows) - len(failed), "failed": failed}}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
