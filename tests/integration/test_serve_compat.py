"""Ray Serve applications run unchanged (issue 12): FastAPI ingress, Serve's replica
context, @serve.batch, @serve.multiplexed, handles from this driver process (chaining,
streaming, multiplexed ids), calling conventions and reconfigure with rank. The apps in
``serve_compat_apps`` use only Serve's API; the answers asserted are those Serve's
documentation specifies."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from ray import serve
from websockets.exceptions import ConnectionClosedOK, InvalidStatus
from websockets.sync.client import connect

import fleetplane  # noqa: F401  (a driver script's one line: Serve's handle API answers)
from tests.integration.conftest import BASE_URL, app, dep_status, deploy, settled, wait_for

pytestmark = pytest.mark.integration
APPS = "tests.integration.serve_compat_apps"
DEPLOYED: dict = {}  # what the module's deploy answered


def get(path: str, **kwargs) -> requests.Response:
    return requests.get(BASE_URL + path, timeout=30, **kwargs)


@pytest.fixture(scope="module")
def compat(fleet):
    result = deploy(fleet,
           app("compat-api", f"{APPS}:api_app", deployments=[{"name": "Api", "num_replicas": 2}]),
           app("compat-standalone", f"{APPS}:standalone_app",
               deployments=[{"name": "ASGIIngressDeployment"}]),
           app("compat-factory", f"{APPS}:factory_app",
               deployments=[{"name": "ASGIIngressDeployment"}, {"name": "Adder"}]),
           app("compat-batch", f"{APPS}:batch_app", deployments=[{"name": "Batcher"}]),
           app("compat-multi", f"{APPS}:multi_app", deployments=[{"name": "Multi"}]),
           app("compat-noreq", f"{APPS}:no_request", deployments=[{"name": "no_request"}]),
           app("compat-shop", f"{APPS}:shop_app",
               deployments=[{"name": "Shop", "user_config": {"tax": 7}}]),
           app("compat-greet", f"{APPS}:greeter_builder", args={"greeting": "hi", "times": 2},
               deployments=[{"name": "Greeter", "max_replicas_per_node": 1}]))
    DEPLOYED["warnings"] = result["warnings"]
    wait_for(fleet, lambda s: all(settled(*a)(s) for a in [
        ("compat-api", 2, "Api"), ("compat-standalone", 1, "ASGIIngressDeployment"),
        ("compat-factory", 1, "ASGIIngressDeployment"), ("compat-factory", 1, "Adder"),
        ("compat-batch", 1, "Batcher"), ("compat-multi", 2, "Multi"),
        ("compat-noreq", 1, "no_request"), ("compat-shop", 1, "Shop"),
        ("compat-greet", 1, "Greeter")]), what="compat apps")
    wait_for(fleet, lambda s: get("/-/routes").json().get("/compat-shop") == "compat-shop/Shop",
             what="proxy routes")
    return fleet


def test_fastapi_routes_params_bodies_and_docs_under_the_prefix(compat):
    assert get("/compat-api/hi?name=ray").json() == "hey ray"
    r = requests.post(BASE_URL + "/compat-api/items/7", json={"name": "pen", "price": 1.5},
                      timeout=30)
    assert r.json() == {"id": 7, "item": {"name": "pen", "price": 1.5}, "total": 3.0}
    bad = requests.post(BASE_URL + "/compat-api/items/x", json={"name": "pen"}, timeout=30)
    assert bad.status_code == 422  # FastAPI's own validation answer
    assert get("/compat-api/nope").status_code == 404
    schema = get("/compat-api/openapi.json").json()
    assert "/items/{item_id}" in schema["paths"]
    docs = get("/compat-api/docs")
    assert docs.status_code == 200 and "/compat-api/openapi.json" in docs.text


def test_websocket_through_the_proxy(compat):
    url = BASE_URL.replace("http://", "ws://") + "/compat-api/ws"
    with connect(url, open_timeout=30) as ws:
        for word in ("a", "b"):
            ws.send(word)
            assert ws.recv(timeout=30) == f"hey {word}"
        ws.send("bye")
        with pytest.raises(ConnectionClosedOK):
            ws.recv(timeout=30)
    with pytest.raises(InvalidStatus):  # no route: refused before the handshake completes
        connect(BASE_URL.replace("http://", "ws://") + "/nowhere/ws", open_timeout=30)


def test_replica_context_in_constructor_and_requests(compat):
    seen = {}
    for _ in range(40):
        body = get("/compat-api/whoami").json()
        seen[body["tag"]] = body
        if len(seen) == 2:
            break
    assert sorted(b["rank"] for b in seen.values()) == [0, 1]
    for body in seen.values():
        assert (body["app"], body["deployment"], body["world_size"]) == ("compat-api", "Api", 2)
        assert body["born"] == ["compat-api", "Api"]


def test_standalone_app_and_factory_with_handle_by_name(compat):
    assert get("/compat-standalone/square/9").json() == {"square": 81}
    assert get("/compat-factory/add/5").json() == {"sum": 105}


def test_batch_collects_concurrent_requests(compat):
    with ThreadPoolExecutor(8) as pool:
        bodies = list(pool.map(lambda x: get(f"/compat-batch?x={x}").json(), range(8)))
    assert [b["value"] for b in bodies] == [x * 2 for x in range(8)]
    assert max(b["batch_size"] for b in bodies) > 1


def test_batched_generator_streams_through_a_driver_handle(compat):
    handle = serve.get_app_handle("compat-batch").options(method_name="stream", stream=True)
    streams = [handle.remote(n) for n in (2, 4)]
    assert [list(s) for s in streams] == [["0", "1"], ["0", "1", "2", "3"]]


def test_multiplexed_id_from_header_and_handle_routes_to_the_holder(compat):
    first = get("/compat-multi", headers={"serve_multiplexed_model_id": "m1"}).json()
    assert (first["model_id"], first["model"]) == ("m1", "model:m1")
    handle = serve.get_app_handle("compat-multi").options(multiplexed_model_id="m1")

    def holders() -> set[str]:
        replicas = dep_status(compat.status(), "compat-multi", "Multi")["replicas"]
        return {r["replica_id"] for r in replicas if "m1" in r.get("model_ids", [])}

    def answered() -> set[str]:
        return {handle.remote().result()["replica"] for _ in range(6)} | \
            {get("/compat-multi", headers={"serve_multiplexed_model_id": "m1"})
             .json()["replica"] for _ in range(6)}

    # The replica reports m1 (status shows it); once the routers (the proxies', this
    # driver's) know, m1 goes only to a holder (a request routed before they knew may
    # have loaded m1 on the other replica too: then both are holders).
    wait_for(compat, lambda s: first["replica"] in holders(), what="m1 reported")
    wait_for(compat, lambda s: answered() <= holders(), what="m1 routed to its holders")
    settled_holders = holders()
    assert answered() <= settled_holders and holders() == settled_holders  # no new loads
    other = serve.get_app_handle("compat-multi").options(multiplexed_model_id="m2")
    assert other.remote().result()["model_id"] == "m2"


def test_driver_handles_chain_and_pick_methods(compat):
    shop = serve.get_app_handle("compat-shop")
    one = shop.add_one.remote(1)
    chained = shop.options(method_name="add_one").remote(one)  # resolved before the call
    assert chained.result() == 3
    assert list(shop.options(method_name="numbers", stream=True).remote(3)) == [0, 1, 2]
    by_name = serve.get_deployment_handle("Shop", app_name="compat-shop")
    assert by_name.reconfigured.remote().result() == [({"tax": 7}, 0)]
    with pytest.raises(ValueError, match="does not exist"):
        serve.get_app_handle("no-such-app")


def test_calling_conventions_and_serve_json(compat):
    assert get("/compat-noreq").json() == {"called": "without a request"}
    r = get("/compat-shop?item=cake")
    assert r.headers["content-type"] == "application/json"
    assert r.text == '{"item":"cake","cents":250}'  # pydantic, Serve's compact JSON


def test_typed_builder_args_and_serve_fields_not_acted_on_are_named(compat):
    assert get("/compat-greet").text == "hi hi"
    assert any("deployments[0].max_replicas_per_node" in w and "not acted on" in w
               for w in DEPLOYED["warnings"]), DEPLOYED["warnings"]
