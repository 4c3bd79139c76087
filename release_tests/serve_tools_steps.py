"""The steps of ``release_tests.serve_tools``: what a Ray Serve team does with its own tools,
each a function of the door (the Serve API's address) returning (ok, what was seen)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from release_tests.results import ROOT

DEMO_SERVE = ROOT / "deployments" / "demo_serve.yaml"


def env() -> dict:
    """A user's shell: Ray's CLI sends the token when RAY_AUTH_MODE says so."""
    return {**os.environ, "RAY_AUTH_MODE": "token", "PYTHONPATH": str(ROOT)}


def token() -> str:
    """Ray's token, where Ray's CLI reads it."""
    from controlplane.admin_surface import read_token

    return read_token()


def serve_cli(*args: str) -> subprocess.CompletedProcess:
    """Ray's own ``serve`` CLI, unchanged."""
    return subprocess.run([sys.executable, "-c", "from ray.serve.scripts import cli; cli()",
                           *args], capture_output=True, text=True, timeout=180, env=env(),
                          cwd=ROOT)


def fleetplane_status(address: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "fleetplane.cli", "status", "--json",
                           "--summary", *(["--address", address] if address else [])],
                          capture_output=True, text=True, timeout=60, env=env(), cwd=ROOT)
    return json.loads(done.stdout)


