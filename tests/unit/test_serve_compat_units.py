"""Issue 12's pieces without Ray: an @serve.ingress app's response (complete or streamed,
the user's error, background tasks), Serve's constructor and reconfigure rules, calling
conventions, Serve's JSON encoding, and multiplexed-model routing preference."""


import asyncio

from fastapi import FastAPI
from pydantic import BaseModel
from ray import serve
from starlette.responses import StreamingResponse

from controlplane.wire import HTTPRequestData, ReplicaInfo
from replicas.asgi_ingress import AsgiResponse
from replicas.serve_context import ServeIdentity, install_replica_context
from replicas.http_adapter import is_streaming, response_parts, unary_response
from replicas.user_callable import UserCallable, _takes_argument
from tests.unit.router_fakes import Harness, settle

api = FastAPI()


@serve.ingress(api)
class Ingress:
    async def __init__(self, word: str) -> None:  # Serve allows an async constructor
        await asyncio.sleep(0)
        self.word = word

    @api.get("/word")
    def get_word(self) -> dict:
        return {"word": self.word}

    @api.get("/stream")
    def stream(self) -> StreamingResponse:
        return StreamingResponse(iter([b"a", b"b", b"c"]))

    @api.get("/boom")
    def boom(self) -> None:
        raise RuntimeError("user bug")


def request(path: str, prefix: str = "/app") -> HTTPRequestData:
    return HTTPRequestData("GET", prefix + path, b"", [], b"", route_prefix=prefix)


async def _ingress() -> UserCallable:
    """As the replica does: construct, then Serve's context with the servable object
    (FastAPI class-based routes find ``self`` there)."""
    user = UserCallable(Ingress, ("hi",), {})
    await user.construct()
    install_replica_context(ServeIdentity("app", "Ingress", "r0", 0, 1, 5), user.servable)
    return user


def test_ingress_complete_response_is_one_round_trip() -> None:
    async def main() -> None:
        user = await _ingress()
        result = await user.call_http(request("/word"))
        assert not is_streaming(result)
        head, body = await unary_response(result)
        assert (head["status"], body) == (200, b'{"word":"hi"}')

    asyncio.run(main())


def test_app_runs_on_after_its_response_like_background_tasks() -> None:
    after: list[str] = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        await asyncio.sleep(0)
        after.append("background work")

    async def main() -> None:
        response = AsgiResponse(app, {"type": "http"}, b"")
        await response.prefetch()
        assert [p async for p in response_parts(response)][1:] == [b"ok"]
        await response._task
        assert after == ["background work"]  # not cancelled when the response finished

    asyncio.run(main())


def test_ingress_streaming_response_streams_and_user_errors_are_fastapis_500() -> None:
    async def main() -> None:
        user = await _ingress()
        result = await user.call_http(request("/stream"))
        parts = [p async for p in response_parts(result)]
        assert parts[0]["status"] == 200 and b"".join(parts[1:]) == b"abc"
        head, body = await unary_response(await user.call_http(request("/boom")))
        assert (head["status"], body) == (500, b"Internal Server Error")  # as under Serve

    asyncio.run(main())


def test_ingress_routes_under_the_route_prefix_with_docs() -> None:
    async def main() -> None:
        user = await _ingress()
        head, body = await unary_response(await user.call_http(request("/docs")))
        assert head["status"] == 200 and b"/app/openapi.json" in body
        head, body = await unary_response(await user.call_http(request("/word", prefix="/b")))
        assert (head["status"], body) == (200, b'{"word":"hi"}')  # routed below any prefix
        head, _ = await unary_response(await user.call_http(request("/nope")))
        assert head["status"] == 404

    asyncio.run(main())


def test_abandoned_asgi_response_cancels_the_app() -> None:
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        await asyncio.sleep(3600)

    async def main() -> None:
        response = AsgiResponse(app, {"type": "http"}, b"")
        await response.prefetch()
        assert is_streaming(response)
        response.close()
        await asyncio.sleep(0)
        assert response._task.cancelled()

    asyncio.run(main())


class Ranked:
    def __init__(self) -> None:
        self.calls: list = []

    def reconfigure(self, config, rank) -> None:
        self.calls.append((config, rank))


class Plain:
    def __init__(self) -> None:
        self.calls: list = []

    def reconfigure(self, config) -> None:
        self.calls.append(config)


def test_reconfigure_follows_serves_rank_rule() -> None:
    async def main() -> None:
        ranked, plain = UserCallable(Ranked, (), {}), UserCallable(Plain, (), {})
        await ranked.construct(), await plain.construct()
        await ranked.reconfigure(None, rank=3)  # subscribed to rank: called without config
        await plain.reconfigure(None, rank=3)  # not subscribed, no config: not called
        await plain.reconfigure({"a": 1}, rank=3)
        assert ranked._instance.calls == [(None, 3)]
        assert plain._instance.calls == [{"a": 1}]

    asyncio.run(main())


