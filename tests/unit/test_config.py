"""The deploy config: defaults, YAML loading, and every rejection with its field path."""

from __future__ import annotations

import pickle

import pytest
from pydantic import ValidationError

from controlplane.config.schema import (AutoscalingConfig, DeployConfig, DeploymentConfig,
                                 check_deployment_options, config_to_dict, load_deploy_config,
                                 parse_deploy_config)
from controlplane.errors import ConfigError

FULL_YAML = """\
http_options: {host: 0.0.0.0, port: 8080}
controller_options: {num_shards: 4}
applications:
  - name: llm
    route_prefix: /llm
    import_path: apps.llm:app
    runtime_env: {pip: [vllm]}
    args: {model: tiny}
    deployments:
      - name: Generator
        max_ongoing_requests: 8
        max_queued_requests: -1
        user_config: {temperature: 0.5}
        autoscaling_config: {min_replicas: 1, max_replicas: 4, initial_replicas: 1}
        health_check_period_s: 5
        backpressure_config: {status_code: 429, retry_after_s: 1.5}
        ray_actor_options: {num_gpus: 1, memory: 1073741824, resources: {H200: 1}}
  - name: batch
    route_prefix: null
    import_path: apps.batch.build
"""


def write(tmp_path, text):
    path = tmp_path / "deploy.yaml"
    path.write_text(text)
    return path


def app(**fields):
    return {"name": "a", "import_path": "pkg.mod:app", **fields}


def with_deployment(**fields):
    return {"applications": [app(deployments=[{"name": "d", **fields}])]}


def errors_of(data) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_deploy_config(data)
    return info.value.errors


def paths_of(data) -> list[str]:
    return [error.split(": ", 1)[0] for error in errors_of(data)]


def test_defaults():
    cfg = parse_deploy_config({})
    assert cfg.applications == []
    assert (cfg.http_options.host, cfg.http_options.port) == ("127.0.0.1", 8000)
    assert cfg.controller_options.num_shards == 2
    application = parse_deploy_config({"applications": [{"import_path": "m:f"}]}).applications[0]
    assert (application.name, application.route_prefix, application.deployments) == ("default", "/", [])
    scaling = AutoscalingConfig()
    assert (scaling.min_replicas, scaling.max_replicas, scaling.initial_replicas) == (1, 1, None)
    assert (scaling.upscale_delay_s, scaling.downscale_delay_s) == (30.0, 600.0)
    deployment = DeploymentConfig(name="d")
    assert deployment.num_replicas is None and deployment.autoscaling_config is None


def test_full_config_loads_from_yaml(tmp_path):
    cfg = load_deploy_config(write(tmp_path, FULL_YAML))
    assert (cfg.http_options.port, cfg.controller_options.num_shards) == (8080, 4)
    llm, batch = cfg.applications
    assert llm.args == {"model": "tiny"} and llm.runtime_env == {"pip": ["vllm"]}
    generator = llm.deployments[0]
    assert generator.autoscaling_config.initial_replicas == 1
    assert generator.backpressure_config.status_code == 429
    assert generator.ray_actor_options.resources == {"H200": 1.0}
    assert batch.route_prefix is None and batch.import_path == "apps.batch.build"


DEPLOYMENT = "applications[0].deployments[0]"


