"""Prefix affinity: the same prompt prefix to the same replica, from every router, without
shared state (the ``prefix``, ``prefix_kv`` and ``session`` routing policies,
``routing.policies``).

An LLM engine keeps the KV cache of the prompts it has read; a request whose prompt starts
like an earlier one skips reading that part again, but only on the replica that read it.
Routers that each keep their own index of who read what disagree (one per proxy, one per
handle), and the affinity halves with every router added. Here the first choice is a pure
function of the prompt and the replica set instead:

- ``read_prompt``: an OpenAI request's prompt (``/v1/completions``' ``prompt``,
  ``/v1/chat/completions``' ``messages`` in order), at most ``max_chars`` of it (only the
  first blocks are hashed, however long the prompt), and its *start*: a completion's first
  ``START_CHARS``; a chat's messages up to its first user message, ``START_PART_CHARS`` of
  each. A conversation keeps its start turn after turn, and two conversations with one
  system prompt have different starts. None for a body that is not such JSON (routed by
  load alone, no error).
- ``HashRing``: consistent hashing of the start onto the replicas (``VNODES`` points per
  replica): every router with the same replica set maps a start to the same replica, and a
  replica joining or leaving moves only the starts it takes or held (about 1/N of them).
- ``choose``: with bounded loads (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with
  Bounded Loads", SODA 2018): walk the ring from the start's point and take the first
  replica with a free slot whose load is within ``balance_factor`` x the mean (+1), so a
  popular prefix spills over to the next replica on its ring walk, the same one from every
  router, instead of hot-spotting one replica. (The HAProxy path keeps the start sticky
  in a stick table its peers share instead: ``ingress/haproxy/balance.py``.)
- ``block_keys``: the prompt's full blocks of ``BLOCK_CHARS``, each key chained to the ones
  before it (as vLLM's block hashes are), for a router's ``PrefixIndex``.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

START_CHARS = 1024  # a completion's start: about 256 tokens, a few-shot template's head
START_PART_CHARS = 512  # of each message in a chat's start
BLOCK_CHARS = 256  # about 64 tokens: four of vLLM's 16-token blocks
MAX_PROMPT_CHARS = 64 * BLOCK_CHARS  # what is read of a prompt at most (16 KiB of text)
VNODES = 64  # ring points per replica: loads within a few % of even at 8+ replicas
# The bound's default (policies.py says why 2, where the paper's examples use 1.25).
DEFAULT_BALANCE_FACTOR = 2.0


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str  # the prompt as read, in order, at most max_chars
    start: str  # the ring key: the conversation's start
    start_chars: int  # how much of ``text`` the start covers (its blocks)
    continued: bool = False  # a chat with messages after its start: a conversation's turn 2+


def read_prompt(body: Any, max_chars: int = MAX_PROMPT_CHARS) -> Prompt | None:
    """The prompt of a completion (``prompt``, the first of a batch) or of a chat
    (``messages``, each as ``role: content``); None when the body has neither. ``body``:
    JSON bytes or text, or the parsed dict."""
    if isinstance(body, (bytes, bytearray, str)):
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
        text = prompt[:max_chars]
        return Prompt(text, text[:START_CHARS], min(len(text), START_CHARS))
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        return _chat_prompt(messages, max_chars)
    return None


def _chat_prompt(messages: list[Any], max_chars: int) -> Prompt | None:
    parts: list[str] = []
    start: list[str] = []
    size, start_chars, started = 0, 0, False
    for message in messages:
        if not isinstance(message, dict):
            break
        content = message.get("content")
        if isinstance(content, list):  # content parts: their text, in order
            content = "".join(p.get("text", "") for p in content
                              if isinstance(p, dict) and isinstance(p.get("text"), str))
        role = message.get("role")
        part = f"{role}: {content if isinstance(content, str) else ''}\n"
        parts.append(part)
        size += len(part)
        if not started:
            start.append(part[:START_PART_CHARS])
            start_chars = min(size, max_chars)
            started = role == "user"
        if size >= max_chars:
            break
    if not parts:
        return None
    return Prompt("".join(parts)[:max_chars], "".join(start), start_chars,
                  continued=len(parts) > len(start))


def block_keys(text: str, block_chars: int = BLOCK_CHARS) -> tuple[int, ...]:
    """One key per full block of ``text``, each chained to those before it: equal keys
    mean equal text up to that block. Python's ``hash`` (salted per process): the keys
    are for this router's own index."""
    keys, key = [], 0
    for end in range(block_chars, len(text) + 1, block_chars):
        key = hash((key, text[end - block_chars:end]))
        keys.append(key)
    return tuple(keys)


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
             balance_factor: float = DEFAULT_BALANCE_FACTOR, floor: int = 1) -> int:
    """The most requests a replica may hold before a prefix spills past it: ``ceil(c x
    (m + 1) / n)`` for ``m`` requests on ``n`` replicas (the paper's bound), and never
    under ``floor``: near idle the paper's bound is 1, so any two requests of one prefix
    (or one another router's stale load counts) would split it for no gain."""
    return max(1, floor, math.ceil(balance_factor * (total_load + 1) / max(1, replicas)))


def choose(ring: HashRing, key: str, load_of: Callable[[str], int | None], total_load: int,
           balance_factor: float = DEFAULT_BALANCE_FACTOR, floor: int = 1) -> str | None:
    """The first replica on ``key``'s ring walk with room (``load_of`` not None: None means
    full, stopping or unreachable, as for power of two choices) and a load under
    ``capacity``; None when none qualifies (the caller falls back to load-based placement,
    or queues). Stops at the first that qualifies: usually the first or second looked at."""
    bound = capacity(total_load, ring.size, balance_factor, floor)
    for rid in ring.walk(key):
        load = load_of(rid)
        if load is not None and load + 1 <= bound:
            return rid
    return None
