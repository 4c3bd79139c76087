"""Where a node's HTTP listeners bind: ``http_options.host`` as an address.

``node_ip`` means this node's Ray address (``ray start --node-ip-address``), so a fleet
whose nodes share one machine with distinct loopback addresses (127.0.0.2, 127.0.0.3...)
serves the same port on every node; any other value is bound as given.
"""

from __future__ import annotations

NODE_IP = "node_ip"


def bind_host(host: str) -> str:
    if host != NODE_IP:
        return host
    import ray

    return ray.util.get_node_ip_address()
