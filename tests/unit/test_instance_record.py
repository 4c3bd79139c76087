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
from controlplane.instance_record import (check_reachable, forget_record, recorded_instance,
                                          resolve_target)


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETPLANE_STATE_DIR", str(tmp_path))
    return tmp_path


def write(state_dir, pid: int, address: str = "127.0.0.1:6379") -> None:
    (state_dir / "instance.json").write_text(json.dumps({"address": address, "pid": pid,
                                                         "auth_mode": "token"}))


def recorded_address() -> str | None:
    record = recorded_instance()
    return None if record is None else record["address"]


def test_the_address_of_a_live_run_is_used(state_dir):
    write(state_dir, os.getpid(), "127.0.0.5:6380")
    assert recorded_instance() == {"address": "127.0.0.5:6380", "pid": os.getpid(),
                                   "auth_mode": "token"}


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
    forget_record()
    assert (state_dir / "instance.json").exists()
    write(state_dir, os.getpid())
    forget_record()
    assert not (state_dir / "instance.json").exists()


def test_an_address_nobody_listens_on_is_refused_with_a_clear_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(NoInstance, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
            check_reachable(f"127.0.0.1:{port}")


@pytest.mark.parametrize("storage, says", [
    ("redis", "Its state is kept in redis (GCS fault tolerance): the worker nodes keep "
              "serving"),
    ("memory", "no GCS fault tolerance): a head that was lost is not coming back; after "
               "RAY_gcs_rpc_server_reconnect_timeout_s (60 s by default) Ray ends the worker "
               "nodes"),
])
def test_a_silent_gcs_is_explained_by_what_the_live_run_recorded_of_it(state_dir, storage,
                                                                       says):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        (state_dir / "instance.json").write_text(json.dumps({
            "address": address, "pid": os.getpid(), "auth_mode": "token",
            "gcs_storage": storage}))
        with pytest.raises(NoInstance) as e:
            check_reachable(address)
    assert f"the GCS at {address} does not answer" in str(e.value)
    assert "the head node is down or restarting" in str(e.value) and says in str(e.value)


def test_a_listening_address_passes():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        check_reachable(f"127.0.0.1:{sock.getsockname()[1]}")


def test_the_recorded_cluster_is_joined_with_its_auth_mode(state_dir, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "restored-after-the-test")
    monkeypatch.delenv("RAY_AUTH_MODE")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        write(state_dir, os.getpid(), address)
        assert resolve_target(None) == address
        assert os.environ["RAY_AUTH_MODE"] == "token"
        assert resolve_target(address) == address  # an explicit address wins


def test_without_a_live_run_ray_chooses(state_dir):
    assert resolve_target(None) == "auto"
