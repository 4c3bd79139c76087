"""A worker's probes while the head node's GCS does not answer (issue 32).

Ray's agent then answers ``/api/local_raylet_healthz`` "success" (a silent GCS is not the
raylet's failure), but only once its own GCS call has failed: about 1 s, measured on a
3-node cluster with the head's Ray processes killed. A probe that gave up sooner failed
every worker through a head restart, and Kubernetes (readiness failureThreshold 1) would
have taken every worker out of its Service while their listeners served.
"""

from __future__ import annotations

import argparse
import time
from http.server import ThreadingHTTPServer

import pytest

from fleetplane.cli_probe import EXIT_NOT, EXIT_OK, add_probe_parser, cmd_probe
from tests.unit.http_fake import http_server

AGENT_ANSWERS_AFTER_S = 0.8  # past the listener's 0.4 s wait, as Ray's agent then is


def _server(delay_s: float) -> ThreadingHTTPServer:
    def answer(request) -> tuple[int, bytes]:
        time.sleep(delay_s)  # the agent's GCS call failing (a socket wait: no fake clock)
        return 200, b"success"
    return http_server(answer)


@pytest.fixture
def node():
    agent, listener = _server(AGENT_ANSWERS_AFTER_S), _server(0.0)
    yield agent.server_address[1], listener.server_address[1]
    agent.shutdown()
    listener.shutdown()


def probe(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_probe_parser(parser.add_subparsers(dest="command"))
    return cmd_probe(parser.parse_args(["probe", *argv]))


@pytest.mark.parametrize("kind", ["liveness", "readiness"])
def test_a_worker_stays_alive_and_ready_while_the_agent_waits_on_a_silent_gcs(node, kind):
    agent_port, listener_port = node
    assert probe(kind, "--agent-port", str(agent_port), "--port", str(listener_port)) == EXIT_OK


def test_a_raylet_that_does_not_answer_in_its_wait_still_fails_the_probe(node, capsys):
    agent_port, listener_port = node
    assert probe("liveness", "--agent-port", str(agent_port),
                 "--raylet-timeout-s", "0.2") == EXIT_NOT
    assert "not alive: raylet:" in capsys.readouterr().out
