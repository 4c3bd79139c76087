"""Stopped HAProxies' directories are pruned a day after their last write; a running
one's, a fresh one's and the starting manager's own are kept."""

import os
import subprocess
import sys

from controlplane.ingress.haproxy.runtime_dirs import KEEP_S, prune, runtime_dir

DAY = KEEP_S


def make(base, namespace, node, written_at, pid=None):
    directory = runtime_dir(namespace, node, base)
    directory.mkdir(parents=True)
    (directory / "haproxy.log").write_text("log")
    if pid is not None:
        (directory / "haproxy.pid").write_text(f"{pid}\n")
    for path in [*directory.iterdir(), directory]:
        os.utime(path, (written_at, written_at))
    return directory


def test_only_stopped_and_day_old_directories_are_removed_and_empty_namespaces_with_them(
        tmp_path):
    now = 10 * DAY
    old_stopped = make(tmp_path, "ns1", "aaaa", now - 2 * DAY)
    old_no_pid_file = make(tmp_path, "ns2", "bbbb", now - 2 * DAY, pid=None)
    fresh_stopped = make(tmp_path, "ns3", "cccc", now - 60)
    mine = make(tmp_path, "ns3", "dddd", now - 2 * DAY)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as live:
        try:
            running = make(tmp_path, "ns3", "eeee", now - 2 * DAY, pid=live.pid)
            removed = prune(keep=mine, base=tmp_path, now=lambda: now)
        finally:
            live.kill()
    assert sorted(removed) == sorted([old_stopped, old_no_pid_file])
    assert not (tmp_path / "ns1").exists() and not (tmp_path / "ns2").exists()
    assert fresh_stopped.exists() and mine.exists() and running.exists()


def test_a_dead_pid_is_stopped_and_other_files_in_the_base_are_left(tmp_path):
    now = 10 * DAY
    with subprocess.Popen([sys.executable, "-c", "pass"]) as gone:
        gone.wait()
    dead = make(tmp_path, "ns", "ffff", now - 2 * DAY, pid=gone.pid)
    (tmp_path / "instance.json").write_text("{}")
    other = tmp_path / "ns" / "notes"
    other.mkdir()
    assert prune(keep=tmp_path / "x", base=tmp_path, now=lambda: now) == [dead]
    assert (tmp_path / "instance.json").exists() and other.exists()


def test_a_missing_base_prunes_nothing(tmp_path):
    assert prune(keep=tmp_path / "x", base=tmp_path / "none") == []
