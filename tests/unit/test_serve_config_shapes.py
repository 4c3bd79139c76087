"""Ray Serve's config and builder shapes, as its docs show them, accepted by fleetplane.

- Every field of Serve 2.60's deploy schema loads, with Serve's type; those fleetplane
  does not act on are named by ``ignored_fields`` (and logged), never dropped silently.
- Builders: typed args validated into the builder's pydantic model, with a clear
  ``BuildError`` naming application and field when they do not fit, before any commit.
- Options set in code that fleetplane does not implement are reported by the build.

Nothing here starts Ray: builds run in-process (``build_with_warnings``).
"""

from __future__ import annotations

import asyncio
import logging

import pytest
import ray.cloudpickle as cloudpickle
import yaml

from controlplane import controller as controller_module
from controlplane.config.schema import (DeploymentConfig, config_to_dict, ignored_fields,
                                 load_deploy_config, parse_deploy_config)
from controlplane.config.serve_compat import AUTO_AUTOSCALING
from controlplane.errors import BuildError, ConfigError
from controlplane.usercode.build import build_application, build_with_warnings

APPS = "tests.unit.serve_shape_apps"
SAMPLES = "tests.unit.sample_apps"
NOTE = "accepted for compatibility with Ray Serve but not acted on by fleetplane"

# A Serve 2.60 deploy config with every field fleetplane does not act on, set.
SERVE_YAML = """\
proxy_location: HeadOnly
http_options:
  host: 0.0.0.0
  port: 8000
  root_path: /serve
  request_timeout_s: 30
  keep_alive_timeout_s: 5
  ssl_keyfile: /k.pem
  ssl_certfile: /c.pem
  ssl_keyfile_password: secret
  ssl_ca_certs: /ca.pem
  middlewares: [my.middleware]
grpc_options: {port: 9000, grpc_servicer_functions: [my.pb2_grpc.add_Servicer_to_server]}
logging_config: {encoding: JSON, log_level: 10, logs_dir: /tmp/x, enable_access_log: false}
tracing_config: {enabled: true, sampling_ratio: 0.5}
target_capacity: 50
controller_options: {num_shards: 2, runtime_env: {env_vars: {A: "1"}}}
applications:
  - name: app
    route_prefix: /
    import_path: pkg.mod:app
    autoscaling_policy: {policy_function: pkg.mod:policy}
    logging_config: {log_level: DEBUG}
    external_scaler_enabled: true
    deployments:
      - name: Model
        num_replicas: 2
        graceful_shutdown_wait_loop_s: 2
        placement_group_bundles: [{CPU: 1}, {GPU: 1}]
        placement_group_strategy: STRICT_PACK
        placement_group_bundle_label_selector: [{zone: a}]
        max_replicas_per_node: 3
        logging_config: {log_level: WARNING}
        request_router_config:
          request_router_class: ray.serve.llm.request_router.PrefixCacheAffinityRouter
          request_router_kwargs: {imbalanced_threshold: 20}
          request_routing_stats_period_s: 5
        gang_scheduling_config: {gang_size: 2}
        deployment_actors: [{name: cache, actor_class: pkg.mod:Cache}]
        rolling_update_percentage: 0.5
        max_surge_percent: 10
        ray_actor_options: {num_cpus: 1, label_selector: {zone: a}}
      - name: Scaled
        autoscaling_config:
          min_replicas: 1
          max_replicas: 4
          metrics_interval_s: 5
          smoothing_factor: 0.5
          upscale_smoothing_factor: 1.5
          downscale_smoothing_factor: 0.5
          upscaling_factor: 2
          downscaling_factor: 0.5
          downscale_to_zero_delay_s: 60
          aggregation_function: MAX
          policy: {policy_function: pkg.mod:policy}
"""

