"""symbolic.prop through the whole service at a tiny size: the invariant model and a baseline, the parent run's
Correct / Exact / alpha-covariance report and heatmap, and a registered model that loads and decodes."""

from __future__ import annotations

import csv
import io

import mlflow
import pytest
import torch

from jobs.registry import get_task

from .conftest import Stack

pytestmark = pytest.mark.stack

PROP = """
name: e2e-symbolic
task: symbolic.prop
metric: {name: correct}
params: {d_model: 16, heads: 2, ff: 32, layers: 1, max_size: 20, train_examples: 300, test_examples: 30,
         batch_size: 16, steps: 6, eval_every: 3, warmup_steps: 2, alpha_examples: 1, max_renamings: 4,
         grid_max_symbols: 7, grid_per_cell: 1}
space: {variant: {grid: ["EP-DP-EA-DA-CP", "fixed"]}}
register: {model: e2e-symbolic}
"""


def test_symbolic_prop_sweep_reports_the_table(workers: Stack) -> None:
    sweep_id = workers.submit(PROP)["id"]
    workers.start_worker("w-symbolic")
    done = workers.wait_state(sweep_id, ("succeeded", "failed", "cancelled"), timeout=300)
    assert done["state"] == "succeeded", done
    assert done["trials"]["finished"] == done["trials"]["total"] == 2
    client = workers.mlflow()

    parent = done["mlflow"]["parent_run_id"]
    summary = [a.path for a in client.list_artifacts(parent, "summary")]
    assert {"summary/report.md", "summary/report.csv", "summary/trials.csv", "summary/heatmap.png"} <= set(summary)
    report = client.download_artifacts(parent, "summary/report.csv", str(workers.home))
    with open(report) as f:
        rows = {r["variant"]: r for r in csv.DictReader(io.StringIO(f.read()))}
    assert list(rows) == ["EP-DP-EA-DA-CP", "fixed"]
    assert float(rows["EP-DP-EA-DA-CP"]["alpha_cov_3_mean"]) == 1.0, rows  # invariant by construction
    assert all(0.0 <= float(r["correct_mean"]) <= 1.0 for r in rows.values())

    mlflow.set_tracking_uri(workers.tracking_uri)
    model = mlflow.pytorch.load_model("models:/e2e-symbolic@champion")
    task = get_task("symbolic.prop")
    x = task.example_input(task.make_config(done["best_config"]))
    with torch.no_grad():
        out = model(x)
    assert out.shape[0] == 2 and out.shape[2] == 2  # (fixed id, stream) per decoded token
