"""A least-connection HTTP proxy in front of simulated backends (loopback only).

``python -m tests.llm_sim.proxy --port P --backend URL --backend URL``. Every request goes
to the backend with the fewest requests in flight, as a least-connection proxy does, so two
reads of ``/metrics`` through it may come from two different backends (seed 001: why a proxy
is checked only through ``/v1/models``). ``GET /proxy/stats`` counts the paths it forwarded.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import aiohttp
from aiohttp import web


class LeastConnectionProxy:
    def __init__(self, backends: list[str]) -> None:
        self.backends = [b.rstrip("/") for b in backends]
        self.in_flight = dict.fromkeys(self.backends, 0)
        self.paths: Counter[str] = Counter()
        self._session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/proxy/stats", self.stats)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        app.cleanup_ctx.append(self._client)
        return app

    async def _client(self, app: web.Application):
        self._session = aiohttp.ClientSession(trust_env=False)
        yield
        await self._session.close()

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"paths": dict(self.paths), "in_flight": self.in_flight})

    async def forward(self, request: web.Request) -> web.Response:
        backend = min(self.backends, key=lambda b: self.in_flight[b])
        self.paths[request.path] += 1
        self.in_flight[backend] += 1
        try:
            async with self._session.request(
                    request.method, backend + request.path_qs, data=await request.read(),
                    headers={"Content-Type": request.headers.get("Content-Type", "")}) as r:
                return web.Response(status=r.status, body=await r.read(),
                                    content_type=r.content_type)
        except aiohttp.ClientError as e:
            return web.Response(status=502, text=f"bad gateway: {e}")
        finally:
            self.in_flight[backend] -= 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.llm_sim.proxy")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--backend", action="append", required=True)
    args = p.parse_args(argv)
    web.run_app(LeastConnectionProxy(args.backend).app(), host="127.0.0.1", port=args.port,
                print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
