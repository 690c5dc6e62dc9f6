"""The parent run's pictures: the metric against each searched parameter, the heatmap of two grid
parameters and the curves coloured by the parameter that matters most. Each check recomputes what a
picture should show from the trials themselves and reads it back from the drawn artists."""

from __future__ import annotations

import io
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from PIL import Image

from service.spec import Domain, SweepSpec
from workers.summary_plots import (
    BINS,
    REPORT_AXIS,
    Searched,
    TrialResult,
    by_param_figure,
    curves_figure,
    draw_summary,
    groups,
    save,
    searched_params,
    summary_figures,
    sweep_figures,
)


def _coloured_pixels(fig: Figure, tmp_path: Path) -> int:
    """Pixels of the plot that are neither white nor grey (axes and text are black and grey)."""
    path = save(fig, tmp_path / "plot.png")
    rgb = np.asarray(Image.open(io.BytesIO(path.read_bytes())).convert("RGB")).astype(int)
    return int(((rgb.max(axis=2) - rgb.min(axis=2)) > 40).sum())


def _grid_sweep(nan_at: tuple[int, ...] = ()) -> tuple[list[TrialResult], list[Searched]]:
    """3 intersections x 2 differences x 2 seeds, each trial's final value its own."""
    space = {
        "intersection": Domain(grid=["product", "min", "mean"]),
        "difference": Domain(grid=["ignorematch", "substractmatch"]),
        "seed": Domain(grid=[0, 1]),
    }
    rng = np.random.default_rng(0)
    trials = []
    for i, (a, b, s) in enumerate(
        (a, b, s) for a in ("product", "min", "mean") for b in space["difference"].grid or [] for s in (0, 1)
    ):
        final = math.nan if i in nan_at else float(rng.random())
        trials.append(
            TrialResult({"intersection": a, "difference": b, "seed": s, "features": 16}, final, {1: 0.1, 2: final})
        )
    return trials, searched_params(space)


def _panel(fig: Figure, name: str) -> Any:
    (ax,) = [ax for ax in fig.axes if ax.get_title().startswith(f"{name} (")]
    return ax


def _means_drawn(ax: Any) -> list[tuple[float, float]]:
    """The (x, mean) points of a panel's errorbar, rounded to 12 digits."""
    (line,) = [line for line in ax.lines if line.get_marker() == "o"]
    return [(round(float(x), 12), round(float(y), 12)) for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True)]


def _stars(ax: Any) -> list[list[float]]:
    return [
        c.get_offsets().tolist() for c in ax.collections if isinstance(c, PathCollection) and c.get_sizes()[0] > 100
    ]


def test_the_space_is_drawn_on_the_axes_its_values_need() -> None:
    space = {
        "lr": Domain(grid=[1e-4, 1e-3, 1e-2]),
        "width": Domain(grid=[16, 24, 32, 40]),
        "hidden": Domain(choice=[16, 64, 256, 1024]),
        "beta": Domain(grid=[0.1, 0.5, 0.9]),
        "wd": Domain(loguniform=(1e-6, 1e-2)),
        "p": Domain(uniform=(0.0, 0.5)),
        "n": Domain(randint=(1, 9)),
        "act": Domain(choice=["relu", "gelu"]),
        "on": Domain(grid=[True, False]),
        "shape": Domain(grid=[[1, 2], [3]]),
    }
    scales = {p.name: p.scale for p in searched_params(space)}
    assert scales == {
        "lr": "log", "width": "linear", "hidden": "log", "beta": "linear", "wd": "log", "p": "linear",
        "n": "linear", "act": "category", "on": "category", "shape": "category",
    }  # fmt: skip


