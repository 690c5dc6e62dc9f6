"""The pictures on a sweep's parent run: what the searched parameters did to the sweep metric.

- `<metric>_final.png`: the final metric against each searched parameter, a panel each. A value's trials are
  points; its mean and spread (std) sit on them; the best trial is a star. Numeric parameters get a
  numeric axis (log when the space is log: loguniform, or a grid/choice of geometric values), the rest
  one category per value. A continuous space (uniform, loguniform, randint) of many values is averaged
  per bin. With no searched parameter: each trial's final value, in trial order.
- `<metric>_heatmap.png`: with two or more grid parameters (seeds aside), the mean metric per cell of the
  two that matter most (below), annotated, the best cell outlined: the generic form of the paper
  sweep's Ψ x difference heatmap (jobs/tversky/xor_grid.py).
- `<metric>_curves.png`: every trial's curve, coloured by the parameter that matters most, with a legend,
  over the task's own step: the `step` it reports with each result (optimizer steps, environment steps,
  loads stored: what the task counts), not Tune's count of reports. A task that reports no `step` is drawn
  over its reports, and the axis says so.

"Matters most" is the parameter whose per-value means of the final metric spread most (max - min). A
parameter named `seed` or `*_seed` is a replicate: it has its panel, but colours nothing and is no heatmap
axis (the demo sweep averages 2 seeds per Ψ x difference cell).

Each picture is a few collections, not an artist per trial, with no pyplot (no global figure state, safe
in a worker thread) and no tight_layout. For a 200-trial sweep (5 x 4 grid x 10 seeds and a loguniform lr,
20 steps a trial) SweepTracker._plots took 0.85-1.05 s of CPU for the three pictures, against 0.45-0.5 s
for the two they replace (a bar per trial index, unlabelled curves), on a loaded 2-core machine.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeGuard

import numpy as np
from matplotlib import colormaps, colors
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator

if TYPE_CHECKING:
    from service.spec import SweepSpec

STEP_KEY = "step"
"""The result key of a task's own step count, which the jobs' tasks report with every result. The worker
logs it with the metrics (a `step` metric on each child run), so the curves can be drawn over it."""
REPORT_AXIS = "report (Tune's training_iteration)"
"""The curves' x label when some trial reported no task step."""
MAX_GROUPS = 12
"""A continuous space with more distinct values than this is averaged per bin (BINS of them)."""
BINS = 8
MAX_ANNOTATED_CELLS = 300
"""A larger heatmap has no numbers written in its cells (unreadable, and each text costs a draw)."""
PANEL_WIDTH = 3.8
"""Inches of one panel's axes in the per-parameter picture."""
CHAR_WIDTH = 0.075
"""Inches per character of a tick label, about, at the default 10 pt."""
TITLE_Y = 1.0
"""An axes title at a fixed height: placed automatically, it measures the axes' tick labels at every draw
to clear them, the largest single cost of the panels' draw (no labels sit on top here)."""
_CATEGORY_JITTER = 0.3  # spread of a value's points, in category slots


@dataclass(frozen=True)
class Searched:
    """A searched parameter as the pictures draw it."""

    name: str
    kind: str
    """The spec's domain: grid, choice, uniform, loguniform, randint."""
    scale: Literal["linear", "log", "category"]
    values: tuple[Any, ...] = ()
    """grid/choice: the spec's values, in its order (the order of categories)."""

    @property
    def replicate(self) -> bool:
        return self.name == "seed" or self.name.endswith("_seed")


@dataclass(frozen=True)
class TrialResult:
    config: Mapping[str, Any]
    final: float
    """The trial's last value of the metric; NaN when it has none (never reported, or not finite)."""
    curve: dict[Any, float] = field(default_factory=dict)
    """step -> value: the task's own steps, or its reports (draw_summary)."""


@dataclass(frozen=True)
class Baseline:
    """A trivial baseline of the sweep's metric (a policy or model that reads nothing), drawn dashed."""

    name: str
    value: float

    @property
    def label(self) -> str:
        return f"{self.name} = {self.value:.4g}"


