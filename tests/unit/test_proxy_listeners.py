"""The node's proxies share one port (SO_REUSEPORT); the first checks it is free, so
another instance's proxies are never joined silently. Real sockets on loopback."""

from __future__ import annotations

import socket

import pytest

from controlplane.routing.listen import listen_socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_listeners_share_the_port_and_the_survivor_takes_every_new_connection():
    port = free_port()
    first = listen_socket("127.0.0.1", port, exclusive=True)
    second = listen_socket("127.0.0.1", port, exclusive=False)
    first.listen(16), second.listen(16)
    first.close()  # the first listener dies
    for _ in range(8):
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            conn, _ = second.accept()
            conn.close()
    second.close()


def test_an_exclusive_listener_refuses_a_port_that_another_instance_shares():
    port = free_port()
    other_instance = listen_socket("127.0.0.1", port, exclusive=True)
    other_instance.listen(16)
    with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{port}.*"
                                           "http_options.port"):
        listen_socket("127.0.0.1", port, exclusive=True)
    other_instance.close()


def test_a_port_held_by_an_ordinary_server_is_refused_even_when_sharing():
    port = free_port()
    with socket.socket() as plain:
        plain.bind(("127.0.0.1", port))
        plain.listen(1)
        with pytest.raises(RuntimeError, match="cannot listen"):
            listen_socket("127.0.0.1", port, exclusive=False)


def test_a_proxy_on_a_draining_node_fails_readiness_not_liveness():
    """/-/healthz is the node's readiness: 503 "node draining" once told, while the
    proxy keeps routing (a route table it holds is still used)."""
    import asyncio

    from controlplane.ingress.proxy import ProxyApp
    from controlplane.ingress.proxy_metrics import ProxyMetrics
    from controlplane.wire import HTTPLimits, RoutesUpdate

    async def get(app, path):
        sent = []

        async def send(message):
            sent.append(message)
        await app({"type": "http", "path": path}, None, send)
        return sent[0]["status"], sent[1]["body"]

    app = ProxyApp(None, ProxyMetrics(), HTTPLimits())
    app.set_routes(RoutesUpdate(num_shards=1, generation=1, routes={"/a": "a/M"}))
    assert asyncio.run(get(app, "/-/healthz")) == (200, b"success")
    app.draining = True
    assert asyncio.run(get(app, "/-/healthz")) == (503, b"node draining")
    assert asyncio.run(get(app, "/-/routes"))[0] == 200