SERVE_ONLY_PATHS = [
    "proxy_location", "grpc_options", "logging_config", "tracing_config", "target_capacity",
    # keep_alive_timeout_s is acted on (config.HTTPOptions): the proxy's idle timeout
    *(f"http_options.{f}" for f in ("root_path", "request_timeout_s",
                                    "ssl_keyfile", "ssl_certfile", "ssl_keyfile_password",
                                    "ssl_ca_certs", "middlewares")),
    "controller_options.runtime_env",
    *(f"applications[0].{f}" for f in ("autoscaling_policy", "logging_config",
                                       "external_scaler_enabled")),
    *(f"applications[0].deployments[0].{f}" for f in (
        "graceful_shutdown_wait_loop_s", "placement_group_bundles", "placement_group_strategy",
        "placement_group_bundle_label_selector", "max_replicas_per_node", "logging_config",
        "request_router_config.request_router_kwargs.imbalanced_threshold",
        "request_router_config.request_routing_stats_period_s", "gang_scheduling_config",
        "deployment_actors", "rolling_update_percentage", "max_surge_percent")),
    *(f"applications[0].deployments[1].autoscaling_config.{f}" for f in (
        "metrics_interval_s", "smoothing_factor", "upscale_smoothing_factor",
        "downscale_smoothing_factor", "upscaling_factor", "downscaling_factor",
        "aggregation_function", "policy")),
]


def serve_config() -> dict:
    return yaml.safe_load(SERVE_YAML)


