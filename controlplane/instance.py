"""Driver-side access to a fleetplane instance: start or find Ray and the controller,
and call it with errors unwrapped to their own types (ConfigError, BuildError, ...).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

import ray
from ray.exceptions import RayTaskError

from controlplane.config.schema import DeployConfig, config_to_dict
from controlplane.control_placement import control_options
from controlplane.controller import Controller
from controlplane.errors import ControllerGone, ControllerUnavailable, NoInstance
from controlplane.gcs import read_storage
from controlplane.instance_record import write_record
from controlplane.priority import embedded_worker_niceness
from controlplane.settings import Settings


def start_local_ray(num_cpus: int | None = None) -> str | None:
    """An embedded single-node Ray. Ray's own processes use this node's address (Ray
    resolves 127.0.0.1 to it on purpose); what fleetplane serves binds http_options.host,
    127.0.0.1 by default. Returns a line to show when its workers' niceness was chosen
    for the control plane (``priority.embedded_worker_niceness``)."""
    note = embedded_worker_niceness(os.environ)
    # address="local": always a new Ray, never the cluster a `ray start` on this machine
    # last recorded (/tmp/ray/ray_current_cluster outlives a node ended by SIGTERM)
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
             namespace=Settings().namespace, logging_level=logging.WARNING,
             configure_logging=True)
    return note


def connect(target: str) -> None:
    """Join the cluster at ``target`` (from ``instance_record.resolve_target``, which must
    run before Ray is imported)."""
    try:
        ray.init(address=target, namespace=Settings().namespace,
                 log_to_driver=False, logging_level=logging.ERROR)
    except ConnectionError as e:
        raise NoInstance(f"no running Ray cluster found ({e}); start one with "
                         "`fleetplane run CONFIG` or pass --address") from None


_STATUS_TIMEOUT_S = 15.0  # status is cheap: longer means the controller is restarting
_RESTARTING = (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError,
               ray.exceptions.GetTimeoutError)


def record_instance() -> str:
    """Called by ``run`` once Ray is up: other commands attach to this cluster. Returns
    where its GCS keeps its state (``gcs.read_storage``), recorded with it."""
    storage = read_storage()
    write_record(ray.get_runtime_context().gcs_address, os.environ.get("RAY_AUTH_MODE"),
                 storage)
    return storage


def _unwrap(call: Callable[[], Any]) -> Any:
    """The controller's answer, or its error as our own type: the user's exception out of
    a RayTaskError, and ``ControllerUnavailable`` while Ray restarts a control actor."""
    try:
        return call()
    except RayTaskError as e:
        error = e.cause if isinstance(e.cause, Exception) else e
    except _RESTARTING as e:
        error = e
    if isinstance(error, _RESTARTING):
        raise ControllerUnavailable(
            f"the control plane is not answering ({type(error).__name__}); Ray restarts "
            "its actors within seconds: try again") from None
    raise error from None


class Client:
    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()

    def start_controller(self) -> Any:
        s = self.settings
        handle = ray.remote(Controller).options(
            name=s.controller_name, namespace=s.namespace, lifetime="detached", num_cpus=0,
            get_if_exists=True, max_concurrency=1000, max_restarts=-1,
            **control_options(s.control_plane_on)).remote(s.to_dict())
        ray.get(handle.ready.remote())
        return handle

    def controller(self) -> Any:
        try:
            return ray.get_actor(self.settings.controller_name, namespace=self.settings.namespace)
        except ValueError:
            raise ControllerGone("Ray is running but no fleetplane controller is; deploy "
                                 "with `fleetplane run CONFIG`") from None

    def deploy(self, cfg: DeployConfig) -> dict:
        controller = self.controller()
        return _unwrap(lambda: ray.get(controller.deploy.remote(config_to_dict(cfg))))

    def deploy_in_progress(self) -> str:
        """What a running deploy is doing ("" when none): a new one would wait for it."""
        controller = self.controller()
        return _unwrap(lambda: ray.get(controller.deploy_in_progress.remote(),
                                       timeout=_STATUS_TIMEOUT_S))

    def status(self, summary: bool = False, app: str | None = None,
               deployment: str | None = None) -> dict:
        """``fleetplane status``; ``summary``: replica counts, no rows (cheap: for polls);
        ``app``/``deployment``: only those (``UnknownName`` when unknown)."""
        controller = self.controller()
        return _unwrap(lambda: ray.get(
            controller.status.remote(summary=summary, app=app, deployment=deployment),
            timeout=_STATUS_TIMEOUT_S))

    def shutdown(self, timeout_s: float = 60.0) -> dict:
        controller = self.controller()
        try:  # bounded: a Ray that is itself going down must not hang the exit
            result = _unwrap(lambda: ray.get(controller.shutdown.remote(timeout_s),
                                             timeout=timeout_s + 30))
        except ray.exceptions.GetTimeoutError:
            result = {"drained": False}
        ray.kill(controller, no_restart=True)
        return result

    def wait_until_running(self, timeout_s: float, on_status: Callable[[dict], None],
                           poll_s: float = 0.25) -> dict:
        """Poll the status summary until every application is RUNNING (or one
        DEPLOY_FAILED); ``on_status`` sees each summary (counts, no replica rows)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                status = self.status(summary=True)
            except ControllerUnavailable:  # Ray is restarting it: keep waiting
                time.sleep(poll_s)
                continue
            on_status(status)
            states = [a["status"] for a in status["applications"].values()]
            if states and (all(s == "RUNNING" for s in states) or "DEPLOY_FAILED" in states):
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"applications not RUNNING after {timeout_s:.0f}s")
            time.sleep(poll_s)