def api(door: str, method: str = "GET", body: Any = None, query: str = "",
        header: str = "authorization") -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{door}/api/serve/applications/{query}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={header: f"Bearer {token()}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def wait_running(door: str, names: set[str], timeout_s: float = 180) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code, details = api(door, query="?api_type=declarative")
        apps = details.get("applications", {}) if code == 200 else {}
        if set(apps) == names and all(a["status"] == "RUNNING" for a in apps.values()):
            return True
        time.sleep(0.5)
    return False


DEMO_APPS = {"greeter", "echo", "api"}


def serve_status(door: str, _: str) -> tuple[bool, str]:
    done = serve_cli("status", "-a", door)
    apps = (yaml.safe_load(done.stdout) or {}).get("applications", {}) if done.returncode == 0 else {}
    statuses = {n: a["status"] for n, a in apps.items()}
    return set(statuses) == DEMO_APPS and set(statuses.values()) == {"RUNNING"}, str(statuses)


def serve_deploy(door: str, address: str) -> tuple[bool, str]:
    before = fleetplane_status(address)["controller"]["generation"]
    done = serve_cli("deploy", str(DEMO_SERVE), "-a", door)
    running = done.returncode == 0 and wait_running(door, DEMO_APPS)
    after = fleetplane_status(address)["controller"]["generation"]
    return running and after == before + 1, f"generation {before} -> {after}"


def serve_deploy_bad(door: str, address: str, tmp: Path) -> tuple[bool, str]:
    bad = yaml.safe_load(DEMO_SERVE.read_text())
    bad["applications"][0]["import_path"] = "deployments.demo_app:NoSuchThing"
    path = tmp / "bad_serve.yaml"
    path.write_text(yaml.safe_dump(bad))
    before = fleetplane_status(address)["controller"]["generation"]
    done = serve_cli("deploy", str(path), "-a", door)
    after = fleetplane_status(address)["controller"]["generation"]
    return (done.returncode != 0 and "NoSuchThing" in done.stderr and after == before,
            f"exit {done.returncode}, generation {before} -> {after}")


def kuberay_sequence(door: str, http: str) -> tuple[bool, str]:
    """KubeRay's RayService calls: healthz on the head's listener, the declarative
    applications, a PUT of serveConfigV2 as JSON, then the applications until RUNNING."""
    with urllib.request.urlopen(f"{http}/-/healthz", timeout=2) as response:
        healthy = "success" in response.read().decode()
    code, _ = api(door, query="?api_type=declarative", header="x-ray-authorization")
    config = yaml.safe_load(DEMO_SERVE.read_text())
    config["applications"] = config["applications"][:2]  # the api application goes
    put, _ = api(door, "PUT", config, header="x-ray-authorization")
    started = time.monotonic()
    running = put == 200 and wait_running(door, {"greeter", "echo"})
    return (healthy and code == 200 and running,
            f"GET {code}, PUT {put}, RUNNING after {time.monotonic() - started:.1f}s")


# The timed loop both drivers run: sequential calls of the demo's api.add
_LOOP = textwrap.dedent("""
    api = serve.get_app_handle("api")
    ms = []
    for i in range(int(sys.argv[3]) + 20):  # the first 20 warm up
        t = time.perf_counter()
        assert api.add.remote(i, 1).result() == i + 1
        ms.append((time.perf_counter() - t) * 1000)
    print("RESULT " + json.dumps(ms[20:]))
""")

DRIVER = textwrap.dedent("""
    import json, sys, time
    if sys.argv[2] == "bridge":  # an environment with Ray Serve and without fleetplane
        class NoFleetplane:
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in ("fleetplane", "controlplane", "replicas"):
                    raise ImportError(name)
        sys.meta_path.insert(0, NoFleetplane())
    else:
        import fleetplane  # noqa: F401 (the direct path)
    import ray
    from ray import serve
    ray.init(address=sys.argv[1], log_to_driver=False)
""") + _LOOP


SERVE_ITSELF = textwrap.dedent("""
    import json, sys, time
    import ray
    from ray import serve
    from release_tests.serve_peer import init_local_ray
    init_local_ray(num_cpus=2)
    from deployments.demo_app import api_app
    serve.start(http_options={"host": "127.0.0.1", "port": 0})
    serve.run(api_app, name="api", route_prefix="/api")
""") + _LOOP + "serve.shutdown()\n"


def driver_latency(address: str, path: str, calls: int, tmp: Path) -> dict:
    """Sequential handle calls from a driver (the demo's ``api.add``, the README's example):
    through the bridge (no fleetplane in the driver) or direct (``import fleetplane``); or
    ``serve``: Ray Serve 2.60 itself serving the same app on a local Ray of its own, the
    same loop (the reference)."""
    script = tmp / "driver.py"
    script.write_text(SERVE_ITSELF if path == "serve" else DRIVER)
    done = subprocess.run([sys.executable, str(script), address, path, str(calls)],
                          capture_output=True, text=True, timeout=300, env=env(), cwd=tmp)
    lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    if not lines:
        return {"ok": False, "error": done.stderr[-1500:]}
    ms = sorted(json.loads(lines[-1][len("RESULT "):]))
    return {"ok": True, "calls": len(ms), "p50_ms": round(statistics.median(ms), 3),
            "p99_ms": round(ms[int(len(ms) * 0.99) - 1], 3)}


def serve_shutdown(door: str, address: str) -> tuple[bool, str]:
    done = serve_cli("shutdown", "-a", door, "-y")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = fleetplane_status(address)
        if not status["applications"]:
            return done.returncode == 0 and bool(status.get("serve_api_address")), \
                "no applications; fleetplane still answers"
        time.sleep(0.5)
    return False, "applications still there"


def no_real_serve(address: str) -> tuple[bool, str]:
    code = textwrap.dedent("""
        import sys, ray
        ray.init(address=sys.argv[1], log_to_driver=False)
        alive = {a["ActorClassName"] for a in ray._private.state.state.actor_table(None).values()
                 if a["State"] != "DEAD"}
        print("CLASSES " + ",".join(sorted(alive)))
    """)
    done = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True,
                          timeout=60, env=env(), cwd=ROOT)
    line = next((l for l in done.stdout.splitlines() if l.startswith("CLASSES ")), "CLASSES ")
    classes = set(line[len("CLASSES "):].split(","))
    return "ServeController" not in classes and "ServeFacade" in classes, \
        "ServeController absent, ServeFacade present" if "ServeFacade" in classes else str(classes)
