"""Autoscaling on real replicas: load reported by the replicas scales the deployment up,
and its absence scales it back down."""

from __future__ import annotations

import threading

import pytest
import requests

from tests.integration.conftest import (BASE_URL, app, burst_at_zero, dep_status, deploy,
                                        settled, wait_for, zero_app)

pytestmark = pytest.mark.integration


def test_load_scales_up_and_idleness_scales_down(fleet):
    deploy(fleet, app("auto", "tests.integration.apps:Sleeper", deployments=[{
        "name": "Sleeper", "max_ongoing_requests": 2,
        "autoscaling_config": {"min_replicas": 1, "max_replicas": 3,
                               "target_ongoing_requests": 1, "upscale_delay_s": 0,
                               "downscale_delay_s": 1, "look_back_period_s": 2}}]))
    wait_for(fleet, settled("auto", 1, "Sleeper"), what="1 replica")
    wait_for(fleet, lambda s: requests.get(BASE_URL + "/auto?s=0", timeout=10).ok,
             what="route to the autoscaled app")

    stop = threading.Event()

    def keep_busy() -> None:  # 4 clients, each always holding a 1 s request
        while not stop.is_set():
            requests.get(BASE_URL + "/auto?s=1", timeout=30)

    clients = [threading.Thread(target=keep_busy) for _ in range(4)]
    for c in clients:
        c.start()
    try:
        status = wait_for(fleet, lambda s: dep_status(s, "auto", "Sleeper")["target_replicas"]
                          == 3, timeout_s=60, what="scale up to max_replicas")
        assert dep_status(status, "auto", "Sleeper")["autoscaling"] is True
        wait_for(fleet, settled("auto", 3, "Sleeper"), what="3 RUNNING")
    finally:
        stop.set()
        for c in clients:
            c.join()
    wait_for(fleet, settled("auto", 1, "Sleeper"), timeout_s=60, what="scale down to 1")


def test_idle_goes_to_zero_and_a_burst_at_zero_is_held_then_served(fleet):
    """min_replicas 0: idle, the deployment goes to zero after downscale_to_zero_delay_s;
    a burst then waits in the proxy (cold_start_hold_s) while the first replica starts,
    and every request of it is answered 200, none with an error."""
    deploy(fleet, zero_app("zero"))
    answers = burst_at_zero(fleet, BASE_URL + "/zero", "zero")
    assert [code for code, _ in answers] == [200] * 6, answers
    assert dep_status(fleet.status(), "zero", "Sleeper")["target_replicas"] >= 1
