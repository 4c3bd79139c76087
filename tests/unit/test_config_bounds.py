"""The config's limits (``config_bounds``, ``config_runtime_env``), one test per row of
issue 15's "accepted, should not be": each is refused with the field, the value and the
allowed range; the values just inside each bound still load."""

from __future__ import annotations

import pytest

from controlplane.config.schema import config_to_dict, parse_deploy_config
from controlplane.config.bounds import (MAX_MEMORY_BYTES, MAX_REPLICAS, MAX_USER_CONFIG_BYTES,
                                        route_prefix_problem)
from controlplane.errors import BuildError, ConfigError
from controlplane.usercode.build import build_application

DEPLOYMENT = "applications[0].deployments[0]"


def app(**fields):
    return {"name": "a", "import_path": "pkg.mod:app", **fields}


def with_deployment(**fields):
    return {"applications": [app(deployments=[{"name": "d", **fields}])]}


def nested(path: str, value):
    """``with_deployment`` (or the top level, for ``controller_options``...) with ``value``
    at the dotted ``path``."""
    *parents, leaf = path.split(".")
    inner = {leaf: value}
    for parent in reversed(parents):
        inner = {parent: inner}
    top = parents[0] if parents else leaf
    return inner if top in ("controller_options", "http_options") else with_deployment(**inner)


def error_at(data) -> str:
    with pytest.raises(ConfigError) as info:
        parse_deploy_config(data)
    [error] = info.value.errors
    return error


NUMBER_FIELDS = [
    "num_replicas", "max_ongoing_requests", "max_queued_requests", "health_check_period_s",
    "health_check_timeout_s", "graceful_shutdown_timeout_s",
    "autoscaling_config.min_replicas", "autoscaling_config.max_replicas",
    "autoscaling_config.initial_replicas", "autoscaling_config.target_ongoing_requests",
    "autoscaling_config.upscale_delay_s", "autoscaling_config.downscale_delay_s",
    "autoscaling_config.look_back_period_s", "backpressure_config.retry_after_s",
    "ray_actor_options.num_cpus", "ray_actor_options.num_gpus", "ray_actor_options.memory",
    "ray_actor_options.resources.H200", "controller_options.num_shards",
    "controller_options.build_timeout_s",
    # Serve's fields, not acted on: still numbers
    "max_replicas_per_node", "rolling_update_percentage", "max_surge_percent",
    "graceful_shutdown_wait_loop_s", "autoscaling_config.smoothing_factor",
]


def expected_path(path: str) -> str:
    return path if path.startswith("controller_options") else f"{DEPLOYMENT}.{path}"


# ---- numbers are numbers ------------------------------------------------------------------

@pytest.mark.parametrize("path", NUMBER_FIELDS)
@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_not_a_number(path, value):
    error = error_at(nested(path, value))
    assert error.startswith(f"{expected_path(path)}: ")
    assert f"(got: {value})" in error


@pytest.mark.parametrize("path", NUMBER_FIELDS)
def test_a_string_is_not_a_number(path):
    assert error_at(nested(path, "3")).startswith(f"{expected_path(path)}: ")


def test_the_boolean_error_says_what_to_use_instead():
    assert error_at(with_deployment(max_ongoing_requests=True)) == (
        f"{DEPLOYMENT}.max_ongoing_requests: must be a number, not true or false; use a value "
        "from 1 to 1000000 requests (got: True)")


def test_a_whole_float_counts_and_a_fraction_does_not():
    cfg = parse_deploy_config(with_deployment(num_replicas=2.0))
    assert cfg.applications[0].deployments[0].num_replicas == 2
    assert "must be a whole number" in error_at(with_deployment(max_ongoing_requests=2.5))


def test_an_int_is_taken_where_a_float_is_expected():
    cfg = parse_deploy_config(with_deployment(health_check_period_s=10))
    assert cfg.applications[0].deployments[0].health_check_period_s == 10.0


# ---- bounds ----------------------------------------------------------------------------

def test_the_range_error_names_field_value_and_range():
    assert error_at(with_deployment(health_check_period_s=1e-9)) == (
        f"{DEPLOYMENT}.health_check_period_s: out of range; use a value from 0.1 to 86400 "
        "seconds (got: 1e-09)")


