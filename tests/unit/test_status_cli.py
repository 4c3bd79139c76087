"""Status assembly and rendering, and the CLI's config-error paths (which start no Ray)."""

from __future__ import annotations

import pickle
from collections import Counter

import pytest
import ray

from controlplane.status import UnknownName, app_status, assemble_status, check_names
from fleetplane import cli
from fleetplane.progress import deployment_summary, progress_lines, render_table, total_replicas


def replica(replica_id: str, state: str = "RUNNING", rank: int | None = 0,
            healthy: bool = True, node_id: str | None = "node-abcdef0123456789") -> dict:
    return {"replica_id": replica_id, "state": state, "rank": rank, "healthy": healthy,
            "node_id": node_id, "actor_name": f"actor-{replica_id}", "version": "v1",
            "message": ""}


def deployment(status: str, target: int, replicas: list[dict], message: str = "") -> dict:
    return {"status": status, "message": message, "target_replicas": target, "version": "v1",
            "autoscaling": False, "replicas": replicas}


def shard(index: int, deployments: dict[str, dict], ticks: int = 10) -> dict:
    return {"index": index, "deployments": deployments, "ticks": ticks, "tick_errors_total": 0,
            "last_tick_ms": 0.25}


# ---- app_status ------------------------------------------------------------------------

@pytest.mark.parametrize("statuses, expected", [
    ([], "DEPLOYING"),
    (["HEALTHY"], "RUNNING"),
    (["HEALTHY", "HEALTHY"], "RUNNING"),
    (["HEALTHY", "UPDATING"], "DEPLOYING"),
    (["HEALTHY", "UNHEALTHY"], "UNHEALTHY"),
    (["UPDATING", "UNHEALTHY"], "UNHEALTHY"),
    (["DELETING", "DELETING"], "DELETING"),
    (["HEALTHY", "DEPLOY_FAILED"], "DEPLOY_FAILED"),
    (["UNHEALTHY", "DEPLOY_FAILED", "DELETING"], "DEPLOY_FAILED"),
])
def test_app_status_folds_deployment_statuses(statuses, expected):
    assert app_status(statuses) == expected


# ---- assemble_status -------------------------------------------------------------------

CONFIG = {"applications": [{"name": "shop", "route_prefix": "/shop"},
                           {"name": "echo", "route_prefix": None},
                           {"name": "fresh", "route_prefix": "/fresh"}]}


def shards() -> list[dict]:
    return [
        shard(0, {"shop/Router": deployment("HEALTHY", 1, [replica("r-1")]),
                  "old/Gone": deployment("DELETING", 0, [replica("g-1", "STOPPING")])}),
        shard(1, {"shop/Adder": deployment("UPDATING", 2, [replica("a-1", rank=0),
                                                            replica("a-2", "STARTING", None,
                                                                    False, None)]),
                  "echo/Echo": deployment("HEALTHY", 1, [replica("e-1")])}, ticks=12),
    ]


def test_assemble_status_has_the_design_shape():
    status = assemble_status(CONFIG, shards(), generation=3)
    adder = status["applications"]["shop"]["deployments"]["Adder"]
    assert adder["status"] == "UPDATING" and adder["target_replicas"] == 2
    for r in adder["replicas"]:
        assert {"replica_id", "state", "rank", "healthy", "node_id"} <= r.keys()
    assert adder["replicas"][1] == replica("a-2", "STARTING", None, False, None)
    assert status["controller"]["num_shards"] == 2
    assert status["controller"]["generation"] == 3
    assert status["controller"]["shards"] == [
        {"index": 0, "deployments": 2, "ticks": 10, "tick_errors_total": 0, "last_tick_ms": 0.25},
        {"index": 1, "deployments": 2, "ticks": 12, "tick_errors_total": 0, "last_tick_ms": 0.25}]


def test_assemble_status_groups_deployments_of_an_app_across_shards():
    apps = assemble_status(CONFIG, shards(), generation=1)["applications"]
    assert list(apps["shop"]["deployments"]) == ["Adder", "Router"]  # sorted by name
    assert apps["shop"]["status"] == "DEPLOYING"  # Router HEALTHY, Adder UPDATING
    assert apps["shop"]["route_prefix"] == "/shop"
    assert apps["echo"]["status"] == "RUNNING" and apps["echo"]["route_prefix"] is None


