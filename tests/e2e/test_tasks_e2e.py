"""Every task family through the whole service, at tiny sizes: the sweep succeeds, its files reach
MLflow and the registered model loads and runs."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
import torch

from jobs.registry import get_task

from .conftest import Stack

pytestmark = pytest.mark.stack

IMAGE = """
name: e2e-image
task: tversky.image
metric: {name: test/accuracy}
params: {image_size: 16, epochs: 1, max_train_images: 96, max_test_images: 32, batch_size: 32, features: 16}
space: {head: {grid: [tversky]}}
register: {model: e2e-image}
"""
LM = """
name: e2e-lm
task: tversky.lm
metric: {name: val/perplexity}
params: {max_steps: 20, eval_every: 10, eval_batches: 2, warmup_steps: 2, n_embd: 32, block_size: 16, vocab_size: 300}
space: {lm_head: {grid: [tversky]}}
register: {model: e2e-lm}
"""
XOR_GRID = """
name: e2e-xor-grid
task: tversky.xor_grid
metric: {name: convergence_rate}
params: {features: [4, 16], seeds: 2, steps: 200, report_every: 100, init_scale: 1.0}
space:
  intersection: {grid: [product, mean]}
  difference: {grid: [substractmatch]}
"""


def test_image_lm_and_xor_grid_sweeps_run_through_the_service(workers: Stack) -> None:
    ids = {name: workers.submit(spec)["id"] for name, spec in [("image", IMAGE), ("lm", LM), ("grid", XOR_GRID)]}
    workers.start_worker("w-tasks")
    done = {name: workers.wait_state(i, ("succeeded", "failed", "cancelled"), timeout=400) for name, i in ids.items()}
    for name, s in done.items():
        assert s["state"] == "succeeded", (name, s)
    client = workers.mlflow()

    # image: the Tversky head's prototype pictures on the trial's run; the model loads and classifies
    image = done["image"]
    assert 0.0 <= image["best_metric"] <= 1.0
    exp = client.get_experiment_by_name("e2e-image")
    child = next(r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("mlflow.parentRunId"))
    assert "prototypes.png" in [a.path for a in client.list_artifacts(child.info.run_id)]
    plots = [a.path for a in client.list_artifacts(image["mlflow"]["parent_run_id"], "plots")]
    assert "plots/test_accuracy_curves.png" in plots  # slash-grouped metric names make safe file names
    mlflow.set_tracking_uri(workers.tracking_uri)
    model = mlflow.pytorch.load_model("models:/e2e-image@champion")
    x = get_task("tversky.image").example_input(get_task("tversky.image").make_config(image["best_config"]))
    with torch.no_grad():
        assert model(x).shape == (2, 10)
    version = client.get_model_version_by_alias("e2e-image", "champion")
    assert version.tags["layerlab.metric"] == "test/accuracy"
    requirements = Path(mlflow.pyfunc.get_model_dependencies("models:/e2e-image@champion")).read_text()
    assert "torchvision==" in requirements  # the pickled ResNet needs it wherever the model loads

    # lm: perplexity is minimised; the registered decoder returns logits over the vocabulary
    lm = done["lm"]
    assert lm["metric"] == {"name": "val/perplexity", "mode": "min"} and lm["best_metric"] > 1.0
    model = mlflow.pytorch.load_model("models:/e2e-lm@champion")
    tokens = get_task("tversky.lm").example_input(get_task("tversky.lm").make_config(lm["best_config"]))
    with torch.no_grad():
        assert model(tokens).shape == (*tokens.shape, 300)

    # xor grid: per-model rows of both trials reach the sweep-level summary on the parent run
    grid = done["grid"]
    files = [a.path for a in client.list_artifacts(grid["mlflow"]["parent_run_id"], "summary")]
    assert files and all(f.startswith("summary/") for f in files)
    assert any(f.endswith(".csv") for f in files) and any(f.endswith(".png") for f in files)
    local = client.download_artifacts(grid["mlflow"]["parent_run_id"], "summary")
    runs_csv = next(p for p in Path(local).glob("*.csv") if "runs" in p.name)
    assert len(runs_csv.read_text().strip().splitlines()) == 1 + 2 * (2 * 2 * 3 * 3 * 2)  # header + every model
