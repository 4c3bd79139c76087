"""``fleetplane profile`` without Ray or py-spy: the arguments, which actor each target
names, the self-time table from collapsed stacks, and the errors (no such actor, another
machine, no permission), through a fake actor lookup and a fake py-spy runner."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from controlplane.settings import Settings
from fleetplane.cli import main
from fleetplane.cli_profile import (
    NO_SAMPLES, ActorProcess, ProfileError, SpyResult, Target, actor_name, add_profile_parser,
    default_output, find_actor, is_local_address, profile, render_top, spy_failure,
    target_of, top_frames, usage_error)

SETTINGS = Settings()
NODE_A, NODE_B = "a1" * 28, "b2" * 28


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_profile_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["profile", *argv])


class FakeLookup:
    def __init__(self, *actors: ActorProcess, names: tuple[str, ...] = ()) -> None:
        self._actors = {a.name: a for a in actors}
        self._names = [*self._actors, *names]

    def names(self) -> list[str]:
        return list(self._names)

    def locate(self, name: str) -> ActorProcess | None:
        return self._actors.get(name)


def _alive(name: str, pid: int = 4242, node: str = NODE_A, ip: str = "127.0.0.2"):
    return ActorProcess(name=name, state="ALIVE", pid=pid, node_id=node, node_ip=ip)


class FakeSpy:
    """Records the commands; "writes" the collapsed stacks it is given."""

    def __init__(self, stacks: str = "", result: SpyResult = SpyResult(0, "")) -> None:
        self.commands: list[list[str]] = []
        self._stacks, self._result = stacks, result

    def __call__(self, commands: list[list[str]]) -> list[SpyResult]:
        self.commands = commands
        raw = commands[1]
        Path(raw[raw.index("-o") + 1]).write_text(self._stacks)
        return [self._result for _ in commands]


def _profile(target: Target, lookup: FakeLookup, spy: FakeSpy, local: bool = True,
             said: list[str] | None = None) -> str:
    return profile(target, "/tmp/out.svg", 5, 100, lookup=lookup, run_spy=spy,
                   is_local=lambda ip: local, py_spy="/bin/py-spy", settings=SETTINGS,
                   say=(said if said is not None else []).append)


# --- arguments ---------------------------------------------------------------------------


def test_each_target_parses_with_defaults():
    args = _parse("--shard", "3")
    assert target_of(args) == Target("shard", shard=3)
    assert (args.duration_s, args.rate, args.output, args.address) == (10, 100, None, None)
    assert target_of(_parse("--controller")) == Target("controller")
    assert target_of(_parse("--proxy", "a1a1")) == Target("proxy", node="a1a1")
    args = _parse("--controller", "--duration-s", "5", "-o", "x.svg", "--rate", "250")
    assert (args.duration_s, args.output, args.rate) == (5, "x.svg", 250)


@pytest.mark.parametrize("argv", [(), ("--shard", "0", "--controller"),
                                  ("--controller", "--proxy", "n")])
def test_exactly_one_target_is_required(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        _parse(*argv)
    assert exit_.value.code == 2


@pytest.mark.parametrize("argv, problem", [
    (("--shard", "-1"), "--shard must be 0 or more"),
    (("--proxy", " "), "--proxy needs a node id or address"),
    (("--controller", "--duration-s", "0"), "--duration-s and --rate must be at least 1"),
    (("--controller", "--rate", "0"), "--duration-s and --rate must be at least 1"),
])
def test_bad_values_are_refused_before_anything_starts(argv, problem, capsys):
    assert usage_error(_parse(*argv)) == problem
    assert main(["profile", *argv]) == 2
    assert capsys.readouterr().err == f"error: {problem}\n"


def test_default_output_names_the_target_and_the_time():
    from time import mktime
    now_s = mktime((2026, 12, 1, 10, 15, 30, 0, 0, -1))
    assert default_output(Target("shard", shard=0), now_s) == "profile-shard0-20261201-101530.svg"
    assert default_output(Target("controller"), now_s).startswith("profile-controller-2026")
    assert default_output(Target("proxy", node=NODE_A), now_s).startswith(
        f"profile-proxy-{NODE_A[:12]}-")


# --- which actor -------------------------------------------------------------------------


def test_shard_and_controller_name_their_actors():
    assert actor_name(Target("shard", shard=2), SETTINGS) == "fleetplane_shard_2"
    assert actor_name(Target("controller"), SETTINGS) == SETTINGS.controller_name


def test_a_proxy_is_found_by_node_id_prefix_or_address_listener_zero():
    p_a = _alive(f"fleetplane_proxy::{NODE_A}::0", node=NODE_A, ip="127.0.0.2")
    p_b = _alive(f"fleetplane_proxy::{NODE_B}::0", node=NODE_B, ip="127.0.0.3")
    lookup = FakeLookup(p_a, p_b, names=(f"fleetplane_proxy::{NODE_A}::1",))
    assert find_actor(Target("proxy", node=NODE_A[:12]), lookup, SETTINGS) == p_a
    assert find_actor(Target("proxy", node=NODE_B), lookup, SETTINGS) == p_b
    assert find_actor(Target("proxy", node="127.0.0.3"), lookup, SETTINGS) == p_b


def test_a_proxy_that_matches_no_node_or_several_lists_the_nodes():
    lookup = FakeLookup(_alive(f"fleetplane_proxy::{NODE_A}::0"),
                        _alive(f"fleetplane_proxy::{NODE_A[:2]}ff::0"))
    with pytest.raises(ProfileError, match="no proxy runs on a node matching --proxy 'zz'; "
                       f"nodes with a proxy: {NODE_A}, {NODE_A[:2]}ff"):
        find_actor(Target("proxy", node="zz"), lookup, SETTINGS)
    with pytest.raises(ProfileError, match="several nodes match --proxy 'a1'"):
        find_actor(Target("proxy", node="a1"), lookup, SETTINGS)


def test_a_missing_actor_is_named_with_the_control_actors_that_exist():
    lookup = FakeLookup(_alive("fleetplane_controller"), _alive("fleetplane_shard_0"),
                        names=("fleetplane_replica::app#d#x1",))
    with pytest.raises(ProfileError) as e:
        find_actor(Target("shard", shard=3), lookup, SETTINGS)
    assert str(e.value) == ("no actor 'fleetplane_shard_3' in namespace 'fleetplane'; there "
                            "are: fleetplane_controller, fleetplane_shard_0")
    with pytest.raises(ProfileError, match="no fleetplane actors are running"):
        find_actor(Target("controller"), FakeLookup(), SETTINGS)


def test_an_actor_that_is_not_alive_is_not_profiled():
    lookup = FakeLookup(ActorProcess("fleetplane_shard_0", "RESTARTING", 0, NODE_A, "127.0.0.2"))
    with pytest.raises(ProfileError, match="fleetplane_shard_0 is RESTARTING, not ALIVE"):
        find_actor(Target("shard", shard=0), lookup, SETTINGS)


# --- the profile -------------------------------------------------------------------------

STACKS = """\
<module> (ray/_private/workers/default_worker.py:1);main_loop (ray/_raylet.pyx:10) 7
run (asyncio/base_events.py:600);_run_once (asyncio/base_events.py:1900);tick (controlplane/shard.py:120);pop_due (controlplane/health/deadline_wheel.py:40) 30
run (asyncio/base_events.py:600);_run_once (asyncio/base_events.py:1900);tick (controlplane/shard.py:120) 10
run (asyncio/base_events.py:600);ingest (controlplane/shard.py:200);pop_due (controlplane/health/deadline_wheel.py:40) 3
"""


def test_top_frames_add_up_each_leafs_self_samples():
    frames, total = top_frames(STACKS)
    assert total == 50
    assert frames == [("pop_due (controlplane/health/deadline_wheel.py:40)", 33),
                      ("tick (controlplane/shard.py:120)", 10),
                      ("main_loop (ray/_raylet.pyx:10)", 7)]
    assert top_frames(STACKS, n=1)[0] == frames[:1]
    assert top_frames("\n\nnot a stack line\n") == ([], 0)


def test_the_table_shows_each_frames_share_of_all_samples():
    table = render_top(*top_frames(STACKS)).splitlines()
    assert table[0] == "top 3 frames by self time (50 samples):"
    assert table[2] == "  66.0%       33  pop_due (controlplane/health/deadline_wheel.py:40)"
    assert table[4] == "  14.0%        7  main_loop (ray/_raylet.pyx:10)"


def test_a_local_actor_is_sampled_twice_at_once_and_reported():
    spy, said = FakeSpy(STACKS), []
    report = _profile(Target("shard", shard=0), FakeLookup(_alive("fleetplane_shard_0")), spy,
                      said=said)
    assert said == [f"sampling fleetplane_shard_0: pid 4242 on node {NODE_A[:12]} (127.0.0.2), "
                    "5s at 100 Hz ..."]
    svg, raw = spy.commands
    common = ["/bin/py-spy", "record", "--pid", "4242", "--duration", "5", "--rate", "100",
              "--nonblocking"]
    assert svg == [*common, "--format", "flamegraph", "-o", "/tmp/out.svg"]
    assert raw[:-1] == [*common, "--format", "raw", "--function", "-o"]
    assert not Path(raw[-1]).exists()  # the temporary stacks are removed
    assert report.splitlines()[:2] == [
        "flame graph: /tmp/out.svg", "top 3 frames by self time (50 samples):"]


def test_an_actor_on_another_machine_is_not_sampled():
    spy, said = FakeSpy(), []
    lookup = FakeLookup(_alive("fleetplane_controller", node=NODE_B, ip="10.0.0.7"))
    with pytest.raises(ProfileError) as e:
        _profile(Target("controller"), lookup, spy, local=False, said=said)
    assert str(e.value).startswith(f"fleetplane_controller (pid 4242) runs on node "
                                   f"{NODE_B[:12]} at 10.0.0.7, not on this machine")
    assert spy.commands == [] and said == []


PERMISSION_DENIED = """\
Permission Denied: Try running again with elevated permissions by going 'sudo env "PATH=$PATH" !!'
Error: Failed to get process executable name. Check that the process is running.

