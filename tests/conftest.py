"""Test-wide environment: offline, quiet Ray/MLflow, nothing written to $HOME."""

from __future__ import annotations

import os

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
