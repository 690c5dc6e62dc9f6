"""`layerlab up --detach`, a sweep, `layerlab down`: the stack stops promptly and leaves no process behind;
and its supervised worker, killed mid-sweep, is replaced by one that takes the sweep over at once.

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
from collections.abc import Iterable
from pathlib import Path

import httpx

from service.queue import QueueStore
from service.settings import Settings
from tests.e2e.conftest import LAYERLAB, free_port, wait_until

LONG = """\
name: up-down-kill
task: tversky.xor
metric: {name: accuracy, mode: max}
params: {steps: 3000, report_every: 100, features: 4}
space: {seed: {grid: [0, 1]}}
resources: {cpus: 1}
"""
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


def _stack_env(home: Path) -> tuple[dict[str, str], list[str]]:
    """The environment and `up` options of an embedded stack of its own under `home`, on free ports."""
    api_port, mlflow_port = free_port(), free_port()
    env = {
        **os.environ,
        "LAYERLAB_HOME": str(home),
        "LAYERLAB_API_URL": f"http://127.0.0.1:{api_port}",
        "LAYERLAB_RAY_NUM_CPUS": "2",
        "RAY_TMPDIR": tempfile.mkdtemp(prefix="rt", dir="/tmp"),  # Ray's socket paths must stay short
    }
    for key in ("RAY_ADDRESS", "LAYERLAB_DATABASE_URL", "LAYERLAB_MLFLOW_TRACKING_URI", "LAYERLAB_TUNE_STORAGE"):
        env.pop(key, None)
    return env, ["--api-port", str(api_port), "--mlflow-port", str(mlflow_port)]


def _stack_pids(home: Path) -> dict[str, int]:
    """The keeper's and each part's process group, from up.json."""
    state = json.loads((home / "up.json").read_text())
    return {"keeper": state["keeper"], **{name: part["pid"] for name, part in state["parts"].items()}}


def test_down_after_a_sweep_stops_every_process_within_seconds(tmp_path: Path) -> None:
    env, ports = _stack_env(tmp_path)
    subprocess.run([LAYERLAB, "up", "--detach", *ports], env=env, check=True, timeout=300, capture_output=True)
    pids = _stack_pids(tmp_path)
    try:
        spec = tmp_path / "spec.yaml"
        spec.write_text(SPEC)
        done = subprocess.run([LAYERLAB, "submit", str(spec), "--wait"], env=env, timeout=300, capture_output=True)
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
        worker = int((tmp_path / "worker.pid").read_text())  # the supervised worker, in a group of its own
        assert _group(pids["ray"]), "the stack's Ray head should run in a group of its own"
        spare = _spare(pids["worker"], worker)
        assert spare is not None, "the supervisor should keep a spare worker"

        # kill -9 of the worker mid-sweep: the spare takes its place and takes the sweep over at once, on the
        # same Ray (still running: it was not in the worker's group)
        spec.write_text(LONG)
        sweep_id = _submit(spec, env)
        store = QueueStore(Settings(home=tmp_path).queue_url)
        wait_until(lambda: sum(t.iteration for t in store.trials(sweep_id)) >= 4, 180, "the trials to report")
        os.killpg(worker, signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: int((tmp_path / "worker.pid").read_text()) != worker, 30, "a new worker")
        wait_until(lambda: store.get(sweep_id).attempts == 2, 60, "the new worker to take the sweep over")
        took_over = time.monotonic() - killed
        assert took_over < 30, f"the sweep waited {took_over:.0f}s: as long as a lease, not taken over"
        done = subprocess.run([LAYERLAB, "watch", str(sweep_id)], env=env, timeout=300, capture_output=True)
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
        assert "lease_expired" in [e.action for e in store.events(sweep_id)]
        worker = int((tmp_path / "worker.pid").read_text())
        assert worker == spare, "the spare worker should have taken the dead worker's place"
        pids["worker-child"] = worker
        pids["spare"] = wait_until(lambda: _spare(pids["worker"], worker), 90, "the supervisor's new spare worker")

        start = time.monotonic()
        subprocess.run([LAYERLAB, "down"], env=env, check=True, timeout=120, capture_output=True)
        took = time.monotonic() - start

        left = {name: _group(pgid) for name, pgid in pids.items() if _group(pgid)}
        assert not left, f"processes left after `layerlab down`: {left}"
        assert took < 20, f"`layerlab down` took {took:.0f}s (the worker should stop its Ray and exit in seconds)"
        log = (tmp_path / "logs" / "worker.log").read_text()
        assert "worker" in log and "Traceback" not in log.split("signal 15")[-1], log[-3000:]
    finally:
        _kill_groups(pids.values())


def _spare(supervisor: int, worker: int) -> int | None:
    """The supervisor's spare: its child started with --standby (a session of its own, so its pid is its
    group) that is not the worker (a promoted spare keeps its command line)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == worker:
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) == supervisor and b"--standby" in cmdline:
            return int(entry)
    return None


