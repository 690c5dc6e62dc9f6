"""benchmarks/tversky_per_feature_gpu.py is run by hand on a GPU machine; this keeps it runnable: its --dry-run on
the CPU, where the Triton kernels run under the interpreter at toy sizes and are checked against the chunked path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton does not import here: the benchmark's Triton cases cannot run")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "tversky_per_feature_gpu.py"


def test_the_per_feature_gpu_benchmark_dry_run() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    checks = [line for line in done.stdout.splitlines() if line.startswith("check ")]
    assert len(checks) == 3 and all(float(line.rsplit("= ", 1)[1]) <= 1e-5 for line in checks), checks
    rows = [line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| ")]
    assert rows[1:] == [
        "product path (fused GEMM)",
        "per_feature min+ignorematch",
        "per_feature softmin+ignorematch",
        "per_feature min+substractmatch",
        "per_feature min+ignorematch, chunked",
    ], rows
