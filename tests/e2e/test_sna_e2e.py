"""The separable-architecture tasks (sna.lorenz, sna.lm) through the whole service, at tiny sizes: both sweeps
succeed, the rollout plot and the sweep summary reach MLflow, and the registered forecaster loads and runs."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import mlflow
import pytest
import torch

from jobs.registry import get_task

from .conftest import Stack

pytestmark = pytest.mark.stack

LORENZ = """
name: e2e-sna-lorenz
task: sna.lorenz
metric: {name: eval/vpt, mode: max}
params: {train_trajectories: 4, train_time: 4.0, test_trajectories: 3, horizon: 2.0, transient: 5.0, steps: 60,
         eval_every: 30, batch_size: 64, rank: 4, hidden: 8, lyapunov_span: 5.0}
space: {model: {grid: [cp, mlp]}}
register: {model: e2e-sna-lorenz}
"""
LM = """
name: e2e-sna-lm
task: sna.lm
metric: {name: val/bpc, mode: min}
params: {n_layer: 1, n_embd: 32, n_head: 2, rank: 8, block_size: 32, batch_size: 8, max_steps: 20, eval_every: 10,
         warmup_steps: 2, eval_batches: 2}
space: {attention: {grid: [separable, softmax]}}
"""


def test_lorenz_and_lm_sweeps_run_through_the_service(workers: Stack) -> None:
    ids = {name: workers.submit(spec)["id"] for name, spec in [("lorenz", LORENZ), ("lm", LM)]}
    workers.start_worker("w-sna")
    done = {name: workers.wait_state(i, ("succeeded", "failed", "cancelled"), timeout=300) for name, i in ids.items()}
    for name, s in done.items():
        assert s["state"] == "succeeded", (name, s)
        assert s["trials"]["finished"] == s["trials"]["total"] == 2, (name, s["trials"])
    client = workers.mlflow()

    # lorenz: every trial's run holds its rollout plot; the parent run holds the per-trial table
    exp = client.get_experiment_by_name("e2e-sna-lorenz")
    children = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("mlflow.parentRunId")]
    assert len(children) == 2
    for run in children:
        assert "rollout.png" in [a.path for a in client.list_artifacts(run.info.run_id)]
        assert run.data.metrics["params/total"] > 0 and run.data.metrics["diag/effective_rank"] >= 1
    lorenz = done["lorenz"]
    local = client.download_artifacts(lorenz["mlflow"]["parent_run_id"], "summary")
    table = list(csv.DictReader(io.StringIO((Path(local) / "sna_lorenz.csv").read_text())))
    assert sorted(r["model"] for r in table) == ["cp", "mlp"] and (Path(local) / "vpt.png").is_file()
    assert all(float(r["lyapunov"]) > 0 for r in table)
    mlflow.set_tracking_uri(workers.tracking_uri)
    model = mlflow.pytorch.load_model("models:/e2e-sna-lorenz@champion")  # the spec's default alias
    task = get_task("sna.lorenz")
    x = task.example_input(task.make_config(lorenz["best_config"]))
    with torch.no_grad():
        assert model(x).shape == (8, 3)  # the next state of each of the 8 example states
    assert client.get_model_version_by_alias("e2e-sna-lorenz", "champion").tags["layerlab.metric"] == "eval/vpt"

    # lm: bits per character, minimised, below the 4.9 bits of a uniform guess over 30 characters
    lm = done["lm"]
    assert lm["metric"] == {"name": "val/bpc", "mode": "min"} and 0 < lm["best_metric"] < 4.9
