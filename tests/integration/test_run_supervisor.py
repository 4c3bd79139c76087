"""`fleetplane run` as a supervisor: its control actors killed under load, it keeps serving.

A real ``fleetplane run`` in a subprocess, on an embedded Ray cluster of its own (a second
cluster on this machine beside the session's). It records that cluster's address, so
``fleetplane status`` from another process attaches to it and not to the session's. A
helper process SIGKILLs the controller, then a shard, then the proxy; ``run`` must print
each as news and never exit, requests must not fail (the killed proxy's in-flight
request aside), and Ctrl-C (or a hangup) must still stop everything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import requests

from tests.integration.conftest import _free_port
from tests.integration.test_self_healing import Load

pytestmark = pytest.mark.integration

KILL = textwrap.dedent("""
    import os, signal, sys
    import ray, ray._private.state as state
    ray.init(address=sys.argv[1], namespace="fleetplane", logging_level="ERROR")
    actor_id = ray.get_actor(sys.argv[2], namespace="fleetplane")._actor_id.hex()
    os.kill(state.actors()[actor_id]["Pid"], signal.SIGKILL)
""")


@pytest.fixture
def running(tmp_path):
    port = _free_port()
    config = tmp_path / "run.yaml"
    config.write_text(textwrap.dedent(f"""
        http_options: {{host: 127.0.0.1, port: {port}}}
        controller_options: {{num_shards: 1}}
        applications:
          - name: sup
            route_prefix: /sup
            import_path: tests.integration.apps:Model
            deployments: [{{name: Model, num_replicas: 2, ray_actor_options: {{num_cpus: 0}}}}]
    """))
    env = {**os.environ, "FLEETPLANE_STATE_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_MODE", None)  # `status` must find run's auth mode in its record
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        run = subprocess.Popen([sys.executable, "-m", "fleetplane.cli", "run", str(config)],
                               stdout=out, stderr=subprocess.STDOUT, env=env,
                               cwd=Path(__file__).resolve().parents[2])
    try:
        wait_line(log, "Ctrl-C to stop", 120)
        yield run, log, f"http://127.0.0.1:{port}/sup", env
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
            run.wait(90)


def wait_line(log: Path, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {text!r} in run's output:\n{log.read_text()}")
        time.sleep(0.2)


def status(env: dict) -> dict:
    out = subprocess.run([sys.executable, "-m", "fleetplane.cli", "status", "--json"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_run_survives_its_control_actors_and_still_stops_on_ctrl_c(running):
    run, log, url, env = running
    address = json.loads((Path(env["FLEETPLANE_STATE_DIR"]) / "instance.json").read_text())
    proxy = next(n for n in status(env)["controller"]["actors"]
                 if n.startswith("proxy_") and n.endswith("_0"))
    victims = [("fleetplane_controller", "controller restarted by Ray and recovered"),
               ("fleetplane_shard_0", "shard_0 restarted by Ray and recovered"),
               (None, f"{proxy} restarted by Ray and recovered")]
    helper_env = {**env, "RAY_AUTH_MODE": address["auth_mode"]}  # as an operator exports it
    with Load(url) as load:
        for actor, news in victims:
            actor = actor or _proxy_actor(address["address"], helper_env)
            subprocess.run([sys.executable, "-c", KILL, address["address"], actor],
                           env=helper_env, check=True, timeout=60)
            wait_line(log, news, 60)
            assert run.poll() is None, log.read_text()
        back_at = time.monotonic()
        while not any(t > back_at and o == 200 for _, t, o in load.results):
            time.sleep(0.1)
    answers = {o for o in load.outcomes() if isinstance(o, int)}
    assert answers == {200}, load.outcomes()
    # the node's other proxy kept the port: at most the killed one's in-flight request
    assert sum(o != 200 for o in load.outcomes()) <= 1, load.outcomes()
    assert requests.get(url, timeout=10).status_code == 200
    run.send_signal(signal.SIGINT)
    assert run.wait(90) == 0
    assert "stopped (Ray shut down)" in log.read_text()


def _proxy_actor(address: str, env: dict) -> str:
    code = textwrap.dedent("""
        import sys, ray
        ray.init(address=sys.argv[1], namespace="fleetplane", logging_level="ERROR")
        print(next(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                   if a["name"].startswith("fleetplane_proxy::") and a["name"].endswith("::0")))
    """)
    out = subprocess.run([sys.executable, "-c", code, address], env=env, check=True,
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip().splitlines()[-1]


def test_a_hangup_stops_run_and_leaves_no_ray_process_behind(running):
    """The terminal closed (SIGHUP), as Ctrl-C: drain, stop Ray, exit 0, nothing left."""
    import psutil

    run, log, url, _ = running
    assert requests.get(url, timeout=10).status_code == 200
    started = psutil.Process(run.pid).children(recursive=True)  # its GCS, raylet, workers
    assert started
    run.send_signal(signal.SIGHUP)
    assert run.wait(90) == 0
    assert "stopped (Ray shut down)" in log.read_text()
    _, alive = psutil.wait_procs(started, timeout=30)
    assert alive == [], [p.pid for p in alive]
