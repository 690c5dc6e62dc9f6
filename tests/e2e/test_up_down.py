"""`layerlab up --detach`, a sweep, `layerlab down`: the stack stops promptly and leaves no process behind.

`down` used to send SIGTERM to each process group, the worker's local Ray included: the worker then spent
the whole grace period (30 s) retrying its dead Ray at a full core, and was killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.e2e.conftest import LAYERLAB, free_port

SPEC = """\
name: up-down
task: tversky.xor
metric: {name: accuracy, mode: max}
params: {steps: 10, report_every: 10, features: 4}
space: {seed: {grid: [0, 1]}}
resources: {cpus: 1}
"""


def _group(pgid: int) -> list[int]:
    """Live processes in a process group (zombies left out: they hold nothing)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def test_down_after_a_sweep_stops_every_process_within_seconds(tmp_path: Path) -> None:
    api_port, mlflow_port = free_port(), free_port()
    env = {
        **os.environ,
        "LAYERLAB_HOME": str(tmp_path),
        "LAYERLAB_API_URL": f"http://127.0.0.1:{api_port}",
        "LAYERLAB_RAY_NUM_CPUS": "2",
        "RAY_TMPDIR": tempfile.mkdtemp(prefix="rt", dir="/tmp"),  # Ray's socket paths must stay short
    }
    for key in ("RAY_ADDRESS", "LAYERLAB_DATABASE_URL", "LAYERLAB_MLFLOW_TRACKING_URI", "LAYERLAB_TUNE_STORAGE"):
        env.pop(key, None)
    ports = ["--api-port", str(api_port), "--mlflow-port", str(mlflow_port)]
    subprocess.run([LAYERLAB, "up", "--detach", *ports], env=env, check=True, timeout=240, capture_output=True)
    pids: dict[str, int] = json.loads((tmp_path / "up.json").read_text())
    try:
        spec = tmp_path / "spec.yaml"
        spec.write_text(SPEC)
        done = subprocess.run([LAYERLAB, "submit", str(spec), "--wait"], env=env, timeout=300, capture_output=True)
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
        assert len(_group(pids["worker"])) > 1, "the worker's local Ray should be running in its group"

        start = time.monotonic()
        subprocess.run([LAYERLAB, "down"], env=env, check=True, timeout=120, capture_output=True)
        took = time.monotonic() - start

        left = {name: _group(pgid) for name, pgid in pids.items() if _group(pgid)}
        assert not left, f"processes left after `layerlab down`: {left}"
        assert took < 20, f"`layerlab down` took {took:.0f}s (the worker should stop its Ray and exit in seconds)"
        log = (tmp_path / "logs" / "worker.log").read_text()
        assert "worker" in log and "Traceback" not in log.split("signal 15")[-1], log[-3000:]
    finally:
        for pgid in pids.values():
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
