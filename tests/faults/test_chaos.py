"""The chaos soak's 2-minute variant (tests/chaos.py; `make chaos` runs it for 10): the production stack on loopback
(its own PostgreSQL, moto S3, the MLflow server, two Ray nodes, the API, two workers) while three users' sweeps run,
one random action every 5-20 s (kill -9 of a worker, the API, the MLflow server, a Ray node or the head; PostgreSQL
restarted; S3 paused), then every check of the soak: each sweep succeeded, each reported step in MLflow once, every
run ended, every artifact and model there, no traceback of ours in a log.

The actions and their spacing come from a fixed seed (LAYERLAB_CHAOS_SEED to try another); what the soak checks
holds whatever the timing, so a failure here is a fault of the service, not bad luck.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.stack

ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("LAYERLAB_CHAOS_SEED", "1"))
MINUTES = 2
TIMEOUT_S = 900  # the soak took 181 s here; its settling waits up to 15 minutes for the sweeps before it checks


def test_two_minutes_of_random_kills_lose_nothing_and_double_nothing(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tests.chaos", "--minutes", str(MINUTES), "--seed", str(SEED), "--home", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: the soak ends through its cleanup and stops every part it started
        out, _ = proc.communicate(timeout=120)
        pytest.fail(f"the soak ran past {TIMEOUT_S} s:\n{out[-6000:]}")
    report_file = tmp_path / "chaos-report.json"
    assert report_file.exists(), f"the soak wrote no report (exit {proc.returncode}):\n{out[-6000:]}"
    report = json.loads(report_file.read_text())
    assert report["failures"] == [] and proc.returncode == 0, out[-6000:]
    # The soak did what it is for: kills happened while sweeps ran, and it checked their steps.
    assert sum(report["actions"].values()) >= 5 and report["actions"].get("kill worker", 0) >= 1, report["actions"]
    assert report["sweeps"] >= 3 and report["steps_checked"] >= 3 * 4 * 30, report
