"""Prefix affinity: the same prompt prefix to the same replica, from every router, without
shared state. Groundwork for LLM-aware routing (not yet a routing policy a config can name).

An LLM engine keeps the KV cache of the prompts it has read; a request whose prompt starts
like an earlier one skips reading that part again, but only on the replica that read it.
Routers that each keep their own index of who read what disagree (one per proxy, one per
handle), and the affinity halves with every router added. Here the choice is a pure
function of the prompt and the replica set instead:

- ``prompt_prefix``: the start of an OpenAI request's prompt (``/v1/completions``'
  ``prompt``, ``/v1/chat/completions``' ``messages`` in order) up to ``max_chars``; None for
  a body that is not such JSON (it is routed by load alone, no error).
- ``HashRing``: consistent hashing of that prefix onto the replicas (``VNODES`` points per
  replica): every router with the same replica set maps a prefix to the same replica, and a
  replica joining or leaving moves only the prefixes it takes or held (about 1/N of them).
- ``choose``: with bounded loads (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with
  Bounded Loads", SODA 2018): walk the ring from the prefix's point and take the first
  replica with a free slot whose load is within ``balance_factor`` x the mean (+1), so a
  popular prefix (a shared system prompt) spills over to the next replica on its ring walk,
  the same one from every router, instead of hot-spotting one replica. HAProxy's
  ``hash-type consistent`` with ``hash-balance-factor`` is the same scheme, for the
  HAProxy path.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from typing import Any, Callable, Iterator, Sequence

DEFAULT_MAX_CHARS = 1024  # about 256 tokens: a system prompt or a template's head
VNODES = 64  # ring points per replica: loads within a few % of even at 8+ replicas
DEFAULT_BALANCE_FACTOR = 1.25  # the bound the paper and HAProxy's examples use


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def prompt_prefix(body: bytes | str | dict | None, max_chars: int = DEFAULT_MAX_CHARS
                  ) -> str | None:
    """The first ``max_chars`` characters of a completion's ``prompt`` or of a chat's
    ``messages`` (each as ``role: content``, in order); None when the body has neither."""
    if isinstance(body, (bytes, str)):
        try:
            body = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None
    if not isinstance(body, dict):
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]  # a batch of prompts: the first leads
    if isinstance(prompt, str) and prompt:
        return prompt[:max_chars]
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        return _messages_prefix(messages, max_chars) or None
    return None


def _messages_prefix(messages: list[Any], max_chars: int) -> str:
    parts: list[str] = []
    size = 0
    for message in messages:
        if not isinstance(message, dict):
            break
        content = message.get("content")
        if isinstance(content, list):  # content parts: their text, in order
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        part = f"{message.get('role', '')}: {content if isinstance(content, str) else ''}\n"
        parts.append(part)
        size += len(part)
        if size >= max_chars:
            break
    return "".join(parts)[:max_chars]


class HashRing:
    """Replicas on a hash ring, ``VNODES`` points each, placed by the replica's id alone (so
    every router builds the same ring from the same set)."""

    def __init__(self, replica_ids: Sequence[str], vnodes: int = VNODES) -> None:
        points = sorted((_hash(f"{rid}#{i}".encode()), rid)
                        for rid in set(replica_ids) for i in range(vnodes))
        self._keys = [k for k, _ in points]
        self._owners = [rid for _, rid in points]
        self.size = len(set(replica_ids))

    def walk(self, key: str) -> Iterator[str]:
        """Every replica once, in ring order from ``key``'s point."""
        if not self._keys:
            return
        start = bisect.bisect(self._keys, _hash(key.encode()))
        seen: set[str] = set()
        for i in range(len(self._keys)):
            owner = self._owners[(start + i) % len(self._keys)]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == self.size:
                    return


def capacity(total_load: int, replicas: int,
             balance_factor: float = DEFAULT_BALANCE_FACTOR) -> int:
    """The most requests a replica may hold before a prefix spills past it: ``ceil(c x
    (m + 1) / n)`` for ``m`` requests on ``n`` replicas (the paper's bound, at least 1)."""
    return max(1, math.ceil(balance_factor * (total_load + 1) / max(1, replicas)))


def choose(ring: HashRing, key: str, load_of: Callable[[str], int | None], total_load: int,
           balance_factor: float = DEFAULT_BALANCE_FACTOR) -> str | None:
    """The first replica on ``key``'s ring walk with room (``load_of`` not None: None means
    full, stopping or unreachable, as for power of two choices) and a load under
    ``capacity``; None when none qualifies (the caller falls back to load-based placement,
    or queues). Stops at the first that qualifies: usually the first or second looked at."""
    bound = capacity(total_load, ring.size, balance_factor)
    for rid in ring.walk(key):
        load = load_of(rid)
        if load is not None and load + 1 <= bound:
            return rid
    return None