@pytest.mark.parametrize(
    "data, path",
    [
        ({"http_options": {"port": 0}}, "http_options.port"),
        ({"http_options": {"port": 65536}}, "http_options.port"),
        ({"controller_options": {"num_shards": 65}}, "controller_options.num_shards"),
        (with_deployment(num_replicas=-1), f"{DEPLOYMENT}.num_replicas"),
        (with_deployment(max_ongoing_requests=0), f"{DEPLOYMENT}.max_ongoing_requests"),
        (with_deployment(max_queued_requests=-2), f"{DEPLOYMENT}.max_queued_requests"),
        (with_deployment(user_config={"s": {1, 2}}), f"{DEPLOYMENT}.user_config"),
        (with_deployment(user_config=float("nan")), f"{DEPLOYMENT}.user_config"),
        (with_deployment(health_check_period_s=0), f"{DEPLOYMENT}.health_check_period_s"),
        (with_deployment(health_check_timeout_s=float("inf")), f"{DEPLOYMENT}.health_check_timeout_s"),
        (with_deployment(graceful_shutdown_timeout_s=-1), f"{DEPLOYMENT}.graceful_shutdown_timeout_s"),
        (with_deployment(backpressure_config={"status_code": 500}),
         f"{DEPLOYMENT}.backpressure_config.status_code"),
        (with_deployment(backpressure_config={"retry_after_s": 0}),
         f"{DEPLOYMENT}.backpressure_config.retry_after_s"),
        (with_deployment(autoscaling_config={"min_replicas": 3}),
         f"{DEPLOYMENT}.autoscaling_config.max_replicas"),
        (with_deployment(autoscaling_config={"max_replicas": 4, "initial_replicas": 5}),
         f"{DEPLOYMENT}.autoscaling_config.initial_replicas"),
        (with_deployment(autoscaling_config={"target_ongoing_requests": 0}),
         f"{DEPLOYMENT}.autoscaling_config.target_ongoing_requests"),
        (with_deployment(ray_actor_options={"num_cpus": -1}), f"{DEPLOYMENT}.ray_actor_options.num_cpus"),
        (with_deployment(ray_actor_options={"resources": {"H200": -1}}),
         f"{DEPLOYMENT}.ray_actor_options.resources.H200"),
        ({"applications": [app(deployments=[{"name": "has space"}])]}, f"{DEPLOYMENT}.name"),
        ({"applications": [app(deployments=[{"name": ""}])]}, f"{DEPLOYMENT}.name"),
        ({"applications": [app(name="a/b")]}, "applications[0].name"),
        ({"applications": [app(route_prefix="api")]}, "applications[0].route_prefix"),
        ({"applications": [app(route_prefix="/api/")]}, "applications[0].route_prefix"),
        ({"applications": [app(args={"x": float("inf")})]}, "applications[0].args"),
        ({"applications": [{"name": "a"}]}, "applications[0].import_path"),
    ],
)
def test_each_invalid_value_is_reported_at_its_path(data, path):
    assert paths_of(data) == [path]


@pytest.mark.parametrize("import_path", ["pkg", "pkg:", ":app", "pkg.:app", "pkg:1app", "a b:c", "pkg."])
def test_bad_import_path_shows_both_accepted_forms(import_path):
    [error] = errors_of({"applications": [app(import_path=import_path)]})
    assert "'pkg.module:attr'" in error and "'pkg.module.attr'" in error
    assert f"(got: {import_path!r})" in error


@pytest.mark.parametrize("import_path", ["pkg.mod:app", "mod:app", "pkg.mod.app", "pkg.mod:Cls.attr"])
def test_good_import_paths_pass(import_path):
    assert parse_deploy_config({"applications": [app(import_path=import_path)]})


def test_value_errors_say_what_was_received():
    [error] = errors_of({"http_options": {"port": 70000}})
    assert error.startswith("http_options.port: ") and "(got: 70000)" in error
    [long_error] = errors_of({"applications": [app(route_prefix="x" * 200)]})
    assert "(got: 'xxx" in long_error and long_error.endswith("...)")


def test_all_errors_are_reported_at_once():
    data = {
        "http_options": {"port": 0},
        "applications": [app(route_prefix="nope", deployments=[{"name": "d", "num_replicas": -3}])],
    }
    assert sorted(paths_of(data)) == [
        "applications[0].deployments[0].num_replicas",
        "applications[0].route_prefix",
        "http_options.port",
    ]


