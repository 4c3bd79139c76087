"""``fleetplane run`` after its replicas run: a supervisor that says what happens to the
control plane and never exits for it (only Ctrl-C, SIGTERM or ``fleetplane shutdown``
end it).

Every poll (2 s) it asks the controller for the status summary and says, one line each:
the controller not answering and answering again; a shard's or proxy's death and its
recovery (Ray restarts them). A joined cluster's GCS is asked first whether it takes a
connection at all: while the head node is down a GCS call would wait, so the run says once
what a silent GCS means for this cluster (``gcs.down_message``: with GCS fault tolerance
the worker nodes keep serving and the control plane comes back with the head) and waits.
When the GCS answers again the run reconnects to the cluster: its own connection went
through a raylet on its machine, which may have been the head's and died with it (a
driver left on a dead raylet never hears of the restarted controller). So does a
controller that stays silent for several polls while the GCS answers.
"""

from __future__ import annotations

from typing import Callable

from controlplane.errors import ControllerGone, NoInstance
from controlplane.gcs import down_message, unreachable

_GCS_TIMEOUT_S = 1.0  # a connection to the GCS, asked before each poll of a joined cluster
_RECONNECT_AFTER = 3  # polls in a row the controller did not answer while the GCS did


class Supervision:
    """Reads status for ``run`` (``status``) and says what happened (``say``).
    ``address``: the joined cluster's GCS (None for the embedded Ray, which lives and
    dies with this process); ``reconnect``: joins it again (required with an address);
    ``storage``: where its GCS keeps its state (``gcs.read_storage``)."""

    def __init__(self, say: Callable[[str], None], address: str | None = None,
                 storage: str = "unknown", reconnect: Callable[[], None] | None = None) -> None:
        self._say, self._address, self._storage = say, address, storage
        self._reconnect = reconnect
        self._down = self._gcs_down = False
        self._failing = 0  # polls in a row without an answer while the GCS answered
        self._gone = 0  # polls in a row that found no controller at all
        self._seen: dict[str, tuple[int, bool]] = {}

    def status(self, client) -> dict | None:
        """The summary, or None while the control plane does not answer; raises
        ControllerGone once two polls in a row found no controller (shut down, not
        restarting: Ray keeps a restarting actor's name)."""
        if self._gcs_silent():
            return None
        try:
            status = client.status(summary=True)  # every 2 s, forever: O(deployments)
            self._gone = 0
        except ControllerGone:
            self._gone += 1
            if self._gone >= 2:
                raise
            return None
        except Exception as e:  # NoInstance when restarting; anything else: say it, go on
            self._not_answering(e)
            return None
        if self._down:
            self._say("control plane: the controller answers again")
        self._down, self._failing = False, 0
        self._report_restarts(status["controller"].get("actors", {}))
        return status

    def _gcs_silent(self) -> bool:
        """True while the joined cluster's GCS takes no connection (said once); on its
        return, this process joins the cluster again."""
        if self._address is None:
            return False
        why = unreachable(self._address, _GCS_TIMEOUT_S)
        if why is not None:
            if not self._gcs_down:
                self._say(f"control plane: {down_message(self._address, why, self._storage)}"
                          "; this run keeps supervising and waits for it")
            self._gcs_down = self._down = True  # its return is said with the controller's
            return True
        if self._gcs_down:
            self._gcs_down = False
            self._say("control plane: the GCS answers again; joining the cluster again")
            self._join_again()
        return self._gcs_down  # a failed join: not connected, so nothing to ask yet

    def _not_answering(self, e: Exception) -> None:
        text = str(e) if isinstance(e, NoInstance) else f"{type(e).__name__}: {e}"
        if not self._down:
            self._say(f"control plane: {text.splitlines()[0] if text else ''}")
        self._down = True
        self._failing += 1
        if self._reconnect is not None and self._failing >= _RECONNECT_AFTER:
            self._say(f"control plane: no answer in {self._failing} polls while the GCS "
                      "answers; joining the cluster again (this machine's node may have "
                      "restarted)")
            self._join_again()

    def _join_again(self) -> None:
        self._failing = 0
        try:
            self._reconnect()
        except Exception as e:  # the head not ready yet: the next polls try again
            self._say(f"control plane: joining again failed ({type(e).__name__}: {e}); "
                      "trying again")
            self._gcs_down = True

    def _report_restarts(self, actors: dict) -> None:
        for name, actor in actors.items():
            seen = (actor["restarts"], actor["alive"])
            before = self._seen.get(name, seen)  # counts restart at 0 with the controller
            if seen[0] > before[0] or seen[1] != before[1]:
                self._say(f"control plane: {name} restarted by Ray and recovered "
                          f"({actor['restarts']} restart(s); last: "
                          f"{actor['last_restart_reason']})" if actor["alive"] else
                          f"control plane: {name} died ({actor['last_restart_reason']}); "
                          "Ray is restarting it")
            self._seen[name] = seen
