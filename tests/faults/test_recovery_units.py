"""The recovery mechanisms the fault tests rely on, one at a time and in seconds: a lease across a
database restart, worker calls waiting out an outage, Tune's storage writing whole files only, which
MLflow failures count as the server being away, and a metric a kill kept from MLflow."""

from __future__ import annotations

import json
import pickle
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from sqlalchemy.exc import OperationalError

from service.queue import Claim, QueueStore
from service.settings import Settings
from service.spec import SweepSpec, parse_spec
from tests.e2e.conftest import free_port
from workers.mlflow_store import unreachable
from workers.storage import tune_storage
from workers.tracking import SweepTracker

from .conftest import PrivatePostgres, actions, private_postgres

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pg() -> Iterator[PrivatePostgres]:
    with private_postgres() as server:
        yield server


def _spec(name: str) -> SweepSpec:
    return parse_spec({"name": name, "task": "tversky.xor", "metric": {"name": "loss"}})


def test_a_lease_that_expired_while_postgres_was_down_is_not_reclaimed(pg: PrivatePostgres) -> None:
    store = QueueStore(pg.url)
    sweep = store.submit(_spec("outlives-a-restart"))
    held = store.claim("w1", lease_seconds=1.0)
    assert held is not None and held.sweep_id == sweep.id
    pg.stop()
    time.sleep(1.5)  # longer than the lease: by the clock alone, w1 is gone
    pg.start()
    assert store.claim("w2", lease_seconds=1.0) is None  # the server is younger than a lease
    assert store.heartbeat(held, lease_seconds=1.0) is False  # w1 is back and still owns it
    time.sleep(1.5)  # now w1 really stays silent for longer than its lease, the server for longer too
    taken = store.claim("w2", lease_seconds=1.0)
    assert taken is not None and (taken.sweep_id, taken.attempt) == (sweep.id, 2)
    assert actions(store, sweep.id) == ["submit", "claim", "requeue", "claim"]


def test_worker_calls_wait_out_an_outage_and_api_calls_do_not(pg: PrivatePostgres) -> None:
    api_side = QueueStore(pg.url)
    worker_side = QueueStore(pg.url, run_migrations=False, outage_seconds=60)
    sweep = api_side.submit(_spec("waits"))
    pg.stop()
    with pytest.raises(OperationalError):
        api_side.get(sweep.id)
    back = threading.Timer(2.0, pg.start)
    back.start()
    t0 = time.monotonic()
    assert worker_side.get(sweep.id).name == "waits"
    waited = time.monotonic() - t0
    back.join()
    assert 2.0 <= waited < 15, waited
    assert api_side.get(sweep.id).name == "waits"  # the pool reconnects by itself


def test_a_worker_call_gives_up_after_outage_seconds(pg: PrivatePostgres) -> None:
    store = QueueStore(pg.url, run_migrations=False, outage_seconds=2)
    sweep = store.submit(_spec("gives-up"))
    pg.stop()
    try:
        t0 = time.monotonic()
        with pytest.raises(OperationalError):
            store.get(sweep.id)
        assert 2.0 <= time.monotonic() - t0 < 5
    finally:
        pg.start()


def test_a_storage_write_cut_short_leaves_the_old_file_whole(tmp_path: Path) -> None:
    """What a kill -9 in the middle of Tune's copy of a state file leaves at the storage path: the file
    as it was (the new bytes wait under a temporary name that no reader opens)."""
    _, fs = tune_storage(str(tmp_path))
    assert fs is not None
    state = tmp_path / "experiment_state-x.json"
    state.write_text('{"whole": "old"}')
    out = fs.open_output_stream(str(state))
    out.write(b'{"whole": "n')  # the writer dies here: no close()
    assert json.loads(state.read_text()) == {"whole": "old"}
    del out  # (pyarrow closes a stream it collects; a killed process never gets that far)
    with fs.open_output_stream(str(state)) as whole:
        whole.write(b'{"whole": "new"}')
    assert json.loads(state.read_text()) == {"whole": "new"}


