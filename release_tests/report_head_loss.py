"""MEASURED.md's sections for ``release_tests.head_loss``: what the issue's bars ask (0
failed through the worker nodes' listeners, no replica restarted, HEALTHY with the same
replicas within 60 s of the head's return, reconcile acting again), then the requests
each listener saw per phase, and where the control actors ran."""

from __future__ import annotations

from release_tests.report_tables import Where, table

HEAD = "127.0.0.2"


def render_head_loss(summary: dict, where: Where, name: str) -> list[str]:
    recovered = summary.get("recovered_s")
    restarted = summary.get("restarted") or []
    rows = [
        {"bar": "failed through the worker nodes' listeners (head down, head back)",
         "measured": summary.get("worker_listener_failures"),
         "met": summary.get("worker_listener_failures") == 0},
        {"bar": "replicas that lived, restarted", "measured": ", ".join(restarted) or "none",
         "met": not restarted},
        {"bar": "HEALTHY with the same replicas, seconds after the head's return (<= 60)",
         "measured": recovered, "met": recovered is not None and recovered <= 60},
        {"bar": "a worker's replica killed afterwards: replaced in seconds",
         "measured": summary.get("replaced_after_s"),
         "met": summary.get("replaced_after_s") is not None},
    ]
    lines = [f"{summary.get('mode')} mode, control plane on "
             f"{summary.get('control_plane_on', 'head')}, {summary.get('down_s'):g} s down, "
             f"{summary.get('rate'):g} requests/s per listener (GET and POST in turn).", ""]
    lines += table([{**r, "met": "yes" if r["met"] else "NO"} for r in rows])
    sent, failed = summary.get("sent", {}), summary.get("failed", {})
    lines += ["Requests per listener and phase, failed of sent (the head's own listener, "
              f"{HEAD}, dies with it; a killed replica's in-flight POSTs fail by design):", ""]
    listeners = sorted({ip for phase in sent.values() for ip in phase})
    lines += table([{"phase": phase, **{ip: f"{failed.get(phase, {}).get(ip, 0)} of "
                                        f"{sent[phase].get(ip, 0)}" for ip in listeners}}
                    for phase in sent])
    placed = summary.get("control_actors_on") or {}
    lines += ["Control actors ran on: " + "; ".join(
        f"{actor} {', '.join(nodes)}" for actor, nodes in sorted(placed.items())) + ".", ""]
    return lines
