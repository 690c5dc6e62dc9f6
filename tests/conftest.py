"""Test-wide environment: offline, quiet Ray/MLflow, nothing written to $HOME; and how the suite splits
over pytest-xdist's processes (`make test` runs two)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

for key, value in {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
}.items():
    os.environ.setdefault(key, value)

# Triton reads TRITON_INTERPRET when it decorates a kernel, so it must be set before any test imports
# jobs/layers/tversky_triton.py: without a GPU, its tests run the kernels under Triton's interpreter.
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


# Tests that start a whole stack (API, workers, Ray, MLflow servers, PostgreSQL clusters, containers) run
# one after another in one xdist process: each wants both cores for its trials and some time leases and
# kills, so two at once would only trade speed for flakiness. Every other module runs whole (its module
# fixtures once) in whichever process is free; on 2 cores they fill the time the stack tests spend waiting.
STACK_DIRS = {"e2e", "faults", "browser", "production", "containers"}
TESTS = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    stack = set()
    for item in items:
        rel = item.path.relative_to(TESTS)
        group = "stack" if rel.parts[0] in STACK_DIRS else rel.as_posix()
        item.add_marker(pytest.mark.xdist_group(group))
        if group == "stack":
            stack.add(item.nodeid)
    # The stack tests first: with --no-loadscope-reorder (make test) xdist hands out the groups in this
    # order, so the longest one starts at once instead of after the modules with more tests.
    items.sort(key=lambda item: item.nodeid not in stack)
