"""Ray Serve's own tools against a running fleetplane (issue 31): Ray's `serve` CLI
(status, config, deploy, shutdown) on the Serve REST API fleetplane answers, a driver
script that never imports fleetplane (``serve.get_app_handle``, ``serve.status``,
``serve.delete``, ``serve.run`` refused), KubeRay's RayService call sequence replayed, and
never a real Serve controller beside fleetplane.

The CLI and the drivers run as subprocesses: this test process imported fleetplane
(other modules do), and what is tested is a process that did not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import ray
import requests
import yaml

from controlplane.admin_surface import cluster_token_auth_on
from controlplane.routing.handles import DeploymentHandle
from tests.integration.conftest import BASE_URL, SERVE_API, app, deploy, settled, wait_for

pytestmark = pytest.mark.integration
APPS = "tests.integration.serve_compat_apps"
SHOP = ("tools-shop", 1, "Shop")


def _apps() -> list[dict]:
    return [app("tools-shop", f"{APPS}:shop_app", deployments=[{"name": "Shop"}]),
            app("tools-noreq", f"{APPS}:no_request", deployments=[{"name": "no_request"}])]


@pytest.fixture
def tools(fleet):
    deploy(fleet, *_apps())
    wait_for(fleet, lambda s: settled(*SHOP)(s) and settled("tools-noreq", 1, "no_request")(s),
             what="tools apps")
    return fleet


def _env() -> dict:
    """A user's shell: Ray's CLI sends the cluster's token when RAY_AUTH_MODE says so."""
    return {**os.environ, "RAY_AUTH_MODE": "token" if cluster_token_auth_on() else "disabled",
            "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def serve_cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", "from ray.serve.scripts import cli; cli()", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=_env())


def _serve_config(apps: list[dict]) -> dict:
    """The applications as a Serve config (Serve's fields only, as `serve deploy` sends)."""
    return {"applications": [{k: v for k, v in a.items()} for a in apps]}


def _token_headers(name: str = "authorization") -> dict:
    if not cluster_token_auth_on():
        return {}
    from ray._raylet import AuthenticationTokenLoader

    header = AuthenticationTokenLoader.instance().get_token_for_http_header()
    return {name: next(iter(header.values()))}


def test_serve_status_and_config_show_fleetplanes_applications(tools):
    status = serve_cli("status", "-a", SERVE_API)
    assert status.returncode == 0, status.stderr
    apps = yaml.safe_load(status.stdout)["applications"]
    assert apps["tools-shop"]["status"] == "RUNNING"
    assert apps["tools-shop"]["deployments"]["Shop"]["replica_states"] == {"RUNNING": 1}
    config = serve_cli("config", "-a", SERVE_API, "--name", "tools-shop")
    assert config.returncode == 0 and f"import_path: {APPS}:shop_app" in config.stdout
    assert tools.status()["serve_api_address"] == SERVE_API


