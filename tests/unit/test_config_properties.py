"""Property tests of the deploy config schema (issue 15's proof): any config, valid or
mutated, is either accepted within every bound or refused with a ``ConfigError`` whose
every line names a field; never any other exception.

Generated: valid configs (unique names and route prefixes, every number within its
bound), and mutations of them at a random place: a wrong type (bools included), an edge
number (NaN, infinities, huge, tiny, negative), a key removed or an unknown one added, a
bad route prefix, a value nested thousands deep. Deterministic (``derandomize``) and
small (about 350 examples in all), so CI runs the same examples in a few seconds.
"""

from __future__ import annotations

import math
import os
import re
import string
import tempfile
from typing import Any

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from controlplane.config import bounds
from controlplane.config.schema import (DeployConfig, check_deployment_options, config_to_dict,
                                 load_deploy_config, parse_deploy_config)
from controlplane.errors import ConfigError

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---- valid configs ---------------------------------------------------------------------

# Plain alphabets, not st.from_regex: regex drawing is most of the run time.
names = st.text(string.ascii_letters + string.digits + "_.-", min_size=1, max_size=12)
keys = st.text(string.ascii_lowercase + "_", min_size=1, max_size=10)
json_leaves = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
json_values = st.recursive(json_leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)), max_leaves=10)


def seconds(low: float, high: float = bounds.DAY_S) -> st.SearchStrategy[float]:
    return st.floats(low, high)


amounts = st.one_of(st.just(0), st.floats(bounds.MIN_RESOURCE, bounds.MAX_CPUS))
route_prefixes = st.lists(st.text(string.ascii_lowercase + string.digits + "_~-", min_size=1,
                                  max_size=6), max_size=3).map(lambda parts: "/" + "/".join(parts))


@st.composite
def autoscaling(draw: Any) -> dict:
    low = draw(st.integers(1, 50))
    high = draw(st.integers(low, bounds.MAX_REPLICAS))
    optional = {"initial_replicas": st.integers(low, high),
                "target_ongoing_requests": st.floats(0.01, 1000),
                "upscale_delay_s": seconds(0), "downscale_delay_s": seconds(0),
                "look_back_period_s": seconds(0.01)}
    return {"min_replicas": low, "max_replicas": high,
            **draw(st.fixed_dictionaries({}, optional=optional))}


DEPLOYMENT_FIELDS = {
    "max_ongoing_requests": st.integers(1, bounds.MAX_ONGOING_REQUESTS),
    "max_queued_requests": st.integers(-1, bounds.MAX_QUEUED_REQUESTS),
    "user_config": json_values,
    "health_check_period_s": seconds(bounds.MIN_HEALTH_CHECK_S),
    "health_check_timeout_s": seconds(bounds.MIN_HEALTH_CHECK_S),
    "graceful_shutdown_timeout_s": seconds(0),
    "backpressure_config": st.fixed_dictionaries({}, optional={
        "status_code": st.sampled_from([429, 503]), "retry_after_s": seconds(0.001)}),
    "ray_actor_options": st.fixed_dictionaries({}, optional={
        "num_cpus": amounts, "num_gpus": amounts,
        "memory": st.integers(0, bounds.MAX_MEMORY_BYTES),
        "resources": st.dictionaries(keys, amounts, max_size=2),
        "runtime_env": st.fixed_dictionaries({}, optional={
            "env_vars": st.dictionaries(keys, st.text(max_size=5), max_size=2),
            "pip": st.lists(keys, max_size=2), "working_dir": st.just("s3://b/app.zip")})}),
}
sizing = st.one_of(st.fixed_dictionaries({}),
                   st.fixed_dictionaries({"num_replicas": st.integers(0, bounds.MAX_REPLICAS)}),
                   st.fixed_dictionaries({"autoscaling_config": autoscaling()}))
deployments = st.builds(lambda name, size, rest: {"name": name, **size, **rest},
                        names, sizing, st.fixed_dictionaries({}, optional=DEPLOYMENT_FIELDS))
