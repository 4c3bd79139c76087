"""What a node's HAProxy should serve, and what its current worker was given.

``Wanted`` is what the long-polls say (routes, each deployment's replica set and limits,
whether the node drains) plus the servers a deregistration added ahead of the long-poll and
the fleet's HAProxy peers (``peers``: rendered while a backend keeps a stick table);
``Loaded`` is the routes and drain state of the last (re)load and the current worker's
servers since (runtime API). The ingress actor (``ingress``) turns the difference into a
reload (routes or drain changed) or runtime-API commands (``membership``).

Threads: the long-poll callbacks write ``Wanted`` on the event loop while the actor's sync
reads it in a thread: each read starts from a copy (``dict(...)`` copies under the GIL).
"""

from __future__ import annotations

from controlplane.ingress.haproxy import membership
from controlplane.ingress.haproxy.balance import DEFAULT_BALANCE, balance_lines
from controlplane.ingress.haproxy.config import Peers, needs_peers
from controlplane.ingress.haproxy.peers import PeerSet
from controlplane.wire import RoutingUpdate

EARLY_S = 10.0  # how long a replica added by a deregistration waits for the long-poll


class Wanted:
    def __init__(self, peers: PeerSet | None = None) -> None:
        self.routes: dict[str, str] | None = None  # prefix -> deployment key, once heard
        self.draining = False  # the node drains: readiness fails (a reload renders it)
        self.peers = peers
        self._deployments: dict[str, RoutingUpdate] = {}
        # added by a deregistration before the long-poll brought them: (address, until)
        self._early: dict[tuple[str, str], tuple[str, float]] = {}

    def set_deployment(self, key: str, update: RoutingUpdate | None) -> None:
        if update is None:
            self._deployments.pop(key, None)
        else:
            self._deployments[key] = update

    def joined_early(self, backend: str, server: str, address: str, now: float) -> None:
        """A server added ahead of the long-poll: kept until it brings it, not removed
        as unknown (at most ``EARLY_S``)."""
        self._early[(backend, server)] = (address, now + EARLY_S)

    def servers(self, loaded: membership.Servers, now: float) -> membership.Servers:
        """The members to serve. A deployment whose replica set this actor has not heard
        yet (it just restarted and adopted a running HAProxy) keeps the servers it has
        (``loaded``): unknown is not empty; so does every backend before the routes are
        heard (an adopted HAProxy's first sync once removed them all: 503s)."""
        if self.routes is None:
            return {backend: dict(servers) for backend, servers in loaded.items()}
        keys, deployments = set(dict(self.routes).values()), dict(self._deployments)
        desired = membership.desired_servers({
            key: [(r.replica_id, r.http_address) for r in update.replicas if r.http_address]
            for key, update in deployments.items() if key in keys})
        for key in keys - set(deployments):
            backend = membership.backend_name(key)
            desired[backend] = dict(loaded.get(backend, {}))
        for (backend, server), (address, until) in list(self._early.items()):
            if now >= until or server in desired.get(backend, {}):
                del self._early[(backend, server)]  # the long-poll has it (or never will)
            elif backend in desired:
                desired[backend][server] = address
        return desired

    def maxconn(self) -> dict[str, int]:
        """Each backend's ``maxconn`` per server (``server_maxconn``)."""
        return {membership.backend_name(k): server_maxconn(u)
                for k, u in dict(self._deployments).items()}

    def balances(self) -> dict[str, list[str]]:
        """Each routed backend's ``balance`` lines where its policy is not the default
        (``render`` gives a backend without lines leastconn): a new p2c deployment, whose
        policy arrives after its route, costs no second reload."""
        keys = set(dict(self.routes or {}).values())
        lines = {membership.backend_name(k): balance_lines(u.request_router)
                 for k, u in dict(self._deployments).items() if k in keys}
        return {backend: b for backend, b in lines.items() if b != DEFAULT_BALANCE}

    def rendered_peers(self, balances: dict[str, list[str]]) -> Peers | None:
        """The peers to render with ``balances``: None where no backend keeps a table."""
        return self.peers.current() if self.peers is not None and needs_peers(balances) \
            else None

    def cold(self) -> set[str]:
        """Routed backends whose deployment scales to zero: the cold-start door is their
        backup server (``cold_door``)."""
        keys = set(dict(self.routes or {}).values())
        return {membership.backend_name(k) for k, u in dict(self._deployments).items()
                if k in keys and getattr(u, "cold_hold_s", None) is not None}


def server_maxconn(update: RoutingUpdate) -> int:
    """How many requests HAProxy sends one replica at once. A replica admits as a router
    does (its slots, then ``max_queued_requests`` waiting) and rejects beyond with the
    Retry-After its policy computes, so with a bounded queue one more than it admits: that
    request reaches the replica and is rejected at once, with the hint, where HAProxy's own
    queue would hold it and then answer a 503 without one. With an unbounded queue (-1),
    its slots: the rest wait in HAProxy's queue."""
    if update.max_queued_requests < 0:
        return update.max_ongoing_requests
    return update.max_ongoing_requests + update.max_queued_requests + 1


class Loaded:
    def __init__(self) -> None:
        self.routes: dict[str, str] | None = None  # what HAProxy's config has
        self.draining = False
        self.servers: membership.Servers = {}  # what the current worker has
        self.balances: dict[str, list[str]] = {}  # each backend's balance lines
        self.cold: set[str] = set()  # backends with the cold-start door as backup
        self.peers: Peers | None = None  # the peers rendered (None: no stick table)

    def differs(self, wanted: Wanted) -> bool:
        """Whether the config must be rendered again (a reload): routes, drain, a
        backend's routing policy, whether it scales to zero, or the peers changed."""
        balances = wanted.balances()
        return (wanted.routes is not None and wanted.routes != self.routes) or \
            wanted.draining != self.draining or balances != self.balances or \
            wanted.cold() != self.cold or wanted.rendered_peers(balances) != self.peers


class LateLeaving:
    """Phase 1 off (``ReplicaSettings.deregister_before_stop``, only to show what it
    prevents): HAProxy is told that a replica left a deregistration window late, as
    membership applied by a later reload would be."""

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._due: dict[tuple[str, str], float] = {}  # (backend, server) -> when to tell

    def not_yet(self, backend: str, server: str, now: float) -> bool:
        due = self._due.setdefault((backend, server), now + self._window_s)
        if due > now:
            return True
        del self._due[(backend, server)]
        return False
