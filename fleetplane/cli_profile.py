"""``fleetplane profile``: a py-spy flame graph of one control actor, and its top frames.

``fleetplane profile [--shard I | --controller | --proxy NODE] [--duration-s S] [-o FILE]
[--rate HZ]`` finds the chosen actor's process (pid, node) by its name in fleetplane's
namespace, checks that it runs on this machine, and samples it with py-spy twice over the
same window: a flame graph (SVG) to FILE, and collapsed stacks to a temporary file whose
leaf frames give the top frames by self time (printed, with their share of the samples).

- The lookup reads the GCS's actor table, not ``ray.util.state.list_actors``: the state
  API is served by the dashboard, which the embedded Ray of ``fleetplane run`` does not
  start (with no dashboard it falls back to 127.0.0.1:8265, where another Ray's dashboard
  would answer for the wrong cluster). ``release_tests.chaos`` and the replica client read
  the same table for the same reason.
- "This machine": py-spy reads the process's memory, so it must run beside it. A node
  whose address is a loopback one (127.x: the raylets of ``start-local-cluster``) or one
  this machine can bind is local.
- Both samplers run ``--nonblocking``: the actor is not paused at each sample, so the
  profile does not slow the ticks it measures, and the two do not contend for ptrace.

Exit codes: 0 written; 1 no such actor, on another machine, py-spy missing, refused
(permission) or failed; 2 bad arguments. The actor lookup, the py-spy runner and the local
address check are passed in (``profile``), so tests need neither Ray nor py-spy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Protocol

from controlplane.ingress.listener import LISTENER_PREFIX
from controlplane.settings import Settings, shard_actor_name

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
TOP_FRAMES = 15
PROXY_PREFIX = LISTENER_PREFIX  # a listener actor's name: controlplane.ingress.listener
REPLICA_PREFIX = "fleetplane_replica::"  # controlplane.replica_client.replica_actor_name
PERMISSION_HINT = (
    "py-spy may not read process {pid} (permission denied): it needs ptrace. In a container "
    "add the SYS_PTRACE capability (`docker run --cap-add SYS_PTRACE ...`; Kubernetes: "
    "securityContext.capabilities.add: [SYS_PTRACE]); otherwise run as root (sudo), or let "
    "your user trace its own processes with `sysctl kernel.yama.ptrace_scope=0`")
NO_SAMPLES = ("no samples: the actor's threads were idle the whole time (py-spy leaves idle "
              "threads out); profile longer (--duration-s) or under load")


class ProfileError(Exception):
    """What stops a profile: one line for the user, exit 1."""


@dataclass(frozen=True)
class Target:
    kind: str  # "shard", "controller" or "proxy"
    shard: int = 0
    node: str = ""  # --proxy: a node id (or its first characters) or the node's address

    def label(self) -> str:
        """Names the default output file: ``shard0``, ``controller``, ``proxy-<node>``."""
        return {"shard": f"shard{self.shard}", "controller": "controller"}.get(
            self.kind, f"proxy-{self.node[:12]}")


@dataclass(frozen=True)
class ActorProcess:
    name: str
    state: str  # the GCS's word: ALIVE, RESTARTING, DEAD, ...
    pid: int
    node_id: str
    node_ip: str


class ActorLookup(Protocol):
    def names(self) -> list[str]:
        """The named actors of fleetplane's namespace."""

    def locate(self, name: str) -> ActorProcess | None:
        """The actor's process, or None when no actor has that name."""


@dataclass(frozen=True)
class SpyResult:
    returncode: int
    output: str  # py-spy's stdout and stderr together


SpyRunner = Callable[[list[list[str]]], list[SpyResult]]  # runs the commands at once


def add_profile_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("profile", help="py-spy a control actor on this machine: write a "
                       "flame graph (SVG) and print the top frames by self time")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--shard", type=int, metavar="I", help="controller shard I")
    which.add_argument("--controller", action="store_true", help="the controller")
    which.add_argument("--proxy", metavar="NODE", help="the proxy (listener 0) of NODE: a "
                       "node id, its first characters as `status` shows them, or its address")
    p.add_argument("--duration-s", type=int, default=10, help="seconds to sample (default 10)")
    p.add_argument("-o", "--output", metavar="FILE", help="the SVG to write (default "
                   "profile-<target>-<time>.svg in the current directory)")
    p.add_argument("--rate", type=int, default=100, metavar="HZ",
                   help="samples per second (default 100)")
    p.add_argument("--address", help="Ray cluster address (default: the local one)")
    return p