@pytest.mark.parametrize("torn", [b"", b'{"trial_data": [', pickle.dumps({"searcher": 1})[:-3]])
def test_a_torn_copy_of_a_state_file_never_replaces_a_whole_one(tmp_path: Path, torn: bytes) -> None:
    """Tune rewrites its state files in place while its background copy may be reading them: a copy that
    read one half-written arrives whole but torn. It is dropped, old file or none."""
    _, fs = tune_storage(str(tmp_path))
    assert fs is not None
    state, new_session = tmp_path / "experiment_state-a.json", tmp_path / "experiment_state-b.json"
    state.write_text('{"whole": "old"}')
    for target in (state, new_session):
        with fs.open_output_stream(str(target)) as out:
            out.write(torn)
    assert json.loads(state.read_text()) == {"whole": "old"}
    assert not new_session.exists()
    searcher = tmp_path / "basic-variant-state-a.json"  # a pickle, whatever its suffix
    with fs.open_output_stream(str(searcher)) as out:
        out.write(pickle.dumps({"searcher": 2}))
    assert pickle.loads(searcher.read_bytes()) == {"searcher": 2}
    results = tmp_path / "result.json"  # Tune's JSON lines: whole if every line is
    with fs.open_output_stream(str(results)) as out:
        out.write(b'{"training_iteration": 1}\n{"training_iteration": 2}\n')
    assert len(results.read_text().splitlines()) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [searcher.name, state.name, results.name]  # no temp file


def test_an_empty_first_copy_is_dropped_quietly_and_an_empty_overwrite_is_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Tune makes a trial's result.json empty at the trial's start and the copy runs every few seconds: no
    warning for that. An empty copy over a whole file is a torn one, and says so."""
    _, fs = tune_storage(str(tmp_path))
    assert fs is not None
    results = tmp_path / "result.json"
    with caplog.at_level("WARNING", logger="workers.storage"):
        with fs.open_output_stream(str(results)) as out:
            out.write(b"")
        assert not results.exists() and not caplog.records
        results.write_text('{"training_iteration": 1}\n')
        with fs.open_output_stream(str(results)) as out:
            out.write(b"")
    assert results.read_text() == '{"training_iteration": 1}\n'
    assert [r.getMessage() for r in caplog.records] == [
        f"{results}: a torn copy arrived (its source was being rewritten); kept the previous one"
    ]


def test_the_atomic_storage_travels_to_trial_processes_and_copies_folders(tmp_path: Path) -> None:
    import pyarrow.fs as pafs

    _, fs = tune_storage(str(tmp_path / "store"))
    assert fs is not None
    again = pickle.loads(pickle.dumps(fs))  # Tune ships its storage context (with the filesystem) to trials
    source = tmp_path / "staging"
    (source / "trial").mkdir(parents=True)
    (source / "trial" / "result.json").write_text("{}")
    (source / "experiment_state-x.json").write_text("[]")
    pafs.copy_files(str(source), str(tmp_path / "store" / "exp"), destination_filesystem=again)
    copied = sorted(p.relative_to(tmp_path / "store").as_posix() for p in (tmp_path / "store").rglob("*"))
    assert copied == ["exp", "exp/experiment_state-x.json", "exp/trial", "exp/trial/result.json"]
    assert tune_storage("s3://bucket/tune") == ("s3://bucket/tune", None)


def test_an_mlflow_server_that_does_not_answer_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    down = MlflowClient(tracking_uri=f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(MlflowException) as refused:
        down.get_experiment_by_name("anything")
    assert unreachable(refused.value)


def test_a_refused_write_is_not_an_outage(tmp_path: Path) -> None:
    local = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(MlflowException) as missing:
        local.get_run("0" * 32)
    assert not unreachable(missing.value), missing.value.get_http_status_code()
    assert not unreachable(ValueError("a bug, not an outage"))


def _attempt(settings: Settings, store: QueueStore, spec: SweepSpec, worker: str) -> tuple[Claim, SweepTracker]:
    """The next claim of the test's one sweep and its tracker, with trial t0 started."""
    claim = store.claim(worker, 30)
    assert claim is not None
    tracker = SweepTracker(settings, store, claim, spec)
    tracker.start_trial("t0", {"seed": 0})
    return claim, tracker