def _baseline_line(ax: Any, baseline: Baseline | None) -> None:
    if baseline is not None:
        ax.axhline(baseline.value, color="dimgrey", ls="--", lw=1.2, label=baseline.label, zorder=1)


@dataclass
class _Group:
    label: str
    x: float  # numeric axes: the value (bin centre); categories: the slot index
    members: list[int]  # trial indices
    binned: bool = False  # a bin of a continuous space: its trials keep their own x
    mean: float = math.nan
    std: float = math.nan


def searched_params(space: Mapping[str, Any]) -> list[Searched]:
    """The spec's `space` (name -> service.spec.Domain) as the pictures draw it, in the spec's order."""
    out = []
    for name, domain in space.items():
        kind = domain.kind
        values = tuple(getattr(domain, kind)) if kind in ("grid", "choice") else ()
        if kind == "loguniform":
            scale: Literal["linear", "log", "category"] = "log"
        elif kind in ("uniform", "randint"):
            scale = "linear"
        elif all(_is_number(v) for v in values):
            scale = "log" if _geometric(values) else "linear"
        else:
            scale = "category"
        out.append(Searched(name, kind, scale, values))
    return out


def _is_number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _geometric(values: Sequence[float]) -> bool:
    """Values a log axis shows better: positive, spanning 8x or more, and evenly spaced in log rather
    than linearly ([1e-4, 1e-3, 1e-2], [16, 64, 256, 1024]; not [16, 24, 32, 40], nor [0.1, 0.5, 0.9])."""
    v = np.unique(np.asarray(values, dtype=float))
    if len(v) < 2 or v[0] <= 0 or v[-1] / v[0] < 8:
        return False
    if len(v) == 2:
        return bool(v[-1] / v[0] >= 100)

    def unevenness(gaps: Any) -> float:
        return float(np.std(gaps) / np.mean(gaps))

    return unevenness(np.diff(np.log(v))) < unevenness(np.diff(v))


def _key(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def _label(v: Any) -> str:
    text = v if isinstance(v, str) else f"{v:g}" if _is_number(v) else _key(v)
    return text if len(text) <= 24 else text[:23] + "…"


def groups(trials: Sequence[TrialResult], p: Searched) -> list[_Group]:
    """The trials by value of `p` (by bin, for a continuous space of many values), with each group's mean
    and std of the finite finals. Numeric parameters: trials whose value is not a number are left out."""
    raw = [t.config.get(p.name) for t in trials]
    if p.scale == "category":
        order = {_key(v): v for v in p.values}
        for v in raw:
            order.setdefault(_key(v), v)
        slots = {k: _Group(_label(v), float(i), []) for i, (k, v) in enumerate(order.items())}
        for i, v in enumerate(raw):
            slots[_key(v)].members.append(i)
        found = list(slots.values())
    else:
        numbers = {i: float(v) for i, v in enumerate(raw) if _is_number(v) and (p.scale == "linear" or v > 0)}
        distinct = sorted(set(numbers.values()) | {float(v) for v in p.values})
        if len(distinct) <= MAX_GROUPS:
            by_value = {v: _Group(_label(v), v, []) for v in distinct}
            for i, v in numbers.items():
                by_value[v].members.append(i)
            found = list(by_value.values())
        else:
            found = _bins(numbers, p.scale == "log")
    finals = np.array([t.final for t in trials], dtype=float)
    for g in found:
        values = finals[g.members][np.isfinite(finals[g.members])]
        if len(values):
            g.mean, g.std = float(values.mean()), float(values.std())
    return found


def _bins(numbers: dict[int, float], log: bool) -> list[_Group]:
    xs = np.array(list(numbers.values()))
    t = np.log10(xs) if log else xs
    edges = np.linspace(t.min(), t.max(), BINS + 1)
    which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, BINS - 1)
    out = []
    for b in range(BINS):
        lo, hi = (10 ** edges[b], 10 ** edges[b + 1]) if log else (edges[b], edges[b + 1])
        centre = 10 ** ((edges[b] + edges[b + 1]) / 2) if log else (lo + hi) / 2
        members = [i for i, w in zip(numbers, which, strict=True) if w == b]
        out.append(_Group(f"{lo:.3g}–{hi:.3g}", float(centre), members, binned=True))
    return out