def target_of(args: argparse.Namespace) -> Target:
    if args.controller:
        return Target("controller")
    if args.proxy is not None:
        return Target("proxy", node=args.proxy)
    return Target("shard", shard=args.shard)


def usage_error(args: argparse.Namespace) -> str:
    """"" when the arguments are usable, else what is wrong with them."""
    if args.shard is not None and args.shard < 0:
        return "--shard must be 0 or more"
    if args.proxy is not None and not args.proxy.strip():
        return "--proxy needs a node id or address"
    if args.duration_s < 1 or args.rate < 1:
        return "--duration-s and --rate must be at least 1"
    return ""


def default_output(target: Target, now_s: float) -> str:
    return f"profile-{target.label()}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now_s))}.svg"


def actor_name(target: Target, settings: Settings) -> str:
    """The actor a shard or controller target names (a proxy's depends on its node)."""
    if target.kind == "controller":
        return settings.controller_name
    return shard_actor_name(target.shard)


def find_actor(target: Target, lookup: ActorLookup, settings: Settings) -> ActorProcess:
    """The target's process, ALIVE; else a ProfileError naming it and what exists."""
    name = (choose_proxy(target.node, lookup) if target.kind == "proxy"
            else actor_name(target, settings))
    found = lookup.locate(name)
    if found is None:
        raise ProfileError(f"no actor {name!r} in namespace {settings.namespace!r}; "
                           f"{existing(lookup.names())}")
    if found.state != "ALIVE" or found.pid <= 0:
        raise ProfileError(f"{name} is {found.state}, not ALIVE: Ray is restarting it or it "
                           "is gone; try again in a few seconds")
    return found


def existing(names: list[str]) -> str:
    """The control actors there are (replicas left out: there may be thousands)."""
    control = sorted(n for n in names if not n.startswith(REPLICA_PREFIX))
    if not control:
        return "no fleetplane actors are running (start one with `fleetplane run CONFIG`)"
    return f"there are: {', '.join(control)}"


def choose_proxy(node: str, lookup: ActorLookup) -> str:
    """The name of ``node``'s listener 0: by node id or its prefix, else by address."""
    firsts = sorted(n for n in lookup.names() if n.startswith(PROXY_PREFIX) and
                    n.endswith("::0"))
    by_id = [n for n in firsts if n[len(PROXY_PREFIX):].startswith(node)]
    if not by_id:
        by_id = [n for n in firsts if (p := lookup.locate(n)) is not None and p.node_ip == node]
    if len(by_id) == 1:
        return by_id[0]
    nodes = ", ".join(n[len(PROXY_PREFIX):-3] for n in firsts) or "none"
    what = "several nodes match" if by_id else "no proxy runs on a node matching"
    raise ProfileError(f"{what} --proxy {node!r}; nodes with a proxy: {nodes}")


def spy_commands(py_spy: str, pid: int, duration_s: int, rate_hz: int, svg: str,
                 collapsed: str) -> list[list[str]]:
    """The flame graph and the collapsed stacks (by function, for the self-time table)."""
    common = [py_spy, "record", "--pid", str(pid), "--duration", str(duration_s),
              "--rate", str(rate_hz), "--nonblocking"]
    return [[*common, "--format", "flamegraph", "-o", svg],
            [*common, "--format", "raw", "--function", "-o", collapsed]]


def spy_failure(results: list[SpyResult], pid: int) -> str:
    """"" when every run succeeded, else one line: the permission fix, or py-spy's error."""
    failed = [r for r in results if r.returncode != 0]
    if not failed:
        return ""
    text = "\n".join(r.output for r in failed)
    if "permission denied" in text.lower() or "operation not permitted" in text.lower():
        return PERMISSION_HINT.format(pid=pid)
    if "no stack counts found" in text.lower():  # py-spy's flame graph of zero samples
        return NO_SAMPLES
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = next((ln for ln in lines if ln.startswith("Error")), lines[0] if lines else "")
    return f"py-spy failed on process {pid} (exit {failed[0].returncode}): {first}"


def top_frames(collapsed: str, n: int = TOP_FRAMES) -> tuple[list[tuple[str, int]], int]:
    """The ``n`` leaf frames with the most samples, and the number of samples.

    ``collapsed`` is py-spy's raw format (Brendan Gregg's collapsed stacks): one stack a
    line, ``root;...;leaf COUNT``. A stack's leaf is where its samples were spent: the
    leaf's own (self) time."""
    self_samples: Counter[str] = Counter()
    for line in collapsed.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if stack and count.isdigit():
            self_samples[stack.rsplit(";", 1)[-1]] += int(count)
    return self_samples.most_common(n), sum(self_samples.values())


