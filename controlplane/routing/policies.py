"""A deployment's routing policy (``request_router_config``), and the key a request carries
for it.

Policies (their config names):

- ``p2c``: power of two choices on queue length, the default (Ray Serve's default router);
- ``round_robin``: the next replica with room, in turn (a baseline for comparisons);
- ``prefix``: prefix-cache affinity. The prompt's start goes to its replica on the hash
  ring, within the bounded load (``prefix_affinity``); a prompt whose blocks this router
  sent past its start to another replica (a conversation the bound once spilled) follows
  them there (``prefix_index``); over the bound, by load (power of two choices);
- ``kv_load``: power of two choices on ``kv_score``: the queue length, and an engine whose
  KV-cache use (0-1, from the replica's ``record_routing_stats``: for ``VLLMServer``, what
  its health check last read of ``vllm:kv_cache_usage_perc``) is past ``KV_PRESSURE``
  counting as full slots;
- ``prefix_kv``: ``prefix``, and by ``kv_load`` where prefix places nothing;
- ``session``: the value of a request header (``session_header``) on the hash ring within
  the bounded load: a session's requests go to one replica.

The bounded load, ``balance_factor`` x (mean load + 1), is the fall-back threshold: past
it a prefix spills to the next replica on its ring walk, and with every replica on the walk
past it, to load: the busiest replica stays within about that factor of the mean (on the
HAProxy path, the same bound on a start's own requests in flight: ``haproxy/balance.py``),
where unbounded affinity
hot-spots the replica of a popular system prompt. The default is 2: the paper's examples
and HAProxy's use 1.25, which at 0.8 of capacity sent more conversations away from their
caches (swings past 1.25 x the mean are common at a few requests a replica).
Exploratory quick runs of release_tests.llm_routing (shared prefixes, 0.8, this machine):
factor 1.25 / 1.5 / 2 gave cache-hit rates 0.73 / 0.76 / 0.77 through the proxy, TTFT p50
cuts against p2c of 40% / 49% / 60%, and a busiest replica at most 1.18 / 1.26 / 1.39 x
the mean (over proxy and HAProxy). Peers bound less: Serve LLM's prefix router by default
never falls back (``imbalanced_threshold`` infinite), SGLang's only past 32 requests apart. The bound never goes under 2
requests (``affinity_choice.AFFINITY_FLOOR``): near idle it would be 1, and a conversation
would be split by any second request, or by another router's stale count, for no gain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controlplane.routing.prefix_affinity import (BLOCK_CHARS, DEFAULT_BALANCE_FACTOR, Prompt,
                                                   block_keys, read_prompt)

POLICIES = ("p2c", "round_robin", "prefix", "kv_load", "prefix_kv", "session")
PROMPT_POLICIES = frozenset({"prefix", "prefix_kv"})
KV_POLICIES = frozenset({"kv_load", "prefix_kv"})
DEFAULT_SESSION_HEADER = "x-session-id"
# KV-cache use past which an engine is about to preempt (vLLM recomputes a running request
# when a new block cannot be had): kv_load then counts the use as that many full slots.
KV_PRESSURE = 0.9


def kv_score(load: int, kv_use: float, max_ongoing: int) -> float:
    """kv_load's score of a replica: its queue length, and past ``KV_PRESSURE`` (the engine
    nears preemption) the use x ``max_ongoing`` added: such a replica counts as full.

    Under it the use is not weighed at all. It is as old as the replica's last health read
    (seconds, where a queue length is this router's own count plus a probe's) and the same
    number on every router: weighed more, it sent requests after a stale number (TTFT p50
    about twice p2c's in an exploratory run); as a tie-breaker between equal queue lengths,
    every router sent its ties to the engine that read lowest until the next read. Random
    prompts at 0.8 through the proxy (``release_tests.llm_routing``, rounds of every policy
    on the same arrivals, exploratory runs): with the tie-break, prefix_kv's TTFT p99 was
    over p2c's in 6 rounds of 6 (+12% to +61%), kv_load's in 3 of 3 (+2% to +9%); without,
    in one run, prefix_kv +12%, +20%, -2%, kv_load -13%, 0%, -8%. A round moves by about
    20% (prefix, the same placement as prefix_kv on prompts that share nothing: -12%, +19%,
    +9% in that run): a lean, not a proof; the change stands on the mechanism."""
    if kv_use >= KV_PRESSURE:
        return load + kv_use * max_ongoing
    return float(load)


@dataclass(frozen=True, slots=True)
class Affinity:
    """What places a request before load does: a ring key, and a prompt's block keys."""

    start: str  # on the hash ring
    blocks: tuple[int, ...] = ()  # for the router's prefix index (prompt policies)
    start_blocks: int = 0  # how many of ``blocks`` the start covers
    continued: bool = False  # a conversation's later turn (``Prompt.continued``)


@dataclass(frozen=True)
class RoutingPolicy:
    name: str = "p2c"
    balance_factor: float = DEFAULT_BALANCE_FACTOR
    session_header: str = DEFAULT_SESSION_HEADER

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"request_router_config.request_router_class: unknown policy "
                             f"{self.name!r}; one of {', '.join(POLICIES)}")
        if self.balance_factor < 1:
            raise ValueError("request_router_kwargs.balance_factor must be >= 1")

    @classmethod
    def from_wire(cls, fields: dict | None) -> RoutingPolicy:
        return cls(**fields) if fields else cls()

    @property
    def reads_prompt(self) -> bool:
        return self.name in PROMPT_POLICIES

    @property
    def uses_kv(self) -> bool:
        return self.name in KV_POLICIES

    def of_http(self, headers: list[tuple[bytes, bytes]], body: bytes) -> Affinity | None:
        """The affinity of an HTTP request: its prompt's or its session header's."""
        if self.name == "session":
            wanted = self.session_header.lower().encode()
            for name, value in headers:
                if name.lower() == wanted and value:
                    return Affinity(value.decode("latin-1"))
            return None
        if self.reads_prompt:
            return _of_prompt(read_prompt(body))
        return None

    def of_call(self, args: tuple, kwargs: dict) -> Affinity | None:
        """The affinity of a handle call (prompt policies): its first argument, or its
        ``request`` keyword, when that is an OpenAI request: a dict with ``prompt`` or
        ``messages``, or an object with ``model_dump()`` giving one (Serve LLM's request
        models). Anything else is placed by load."""
        if not self.reads_prompt:
            return None
        request = args[0] if args else kwargs.get("request")
        if hasattr(request, "model_dump") and not isinstance(request, dict):
            try:
                request = request.model_dump()
            except Exception:  # a model that cannot dump: no key, placed by load
                return None
        return _of_prompt(read_prompt(request)) if isinstance(request, dict) else None


def _of_prompt(prompt: Prompt | None) -> Affinity | None:
    if prompt is None:
        return None
    return Affinity(prompt.start, block_keys(prompt.text), prompt.start_chars // BLOCK_CHARS,
                    prompt.continued)
