"""A deployment's routing policy as HAProxy balances its backend (pure).

HAProxy routes by itself in haproxy mode, so each policy (``routing.policies``) becomes
HAProxy's own algorithm, the same on every node:

- ``p2c`` and ``kv_load``: ``leastconn`` (HAProxy counts its own connections per server;
  it sees no KV-cache use, so ``kv_load`` is load alone here);
- ``round_robin``: ``roundrobin``;
- ``prefix`` and ``prefix_kv``: sticky on the prompt's start read from the body
  (``option http-buffer-request``; HAProxy's ``json_query``): a completion's ``prompt``,
  its first ``START_CHARS`` bytes; a chat's first message, ``START_PART_CHARS`` bytes, and
  when that is the system prompt the second's too: the proxy's start (``prefix_affinity``)
  for the usual [system, user, ...] and [user, ...] chats;
- ``session``: sticky on the ``session_header``'s value.

Sticky (``_sticky``): a key HAProxy has not seen goes by load (``leastconn``) and the server
it went to is remembered in the backend's stick table (the key's SHA-1); a key seen goes
where it went, while it has at most ``balance_factor`` x (mean + 1) requests in flight
(the proxy's bounded load, counted for the key, not for the server: HAProxy has no fetch
of a table-chosen server's load; never under ``AFFINITY_FLOOR``); past it, by load, not
remembered, so a hot few-shot template spreads and its home stays. A key whose server left
goes by load and is remembered anew. HAProxy 2.8's ``balance hash`` was the first design:
it places a unique prompt on its ring server unless that one is past the bound, blind to
how busy it is below it (HAProxy's own ``hash-preserve-affinity``, 2025, says so), and
measured TTFT p99 +90% over ``leastconn`` on prompts that share nothing; the sticky table
+1% to +6% (``release_tests.llm_routing``; leastconn against itself measured +8%: noise).

Every node's HAProxy must agree: the tables are one, synced by HAProxy's peers protocol
(``config._peers``: every node's HAProxy a peer, the list from the controller): a key
learnt on one node is pushed to the others, by server name (the replica id, the same
everywhere; ``server_id`` numbers them alike too). A reload hands the table to the new
worker through the local peer. Requests without a key (a body that is not JSON, has neither
``prompt`` nor ``messages``, holds the prompt in content parts, ``[{"type": "text", ...}]``,
or is bigger than HAProxy's buffer, ``tune.bufsize``, 80 KiB by default: about 20K tokens,
the part read not being valid JSON; a request without the session header) go by load.
What HAProxy does not have is the proxy's prefix index by blocks: a conversation is known
by its start only.
"""

from __future__ import annotations

import hashlib
from typing import Any

from controlplane.routing.affinity_choice import AFFINITY_FLOOR
from controlplane.routing.policies import RoutingPolicy
from controlplane.routing.prefix_affinity import START_CHARS, START_PART_CHARS

_KEY, _SHA = "txn.fp_key", "txn.fp_sha"
# Equal weights for every server: leastconn and roundrobin weigh by it (HAProxy's 1-256).
SERVER_WEIGHT = 64
DEFAULT_BALANCE = ["    balance leastconn"]  # p2c's, and a backend's without a policy
PEERS = "fleetplane"  # the peers section every node's stick tables sync through
STICK_TABLE = "    stick-table type binary len 20 size"  # a key's SHA-1 -> its server
# Keys remembered per backend and node, the oldest dropped first: 64K starts, about 10 MiB
# (an engine's cache holds about a thousand 256-token starts: 64 replicas' worth); a key
# unused for 30 minutes is long gone from its engine's cache too.
TABLE_SIZE, TABLE_EXPIRE = "64k", "30m"


def server_id(server: str) -> int:
    """The server's HAProxy ``id``, the same on every node: from its name (the replica id)."""
    digest = hashlib.blake2b(server.encode(), digest_size=8).digest()
    return 1 + int.from_bytes(digest, "big") % 2_000_000_000


def balance_lines(request_router: tuple[tuple[str, Any], ...]) -> list[str]:
    """The backend lines choosing a server for a deployment with this policy."""
    policy = RoutingPolicy.from_wire(dict(request_router))
    if policy.name == "round_robin":
        return ["    balance roundrobin"]
    if policy.name in ("prefix", "prefix_kv"):
        return [*_prompt_start_key(), *_sticky(policy)]
    if policy.name == "session":
        return [f"    http-request set-var({_KEY}) req.hdr({policy.session_header})",
                *_sticky(policy)]
    return list(DEFAULT_BALANCE)


def keeps_table(lines: list[str]) -> bool:
    """Whether a backend's balance lines keep a stick table (then HAProxy needs peers)."""
    return any(line.startswith(STICK_TABLE) for line in lines)


def _sticky(policy: RoutingPolicy) -> list[str]:
    """By load, and a key to where it went while it is within the bound (see above).
    ``fp_bound``: ceil(factor x be_conn / servers), be_conn counting this request (the
    proxy's ``capacity``); ``fp_busy``: the key's requests in flight here, this one too
    (the entry's trackers)."""
    percent = max(100, round(policy.balance_factor * 100))
    return [*DEFAULT_BALANCE,
            f"{STICK_TABLE} {TABLE_SIZE} expire {TABLE_EXPIRE} peers {PEERS}",
            f"    http-request set-var({_SHA}) var({_KEY}),sha1 if {{ var({_KEY}) -m found }}",
            f"    http-request track-sc1 var({_SHA}) if {{ var({_SHA}) -m found }}",
            "    http-request set-var(txn.fp_busy) sc1_trackers",
            "    http-request set-var(txn.fp_n100) nbsrv,mul(100)",
            f"    http-request set-var(txn.fp_bound) be_conn,mul({percent}),"
            "add(txn.fp_n100),sub(1),div(txn.fp_n100)",
            "    http-request set-var(txn.fp_room) var(txn.fp_bound),sub(txn.fp_busy)",
            f"    stick on var({_SHA}) if {{ var(txn.fp_room) -m int ge 0 }} || "
            f"{{ var(txn.fp_busy) -m int le {AFFINITY_FLOOR} }}"]


def _prompt_start_key() -> list[str]:
    body = "req.body,json_query"
    return [
        "    option http-buffer-request",
        f"    http-request set-var({_KEY}) {body}('$.prompt'),bytes(0,{START_CHARS})",
        f"    http-request set-var(txn.fp_role) {body}('$.messages[0].role')",
        f"    http-request set-var({_KEY}) {body}('$.messages[0].content'),"
        f"bytes(0,{START_PART_CHARS}) if !{{ var({_KEY}) -m found }}",
        f"    http-request set-var(txn.fp_next) {body}('$.messages[1].content'),"
        f"bytes(0,{START_PART_CHARS}) if {{ var(txn.fp_role) -m str system }}",
        f"    http-request set-var({_KEY}) var({_KEY}),concat(,txn.fp_next,) "
        "if { var(txn.fp_next) -m found }"]