def _submit(spec: Path, env: dict[str, str]) -> int:
    done = subprocess.run([LAYERLAB, "submit", str(spec)], env=env, timeout=120, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return int(done.stdout.split()[2])  # "submitted sweep ID (...)"


def test_a_stopped_part_starts_again_and_up_starts_only_what_is_missing(tmp_path: Path) -> None:
    env, ports = _stack_env(tmp_path)
    api_url = env["LAYERLAB_API_URL"]
    subprocess.run([LAYERLAB, "up", "--detach", *ports], env=env, check=True, timeout=300, capture_output=True)
    pids = _stack_pids(tmp_path)
    try:
        # Submitted the moment `up` returns: the stack's worker has polled already, so no "no live worker" warning.
        spec = tmp_path / "spec.yaml"
        spec.write_text(SPEC)
        done = subprocess.run([LAYERLAB, "submit", str(spec)], env=env, timeout=120, capture_output=True, text=True)
        assert done.returncode == 0 and "warning" not in done.stdout + done.stderr, done.stdout + done.stderr
        sweep_id = int(done.stdout.split()[2])

        status = subprocess.run([LAYERLAB, "status"], env=env, timeout=60, capture_output=True, text=True)
        assert status.returncode == 0, status.stdout + status.stderr
        for name, pid in pids.items():
            rows = [line for line in status.stdout.splitlines() if f" {name} " in line and f" {pid} " in line]
            assert len(rows) == 1 and " alive " in rows[0], (name, pid, status.stdout)

        # kill -9 of the API: the keeper starts it again, on the same port.
        os.killpg(pids["api"], signal.SIGKILL)
        wait_until(lambda: _stack_pids(tmp_path)["api"] != pids["api"], 30, "the keeper to start the API again")
        wait_until(lambda: _answers(f"{api_url}/healthz"), 90, "the API to answer again")
        assert json.loads((tmp_path / "up.json").read_text())["parts"]["api"]["restarts"] == 1

        # The keeper and the MLflow UI killed: `status` says so; `up` starts those two and leaves the rest.
        before = _stack_pids(tmp_path)
        os.killpg(before["keeper"], signal.SIGKILL)
        os.killpg(before["mlflow"], signal.SIGKILL)
        wait_until(lambda: not _group(before["mlflow"]) and not _group(before["keeper"]), 10, "them to die")
        status = subprocess.run([LAYERLAB, "status"], env=env, timeout=60, capture_output=True, text=True)
        assert status.returncode == 1, status.stdout + status.stderr
        assert "not running: keeper, mlflow" in status.stdout + status.stderr, status.stdout + status.stderr
        subprocess.run([LAYERLAB, "up", "--detach", *ports], env=env, check=True, timeout=300, capture_output=True)
        after = _stack_pids(tmp_path)
        assert {k: after[k] for k in ("api", "ray", "worker")} == {k: before[k] for k in ("api", "ray", "worker")}
        assert after["mlflow"] != before["mlflow"] and _group(after["mlflow"]) and _group(after["keeper"])
        pids.update({f"{name}-before": pid for name, pid in before.items()}, **after)

        # The worker never stopped: the sweep submitted at the start finishes.
        done = subprocess.run([LAYERLAB, "watch", str(sweep_id)], env=env, timeout=300, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr

        # kill -9 of the MLflow server's leader alone leaves its uvicorn child serving in the group: `status` says
        # the part is not running (its pid is dead), and the keeper ends the orphan and starts the part again.
        before = _stack_pids(tmp_path)
        assert len(_group(before["mlflow"])) > 1, "the MLflow server runs its uvicorn as a child"
        os.kill(before["mlflow"], signal.SIGKILL)
        wait_until(lambda: _stack_pids(tmp_path)["mlflow"] != before["mlflow"], 60, "the keeper to start MLflow again")
        wait_until(lambda: not _group(before["mlflow"]), 30, "the orphaned uvicorn to be ended")
        wait_until(lambda: _answers(f"http://127.0.0.1:{ports[3]}/health"), 120, "MLflow to answer again")

        # The Ray head killed: the keeper starts it again, then the worker, which had joined the old head; a sweep
        # submitted after that runs on the new head.
        os.killpg(before["ray"], signal.SIGKILL)
        wait_until(lambda: _stack_pids(tmp_path)["worker"] != before["worker"], 180, "the keeper to restart the worker")
        state = json.loads((tmp_path / "up.json").read_text())["parts"]
        assert state["ray"]["restarts"] == 1 and state["worker"]["restarts"] == 1, state
        again = subprocess.run(
            [LAYERLAB, "submit", str(spec), "--wait"], env=env, timeout=300, capture_output=True, text=True
        )
        assert again.returncode == 0, again.stdout + again.stderr
        pids.update({f"{name}-again": pid for name, pid in before.items()}, **_stack_pids(tmp_path))
        subprocess.run([LAYERLAB, "down"], env=env, check=True, timeout=120, capture_output=True)
        left = {name: _group(pgid) for name, pgid in pids.items() if _group(pgid)}
        assert not left, f"processes left after `layerlab down`: {left}"
    finally:
        _kill_groups(pids.values())


def _kill_groups(pgids: Iterable[int]) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
