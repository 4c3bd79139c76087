"""The front door both listeners share (``routing.front_door``), through each of them: a
proxy's ``ProxyApp`` over a real ``RouterSet`` (a fake transport in place of Ray) and a
direct-ingress replica's ``DirectIngressApp`` over a fake replica. The same prefix
matching, the same computed Retry-After, the same 500 that names a request id. Plain ASGI
messages, a fake clock; no server, no Ray."""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from controlplane.clock import FakeClock
from controlplane.errors import DeploymentRaised, ReplicaUnavailableError
from controlplane.ingress.proxy import ProxyApp
from controlplane.ingress.proxy_metrics import ProxyMetrics
from controlplane.routing.router_set import RouterSet
from controlplane.wire import (DirectIngressInit, HTTPLimits, HTTPRequestData, ReplicaInfo,
                               RoutesUpdate, RoutingUpdate)
from replicas.direct_ingress import DirectIngressApp

DEP = "app/Model"
STATIC_S = 5.0  # the static Retry-After, told while the drain rate is cold


class NoJitter(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return 1.0


@dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


async def ask(app: Any, path: str, body: bytes = b"",
              leaves: asyncio.Event | None = None, method: str = "POST") -> Answer | None:
    """The answer; None when nothing was sent (the client left: ``leaves`` was set)."""
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await (leaves or asyncio.Event()).wait()  # without ``leaves`` the client stays
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
    scope = {"type": "http", "method": method, "path": path, "query_string": b"",
             "headers": [(b"content-length", b"%d" % len(body))], "client": ("10.0.0.1", 1)}
    await app(scope, receive, send)
    if not sent:
        return None
    return Answer(sent[0]["status"], dict(sent[0]["headers"]),
                  b"".join(m.get("body", b"") for m in sent[1:]))


async def user_code(data: HTTPRequestData, send: Any, held: asyncio.Event) -> None:
    """What a deployment answers: its path; ``/hold`` until released; ``/raise`` raises."""
    tail = data.path.rsplit("/", 1)[-1]
    if tail == "raise":
        try:
            raise ValueError("the api key sk-secret-123 was refused")
        except ValueError as e:
            raise DeploymentRaised.from_exception(e) from e
    if tail == "gone":
        raise ReplicaUnavailableError("r-0", "actor died", DEP)
    if tail == "hold":
        await held.wait()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": data.path.encode()})


class HTTPTransport:
    """A proxy's replicas (a replica's own code, for direct ingress): ``send_http`` runs
    ``user_code``; probes see no other load."""

    def __init__(self) -> None:
        self.held = asyncio.Event()

    def release(self) -> None:
        """Let the held requests go; the next ``/hold`` is held again."""
        self.held.set()
        self.held = asyncio.Event()

    async def handle(self, replica: ReplicaInfo) -> Any:
        raise AssertionError("no WebSocket in these tests")

    async def send_http(self, replica: ReplicaInfo, data: HTTPRequestData, send: Any) -> int:
        await user_code(data, send, self.held)
        return 200

    async def probe_queue_len(self, replica: ReplicaInfo, deadline_s: float) -> int:
        return 0


@dataclass
class Door:
    app: Any
    clock: FakeClock
    release: Callable[[], None]
    busy: Callable[[], bool]  # a request holds the deployment's one slot


def proxy_door(prefix: str = "/a", show: bool = False,
               policy: str = "router_queue_drain_rate") -> Door:
    clock, transport = FakeClock(), HTTPTransport()
    routers = RouterSet("ns", clock, NoJitter(), transport=transport)
    routers.update(DEP, RoutingUpdate(
        replicas=(ReplicaInfo("r-0", "actor-r-0", "node"),), max_ongoing_requests=1,
        max_queued_requests=0, status_code=429, retry_after_s=STATIC_S,
        retry_after_policy=policy))
    app = ProxyApp(routers, ProxyMetrics(), HTTPLimits(), show_error_messages=show)
    app.set_routes(RoutesUpdate(num_shards=1, generation=1, routes={prefix: DEP}))
    return Door(app, clock, transport.release,
                lambda: routers.statistics()[0].in_flight > 0)


def direct_door(prefix: str = "/a", show: bool = False,
                policy: str = "router_queue_drain_rate") -> Door:
    clock, transport = FakeClock(), HTTPTransport()  # its user_code, and holding it
    running = [0]

    async def serve(data: HTTPRequestData, send: Any) -> None:
        running[0] += 1  # the replica's slot, held while its code runs
        try:
            await transport.send_http(ReplicaInfo("r-0", "actor-r-0", "node"), data, send)
        finally:
            running[0] -= 1
    config = DirectIngressInit(
        host="127.0.0.1", route_prefix=prefix, max_queued_requests=0, status_code=429,
        retry_after_s=STATIC_S, deregistration_window_s=0.0, limits=HTTPLimits(),
        retry_after_policy=policy, deployment=DEP, show_error_messages=show)
    app = DirectIngressApp(config, serve, load=lambda: running[0], capacity=1,
                           healthy=lambda: True, clock=clock)
    return Door(app, clock, transport.release, lambda: running[0] > 0)


DOORS = pytest.mark.parametrize("make", [proxy_door, direct_door], ids=["proxy", "direct"])


def run(scenario: Callable[[], Any]) -> Any:
    return asyncio.run(scenario())


@DOORS
@pytest.mark.parametrize("prefix", ["/a", "/a/"])  # a trailing slash matches as without
def test_a_prefix_matches_itself_and_below_at_a_segment_boundary(make, prefix):
    async def scenario() -> list[int]:
        door = make(prefix)
        return [(await ask(door.app, path)).status for path in ("/a", "/a/x/y", "/ab", "/")]
    assert run(scenario) == [200, 200, 404, 404]


@DOORS
def test_a_user_exception_is_a_bare_500_naming_its_request_id(make, caplog):
    async def scenario() -> Answer:
        return await ask(make().app, "/a/raise")
    with caplog.at_level(logging.WARNING, logger="controlplane.routing.front_door"):
        answer = run(scenario)
    assert answer.status == 500 and b"sk-secret" not in answer.body
    request_id = answer.headers[b"x-request-id"].decode()
    assert answer.body == f"Internal Server Error (request id {request_id})".encode()
    [line] = [r.getMessage() for r in caplog.records]  # the replica logs the traceback
    assert line == (f"request {request_id} answered 500: the deployment raised ValueError: "
                    f"the api key sk-secret-123 was refused")


@DOORS
def test_show_error_messages_puts_the_exception_in_the_body_for_development(make):
    async def scenario() -> Answer:
        return await ask(make(show=True).app, "/a/raise")
    answer = run(scenario)
    assert answer.status == 500
    assert answer.body.endswith(b": the deployment raised ValueError: the api key "
                                b"sk-secret-123 was refused")


@DOORS
def test_overload_is_told_the_static_retry_after_cold_and_a_computed_one_warm(make):
    """Seed 002's ladder at either door: the static value while the admission point's own
    drain rate is cold, then the value computed from it (0 queued ahead: the 1 s floor)."""
    async def overloaded(door: Door) -> Answer:
        holding = asyncio.ensure_future(ask(door.app, "/a/hold"))
        for _ in range(100):  # until it is admitted (loop turns: no time passes)
            if door.busy():
                break
            await asyncio.sleep(0)
        assert door.busy()
        answer = await ask(door.app, "/a/more")
        door.release()
        assert (await holding).status == 200
        return answer

    async def scenario() -> tuple[Answer, Answer]:
        door = make()
        cold = await overloaded(door)
        for _ in range(8):  # two answered a second for 4 s: the drain rate warms
            assert (await ask(door.app, "/a")).status == 200
            door.clock.advance(0.5)
        return cold, await overloaded(door)
    cold, warm = run(scenario)
    assert (cold.status, cold.headers[b"retry-after"]) == (429, b"5")
    assert (warm.status, warm.headers[b"retry-after"]) == (429, b"1")
    assert b"deployment app/Model is overloaded" in warm.body


@DOORS
def test_a_client_that_leaves_cancels_its_work_and_frees_the_slot(make):
    async def scenario() -> tuple[Answer | None, bool, Answer]:
        door, leaves = make(), asyncio.Event()
        holding = asyncio.ensure_future(ask(door.app, "/a/hold", leaves=leaves))
        for _ in range(100):  # until it is admitted (loop turns: no time passes)
            if door.busy():
                break
            await asyncio.sleep(0)
        leaves.set()
        left = await holding
        return left, door.busy(), await ask(door.app, "/a/next")  # never released
    left, busy, served = run(scenario)
    assert left is None and not busy and served.status == 200


def test_the_proxy_counts_a_client_that_left_as_499():
    async def scenario() -> str:
        door, leaves = proxy_door(), asyncio.Event()
        holding = asyncio.ensure_future(ask(door.app, "/a/hold", leaves=leaves))
        await asyncio.sleep(0)
        leaves.set()
        await holding
        return door.app.metrics.own_text()
    assert 'status_code="499"' in run(scenario)


def test_the_proxy_answers_an_unavailable_replica_with_its_status():
    async def scenario() -> Answer:
        return await ask(proxy_door().app, "/a/gone")
    answer = run(scenario)
    assert answer.status == 502 and b"became unavailable" in answer.body


class DyingTransport(HTTPTransport):
    """Replicas in ``dead`` die holding whatever they are sent."""

    def __init__(self, dead: set[str]) -> None:
        super().__init__()
        self.dead, self.asked = dead, []

    async def send_http(self, replica: ReplicaInfo, data: HTTPRequestData, send: Any) -> int:
        self.asked.append(replica.replica_id)
        if replica.replica_id in self.dead:
            raise ReplicaUnavailableError(replica.replica_id, "actor died", DEP)
        return await super().send_http(replica, data, send)


def _dying_door(dead: set[str]) -> tuple[Any, DyingTransport]:
    transport = DyingTransport(dead)
    routers = RouterSet("ns", FakeClock(), NoJitter(), transport=transport)
    routers.update(DEP, RoutingUpdate(
        replicas=tuple(ReplicaInfo(r, f"actor-{r}", "node") for r in ("r-0", "r-1")),
        max_ongoing_requests=4, max_queued_requests=0, status_code=429,
        retry_after_s=STATIC_S))
    app = ProxyApp(routers, ProxyMetrics(), HTTPLimits())
    app.set_routes(RoutesUpdate(num_shards=1, generation=1, routes={"/a": DEP}))
    return app, transport


def test_a_get_whose_replica_died_is_asked_again_of_another_once_and_a_post_is_not():
    async def scenario() -> tuple[list, list, list, list, list]:
        app, one_dead = _dying_door({"r-0"})
        gets = [(await ask(app, "/a/x", method="GET")).status for _ in range(5)]
        app, both = _dying_door({"r-0", "r-1"})
        get = (await ask(app, "/a/x", method="GET")).status
        app, both_again = _dying_door({"r-0", "r-1"})
        post = (await ask(app, "/a/y", method="POST")).status
        return gets, [get], both.asked, [post], both_again.asked
    gets, get, asked_get, post, asked_post = run(scenario)
    assert gets == [200] * 5  # a pick of the dead replica was replayed on the live one
    assert get == [502] and len(asked_get) == 2  # one replay, not more
    assert post == [502] and len(asked_post) == 1  # a POST may have had effects: never


def test_a_direct_ingress_replica_leaving_fails_its_health_check_and_still_serves():
    async def scenario() -> list[tuple[int, bytes]]:
        app = direct_door().app
        before = await ask(app, "/-/healthz")
        app.leaving = True
        after, served = await ask(app, "/-/healthz"), await ask(app, "/a")
        return [(a.status, a.body) for a in (before, after, served)]
    assert run(scenario) == [(200, b"success"), (503, b"leaving"), (200, b"/a")]