def spread(gs: Sequence[_Group]) -> float:
    """Max - min of the groups' means (0 when fewer than two groups have one)."""
    means = [g.mean for g in gs if math.isfinite(g.mean)]
    return max(means) - min(means) if len(means) > 1 else 0.0


def most_influential(trials: Sequence[TrialResult], params: Sequence[Searched], among: int = 1) -> list[Searched]:
    """The `among` parameters whose per-value means spread most, replicates only where nothing else is
    searched; ties keep the spec's order."""
    pool = [p for p in params if not p.replicate] or list(params)
    ranked = sorted(pool, key=lambda p: -spread(groups(trials, p)))
    return ranked[:among]


def best_index(trials: Sequence[TrialResult], mode: str) -> int | None:
    finals = np.array([t.final for t in trials], dtype=float)
    if not np.isfinite(finals).any():
        return None
    pick = np.nanargmin if mode == "min" else np.nanargmax
    return int(pick(np.where(np.isfinite(finals), finals, np.nan)))


# --- the pictures -------------------------------------------------------------------------------


def by_param_figure(
    trials: Sequence[TrialResult],
    params: Sequence[Searched],
    metric: str,
    mode: str,
    title: str,
    baseline: Baseline | None = None,
) -> Figure:
    """A panel per searched parameter: points per trial, mean ± std per value, the best trial starred, and
    the trivial baseline as a dashed line when the sweep names one."""
    n = max(1, len(params))
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    panels = [(p, groups(trials, p)) for p in params]
    below = max((_label_depth(gs, PANEL_WIDTH) for p, gs in panels if p.scale == "category"), default=0.0)
    fig = Figure(figsize=(max(8.0, 4.6 * ncols), 1.0 + (3.4 + below) * nrows))  # 8: the title and the legend
    axes: list[Any] = []
    for k in range(n):  # only the panels drawn: an axes costs ~20 ms to make, drawn or not
        axes.append(fig.add_subplot(nrows, ncols, k + 1, sharey=axes[0] if axes else None))
        if k % ncols:
            axes[-1].tick_params(labelleft=False)
    finals = np.array([t.final for t in trials], dtype=float)
    finite = np.isfinite(finals)
    missing = int((~finite).sum())
    top = 0.95 if missing else 0.75  # inches: the title (a line more for the trials without a value)
    _place(fig, nrows, ncols, left=0.8, right=0.2, top=top, bottom=0.55 + below, wspace=0.2, hspace=0.95 + below)
    best = best_index(trials, mode)
    if not params:
        _trial_order_panel(axes[0], finals, best)
    for ax, (p, gs) in zip(axes, panels, strict=False):
        xs, ys = [], []
        width = _jitter_width(gs, p.scale)
        for g in gs:
            members = [i for i in g.members if finite[i]]
            for k, i in enumerate(members):
                offset = (k * 0.618034) % 1 - 0.5 if len(members) > 1 and width else 0.0  # golden-ratio strip
                x = _trial_x(trials[i], p, g)
                xs.append(x * 10 ** (offset * width) if p.scale == "log" else x + offset * width)
                ys.append(finals[i])
        ax.scatter(xs, ys, s=14, alpha=0.5, color="C0", label="trial", zorder=2)
        with_mean = [g for g in gs if math.isfinite(g.mean)]
        ax.errorbar(
            [g.x for g in with_mean], [g.mean for g in with_mean], yerr=[g.std for g in with_mean],
            fmt="o", color="black", ms=5, capsize=4, label="mean ± std", zorder=3,
        )  # fmt: skip
        if best is not None and p.name in trials[best].config:
            hit = next((g for g in gs if best in g.members), None)
            if hit is not None:
                ax.scatter([_trial_x(trials[best], p, hit)], [finals[best]], marker="*", s=160, color="C3",
                           edgecolors="black", linewidths=0.5, label="best trial", zorder=4)  # fmt: skip
        _x_axis(ax, p, gs)
        ax.set_title(f"{p.name} ({p.kind}, {_spread_text(gs)})", fontsize="medium", y=TITLE_Y)
    for ax in axes:
        _baseline_line(ax, baseline)
    for ax in axes[::ncols]:
        ax.set_ylabel(f"final {metric}")
    # Above the panels, not in one: inside, it hid that panel's points wherever it went.
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper right", ncols=3, fontsize="small", frameon=False)
    fig.suptitle(title + (f"\n{missing} of {len(trials)} trials without a value" if missing else ""),
                 x=0.01, ha="left", y=0.99, va="top")  # fmt: skip
    return fig


