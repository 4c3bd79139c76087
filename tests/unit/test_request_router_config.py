"""``request_router_config``: Serve's field, acted on as fleetplane's routing policies;
from a config file or from code, down to the spec routers get. No Ray."""

from __future__ import annotations

import pytest

from controlplane.config.request_router import SERVE_DEFAULT_ROUTER, policy_name
from controlplane.config.schema import parse_deploy_config
from controlplane.errors import ConfigError
from controlplane.usercode.build import build_application


def with_router(router: dict) -> dict:
    return {"applications": [{"name": "a", "import_path": "tests.unit.sample_apps:Model",
                              "deployments": [{"name": "Model",
                                               "request_router_config": router}]}]}


@pytest.mark.parametrize("name, policy", [
    ("prefix_kv", "prefix_kv"), ("round_robin", "round_robin"),
    (SERVE_DEFAULT_ROUTER, "p2c"),
    ("ray.serve._private.request_router.PowerOfTwoChoicesRequestRouter", "p2c"),
    ("ray.serve.llm.request_router.PrefixCacheAffinityRouter", "prefix"),
    ("ray.serve.llm.request_router:PrefixCacheAffinityRouter", "prefix")])
def test_fleetplane_names_and_serves_classes_name_a_policy(name, policy):
    assert policy_name(name) == policy


def test_an_unknown_router_is_an_error_naming_the_field_and_the_choices():
    with pytest.raises(ConfigError) as info:
        parse_deploy_config(with_router({"request_router_class": "my.pkg:SmartRouter"}))
    [error] = info.value.errors
    assert error.startswith("applications[0].deployments[0].request_router_config."
                            "request_router_class: unknown request router 'my.pkg:SmartRouter'")
    assert "p2c, round_robin, prefix, kv_load, prefix_kv, session" in error


@pytest.mark.parametrize("kwargs, field", [({"balance_factor": 0.5}, "balance_factor"),
                                           ({"session_header": "bad header"}, "session_header"),
                                           ({"threshold": 3}, "threshold")])
def test_bad_router_kwargs_are_named(kwargs, field):
    with pytest.raises(ConfigError) as info:
        parse_deploy_config(with_router({"request_router_class": "prefix",
                                         "request_router_kwargs": kwargs}))
    assert f"request_router_kwargs.{field}" in info.value.errors[0]


def build(router: dict | None, import_path: str = "tests.unit.sample_apps:Model"):
    deployments = [{"name": "Model", "request_router_config": router}] if router else []
    app = {"name": "a", "import_path": import_path, "route_prefix": "/",
           "deployments": deployments}
    cfg = parse_deploy_config({"applications": [app]})
    return build_application(cfg.applications[0].model_dump(exclude_none=True))


def test_the_policy_reaches_the_spec_with_its_settings():
    [spec] = build({"request_router_class": "session",
                    "request_router_kwargs": {"session_header": "X-Chat", "balance_factor": 2}})
    assert spec.request_router == {"name": "session", "balance_factor": 2.0,
                                   "session_header": "X-Chat"}
    [default] = build(None)
    assert default.request_router["name"] == "p2c"


def test_a_router_class_set_in_code_is_read_and_the_config_overrides_it():
    [spec] = build(None, "tests.unit.serve_shape_apps:prefix_routed")
    assert spec.request_router["name"] == "prefix"
    [spec] = build({"request_router_class": "kv_load"}, "tests.unit.serve_shape_apps:prefix_routed")
    assert spec.request_router["name"] == "kv_load"
