"""SweepTracker's writer thread, used with a tracking server: the per-trial writes leave Tune's loop, and
`settle` is where they are known to be in MLflow (a state save waits there) or where one failed."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException

from service.cli import _mlflow_server_cmd
from service.queue import QueueStore
from service.settings import Settings
from service.spec import parse_spec
from tests.e2e.conftest import free_port, wait_until
from workers.tracking import SweepTracker

pytestmark = pytest.mark.slow


def start_server(home: Path, port: int) -> subprocess.Popen[bytes]:
    """An MLflow server exactly as `layerlab up` starts it, once it answers."""
    command = _mlflow_server_cmd(Settings(home=home, mlflow_tracking_uri=None), port)
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def answers() -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200  # noqa: S310
        except OSError:
            return False

    wait_until(answers, 120, "the MLflow server")
    return proc


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    proc = start_server(tmp_path_factory.mktemp("mlflow"), port)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)


def tracker_for(tmp_path: Path, tracking_uri: str) -> tuple[SweepTracker, QueueStore]:
    # Each test its own experiment: each has its own queue, so the same sweep id.
    spec = parse_spec(
        {"name": tmp_path.name.replace("[", "-").rstrip("]"), "task": "tversky.xor", "metric": {"name": "loss"}}
    )
    settings = Settings(home=tmp_path, mlflow_tracking_uri=tracking_uri)
    store = QueueStore(settings.queue_url)
    store.submit(spec)
    claim = store.claim("w", 30)
    assert claim is not None
    return SweepTracker(settings, store, claim, spec), store


def test_per_trial_writes_return_at_once_and_are_in_mlflow_after_settle(server: str, tmp_path: Path) -> None:
    tracker, store = tracker_for(tmp_path, server)
    assert tracker._writes is not None  # a tracking server: the writer thread is on
    start = time.perf_counter()
    for i in range(5):
        tracker.start_trial(f"t{i}", {"seed": i})
        tracker.log_trial_files(f"t{i}", {"picture.png": b"png"})
        tracker.log_trial_metrics(f"t{i}", {"loss": 1.0 / (i + 1)}, 1)
        tracker.end_trial(f"t{i}", "FINISHED")
    queued = time.perf_counter() - start
    tracker.settle()
    delivered = time.perf_counter() - start
    assert queued < delivered / 3, (queued, delivered)  # the caller did not wait for the round trips

    runs = {t.trial_id: t.mlflow_run_id for t in store.trials(tracker.sweep_id)}
    assert sorted(runs) == [f"t{i}" for i in range(5)] and all(runs.values())
    for i in range(5):
        run = tracker.client.get_run(runs[f"t{i}"])
        assert run.data.metrics == {"loss": 1.0 / (i + 1)} and run.info.status == "FINISHED"
        assert [a.path for a in tracker.client.list_artifacts(run.info.run_id)] == ["picture.png"]
    tracker.close()
    assert tracker._writes is None


def test_a_refused_write_fails_at_settle_and_the_writes_after_it_are_not_made(server: str, tmp_path: Path) -> None:
    tracker, store = tracker_for(tmp_path, server)
    tracker.start_trial("t0", {"seed": 0})
    tracker.log_trial_metrics("t0", {"bad?name": 1.0}, 1)  # MLflow refuses the metric name (not an outage)
    tracker.log_trial_metrics("t0", {"loss": 0.5}, 2)
    with pytest.raises(MlflowException, match="bad\\?name"):
        tracker.settle()
    [trial] = store.trials(tracker.sweep_id)
    assert tracker.client.get_run(trial.mlflow_run_id).data.metrics == {}  # step 2 was not written either
    with pytest.raises(MlflowException):
        tracker.settle()  # and it stays failed
    tracker.close()


def test_a_local_store_writes_inline(tmp_path: Path) -> None:
    tracker, store = tracker_for(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert tracker._writes is None
    tracker.start_trial("t0", {"seed": 0})
    tracker.log_trial_metrics("t0", {"loss": 0.5}, 1)
    [trial] = store.trials(tracker.sweep_id)  # no settle: already written
    assert tracker.client.get_run(trial.mlflow_run_id).data.metrics == {"loss": 0.5}


def test_a_checkpoint_reaches_the_ledger_only_after_the_metrics_it_covers(server: str, tmp_path: Path) -> None:
    """ProgressCallback.on_checkpoint records the ledger's checkpoint through `after_writes`: a kill -9 while
    the step's metrics are still on their way must leave the ledger at the older checkpoint, so that the
    next attempt reports that step again (a ledger ahead of MLflow lost step 2 of a trial in a fault run)."""
    tracker, store = tracker_for(tmp_path, server)
    tracker.start_trial("t0", {"seed": 0})
    held, recorded = threading.Event(), []
    tracker.after_writes("hold the writer", held.wait)  # the server is slow to answer
    tracker.log_trial_metrics("t0", {"loss": 0.5}, 2)
    tracker.after_writes("ledger", lambda: recorded.append(tracker.client.get_run(run_of(store, "t0")).data.metrics))
    time.sleep(0.3)
    assert recorded == []  # still behind the metrics write: a kill now leaves the older checkpoint
    held.set()
    tracker.settle()
    assert recorded == [{"loss": 0.5}]  # the metrics were in MLflow when the ledger's record was made
    tracker.close()


def run_of(store: QueueStore, trial_id: str) -> str:
    [run_id] = [t.mlflow_run_id for t in store.trials(1) if t.trial_id == trial_id]
    assert run_id is not None
    return run_id


def test_a_replay_while_mlflow_is_down_is_checked_once_it_answers_and_the_checkpoint_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replayed step that arrives while the server is away cannot be checked against MLflow: the check is kept
    back with the writes, and the ledger's record of the checkpoint after it waits behind it. (Skipped instead,
    the ledger confirmed the checkpoint at once and the step never reached MLflow.)"""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # as the worker sets it: an outage shows at once
    home, port = tmp_path / "mlflow", free_port()
    proc = start_server(home, port)
    try:
        tracker, store = tracker_for(tmp_path, f"http://127.0.0.1:{port}")
        tracker.start_trial("t0", {"seed": 0})
        for step in (1, 2):
            assert store.trial_result(tracker.sweep_id, "t0", step, {"loss": 1.0 / step}, to_log=True)
            tracker.log_trial_metrics("t0", {"loss": 1.0 / step}, step)
        assert store.trial_result(tracker.sweep_id, "t0", 3, {"loss": 1 / 3}, to_log=True)  # killed before its write
        tracker.flush()
        tracker.close()
        store.requeue(tracker.claim, "killed")
        second = store.claim("w2", 30)
        assert second is not None
        again = SweepTracker(tracker.settings, store, second, tracker.spec)
        again.start_trial("t0", {"seed": 0})
        again.settle(everything=True)
        proc.terminate()
        proc.wait(timeout=30)
        again.log_replayed_metrics("t0", {"loss": 1 / 3}, 3)  # the trial resumed from its checkpoint at 2
        recorded: list[int] = []
        again.after_writes("ledger", lambda: recorded.append(3))
        again.settle(everything=True)
        assert recorded == []  # kept back behind the replay's check
        proc = start_server(home, port)
        assert again.flush(wait_seconds=120)
        assert recorded == [3]
        steps = [m.step for m in again.client.get_metric_history(run_of(store, "t0"), "loss")]
        assert sorted(steps) == [1, 2, 3]
        again.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
