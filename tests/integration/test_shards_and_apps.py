"""Two shards own deployments; a Ray Serve app runs unchanged; a removed app drains;
the CLI works against a running instance."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import ray

from controlplane.specs import DeploymentId, shard_of
from tests.integration.conftest import (HTTP_PORT, app, call, dep_status, deploy, settled,
                                        wait_actor_gone, wait_for)

pytestmark = pytest.mark.integration


def _names_on_both_shards() -> list[str]:
    """App names whose Model deployment lands on shard 0 and on shard 1 (two each)."""
    by_shard: dict[int, list[str]] = {0: [], 1: []}
    for i in range(50):
        name = f"sh{i}"
        by_shard[shard_of(DeploymentId(name, "Model"), 2)].append(name)
    return by_shard[0][:2] + by_shard[1][:2]


def test_two_shards_each_own_deployments(fleet):
    names = _names_on_both_shards()
    deploy(fleet, *[app(n) for n in names])
    status = wait_for(fleet, lambda s: all(settled(n, 1)(s) for n in names), what="4 apps")
    shards = status["controller"]["shards"]
    assert [s["deployments"] for s in shards] == [2, 2]
    for shard in range(2):
        actor = ray.get_actor(f"fleetplane_shard_{shard}", namespace="fleetplane")
        owned = ray.get(actor.status.remote())["deployments"]
        assert {k.split("/")[0] for k in owned} == {
            n for n in names if shard_of(DeploymentId(n, "Model"), 2) == shard}


def test_serve_bind_app_runs_unchanged(fleet):
    deploy(fleet, app("serveapp", "tests.integration.apps:serve_app",
                      deployments=[{"name": "ServeModel", "num_replicas": 2}]))
    status = wait_for(fleet, settled("serveapp", 2, "ServeModel"))
    replicas = dep_status(status, "serveapp", "ServeModel")["replicas"]
    assert [call(r, "x") for r in replicas] == ["serve:x", "serve:x"]


def test_removed_application_is_drained_and_stopped(fleet):
    deploy(fleet, app("keep"), app("drop", deployments=[{"name": "Model", "num_replicas": 2}]))
    status = wait_for(fleet, lambda s: settled("keep", 1)(s) and settled("drop", 2)(s))
    dropped = [r["actor_name"] for r in dep_status(status, "drop")["replicas"]]
    deploy(fleet, app("keep"))
    wait_for(fleet, lambda s: "drop" not in s["applications"], what="app removal")
    for name in dropped:
        with pytest.raises(ValueError):
            ray.get_actor(name, namespace="fleetplane")


def _cli(*args: str) -> subprocess.CompletedProcess:
    address = ray.get_runtime_context().gcs_address
    return subprocess.run([sys.executable, "-m", "fleetplane.cli", *args, "--address", address],
                          capture_output=True, text=True, timeout=120)


def test_cli_deploy_and_status_against_running_instance(fleet, tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(
        f"http_options: {{host: 127.0.0.1, port: {HTTP_PORT}}}\n"
        "applications:\n  - name: cli\n    import_path: tests.integration.apps:Model\n"
        "    deployments:\n      - name: Model\n        num_replicas: 1\n"
        "        ray_actor_options: {num_cpus: 0}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("applications:\n  - name: cli\n    import_path: tests.integration.apps:Model\n"
                   "    deployments:\n      - name: Model\n        num_replicas: -1\n")
    done = _cli("deploy", str(good), "--wait", "--timeout-s", "60")
    assert done.returncode == 0, done.stderr
    rejected = _cli("deploy", str(bad))
    assert rejected.returncode == 2
    assert "applications[0].deployments[0].num_replicas" in rejected.stderr
    shown = _cli("status", "--json")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert status["applications"]["cli"]["status"] == "RUNNING"
    assert status["controller"]["num_shards"] == 2
    full = status["applications"]["cli"]["deployments"]["Model"]
    summary = _cli("status", "--json", "--summary", "--app", "cli", "--deployment", "Model")
    assert summary.returncode == 0, summary.stderr
    brief = json.loads(summary.stdout)
    assert list(brief["applications"]) == ["cli"]
    model = brief["applications"]["cli"]["deployments"]["Model"]
    assert "replicas" not in model and model["healthy_replicas"] == 1
    assert model["replica_counts"]["RUNNING"] == len(full["replicas"]) == 1
    assert {k: v for k, v in full.items() if k != "replicas"}.keys() <= model.keys()
    unknown = _cli("status", "--app", "cli", "--deployment", "Nope")
    assert unknown.returncode == 1
    assert "no deployment named 'Nope' in application 'cli'" in unknown.stderr


def test_restarted_controller_resumes_from_checkpoint(fleet):
    deploy(fleet, app("durable", deployments=[{"name": "Model", "num_replicas": 2}]))
    before = dep_status(wait_for(fleet, settled("durable", 2)), "durable")["replicas"]
    ray.kill(fleet.controller(), no_restart=True)
    wait_actor_gone("fleetplane_controller")
    fleet.start_controller()
    status = wait_for(fleet, settled("durable", 2), what="resumed controller")
    after = dep_status(status, "durable")["replicas"]
    assert [r["replica_id"] for r in after] == [r["replica_id"] for r in before]  # adopted
