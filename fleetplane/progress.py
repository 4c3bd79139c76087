"""Human-readable rendering of status: live progress lines and the `status` table.

Renders both entry shapes: a summary entry (``replica_counts``, no ``replicas``) and a
full one (counted from its replica rows when it has no counts).
"""

from __future__ import annotations

from collections import Counter

from controlplane.gcs import FAULT_TOLERANT


def replica_counts(dep: dict) -> dict[str, int]:
    """Replicas by state: the entry's own counts, else counted from its rows."""
    if "replica_counts" in dep:
        return dep["replica_counts"]
    return Counter(r["state"] for r in dep["replicas"])


def deployment_summary(name: str, dep: dict) -> str:
    counts = {state: n for state, n in replica_counts(dep).items() if n}
    running = counts.pop("RUNNING", 0)
    rest = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    line = f"{name}: {dep['status']} {running}/{dep['target_replicas']} RUNNING"
    return f"{line} ({rest})" if rest else line


def progress_lines(status: dict) -> list[str]:
    lines = []
    for app, a in status["applications"].items():
        for dep_name, dep in a["deployments"].items():
            lines.append(f"{app}/{deployment_summary(dep_name, dep)}")
    return lines


def total_replicas(status: dict) -> tuple[int, int]:
    """(running, target) over all deployments."""
    running = target = 0
    for a in status["applications"].values():
        for dep in a["deployments"].values():
            target += dep["target_replicas"]
            running += replica_counts(dep).get("RUNNING", 0)
    return running, target


def render_table(status: dict) -> str:
    out = []
    for app, a in status["applications"].items():
        out.append(f"application {app}  {a['status']}  route_prefix={a.get('route_prefix')}")
        for dep_name, dep in a["deployments"].items():
            out.append(f"  {deployment_summary(dep_name, dep)}")
            if dep.get("message"):
                out.extend(f"    | {line}" for line in dep["message"].splitlines()[-12:])
            if dep.get("request_errors"):
                out.append(f"    {_request_errors(dep['request_errors'])}")
            out.extend(_replica_lines(dep))
    if not status["applications"]:
        out.append("no applications")
    c = status["controller"]
    storage = c.get("gcs_storage", "unknown")
    out.append(f"controller: {c['num_shards']} shard(s), generation {c['generation']}"
               + ("" if storage == "unknown" else ", GCS fault tolerance " + (
                   f"on ({storage})" if storage in FAULT_TOLERANT else "off")))
    if status.get("serve_api_address"):
        out.append(f"Ray Serve's REST API: {status['serve_api_address']}")
    elif status.get("serve_api_error"):
        out.append(f"Ray Serve's REST API: not answered: {status['serve_api_error']}")
    return "\n".join(out)


def _replica_lines(dep: dict) -> list[str]:
    """One line per replica; a summary entry's one line of health instead."""
    if "replicas" not in dep:
        counts = dep["replica_counts"]
        serving = counts.get("RUNNING", 0) + counts.get("UPDATING", 0)
        return [f"    {dep['healthy_replicas']}/{serving} serving replicas healthy"]
    lines = []
    for r in dep["replicas"]:
        node = (r["node_id"] or "-")[:12]
        health = "healthy" if r["healthy"] else "not healthy"
        lines.append(f"    {r['replica_id']:<40} {r['state']:<9} rank={r['rank']}"
                     f"  {health:<11} node={node}")
    return lines


def _request_errors(errors: dict) -> str:
    last = errors["last"]
    return (f"requests raised: {errors['total']}; the newest on {last['replica_id']} "
            f"(request id {last['request_id']}, in that replica's log): {last['error']}")
