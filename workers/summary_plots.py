"""The pictures on a sweep's parent run: every trial's curve of the sweep metric, and each trial's final
value. Drawn as one collection per picture, not an artist per trial: for 200 trials the two pictures
took 215 ms of the worker's time at the end of every sweep that way, ~115 ms now (RELIABILITY.md, eighth
pass)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen
import numpy as np  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def curves_figure(curves: list[dict[int, float]], metric: str, title: str) -> Figure:
    """One line per trial (step -> value). A trial with one reported step has no line to draw: it is a dot."""
    fig, ax = plt.subplots(figsize=(8, 5))
    points = [np.array([(s, c[s]) for s in sorted(c)], dtype=float) for c in curves if c]
    lines = [p for p in points if len(p) > 1]
    if lines:
        colors = [f"C{i % 10}" for i in range(len(lines))]  # ax.plot's own colour cycle
        ax.add_collection(LineCollection(lines, colors=colors, alpha=0.6, linewidths=1))
    dots = np.array([p[0] for p in points if len(p) == 1]).reshape(-1, 2)
    if len(dots):
        ax.scatter(dots[:, 0], dots[:, 1], s=10, alpha=0.6)
    ax.autoscale_view()
    ax.set(xlabel="iteration", ylabel=metric, title=title)
    fig.tight_layout()
    return fig


def finals_figure(finals: list[float], metric: str, title: str) -> Figure:
    """A bar per trial, in trial order."""
    n = len(finals)
    fig, ax = plt.subplots(figsize=(min(24, max(6, n * 0.3)), 4))  # 200 trials: not 60 inches wide
    # Bars as one collection of thick vertical lines, each ~80% of its trial's slot. A line's width is in
    # points (72 per inch); the axes take ~80% of the figure's width.
    slot_points = fig.get_figwidth() * 0.8 * 72 / max(n, 1)
    ax.vlines(np.arange(n), 0, finals, linewidths=max(1.0, 0.8 * slot_points))
    ax.set_xlim(-0.6, n - 0.4)
    ax.set(xlabel="trial", ylabel=f"final {metric}", title=title)
    fig.tight_layout()
    return fig


def save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