applications = st.fixed_dictionaries(
    {"name": names, "import_path": st.sampled_from(["pkg.mod:app", "mod.attr", "a.b:C.d"])},
    optional={"route_prefix": route_prefixes,
              "args": st.dictionaries(keys, json_values, max_size=2),
              "deployments": st.lists(deployments, max_size=3, unique_by=lambda d: d["name"])})
controller_options = st.fixed_dictionaries({}, optional={
    "num_shards": st.integers(1, bounds.MAX_SHARDS),
    "build_timeout_s": seconds(1, bounds.MAX_BUILD_TIMEOUT_S)})
valid_configs = st.fixed_dictionaries({}, optional={
    "applications": st.lists(applications, max_size=3, unique_by=(
        lambda a: a["name"], lambda a: a.get("route_prefix", "/"))),
    "controller_options": controller_options,
})
# What mutations start from: at least one application with a deployment, so most
# mutations land on a deployment's fields rather than an empty config.
rich_configs = st.fixed_dictionaries({
    "applications": st.tuples(applications, deployments).map(
        lambda pair: [{**pair[0], "deployments": [pair[1]]}]),
    "controller_options": controller_options,
})

# ---- mutations --------------------------------------------------------------------------


def deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"k": [value]}
    return value


EDGE_NUMBERS = [math.nan, math.inf, -math.inf, 1e308, -1e308, 1e-9, -1, -0.5, 0, -0.0,
                10**30, 2**63, 0.1, 86_400.5]
BAD_PREFIXES = ["/a/../b", "/..", "/./a", "/a?x=1", "/a#f", "/a b", "/a\x00", "//a", "/a/",
                "a", "", "/%2e%2e", "/{x}", "/a\u2028b"]
nasty = st.one_of(
    st.booleans(), st.none(), st.sampled_from(EDGE_NUMBERS), st.sampled_from(BAD_PREFIXES),
    st.integers(), st.floats(), st.text(max_size=8), st.lists(st.integers(), max_size=3),
    st.dictionaries(keys, st.integers(), max_size=2), st.integers(65, 3000).map(deep))


def places(value: Any, max_depth: int = 8) -> list[tuple]:
    """Paths into ``value`` (dict keys and list indexes), the root included, down to
    ``max_depth``: below that is a generated deep value, not the config's shape."""
    found, stack = [], [((), value)]
    while stack:
        path, item = stack.pop()
        found.append(path)
        items = item.items() if isinstance(item, dict) else \
            enumerate(item) if isinstance(item, list) else ()
        if len(path) < max_depth:
            stack.extend((path + (key,), child) for key, child in items)
    return sorted(found, key=lambda p: (-len(p), repr(p)))  # leaves first: most fields


def mutate(config: dict, path: tuple, operation: str, new: Any, key: str) -> dict:
    parent = config
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if operation == "remove" and isinstance(parent, dict):
        del parent[last]
    elif operation == "add" and isinstance(parent[last], dict):
        parent[last][key] = new
    else:
        parent[last] = new
    return config


@st.composite
def mutated_configs(draw: Any) -> Any:
    config = draw(rich_configs)
    for _ in range(draw(st.integers(1, 3))):
        inside = places(config)[:-1]  # not the root: replacing it is one case, tested apart
        if not inside:
            break
        path = draw(st.sampled_from(inside))
        operation = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
        config = mutate(config, path, operation, draw(nasty), draw(keys))
    return config


# ---- what must hold ------------------------------------------------------------------------

FIELD_PATH = re.compile(r"^(<root>|<file>|[A-Za-z_][^\s:]*): \S")


def assert_names_fields(error: ConfigError, data: Any) -> None:
    assert error.errors, "a ConfigError lists at least one problem"
    for line in error.errors:
        assert FIELD_PATH.match(line), f"no field named in {line!r}"
        root = re.split(r"[.\[:]", line, maxsplit=1)[0]
        assert root in ("<root>", "<file>") or (isinstance(data, dict) and root in data), line


