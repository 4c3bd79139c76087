"""What the user's code raised on a replica: logged with its traceback under the request
id the client is told, reported to the shard at most once per interval with a count,
shown in status; the error's text never in the client's answer."""

from __future__ import annotations

import logging

from controlplane.errors import DeploymentRaised
from controlplane.wire import RequestError
from replicas.request_errors import REPORT_EVERY_S, RequestErrors
from tests.unit.shard_harness import DEP, deployed, run


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def boom(text: str) -> BaseException:
    try:
        raise ValueError(text)
    except ValueError as e:
        return e


def test_an_error_is_logged_with_its_traceback_under_the_request_id_the_client_gets(caplog):
    sent: list[RequestError] = []
    errors = RequestErrors(sent.append, Clock(), wall=lambda: 1e9)
    with caplog.at_level(logging.ERROR, logger="replicas.request_errors"):
        raised = errors.raised(boom("the api key sk-secret was refused"))
    assert isinstance(raised, DeploymentRaised) and len(raised.request_id) == 32
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"request {raised.request_id}: ValueError: the api key sk-secret")
    assert "Traceback" in line and "in boom" in line
    assert sent == [RequestError(raised.request_id, "ValueError: the api key sk-secret was "
                                 "refused", 1e9, 1)]


def test_reports_go_at_most_once_per_interval_carrying_the_count_between():
    sent: list[RequestError] = []
    clock = Clock()
    errors = RequestErrors(sent.append, clock)
    for _ in range(5):
        errors.raised(boom("x"))
    assert [e.count for e in sent] == [1]
    clock.now += REPORT_EVERY_S
    last = errors.raised(boom("y"))
    assert [e.count for e in sent] == [1, 5] and sent[-1].request_id == last.request_id


def test_a_shard_that_cannot_be_told_costs_the_request_nothing():
    def refuse(_: RequestError) -> None:
        raise RuntimeError("shard restarting")
    assert RequestErrors(refuse, Clock()).raised(boom("x")).status_code == 500


def test_status_shows_the_total_and_the_newest_error_with_its_replica_and_request_id():
    async def scenario():
        shard = await deployed(2)
        assert "request_errors" not in shard.status()
        key = (DEP.app, DEP.name)
        first, second = (r["replica_id"] for r in shard.replicas())
        shard.core.report_request_error(key, first, RequestError("id-1", "ValueError: a", 10.0, 3))
        shard.core.report_request_error(key, second, RequestError("id-2", "KeyError: b", 12.0))
        shard.core.report_request_error(key, first, RequestError("id-0", "late", 11.0))
        expected = {"total": 5, "last": {"replica_id": second, "request_id": "id-2",
                                         "error": "KeyError: b", "at_s": 12.0}}
        assert shard.status()["request_errors"] == expected
        assert shard.core.status(summary=True)["deployments"][str(DEP)]["request_errors"] == \
            expected
    run(scenario)