def _place(
    fig: Figure, nrows: int, ncols: int, left: float, right: float, top: float, bottom: float, wspace: float,
    hspace: float,
) -> None:  # fmt: skip
    """Margins and gaps in inches. Not tight_layout: it lays out every text once more before the draw,
    which was a third of this module's time."""
    w, h = fig.get_size_inches()
    aw = (w - left - right - (ncols - 1) * wspace) / ncols
    ah = (h - top - bottom - (nrows - 1) * hspace) / nrows
    fig.subplots_adjust(
        left=left / w, right=1 - right / w, top=1 - top / h, bottom=bottom / h, wspace=wspace / aw, hspace=hspace / ah
    )


def _label_depth(gs: Sequence[_Group], width: float) -> float:
    """Inches that the category labels of an axis `width` inches wide reach below it when slanted (0:
    they stay level)."""
    return 0.5 * CHAR_WIDTH * max(len(g.label) for g in gs) + 0.1 if _slanted(gs, width) else 0.0


def _slanted(gs: Sequence[_Group], width: float) -> bool:
    """Whether the longest label overruns its slot of the axis: then the labels are slanted 30°."""
    return bool(gs) and CHAR_WIDTH * max(len(g.label) for g in gs) > 0.9 * width / len(gs)


def _trial_order_panel(ax: Any, finals: Any, best: int | None) -> None:
    idx = np.flatnonzero(np.isfinite(finals))
    ax.scatter(idx, finals[idx], s=14, color="C0", label="trial")
    if len(idx):
        m, s = float(finals[idx].mean()), float(finals[idx].std())
        ax.axhline(m, color="black", lw=1, label="mean ± std")
        ax.axhspan(m - s, m + s, color="black", alpha=0.08)
    if best is not None:
        ax.scatter([best], [finals[best]], marker="*", s=160, color="C3", edgecolors="black", label="best trial")
    ax.set_xlabel("trial")
    ax.set_title("no searched parameter: each trial", y=TITLE_Y)


def _trial_x(t: TrialResult, p: Searched, g: _Group) -> float:
    """A trial's own value where it has one on the axis (binned values), else its group's slot."""
    v = t.config.get(p.name)
    return float(v) if p.scale != "category" and _is_number(v) else g.x


def _jitter_width(gs: Sequence[_Group], scale: str) -> float:
    """How far a value's points spread: a share of the smallest gap between values (log10 units on a
    log axis); none for binned values (each trial has its own x)."""
    if scale == "category":
        return _CATEGORY_JITTER
    if any(g.binned for g in gs):
        return 0.0
    xs = np.log10([g.x for g in gs]) if scale == "log" else np.array([g.x for g in gs])
    gaps = np.diff(np.sort(xs))
    return float(_CATEGORY_JITTER * gaps.min()) if len(gaps) and gaps.min() > 0 else 0.0