def test_unknown_field_lists_the_accepted_fields():
    [top] = errors_of({"aplications": []})
    assert top == ("aplications: unknown field; accepted fields: applications, http_options, "
                   "controller_options; also accepted from Ray Serve configs, not acted on: "
                   "proxy_location, grpc_options, logging_config, tracing_config, target_capacity")
    [nested] = errors_of(with_deployment(autoscaling_config={"max_replica": 2}))
    assert nested.startswith(f"{DEPLOYMENT}.autoscaling_config.max_replica: unknown field;")
    assert "min_replicas, max_replicas, initial_replicas" in nested


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_deploy_config(missing)
    assert info.value.source == str(missing)
    assert str(missing) in info.value.errors[0]


def test_yaml_syntax_error_gives_the_line(tmp_path):
    path = write(tmp_path, "applications:\n  - name: a\n    import_path: x: y\n  - name: b\n")
    with pytest.raises(ConfigError) as info:
        load_deploy_config(path)
    [error] = info.value.errors
    assert error.startswith("<file>: invalid YAML at line 3, column 19: ")
    assert "mapping values are not allowed" in error


@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_empty_file_is_an_error(tmp_path, text):
    with pytest.raises(ConfigError) as info:
        load_deploy_config(write(tmp_path, text))
    assert "config is empty; expected a mapping with 'applications'" in info.value.errors[0]


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n"])
def test_top_level_must_be_a_mapping(tmp_path, text):
    with pytest.raises(ConfigError) as info:
        load_deploy_config(write(tmp_path, text))
    [error] = info.value.errors
    assert error.startswith("<root>: expected a mapping with 'applications'")


def test_duplicate_application_names_and_route_prefixes():
    data = {"applications": [app(name="x"), app(name="x", route_prefix="/b"), app(name="y")]}
    errors = errors_of(data)
    assert [e.split(": ", 1)[0] for e in errors] == ["applications", "applications"]
    assert "duplicate application name 'x'" in errors[0]
    # 'x' and 'y' share the default "/" prefix; both are named.
    assert "duplicate route_prefix '/'" in errors[1] and "'x'" in errors[1] and "'y'" in errors[1]


def test_apps_without_a_route_may_coexist():
    data = {"applications": [app(name="x", route_prefix=None), app(name="y", route_prefix=None)]}
    assert len(parse_deploy_config(data).applications) == 2


def test_duplicate_deployment_names():
    [error] = errors_of({"applications": [app(deployments=[{"name": "d"}, {"name": "d"}])]})
    assert error.startswith("applications[0].deployments: duplicate deployment name 'd'")


def test_num_replicas_and_autoscaling_conflict():
    [error] = errors_of(with_deployment(num_replicas=2, autoscaling_config={}))
    assert error.startswith(f"{DEPLOYMENT}.num_replicas: ")
    assert "set either num_replicas or autoscaling_config, not both" in error


def test_overrides_are_only_the_fields_set():
    cfg = parse_deploy_config(with_deployment(
        max_ongoing_requests=4, num_replicas=None, autoscaling_config={"max_replicas": 3}
    ))
    overrides = cfg.applications[0].deployments[0].overrides()
    assert set(overrides) == {"max_ongoing_requests", "autoscaling_config"}
    assert overrides["autoscaling_config"]["max_replicas"] == 3
    assert overrides["autoscaling_config"]["min_replicas"] == 1  # nested model is dumped whole
    assert DeploymentConfig(name="d").overrides() == {}


def test_config_error_pickles_and_renders():
    with pytest.raises(ConfigError) as info:
        parse_deploy_config({"http_options": {"port": 0}, "bogus": 1}, source="x.yaml")
    error = info.value
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.source, copy.errors) == ("x.yaml", error.errors)
    lines = str(copy).splitlines()
    assert lines[0] == "invalid deploy config x.yaml: 2 error(s)"
    assert lines[1:] == [f"  - {e}" for e in error.errors]


def test_round_trip_through_dict(tmp_path):
    cfg = load_deploy_config(write(tmp_path, FULL_YAML))
    again = parse_deploy_config(config_to_dict(cfg))
    assert again == cfg
    assert again.applications[0].deployments[0].overrides() == cfg.applications[0].deployments[0].overrides()


