"""A deployment's routing policy as HAProxy balances its backend (pure).

HAProxy routes by itself in haproxy mode, so each policy (``routing.policies``) becomes
HAProxy's own algorithm, the same on every node:

- ``p2c`` and ``kv_load``: ``leastconn`` (HAProxy counts its own connections per server;
  it sees no KV-cache use, so ``kv_load`` is load alone here);
- ``round_robin``: ``roundrobin``;
- ``prefix`` and ``prefix_kv``: ``balance hash`` of the prompt's start read from the body
  (``option http-buffer-request``; HAProxy's ``json_query``): a completion's ``prompt``,
  its first ``START_CHARS`` bytes; a chat's first message, ``START_PART_CHARS`` bytes, and
  when that is the system prompt the second's too: the proxy's start (``prefix_affinity``)
  for the usual [system, user, ...] and [user, ...] chats. With ``hash-type consistent``
  and ``hash-balance-factor`` (the policy's ``balance_factor`` x 100), HAProxy's bounded
  loads, the proxy's scheme: a start spills to the next server on the ring past the bound.
- ``session``: the ``session_header``'s value, hashed alike.

Every HAProxy of the fleet must build the same ring: a server's place on it comes from its
``id``, which is set from the replica id (``server_id``), not from the order servers were
added on each node. Every server has ``weight`` ``SERVER_WEIGHT``: HAProxy gives a server
points on the ring in proportion to its weight, and at the default weight of 1 the ring
was so coarse that 800 keys over 8 servers all went to one (checked against the binary);
at 64 the busiest server got 1.1x the mean. Equal weights leave leastconn and roundrobin
as they were. Requests without a key get a random one (spread over the ring, within
the same bound; HAProxy's own fallback for a missing key sent 5 of 8 to one server): a body that is not JSON, has neither ``prompt`` nor ``messages``, holds
the prompt in content parts (``[{"type": "text", ...}]``), or is bigger than HAProxy's
buffer (``tune.bufsize``, 80 KiB by default: about 20K tokens; the part read is not valid
JSON), and a request without the session header. What HAProxy does not have is this
router's prefix index: a conversation the bound spilled is not followed to its replica.
"""

from __future__ import annotations

import hashlib
from typing import Any

from controlplane.routing.policies import RoutingPolicy
from controlplane.routing.prefix_affinity import START_CHARS, START_PART_CHARS

_KEY = "txn.fp_key"
SERVER_WEIGHT = 64  # of HAProxy's 1-256: ring points per server (see above)
DEFAULT_BALANCE = ["    balance leastconn"]  # p2c's, and a backend's without a policy


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
        return [*_prompt_start_key(), *_hashed(policy)]
    if policy.name == "session":
        return [f"    http-request set-var({_KEY}) req.hdr({policy.session_header})",
                *_hashed(policy)]
    return list(DEFAULT_BALANCE)


def _hashed(policy: RoutingPolicy) -> list[str]:
    """Balance on the key, bounded; a request without one on a random key (spread, and
    bounded alike), where HAProxy's own fallback for a missing key sent most to one."""
    return [f"    http-request set-var({_KEY}) rand if !{{ var({_KEY}) -m found }}",
            f"    balance hash var({_KEY})", "    hash-type consistent",
            f"    hash-balance-factor {max(100, round(policy.balance_factor * 100))}"]


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
