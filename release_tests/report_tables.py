"""Tables for MEASURED.md (``release_tests.report``): a value as a cell, records as a
Markdown table, any summary as tables (the generic section), and where plots go."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_ROWS = 40  # a table longer than this is cut (the results file has the rest)


@dataclass(frozen=True)
class Where:
    """Where a section's plots go, and how the report links them."""

    plots: Path
    out_dir: Path

    def image(self, png: Path | None, alt: str) -> list[str]:
        return [f"![{alt}]({os.path.relpath(png, self.out_dir)})", ""] if png else []

def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)[:60]
    return "-" if value is None else str(value)


def table(rows: list[dict], keys: list[str] | None = None) -> list[str]:
    keys = keys or list(dict.fromkeys(k for r in rows for k in r
                                      if not isinstance(r[k], (list, dict))))
    if not keys:
        return []
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(fmt(r.get(k)) for k in keys) + " |" for r in rows[:MAX_ROWS]]
    if len(rows) > MAX_ROWS:
        out.append(f"\n({len(rows) - MAX_ROWS} more rows in the results file)")
    return out + [""]


def render_generic(summary: dict, where: Where, name: str) -> list[str]:
    """Each list of records as a table, each mapping of scalars as one, nested mappings as
    a table with a row per key."""
    lines: list[str] = []
    for key, value in summary.items():
        rows = _rows(value)
        if rows:
            lines += [f"**{key}**", ""] + table(rows)
    return lines


def _rows(value: Any) -> list[dict]:
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return value
    if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
        if all(isinstance(vv, dict) for v in value.values() for vv in v.values()):
            return [{"": f"{k} {kk}", **vv} for k, v in value.items() for kk, vv in v.items()]
        return [{"": k, **v} for k, v in value.items()]
    if isinstance(value, dict) and value and not any(isinstance(v, dict) for v in value.values()):
        return [value]
    return []