def errors_of(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_deploy_config(data)
    return info.value.errors


def with_deployment(**fields) -> dict:
    return {"applications": [{"name": "a", "import_path": "pkg.mod:app",
                              "deployments": [{"name": "d", **fields}]}]}


def app_config(import_path: str, *, deployments: list | None = None, **fields) -> dict:
    raw = {"name": "app", "import_path": import_path, "deployments": deployments or [], **fields}
    return config_to_dict(parse_deploy_config({"applications": [raw]}))["applications"][0]


def build(import_path: str, **kwargs):
    return build_application(app_config(import_path, **kwargs))


# ---- the deploy config --------------------------------------------------------------------

def test_every_serve_field_loads_and_each_one_not_acted_on_is_named(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text(SERVE_YAML)
    cfg = load_deploy_config(path)
    assert sorted(ignored_fields(cfg)) == sorted(f"{p}: {NOTE}" for p in SERVE_ONLY_PATHS)
    # What fleetplane acts on is read as before, beside the Serve-only fields.
    assert (cfg.http_options.host, cfg.http_options.port) == ("0.0.0.0", 8000)
    assert cfg.logging_config.log_level == "DEBUG"  # an int level, named as Serve does
    model = cfg.applications[0].deployments[0]
    assert model.ray_actor_options.label_selector == {"zone": "a"}  # passed to Ray
    assert cfg.applications[0].deployments[1].autoscaling_config.aggregation_function == "max"


def test_serve_fields_keep_the_round_trip_invariant():
    cfg = parse_deploy_config(serve_config())
    assert parse_deploy_config(config_to_dict(cfg)) == cfg
    assert ignored_fields(parse_deploy_config(config_to_dict(cfg))) == ignored_fields(cfg)


def test_values_that_ask_for_what_fleetplane_does_are_not_reported():
    data = {"proxy_location": "EveryNode", "target_capacity": 100, "applications": [
        {"import_path": "pkg.mod:app", "external_scaler_enabled": False, "deployments": [
            {"name": "d", "autoscaling_config": {"aggregation_function": "MEAN"}}]}]}
    assert ignored_fields(parse_deploy_config(data)) == []
    assert ignored_fields(parse_deploy_config({})) == []


def test_parse_logs_each_field_not_acted_on_unless_told_not_to(caplog):
    data = with_deployment(max_replicas_per_node=2)
    with caplog.at_level(logging.WARNING, logger="controlplane.config.schema"):
        parse_deploy_config(data, source="x.yaml")
        parse_deploy_config(data, source="quiet.yaml", log_ignored=False)
    assert [r.getMessage() for r in caplog.records] == [
        f"x.yaml: applications[0].deployments[0].max_replicas_per_node: {NOTE}"]


@pytest.mark.parametrize("data, path", [
    (with_deployment(max_replicas_per_node="two"), "deployments[0].max_replicas_per_node"),
    (with_deployment(max_replicas_per_node=0), "deployments[0].max_replicas_per_node"),
    (with_deployment(graceful_shutdown_wait_loop_s="soon"),
     "deployments[0].graceful_shutdown_wait_loop_s"),
    (with_deployment(placement_group_bundles=[{"CPU": "one"}]),
     "deployments[0].placement_group_bundles[0].CPU"),
    (with_deployment(placement_group_strategy="PILE"), "deployments[0].placement_group_strategy"),
    (with_deployment(rolling_update_percentage=2), "deployments[0].rolling_update_percentage"),
    (with_deployment(logging_config={"log_level": "LOUD"}),
     "deployments[0].logging_config.log_level"),
    (with_deployment(autoscaling_config={"smoothing_factor": "x"}),
     "deployments[0].autoscaling_config.smoothing_factor"),
    ({"http_options": {"keep_alive_timeout_s": "long"}}, "http_options.keep_alive_timeout_s"),
    ({"proxy_location": "Everywhere"}, "proxy_location"),
    ({"grpc_options": {"port": "x"}}, "grpc_options.port"),
    ({"target_capacity": 150}, "target_capacity"),
    ({"controller_options": {"runtime_env": {"pip": ["x"]}}}, "controller_options.runtime_env"),
])
def test_a_wrong_value_in_a_field_not_acted_on_is_an_error_naming_it(data, path):
    [error] = errors_of(data)
    assert error.split(": ", 1)[0].endswith(path)


def test_ssl_files_come_together_as_serve_requires():
    [error] = errors_of({"http_options": {"ssl_keyfile": "/k.pem"}})
    assert error.startswith("http_options.ssl_certfile: set both ssl_keyfile and ssl_certfile")


def test_unknown_keys_are_still_errors_listing_serve_fields_apart():
    [error] = errors_of(with_deployment(max_replica_per_node=2))
    assert error.startswith("applications[0].deployments[0].max_replica_per_node: unknown field;"
                            " accepted fields: num_replicas, max_ongoing_requests,")
    assert "; also accepted from Ray Serve configs, not acted on: " in error
    assert "max_replicas_per_node" in error.split("not acted on: ")[1]


def test_overrides_are_only_what_fleetplane_acts_on():
    cfg = parse_deploy_config(with_deployment(
        max_replicas_per_node=2, max_ongoing_requests=4,
        autoscaling_config={"max_replicas": 3, "smoothing_factor": 0.5}))
    overrides = cfg.applications[0].deployments[0].overrides()
    assert set(overrides) == {"max_ongoing_requests", "autoscaling_config"}
    assert "smoothing_factor" not in overrides["autoscaling_config"]


def test_num_replicas_auto_with_autoscaling_is_resolved_over_serves_auto_defaults():
    cfg = parse_deploy_config(with_deployment(num_replicas="auto",
                                              autoscaling_config={"max_replicas": 7}))
    entry = cfg.applications[0].deployments[0]
    assert entry.num_replicas is None
    scaling = entry.autoscaling_config
    assert (scaling.min_replicas, scaling.max_replicas,
            scaling.target_ongoing_requests) == (1, 7, 2.0)
    assert parse_deploy_config(config_to_dict(cfg)) == cfg


def test_num_replicas_auto_alone_is_kept_and_a_bad_count_is_one_error():
    entry = DeploymentConfig(name="d", num_replicas="auto")
    assert entry.num_replicas == "auto" and entry.overrides() == {"num_replicas": "auto"}
    cfg = parse_deploy_config(with_deployment(num_replicas="auto"))
    assert parse_deploy_config(config_to_dict(cfg)) == cfg
    [error] = errors_of(with_deployment(num_replicas="many"))
    assert error == ("applications[0].deployments[0].num_replicas: must be 'auto' or a value "
                     "from 0 to 100000 replicas (got: 'many')")


# ---- builders ---------------------------------------------------------------------------

def test_typed_builder_gets_its_args_validated_into_its_model():
    [spec] = build(f"{APPS}:typed_builder", args={"greeting": "hi", "times": "3"})
    assert spec.id.name == "Model"
    _, _, init_kwargs = cloudpickle.loads(spec.serialized_def)
    assert init_kwargs == {"greeting": "hi", "size": 3}  # "3" made an int by GreetArgs


def test_typed_args_that_do_not_fit_are_a_build_error_naming_app_and_fields():
    with pytest.raises(BuildError) as info:
        build(f"{APPS}:typed_builder", args={"times": "often", "extra": 1})
    error = info.value
    assert error.app == "app"
    assert str(error).startswith("application 'app': args do not fit GreetArgs, the type of "
                                 "typed_builder()'s parameter 'args':")
    assert "\n  - args.greeting: Field required" in str(error)
    assert "\n  - args.times: Input should be a valid integer" in str(error)
    assert "Traceback" not in str(error)


def test_a_failed_typed_build_commits_nothing(monkeypatch):
    """The controller commits only after every build succeeded (builds run in-process)."""
    committed = []

    async def build_here(apps, timeout_s):
        return [spec for app in apps for spec in build_application(app)], []

    async def commit(*args, **kwargs):
        committed.append(args)

    monkeypatch.setattr(controller_module, "build_all", build_here)
    controller = controller_module.Controller.__new__(controller_module.Controller)
    controller._shards, controller._deploying, controller._commit = [], None, commit
    config = {"applications": [{"name": "app", "import_path": f"{APPS}:typed_builder",
                                "args": {"times": 2}}]}
    with pytest.raises(BuildError, match="args.greeting: Field required"):
        asyncio.run(controller._apply(config))
    assert committed == [] and controller._deploying is None


def test_builders_without_args_are_told_apart_by_their_signature():
    # Serve calls each as a builder with {}: -> Application, or a pydantic parameter.
    assert build(f"{APPS}:dict_builder")[0].id.name == "Model"
    assert build(f"{APPS}:defaults_builder")[0].id.name == "Model"
    assert build(f"{APPS}:unresolvable_builder")[0].id.name == "Model"
    # fleetplane's own shape stays: a plain function without args is the deployment.
    assert build(f"{SAMPLES}:echo")[0].id.name == "echo"


def test_a_builder_takes_exactly_one_parameter():
    with pytest.raises(BuildError, match=r"two_parameter_builder\(\) must take exactly one "
                                         r"parameter, the application's args; it takes 2"):
        build(f"{APPS}:two_parameter_builder", args={"a": 1})


def test_args_for_a_built_application_are_refused_as_serve_does():
    with pytest.raises(BuildError, match="import_path names a built Serve application"):
        build(f"{SAMPLES}:serve_app", args={"greeting": "x"})


# ---- options set in code ------------------------------------------------------------------

class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_code_options_fleetplane_does_not_implement_are_reported():
    # A handler on the build's own logger, not caplog's on the root: the module built
    # imports Ray Serve LLM, whose first import replaces the root logger's handlers.
    logger, kept = logging.getLogger("controlplane.usercode.build"), _Kept()
    logger.addHandler(kept)
    try:
        [spec], warnings = build_with_warnings(app_config(f"{APPS}:unimplemented_options_app"))
    finally:
        logger.removeHandler(kept)
    assert spec.max_ongoing_requests == 3  # what fleetplane implements still applies
    assert warnings == [f"application 'app', deployment 'Model': {option} set in code is {NOTE}"
                        for option in ("graceful_shutdown_wait_loop_s", "logging_config",
                                       "max_replicas_per_node")]
    assert kept.messages == warnings


def test_config_fields_not_acted_on_do_not_reach_the_spec():
    [spec], warnings = build_with_warnings(app_config(f"{SAMPLES}:Model", deployments=[{
        "name": "Model", "max_replicas_per_node": 2, "num_replicas": 2,
        "ray_actor_options": {"num_cpus": 1, "label_selector": {"zone": "a"}}}]))
    assert spec.num_replicas == 2 and warnings == []  # the config's are parse's to report
    assert spec.ray_actor_options == {"num_cpus": 1.0, "label_selector": {"zone": "a"}}


def test_num_replicas_auto_in_code_autoscales_with_serves_defaults():
    [spec] = build(f"{APPS}:auto_app")
    assert spec.autoscaling_config["max_replicas"] == 100
    assert spec.num_replicas == 1


def test_num_replicas_auto_in_the_config_lays_serves_defaults_under_the_codes():
    [plain] = build(f"{SAMPLES}:Model", deployments=[{"name": "Model", "num_replicas": "auto"}])
    assert {k: plain.autoscaling_config[k] for k in AUTO_AUTOSCALING} == AUTO_AUTOSCALING
    [coded] = build(f"{SAMPLES}:autoscaled_app",
                    deployments=[{"name": "Model", "num_replicas": "auto"}])
    assert (coded.autoscaling_config["min_replicas"], coded.autoscaling_config["max_replicas"],
            coded.num_replicas) == (2, 5, 3)  # the code's, over the "auto" defaults