def assert_within_bounds(cfg: DeployConfig) -> None:
    """Every number the control plane acts on is a real number inside its bound."""
    checks = [(cfg.controller_options.num_shards, 1, bounds.MAX_SHARDS)]
    for app in cfg.applications:
        for d in app.deployments:
            if isinstance(d.num_replicas, int):
                checks.append((d.num_replicas, 0, bounds.MAX_REPLICAS))
            for period in (d.health_check_period_s, d.health_check_timeout_s):
                checks.append((period, bounds.MIN_HEALTH_CHECK_S, bounds.DAY_S))
            checks.append((d.graceful_shutdown_timeout_s, 0, bounds.DAY_S))
            checks.append((d.max_ongoing_requests, 1, bounds.MAX_ONGOING_REQUESTS))
            if d.autoscaling_config is not None:
                scaling = d.autoscaling_config
                checks += [(scaling.max_replicas, 1, bounds.MAX_REPLICAS),
                           (scaling.look_back_period_s, 0, bounds.DAY_S)]
            if d.ray_actor_options is not None:
                checks.append((d.ray_actor_options.num_cpus, 0, bounds.MAX_CPUS))
    for value, low, high in checks:
        if value is not None:
            assert not isinstance(value, bool) and low <= value <= high, (value, low, high)


def outcome(data: Any) -> DeployConfig | ConfigError:
    try:
        return parse_deploy_config(data, log_ignored=False)
    except ConfigError as error:
        return error


@settings(max_examples=60, **SETTINGS)
@given(valid_configs)
def test_valid_configs_load_and_round_trip(data):
    cfg = parse_deploy_config(data, log_ignored=False)
    assert_within_bounds(cfg)
    assert parse_deploy_config(config_to_dict(cfg), log_ignored=False) == cfg


@settings(max_examples=100, **SETTINGS)
@given(mutated_configs())
def test_mutated_configs_are_accepted_in_bounds_or_refused_naming_a_field(data):
    result = outcome(data)
    if isinstance(result, ConfigError):
        assert_names_fields(result, data)
    else:
        assert_within_bounds(result)
        assert parse_deploy_config(config_to_dict(result), log_ignored=False) == result


# Each number field the control plane acts on, under a deployment, and its closed range.
NUMBER_FIELDS = {
    "num_replicas": (0, bounds.MAX_REPLICAS),
    "max_ongoing_requests": (1, bounds.MAX_ONGOING_REQUESTS),
    "max_queued_requests": (-1, bounds.MAX_QUEUED_REQUESTS),
    "health_check_period_s": (bounds.MIN_HEALTH_CHECK_S, bounds.DAY_S),
    "health_check_timeout_s": (bounds.MIN_HEALTH_CHECK_S, bounds.DAY_S),
    "graceful_shutdown_timeout_s": (0, bounds.DAY_S),
    "autoscaling_config.max_replicas": (1, bounds.MAX_REPLICAS),
    "autoscaling_config.target_ongoing_requests": (0, bounds.MAX_ONGOING_REQUESTS),
    "autoscaling_config.downscale_delay_s": (0, bounds.DAY_S),
    "autoscaling_config.look_back_period_s": (0, bounds.DAY_S),
    "backpressure_config.retry_after_s": (0, bounds.DAY_S),
    "ray_actor_options.num_cpus": (0, bounds.MAX_CPUS),
    "ray_actor_options.memory": (0, bounds.MAX_MEMORY_BYTES),
    "ray_actor_options.resources.gpu_slice": (0, bounds.MAX_CUSTOM_RESOURCE),
}
any_number = st.one_of(st.sampled_from(EDGE_NUMBERS), st.booleans(), st.floats(),
                       st.integers(), st.integers(-2, 2).map(lambda n: 10.0 ** (n * 150)))


