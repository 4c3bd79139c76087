"""A replica's start deadline (``replica_start_timeout_s``): from the deploy config, checked
against the health period and against an LLM engine's own ``startup_timeout_s``, derived
from that engine start where unset, and honoured by the shard in virtual time: a start
that takes longer than 300 s (a cold load of a large model) completes under a deadline
that allows it. And the other build-time check of an LLM deployment: its
``autoscaling_config.llm`` needs code that reports its engine. No Ray: the shard runs on
fakes, on a virtual-time loop."""

from __future__ import annotations

import types

import pytest

from controlplane.config.schema import config_to_dict, parse_deploy_config
from controlplane.errors import BuildError, ConfigError
from controlplane.usercode.build import build_application
from controlplane.usercode.code_fit import AFTER_ENGINE_S, start_deadline
from tests.unit.shard_harness import DEP, Shard, make_spec, run

VLLM = "replicas.vllm_replica:VLLMServer"


def parse(**deployment):
    raw = {"applications": [{"name": "llm", "import_path": VLLM, "args": {"model": "m"},
                             "deployments": [{"name": "VLLMServer", **deployment}]}]}
    return config_to_dict(parse_deploy_config(raw))["applications"][0]


@pytest.mark.parametrize("fields, blamed", [
    ({"replica_start_timeout_s": 10}, "must be longer than health_check_period_s (10)"),
    ({"replica_start_timeout_s": 30, "health_check_period_s": 45}, "(45)"),
    ({"replica_start_timeout_s": -5}, "replica_start_timeout_s"),
])
def test_a_deadline_within_one_health_period_is_a_config_error_naming_the_field(
        fields, blamed):
    with pytest.raises(ConfigError) as caught:
        parse(**fields)
    assert "replica_start_timeout_s" in str(caught.value) and blamed in str(caught.value)


def test_an_llm_engine_start_sets_the_default_deadline_with_room_for_the_first_check():
    [spec] = build_application(parse())  # VLLMServer's own default: 900 s of engine start
    assert spec.replica_start_timeout_s == 900 + AFTER_ENGINE_S
    app = parse(replica_start_timeout_s=1800)
    app["args"]["startup_timeout_s"] = 1200
    assert build_application(app)[0].replica_start_timeout_s == 1800


def test_a_deadline_shorter_than_the_engine_start_is_refused_not_silently_cut():
    app = parse(replica_start_timeout_s=300)
    with pytest.raises(BuildError) as caught:
        build_application(app)
    assert ("replica_start_timeout_s (300) is shorter than its engine's startup_timeout_s "
            "(900)") in caught.value.message
    assert "raise replica_start_timeout_s to 960 or more" in caught.value.message


def test_a_class_without_an_engine_start_keeps_the_shards_default():
    class Plain:
        def __init__(self, x: int = 1) -> None:
            pass
    found = types.SimpleNamespace(name="Plain", target=Plain, kwargs={})
    assert start_deadline("app", found, None) is None
    assert start_deadline("app", found, 45.0) == 45.0


def _start(deadline_s: float | None, start_s: float):
    """One replica whose start takes ``start_s`` virtual seconds: its row at 299 s, the
    deadlines its start was given, and the deployment's status and rows after."""
    seen = []

    async def scenario():
        shard = Shard()
        shard.client.start_s = start_s
        await shard.deploy(make_spec(1, replica_start_timeout_s=deadline_s))
        await shard.advance(299.0)
        [starting] = shard.replicas()
        timeouts = [c.args[0] for c in shard.client.calls_to("initialize")]
        await shard.advance(start_s)
        seen.extend([starting, timeouts, shard.status(), shard.replicas()])
    run(scenario)
    return seen


def test_a_420_s_cold_start_completes_under_a_deadline_that_allows_it():
    starting, timeouts, status, replicas = _start(960.0, 420.0)
    assert starting["state"] == "STARTING"
    assert "gives up after 960s" in starting["message"]
    assert timeouts == [960.0]
    assert [r["state"] for r in replicas] == ["RUNNING"] and status["status"] == "HEALTHY"


def test_the_same_start_is_cut_at_the_shards_300_s_and_says_which_field_to_raise():
    _, timeouts, status, _ = _start(None, 420.0)
    assert timeouts == [300.0]
    assert "not started within replica_start_timeout_s (300s)" in status["message"]
    assert "raise replica_start_timeout_s in the deployment's config" in status["message"]


def test_status_shows_what_a_starting_replica_said_and_for_how_long():
    async def scenario():
        shard = Shard()
        shard.client.hold("initialize")
        await shard.deploy(make_spec(1, replica_start_timeout_s=960.0))
        [replica] = shard.replicas()
        rid = replica["replica_id"]
        shard.core.report_start_progress(("other", "dep"), rid, "another deployment's")
        await shard.advance(5.0)
        key = (DEP.app, DEP.name)
        shard.core.report_start_progress(key, rid, "loading the model")
        await shard.advance(40.0)
        shard.core.report_start_progress(key, rid, "loading the model")  # same words
        await shard.advance(2.0)
        assert shard.replicas()[0]["message"] == (
            "loading the model for 42s (starting for 47s; gives up after 960s and retries)")
        shard.client.release("initialize", rid)
        await shard.step(2)
        shard.core.report_start_progress(key, rid, "late word")  # after the start: dropped
        assert shard.replicas()[0]["state"] == "RUNNING"
        assert shard.core._deployments[DEP].ops.start_progress(rid) is None
    run(scenario)


def test_llm_autoscaling_on_code_that_reports_no_engine_is_refused():
    app = parse(autoscaling_config={"min_replicas": 0, "max_replicas": 2, "llm": {}})
    assert build_application(app)[0].autoscaling_config["llm"]["target_fill"] == 0.75
    plain = {"name": "plain", "import_path": "tests.unit.sample_apps:Model",
             "deployments": [{"name": "Model", "autoscaling_config": {
                 "min_replicas": 1, "max_replicas": 2, "llm": {}}}]}
    plain = config_to_dict(parse_deploy_config({"applications": [plain]}))["applications"][0]
    with pytest.raises(BuildError) as caught:
        build_application(plain)
    assert "sets autoscaling_config.llm, but its code has no record_autoscaling_stats()" in \
        caught.value.message
