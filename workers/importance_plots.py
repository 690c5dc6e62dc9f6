"""What mattered, drawn on a sweep's parent run beside workers.summary_plots' pictures.

- `<metric>_importance.png`: each searched parameter's share of the final metric's variance (fANOVA,
  service.importance), largest on top.
- `<metric>_parallel.png`: parallel coordinates: one axis per searched parameter (most important first when
  the importances are known, else the spec's order) and the metric last; each trial a line across them,
  coloured by its final value, the best trial drawn thick. Numeric axes run from the lowest to the highest
  value the trials took (log where the space is), categorical axes one slot per value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from service.importance import final_value
from workers.summary_plots import (
    TITLE_Y,
    Searched,
    TrialResult,
    _is_number,
    _key,
    _label,
    best_index,
    save,
    searched_params,
)

if TYPE_CHECKING:
    from service.spec import SweepSpec


def importance_figure(importances: Mapping[str, float], metric: str, title: str) -> Figure:
    names = list(importances)[::-1]  # barh draws bottom-up: the largest on top
    fig = Figure(figsize=(7, 1.2 + 0.35 * len(names)))
    ax = fig.add_subplot()
    shares = [importances[n] for n in names]
    ax.barh(range(len(names)), shares, color="C0")
    ax.set_yticks(range(len(names)), [_label(n) for n in names])
    for y, v in enumerate(shares):
        ax.text(v, y, f" {v:.2f}", va="center", fontsize="small")
    ax.set_xlim(0, max(1.0, max(shares) * 1.15))
    ax.set_xlabel(f"share of the variance of final {metric} (fANOVA)")
    ax.set_title(title, y=TITLE_Y)
    fig.subplots_adjust(left=0.3, right=0.95, top=1 - 0.45 / fig.get_figheight(), bottom=0.6 / fig.get_figheight())
    return fig


def _axis(trials: Sequence[TrialResult], p: Searched) -> tuple[np.ndarray, list[tuple[float, str]]]:
    """Each trial's position on `p`'s axis in [0, 1] and the axis' ticks. A numeric parameter where a trial has
    no number (a config written by hand) is drawn as categories."""
    raw = [t.config.get(p.name) for t in trials]
    numbers = [float(v) for v in raw if _is_number(v)]
    if p.scale != "category" and len(numbers) == len(raw):
        log = p.scale == "log" and all(v > 0 for v in numbers)
        x = np.array([math.log10(v) if log else v for v in numbers])
        lo, hi = float(x.min()), float(x.max())
        pos = (x - lo) / (hi - lo) if hi > lo else np.full(len(x), 0.5)
        ticks = [(0.0, _label(10**lo if log else lo)), (1.0, _label(10**hi if log else hi))] if hi > lo else []
        return pos, ticks or [(0.5, _label(10**lo if log else lo))]
    order = {_key(v): v for v in p.values}
    for v in raw:
        order.setdefault(_key(v), v)
    slot = {k: i for i, k in enumerate(order)}
    n = max(len(order) - 1, 1)
    pos = np.array([slot[_key(v)] / n for v in raw], dtype=float)
    return pos, [(i / n, _label(v)) for i, v in enumerate(order.values())]


def parallel_figure(
    trials: Sequence[TrialResult], params: Sequence[Searched], metric: str, mode: str, title: str
) -> Figure:
    finals = np.array([t.final for t in trials], dtype=float)
    ok = np.isfinite(finals)
    columns = [_axis(trials, p) for p in params]
    lo, hi = (float(finals[ok].min()), float(finals[ok].max())) if ok.any() else (0.0, 1.0)
    metric_pos = (finals - lo) / (hi - lo) if hi > lo else np.full(len(finals), 0.5)
    columns.append((metric_pos, [(0.0, f"{lo:.4g}"), (1.0, f"{hi:.4g}")] if hi > lo else [(0.5, f"{lo:.4g}")]))
    names = [p.name for p in params] + [metric]
    fig = Figure(figsize=(max(6.0, 1.6 * len(names) + 1.5), 4.8))
    ax = fig.add_subplot()
    norm = Normalize(lo, hi if hi > lo else lo + 1)
    cmap = colormaps["viridis" if mode == "max" else "viridis_r"]
    xs = np.arange(len(names), dtype=float)
    lines = [np.column_stack([xs, [c[0][i] for c in columns]]) for i in range(len(trials)) if ok[i]]
    values = finals[ok]
    if lines:
        ax.add_collection(LineCollection(lines, colors=cmap(norm(values)), alpha=0.55, linewidths=1))
    best = best_index(trials, mode)
    if best is not None:
        ax.plot(xs, [c[0][best] for c in columns], color="crimson", lw=2.5, label=f"best: {finals[best]:.4g}")
        ax.legend(loc="upper left", bbox_to_anchor=(0, -0.12), fontsize="small", frameon=False)
    for x, (_, ticks) in zip(xs, columns, strict=True):
        ax.axvline(x, color="black", lw=0.8)
        for y, text in ticks:
            ax.text(x + 0.03, y, text, fontsize="x-small", va="center")
    ax.set_xlim(-0.2, len(names) - 0.6)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xticks(xs, [_label(n) for n in names])
    ax.set_yticks([])
    ax.set_title(title, y=TITLE_Y)
    if lines:
        fig.colorbar(ScalarMappable(norm, cmap), ax=ax, label=f"final {metric}", pad=0.02)
    fig.subplots_adjust(left=0.04, right=0.98, top=0.9, bottom=0.2)
    return fig


def importance_figures(
    trials: Sequence[TrialResult],
    params: Sequence[Searched],
    metric: str,
    mode: str,
    name: str,
    importances: Mapping[str, float] | None,
) -> dict[str, Figure]:
    """File suffix (importance, parallel) -> picture; nothing with no searched parameter or no trial."""
    if not params or not trials:
        return {}
    out: dict[str, Figure] = {}
    if importances:
        out["importance"] = importance_figure(importances, metric, f"{name}: what mattered for {metric}")
        rank = {n: i for i, n in enumerate(importances)}
        params = sorted(params, key=lambda p: rank.get(p.name, len(rank)))
    out["parallel"] = parallel_figure(trials, params, metric, mode, f"{name}: trials across the searched parameters")
    return out


def draw_importance(
    trials: Sequence[Any], spec: SweepSpec, folder: Path, importances: Mapping[str, float] | None
) -> list[Path]:
    """importance_figures of the queue's trial rows, saved as `<folder>/<metric>_{importance,parallel}.png`."""
    metric = spec.metric.name
    results = [TrialResult(t.config or {}, final_value(t.metrics, metric)) for t in trials]
    figures = importance_figures(
        results, searched_params(spec.space), metric, spec.metric.mode or "max", spec.name, importances
    )
    stem = metric.replace("/", "_")
    return [save(fig, folder / f"{stem}_{suffix}.png") for suffix, fig in figures.items()]