def test_user_config_is_normalised_to_json():
    cfg = parse_deploy_config(with_deployment(user_config={1: (2, 3)}))
    assert cfg.applications[0].deployments[0].user_config == {"1": [2, 3]}
    assert parse_deploy_config(config_to_dict(cfg)) == cfg


def test_models_are_frozen():
    with pytest.raises(ValidationError):
        DeployConfig().http_options.port = 1


def test_scale_to_zero_is_accepted_with_its_delay_and_hold():
    cfg = parse_deploy_config(with_deployment(autoscaling_config={
        "min_replicas": 0, "max_replicas": 2, "downscale_to_zero_delay_s": 120,
        "cold_start_hold_s": 10}))
    scaling = cfg.applications[0].deployments[0].autoscaling_config
    assert (scaling.min_replicas, scaling.downscale_to_zero_delay_s,
            scaling.cold_start_hold_s) == (0, 120.0, 10.0)


@pytest.mark.parametrize("scaling, field", [
    ({"min_replicas": 0, "max_replicas": 0}, "max_replicas"),
    ({"min_replicas": 0, "max_replicas": 2, "downscale_to_zero_delay_s": -1},
     "downscale_to_zero_delay_s"),
    ({"min_replicas": 0, "max_replicas": 2, "cold_start_hold_s": -5}, "cold_start_hold_s"),
])
def test_bad_scale_to_zero_settings_are_errors_naming_the_field(scaling, field):
    errors = errors_of(with_deployment(autoscaling_config=scaling))
    assert len(errors) == 1
    assert errors[0].startswith(
        f"applications[0].deployments[0].autoscaling_config.{field}"), errors


# ---- options set in code, through the same schema ---------------------------------------

def test_checked_options_fill_in_the_autoscaling_defaults():
    checked = check_deployment_options(
        {"autoscaling_config": {"min_replicas": 2, "max_replicas": 5}, "user_config": (1, 2)},
        "app 'a', deployment 'd'")
    assert checked["autoscaling_config"] == AutoscalingConfig(
        min_replicas=2, max_replicas=5).model_dump()
    assert checked["user_config"] == [1, 2]  # normalised to JSON, as in the file
    assert check_deployment_options({}, "x") == {}


def test_checked_options_list_every_problem_by_field_without_a_name():
    with pytest.raises(ConfigError) as info:
        check_deployment_options({"num_replicas": "auto", "autoscaling_config": {
            "min_replicas": 3, "smoothing_factor": 0.5}}, "app 'a', deployment 'd'")
    assert info.value.source == "app 'a', deployment 'd'"
    assert sorted(e.split(": ", 1)[0] for e in info.value.errors) == [
        "autoscaling_config.smoothing_factor", "num_replicas"]
    unknown = next(e for e in info.value.errors if "smoothing_factor" in e)
    assert "accepted fields: min_replicas, max_replicas" in unknown


def test_checked_options_apply_the_cross_field_checks():
    with pytest.raises(ConfigError) as info:
        check_deployment_options({"autoscaling_config": {"min_replicas": 3}}, "x")
    [error] = info.value.errors
    assert error.startswith("autoscaling_config.max_replicas: max_replicas (1) is below")


def test_upstream_name_of_the_drain_rate_policy_is_accepted_and_means_the_same():
    from controlplane.config.schema import BackpressureConfig

    assert BackpressureConfig(retry_after_policy="queue_drain_rate").retry_after_policy == \
        "router_queue_drain_rate"


@pytest.mark.parametrize("bad, field", [({"retry_after_policy": "fastest"}, "retry_after_policy"),
                                        ({"retry_after_s": -1}, "retry_after_s"),
                                        ({"retry_after_s": float("nan")}, "retry_after_s"),
                                        ({"retry_after_s": float("inf")}, "retry_after_s")])
def test_bad_backpressure_values_are_errors_naming_the_field(bad, field):
    from controlplane.config.schema import BackpressureConfig

    with pytest.raises(ValidationError, match=field):
        BackpressureConfig(**bad)