def _x_axis(ax: Any, p: Searched, gs: Sequence[_Group]) -> None:
    ax.set_xlabel(p.name)
    if p.scale == "category":
        ax.set_xticks([g.x for g in gs], [g.label for g in gs])
        if _slanted(gs, PANEL_WIDTH):
            ax.tick_params(axis="x", labelrotation=30)
            for label in ax.get_xticklabels():
                label.set_horizontalalignment("right")
        ax.set_xlim(-0.6, len(gs) - 0.4)
        return
    if p.scale == "log":
        # Plain numbers, no minor ticks: the default 10^k labels go through mathtext, whose first parse in
        # a process took ~0.2 s, as long as the rest of this picture.
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.minorticks_off()
    if not any(g.binned for g in gs):  # the values themselves: a tick at each
        ax.set_xticks([g.x for g in gs], [g.label for g in gs])
        ax.minorticks_off()


def _spread_text(gs: Sequence[_Group]) -> str:
    return f"means spread {spread(gs):.3g}"


def heatmap_figure(
    trials: Sequence[TrialResult], rows: Searched, cols: Searched, metric: str, mode: str, title: str
) -> Figure:
    """Mean metric per (rows value, cols value) cell, annotated; the best cell outlined."""
    rg, cg = groups(trials, rows), groups(trials, cols)
    means = np.full((len(rg), len(cg)), np.nan)
    counts = np.zeros((len(rg), len(cg)), dtype=int)
    finals = np.array([t.final for t in trials], dtype=float)
    for i, r in enumerate(rg):
        for j, c in enumerate(cg):
            cell = sorted(set(r.members) & set(c.members))
            values = finals[cell][np.isfinite(finals[cell])]
            counts[i, j] = len(values)
            if len(values):
                means[i, j] = values.mean()
    left = 0.75 + 0.075 * max(len(r.label) for r in rg)  # inches: the row labels and the y label
    width = min(24.0, max(5.0, left + 1.6 + 0.09 * sum(max(6, len(c.label)) for c in cg)))
    cells = width - left - 1.6  # inches: the colour bar and the margins take the rest
    below = _label_depth(cg, cells)
    fig = Figure(figsize=(width, min(max(3.2, 1.8 + below + 0.45 * len(rg)), 24)))
    ax = fig.add_subplot()
    _place(fig, 1, 1, left=left, right=0.3, top=0.7, bottom=0.65 + below, wspace=0, hspace=0)
    cmap = colormaps["viridis"].with_extremes(bad="#dddddd")  # a cell without a value: grey
    image = ax.imshow(np.ma.masked_invalid(means), cmap=cmap, aspect="auto")
    lo, hi = (np.nanmin(means), np.nanmax(means)) if np.isfinite(means).any() else (0.0, 1.0)
    if means.size <= MAX_ANNOTATED_CELLS:
        for (i, j), m in np.ndenumerate(means):
            dark = math.isfinite(m) and (m - lo) / ((hi - lo) or 1.0) < 0.6
            ax.text(j, i, f"{m:.3g}" if math.isfinite(m) else "–", ha="center", va="center",
                    color="white" if dark else "black", fontsize="small")  # fmt: skip
    if np.isfinite(means).any():
        bi, bj = np.unravel_index(np.nanargmin(means) if mode == "min" else np.nanargmax(means), means.shape)
        ax.add_patch(Rectangle((float(bj) - 0.5, float(bi) - 0.5), 1, 1, fill=False, edgecolor="C3", linewidth=2.5))
    ax.set_xticks(range(len(cg)), [c.label for c in cg])
    if _slanted(cg, cells):
        ax.tick_params(axis="x", labelrotation=30)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
    ax.set_yticks(range(len(rg)), [r.label for r in rg])
    n = counts[counts > 0]
    per_cell = "" if not len(n) else f"{n.min()}" if n.min() == n.max() else f"{n.min()}-{n.max()}"
    ax.set(xlabel=cols.name, ylabel=rows.name)
    ax.set_title(title + (f"\n{per_cell} trials per cell" if per_cell else ""), y=TITLE_Y)
    fig.colorbar(image, ax=ax, label=f"mean {metric}")
    return fig