def _loss_steps(store: QueueStore, tracker: SweepTracker, claim: Claim) -> list[int]:
    [trial] = store.trials(claim.sweep_id)
    assert trial.mlflow_run_id is not None
    return sorted(m.step for m in tracker.client.get_metric_history(trial.mlflow_run_id, "loss"))


def test_a_step_claimed_before_a_kill_but_never_logged_is_logged_on_replay(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    store = QueueStore(settings.queue_url)
    spec = _spec("replayed")
    store.submit(spec)
    first, tracker = _attempt(settings, store, spec, "w1")
    for step in (1, 2, 3):  # what ProgressCallback does: claim the step, then log it
        assert store.trial_result(first.sweep_id, "t0", step, {"loss": 1.0 / step}, to_log=True)
        tracker.log_trial_metrics("t0", {"loss": 1.0 / step}, step)
    assert store.trial_result(
        first.sweep_id, "t0", 4, {"loss": 0.25}, to_log=True
    )  # killed here, before step 4 reached MLflow

    store.requeue(first, "killed")
    second, again = _attempt(settings, store, spec, "w2")
    for step in (3, 4):  # the trial resumes from its checkpoint at step 2 and reports 3 and 4 again
        assert not store.trial_result(second.sweep_id, "t0", step, {"loss": 1.0 / step}, to_log=True)
        again.log_replayed_metrics("t0", {"loss": 1.0 / step}, step)
    assert store.trial_result(second.sweep_id, "t0", 5, {"loss": 0.2}, to_log=True)
    again.log_trial_metrics("t0", {"loss": 0.2}, 5)
    assert _loss_steps(store, again, second) == [1, 2, 3, 4, 5]


def test_a_replayed_step_fills_a_hole_below_steps_logged_later(tmp_path: Path) -> None:
    """An attempt resumed past a step whose write a kill lost, then logged the steps after it; a later replay
    of the lost step still reaches MLflow (a check against the highest logged step alone missed it)."""
    settings = Settings(home=tmp_path)
    store = QueueStore(settings.queue_url)
    spec = _spec("hole")
    store.submit(spec)
    first, tracker = _attempt(settings, store, spec, "w1")
    for step in (1, 3):  # step 2 was claimed, its write lost
        assert store.trial_result(first.sweep_id, "t0", step, {"loss": 1.0 / step}, to_log=True)
        tracker.log_trial_metrics("t0", {"loss": 1.0 / step}, step)
    assert tracker.flush(wait_seconds=30)
    store.requeue(first, "killed")
    second, again = _attempt(settings, store, spec, "w2")
    for step in (2, 3):
        again.log_replayed_metrics("t0", {"loss": 1.0 / step}, step)
    assert again.flush(wait_seconds=30)
    assert _loss_steps(store, again, second) == [1, 2, 3]


def test_a_replay_that_comes_before_the_trial_run_is_looked_up_is_still_logged(tmp_path: Path) -> None:
    """The next attempt's tracker has not looked up the trial's run yet (its start not handled) when the
    replayed step arrives: the run is found among the earlier attempts' runs and the step logged, not skipped
    (a skip let the ledger confirm a checkpoint past a step MLflow never got: test_endings, step 4)."""
    settings = Settings(home=tmp_path)
    store = QueueStore(settings.queue_url)
    spec = _spec("early-replay")
    store.submit(spec)
    first, tracker = _attempt(settings, store, spec, "w1")
    for step in (1, 2):
        assert store.trial_result(first.sweep_id, "t0", step, {"loss": 1.0 / step}, to_log=True)
        tracker.log_trial_metrics("t0", {"loss": 1.0 / step}, step)
    assert store.trial_result(first.sweep_id, "t0", 3, {"loss": 1 / 3}, to_log=True)  # killed before its write
    assert tracker.flush(wait_seconds=30)
    store.requeue(first, "killed")
    second = store.claim("w2", 30)
    assert second is not None
    again = SweepTracker(settings, store, second, spec)  # no start_trial("t0") yet
    again.log_replayed_metrics("t0", {"loss": 1 / 3}, 3)
    again.start_trial("t0", {"seed": 0})
    assert again.flush(wait_seconds=30)
    assert _loss_steps(store, again, second) == [1, 2, 3]
