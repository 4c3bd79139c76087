"""Serve's tools answered by fleetplane (issue 31), the pure parts: fleetplane's status in
Serve's own models (``ServeInstanceDetails``, ``StatusOverview``), a Serve config merged
into the running one, the REST API's answers (aiohttp's test server, a fake facade) and
its guard. The live path (Ray's `serve` CLI, drivers, KubeRay's calls) is in
``tests/integration/test_serve_tools.py``."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer
from ray.serve._private.application_state import StatusOverview
from ray.serve.generated.serve_pb2 import StatusOverview as StatusOverviewProto
from ray.serve.schema import APIType, ApplicationStatus, ServeDeploySchema, ServeInstanceDetails

from controlplane.serve_facade import details
from controlplane.serve_facade.apply import ignored_options, merged_config, without_apps
from controlplane.serve_facade.rest import check_guarded, make_app

CONTROLLER = {"node_id": "n" * 56, "actor_id": "a" * 32, "actor_name": "SERVE_CONTROLLER_ACTOR"}


def _status() -> dict:
    replica = {"replica_id": "shop#Shop#0", "state": "RUNNING", "rank": 0, "healthy": True,
               "node_id": "n" * 56, "actor_name": "fleetplane_replica::shop#Shop#0"}
    return {
        "applications": {
            "shop": {"status": "RUNNING", "route_prefix": "/shop", "deployments": {
                "Shop": {"status": "HEALTHY", "message": "", "target_replicas": 1,
                         "autoscaling": False, "replicas": [replica]}}},
            "broken": {"status": "DEPLOY_FAILED", "route_prefix": "/broken", "deployments": {
                "B": {"status": "DEPLOY_FAILED", "message": "ValueError: no model",
                      "target_replicas": 1, "replicas": [
                          {**replica, "replica_id": "broken#B#3", "state": "FAILED"}]}}},
        },
        "controller": {"num_shards": 1, "generation": 3},
        "nodes": [{"node_id": "n" * 56, "alive": True, "draining": False,
                   "proxy": {"address": "127.0.0.1:8000", "ready": True}, "replicas": []}],
    }


def _config() -> dict:
    return {"http_options": {"host": "127.0.0.1", "port": 8000, "ingress": "proxy"},
            "controller_options": {"num_shards": 1},
            "applications": [
                {"name": "shop", "route_prefix": "/shop", "import_path": "apps:shop",
                 "deployments": [{"name": "Shop", "num_replicas": 1,
                                  "user_config": {"tax": 7}, "max_replicas_per_node": None,
                                  "replica_start_timeout_s": 300.0}]},
                {"name": "broken", "route_prefix": "/broken", "import_path": "apps:broken"}]}


def test_instance_details_is_serves_own_model_with_statuses_mapped():
    out = details.instance_details(_status(), _config(), deployed_at={"shop": 12.5},
                                   controller=CONTROLLER)
    parsed = ServeInstanceDetails.model_validate(out)  # Serve's own model accepts it
    shop = parsed.applications["shop"]
    assert shop.status == ApplicationStatus.RUNNING and shop.source == APIType.DECLARATIVE
    assert shop.last_deployed_time_s == 12.5
    assert shop.deployments["Shop"].status.value == "HEALTHY"
    assert shop.deployments["Shop"].replicas[0].state.value == "RUNNING"
    broken = parsed.applications["broken"]
    assert broken.status == ApplicationStatus.DEPLOY_FAILED
    assert "no model" in broken.message
    assert broken.deployments["B"].status_trigger.value == "REPLICA_STARTUP_FAILED"
    assert broken.deployments["B"].replicas[0].state.value == "STOPPED"
    assert parsed.controller_info.node_id == "n" * 56  # `serve shutdown` needs it
    assert parsed.proxies["n" * 56].status.value == "HEALTHY"
    # the whole set through Serve's own status view (serve.status())
    assert parsed._get_status().applications["shop"].deployments["Shop"].replica_states == \
        {"RUNNING": 1}


def test_deployed_app_config_keeps_only_what_serves_schema_knows():
    out = details.instance_details(_status(), _config(), deployed_at={},
                                   controller=CONTROLLER)
    shop = out["applications"]["shop"]["deployed_app_config"]
    assert shop["import_path"] == "apps:shop"
    assert shop["deployments"] == [{"name": "Shop", "num_replicas": 1,
                                    "user_config": {"tax": 7}}]  # fleetplane's field left out


def test_an_imperative_filter_lists_no_application():
    out = details.instance_details(_status(), _config(), deployed_at={},
                                   controller=CONTROLLER, source=APIType.IMPERATIVE)
    assert out["applications"] == {}
    assert details.instance_details(_status(), _config(), deployed_at={}, controller=CONTROLLER,
                                    source=APIType.DECLARATIVE)["applications"]


def _overview(data: bytes) -> StatusOverview:
    return StatusOverview.from_proto(StatusOverviewProto.FromString(data))


def test_status_overview_protos_as_serve_delete_reads_them():
    running = _overview(details.status_overview("shop", _status()["applications"]["shop"]))
    assert running.app_status.status == ApplicationStatus.RUNNING
    assert running.get_deployment_status("Shop").status.value == "HEALTHY"
    gone = _overview(details.status_overview("nope", None))
    assert gone.app_status.status == ApplicationStatus.NOT_STARTED  # what delete waits for


@pytest.mark.parametrize("fleet,serve", [
    ("DELETING", ("UPDATING", "DELETING")),
    ("UPSCALING", ("UPSCALING", "CONFIG_UPDATE_STARTED")),
    ("SOMETHING_NEW", ("UPDATING", "UNSPECIFIED")),
])
def test_deployment_statuses_serve_has_no_word_for_map_to_updating(fleet, serve):
    status, trigger = details.deployment_status(fleet)
    assert (status.value, trigger.value) == serve


def test_a_serve_config_replaces_the_applications_and_keeps_the_instance_options():
    running = _config()
    serve_config = {"http_options": {"port": 9999},
                    "applications": [{"name": "new", "import_path": "apps:new"}]}
    merged = merged_config(running, serve_config)
    assert merged["applications"] == serve_config["applications"]
    assert merged["http_options"] == running["http_options"]  # as Serve: ignored while running
    assert merged["controller_options"] == {"num_shards": 1}
    assert ignored_options(running, serve_config) == ["http_options.port"]
    assert merged_config(None, serve_config)["http_options"] == {"port": 9999}  # first deploy


def test_deleting_applications_keeps_the_rest():
    assert [a["name"] for a in without_apps(_config(), ["broken"])["applications"]] == ["shop"]
    assert without_apps(None, ["x"]) == {"applications": []}


def test_the_rest_api_is_never_open_to_the_network_without_a_token():
    check_guarded("127.0.0.1", token_auth_on=False)
    check_guarded("0.0.0.0", token_auth_on=True)
    with pytest.raises(ValueError, match="RAY_AUTH_MODE=token"):
        check_guarded("0.0.0.0", token_auth_on=False)


class FakeFacade:
    def __init__(self) -> None:
        self.applied: list = []
        self.shutdowns = 0

    async def get_serve_instance_details(self, source=None) -> dict:
        return {"applications": {}, "proxies": {}, "source": str(source)}

    async def apply_config(self, config) -> None:
        from ray.serve.exceptions import RayServeException

        if config.applications[0].name == "refused":
            raise RayServeException("fleetplane refused the config: import_path 'x:y'")
        self.applied.append(config)

    async def graceful_shutdown(self) -> None:
        self.shutdowns += 1


def _rest(test) -> None:
    async def run() -> None:
        facade = FakeFacade()
        async with TestClient(TestServer(make_app(facade))) as client:
            await test(client, facade)
    asyncio.run(run())


def test_rest_put_validates_with_serves_schema_before_anything_changes():
    async def test(client, facade):
        bad = await client.put("/api/serve/applications/",
                               json={"applications": [{"name": "a", "import_path": "m:a",
                                                       "deployments": [{"name": "D",
                                                                        "num_replicas": -3}]}]})
        assert bad.status == 400 and "num_replicas" in await bad.text()
        refused = await client.put("/api/serve/applications/", json={
            "applications": [{"name": "refused", "import_path": "x:y"}]})
        assert refused.status == 400 and "import_path 'x:y'" in await refused.text()
        assert facade.applied == []
        ok = await client.put("/api/serve/applications/", json={
            "applications": [{"name": "a", "import_path": "m:a"}]})
        assert ok.status == 200
        assert isinstance(facade.applied[0], ServeDeploySchema)
    _rest(test)


def test_rest_get_delete_and_version_as_rays_dashboard_answers():
    async def test(client, facade):
        got = await client.get("/api/serve/applications/?api_type=declarative")
        assert got.status == 200 and (await got.json())["source"] == "APIType.DECLARATIVE"
        bad = await client.get("/api/serve/applications/?api_type=nope")
        assert bad.status == 400 and "declarative" in await bad.text()
        assert (await client.delete("/api/serve/applications/")).status == 200
        assert facade.shutdowns == 1
        version = await (await client.get("/api/ray/version")).json()
        assert version["ray_version"] == "2.60.0" and int(version["version"]) >= 4
    _rest(test)


def test_driver_handles_follow_deployments_that_come_and_go(monkeypatch):
    from ray.serve._private.common import DeploymentID
    from ray.serve._private.long_poll import LongPollNamespace

    from controlplane.serve_facade import targets

    ended: list = []
    monkeypatch.setattr(targets, "_end_bridge", ended.append)
    monkeypatch.setattr(targets.HandleTargets, "_bridge_info",
                        lambda self, dep_id: f"bridge of {dep_id.name}")
    handles = targets.HandleTargets({})
    shop, later = DeploymentID("Shop", "shop"), DeploymentID("Later", "later")
    key = (LongPollNamespace.DEPLOYMENT_TARGETS, later)

    async def scenario():
        told = await handles.listen({(LongPollNamespace.DEPLOYMENT_TARGETS, shop): -1,
                                     key: -1}, {("shop", "Shop")})
        first = {k[1].name: v.object_snapshot for k, v in told.items()}
        both = {("shop", "Shop"), ("later", "Later")}
        handles.follow(both)  # deployed afterwards
        now_later = (await handles.listen({key: told[key].snapshot_id}, both))[key]
        handles.follow(set())  # both gone
        return first, now_later.object_snapshot
    first, now_later = asyncio.run(scenario())
    assert first["Shop"].is_available and first["Shop"].running_replicas == ["bridge of Shop"]
    assert not first["Later"].is_available and first["Later"].running_replicas == []
    assert now_later.is_available  # a handle made before its deploy is told, not stuck
    assert set(ended) == {shop, later}  # bridges end with their deployments