@pytest.mark.parametrize("path, value, allowed", [
    ("health_check_period_s", 1e308, "from 0.1 to 86400 seconds"),
    ("health_check_timeout_s", 0.01, "from 0.1 to 86400 seconds"),
    ("health_check_timeout_s", 1e18, "from 0.1 to 86400 seconds"),
    ("graceful_shutdown_timeout_s", 1e18, "from 0 to 86400 seconds"),
    ("graceful_shutdown_timeout_s", float("nan"), "from 0 to 86400 seconds"),
    ("autoscaling_config.upscale_delay_s", 86_401, "from 0 to 86400 seconds"),
    ("autoscaling_config.downscale_delay_s", float("inf"), "from 0 to 86400 seconds"),
    ("autoscaling_config.look_back_period_s", 0, "above 0 and up to 86400 seconds"),
    ("autoscaling_config.max_replicas", MAX_REPLICAS + 1, "from 1 to 100000 replicas"),
    ("autoscaling_config.target_ongoing_requests", 1e7, "above 0 and up to 1000000 requests"),
    ("num_replicas", 10**30, "from 0 to 100000 replicas"),
    ("max_ongoing_requests", 1_000_001, "from 1 to 1000000 requests"),
    ("max_queued_requests", 10**9, "from -1 to 1000000 requests"),
    ("backpressure_config.retry_after_s", 1e9, "above 0 and up to 86400 seconds"),
    ("ray_actor_options.num_cpus", 1e308, "0 or a value from 0.0001 to 1024 CPUs"),
    ("ray_actor_options.num_gpus", 1e-9, "0 or a value from 0.0001 to 1024 GPUs"),
    ("ray_actor_options.memory", MAX_MEMORY_BYTES + 1, "from 0 to 281474976710656 bytes"),
    ("ray_actor_options.resources.H200", float("inf"), "0 or a value from 0.0001 to 1000000000"),
    ("controller_options.build_timeout_s", 1e18, "from 1 to 3600 seconds"),
])
def test_each_bound_is_said_in_the_error(path, value, allowed):
    error = error_at(nested(path, value))
    assert error.startswith(f"{expected_path(path)}: out of range; use ")
    assert allowed in error


@pytest.mark.parametrize("fields", [
    {"health_check_period_s": 0.1, "health_check_timeout_s": 86_400,
     "graceful_shutdown_timeout_s": 0, "num_replicas": MAX_REPLICAS,
     "max_ongoing_requests": 1_000_000, "max_queued_requests": -1,
     "ray_actor_options": {"num_cpus": 0, "num_gpus": 1024, "memory": MAX_MEMORY_BYTES,
                           "resources": {"H200": 0.0001}}},
    {"autoscaling_config": {"min_replicas": 1, "max_replicas": MAX_REPLICAS,
                            "upscale_delay_s": 0, "downscale_delay_s": 86_400,
                            "look_back_period_s": 0.001}},
])
def test_the_values_at_each_bound_load_and_round_trip(fields):
    cfg = parse_deploy_config(with_deployment(**fields))
    assert parse_deploy_config(config_to_dict(cfg)) == cfg


# ---- route prefixes -------------------------------------------------------------------------

@pytest.mark.parametrize("prefix, says", [
    ("/a/../b", "'.' or '..' segments"), ("/..", "'.' or '..' segments"),
    ("/a/.", "'.' or '..' segments"), ("/a?b=1", "found '?'"), ("/a#top", "found '#'"),
    ("/a b", "found ' '"), ("/a\tb", "found '\\t'"), ("/a\x00b", "found '\\x00'"),
    ("/a%2e%2e", "found '%'"), ("/{id}", "found '{', '}'"), ("//a", "'//'"),
    ("/a//b", "'//'"), ("a", "start with '/'"), ("/a/", "not end with '/'"),
])
def test_a_route_prefix_must_be_a_clean_url_path(prefix, says):
    error = error_at({"applications": [app(route_prefix=prefix)]})
    assert error.startswith("applications[0].route_prefix: route_prefix must ")
    assert says in error


@pytest.mark.parametrize("prefix", ["/", "/a", "/api/v1.2", "/a..b", "/.well-known", "/a-b_c~d"])
def test_clean_route_prefixes_pass(prefix):
    assert route_prefix_problem(prefix) is None
    assert parse_deploy_config({"applications": [app(route_prefix=prefix)]})


# ---- user_config size, nesting ---------------------------------------------------------------

def test_a_user_config_over_the_limit_is_refused_with_its_size():
    blob = "x" * (7 * MAX_USER_CONFIG_BYTES)
    error = error_at(with_deployment(user_config={"blob": blob}))
    assert error.startswith(f"{DEPLOYMENT}.user_config: is 7.0 MiB as JSON, over the limit of "
                            "1.0 MiB; pass large data by reference")


def test_a_user_config_just_under_the_limit_loads():
    blob = "x" * (MAX_USER_CONFIG_BYTES - len('{"blob":""}'))
    assert parse_deploy_config(with_deployment(user_config={"blob": blob}))


def deep(levels: int, leaf=1):
    for _ in range(levels):
        leaf = {"k": [leaf]}
    return leaf


