"""Which cluster the commands attach to: the one a live ``fleetplane run`` recorded, and
a clear error within seconds when nobody answers there (no Ray is started here)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from controlplane.errors import NoInstance
from controlplane.instance import _check_reachable, forget_instance, recorded_address


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETPLANE_STATE_DIR", str(tmp_path))
    return tmp_path


def write(state_dir, pid: int, address: str = "127.0.0.1:6379") -> None:
    (state_dir / "instance.json").write_text(json.dumps({"address": address, "pid": pid}))


def test_the_address_of_a_live_run_is_used(state_dir):
    write(state_dir, os.getpid(), "127.0.0.5:6380")
    assert recorded_address() == "127.0.0.5:6380"


def test_a_record_left_by_a_run_that_is_gone_is_ignored(state_dir):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    write(state_dir, int(gone))
    assert recorded_address() is None


def test_no_record_or_a_garbled_one_means_none(state_dir):
    assert recorded_address() is None
    (state_dir / "instance.json").write_text("{not json")
    assert recorded_address() is None


def test_a_run_removes_only_its_own_record(state_dir):
    write(state_dir, os.getpid() + 1)
    forget_instance()
    assert (state_dir / "instance.json").exists()
    write(state_dir, os.getpid())
    forget_instance()
    assert not (state_dir / "instance.json").exists()


def test_an_address_nobody_listens_on_is_refused_with_a_clear_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(NoInstance, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
            _check_reachable(f"127.0.0.1:{port}")


def test_a_listening_address_passes():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        _check_reachable(f"127.0.0.1:{sock.getsockname()[1]}")
