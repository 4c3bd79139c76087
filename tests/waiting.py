"""Waiting on a running instance's status, shared by the integration and multi-node
tests: a deadline, never a timed assertion."""

from __future__ import annotations

import time
from typing import Callable


def wait_for(client, predicate: Callable[[dict], bool], timeout_s: float = 60.0,
             what: str = "condition", poll_s: float = 0.1) -> dict:
    """Poll status until predicate(status) holds; AssertionError with the last status."""
    deadline = time.monotonic() + timeout_s
    status = client.status()
    while not predicate(status):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last status: {status}")
        time.sleep(poll_s)
        status = client.status()
    return status
