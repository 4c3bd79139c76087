"""This node's HAProxy among the fleet's peers (``config.Peers``), whose stick tables are
one (``balance``): its peer name, the address it listens on for the others, and the
others' as the controller last told (``ProxyFleet._share_peers``).

The address is this node's Ray address (where the other nodes reach it, whatever
``http_options.host`` is) and a port free when the HAProxy was first started; an adopted
HAProxy (its manager restarted) keeps the address and the peers its config has, so that
nothing is reloaded until the controller says otherwise. HAProxy's peers protocol has no
authentication: the port is reachable on the node's network, as the HTTP port is.
"""

from __future__ import annotations

from controlplane.ingress.haproxy.balance import PEERS
from controlplane.ingress.haproxy.config import Peers
from controlplane.routing.listen import free_port


def peer_name(node_id: str) -> str:
    """A node's peer name, the same in every node's config."""
    return f"node_{node_id[:16]}"


class PeerSet:
    def __init__(self, name: str) -> None:
        self.name = name
        self.address: str | None = None  # "ip:port", once ``listen_on`` chose it
        self._others: dict[str, str] = {}  # name -> address

    def listen_on(self, host: str, config: str = "") -> str:
        """The address this node's HAProxy serves its peers on: the one ``config`` (an
        adopted HAProxy's) has, with its peers; else a port of ``host`` free now."""
        written = peers_of(config)
        self._others = {n: a for n, a in written.items() if n != self.name}
        self.address = written.get(self.name) or f"{host}:{free_port(host)}"
        return self.address

    def set(self, peers: dict[str, str]) -> None:
        """The fleet's peers (this node's own entry, if there, is ignored: it knows it)."""
        self._others = {n: a for n, a in peers.items() if n != self.name}

    def current(self) -> Peers:
        if self.address is None:
            raise RuntimeError("the peer address is chosen when HAProxy starts")
        return Peers.of(self.name, {**self._others, self.name: self.address})


def peers_of(config: str) -> dict[str, str]:
    """name -> address of the peers section a rendered config has ({} without one)."""
    found, inside = {}, False
    for line in config.splitlines():
        if not line.startswith(" "):
            inside = line.strip() == f"peers {PEERS}"
            continue
        fields = line.split()
        if inside and len(fields) == 3 and fields[0] == "peer":
            found[fields[1]] = fields[2]
    return found