def test_assemble_status_lists_config_apps_in_order_then_draining_ones():
    apps = assemble_status(CONFIG, shards(), generation=1)["applications"]
    assert list(apps) == ["shop", "echo", "fresh", "old"]
    assert apps["fresh"] == {"status": "DEPLOYING", "route_prefix": "/fresh", "deployments": {}}
    assert apps["old"]["status"] == "DELETING" and apps["old"]["route_prefix"] is None


def test_assemble_status_without_a_config():
    status = assemble_status(None, [shard(0, {})], generation=0)
    assert status["applications"] == {}
    assert status["controller"]["num_shards"] == 1


# ---- progress --------------------------------------------------------------------------

def small_status() -> dict:
    return assemble_status(
        {"applications": [{"name": "shop", "route_prefix": "/shop"}]},
        [shard(0, {"shop/Router": deployment("HEALTHY", 1, [replica("r-1")]),
                   "shop/Adder": deployment(
                       "UPDATING", 3,
                       [replica("a-1"), replica("a-2", "STARTING", 1, False, None),
                        replica("a-3", "STOPPING", None, False)],
                       message="\n".join(f"line {i}" for i in range(15)))})],
        generation=4)


def test_deployment_summary_counts_running_against_target():
    status = small_status()
    adder = status["applications"]["shop"]["deployments"]["Adder"]
    assert deployment_summary("Adder", adder) == \
        "Adder: UPDATING 1/3 RUNNING (1 STARTING, 1 STOPPING)"
    router = status["applications"]["shop"]["deployments"]["Router"]
    assert deployment_summary("Router", router) == "Router: HEALTHY 1/1 RUNNING"


def test_progress_lines_one_per_deployment_prefixed_by_app():
    assert progress_lines(small_status()) == [
        "shop/Adder: UPDATING 1/3 RUNNING (1 STARTING, 1 STOPPING)",
        "shop/Router: HEALTHY 1/1 RUNNING"]


def test_total_replicas_sums_running_and_target():
    assert total_replicas(small_status()) == (2, 4)


def test_render_table_shows_apps_replicas_messages_and_controller():
    lines = render_table(small_status()).splitlines()
    assert lines[0] == "application shop  DEPLOYING  route_prefix=/shop"
    assert lines[1] == "  Adder: UPDATING 1/3 RUNNING (1 STARTING, 1 STOPPING)"
    # Only the message's last 12 lines, indented under the deployment.
    assert lines[2:14] == [f"    | line {i}" for i in range(3, 15)]
    a1, a2, a3 = lines[14:17]
    assert a1.split() == ["a-1", "RUNNING", "rank=0", "healthy", "node=node-abcdef0"]
    assert a2.split() == ["a-2", "STARTING", "rank=1", "not", "healthy", "node=-"]
    assert a3.split()[:3] == ["a-3", "STOPPING", "rank=None"]
    assert lines[17] == "  Router: HEALTHY 1/1 RUNNING"
    assert lines[-1] == "controller: 1 shard(s), generation 4"


@pytest.mark.parametrize("storage, line", [
    ("redis", "controller: 1 shard(s), generation 0, GCS fault tolerance on (redis)"),
    ("memory", "controller: 1 shard(s), generation 0, GCS fault tolerance off")])
def test_the_table_says_whether_the_head_nodes_loss_is_survived(storage, line):
    status = assemble_status(None, [shard(0, {})], 0)
    status["controller"]["gcs_storage"] = storage
    assert render_table(status).splitlines()[-1] == line


def test_render_table_says_no_applications_when_there_are_none():
    assert "no applications" in render_table(assemble_status(None, [shard(0, {})], 0))


# ---- summary entries and filters -------------------------------------------------------

def summarized(dep: dict) -> dict:
    """A full entry as the shard's summary gives it: counts, no rows."""
    states = Counter(r["state"] for r in dep["replicas"])
    return {**{k: v for k, v in dep.items() if k != "replicas"},
            "replica_counts": {s: states[s] for s in ("STARTING", "RUNNING", "UPDATING",
                                                      "STOPPING")},
            "healthy_replicas": sum(r["healthy"] for r in dep["replicas"])}


def summary_status() -> dict:
    full = small_status()
    for a in full["applications"].values():
        a["deployments"] = {name: summarized(dep) for name, dep in a["deployments"].items()}
    return full


def test_progress_from_summary_entries_reads_as_from_the_rows():
    assert progress_lines(summary_status()) == progress_lines(small_status())
    assert total_replicas(summary_status()) == total_replicas(small_status()) == (2, 4)


