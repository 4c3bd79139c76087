"""``fleetplane probe readiness --head --serve-api URL`` (a RayService's head): ready only
once a Serve controller (fleetplane's facade) answers Serve's REST API, so KubeRay's first
PUT, which waits for the head to be ready, never finds "no Serve" and starts a real one."""

from __future__ import annotations

import json
from http.server import ThreadingHTTPServer

import pytest

from fleetplane.cli_probe import check_serve_api
from tests.unit.http_fake import http_server


def _server(body: dict, status: int = 200, seen: list | None = None) -> ThreadingHTTPServer:
    def answer(request) -> tuple[int, bytes]:
        if seen is not None:
            seen.append(request.headers.get("authorization"))
        return status, json.dumps(body).encode()
    return http_server(answer)


@pytest.fixture
def serve_api():
    servers = []

    def make(body: dict, status: int = 200, seen: list | None = None) -> str:
        servers.append(_server(body, status, seen))
        return f"http://127.0.0.1:{servers[-1].server_address[1]}"
    yield make
    for server in servers:
        server.shutdown()


def test_ready_once_a_controller_answers_with_the_token(serve_api, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "t0ken")
    seen: list = []
    url = serve_api({"controller_info": {"node_id": "abc"}, "applications": {}}, seen=seen)
    assert check_serve_api(url, 2.0) == ""
    assert seen == ["Bearer t0ken"]


def test_not_ready_before_fleetplane_answers_or_when_refused(serve_api, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/nonexistent")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    empty = serve_api({"applications": {}, "proxies": {}})  # the dashboard with no Serve
    assert "no Serve controller answers yet" in check_serve_api(empty, 2.0)
    assert "answered 401" in check_serve_api(serve_api({}, status=401), 2.0)
    assert "did not answer" in check_serve_api("http://127.0.0.1:9", 1.0)
