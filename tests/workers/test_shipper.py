"""The shipper (workers.shipper) makes MLflow follow the queue database: child runs, every outbox row once with its
stored timestamp, files, run statuses from the trial rows. Against a real tracking server where the behaviour
depends on it (an outage, a refused write), else on the embedded stack's SQLite store."""

from __future__ import annotations

import base64
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow.exceptions import MlflowException

from service.embedded_stack import mlflow_server_cmd
from service.models import TrialState
from service.queue import QueueStore
from service.settings import Settings
from service.spec import parse_spec
from tests.support import free_port, wait_until
from workers.durability import close_abandoned
from workers.shipper import MetricShipper
from workers.tracking import SweepTracker


def start_server(home: Path, port: int) -> subprocess.Popen[bytes]:
    """An MLflow server exactly as `layerlab up` starts it, once it answers."""
    command = mlflow_server_cmd(Settings(home=home, mlflow_tracking_uri=None), port)
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def answers() -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200  # noqa: S310
        except OSError:
            return False

    wait_until(answers, 120, "the MLflow server")
    return proc


def tracker_for(tmp_path: Path, tracking_uri: str | None = None) -> tuple[SweepTracker, QueueStore]:
    tracking_uri = tracking_uri or f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = parse_spec(
        {"name": tmp_path.name.replace("[", "-").rstrip("]"), "task": "tversky.xor", "metric": {"name": "loss"}}
    )
    settings = Settings(home=tmp_path, mlflow_tracking_uri=tracking_uri)
    store = QueueStore(settings.queue_url)
    store.submit(spec)
    claim = store.claim("w", 30)
    assert claim is not None
    return SweepTracker(settings, store, claim, spec), store


def history(tracker: SweepTracker, store: QueueStore, trial_id: str, key: str = "loss") -> list[tuple[int, float]]:
    run_id = store.trial(tracker.sweep_id, trial_id).mlflow_run_id
    assert run_id is not None
    return sorted((m.step, m.value) for m in tracker.client.get_metric_history(run_id, key))


def test_rows_reach_mlflow_once_with_their_stored_time_and_runs_end_as_their_trials(tmp_path: Path) -> None:
    tracker, store = tracker_for(tmp_path)
    sweep = tracker.sweep_id
    for i in range(3):
        store.trial_started(sweep, f"t{i}", {"seed": i})
    picture = base64.b64encode(b"png").decode()
    for step in (1, 2):
        for i in range(3):
            store.trial_result(sweep, f"t{i}", step, {"loss": 1.0 / (i + step)}, files={"p.png": picture})
    assert not store.trial_result(sweep, "t0", 2, {"loss": 99.0})  # a step reported again: the first value wins
    store.trial_ended(sweep, "t0", TrialState.terminated)
    store.trial_ended(sweep, "t1", TrialState.error)
    stamps = {(r.trial_id, r.step): r.timestamp_ms for r in store.unshipped(sweep, 100)}
    assert tracker.shipper.drain(wait_seconds=0)

    assert store.unshipped(sweep, 100) == []
    for i in range(3):
        run_id = store.trial(sweep, f"t{i}").mlflow_run_id
        assert run_id is not None
        points = tracker.client.get_metric_history(run_id, "loss")
        assert sorted((m.step, m.value, m.timestamp) for m in points) == [
            (step, 1.0 / (i + step), stamps[(f"t{i}", step)]) for step in (1, 2)
        ]
        run = tracker.client.get_run(run_id)
        assert run.data.params == {"seed": str(i)}
        assert run.data.tags["mlflow.parentRunId"] == tracker.parent_run_id
        assert [a.path for a in tracker.client.list_artifacts(run_id)] == ["p.png"]
    statuses = [tracker.client.get_run(store.trial(sweep, f"t{i}").mlflow_run_id or "").info.status for i in range(3)]
    assert statuses == ["FINISHED", "FAILED", "RUNNING"]
    assert tracker.shipper.ship_once() == 0  # MLflow shows everything: a pass writes nothing

    store.trial_started(sweep, "t1", {"seed": 1})  # resumed (layerlab resume): its run runs again
    assert tracker.shipper.ship_once() == 1
    assert tracker.client.get_run(store.trial(sweep, "t1").mlflow_run_id or "").info.status == "RUNNING"


class KilledBeforeTheMark(QueueStore):
    """The store as a shipper killed between a send and its mark sees it: the mark never happens."""

    def mark_shipped(self, row_ids: Any) -> None:
        raise KeyboardInterrupt("killed")


def test_a_row_sent_again_after_a_kill_between_send_and_mark_is_in_mlflow_once(tmp_path: Path) -> None:
    tracker, store = tracker_for(tmp_path)
    sweep = tracker.sweep_id
    store.trial_started(sweep, "t0", {"seed": 0})
    for step in (1, 2, 3):
        store.trial_result(sweep, "t0", step, {"loss": 1.0 / step})
    killed = KilledBeforeTheMark(tracker.settings.queue_url)
    first = MetricShipper(killed, tracker.client, sweep, tracker.experiment_id, tracker.parent_run_id, {}, "")
    with pytest.raises(KeyboardInterrupt):
        first.ship_once()
    assert len(store.unshipped(sweep, 10)) == 3 and history(tracker, store, "t0") == [(1, 1.0), (2, 0.5), (3, 1 / 3)]
    # The next attempt's shipper sends the three rows again: the identical metrics, kept once.
    again = MetricShipper(store, tracker.client, sweep, tracker.experiment_id, tracker.parent_run_id, {}, "")
    assert again.drain(wait_seconds=0)
    assert history(tracker, store, "t0") == [(1, 1.0), (2, 0.5), (3, 1 / 3)]