@settings(max_examples=60, **SETTINGS)
@given(st.sampled_from(sorted(NUMBER_FIELDS)), any_number)
def test_any_number_is_taken_within_its_bound_or_refused_at_its_field(path, value):
    *parents, leaf = path.split(".")
    entry: dict = {"name": "d", leaf: value}
    for parent in reversed(parents):
        entry = {"name": "d", parent: {k: v for k, v in entry.items() if k != "name"}}
    result = outcome({"applications": [{"import_path": "m:a", "deployments": [entry]}]})
    if isinstance(result, ConfigError):
        [line] = result.errors
        assert line.startswith(f"applications[0].deployments[0].{path}: "), line
        return
    taken: Any = config_to_dict(result)["applications"][0]["deployments"][0]
    for part in path.split("."):
        taken = taken[part]
    low, high = NUMBER_FIELDS[path]
    assert not isinstance(taken, bool) and low <= taken <= high and taken == value


# Free-form fields (JSON values), as (where, field): the application's or a deployment's.
FREE_FORM = [("app", "args"), ("app", "runtime_env"), ("app", "autoscaling_policy"),
             ("deployment", "user_config"), ("deployment", "request_router_config"),
             ("actor", "runtime_env"), ("actor", "resources")]


@settings(max_examples=30, **SETTINGS)
@given(st.sampled_from(FREE_FORM),
       st.one_of(json_values, nasty, st.integers(1, 5000).map(deep)))
def test_a_free_form_value_of_any_shape_or_depth_is_taken_or_refused_at_its_field(where, value):
    level, field = where
    deployment = {"name": "d", **({field: value} if level == "deployment" else {}),
                  **({"ray_actor_options": {field: value}} if level == "actor" else {})}
    app = {"import_path": "m:a", "deployments": [deployment],
           **({field: value} if level == "app" else {})}
    result = outcome({"applications": [app]})
    if isinstance(result, ConfigError):
        path = {"app": "applications[0]", "deployment": "applications[0].deployments[0]",
                "actor": "applications[0].deployments[0].ray_actor_options"}[level]
        assert all(line.startswith(f"{path}.{field}") for line in result.errors), result.errors


@settings(max_examples=30, **SETTINGS)
@given(st.text(st.sampled_from("ab/.?#% \t\x00\u2028{}~-"), max_size=10).map(lambda t: "/" + t))
def test_a_route_prefix_is_taken_only_when_it_is_a_clean_path(prefix):
    result = outcome({"applications": [{"import_path": "m:a", "route_prefix": prefix}]})
    segments = prefix[1:].split("/")
    clean = prefix == "/" or (
        not set(prefix) & set("?#%{} \t\x00\u2028")
        and "" not in segments and "." not in segments and ".." not in segments)
    assert isinstance(result, DeployConfig) == clean
    assert (bounds.route_prefix_problem(prefix) is None) == clean
    if not clean:
        [line] = result.errors
        assert line.startswith("applications[0].route_prefix: route_prefix must ")


@settings(max_examples=40, **SETTINGS)
@given(st.dictionaries(st.sampled_from([*DEPLOYMENT_FIELDS, "num_replicas",
                                        "autoscaling_config"]),
                       st.one_of(nasty, *DEPLOYMENT_FIELDS.values()), max_size=4))
def test_options_set_in_code_are_checked_or_refused_naming_the_option(options):
    try:
        checked = check_deployment_options(options, "application 'a', deployment 'd'")
    except ConfigError as error:
        assert_names_fields(error, options)
    else:
        assert set(checked) <= set(options)


@settings(max_examples=30, **SETTINGS)
@given(mutated_configs())
def test_the_cli_load_path_agrees_with_the_parser(data):
    # The CLI reads YAML (load_deploy_config). Values nested deeper than yaml.safe_dump
    # writes are the free-form test's; the YAML reader's own limits have their own tests.
    assume(not _too_deep(data))
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as file:
        yaml.safe_dump(data, file)
    try:
        from_file: Any = load_deploy_config(file.name, log_ignored=False)
    except ConfigError as error:
        from_file = error
    finally:
        os.unlink(file.name)
    parsed = outcome(data)
    assert type(from_file) is type(parsed)
    if isinstance(parsed, ConfigError):
        assert from_file.errors == parsed.errors
    else:
        assert from_file == parsed


def _too_deep(value: Any, limit: int = 40) -> bool:
    return any(len(path) > limit for path in places(value, limit + 1))
