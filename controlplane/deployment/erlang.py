"""How many engines a demand needs for its requests to wait little for a slot: Erlang C.

An LLM engine serves ``slots`` requests at once (vLLM's ``max_num_seqs``); a request that
finds them taken waits, and its time to first token is that wait plus its prefill. For a
fleet of ``n`` engines the M/M/c queue with ``c = n x slots`` servers gives the share of
requests that wait longer than ``t`` seconds (Erlang C):

    P(wait > t) = C(c, a) x exp(-(c - a) x t / s)

where ``a`` is the offered load in busy slots (the requests in service and waiting: by
Little's law, arrivals per second x ``s``) and ``s`` the mean time a request holds a slot.
Unlike a fixed fill, it asks for headroom where chance needs it: at the same bound (``s``
21 s, ``t`` 10 s, 1 in 10,000: the LLM policy's) and 4 slots an engine, 0.5 busy slots
need two engines, 10 need 5 (50% full), 100 need 29 (86%).

Pure and O(c): Erlang B by its stable recursion, B(0) = 1, B(k) = a B(k-1) / (k + a B(k-1)),
then C = B / (1 - rho (1 - B)).
"""

from __future__ import annotations

import math


def late_share(servers: int, load: float, slot_s: float, wait_s: float) -> float:
    """P(wait > ``wait_s``) for ``load`` busy slots offered to ``servers`` slots (1 when
    the load is at or over them: the queue grows without bound)."""
    if load <= 0:
        return 0.0
    if load >= servers:
        return 1.0
    return _late(servers, load, _erlang_b(servers, load), slot_s, wait_s)


def engines_for(load: float, slots: int, slot_s: float, wait_s: float, share: float,
                first: int, most: int) -> int:
    """The fewest engines, from ``first`` to ``most``, for which at most ``share`` of the
    requests wait longer than ``wait_s``; ``most`` when none is enough. One pass of the
    recursion: each engine tried adds its ``slots`` steps."""
    if load <= 0:
        return max(0, first)
    b, k = 1.0, 0
    for n in range(max(1, first), most + 1):
        while k < n * slots:
            k += 1
            b = load * b / (k + load * b)
        c = n * slots
        if load < c and _late(c, load, b, slot_s, wait_s) <= share:
            return n
    return most


def _erlang_b(servers: int, load: float) -> float:
    b = 1.0
    for k in range(1, servers + 1):
        b = load * b / (k + load * b)
    return b


def _late(servers: int, load: float, b: float, slot_s: float, wait_s: float) -> float:
    """P(wait > ``wait_s``) from Erlang B's ``b`` for these servers (load under them)."""
    rho = load / servers
    return b / (1.0 - rho * (1.0 - b)) * math.exp(-(servers - load) * wait_s / slot_s)
