"""Ray Serve applications written against Serve's own API only (no fleetplane import), one
per feature of issue 12: FastAPI ingress in its three forms, the replica context,
@serve.batch, @serve.multiplexed, handle composition and streaming, calling conventions,
reconfigure with rank and a builder with typed args."""


import asyncio
from typing import Optional

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from pydantic import BaseModel
from ray import serve
from starlette.requests import Request


class Item(BaseModel):
    name: str
    price: float


# ---- 1. FastAPI: routes in the class, path parameters, bodies, the replica context ------
api = FastAPI()


@serve.deployment
@serve.ingress(api)
class Api:
    def __init__(self, greeting: str = "hello") -> None:
        self.greeting = greeting
        context = serve.get_replica_context()  # available in the constructor, as in Serve
        self.born = (context.app_name, context.deployment)

    @api.get("/hi")
    def hi(self, name: str = "world") -> str:
        return f"{self.greeting} {name}"

    @api.post("/items/{item_id}")
    async def put_item(self, item_id: int, item: Item) -> dict:
        return {"id": item_id, "item": item, "total": item.price * 2}

    @api.get("/whoami")
    def whoami(self) -> dict:
        context = serve.get_replica_context()
        return {"app": context.app_name, "deployment": context.deployment,
                "rank": context.rank.rank, "world_size": context.world_size,
                "tag": context.replica_tag, "born": list(self.born)}


    @api.websocket("/ws")
    async def echo(self, ws: WebSocket) -> None:
        await ws.accept()
        try:
            while (text := await ws.receive_text()) != "bye":
                await ws.send_text(f"{self.greeting} {text}")
            await ws.close(code=1000)
        except WebSocketDisconnect:
            pass


api_app = Api.bind(greeting="hey")


# ---- 2. An existing FastAPI app passed in, with a downstream deployment ---------------
standalone = FastAPI()


@standalone.get("/square/{x}")
def square(x: int) -> dict:
    return {"square": x * x}


standalone_app = serve.deployment(serve.ingress(standalone)()).bind()


# ---- 3. A factory building the app at replica start; handles by name ------------------
@serve.deployment
class Adder:
    def __call__(self, x: int) -> int:
        return x + 100


def build_asgi() -> FastAPI:
    app = FastAPI()

    @app.get("/add/{x}")
    async def add(x: int) -> dict:
        handle = serve.get_deployment_handle("Adder", app_name="compat-factory")
        return {"sum": await handle.remote(x)}

    return app


factory_app = serve.deployment(serve.ingress(build_asgi)()).bind(Adder.bind())


# ---- 4. @serve.batch, plain and as a streaming async generator ------------------------
@serve.deployment(max_ongoing_requests=16)
class Batcher:
    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.2)
    async def double(self, xs: list[int]) -> list[dict]:
        return [{"value": x * 2, "batch_size": len(xs)} for x in xs]

    async def __call__(self, request: Request) -> dict:
        return await self.double(int(request.query_params["x"]))

    @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.1)
    async def count_to(self, ns: list[int]):
        for i in range(max(ns)):
            yield [str(i) if i < n else StopIteration for n in ns]

    async def stream(self, n: int):
        async for item in self.count_to(n):
            yield item


batch_app = Batcher.bind()


# ---- 5. @serve.multiplexed -------------------------------------------------------------
@serve.deployment(num_replicas=2)
class Multi:
    @serve.multiplexed(max_num_models_per_replica=3)
    async def get_model(self, model_id: str) -> str:
        await asyncio.sleep(0.05)
        return f"model:{model_id}"

    async def __call__(self, request: Optional[Request] = None) -> dict:
        model_id = serve.get_multiplexed_model_id()
        return {"model_id": model_id, "model": await self.get_model(model_id),
                "replica": serve.get_replica_context().replica_tag}


multi_app = Multi.bind()


# ---- 6. Calling conventions, composition from a driver, reconfigure with rank ----------
@serve.deployment
def no_request() -> dict:
    return {"called": "without a request"}


class Price(BaseModel):
    item: str
    cents: int


@serve.deployment
class Shop:
    def __init__(self) -> None:
        self.seen: list = []

    def reconfigure(self, config: dict, rank) -> None:
        self.seen.append((config, rank.rank))

    def __call__(self, request: Request) -> Price:
        return Price(item=request.query_params.get("item", "tea"), cents=250)

    def reconfigured(self) -> list:
        return self.seen

    def add_one(self, x: int) -> int:
        return x + 1

    def numbers(self, n: int):
        for i in range(n):
            yield i


shop_app = Shop.bind()


# ---- 7. An application builder with typed args ----------------------------------------
class GreeterArgs(BaseModel):
    greeting: str
    times: int = 1


@serve.deployment
class Greeter:
    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self) -> str:
        return self.text


def greeter_builder(args: GreeterArgs):
    return Greeter.bind(" ".join([args.greeting] * args.times))
