"""The load of ``release_tests.llm_routing``: streamed OpenAI requests over HTTP, open loop
(Poisson arrivals at a rate) or closed loop (a number of clients, to find capacity).

Each request is a new connection (``force_close``): with several proxies sharing a port
(SO_REUSEPORT) the kernel spreads connections over them, so every proxy's router places
requests, as with many clients. Time to first token (TTFT) is the time from the request's
send to its first server-sent event with a token; end to end to its ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import aiohttp

from release_tests.llm_workloads import LLMRequest

REQUEST_TIMEOUT_S = 120.0


@dataclass
class Outcome:
    sent_at: float  # seconds from the run's start
    ttft_s: float | None
    e2e_s: float
    ok: bool
    status: int  # 0: no answer (a connection error or the timeout)
    prompt_tokens: int
    error: str = ""


async def one(session: aiohttp.ClientSession, base_url: str, request: LLMRequest,
              start: float) -> Outcome:
    sent = time.perf_counter()
    first: float | None = None
    status, ok, error = 0, False, ""
    try:
        async with session.post(base_url + request.path, json=request.body) as response:
            status = response.status
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    ok = status == 200 and not error
                    break
                if b'"error"' in data[:40] or b'"object": "error"' in data:
                    error = json.loads(data).get("message", "error")[:80]
                elif first is None:
                    first = time.perf_counter()
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
        error = type(e).__name__
    done = time.perf_counter()
    return Outcome(sent - start, None if first is None else first - sent, done - sent,
                   ok, status, request.prompt_tokens, error)


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True, limit=0),
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))


async def open_loop(base_url: str | list[str], workload, rate: float, duration_s: float,
                    seed: int) -> list[Outcome]:
    """Poisson arrivals at ``rate`` for ``duration_s``; waits for every answer. With
    several base URLs (several nodes' ingresses), each request goes to one at random (its
    own random stream: the arrivals are the same as with one)."""
    rng, pick = random.Random(seed), random.Random(seed + 1)
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    tasks: list[asyncio.Task] = []
    async with _session() as session:
        start = time.perf_counter()
        due = start
        while True:
            due += rng.expovariate(rate)
            if due - start >= duration_s:
                break
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            url = urls[pick.randrange(len(urls))]
            tasks.append(asyncio.create_task(_tracked(session, url, workload, start)))
        return list(await asyncio.gather(*tasks))


async def closed_loop(base_url: str, workload, clients: int,
                      duration_s: float) -> list[Outcome]:
    """``clients`` each sending their next request when the last is answered."""
    async with _session() as session:
        start = time.perf_counter()
        outcomes: list[Outcome] = []

        async def client() -> None:
            while time.perf_counter() - start < duration_s:
                outcomes.append(await _tracked(session, base_url, workload, start))

        await asyncio.gather(*(client() for _ in range(clients)))
        return outcomes


async def _tracked(session: aiohttp.ClientSession, base_url: str, workload,
                   start: float) -> Outcome:
    request = workload.next()
    outcome = await one(session, base_url, request, start)
    workload.answered(request, outcome.ok)
    return outcome
