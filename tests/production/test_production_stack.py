"""The production stack end to end: PostgreSQL queue, token-authenticated API, workers driving a
two-node Ray cluster with Tune storage on S3, the MLflow server (PostgreSQL backend, S3 artifacts,
basic auth)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from mlflow.entities import Run

from service.queue import QueueStore
from tests.e2e.brought_code import EXAMPLE, check_model_loads_alone, check_runs_name_the_code, cli_submit
from tests.e2e.conftest import wait_until

from .conftest import Production

pytestmark = pytest.mark.stack

FOUR_TRIALS = """
name: prod-xor-{tag}
task: tversky.xor
metric: {{name: accuracy, mode: max}}
params: {{features: 8, steps: {steps}, report_every: {every}}}
space:
  intersection: {{grid: [product, mean]}}
  difference: {{grid: [ignorematch, substractmatch]}}
resources: {{cpus: 1}}
max_concurrent_trials: 2
max_failures: 2
register: {{model: prod-xor-{tag}, alias: champion}}
"""

LOAD_MODEL = """
import mlflow, torch
m = mlflow.pytorch.load_model("models:/prod-xor-a@champion")
print(type(m).__name__, m(torch.tensor([[0.0, 1.0]])).shape[0])
"""


def _child_runs(prod: Production, experiment: str) -> list[Run]:
    client = prod.mlflow_client()
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment}"
    return [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("mlflow.parentRunId")]


def test_mlflow_server_needs_basic_auth(production: Production) -> None:
    url = f"{production.mlflow_server.url}/api/2.0/mlflow/experiments/search?max_results=5"
    assert httpx.get(url, timeout=10).status_code == 401
    assert httpx.get(url, auth=("admin", "wrong-password-123"), timeout=10).status_code == 401
    ok = httpx.get(url, auth=(production.mlflow_server.username, production.mlflow_server.password), timeout=10)
    assert ok.status_code == 200, ok.text


def test_sweep_runs_on_both_ray_nodes_with_artifacts_on_s3(prod: Production) -> None:
    submitted = prod.submit(FOUR_TRIALS.format(tag="a", steps=300, every=100))
    prod.start_worker("w-prod-a")
    s = prod.wait_state(submitted["id"], ("succeeded", "failed", "cancelled"), timeout=300)
    assert s["state"] == "succeeded", s
    assert s["trials"]["finished"] == 4 and s["owner"] == "ops"

    trials = QueueStore(prod.queue_url, run_migrations=False).trials(submitted["id"])
    nodes = Counter(t.node_id for t in trials)
    assert None not in nodes and len(nodes) == 2, f"trials did not land on both Ray nodes: {nodes}"

    children = _child_runs(prod, "prod-xor-a")
    assert len(children) == 4
    # Each trial's own file reached MLflow (and S3) from whichever node ran it.
    client = prod.mlflow_client()
    for run in children:
        files = [a.path for a in client.list_artifacts(run.info.run_id)]
        assert "decision_boundary.png" in files, (run.info.run_id, files)
    assert s["mlflow"]["parent_run_url"].startswith(prod.mlflow_server.url)
    # Artifacts went through the MLflow server to S3; Tune's experiment and checkpoints too.
    assert any(k.endswith("MLmodel") for k in prod.s3.keys("mlartifacts/")), "no model on S3"
    parent_files = {k.rsplit("/", 1)[-1] for k in prod.s3.keys("mlartifacts/") if "/artifacts/" in k}
    assert {"spec.yaml", "trials.csv"} <= parent_files, parent_files
    assert any(k.endswith(".png") and "/plots/" in k for k in prod.s3.keys("mlartifacts/")), "no plots on S3"
    tune_keys = prod.s3.keys(f"tune/sweep-{submitted['id']}/")
    assert any("checkpoint_" in k for k in tune_keys) and any("experiment_state" in k for k in tune_keys)

    # The registered model loads in another process that has only the server's URL and credentials.
    env = {k: v for k, v in prod.env.items() if not k.startswith(("AWS_", "MLFLOW_S3"))}
    env["MLFLOW_TRACKING_URI"] = prod.mlflow_server.url
    out = subprocess.run([sys.executable, "-c", LOAD_MODEL], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["TverskyProjection", "1"], out.stdout

    metrics = httpx.get(f"{prod.api_url}/metrics", headers=prod.headers, timeout=10).text
    assert 'layerlab_sweeps{state="succeeded"}' in metrics


def test_a_sweep_resumes_on_another_worker_from_s3(prod: Production) -> None:
    """kill -9 the worker (the Ray driver) mid-sweep; a worker with an empty home restores the Tune
    experiment from S3 and finishes: every trial ends once, with one MLflow child run each."""
    submitted = prod.submit(FOUR_TRIALS.format(tag="b", steps=6000, every=500))
    first = prod.start_worker("w-prod-b1")
    store = QueueStore(prod.queue_url, run_migrations=False)

    def progressed() -> bool:
        return any(t.iteration >= 2 for t in store.trials(submitted["id"]))

    wait_until(progressed, 240, "a trial to report 2 iterations")
    prod.kill_worker(first)
    time.sleep(1)
    prod.start_worker("w-prod-b2")
    s = prod.wait_state(submitted["id"], ("succeeded", "failed", "cancelled"), timeout=400)
    assert s["state"] == "succeeded", s
    assert s["attempts"] == 2
    trials = store.trials(submitted["id"])
    assert len(trials) == 4 and all(t.state == "terminated" and t.iteration == 12 for t in trials)
    assert any(t.starts >= 2 for t in trials), "no trial was resumed: the kill came too late to test anything"
    assert len(_child_runs(prod, "prod-xor-b")) == 4


def test_a_sweep_brings_its_code_to_both_ray_nodes(prod: Production, tmp_path: Path) -> None:
    """examples/own_psi.yaml through the CLI: Ray's runtime_env carries the researcher's folder to the second
    node, every run names the code, and the model loads from the MLflow server with torch and mlflow alone."""
    sweep_id, said = cli_submit(prod.env, EXAMPLE)
    assert "(uploaded)" in said, said
    prod.start_worker("w-prod-code")
    s = prod.wait_state(sweep_id, ("succeeded", "failed", "cancelled"), timeout=300)
    assert s["state"] == "succeeded", s
    trials = QueueStore(prod.queue_url, run_migrations=False).trials(sweep_id)
    nodes = Counter(t.node_id for t in trials)
    assert None not in nodes and len(nodes) == 2, f"trials did not land on both Ray nodes: {nodes}"
    check_runs_name_the_code(prod.mlflow_client(), s, (prod.api_url, prod.headers), tmp_path)
    server = prod.mlflow_server
    env = {
        "MLFLOW_TRACKING_URI": server.url,
        "MLFLOW_TRACKING_USERNAME": server.username,
        "MLFLOW_TRACKING_PASSWORD": server.password,
    }
    check_model_loads_alone("own-psi-xor", env, tmp_path)