def test_the_rest_api_wants_rays_token_where_rays_is_on():
    url = f"{SERVE_API}/api/serve/applications/"
    if not cluster_token_auth_on():  # then it listens on loopback only (unit-tested guard)
        assert SERVE_API.startswith("http://127.0.0.1:")
        return
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(url, timeout=10)
    assert missing.value.code == 401
    wrong = urllib.request.Request(url, headers={"authorization": "Bearer wrong"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(wrong, timeout=10)
    assert refused.value.code == 403


def test_serve_deploy_applies_a_changed_config_and_refuses_a_bad_one(tools, tmp_path):
    before = tools.status()["controller"]["generation"]
    changed = _apps()
    changed[0]["deployments"][0]["user_config"] = {"tax": 9}
    changed.append(app("tools-extra", f"{APPS}:batch_app", deployments=[{"name": "Batcher"}]))
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(_serve_config(changed)))
    applied = serve_cli("deploy", str(path), "-a", SERVE_API)
    assert applied.returncode == 0, applied.stderr
    status = wait_for(tools, lambda s: settled("tools-extra", 1, "Batcher")(s),
                      what="the app serve deploy added")
    assert status["controller"]["generation"] == before + 1
    shop = DeploymentHandle("tools-shop", "Shop")
    wait_for(tools, lambda _: shop.reconfigured.remote().result()[-1][0] == {"tax": 9},
             what="the new user_config")

    bad = [*changed[:1], app("tools-bad", "tests.integration.serve_compat_apps:nothing_here")]
    path.write_text(yaml.safe_dump(_serve_config(bad)))
    refused = serve_cli("deploy", str(path), "-a", SERVE_API)
    assert refused.returncode != 0
    assert "400" in refused.stderr and "nothing_here" in refused.stderr
    after = tools.status()
    assert after["controller"]["generation"] == before + 1  # nothing changed
    assert set(after["applications"]) == {"tools-shop", "tools-noreq", "tools-extra"}


DRIVER = textwrap.dedent("""
    import json, sys

    class NoFleetplane:  # a driver environment with Ray Serve and without fleetplane
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("fleetplane", "controlplane", "replicas"):
                raise ImportError(f"{name} is not installed here")

    sys.meta_path.insert(0, NoFleetplane())
    import ray
    from ray import serve

    ray.init(address=sys.argv[1], log_to_driver=False)
    shop = serve.get_app_handle("tools-shop")
    out = {"add_one": shop.add_one.remote(41).result(),
           "numbers": list(shop.options(method_name="numbers", stream=True).remote(3)),
           "by_name": serve.get_deployment_handle("Shop", "tools-shop").add_one.remote(1)
                           .result(),
           "status": serve.status().applications["tools-shop"].status}
    try:
        serve.run(serve.deployment(lambda: 1).bind(), name="imperative")
    except Exception as e:
        out["run_refused"] = str(e)
    serve.start()  # connects to the existing "Serve": starts nothing
    serve.delete("tools-noreq")
    out["after_delete"] = sorted(serve.status().applications)
    out["fleetplane_imported"] = any(m.split(".")[0] in ("fleetplane", "controlplane")
                                     for m in sys.modules)
    out["serve_patched"] = hasattr(serve.get_app_handle, "__fleetplane_patched__")
    print("RESULT " + json.dumps(out, default=str))
""")


def test_a_driver_that_never_imports_fleetplane(tools, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    done = subprocess.run([sys.executable, str(script), ray.get_runtime_context().gcs_address],
                          capture_output=True, text=True, timeout=180, env=_env())
    lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    assert lines, done.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["add_one"] == 42 and out["by_name"] == 2
    assert out["numbers"] == [0, 1, 2]
    assert out["status"] == "RUNNING"
    assert "serve deploy" in out["run_refused"]
    assert out["after_delete"] == ["tools-shop"]
    assert not out["fleetplane_imported"] and not out["serve_patched"]
    assert "tools-noreq" not in tools.status()["applications"]
    _assert_no_real_serve_controller()


def test_kuberays_rayservice_call_sequence(tools):
    """What KubeRay's RayService controller does (ray-operator, dashboard_httpclient.go and
    rayservice_controller.go): the head's /-/healthz, the declarative applications, a PUT
    of serveConfigV2 (its YAML as JSON) when the config changed, then the applications
    until every one is RUNNING. Headers as KubeRay sends them."""
    headers = {"Content-Type": "application/json", **_token_headers("x-ray-authorization")}
    url = f"{SERVE_API}/api/serve/applications/?api_type=declarative"
    assert "success" in requests.get(f"{BASE_URL}/-/healthz", timeout=2).text
    got = requests.get(url, headers=headers, timeout=2).json()
    assert {a["status"] for a in got["applications"].values()} == {"RUNNING"}
    serve_config_v2 = yaml.safe_dump(_serve_config(
        [*_apps(), app("tools-rs", f"{APPS}:multi_app", deployments=[{"name": "Multi"}])]))
    put = requests.put(f"{SERVE_API}/api/serve/applications/", headers=headers, timeout=10,
                       data=json.dumps(yaml.safe_load(serve_config_v2)))
    assert put.status_code == 200, put.text
    deadline = time.monotonic() + 120
    while True:
        apps = requests.get(url, headers=headers, timeout=2).json()["applications"]
        assert "tools-rs" in apps  # present at once (KubeRay reads a missing app as failed)
        if all(a["status"] == "RUNNING" for a in apps.values()):
            break
        assert time.monotonic() < deadline, apps
        time.sleep(0.5)


def test_a_rayservice_heads_probe_sees_fleetplane_answer(tools):
    from fleetplane.cli_probe import check_serve_api

    assert check_serve_api(SERVE_API, 10.0) == ""  # the token from Ray's own places


def test_serve_shutdown_stops_the_applications_and_fleetplane_stays(tools):
    done = serve_cli("shutdown", "-a", SERVE_API, "-y")
    assert done.returncode == 0, done.stderr
    wait_for(tools, lambda s: not s["applications"], what="no applications")
    assert tools.status()["serve_api_address"] == SERVE_API  # ready for the next deploy
    _assert_no_real_serve_controller()


def _assert_no_real_serve_controller() -> None:
    serve_name = ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
    assert ray.get(serve_name.fleetplane_owner.remote(), timeout=30) == "fleetplane"
    classes = {a["ActorClassName"] for a in ray._private.state.state.actor_table(None).values()
               if a["State"] != "DEAD"}
    assert "ServeController" not in classes and "ServeFacade" in classes
