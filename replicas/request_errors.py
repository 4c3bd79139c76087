"""What the user's code raised on this replica's requests: logged with its traceback
under a request id, and told to the shard (status shows the newest), at most once per
``REPORT_EVERY_S``.

The HTTP client gets only the request id (``DeploymentRaised``: the front door answers a
bare 500); an exception's text can carry secrets, so it goes to the log and to status,
where an operator looks. Errors raised between two reports are counted and carried by
the next one. No Ray here: ``send`` is the shard call the replica passes in.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from controlplane.errors import DeploymentRaised
from controlplane.wire import RequestError

logger = logging.getLogger(__name__)

REPORT_EVERY_S = 5.0


class RequestErrors:
    def __init__(self, send: Callable[[RequestError], Any],
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self._send = send
        self._clock, self._wall = clock, wall
        self._next_at = float("-inf")
        self._unsent = 0  # raised since the last report

    def raised(self, error: BaseException) -> DeploymentRaised:
        """The user's ``error`` as the front door answers it, logged and reported."""
        raised = DeploymentRaised.from_exception(error)
        logger.error("request %s: %s\n%s", raised.request_id, raised.text,
                     raised.traceback.rstrip())
        self._unsent += 1
        now = self._clock()
        if now >= self._next_at:
            self._next_at = now + REPORT_EVERY_S
            report = RequestError(raised.request_id, raised.text.splitlines()[0][:500],
                                  self._wall(), self._unsent)
            self._unsent = 0
            try:
                self._send(report)
            except Exception as e:  # the shard may be restarting: the next one tells
                logger.warning("request error not reported to the shard: %r", e)
        return raised