def render_top(frames: list[tuple[str, int]], total: int) -> str:
    if not total:
        return NO_SAMPLES
    lines = [f"top {len(frames)} frames by self time ({total} samples):",
             f"{'self %':>7} {'samples':>8}  frame"]
    lines += [f"{100.0 * c / total:6.1f}% {c:8d}  {frame}" for frame, c in frames]
    return "\n".join(lines)


def profile(target: Target, svg: str, duration_s: int, rate_hz: int, *, lookup: ActorLookup,
            run_spy: SpyRunner, is_local: Callable[[str], bool], py_spy: str,
            settings: Settings, say: Callable[[str], None] = lambda line: None) -> str:
    """Find, check, sample (``say`` is told what, before the wait); the report to print.
    Raises ProfileError with the reason."""
    actor = find_actor(target, lookup, settings)
    if not is_local(actor.node_ip):
        raise ProfileError(
            f"{actor.name} (pid {actor.pid}) runs on node {actor.node_id[:12]} at "
            f"{actor.node_ip}, not on this machine: run `fleetplane profile` on that node "
            "(py-spy reads the process's memory, so it must run beside it)")
    say(f"sampling {actor.name}: pid {actor.pid} on node {actor.node_id[:12]} "
        f"({actor.node_ip}), {duration_s}s at {rate_hz} Hz ...")
    with tempfile.TemporaryDirectory(prefix="fleetplane-profile-") as tmp:
        collapsed = os.path.join(tmp, "stacks.txt")
        results = run_spy(spy_commands(py_spy, actor.pid, duration_s, rate_hz, svg, collapsed))
        failure = spy_failure(results, actor.pid)
        if failure:
            raise ProfileError(failure)
        with open(collapsed) as f:
            frames, total = top_frames(f.read())
    return f"flame graph: {svg}\n{render_top(frames, total)}"


def cmd_profile(args: argparse.Namespace) -> int:
    problem = usage_error(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    target = target_of(args)
    svg = os.path.abspath(args.output or default_output(target, time.time()))
    try:
        py_spy = find_py_spy()
        _connect(args.address)  # NoInstance: cli.main says it and exits 1
        print(profile(target, svg, args.duration_s, args.rate, lookup=GcsActorLookup(),
                      run_spy=run_concurrently, is_local=is_local_address, py_spy=py_spy,
                      settings=Settings(), say=lambda line: print(line, flush=True)))
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


# --- the shell: Ray, processes and sockets ---------------------------------------------


def _connect(address: str | None) -> None:
    """As ``status`` attaches: the target is resolved before Ray is imported."""
    from controlplane.instance_record import resolve_target

    target = resolve_target(address)
    from controlplane.instance import connect

    connect(target)


def find_py_spy() -> str:
    """py-spy beside this Python (a virtualenv's bin/ need not be on PATH), else on PATH."""
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    found = shutil.which("py-spy", path=path)
    if found is None:
        raise ProfileError("py-spy is not installed here: `pip install py-spy` "
                           "(a dependency of fleetplane)")
    return found


class GcsActorLookup:
    """Named actors and their processes from the GCS (the driver's own cluster)."""

    def __init__(self, namespace: str | None = None) -> None:
        self._namespace = namespace or Settings().namespace

    def names(self) -> list[str]:
        import ray

        return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == self._namespace]

    def locate(self, name: str) -> ActorProcess | None:
        import ray
        from ray._private import state

        try:
            handle = ray.get_actor(name, namespace=self._namespace)
        except ValueError:
            return None
        a = state.actors(handle._actor_id.hex())
        return ActorProcess(name=name, state=a["State"], pid=a["Pid"],
                            node_id=a["Address"]["NodeID"], node_ip=a["Address"]["IPAddress"])


def run_concurrently(commands: list[list[str]]) -> list[SpyResult]:
    """Runs the commands side by side and waits for all (each gets its sampling time and
    30 s more to attach and write)."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for c in commands]
    results = []
    for proc, command in zip(procs, commands):
        duration_s = int(command[command.index("--duration") + 1])
        try:
            out, _ = proc.communicate(timeout=duration_s + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            out += f"\nError: py-spy did not finish within {duration_s + 30}s"
        results.append(SpyResult(proc.returncode, out))
    return results


def is_local_address(ip: str) -> bool:
    """Whether ``ip`` is this machine's: any loopback address (Linux answers all of
    127.0.0.0/8), or one a socket can bind here."""
    if ip.startswith("127.") or ip == "::1":
        return True
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False