def test_two_grid_params_make_a_heatmap_of_the_per_cell_means(tmp_path: Path) -> None:
    trials, params = _grid_sweep(nan_at=(5,))
    figures = summary_figures(trials, params, "accuracy", "max", "s")
    assert list(figures) == ["final", "heatmap", "curves"]
    ax = figures["heatmap"].axes[0]
    # Independently: the mean over seeds of each (intersection, difference) cell, NaN left out.
    rows, cols = ["product", "min", "mean"], ["ignorematch", "substractmatch"]

    def cell_mean(r: str, c: str) -> float:
        cell = [t.final for t in trials if t.config["intersection"] == r and t.config["difference"] == c]
        finite = [v for v in cell if not math.isnan(v)]
        return float(np.mean(finite)) if finite else math.nan

    expected = np.array([[cell_mean(r, c) for c in cols] for r in rows])
    drawn = ax.images[0].get_array()
    np.testing.assert_allclose(np.ma.filled(drawn, np.nan), expected, rtol=1e-12)
    assert [t.get_text() for t in ax.get_yticklabels()] == rows
    assert [t.get_text() for t in ax.get_xticklabels()] == cols
    assert ax.get_ylabel() == "intersection" and ax.get_xlabel() == "difference"
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    assert texts == {(i, j): f"{expected[i, j]:.3g}" for i in range(3) for j in range(2)}
    (box,) = [p for p in ax.patches if isinstance(p, Rectangle)]
    i, j = np.unravel_index(np.argmax(expected), expected.shape)
    assert box.get_xy() == (j - 0.5, i - 0.5)  # the best cell outlined
    assert "mean over seed" in ax.get_title() and "1-2 trials per cell" in ax.get_title()
    for name, fig in figures.items():
        assert _coloured_pixels(fig, tmp_path) > 500, name


