"""The plots of MEASURED.md (``release_tests.report``), drawn with matplotlib into PNG files.

Each function takes a results summary's data and a path, draws one figure and returns the
path (None when the data has nothing to draw). Deterministic: no timestamp in the file
(``metadata``), so the same data gives the same PNG.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no screen
import matplotlib.pyplot as plt  # noqa: E402

_META = {"Software": None}  # no matplotlib version/timestamp in the file
COLORS = {"fleetplane": "#1f77b4", "serve": "#d62728"}


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=_META)
    plt.close(fig)
    return path


def _label(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
    """Axis labels, title, grid and legend, as every x-y plot here has them."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def scale(figures: dict[str, dict[str, dict]], path: Path) -> Path | None:
    """All work per 0.1 s period and the rolling replacement's, against N, per system."""
    panels = [("period_cpu_ms", "steady: all work per 0.1 s period (CPU ms)"),
              ("replace_s", "rolling replacement of all N (s, controller time)"),
              ("cpu_us_per_start", "CPU per replica start (us, collection counted)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    drawn = False
    for ax, (key, title) in zip(axes, panels):
        for system, by_n in figures.items():
            points = sorted((int(n), r[key]) for n, r in by_n.items() if r.get(key) is not None)
            if points:
                drawn = True
                ax.plot(*zip(*points), marker="o", label=system, color=COLORS.get(system))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("replicas (N)")
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path) if drawn else None


def percentiles(series: dict[str, dict[str, float]], path: Path, ylabel: str,
                title: str) -> Path | None:
    """Latency percentiles per system: ``{system: {"p50": ms, "p90": ms, ...}}``, one line
    per system over the percentiles (log scale)."""
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for system, points in series.items():
        keys = [k for k in points if k.startswith("p") and points[k] is not None]
        qs = sorted(keys, key=lambda k: float(k[1:].replace("_", ".")))
        ax.plot(qs, [points[q] for q in qs], marker="o", label=system,
                color=COLORS.get(system.split()[0]))
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def bars(groups: dict[str, dict[str, float]], path: Path, ylabel: str,
         title: str) -> Path | None:
    """Grouped bars: ``{group: {bar: value}}`` (e.g. per policy: rejected, admitted)."""
    if not groups:
        return None
    names = list(dict.fromkeys(b for g in groups.values() for b in g))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(groups)), 3.6))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs = [j + i * width for j in range(len(groups))]
        ax.bar(xs, [g.get(name, 0) or 0 for g in groups.values()], width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], list(groups),
                  fontsize=8, rotation=15)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)


def timeline(series: dict[str, list[tuple[float, float]]], path: Path, xlabel: str,
             ylabel: str, title: str) -> Path | None:
    """Lines over time: ``{name: [(t, value), ...]}``."""
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for name, points in series.items():
        ax.plot(*zip(*points), label=name, linewidth=1.2)
    _label(ax, xlabel, ylabel, title)
    return _save(fig, path)


def scatter(series: dict[str, list[tuple[float, float]]], path: Path, xlabel: str,
            ylabel: str, title: str, hlines: dict[str, float] | None = None,
            vlines: dict[str, float] | None = None,
            notes: dict[str, list[str]] | None = None) -> Path | None:
    """Points per series (``{name: [(x, y), ...]}``), with labelled reference lines;
    with ``notes`` (a label per point, by series), each such series' points are joined in
    order and labelled: a curve along a knob."""
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name, points in series.items():
        dots = ax.scatter(*zip(*points), label=name, s=28, alpha=0.8)
        if notes and name in notes:
            ax.plot(*zip(*points), color=dots.get_facecolor()[0], linewidth=0.8, alpha=0.6)
            for (x, y), text in zip(points, notes[name]):
                ax.annotate(text, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    for label, y in (hlines or {}).items():
        ax.axhline(y, color="grey", linestyle="--", linewidth=0.8)
        ax.annotate(label, (ax.get_xlim()[0], y), fontsize=7, va="bottom")
    for label, x in (vlines or {}).items():
        ax.axvline(x, color="grey", linestyle=":", linewidth=0.8)
        ax.annotate(label, (x, ax.get_ylim()[0]), fontsize=7, rotation=90, ha="right")
    _label(ax, xlabel, ylabel, title)
    return _save(fig, path)


def cdf(series: dict[str, list[list[float]]], path: Path, xlabel: str,
        title: str) -> Path | None:
    """Latency CDFs: ``{system: [[percentile, ms], ...]}``, one line per system (log x)."""
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for system, points in series.items():
        ms = [max(m, 1e-3) for _, m in points]
        ax.plot(ms, [p for p, _ in points], marker=".", label=system,
                color=COLORS.get(system.split("-")[0]) if system in COLORS else None)
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("percentile")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def panels(panels: dict[str, dict[str, list[tuple[float, float]]]], path: Path,
           xlabel: str, marks: list[tuple[float, str]] | None = None) -> Path | None:
    """Panels stacked over one time axis: ``{panel title: {line: [(t, value), ...]}}``;
    ``marks``, (t, label) each, are drawn as dashed vertical lines on every panel (events:
    a kill, a drain), labelled on the first."""
    panels = {title: {k: v for k, v in lines.items() if v} for title, lines in panels.items()}
    panels = {title: lines for title, lines in panels.items() if lines}
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(7.5, 2.3 * len(panels)), sharex=True,
                             squeeze=False)
    for ax, (title, lines) in zip(axes[:, 0], panels.items()):
        for name, points in lines.items():
            ax.plot(*zip(*points), label=name, linewidth=1.1)
        for t, _ in marks or []:
            ax.axvline(t, color="grey", linestyle="--", linewidth=0.8, alpha=0.7)
        ax.set_title(title, fontsize=9)
        ax.grid(True, alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=7)
    top = axes[0, 0]
    for t, label in marks or []:
        top.annotate(label, (t, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                     fontsize=6, va="top", ha="right", color="dimgrey")
    axes[-1, 0].set_xlabel(xlabel)
    return _save(fig, path)