def test_render_table_of_a_summary_shows_counts_and_health_instead_of_rows():
    lines = render_table(summary_status()).splitlines()
    assert lines[1] == "  Adder: UPDATING 1/3 RUNNING (1 STARTING, 1 STOPPING)"
    assert lines[14] == "    1/1 serving replicas healthy"
    assert lines[15:] == ["  Router: HEALTHY 1/1 RUNNING", "    1/1 serving replicas healthy",
                          "controller: 1 shard(s), generation 4"]


def test_a_filtered_status_lists_only_the_applications_asked_for():
    only_shop = [shard(0, {"shop/Router": deployment("HEALTHY", 1, [replica("r-1")])})]
    apps = assemble_status(CONFIG, only_shop, 1, app="shop")["applications"]
    assert list(apps) == ["shop"] and list(apps["shop"]["deployments"]) == ["Router"]
    by_name = assemble_status(CONFIG, only_shop, 1, deployment="Router")["applications"]
    assert list(by_name) == ["shop"]  # not the config's other applications


def test_shard_rows_count_owned_deployments_even_when_filtered():
    answer = {**shard(0, {}), "deployments_owned": 5}
    [row] = assemble_status(CONFIG, [answer], 1, app="echo")["controller"]["shards"]
    assert row["deployments"] == 5


KNOWN = [("shop", "Router"), ("shop", "Adder"), ("echo", "Echo")]


def test_check_names_accepts_known_names_and_config_apps_without_deployments():
    check_names("shop", "Adder", KNOWN)
    check_names(None, "Echo", KNOWN)
    check_names("fresh", None, KNOWN, apps=["fresh"])
    check_names(None, None, [])


@pytest.mark.parametrize("app, dep, says", [
    ("nope", None, "no application named 'nope' (known: echo, shop)"),
    (None, "Nope", "no deployment named 'Nope' (known: Adder, Echo, Router)"),
    ("echo", "Router", "no deployment named 'Router' in application 'echo' (known: Echo)"),
])
def test_an_unknown_name_is_an_error_naming_it_and_what_is_known(app, dep, says):
    with pytest.raises(UnknownName) as caught:
        check_names(app, dep, KNOWN)
    assert str(caught.value) == says
    again = pickle.loads(pickle.dumps(caught.value))  # it crosses the controller actor
    assert str(again) == says and isinstance(again, LookupError)


# ---- CLI: invalid configs fail before any Ray call -------------------------------------

BAD_YAML = """\
applications:
  - name: shop
    import_path: tests.unit.sample_apps:Model
    deployments:
      - name: Model
        num_replicas: -1
"""


@pytest.fixture
def no_ray_started():
    assert not ray.is_initialized()
    yield
    assert not ray.is_initialized(), "a config error must fail before Ray starts"


def test_run_with_a_missing_file_exits_2_naming_the_file(tmp_path, monkeypatch, capsys,
                                                         no_ray_started):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "missing.yaml"]) == cli.EXIT_BAD_CONFIG == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "missing.yaml" in captured.err and "no such file" in captured.err
    assert "nothing was changed" in captured.err


@pytest.mark.parametrize("command", ["run", "deploy"])
def test_invalid_config_exits_2_naming_the_field_path(command, tmp_path, capsys,
                                                      no_ray_started):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_YAML)
    assert cli.main([command, str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"invalid deploy config {bad}" in err
    assert "applications[0].deployments[0].num_replicas:" in err
    assert "(got: -1)" in err


def test_unknown_field_and_bad_yaml_exit_2(tmp_path, capsys, no_ray_started):
    typo = tmp_path / "typo.yaml"
    typo.write_text("applications:\n  - import_path: a.b:c\n    num_replica: 2\n")
    assert cli.main(["deploy", str(typo)]) == 2
    assert "applications[0].num_replica: unknown field" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("applications: [\n")
    assert cli.main(["deploy", str(broken)]) == 2
    assert "invalid YAML at line" in capsys.readouterr().err


def test_render_table_names_the_newest_request_error_and_where_its_traceback_is():
    status = assemble_status(None, [shard(0, {"shop/Router": {
        **deployment("HEALTHY", 1, [replica("r-1")]),
        "request_errors": {"total": 3, "last": {"replica_id": "r-1", "request_id": "abc",
                                                "error": "ValueError: no", "at_s": 1.0}}}})], 1)
    assert ("    requests raised: 3; the newest on r-1 (request id abc, in that replica's "
            "log): ValueError: no") in render_table(status).splitlines()