def test_a_numeric_parameter_is_on_a_log_axis_with_its_means_and_the_best_trial(tmp_path: Path) -> None:
    params = searched_params({"lr": Domain(grid=[1e-3, 1e-2, 1e-1])})
    finals = {1e-3: [0.2, 0.4], 1e-2: [0.9, 0.7], 1e-1: [0.1, 0.3]}
    trials = [TrialResult({"lr": lr}, v, {1: v / 2, 2: v}) for lr, vs in finals.items() for v in vs]
    figures = summary_figures(trials, params, "accuracy", "max", "s")
    assert "heatmap" not in figures
    ax = _panel(figures["final"], "lr")
    assert ax.get_xscale() == "log"
    assert _means_drawn(ax) == [(lr, round(float(np.mean(vs)), 12)) for lr, vs in finals.items()]
    (err,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    stds = [seg[1][1] - seg[0][1] for seg in err.get_segments()]
    assert stds == pytest.approx([2 * np.std(vs) for vs in finals.values()])  # mean ± std: twice std long
    points = [c for c in ax.collections if isinstance(c, PathCollection) and c.get_label() == "trial"][0]
    xy = points.get_offsets()
    assert sorted(xy[:, 1]) == sorted(t.final for t in trials)
    for x, y in xy:  # each point near its own value of lr (a strip, not on top of each other)
        lr = next(t.config["lr"] for t in trials if t.final == y)
        assert abs(math.log10(x) - math.log10(lr)) < 0.2
    assert _stars(ax) == [[[1e-2, 0.9]]]
    # Loss would mark the lowest instead.
    low = by_param_figure(trials, params, "loss", "min", "s")
    assert _stars(_panel(low, "lr")) == [[[1e-1, 0.1]]]
    # The curves: a colour per lr, a legend naming them, over the step axis.
    curves = figures["curves"].axes[0]
    legend = curves.get_legend()
    assert legend.get_title().get_text() == "lr"
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["0.001", "0.01", "0.1"]
    colour = {label: to_hex(h.get_color()) for label, h in zip(labels, legend.legend_handles, strict=True)}
    (lines,) = [c for c in curves.collections if isinstance(c, LineCollection)]
    assert [to_hex(c) for c in lines.get_colors()] == [colour[f"{t.config['lr']:g}"] for t in trials]
    assert curves.get_xlabel() == REPORT_AXIS
    assert curves_figure(trials, params[0], "accuracy", "s", step_label="epoch").axes[0].get_xlabel() == "epoch"


def test_a_categorical_parameter_has_a_slot_per_value_in_the_spec_order() -> None:
    params = searched_params({"act": Domain(choice=["relu", "gelu", "tanh"])})
    finals = {"gelu": [0.5, 0.7, 0.6], "relu": [0.1], "tanh": []}  # tanh never drawn by the sampler
    trials = [TrialResult({"act": a}, v, {}) for a, vs in finals.items() for v in vs]
    fig = summary_figures(trials, params, "accuracy", "max", "s")["final"]
    ax = _panel(fig, "act")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["relu", "gelu", "tanh"]
    assert _means_drawn(ax) == [(0, 0.1), (1, 0.6)]
    assert _stars(ax) == [[[1, 0.7]]]
    points = [c for c in ax.collections if isinstance(c, PathCollection) and c.get_label() == "trial"][0]
    for x, y in points.get_offsets():
        slot = 0 if y == 0.1 else 1
        assert abs(x - slot) <= 0.15 + 1e-9


def test_a_continuous_space_of_many_values_is_averaged_per_bin() -> None:
    p = searched_params({"p": Domain(uniform=(0.0, 1.0))})[0]
    xs = np.linspace(0, 1, 40)
    trials = [TrialResult({"p": float(x)}, float(x**2), {}) for x in xs]
    gs = groups(trials, p)
    assert len(gs) == BINS and sorted(i for g in gs for i in g.members) == list(range(40))
    for g in gs:
        assert g.mean == pytest.approx(np.mean([trials[i].final for i in g.members]))
    ax = by_param_figure(trials, [p], "m", "max", "s").axes[0]
    points = [c for c in ax.collections if isinstance(c, PathCollection) and c.get_label() == "trial"][0]
    np.testing.assert_allclose(points.get_offsets(), np.c_[xs, xs**2])  # each trial at its own value


def test_no_searched_parameter_draws_each_trial_and_no_heatmap(tmp_path: Path) -> None:
    trials = [TrialResult({}, v, {1: v}) for v in (0.3, 0.9, 0.5)]
    figures = summary_figures(trials, [], "accuracy", "max", "s")
    assert list(figures) == ["final", "curves"]
    (ax,) = figures["final"].axes
    assert _stars(ax) == [[[1, 0.9]]]
    assert figures["curves"].axes[0].get_legend() is None
    assert _coloured_pixels(figures["curves"], tmp_path) > 20  # one-step trials are dots
    assert list(summary_figures([], [], "accuracy", "max", "s")) == ["curves"]  # no trial at all: empty axes


def test_nan_metrics_are_left_out_and_counted(tmp_path: Path) -> None:
    trials, params = _grid_sweep(nan_at=tuple(range(12)))  # every trial without a value
    figures = summary_figures(trials, params, "accuracy", "max", "s")
    assert "12 of 12 trials without a value" in figures["final"].get_suptitle()
    assert all(not _stars(ax) for ax in figures["final"].axes)
    assert np.ma.getmaskarray(figures["heatmap"].axes[0].images[0].get_array()).all()
    some = [TrialResult({"lr": 0.1}, math.nan, {1: math.nan, 2: 0.5, 3: 0.6}), TrialResult({"lr": 0.2}, 0.4, {1: 0.4})]
    fig = summary_figures(some, searched_params({"lr": Domain(grid=[0.1, 0.2])}), "accuracy", "max", "s")
    assert _means_drawn(_panel(fig["final"], "lr")) == [(0.2, 0.4)]
    (lines,) = [c for c in fig["curves"].axes[0].collections if isinstance(c, LineCollection)]
    assert [seg.tolist() for seg in lines.get_segments()] == [[[2, 0.5], [3, 0.6]]]  # the NaN step dropped
    for f in fig.values():
        save(f, tmp_path / "nan.png")


def test_the_pictures_are_saved_under_stable_names(tmp_path: Path) -> None:
    spec = SweepSpec.model_validate(
        {
            "name": "s", "task": "tversky.xor", "metric": {"name": "test/accuracy", "mode": "max"},
            "space": {"a": {"grid": [1, 2]}, "b": {"grid": ["x", "y"]}},
        }
    )  # fmt: skip
    trials = [
        SimpleNamespace(
            trial_id=f"t{i}", config={"a": a, "b": b}, metrics={"test/accuracy": a / 2}, mlflow_run_id=f"r{i}"
        )
        for i, (a, b) in enumerate([(1, "x"), (1, "y"), (2, "x"), (2, "y")])
    ]
    trials[3].mlflow_run_id = None
    curves = {"t0": {1: 0.1, 2: 0.2}, "t1": {1: 0.3}, "t2": {}}
    out = draw_summary(trials, lambda t: curves[t.trial_id], spec, tmp_path)  # t3 has no run: not asked
    assert [p.name for p in out] == ["test_accuracy_final.png", "test_accuracy_heatmap.png", "test_accuracy_curves.png"]
    assert all(p.stat().st_size > 1000 for p in out)


def test_the_curves_are_drawn_over_the_tasks_own_steps() -> None:
    spec = SweepSpec.model_validate(
        {"name": "s", "task": "tversky.xor", "metric": {"name": "accuracy", "mode": "max"},
         "space": {"lr": {"grid": [0.1, 0.2]}}}
    )  # fmt: skip
    trials = [
        SimpleNamespace(trial_id=f"t{i}", config={"lr": lr}, metrics={"accuracy": 0.5}, mlflow_run_id=f"r{i}")
        for i, lr in enumerate([0.1, 0.2])
    ]
    curves = {"t0": {1: 0.25, 2: 0.5, 3: 0.75}, "t1": {1: 0.5, 2: 1.0}}  # report -> accuracy
    steps = {"t0": {1: 50, 2: 100, 3: 150}, "t1": {1: 250, 2: 500}}  # report -> the task's step

    def drawn(fig: dict[str, Figure]) -> tuple[str, list[list[list[float]]]]:
        ax = fig["curves"].axes[0]
        (lines,) = [c for c in ax.collections if isinstance(c, LineCollection)]
        return ax.get_xlabel(), sorted(seg.tolist() for seg in lines.get_segments())

    on_steps = sweep_figures(trials, lambda t: curves[t.trial_id], spec, lambda t: steps[t.trial_id])
    assert drawn(on_steps) == (
        "step, as tversky.xor counts it",
        [[[50, 0.25], [100, 0.5], [150, 0.75]], [[250, 0.5], [500, 1.0]]],
    )
    # One report without its task step (a run of an earlier attempt logged none): every curve over reports.
    steps["t1"] = {1: 250}
    on_reports = sweep_figures(trials, lambda t: curves[t.trial_id], spec, lambda t: steps[t.trial_id])
    assert drawn(on_reports) == (REPORT_AXIS, [[[1, 0.25], [2, 0.5], [3, 0.75]], [[1, 0.5], [2, 1.0]]])


def test_the_trivial_baseline_of_the_sweeps_metric_is_a_dashed_line_on_its_pictures() -> None:
    """A claim about the sweep's metric that names a baseline: its mean over the trials is drawn dashed on the
    final-value panels and the curves; a sweep without such a claim draws none."""
    base = {"name": "s", "task": "tversky.xor", "metric": {"name": "accuracy", "mode": "max"},
            "space": {"lr": {"grid": [0.1, 0.2]}}}  # fmt: skip
    claim = {"id": "c", "text": "t", "metric": "accuracy", "baseline": "baseline/majority"}
    trials = [
        SimpleNamespace(
            trial_id=f"t{i}", config={"lr": lr}, metrics={"accuracy": 0.9, "baseline/majority": b}, mlflow_run_id="r"
        )
        for i, (lr, b) in enumerate([(0.1, 0.5), (0.2, 0.7)])
    ]

    def dashed(figures: dict[str, Figure]) -> dict[str, list[tuple[float, str]]]:
        return {
            k: [(line.get_ydata()[0], line.get_label()) for ax in f.axes for line in ax.lines if line.get_ls() == "--"]
            for k, f in figures.items()
        }

    with_claim = SweepSpec.model_validate({**base, "claims": [claim]})
    got = dashed(sweep_figures(trials, lambda t: {1: 0.9}, with_claim))
    assert got == {
        "final": [(0.6, "baseline/majority = 0.6")],
        "curves": [(0.6, "baseline/majority = 0.6")],
    }
    plain = dashed(sweep_figures(trials, lambda t: {1: 0.9}, SweepSpec.model_validate(base)))
    assert plain == {"final": [], "curves": []}