@pytest.mark.parametrize("data, path", [
    (with_deployment(user_config=deep(50_000)), f"{DEPLOYMENT}.user_config"),
    ({"applications": [app(args=deep(50_000))]}, "applications[0].args"),
    ({"applications": [app(runtime_env=deep(50_000))]}, "applications[0].runtime_env"),
])
def test_deep_nesting_is_refused_not_recursed(data, path):
    error = error_at(data)
    assert error.startswith(f"{path}: nested more than 64 levels deep")


# ---- runtime_env -------------------------------------------------------------------------

@pytest.mark.parametrize("runtime_env, path, says", [
    (["pip"], "", "valid dictionary"),
    ("env_vars=A", "", "valid dictionary"),
    ({"env_vars": ["A=1"]}, ".env_vars", "valid dictionary"),
    ({"env_vars": {"A": 1}}, ".env_vars.A", "valid string"),
    ({"working_dir": 3}, ".working_dir", "valid string"),
    ({"py_modules": "mod"}, ".py_modules", "valid list"),
    ({"py_modules": [1]}, ".py_modules[0]", "valid string"),
    ({"pip": 5}, ".pip", "a list of requirements, the path of a requirements file"),
    ({"conda": ["x"]}, ".conda", "the name of a conda environment"),
])
def test_a_runtime_env_of_the_wrong_shape_is_an_error_naming_the_field(runtime_env, path, says):
    for data, where in [({"applications": [app(runtime_env=runtime_env)]}, "applications[0]"),
                        (with_deployment(ray_actor_options={"runtime_env": runtime_env}),
                         f"{DEPLOYMENT}.ray_actor_options")]:
        error = error_at(data)
        assert error.startswith(f"{where}.runtime_env{path}: ") and says in error


def test_a_well_formed_runtime_env_is_kept_as_written():
    env = {"working_dir": "s3://bucket/app.zip", "py_modules": ["./lib"],
           "pip": {"packages": ["requests"], "pip_check": False}, "env_vars": {"A": "1"},
           "my_plugin": {"any": ["thing"]}, "config": {"setup_timeout_seconds": 60}}
    cfg = parse_deploy_config({"applications": [app(runtime_env=env)]})
    assert cfg.applications[0].runtime_env == env
    assert list(cfg.applications[0].runtime_env) == list(env)  # order too: it is hashed


# ---- options set in code -------------------------------------------------------------------

def build(target: str, name: str = "shop"):
    raw = {"name": name, "import_path": f"tests.unit.bounds_apps:{target}"}
    return build_application(config_to_dict(parse_deploy_config({"applications": [raw]}))
                             ["applications"][0])


@pytest.mark.parametrize("target, option, says", [
    ("tiny_health_period_app", "health_check_period_s", "from 0.1 to 86400 seconds"),
    ("day_long_shutdown_app", "graceful_shutdown_timeout_s", "from 0 to 86400 seconds"),
    ("many_ongoing_app", "max_ongoing_requests", "from 1 to 1000000 requests"),
    ("many_cpus_app", "ray_actor_options.num_cpus", "to 1024 CPUs"),
    ("huge_memory_app", "ray_actor_options.memory", "to 281474976710656 bytes"),
    ("big_user_config_app", "user_config", "over the limit of 1.0 MiB"),
])
def test_options_set_in_code_meet_the_same_bounds(target, option, says):
    with pytest.raises(BuildError) as info:
        build(target)
    message = str(info.value)
    assert message.startswith("application 'shop': deployment 'Model': invalid options")
    assert f"\n  - {option}: " in message and says in message


def test_code_options_within_bounds_pass_through_as_written():
    [spec] = build("within_bounds_app")
    assert spec.ray_actor_options == {"num_cpus": 0.5, "accelerator_type": "H100",
                                      "runtime_env": {"env_vars": {"A": "1"}}}


@pytest.mark.parametrize("text, hint", [
    ("1e-09", "write 1e-09 without quotes"),
    ("3", "write 3 without quotes"), (" 2.5", "write 2.5 without quotes")])
def test_a_number_written_as_text_gets_a_hint(text, hint):
    error = error_at(with_deployment(health_check_period_s=text))
    assert error.startswith(f"{DEPLOYMENT}.health_check_period_s: must be a number, not text; "
                            f"{hint}")


def test_a_yaml_exponent_without_a_point_is_a_number_and_out_of_range(tmp_path):
    from controlplane.config.schema import load_deploy_config

    path = tmp_path / "deploy.yaml"
    for text in ("1e-09", "1.0e-09"):
        path.write_text("applications:\n  - import_path: m:a\n    deployments:\n"
                        f"      - {{name: d, health_check_period_s: {text}}}\n")
        with pytest.raises(ConfigError) as info:
            load_deploy_config(path)
        assert "out of range; use a value from 0.1 to 86400 seconds (got: 1e-09)" in \
            info.value.errors[0]
