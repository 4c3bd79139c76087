"""The `fleetplane` command: run, deploy, status, shutdown (README, "Commands").

Exit codes: 0 ok; 1 the instance refused or failed (bad code, no instance, timeout, a
status filter naming no application or deployment); 2 the config file is invalid
(nothing was changed). Errors are one line each (``cli_errors``); ``--verbose``, before or
after the command, adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from controlplane.config.schema import ignored_fields, load_deploy_config
from controlplane.control_placement import CHOICES as CONTROL_CHOICES
from controlplane.errors import ControllerGone, NoInstance
from controlplane.gcs import storage_line
from controlplane.settings import Settings
from fleetplane.cli_llm import add_llm_health_parser, cmd_llm_health
from fleetplane.cli_cluster import add_cluster_parser, cmd_start_local_cluster
from fleetplane.cli_errors import EXIT_BAD_CONFIG, EXIT_OK, report
from fleetplane.cli_probe import add_probe_parser, cmd_probe
from fleetplane.cli_profile import add_profile_parser, cmd_profile
from fleetplane.cli_supervise import Supervision
from fleetplane.progress import progress_lines, render_table, total_replicas

_VERBOSE_HELP = "on an error, print the traceback too"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleetplane", description="A model-serving control "
                                "plane made of Ray actors.")
    p.add_argument("--verbose", action="store_true", help=_VERBOSE_HELP)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start an embedded local Ray (or join --address), deploy "
                         "CONFIG, show progress, serve until Ctrl-C, then stop everything")
    run.add_argument("config")
    run.add_argument("--address", help="join this Ray cluster instead of starting one")
    run.add_argument("--start-timeout-s", type=float, default=600.0,
                     help="give up if replicas are not RUNNING by then (default 600)")
    run.add_argument("--serve-api-port", type=int, default=8265,
                     help="where Ray Serve's REST API is answered (Ray's `serve deploy/"
                     "status/shutdown -a`) when the cluster has no Ray dashboard to answer "
                     "it; 8265 (default) is the dashboard's own, so `serve status` needs no "
                     "-a; 0: no listener")
    run.add_argument("--serve-api-host", default="127.0.0.1",
                     help="its address (default 127.0.0.1; another needs Ray's token auth)")
    run.add_argument("--control-plane-on", choices=CONTROL_CHOICES, default="head",
                     help="where the controller, its shards and Serve's facade run: the head "
                     "node (default: the node a fleet keeps), workers (a head restart "
                     "leaves them running), or any (Ray's choice); README: What survives what")
    deploy = sub.add_parser("deploy", help="apply CONFIG to a running instance")
    deploy.add_argument("config")
    deploy.add_argument("--wait", action="store_true", help="return once all are RUNNING")
    deploy.add_argument("--timeout-s", type=float, default=600.0)
    status = sub.add_parser("status", help="applications, deployments, replicas, controller")
    status.add_argument("--json", action="store_true",
                        help="machine-readable JSON (its fields: ARCHITECTURE.md, 'The "
                        "status JSON, field by field')")
    status.add_argument("--app", help="only this application")
    status.add_argument("--deployment", help="only deployments of this name")
    status.add_argument("--summary", action="store_true",
                        help="replica counts by state instead of one row per replica")
    sub.add_parser("shutdown", help="drain and stop every replica and the controller")
    for sp in (deploy, status, sub.choices["shutdown"]):
        sp.add_argument("--address", help="Ray cluster address (default: the local one)")
    add_llm_health_parser(sub)
    add_probe_parser(sub)
    add_profile_parser(sub)
    add_cluster_parser(sub)
    k8s = sub.add_parser("k8s", help="Kubernetes manifests").add_subparsers(
        dest="k8s_command", required=True)
    render = k8s.add_parser("render", help="print a KubeRay RayCluster (ray.io/v1), its "
                            "config and a Service for CONFIG, with probes and drain hooks "
                            "(--rayservice: a RayService)")
    render.add_argument("config")
    render.add_argument("--name", default="fleetplane", help="the RayCluster's name")
    render.add_argument("--image", default=None, help="the Ray image with fleetplane "
                        "installed (default: rayproject/ray:2.60.0-py311)")
    render.add_argument("--workers", type=int, default=2, help="CPU worker pods (default 2)")
    render.add_argument("--gb10-workers", type=int, default=0,
                        help="GB10 worker pods: resources {GB10: 1} and one GPU (default 0)")
    render.add_argument("--redis-address", metavar="HOST:PORT",
                        help="GCS fault tolerance: the Redis the head's GCS keeps its state "
                        "in, so the head's loss is survived (KubeRay gcsFaultToleranceOptions)")
    render.add_argument("--redis-password-secret", metavar="SECRET/KEY",
                        help="with --redis-address: the Kubernetes Secret and key holding "
                        "Redis's password (never inline)")
    render.add_argument("--rayservice", action="store_true",
                        help="a KubeRay RayService instead: serveConfigV2 holds the "
                        "applications (Serve's fields only), KubeRay applies them through "
                        "the Serve REST API fleetplane answers")
    _verbose_after(*sub.choices.values(), render)
    return p


def _verbose_after(*commands: argparse.ArgumentParser) -> None:
    """``--verbose`` after the command too. SUPPRESS: absent there, the command's parser
    leaves the value set before the command as it is."""
    for command in {id(c): c for c in commands}.values():  # aliases share a parser
        command.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                             help=_VERBOSE_HELP)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handlers = {"run": cmd_run, "deploy": cmd_deploy, "status": cmd_status,
                "shutdown": cmd_shutdown, "llm-health": cmd_llm_health, "probe": cmd_probe,
                "profile": cmd_profile,
                "start-local-cluster": cmd_start_local_cluster, "k8s": cmd_k8s}
    try:
        return handlers[args.command](args)
    except Exception as e:  # outermost: one clear line per problem, not a Ray stack
        # A refused deploy changed nothing on an instance that keeps running; an embedded
        # `run` has stopped everything it started by now, and has said so.
        refused = args.command == "deploy" or (args.command == "run" and bool(args.address))
        return report(e, sys.stderr, verbose=args.verbose, refused=refused)


def _say(start: float, text: str) -> None:
    try:
        print(f"[{time.monotonic() - start:7.2f}s] {text}", flush=True)
    except OSError:  # the terminal is gone (SIGHUP): keep stopping, silently
        pass


class _Progress:
    """Prints only the lines that changed since the last status."""

    def __init__(self, start: float) -> None:
        self._start, self._last = start, []

    def __call__(self, status: dict) -> None:
        lines = progress_lines(status)
        for line in lines:
            if line not in self._last:
                _say(self._start, line)
        self._last = lines


def cmd_run(args: argparse.Namespace) -> int:
    # Before Ray starts: a bad file costs nothing. Fields accepted from Serve configs but not
    # acted on come back as the deploy's warnings (the controller names them).
    cfg = load_deploy_config(args.config, log_ignored=False)
    from controlplane.instance_record import forget_record, resolve_target

    target = resolve_target(args.address) if args.address else None
    from controlplane.instance import Client, connect, record_instance, start_local_ray

    start = time.monotonic()
    note = None
    if target:
        connect(target)
    else:
        note = start_local_ray()
    # After ray.init, which installs a SIGTERM handler of its own that exits at once:
    # SIGTERM must drain like Ctrl-C does. SIGINT is installed too: a shell starts a
    # script's background job with SIGINT ignored, and Ctrl-C must work there as well.
    # SIGHUP (the terminal closed) stops it the same way: nothing is left behind.
    _catch_stop_signals()
    storage = record_instance()
    _say(start, f"Ray ready ({'joined ' + args.address if args.address else 'embedded, local'})")
    if target:
        _say(start, storage_line(storage))
    if note:
        _say(start, note)
    if not args.address:  # what this machine now exposes (README: "What to protect")
        from controlplane.admin_surface import auth_line, cluster_token_auth_on

        _say(start, auth_line(cluster_token_auth_on())[0])
    client = Client(Settings(serve_api_host=args.serve_api_host,
                             serve_api_port=args.serve_api_port,
                             control_plane_on=args.control_plane_on))
    deployed = False
    try:
        client.start_controller()
        result = client.deploy(cfg)
        deployed = True
        _say(start, f"deployed {len(result['deployments'])} deployment(s) on "
             f"{result['num_shards']} shard(s); waiting for replicas")
        for warning in result.get("warnings", []):
            _say(start, f"warning: {warning}")
        _say_serve_api(start, result.get("serve_api_address"))
        _serve(client, start, args.start_timeout_s, Supervision(
            lambda text: _say(start, text), target, storage,
            (lambda: _join_again(target)) if target else None))
    except KeyboardInterrupt:
        _say(start, "stopping: draining replicas")
    except ControllerGone:
        _say(start, "the instance is gone: shut down (`fleetplane shutdown`), or lost with a "
             "head node whose GCS kept no state (no fault tolerance); stopping")
    finally:
        # A joined instance that refused this config keeps running as it was.
        if deployed or not args.address:
            _stop(client, start, embedded=not args.address)
        forget_record()
    return EXIT_OK


def _say_serve_api(start: float, address: str | None) -> None:
    if address:
        _say(start, f"Ray Serve's REST API answered at {address}: Ray's `serve status/deploy/"
             f"shutdown -a {address}` work here (README: Switching from Ray Serve)")
    else:
        _say(start, "Ray Serve's REST API is not answered (`fleetplane status` says why)")


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _catch_stop_signals() -> None:
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _interrupt)


def _join_again(target: str) -> None:
    """``run``'s connection made anew (``Supervision``: after the head's GCS came back)."""
    import ray

    from controlplane.instance import connect

    ray.shutdown()
    connect(target)
    _catch_stop_signals()  # ray.init installs a SIGTERM handler of its own


def _interrupt(*_: object) -> None:
    """The first stop signal stops the run; any later one is ignored, so a second Ctrl-C
    cannot cut the drain short (nor raise in the middle of saying so)."""
    for signum in _STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    raise KeyboardInterrupt


def _serve(client, start: float, timeout_s: float, watch: Supervision) -> None:
    progress = _Progress(start)
    status = client.wait_until_running(timeout_s, progress)
    running, target = total_replicas(status)
    for app, a in status["applications"].items():
        for name, dep in a["deployments"].items():
            if dep["status"] == "DEPLOY_FAILED":
                _say(start, f"{app}/{name} DEPLOY_FAILED:\n{dep['message']}")
    if all(a["status"] == "RUNNING" for a in status["applications"].values()):
        _say(start, f"all {running}/{target} replicas RUNNING "
             f"in {time.monotonic() - start:.2f}s; Ctrl-C to stop")
    while True:  # a supervisor: a control actor's death is news, never a reason to exit
        time.sleep(2.0)
        status = watch.status(client)
        if status is not None:
            progress(status)


def _stop(client, start: float, embedded: bool) -> None:
    import ray

    for signum in _STOP_SIGNALS:  # a second signal must not cut the drain short
        signal.signal(signum, signal.SIG_IGN)
    if not ray.is_initialized():  # stopped while joining again: Ray would start its own
        _say(start, "stopped without draining: not connected to the cluster (its GCS did "
             "not answer); `fleetplane shutdown --address ...` drains it")
        return
    try:
        client.shutdown()
    except NoInstance:
        pass
    if embedded:
        ray.shutdown()
    _say(start, "stopped" + (" (Ray shut down)" if embedded else ""))


def _attach(address: str | None):
    """A client of the instance: ``address``, else the one a live ``run`` serves on.
    The target is resolved before Ray is imported (it may set Ray's auth mode)."""
    from controlplane.instance_record import resolve_target

    target = resolve_target(address)
    from controlplane.instance import Client, connect

    connect(target)
    return Client()


def cmd_deploy(args: argparse.Namespace) -> int:
    cfg = load_deploy_config(args.config, log_ignored=False)  # warnings: the deploy's
    client = _attach(args.address)
    client.controller()  # a clear NoInstance before anything else
    busy = client.deploy_in_progress()
    if busy:
        print(f"{busy} is still importing and building; this one waits its turn "
              f"(builds time out after controller_options.build_timeout_s)", flush=True)
    result = client.deploy(cfg)
    print(f"accepted: generation {result['generation']}, "
          f"{len(result['deployments'])} deployment(s)")
    for warning in result.get("warnings", []):
        print(f"warning: {warning}")
    if args.wait:
        start = time.monotonic()
        status = client.wait_until_running(args.timeout_s, _Progress(start))
        print(render_table(status))
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    client = _attach(args.address)
    status = client.status(summary=args.summary, app=args.app, deployment=args.deployment)
    print(json.dumps(status, indent=2) if args.json else render_table(status))
    return EXIT_OK


def cmd_k8s(args: argparse.Namespace) -> int:
    from fleetplane import k8s

    if args.workers < 0 or args.gb10_workers < 0:
        print("error: --workers and --gb10-workers must be 0 or more", file=sys.stderr)
        return EXIT_BAD_CONFIG
    checked = load_deploy_config(args.config, log_ignored=False)  # invalid: exit 2
    for warning in ignored_fields(checked):  # stderr: stdout is the manifest
        print(f"warning: {warning}", file=sys.stderr)
    from controlplane.config.yaml_file import read_yaml_file

    cfg = read_yaml_file(args.config)  # the user's own file, not its normalized form
    render = k8s.render_rayservice if args.rayservice else k8s.render
    try:
        if args.redis_password_secret and not args.redis_address:
            raise ValueError("--redis-password-secret needs --redis-address")
        gcs_ft = k8s.gcs_fault_tolerance(args.redis_address, args.redis_password_secret,
                                         args.name) if args.redis_address else None
        manifests = render(cfg, args.name, args.image or k8s.RAY_IMAGE, args.workers,
                           args.gb10_workers, gcs_ft)
    except ValueError as e:  # a field KubeRay's dashboard would refuse
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    print(k8s.render_yaml(manifests), end="")
    return EXIT_OK


def cmd_shutdown(args: argparse.Namespace) -> int:
    client = _attach(args.address)
    result = client.shutdown()
    print("shut down" + ("" if result["drained"] else " (some replicas did not drain in time)"))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
