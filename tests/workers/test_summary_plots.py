"""The parent run's pictures: every trial is drawn, with its own values, and can be seen."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure
from PIL import Image

from workers.summary_plots import curves_figure, finals_figure, save


def _coloured_pixels(fig: Figure, tmp_path: Path) -> int:
    """Pixels of the plot that are neither white nor grey (axes and text are black and grey)."""
    path = save(fig, tmp_path / "plot.png")
    rgb = np.asarray(Image.open(io.BytesIO(path.read_bytes())).convert("RGB")).astype(int)
    return int(((rgb.max(axis=2) - rgb.min(axis=2)) > 40).sum())


def test_each_trial_is_a_line_with_its_own_points(tmp_path: Path) -> None:
    curves = [{1: 0.1, 2: 0.5, 3: 0.9}, {3: 0.2, 1: 0.4}]  # steps in any order
    fig = curves_figure(curves, "accuracy", "s: accuracy per trial")
    (lines,) = [c for c in fig.axes[0].collections if isinstance(c, LineCollection)]
    assert [seg.tolist() for seg in lines.get_segments()] == [
        [[1, 0.1], [2, 0.5], [3, 0.9]],
        [[1, 0.4], [3, 0.2]],
    ]
    x0, x1 = fig.axes[0].get_xlim()
    assert x0 <= 1 and x1 >= 3  # the view holds every point
    assert _coloured_pixels(fig, tmp_path) > 100


def test_a_trial_with_one_step_is_a_visible_dot(tmp_path: Path) -> None:
    # A trial that reports once (the benchmark's sweep, short tasks) has no line: a plain ax.plot of one
    # point draws nothing, and the picture of a 200-trial sweep was empty axes.
    curves = [{10: 0.25}, {10: 0.75}, {}, {1: 0.0, 2: 1.0}]
    fig = curves_figure(curves, "accuracy", "s")
    (dots,) = [c for c in fig.axes[0].collections if isinstance(c, PathCollection)]
    assert dots.get_offsets().tolist() == [[10, 0.25], [10, 0.75]]
    only_dots = curves_figure([{10: 0.25}, {10: 0.75}], "accuracy", "s")
    assert _coloured_pixels(only_dots, tmp_path) > 20


def test_no_trial_gives_empty_axes(tmp_path: Path) -> None:
    fig = curves_figure([], "accuracy", "s")
    assert not fig.axes[0].collections
    save(fig, tmp_path / "empty.png")


def test_finals_are_a_bar_per_trial_at_its_value(tmp_path: Path) -> None:
    finals = [0.3, -0.2, 0.9]
    fig = finals_figure(finals, "loss", "s: final loss")
    (bars,) = fig.axes[0].collections
    segments = [seg.tolist() for seg in bars.get_segments()]
    assert segments == [[[0, 0], [0, 0.3]], [[1, 0], [1, -0.2]], [[2, 0], [2, 0.9]]]
    assert fig.axes[0].get_ylabel() == "final loss"
    assert _coloured_pixels(fig, tmp_path) > 1000  # thick bars, not hairlines
    wide = finals_figure(list(np.linspace(0, 1, 200)), "loss", "s")
    assert wide.get_figwidth() == 24  # 200 trials: capped, not 60 inches
    assert len(wide.axes[0].collections[0].get_segments()) == 200
