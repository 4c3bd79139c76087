"""build_application: each kind of user app becomes the right DeploymentSpecs.

Configs go through the real edge (``parse_deploy_config`` then ``config_to_dict``), so
every ``deployments[]`` entry has all its fields, None where unset, exactly as the
controller hands them over.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import ray.cloudpickle as cloudpickle

from controlplane.config.schema import AutoscalingConfig, config_to_dict, parse_deploy_config
from controlplane.errors import BuildError
from controlplane.specs import DEPLOYMENT_DEFAULTS, DeploymentId, shard_of, stable_hash
from controlplane.usercode.build import build_application
from controlplane.wire import DeploymentRef

APPS = "tests.unit.sample_apps"
REPO_ROOT = Path(__file__).resolve().parents[2]


def app_config(import_path: str, *, name: str = "app", deployments: list | None = None,
               **fields) -> dict:
    raw = {"name": name, "import_path": import_path, "deployments": deployments or [], **fields}
    return config_to_dict(parse_deploy_config({"applications": [raw]}))["applications"][0]


def build(import_path: str, **kwargs):
    return build_application(app_config(import_path, **kwargs))


def by_name(specs) -> dict:
    return {s.id.name: s for s in specs}


def loaded(spec) -> tuple:
    """(target, init_args, init_kwargs) as the replica will unpickle them."""
    return cloudpickle.loads(spec.serialized_def)


def test_config_fixture_has_every_field_none_when_unset():
    app = app_config(f"{APPS}:Model", deployments=[{"name": "Model", "num_replicas": 2}])
    entry = app["deployments"][0]
    assert entry["num_replicas"] == 2
    assert entry["user_config"] is None and entry["autoscaling_config"] is None
    assert entry["max_ongoing_requests"] is None


# ---- plain class ---------------------------------------------------------------------

def test_plain_class_is_one_ingress_deployment_with_builtin_defaults():
    [spec] = build(f"{APPS}:Model", route_prefix="/m")
    assert spec.id == DeploymentId("app", "Model")
    assert spec.ingress and spec.route_prefix == "/m"
    assert spec.num_replicas == DEPLOYMENT_DEFAULTS["num_replicas"] == 1
    assert spec.max_ongoing_requests == 5 and spec.max_queued_requests == -1
    assert spec.user_config is None and spec.autoscaling_config is None
    assert (spec.health_check_period_s, spec.health_check_timeout_s,
            spec.graceful_shutdown_timeout_s) == (10.0, 30.0, 20.0)
    assert spec.backpressure_config == {"status_code": 503, "retry_after_s": None,
                                     "retry_after_policy": "static"}
    assert spec.ray_actor_options == {"num_cpus": 1}


def test_plain_class_args_become_constructor_kwargs():
    [spec] = build(f"{APPS}:Model", args={"greeting": "hey", "size": 3})
    target, init_args, init_kwargs = loaded(spec)
    from tests.unit.sample_apps import Model
    assert target is Model
    assert init_args == () and init_kwargs == {"greeting": "hey", "size": 3}


def test_config_overrides_builtin_defaults_for_a_plain_class():
    [spec] = build(f"{APPS}:Model", deployments=[{
        "name": "Model", "num_replicas": 4, "max_ongoing_requests": 2, "user_config": {"k": 1},
        "health_check_period_s": 2.5, "backpressure_config": {"status_code": 429},
        "ray_actor_options": {"num_gpus": 1}}])
    assert spec.num_replicas == 4 and spec.max_ongoing_requests == 2
    assert spec.user_config == {"k": 1}
    assert spec.health_check_period_s == 2.5
    assert spec.health_check_timeout_s == 30.0  # unset in config: the default stays
    assert spec.backpressure_config == {"status_code": 429, "retry_after_s": None,
                                     "retry_after_policy": "static"}
    # Unset actor options (None, {}) are dropped so Ray's own defaults apply.
    assert spec.ray_actor_options == {"num_gpus": 1.0}


def test_config_autoscaling_sets_initial_replicas():
    [spec] = build(f"{APPS}:Model", deployments=[{
        "name": "Model", "autoscaling_config": {"min_replicas": 2, "max_replicas": 6}}])
    assert spec.autoscaling_config["min_replicas"] == 2
    assert spec.num_replicas == 2  # initial_replicas unset: min_replicas
    [spec] = build(f"{APPS}:Model", deployments=[{
        "name": "Model",
        "autoscaling_config": {"min_replicas": 1, "max_replicas": 6, "initial_replicas": 4}}])
    assert spec.num_replicas == 4


def test_app_runtime_env_reaches_every_spec():
    [spec] = build(f"{APPS}:Model", runtime_env={"env_vars": {"A": "1"}})
    assert spec.runtime_env == {"env_vars": {"A": "1"}}


# ---- plain function and builders ----------------------------------------------------------

def test_plain_function_without_args_is_the_deployment():
    [spec] = build(f"{APPS}:echo")
    from tests.unit.sample_apps import echo
    assert spec.id.name == "echo" and spec.ingress
    assert loaded(spec) == (echo, (), {})


def test_function_with_args_is_a_builder_called_with_them():
    [spec] = build(f"{APPS}:build_model_app", args={"greeting": "yo", "size": 5})
    target, init_args, init_kwargs = loaded(spec)
    assert spec.id.name == "Model" and target.__name__ == "Model"
    assert init_kwargs == {"greeting": "yo", "size": 5}


def test_builder_may_return_a_plain_class_which_gets_no_args():
    [spec] = build(f"{APPS}:build_plain_class", args={"greeting": "yo"})
    target, init_args, init_kwargs = loaded(spec)
    assert target.__name__ == "Model" and init_kwargs == {}


def test_builder_returning_something_else_is_a_build_error():
    with pytest.raises(BuildError, match="builder must return .* got int"):
        build(f"{APPS}:build_nothing", args={"x": 1})


def test_import_path_naming_data_is_a_build_error():
    with pytest.raises(BuildError, match="import_path names a dict"):
        build(f"{APPS}:NOT_CALLABLE")


# ---- Ray Serve apps --------------------------------------------------------------------

def test_serve_app_takes_options_set_in_code():
    [spec] = build(f"{APPS}:serve_app")
    assert spec.id.name == "Model" and spec.ingress
    assert spec.num_replicas == 3
    assert spec.user_config == {"a": 1}
    assert spec.max_ongoing_requests == 7
    assert spec.health_check_period_s == 10.0  # not set in code: built-in default
    assert loaded(spec)[2] == {"greeting": "hi"}


def test_config_overrides_serve_code_options_field_by_field():
    [spec] = build(f"{APPS}:serve_app", deployments=[{
        "name": "Model", "max_ongoing_requests": 9, "user_config": {"b": 2}}])
    assert spec.max_ongoing_requests == 9
    assert spec.user_config == {"b": 2}
    assert spec.num_replicas == 3  # set in code, not in config: the code's value stays


def test_config_num_replicas_overrides_code_autoscaling():
    [spec] = build(f"{APPS}:autoscaled_app", deployments=[{"name": "Model", "num_replicas": 4}])
    assert spec.num_replicas == 4
    assert spec.autoscaling_config is None


def test_config_autoscaling_overrides_code_num_replicas():
    [spec] = build(f"{APPS}:serve_app", deployments=[{
        "name": "Model", "autoscaling_config": {"min_replicas": 2, "max_replicas": 8}}])
    assert spec.autoscaling_config["max_replicas"] == 8
    assert spec.num_replicas == 2  # from the autoscaling config, not the code's 3


def test_code_autoscaling_is_kept_when_config_does_not_size():
    [spec] = build(f"{APPS}:autoscaled_app")
    # The schema's defaults fill in what code left out.
    assert spec.autoscaling_config == AutoscalingConfig(
        min_replicas=2, max_replicas=5, initial_replicas=3).model_dump()
    assert spec.autoscaling_config["upscale_delay_s"] == AutoscalingConfig().upscale_delay_s


def test_code_autoscaling_sets_initial_replicas_like_config_autoscaling():
    [spec] = build(f"{APPS}:autoscaled_app")
    assert spec.num_replicas == 3  # initial_replicas, as for the same config in YAML


def test_invalid_code_autoscaling_fails_the_build_naming_app_deployment_and_field():
    with pytest.raises(BuildError) as info:
        build(f"{APPS}:too_many_app", name="shop")
    message = str(info.value)
    assert message.startswith("application 'shop': deployment 'Model': invalid options")
    assert "\n  - autoscaling_config.max_replicas: " in message


def test_serve_only_autoscaling_knob_in_code_is_ignored_with_a_warning(caplog):
    # Valid Serve code keeps running; the knobs fleetplane implements are still checked.
    with caplog.at_level(logging.WARNING, logger="controlplane.usercode.build"):
        [spec] = build(f"{APPS}:serve_only_knob_app")
    assert "smoothing_factor" not in spec.autoscaling_config
    assert spec.autoscaling_config["max_replicas"] == 3
    assert ("application 'app', deployment 'Model': autoscaling_config.smoothing_factor set "
            "in code is accepted for compatibility with Ray Serve but not acted on by "
            "fleetplane") in caplog.text


def test_config_sizing_replaces_invalid_code_autoscaling():
    [spec] = build(f"{APPS}:too_many_app", deployments=[{"name": "Model",
                                                              "num_replicas": 2}])
    assert spec.autoscaling_config is None and spec.num_replicas == 2
    [spec] = build(f"{APPS}:too_many_app", deployments=[{
        "name": "Model", "autoscaling_config": {"min_replicas": 1, "max_replicas": 2}}])
    assert spec.autoscaling_config["min_replicas"] == 1


def test_invalid_code_options_fail_their_application_by_name():
    with pytest.raises(BuildError) as caught:
        build(f"{APPS}:too_many_app", name="bad")
    assert caught.value.app == "bad"


def test_unbound_serve_deployment_is_bound_without_args():
    [spec] = build(f"{APPS}:unbound_deployment")
    assert spec.id.name == "Model" and spec.max_ongoing_requests == 4
    assert loaded(spec)[1:] == ((), {})


def test_composed_serve_app_yields_ingress_first_and_a_ref_in_its_args():
    specs = build(f"{APPS}:composed_app", name="shop", route_prefix="/shop")
    assert [s.id.name for s in specs] == ["Router", "Adder"]
    router, adder = specs
    assert router.ingress and router.route_prefix == "/shop"
    assert not adder.ingress and adder.route_prefix is None
    _, router_args, router_kwargs = loaded(router)
    assert router_args == (DeploymentRef("shop", "Adder"),)
    assert router_kwargs == {"label": "composed"}
    assert loaded(adder)[2] == {"increment": 2}


def test_composed_app_overrides_apply_to_the_named_deployment_only():
    specs = by_name(build(f"{APPS}:composed_app",
                          deployments=[{"name": "Adder", "num_replicas": 5}]))
    assert specs["Adder"].num_replicas == 5
    assert specs["Router"].num_replicas == 1


# ---- errors ---------------------------------------------------------------------------

def test_unknown_deployment_name_names_the_available_ones():
    with pytest.raises(BuildError) as info:
        build(f"{APPS}:composed_app", name="shop", deployments=[{"name": "Adderr"}])
    text = str(info.value)
    assert text.startswith("application 'shop':")
    assert "Adderr" in text and "[Router, Adder]" in text


def test_build_error_pickles_with_its_fields():
    err = pickle.loads(pickle.dumps(BuildError("app", "boom")))
    assert (err.app, err.message, str(err)) == ("app", "boom", "application 'app': boom")


# ---- code_version ---------------------------------------------------------------------

def version(import_path: str = f"{APPS}:Model", **kwargs) -> str:
    [spec] = build(import_path, **kwargs)
    return spec.code_version


def test_code_version_is_stable_across_builds_of_the_same_config():
    kwargs = dict(args={"greeting": "hey"}, deployments=[{"name": "Model", "num_replicas": 2}])
    assert version(**kwargs) == version(**kwargs)
    assert version(f"{APPS}:serve_app") == version(f"{APPS}:serve_app")


def test_code_version_changes_with_args():
    assert version(args={"greeting": "a"}) != version(args={"greeting": "b"})


def test_code_version_changes_with_ray_actor_options():
    base = version(deployments=[{"name": "Model", "ray_actor_options": {"num_cpus": 1}}])
    assert base != version(deployments=[{"name": "Model", "ray_actor_options": {"num_cpus": 2}}])
    assert base != version(deployments=[{"name": "Model", "ray_actor_options": {"num_gpus": 1}}])


def test_code_version_changes_with_runtime_env_and_import_path():
    assert version() != version(runtime_env={"env_vars": {"A": "1"}})
    assert version(f"{APPS}:Model") != version(f"{APPS}.Model")


def test_code_version_ignores_in_place_options():
    base = version()
    assert base == version(deployments=[{"name": "Model", "user_config": {"t": 0.5}}])
    assert base == version(deployments=[{"name": "Model", "num_replicas": 7}])
    assert base == version(deployments=[{"name": "Model", "max_ongoing_requests": 1,
                                         "health_check_period_s": 1}])
    serve_base = version(f"{APPS}:serve_app")
    assert serve_base == version(f"{APPS}:serve_app",
                                 deployments=[{"name": "Model", "user_config": {"a": 2}}])


def test_code_version_same_when_config_restates_the_default_actor_options():
    assert version() == version(deployments=[{"name": "Model",
                                              "ray_actor_options": {"num_cpus": 1}}])


# The controller builds in a fresh worker per deploy (max_calls=1) and again after its own
# restart, so code_version must agree across processes or every re-deploy replaces every
# replica.
_PRINT_VERSIONS = """
import json
from controlplane.config.schema import config_to_dict, parse_deploy_config
from controlplane.usercode.build import build_application
out = {}
for path in ("tests.unit.sample_apps:Model", "tests.unit.sample_apps:serve_app",
             "tests.unit.sample_apps:decorated_app"):
    raw = {"applications": [{"name": "app", "import_path": path}]}
    app = config_to_dict(parse_deploy_config(raw))["applications"][0]
    out[path.split(":")[1]] = [s.code_version for s in build_application(app)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def versions_from_two_processes() -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONHASHSEED": "random"}
    procs = [subprocess.Popen([sys.executable, "-c", _PRINT_VERSIONS], cwd=REPO_ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_code_version_agrees_across_processes(versions_from_two_processes):
    first, second = versions_from_two_processes
    assert first["Model"] == second["Model"]
    assert first["serve_app"] == second["serve_app"]


def test_code_version_of_a_decorated_serve_class_agrees_across_processes(
        versions_from_two_processes):
    first, second = versions_from_two_processes
    assert first["decorated_app"] == second["decorated_app"]


# ---- shard_of and stable_hash ---------------------------------------------------------

def test_shard_of_is_stable_and_in_range():
    ids = [DeploymentId(f"app{i}", f"Dep{j}") for i in range(20) for j in range(5)]
    for k in (1, 2, 3, 8, 64):
        shards = [shard_of(d, k) for d in ids]
        assert all(0 <= s < k for s in shards)
        assert shards == [shard_of(d, k) for d in ids]
    assert {shard_of(d, 4) for d in ids} == {0, 1, 2, 3}  # 100 ids reach every shard
    # Pinned: the same in every process (Python's hash() of a str is salted per process).
    pinned = [shard_of(DeploymentId("app", n), 7) for n in ("Model", "Router", "Adder", "Echo")]
    assert pinned == [6, 2, 3, 6]


def test_stable_hash_is_deterministic():
    value = {"b": [1, 2.5, None], "a": {"x": "y"}}
    reordered = {"a": {"x": "y"}, "b": [1, 2.5, None]}
    assert stable_hash(value) == stable_hash(reordered)
    assert stable_hash(value) == "b280151835e17100"  # pinned: the same in every process
    assert len(stable_hash(None)) == 16
    assert stable_hash({"a": 1}) != stable_hash({"a": 2})
    assert stable_hash([1, 2]) == stable_hash((1, 2))  # the JSON form is what counts



@pytest.mark.parametrize("target, kind", [("Adder", "class"), ("echo", "function deployment")])
def test_user_config_without_a_reconfigure_to_receive_it_is_refused(target, kind):
    name = "Adder" if target == "Adder" else "echo"
    with pytest.raises(BuildError) as caught:
        build(f"{APPS}:{target}", deployments=[{"name": name, "user_config": {"k": 1}}])
    assert f"deployment '{name}' sets user_config but its {kind} has no reconfigure" \
        in caught.value.message
    assert "add one or remove user_config" in caught.value.message
