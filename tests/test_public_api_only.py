"""Ray and MLflow are used through their public, documented API only: a later version that renames its
internals must not break the service silently. An AST scan of service/, workers/ and jobs/ fails on:
- an import of a Ray or MLflow module or name whose name starts with `_`;
- an assignment to an attribute of anything imported from Ray or MLflow (a monkeypatch), or setattr on it;
- a `_private` attribute (not a dunder) read on anything other than `self` / `cls`, unless our own code
  defines that name (then it is one of ours, e.g. a module-level helper of another module of ours);
- a RAY_* / TUNE_* / MLFLOW_* environment variable that is not in DOCUMENTED_ENV (each with where it is
  documented).
Exceptions live in ALLOWED, each with its reason and the test that guards it (at most three).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("service", "workers", "jobs")
FOREIGN = ("ray", "mlflow")

DOCUMENTED_ENV = {
    # Ray: "Usage Stats Collection" and the token-authentication guide.
    "RAY_USAGE_STATS_ENABLED": "docs.ray.io: cluster/usage-stats",
    "RAY_AUTH_MODE": "docs.ray.io: ray-security/token-auth",
    "RAY_ADDRESS": "docs.ray.io: ray.init (address)",
    # Tune's environment-variable page (tune/api/env.html).
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "docs.ray.io: tune/api/env",
    "TUNE_MAX_PENDING_TRIALS_PG": "docs.ray.io: tune/api/env",
    "TUNE_GLOBAL_CHECKPOINT_S": "docs.ray.io: tune/api/env",
    "TUNE_DISABLE_SIGINT_HANDLER": "docs.ray.io: tune/api/env",
    # MLflow: mlflow.environment_variables (its reference page) and the auth / server docs.
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "mlflow.environment_variables",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "mlflow.environment_variables",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "mlflow.environment_variables",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "mlflow.environment_variables",
    "MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD": "mlflow.environment_variables",
    "MLFLOW_DISABLE_TELEMETRY": "mlflow.org: community/usage-tracking",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "mlflow.environment_variables",
    "MLFLOW_S3_ENDPOINT_URL": "mlflow.org: tracking/artifact-stores (S3 and S3-compatible)",
    "MLFLOW_TRACKING_USERNAME": "mlflow.org: auth (basic HTTP authentication)",
    "MLFLOW_TRACKING_PASSWORD": "mlflow.org: auth (basic HTTP authentication)",
    "MLFLOW_AUTH_CONFIG_PATH": "mlflow.org: auth (configuration)",
    "MLFLOW_AUTH_ADMIN_PASSWORD": "mlflow.org: auth (admin user)",
    "MLFLOW_FLASK_SERVER_SECRET_KEY": "mlflow.org: auth (CSRF secret)",
}
OURS_NOT_ENV = {"RAY_ENV_DEFAULTS", "MLFLOW_OUTAGE_SECONDS", "TUNE_KEYS", "MLFLOW_HTTP_REQUEST_"}
"""Names of ours that merely start like an environment variable."""

ALLOWED: dict[tuple[str, str], str] = {}
"""(file, what) -> why, and the test that guards it. Empty: no exception is needed today."""


def _files() -> list[Path]:
    return sorted(p for folder in SCANNED for p in (ROOT / folder).rglob("*.py"))


def _our_names(trees: dict[Path, ast.Module]) -> set[str]:
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return names


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _violations(path: Path, tree: ast.Module, ours: set[str]) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    foreign: set[str] = set()  # names bound to Ray / MLflow modules or objects in this file
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FOREIGN:
                    foreign.add((alias.asname or alias.name).split(".")[0])
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"{rel}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FOREIGN:
            if any(_private(part) for part in (node.module or "").split(".")):
                found.append(f"{rel}:{node.lineno}: from {node.module} import ...")
            for alias in node.names:
                foreign.add(alias.asname or alias.name)
                if _private(alias.name):
                    found.append(f"{rel}:{node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and _root(target) in foreign:
                found.append(f"{rel}:{node.lineno}: assigns {ast.unparse(target)} (a monkeypatch)")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            if node.args and _root(node.args[0]) in foreign:
                found.append(f"{rel}:{node.lineno}: setattr on {ast.unparse(node.args[0])} (a monkeypatch)")
        if isinstance(node, ast.Attribute) and _private(node.attr):
            receiver = node.value
            if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
                continue
            if _root(node) in foreign or node.attr not in ours:
                found.append(f"{rel}:{node.lineno}: reads {ast.unparse(node)}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for var in re.findall(r"\b(?:RAY|TUNE|MLFLOW)_[A-Z0-9_]+", node.value):
                if var not in DOCUMENTED_ENV and var not in OURS_NOT_ENV:
                    found.append(f"{rel}:{node.lineno}: environment variable {var} (not in DOCUMENTED_ENV)")
    return [f for f in found if (rel, f.split(": ", 1)[1]) not in ALLOWED]


def test_service_workers_and_jobs_use_only_public_ray_and_mlflow_api() -> None:
    trees = {p: ast.parse(p.read_text(), str(p)) for p in _files()}
    ours = _our_names(trees)
    problems = [v for path, tree in trees.items() for v in _violations(path, tree, ours)]
    assert problems == [], "\n".join(problems)
    assert len(ALLOWED) <= 3


def test_the_scan_catches_what_it_is_for() -> None:
    """The scan itself: each kind of private use below must be found (else the test above cannot fail)."""
    bad = """
import ray._private.worker
from mlflow.store.tracking import _get_sqlalchemy_store
from ray.tune.execution.tune_controller import TuneController
from mlflow import tracking
TuneController.checkpoint = lambda self: None
setattr(tracking, "thing", 1)
def f(manager):
    return manager._trial_num_checkpoints_since_last_sync
x = "RAY_SOME_UNDOCUMENTED_KNOB"
"""
    path = ROOT / "workers" / "example.py"
    found = _violations(path, ast.parse(bad), ours=set())
    kinds = ["import ray._private", "_get_sqlalchemy_store", "assigns TuneController", "setattr on tracking"]
    kinds += ["reads manager._trial_num", "RAY_SOME_UNDOCUMENTED_KNOB"]
    for kind in kinds:
        assert any(kind in f for f in found), (kind, found)
