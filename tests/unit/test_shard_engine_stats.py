"""A replica's engine stats reaching the LLM autoscaling policy through the shard
(``ShardCore.report_autoscaling_stats``): a read is recorded, an empty one (the replica's
check has not read its engine yet) says nothing and logs nothing, a malformed one is
logged and dropped. Virtual time, no Ray."""

from __future__ import annotations

import logging

from tests.unit.shard_harness import DEP, deployed, run

LLM_SCALING = {"min_replicas": 1, "max_replicas": 3, "llm": {}}
READ = {"running": 2.0, "waiting": 0.0, "slots": 4.0, "finished": 2.0, "slot_s": 20.0}


def test_engine_stats_reach_the_policy_and_an_empty_report_says_nothing(caplog):
    async def main():
        shard = await deployed(1, autoscaling_config=LLM_SCALING)
        replica_id = shard.replicas()[0]["replica_id"]
        engines = shard.core._deployments[DEP].autoscaler.engines
        key = (DEP.app, DEP.name)
        with caplog.at_level(logging.WARNING):
            shard.core.report_autoscaling_stats(key, replica_id, {})
        assert engines.reporting() == [] and not caplog.records
        shard.core.report_autoscaling_stats(key, replica_id, READ)
        assert engines.reporting() == [replica_id] and engines.slot_s == 20.0
        with caplog.at_level(logging.WARNING):
            shard.core.report_autoscaling_stats(key, replica_id, {"waiting": 1})
        assert "dropped engine stats" in caplog.text
        assert engines.signals(shard.clock.monotonic()).running == 2.0  # the read kept
    run(main)
