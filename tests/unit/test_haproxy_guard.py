"""The guard ends a node's HAProxy once the node's raylet is gone, and only then."""

from __future__ import annotations

import subprocess
import sys

from controlplane.ingress.haproxy.guard import alive, watch


def sleeper(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_the_master_is_stopped_when_the_raylet_is_gone():
    raylet, master = sleeper(0.2), sleeper(60)
    try:
        assert watch(raylet.pid, master.pid, poll_s=0.05) is True
        assert master.wait(10) == -15  # SIGTERM
    finally:
        master.kill()


def test_the_guard_leaves_when_the_master_ends_first():
    raylet, master = sleeper(60), sleeper(0.2)
    try:
        assert watch(raylet.pid, master.pid, poll_s=0.05) is False
        assert alive(raylet.pid)
    finally:
        raylet.kill()