def test_a_run_created_before_a_kill_is_found_by_its_tag_not_made_twice(tmp_path: Path) -> None:
    tracker, store = tracker_for(tmp_path)
    sweep = tracker.sweep_id
    store.trial_started(sweep, "t0", {"seed": 0})

    class KilledBeforeStoringTheRun(QueueStore):
        def set_trial_run(self, sweep_id: int, trial_id: str, run_id: str) -> str:
            raise KeyboardInterrupt("killed")

    killed = KilledBeforeStoringTheRun(tracker.settings.queue_url)
    first = MetricShipper(killed, tracker.client, sweep, tracker.experiment_id, tracker.parent_run_id, {}, "")
    with pytest.raises(KeyboardInterrupt):
        first.ship_once()
    assert store.trial(sweep, "t0").mlflow_run_id is None
    assert tracker.shipper.drain(wait_seconds=0)
    runs = tracker.client.search_runs([tracker.experiment_id], "tags.`layerlab.trial_id` = 't0'")
    assert [r.info.run_id for r in runs] == [store.trial(sweep, "t0").mlflow_run_id]


def test_a_sweep_given_up_is_closed_with_what_was_left_in_its_outbox(tmp_path: Path) -> None:
    tracker, store = tracker_for(tmp_path)
    sweep = tracker.sweep_id
    store.trial_started(sweep, "t0", {"seed": 0})
    store.trial_result(sweep, "t0", 1, {"loss": 1.0})
    tracker.shipper.drain(wait_seconds=0)
    store.trial_result(sweep, "t0", 2, {"loss": 0.5})  # the worker dies before its shipper sends this
    store.fail(tracker.claim, "gave up after 1 of max_attempts=1", closed=False)
    close_abandoned(tracker.settings, store)
    assert history(tracker, store, "t0") == [(1, 1.0), (2, 0.5)]
    assert store.trial(sweep, "t0").state == "error"
    assert tracker.client.get_run(store.trial(sweep, "t0").mlflow_run_id or "").info.status == "FAILED"
    assert tracker.client.get_run(tracker.parent_run_id).info.status == "FAILED"
    assert store.unclosed() == []


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path, int]]:
    home, port = tmp_path / "mlflow", free_port()
    proc = start_server(home, port)
    yield f"http://127.0.0.1:{port}", home, port
    proc.terminate()
    proc.wait(timeout=30)


@pytest.mark.stack
def test_a_refused_write_fails_the_sweep_and_nothing_after_it_is_marked(
    server: tuple[str, Path, int], tmp_path: Path
) -> None:
    tracker, store = tracker_for(tmp_path, server[0])
    sweep = tracker.sweep_id
    store.trial_started(sweep, "t0", {"seed": 0})
    store.trial_result(sweep, "t0", 1, {"bad?name": 1.0})  # MLflow refuses the metric name (not an outage)
    store.trial_result(sweep, "t0", 2, {"loss": 0.5})
    with pytest.raises(MlflowException, match="bad\\?name"):
        tracker.shipper.drain(wait_seconds=0)
    assert [r.step for r in store.unshipped(sweep, 10)] == [1, 2]
    with pytest.raises(MlflowException):
        tracker.shipper.drain(wait_seconds=0)  # and it stays failed


@pytest.mark.stack
def test_while_mlflow_is_away_rows_wait_and_results_are_recorded_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # as the worker sets it: an outage shows at once
    home, port = tmp_path / "mlflow", free_port()
    proc = start_server(home, port)
    try:
        tracker, store = tracker_for(tmp_path, f"http://127.0.0.1:{port}")
        sweep = tracker.sweep_id
        tracker.shipper.start()
        store.trial_started(sweep, "t0", {"seed": 0})
        store.trial_result(sweep, "t0", 1, {"loss": 1.0})
        tracker.shipper.notify()
        wait_until(lambda: not store.unshipped(sweep, 10), 60, "step 1 shipped")
        proc.terminate()
        proc.wait(timeout=30)
        start = time.monotonic()
        for step in range(2, 7):  # the trial goes on: each result is one database write, no MLflow call
            store.trial_result(sweep, "t0", step, {"loss": 1.0 / step})
            tracker.shipper.notify()
        assert time.monotonic() - start < 5
        time.sleep(2)
        assert [r.step for r in store.unshipped(sweep, 10)] == [2, 3, 4, 5, 6]
        proc = start_server(home, port)
        assert tracker.shipper.drain(wait_seconds=120)
        assert history(tracker, store, "t0") == [(s, 1.0 / s) for s in range(1, 7)]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
