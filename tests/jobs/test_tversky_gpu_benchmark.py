"""benchmarks/tversky_gpu.py is run by hand on a GPU machine; this keeps it runnable: its --quick shape on
the CPU, in bf16, ours against the official package (under autocast) and the bare GEMMs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "tversky_gpu.py"


def test_the_gpu_benchmark_runs_its_quick_shape_on_the_cpu() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--device", "cpu", "--repeats", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "ms" not in line]
    assert [r.split("|")[1].strip() for r in rows] == [
        "GEMMs alone",
        "ours product+ignorematch",
        "official product+ignorematch",
    ]
    assert "ours vs official:" in done.stdout
