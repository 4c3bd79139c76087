"""The listener-actor contract both listeners inherit (``ingress.listener.Listener``): the
controller's watch stays pending until ``shutdown``, which stops what the listener started,
the last started first, a failing stop not keeping the others from running. No Ray."""

from __future__ import annotations

import asyncio
import logging

from controlplane.ingress.listener import LISTENER_PREFIX, Listener, proxy_actor_name


class Started(Listener):
    """A listener that started three things, one of which cannot stop cleanly."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()

        async def stop_server() -> None:
            await asyncio.sleep(0)
            log.append("server")

        def stop_broken() -> None:
            raise OSError("already gone")
        self._stops_with(lambda: log.append("subscriber"))
        self._stops_with(stop_broken)
        self._stops_with(stop_server)


def test_shutdown_ends_the_watch_and_stops_the_last_started_first(caplog):
    async def scenario() -> list[str]:
        log: list[str] = []
        listener = Started(log)
        watch = asyncio.ensure_future(listener.wait_until_stopped())
        await asyncio.sleep(0)
        assert not watch.done()  # pending while the listener serves
        with caplog.at_level(logging.ERROR, logger="controlplane.ingress.listener"):
            await listener.shutdown()
        await asyncio.wait_for(watch, 1.0)
        await listener.shutdown()  # again: nothing left to stop
        return log
    assert asyncio.run(scenario()) == ["server", "subscriber"]
    assert len(caplog.records) == 1 and "already gone" in caplog.text


def test_every_listener_is_named_under_one_prefix():
    assert proxy_actor_name("node-1", 0) == "fleetplane_proxy::node-1::0"
    assert proxy_actor_name("node-1", 1).startswith(LISTENER_PREFIX)