def curves_figure(
    trials: Sequence[TrialResult],
    colour_by: Searched | None,
    metric: str,
    title: str,
    step_label: str = REPORT_AXIS,
    baseline: Baseline | None = None,
) -> Figure:
    """One line per trial (a dot where it reported once), coloured by `colour_by`'s values, with a legend."""
    fig = Figure(figsize=(9.5, 5))
    ax = fig.add_subplot()
    legend_width = 0.0  # inches
    colour = [f"C{i % 10}" for i in range(len(trials))]  # no parameter: each trial its own
    handles: list[Line2D] = []
    if colour_by is not None:
        gs = [g for g in groups(trials, colour_by) if g.members]
        palette = _palette(len(gs), colour_by.scale != "category")
        for g, c in zip(gs, palette, strict=True):
            for i in g.members:
                colour[i] = c
            handles.append(Line2D([], [], color=c, lw=2, label=g.label))
        # Trials left out of every group (no numeric value of a numeric parameter): grey, unlabelled.
        grouped = {i for g in gs for i in g.members}
        colour = [c if i in grouped else "#999999" for i, c in enumerate(colour)]
    points = [np.array([(s, t.curve[s]) for s in sorted(t.curve) if math.isfinite(t.curve[s])]) for t in trials]
    lines = [(p, c) for p, c in zip(points, colour, strict=True) if len(p) > 1]
    if lines:
        ax.add_collection(LineCollection([p for p, _ in lines], colors=[c for _, c in lines], alpha=0.6, linewidths=1))
    dots = [(p[0], c) for p, c in zip(points, colour, strict=True) if len(p) == 1]
    if dots:
        ax.scatter([d[0][0] for d in dots], [d[0][1] for d in dots], s=12, alpha=0.7, c=[c for _, c in dots])
    _baseline_line(ax, baseline)
    if baseline is not None:
        handles.append(Line2D([], [], color="dimgrey", ls="--", lw=1.2, label=baseline.label))
    ax.autoscale_view()
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps and reports are whole numbers
    ax.set(xlabel=step_label, ylabel=metric)
    ax.set_title(title, y=TITLE_Y)
    if handles:
        ncols = math.ceil(len(handles) / 16)
        ax.legend(handles=handles, title=colour_by.name if colour_by else None, fontsize="small", loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), ncols=ncols)  # fmt: skip
        longest = max(len(colour_by.name if colour_by else ""), *(len(str(h.get_label())) for h in handles))
        legend_width = ncols * (0.7 + 0.07 * longest)
    _place(fig, 1, 1, left=0.8, right=0.25 + legend_width, top=0.45, bottom=0.6, wspace=0, hspace=0)
    return fig


def _palette(n: int, ordered: bool) -> list[str]:
    """Ordered values: a sequential map, so that the colour reads as the value; categories: distinct hues."""
    if ordered:
        cmap = colormaps["viridis"]
        return [colors.to_hex(cmap(x)) for x in np.linspace(0.0, 0.9, n)]
    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [colors.to_hex(cmap(i % cmap.N)) for i in range(n)]


def summary_figures(
    trials: Sequence[TrialResult],
    params: Sequence[Searched],
    metric: str,
    mode: str,
    name: str,
    step_label: str = REPORT_AXIS,
    baseline: Baseline | None = None,
) -> dict[str, Figure]:
    """File suffix (final, heatmap, curves) -> picture; see the module docstring for what each shows."""
    out = {}
    if trials:
        title = f"{name}: final {metric} by searched parameter"
        out["final"] = by_param_figure(trials, params, metric, mode, title, baseline)
    grid = [p for p in params if p.kind == "grid" and not p.replicate and len(groups(trials, p)) > 1]
    if len(grid) >= 2 and trials:
        pair = most_influential(trials, grid, among=2)
        rows, cols = sorted(pair, key=lambda p: params.index(p))
        others = [p.name for p in params if p not in pair]
        over = f", mean over {', '.join(others)}" if others else ""
        out["heatmap"] = heatmap_figure(trials, rows, cols, metric, mode, f"{name}: mean final {metric}{over}")
    top = most_influential(trials, params)
    colour_by = top[0] if top else None
    by = f", coloured by {colour_by.name}" if colour_by else ""
    out["curves"] = curves_figure(trials, colour_by, metric, f"{name}: {metric} per trial{by}", step_label, baseline)
    return out