Caused by:
    0: Permission denied (os error 13)
"""


def test_no_permission_says_sys_ptrace_and_how_to_fix_it():
    spy = FakeSpy(result=SpyResult(1, PERMISSION_DENIED))
    with pytest.raises(ProfileError) as e:
        _profile(Target("shard", shard=0), FakeLookup(_alive("fleetplane_shard_0")), spy)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("py-spy may not read process 4242 (permission denied)")
    for fix in ("SYS_PTRACE", "docker run --cap-add SYS_PTRACE", "root",
                "kernel.yama.ptrace_scope"):
        assert fix in message
    eperm = SpyResult(1, "Error: Operation not permitted (os error 1)")
    assert spy_failure([SpyResult(0, ""), eperm], 7).startswith("py-spy may not read process 7")


def test_another_py_spy_failure_gives_its_error_line():
    gone = SpyResult(1, "Error: Failed to get process executable name. Check that the process"
                     " is running.\n\nCaused by:\n    0: No such file or directory (os error 2)")
    assert spy_failure([gone, gone], 9) == (
        "py-spy failed on process 9 (exit 1): Error: Failed to get process executable name. "
        "Check that the process is running.")
    assert spy_failure([SpyResult(0, "ok"), SpyResult(0, "")], 9) == ""


def test_an_actor_idle_the_whole_time_says_so():
    empty = SpyResult(1, "Error: Failed to write flamegraph: No stack counts found")
    assert spy_failure([empty, SpyResult(0, "")], 9) == NO_SAMPLES
    assert render_top([], 0) == NO_SAMPLES
    assert NO_SAMPLES.startswith("no samples: the actor's threads were idle")


def test_loopback_and_bindable_addresses_are_this_machine():
    assert is_local_address("127.0.0.1") and is_local_address("127.0.0.5")
    assert not is_local_address("203.0.113.7")  # TEST-NET-3 (RFC 5737): never ours
