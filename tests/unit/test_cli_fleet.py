"""The fleet commands' bad input: clear errors, exit 2, nothing started."""

from __future__ import annotations

from fleetplane.cli import main


def test_start_local_cluster_refuses_bad_arguments_before_starting_anything(capsys, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("FLEETPLANE_STATE_DIR", str(tmp_path))
    assert main(["start-local-cluster", "--nodes", "0"]) == 2
    assert "--nodes must be at least 1" in capsys.readouterr().err
    assert main(["start-local-cluster", "--nodes", "2", "--resources", "{GB10: 1}"]) == 2
    assert "must be a JSON object" in capsys.readouterr().err
    assert main(["start-local-cluster", "--nodes", "2", "--resources", "{}",
                 "--resources", "{}"]) == 2
    assert "at most one --resources" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing recorded, nothing started


def test_stop_with_nothing_started_says_so(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETPLANE_STATE_DIR", str(tmp_path))
    assert main(["start-local-cluster", "--stop"]) == 0
    assert "nothing to stop" in capsys.readouterr().out


def test_a_probe_of_nothing_listening_is_not_ready_with_the_reason(capsys):
    assert main(["probe", "liveness", "--host", "127.0.0.1", "--agent-port", "1"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("not alive: raylet:") and "did not answer" in out
