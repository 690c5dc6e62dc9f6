"""What mattered, drawn: the importance bars and the parallel-coordinates picture, read back from their artists."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from matplotlib.collections import LineCollection
from PIL import Image

from service.spec import SweepSpec
from workers.importance_plots import draw_importance, importance_figure, importance_figures, parallel_figure
from workers.summary_plots import Searched, TrialResult

LR = Searched("lr", "loguniform", "log")
ACT = Searched("act", "choice", "category", ("relu", "gelu", "tanh"))
TRIALS = [
    TrialResult({"lr": 1e-4, "act": "relu"}, 0.2),
    TrialResult({"lr": 1e-2, "act": "gelu"}, 0.9),
    TrialResult({"lr": 1e-3, "act": "tanh"}, math.nan),  # never reported: no line
    TrialResult({"lr": 1e-1, "act": "gelu"}, 0.5),
]


def test_the_bars_hold_each_share_largest_on_top() -> None:
    fig = importance_figure({"lr": 0.7, "act": 0.2, "seed": 0.1}, "accuracy", "t")
    ax = fig.axes[0]
    widths = [p.get_width() for p in ax.patches]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["seed", "act", "lr"] and widths == [0.1, 0.2, 0.7]  # barh: bottom-up


def test_each_trial_is_a_line_across_the_axes_on_its_values() -> None:
    fig = parallel_figure(TRIALS, [LR, ACT], "accuracy", "max", "t")
    ax = fig.axes[0]
    (lines,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    paths = [p.vertices for p in lines.get_paths()]
    assert len(paths) == 3  # the NaN trial has no line
    # lr on a log axis from 1e-4 to 1e-1; act one slot per value in the spec's order; the metric last
    assert np.allclose(paths[0], [[0, 0.0], [1, 0.0], [2, 0.0]])
    assert np.allclose(paths[1], [[0, 2 / 3], [1, 0.5], [2, 1.0]])
    assert np.allclose(paths[2], [[0, 1.0], [1, 0.5], [2, 3 / 7]])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["lr", "act", "accuracy"]
    (best,) = [ln for ln in ax.lines if ln.get_label().startswith("best")]
    assert np.allclose(best.get_ydata(), [2 / 3, 0.5, 1.0])


def test_the_axes_follow_the_importances_when_known() -> None:
    figures = importance_figures(TRIALS, [LR, ACT], "accuracy", "max", "s", {"act": 0.8, "lr": 0.2})
    assert set(figures) == {"importance", "parallel"}
    assert [t.get_text() for t in figures["parallel"].axes[0].get_xticklabels()] == ["act", "lr", "accuracy"]
    assert set(importance_figures(TRIALS, [LR, ACT], "accuracy", "max", "s", None)) == {"parallel"}
    assert importance_figures(TRIALS, [], "accuracy", "max", "s", None) == {}


def test_draw_importance_saves_both_pictures_from_the_queue_rows(tmp_path: Path) -> None:
    spec = SweepSpec.model_validate(
        {"name": "s", "task": "tversky.xor", "metric": {"name": "test/accuracy", "mode": "max"},
         "space": {"lr": {"loguniform": [1e-4, 1e-1]}, "act": {"choice": ["relu", "gelu", "tanh"]}}}
    )  # fmt: skip
    rows = [SimpleNamespace(config=t.config, metrics={"test/accuracy": t.final}) for t in TRIALS]
    rows.append(SimpleNamespace(config={"lr": 1e-3, "act": "relu"}, metrics=None))  # errored before a report
    paths = draw_importance(rows, spec, tmp_path, {"lr": 0.6, "act": 0.4})
    assert [p.name for p in paths] == ["test_accuracy_importance.png", "test_accuracy_parallel.png"]
    assert all(Image.open(p).size[0] > 400 for p in paths)
