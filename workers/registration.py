"""Register the best trial's model in the MLflow Model Registry, once per sweep.

The model is pickled with `code_paths=[jobs/]`, so it loads with `mlflow.pytorch.load_model` in an
environment that has torch and mlflow but not this repository (MLflow 3.x's default pt2 format would
give back a GraphModule, not our class; see stack-notes §3).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import mlflow
import torch
from mlflow.models import infer_signature
from mlflow.tracking import MlflowClient

from jobs.brought_code import model_code_paths
from jobs.registry import Task
from workers import checkpoints

log = logging.getLogger(__name__)


def load_best_model(
    task: Task, config: dict[str, Any], checkpoint_dir: str | Path, committed: int | None = None
) -> torch.nn.Module:
    """The model of the checkpoint that workers.checkpoints chooses in a folder: the newest up to the ledger's
    `committed` iteration (None: the newest there)."""
    chosen = checkpoints.newest_usable([checkpoint_dir], attempt=None, committed=committed)
    if chosen is None:
        up_to = "" if committed is None else f" up to iteration {committed}"
        raise FileNotFoundError(f"no checkpoint{up_to} in {checkpoint_dir}")
    state = checkpoints.load(chosen)
    model: torch.nn.Module = task.build_model(task.make_config(config))
    model.load_state_dict(state["model"])
    model.eval()
    return model


def register_model(
    tracking_uri: str,
    *,
    task: Task,
    task_ref: str,
    model: torch.nn.Module,
    config: dict[str, Any],
    name: str,
    alias: str,
    parent_run_id: str,
    sweep_id: int,
    metric_name: str,
    metric_value: float,
) -> str:
    """Log the model on the parent run and register it; returns the version (reused if already registered)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    existing = _version_of_run(client, name, parent_run_id)
    if existing is None:
        example = task.example_input(task.make_config(config))
        with torch.no_grad():
            output = model(example)
        signature = infer_signature(example.numpy(), output.detach().numpy())
        mlflow.set_tracking_uri(tracking_uri)
        # start_run(run_id=...) re-opens the parent; its end status is set by the caller afterwards.
        with mlflow.start_run(run_id=parent_run_id):
            info = mlflow.pytorch.log_model(
                model,
                name="model",
                serialization_format="pickle",
                code_paths=model_code_paths(task_ref),
                signature=signature,
                # Explicit requirements: inference would load the model in a subprocess (seconds).
                # MLflow writes requirements.txt from this list itself, without a final newline
                # (`"\n".join(...)` in mlflow/pytorch/__init__.py, as in every flavour); pip reads it fine,
                # and the logged, registered artifact is MLflow's output, so we leave it as it is.
                pip_requirements=model_requirements(model),
                registered_model_name=name,
            )
        existing = str(info.registered_model_version)
    tags = {
        "layerlab.sweep_id": str(sweep_id),
        "layerlab.task": task.name,
        "layerlab.metric": metric_name,
        "layerlab.metric_value": repr(metric_value),
        "layerlab.config": json.dumps(config, sort_keys=True)[:5000],
    }
    for k, v in tags.items():
        client.set_model_version_tag(name, existing, k, v)
    client.set_registered_model_alias(name, alias, existing)
    log.info("registered %s version %s as @%s", name, existing, alias)
    return existing


def model_requirements(model: torch.nn.Module) -> list[str]:
    """torch and mlflow, plus the distribution of every other package whose classes the pickled
    model holds (torchvision's ResNet in tversky.image); `jobs` travels as code_paths."""
    import importlib.metadata as md

    packages = {type(m).__module__.split(".")[0] for m in model.modules()} - {"jobs", "torch", "builtins"}
    reqs = [f"torch=={md.version('torch').split('+')[0]}", f"mlflow=={mlflow.__version__}"]
    dists = md.packages_distributions()
    for pkg in sorted(packages):
        for dist in dists.get(pkg, []):
            reqs.append(f"{dist}=={md.version(dist).split('+')[0]}")
    return reqs


def _version_of_run(client: MlflowClient, name: str, run_id: str) -> str | None:
    try:
        versions = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    except Exception:  # the registered model does not exist yet
        return None
    return str(versions[0].version) if versions else None
