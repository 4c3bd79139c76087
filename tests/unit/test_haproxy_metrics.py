"""haproxy mode's /metrics: HAProxy's exporter (read on its unix socket) and fleetplane's
figures in one exposition; a part that cannot be read is left out, never the scrape."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from controlplane.ingress.haproxy.membership import backend_name
from controlplane.ingress.haproxy.metrics import IngressMetrics

EXPORTER = b"# TYPE haproxy_process_uptime_seconds gauge\nhaproxy_process_uptime_seconds 42\n"


async def _exporter(path) -> asyncio.AbstractServer:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                     + str(len(EXPORTER)).encode() + b"\r\nConnection: close\r\n\r\n" + EXPORTER)
        await writer.drain()
        writer.close()
    return await asyncio.start_unix_server(answer, path=str(path))


def samples(text: bytes) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text.decode())}


async def health() -> dict:
    return {"pushes_total": 7, "self_check_interval_s": {"0.5": 1.0}}


def test_haproxys_exposition_then_fleetplanes(tmp_path):
    async def main() -> bytes:
        server = await _exporter(tmp_path / "exporter.sock")
        async with server:
            metrics = IngressMetrics(tmp_path / "exporter.sock", health,
                                     lambda: {"/greet": "greeter/Greeter"})
            return await metrics.render()

    found = samples(asyncio.run(main()))
    assert found["haproxy_process_uptime_seconds"][0].value == 42
    [info] = found["fleetplane_haproxy_backend_info"]
    assert info.labels == {"backend": backend_name("greeter/Greeter"),
                           "deployment": "greeter/Greeter", "route": "/greet"}
    assert found["fleetplane_health_pushes"][0].value == 7


def test_without_the_exporter_or_the_controller_fleetplanes_part_still_renders(tmp_path):
    async def unreachable() -> dict:
        raise ConnectionError("the controller is restarting")

    metrics = IngressMetrics(tmp_path / "absent.sock", unreachable, lambda: None)
    found = samples(asyncio.run(metrics.render()))
    assert "haproxy_process_uptime_seconds" not in found
    assert found["fleetplane_haproxy_backend_info"] == []
