"""The compose stack from the built image, end to end: a token made with the operator command in the API
container, a sweep submitted through the API, run by the queue worker on the Ray head and worker
containers, its parent and child runs and registered model read back through the MLflow server (basic
auth, PostgreSQL, S3), and the model pulled with `layerlab pull` from this host."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from mlflow.tracking import MlflowClient

from tests.e2e.brought_code import EXAMPLE, check_runs_name_the_code, cli_submit
from tests.e2e.conftest import LAYERLAB

from .conftest import ComposeStack

pytestmark = pytest.mark.stack

SPEC = """
name: containers-xor
task: tversky.xor
metric: {name: accuracy, mode: max}
params: {features: 8, steps: 200, report_every: 100}
space:
  intersection: {grid: [product, mean]}
resources: {cpus: 1}
max_concurrent_trials: 2
register: {model: containers-xor, alias: champion}
"""


def _wait_for_sweep(stack: ComposeStack, sweep_id: int, headers: dict[str, str], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s: dict[str, Any] = httpx.get(f"{stack.api_url}/sweeps/{sweep_id}", headers=headers, timeout=30).json()
        if s["state"] in ("succeeded", "failed", "cancelled"):
            return s
        time.sleep(2)
    logs = "\n".join(stack.logs(service) for service in ("worker", "ray-head", "ray-worker"))
    raise AssertionError(f"sweep {sweep_id} still {s['state']} after {timeout:.0f} s: {s}\n{logs}")


def test_sweep_through_the_compose_stack(
    compose_stack: ComposeStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = compose_stack
    token = stack.exec("api", "layerlab", "token", "create", "--user", "ci").strip().splitlines()[-1]
    sweeps = f"{stack.api_url}/sweeps"
    yaml_type = {"content-type": "application/yaml"}
    assert httpx.post(sweeps, content=SPEC, headers=yaml_type, timeout=60).status_code == 401

    headers = {"Authorization": f"Bearer {token}"}
    r = httpx.post(sweeps, content=SPEC, headers={**yaml_type, **headers}, timeout=60)
    assert r.status_code == 201, r.text
    s = _wait_for_sweep(stack, r.json()["id"], headers, timeout=420)
    assert s["state"] == "succeeded", f"{s}\n{stack.logs('worker')}"
    assert s["trials"]["finished"] == 2 and s["owner"] == "ci", s
    assert s["mlflow"]["parent_run_url"].startswith(stack.mlflow_url), s["mlflow"]

    # MLflow, through its published port: basic auth, runs in PostgreSQL, artifacts on S3.
    search = f"{stack.mlflow_url}/api/2.0/mlflow/experiments/search?max_results=5"
    assert httpx.get(search, timeout=30).status_code == 401
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", stack.mlflow_password)
    client = MlflowClient(tracking_uri=stack.mlflow_url)
    exp = client.get_experiment_by_name("containers-xor")
    assert exp is not None, "the sweep's MLflow experiment is missing"
    runs = client.search_runs([exp.experiment_id])
    parents = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    children = [run for run in runs if "mlflow.parentRunId" in run.data.tags]
    assert len(parents) == 1 and len(children) == 2, [(run.info.run_name, run.data.tags) for run in runs]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    parent_files = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"spec.yaml", "trials.csv"} <= parent_files, parent_files
    version = client.get_model_version_by_alias("containers-xor", "champion")
    assert version.status == "READY", version

    # The researcher's path: pull the registered model from this host with the server's URL and password.
    env = {
        **os.environ,
        "LAYERLAB_HOME": str(tmp_path / "home"),
        "LAYERLAB_MLFLOW_TRACKING_URI": stack.mlflow_url,
        "MLFLOW_TRACKING_USERNAME": "admin",
        "MLFLOW_TRACKING_PASSWORD": stack.mlflow_password,
    }
    dest = tmp_path / "model"
    pulled = subprocess.run(
        [LAYERLAB, "pull", "containers-xor@champion", str(dest)], env=env, capture_output=True, text=True, timeout=180
    )
    assert pulled.returncode == 0, pulled.stderr[-2000:]
    assert (dest / "MLmodel").is_file(), sorted(p.name for p in dest.iterdir())

    # A sweep that brings its code (examples/own_psi.yaml), from this host through the CLI: Ray's runtime_env
    # carries the folder to the Ray worker container; every run names the code; the model is registered.
    cli_env = {**env, "LAYERLAB_API_URL": stack.api_url, "LAYERLAB_API_TOKEN": token}
    sweep_id, said = cli_submit(cli_env, EXAMPLE)
    assert "(uploaded)" in said, said
    own = _wait_for_sweep(stack, sweep_id, headers, timeout=420)
    assert own["state"] == "succeeded" and own["trials"]["finished"] == 4, f"{own}\n{stack.logs('worker')}"
    check_runs_name_the_code(client, own, (stack.api_url, headers), tmp_path, download=False)
    # Registered; loading it alone is checked on the embedded and the loopback production stacks (from the host,
    # this stack's MLflow hands some downloads to MinIO by its in-network name).
    assert client.get_model_version_by_alias("own-psi-xor", "champion").status == "READY"
