"""Replica-set changes as HAProxy runtime-API commands (pure).

A server joins: added (dynamic servers start in maint), health checks enabled, marked
up (its replica passed its own check), enabled.
A server leaves: ``drain`` then ``maint`` in every worker, current and old, before the
replica closes its listener (phase 1 of the two-phase shutdown); deleted later, once it
has no connection left. Servers are named by replica id; a backend is a deployment.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.ingress.haproxy.balance import SERVER_WEIGHT, server_id
from controlplane.ingress.haproxy.config import backend_name, server_name  # noqa: F401 (re-exported)

Servers = dict[str, dict[str, str]]  # backend -> server -> "host:port"


@dataclass(frozen=True)
class Plan:
    added: list[tuple[str, str, str]]  # (backend, server, address)
    removed: list[tuple[str, str]]  # (backend, server)


def desired_servers(deployments: dict[str, list[tuple[str, str]]]) -> Servers:
    """deployment key -> [(replica id, address)] as backend -> server -> address."""
    return {backend_name(key): {server_name(rid): addr for rid, addr in replicas}
            for key, replicas in deployments.items()}


def diff(current: Servers, desired: Servers) -> Plan:
    added, removed = [], []
    for backend in sorted(set(current) | set(desired)):
        have, want = current.get(backend, {}), desired.get(backend, {})
        added += [(backend, s, want[s]) for s in sorted(want) if have.get(s) != want[s]]
        removed += [(backend, s) for s in sorted(have) if s not in want or have[s] != want[s]]
    return Plan(added, removed)


def add_commands(backend: str, server: str, address: str, maxconn: int,
                 with_id: bool = True) -> list[str]:
    """``with_id``: the server's ``id`` from its name, so that every node's HAProxy numbers
    it alike (False only after an id collision: HAProxy numbers it)."""
    target = f"{backend}/{server}"
    server_ref = f" id {server_id(server)}" if with_id else ""
    # The replica is RUNNING and passed its health check: UP at once, not after the
    # first HAProxy check (until then a new server would be DOWN: 503 with no other).
    return [f"add server {target} {address}{server_ref} weight {SERVER_WEIGHT} check "
            f"maxconn {max(1, maxconn)}",
            f"enable health {target}", f"set server {target} health up",
            f"enable server {target}"]


def leave_commands(backend: str, server: str) -> list[str]:
    target = f"{backend}/{server}"
    return [f"set server {target} state drain", f"set server {target} state maint"]


def delete_command(backend: str, server: str) -> str:
    return f"del server {backend}/{server}"
