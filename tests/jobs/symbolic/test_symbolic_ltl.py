"""jobs/symbolic/ltl.py: a tiny run on spot-generated LTL data reports every metric, and its registered
model takes one tensor."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("spot", reason="spot is not installed (pip install spottl): symbolic.ltl cannot run")

from jobs.registry import get_task  # noqa: E402
from jobs.runtime import LocalSession  # noqa: E402
from jobs.symbolic.ltl import TASK, build_model, example_input, train  # noqa: E402
from jobs.symbolic.ltl_data import LTL_VOCAB  # noqa: E402 - after the skip
from jobs.symbolic.task import METRICS, SymbolicConfig  # noqa: E402

TINY = SymbolicConfig(
    d_model=16, heads=2, ff=32, layers=1, dropout=0.0, max_size=16, max_trace_tokens=24, train_examples=150,
    test_examples=30, batch_size=16, steps=8, eval_every=4, warmup_steps=2, lr=3e-3, alpha_examples=1,
    max_renamings=4, grid_max_symbols=3, grid_per_cell=1,
)  # fmt: skip


def test_tiny_ltl_run_reports_every_metric() -> None:
    assert get_task("symbolic.ltl") is TASK
    model = build_model(TINY).eval()
    assert model.transformer.config.vocab_size == len(LTL_VOCAB)
    x = example_input(TINY)
    assert x.dtype == torch.float32 and x.shape == (2, 5, 2)
    with torch.no_grad():
        assert model(x).shape[0] == 2

    session = LocalSession(quiet=True)
    train(TINY, session)
    assert [h["step"] for h in session.history] == [4, 8]
    for h in session.history:
        assert set(METRICS) <= set(h) and 0 <= h["exact"] <= h["correct"] <= 1
        assert math.isclose(sum(h[f"outcome/{o}"] for o in ("exact", "correct", "incorrect", "invalid")), 1)
        assert all(math.isnan(h[f"alpha_cov_{n}"]) or h[f"alpha_cov_{n}"] == 1.0 for n in (3, 4, 5))
        assert all(math.isnan(h[f"alpha_cov_pool_{n}"]) or h[f"alpha_cov_pool_{n}"] == 1.0 for n in (3, 4, 5))
        # the constant traces, checked with spot: on the test set and the grid (no grid formula has more APs than
        # training here: grid_max_symbols 3 < 5, so the open-vocabulary baselines are NaN, as open_vocab_correct)
        assert 0 <= h["baseline/all_false"] <= h["baseline/constant_best"] <= 1
        assert 0 <= h["baseline/all_true"] <= h["baseline/constant_best"] <= 1
        assert 0 <= h["baseline/heatmap_constant_best"] <= 1 and math.isnan(h["baseline/open_vocab_constant_best"])
        assert math.isnan(h["exact_paper"]) and 0 <= h["heatmap_accuracy"] <= 1  # no paper targets for LTL
    assert session.history[-1]["table"][0]["correct"] == session.history[-1]["correct"]
    assert b"| formula | target | prediction | outcome |" in session.artifacts["predictions.md"]
    cells = session.history[-1]["table"][0]["heatmap"]
    assert cells and all(c[3] == 1 for c in cells) and "heatmap.png" in session.artifacts  # grid_per_cell 1
    report = TASK.summarize(session.history[-1]["table"]).get("report.md", b"").decode()  # type: ignore[misc]
    assert "| -DA " not in report and "LTLRandom35" in report  # the LTL paper's numbers, not prop's
    assert "| baseline: constant best (oracle) |" in report and "n = 1: " in report