class Price(BaseModel):
    cents: int


def test_call_without_request_and_serve_json_encoding() -> None:
    def no_args() -> Price:
        return Price(cents=5)

    assert not _takes_argument(no_args) and _takes_argument(lambda r: r)

    async def main() -> None:
        result = await UserCallable(no_args, (), {}).call_http(request("/"))
        head, body = await unary_response(result)
        assert body == b'{"cents":5}'
        assert (b"content-type", b"application/json") in head["headers"]

    asyncio.run(main())


def test_multiplexed_model_goes_to_a_holder_with_room_else_anywhere() -> None:
    h = Harness()
    router = h.make(replicas=3, max_ongoing=1)
    router.update_replicas([ReplicaInfo("r0", "a0"), ReplicaInfo("r1", "a1", model_ids=("m",)),
                            ReplicaInfo("r2", "a2")])

    async def main() -> None:
        first = asyncio.get_running_loop().create_task(router.assign("a", model_id="m"))
        await settle()
        assert h.transport.where("a") == "r1"
        second = asyncio.get_running_loop().create_task(router.assign("b", model_id="m"))
        await settle()
        assert h.transport.where("b") in ("r0", "r2")  # the holder is full: any replica
        h.transport.finish("a"), h.transport.finish("b")
        await asyncio.gather(first, second)

    h.run(main)


def test_plain_encoding_is_serves_without_importing_it() -> None:
    """Replicas of plain classes encode without Serve; the bytes are Serve's own."""
    import numpy as np
    from ray.serve._private.http_util import convert_object_to_asgi_messages
    from starlette.datastructures import QueryParams

    from replicas.http_adapter import encode_like_serve

    for value in (None, b"raw", "text", {"a": [1, 2.5, None]}, Price(cents=3),
                  QueryParams("a=1&b=2"), ValueError("bad"),
                  {"x": np.arange(3), "f": np.float32(1.5), "m": np.ones((2, 2))}):
        start, body = convert_object_to_asgi_messages(value)
        assert encode_like_serve(value) == (dict(start["headers"])[b"content-type"],
                                            body["body"]), value


def test_importing_fleetplane_loads_neither_ray_nor_serve() -> None:
    """The CLI sets Ray's auth mode from an instance record before Ray loads, and a
    driver's ``import fleetplane`` patches ``ray.serve`` only when it is imported."""
    import subprocess
    import sys

    code = ("import sys, fleetplane; assert 'ray' not in sys.modules, 'ray imported'; "
            "from ray import serve; assert getattr(serve.get_app_handle, "
            "'__fleetplane_patched__', False), 'not patched'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_an_ingress_whose_app_fails_to_import_is_a_build_error_naming_the_app() -> None:
    from controlplane.errors import BuildError
    from controlplane.usercode.build import build_application

    try:
        build_application({"name": "shop", "import_path": "tests.unit.broken_ingress_app:app"})
    except BuildError as e:
        assert e.app == "shop"
        assert e.message == (
            "import_path 'tests.unit.broken_ingress_app:app': importing module "
            "'tests.unit.broken_ingress_app' raised ModuleNotFoundError: No module named "
            "'a_dependency_that_is_not_installed'")
        assert "broken_ingress_app.py" in e.detail  # the traceback, for --verbose
    else:
        raise AssertionError("a failing import built")


def test_a_driver_handle_without_a_connection_says_to_connect() -> None:
    import ray

    from controlplane.routing.handles import DeploymentHandle

    assert not ray.is_initialized()
    try:
        DeploymentHandle("app", "Model").remote(1)
    except RuntimeError as e:
        assert "ray.init(address=...)" in str(e)
    else:
        raise AssertionError("a handle call ran without a cluster")
    assert not ray.is_initialized()  # and nothing started one


def test_the_apps_lifespan_runs_before_the_first_request() -> None:
    """Serve freezes the app (a pickled copy), so the lifespan is seen through the app."""
    from contextlib import asynccontextmanager

    from starlette.requests import Request as StarletteRequest

    @asynccontextmanager
    async def lifespan(app):
        app.state.model = "loaded at startup"
        yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/model")
    def model(request: StarletteRequest) -> str:
        return request.app.state.model

    Wrapped = serve.ingress(app)()

    async def main() -> None:
        user = UserCallable(Wrapped, (), {})
        await user.construct()
        head, body = await unary_response(await user.call_http(request("/model")))
        assert (head["status"], body) == (200, b'"loaded at startup"')
        await user.shutdown()  # Serve's async __del__: the lifespan's shutdown

    asyncio.run(main())
