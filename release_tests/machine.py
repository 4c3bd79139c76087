"""What a measurement ran on, printed beside every table."""

from __future__ import annotations

import os
import platform


def describe() -> dict:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu": model, "cores": os.cpu_count(), "memory_gib": round(mem_gib, 1),
            "arch": platform.machine(), "python": platform.python_version()}


def describe_line() -> str:
    m = describe()
    return f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['arch']}, Python {m['python']}"