def task_step_label(task: str) -> str:
    return f"step, as {task} counts it"


def on_task_steps(
    curves: Sequence[dict[int, float]], steps: Sequence[dict[int, float]]
) -> list[dict[Any, float]] | None:
    """Each curve (report -> value) over its trial's own steps (report -> task step); None unless every
    report of every curve has its task step (and there is a report)."""
    if not any(curves) or not all(curve.keys() <= axis.keys() for curve, axis in zip(curves, steps, strict=True)):
        return None
    return [{axis[r]: v for r, v in curve.items()} for curve, axis in zip(curves, steps, strict=True)]


def sweep_figures(
    trials: Sequence[Any],
    curve_of: Callable[[Any], dict[int, float]],
    spec: SweepSpec,
    steps_of: Callable[[Any], dict[int, float]] | None = None,
) -> dict[str, Figure]:
    """The pictures of a sweep's trials (the queue's rows: config, metrics, mlflow_run_id), by file suffix.
    `curve_of(trial)`: its metric's report -> value; `steps_of(trial)`: its report -> the task's own step
    (STEP_KEY); both asked only of trials that have a run. The curves are drawn over the task's steps when
    every trial has them, else over the reports."""
    metric = spec.metric.name
    ran = [t for t in trials if t.mlflow_run_id]
    curves = [curve_of(t) for t in ran]
    on_steps = on_task_steps(curves, [steps_of(t) for t in ran]) if steps_of is not None else None
    by_trial: dict[int, dict[Any, float]] = dict(zip(map(id, ran), on_steps or curves, strict=True))
    results = []
    for t in trials:
        value = (t.metrics or {}).get(metric)
        final = float(value) if isinstance(value, int | float) else math.nan
        results.append(TrialResult(t.config or {}, final, by_trial.get(id(t), {})))
    label = task_step_label(spec.task) if on_steps is not None else REPORT_AXIS
    return summary_figures(
        results,
        searched_params(spec.space),
        metric,
        spec.metric.mode or "max",
        spec.name,
        step_label=label,
        baseline=sweep_baseline(trials, spec),
    )


def sweep_baseline(trials: Sequence[Any], spec: SweepSpec) -> Baseline | None:
    """The trivial baseline of the sweep's metric: the `baseline` of the first claim about that metric,
    averaged over the trials that report it (it reads only data, so it barely moves between trials)."""
    name = next((c.baseline for c in spec.claims if c.metric == spec.metric.name and c.baseline), None)
    if name is None:
        return None
    values = [float(v) for t in trials if isinstance(v := (t.metrics or {}).get(name), int | float)]
    values = [v for v in values if math.isfinite(v)]
    return Baseline(name, sum(values) / len(values)) if values else None


def draw_summary(
    trials: Sequence[Any],
    curve_of: Callable[[Any], dict[int, float]],
    spec: SweepSpec,
    folder: Path,
    steps_of: Callable[[Any], dict[int, float]] | None = None,
) -> list[Path]:
    """sweep_figures saved as `<folder>/<metric>_{final,heatmap,curves}.png`."""
    figures = sweep_figures(trials, curve_of, spec, steps_of)
    stem = spec.metric.name.replace("/", "_")  # slash-grouped metric names (test/accuracy) are not file names
    return [save(fig, folder / f"{stem}_{suffix}.png") for suffix, fig in figures.items()]


def save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    return path
