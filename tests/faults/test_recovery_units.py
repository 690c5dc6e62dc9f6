"""The recovery mechanisms the fault tests rely on, one at a time and in seconds: a lease across a
database restart, worker calls waiting out an outage, the repair of a Tune state file cut short by a
kill, which MLflow failures count as the server being away, and a metric a kill kept from MLflow."""

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

from service.queue import QueueStore
from service.settings import Settings
from service.spec import SweepSpec, parse_spec
from tests.e2e.conftest import free_port
from workers.mlflow_store import unreachable
from workers.sweep import STATE_BACKUP, _sync_folder, _upload_state_files, repair_experiment_state
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


def _state(folder: Path, session: str, content: str, backup: str | None = None) -> Path:
    state = folder / f"experiment_state-{session}.json"
    state.write_text(content)
    if backup is not None:
        state.with_name(state.name + STATE_BACKUP).write_text(backup)
    return state


def test_a_state_file_cut_short_is_repaired_before_a_restore(tmp_path: Path) -> None:
    intact = _state(tmp_path, "a", '{"trial_data": [1]}', backup='{"trial_data": []}')
    cut = _state(tmp_path, "b", '{"trial_data": [1, 2', backup='{"trial_data": [1]}')
    empty = _state(tmp_path, "c", "", backup="")  # killed while copying both
    first = _state(tmp_path, "d", '{"tri')  # killed in its first write: no previous version
    repair_experiment_state(str(tmp_path))
    assert json.loads(intact.read_text()) == {"trial_data": [1]}
    assert json.loads(cut.read_text()) == {"trial_data": [1]}
    assert not empty.exists() and not first.exists()
    assert sorted(p.name for p in tmp_path.glob("experiment_state-*.json")) == [intact.name, cut.name]


def test_a_searcher_state_cut_short_is_repaired_too(tmp_path: Path) -> None:
    # Seen in tests/faults: a kill while the folder was copied left an empty searcher file, and Tune
    # then started the experiment again from scratch.
    whole = pickle.dumps({"counter": 3})
    searcher = tmp_path / "basic-variant-state-b.json"  # a pickle, whatever its suffix
    searcher.write_bytes(b"")
    searcher.with_name(searcher.name + STATE_BACKUP).write_bytes(whole)
    callbacks = tmp_path / "callback-states-b.pkl"
    callbacks.write_bytes(whole[:5])  # cut short, no previous version
    kept = tmp_path / "searcher-state-b.pkl"
    kept.write_bytes(whole)
    repair_experiment_state(str(tmp_path))
    assert pickle.loads(searcher.read_bytes()) == {"counter": 3}
    assert not callbacks.exists()
    assert pickle.loads(kept.read_bytes()) == {"counter": 3}


def test_uploaded_state_files_survive_a_restore_that_stages_into_their_folder(tmp_path: Path) -> None:
    # A restore copies the stored state into a staging folder, which can be the one the files were
    # uploaded from. Hard-linked uploads were truncated by that copy (seen in tests/faults: empty
    # state files, and Tune started the sweep over); uploads are copies, renamed into place.
    import os
    from types import SimpleNamespace

    import pyarrow.fs
    from ray.train._internal.storage import _download_from_fs_path

    staging, stored = tmp_path / "driver_artifacts", tmp_path / "sweep-1"
    staging.mkdir()
    state = staging / "experiment_state-S1.json"
    state.write_text('{"trial_data": ["first"]}')
    storage = SimpleNamespace(
        storage_filesystem=pyarrow.fs.LocalFileSystem(),
        experiment_fs_path=str(stored),
        experiment_driver_staging_path=str(staging),
    )
    uploaded: dict[str, tuple[int, int]] = {}
    _upload_state_files(storage, [state], uploaded)
    _upload_state_files(storage, [state], uploaded)  # unchanged: nothing to do
    _download_from_fs_path(fs=pyarrow.fs.LocalFileSystem(), fs_path=str(stored), local_path=str(staging))
    assert json.loads((stored / state.name).read_text()) == {"trial_data": ["first"]}
    assert sorted(p.name for p in stored.iterdir()) == [state.name]  # no temp file left behind

    # Unchanged since its upload: not copied again. Replaced (as save_to_dir does): copied.
    _upload_state_files(storage, [state], uploaded)
    (stored / state.name).write_text("marker")
    _upload_state_files(storage, [state], uploaded)
    assert (stored / state.name).read_text() == "marker"
    state.with_name("new").write_text('{"trial_data": ["second"]}')
    os.replace(state.with_name("new"), state)
    _upload_state_files(storage, [state], uploaded)
    assert json.loads((stored / state.name).read_text()) == {"trial_data": ["second"]}


def test_the_folder_copy_sends_changed_files_and_leaves_the_state_files_to_their_upload(tmp_path: Path) -> None:
    # The state files are uploaded atomically (above); a plain copy over them could be cut short by a
    # kill. The rest of the folder is copied as it changes, each file once per change.
    from types import SimpleNamespace

    import pyarrow.fs

    staging, stored = tmp_path / "driver_artifacts", tmp_path / "sweep-1"
    (staging / "trial_a").mkdir(parents=True)
    (staging / "experiment_state-S1.json").write_text("{}")
    (staging / "basic-variant-state-S1.json").write_bytes(pickle.dumps({}))
    (staging / "basic-variant-state-S1.json.partial").write_text("half")
    (staging / "trial_a" / "result.json").write_text('{"step": 1}\n')
    (staging / "tuner.pkl").write_bytes(b"tuner")
    storage = SimpleNamespace(
        storage_filesystem=pyarrow.fs.LocalFileSystem(),
        experiment_fs_path=str(stored),
        experiment_driver_staging_path=str(staging),
    )
    copied: dict[str, tuple[int, int]] = {}
    _sync_folder(storage, wait=False, copied=copied)
    found = sorted(str(p.relative_to(stored)) for p in stored.rglob("*") if p.is_file())
    assert found == ["trial_a/result.json", "tuner.pkl"]

    (stored / "tuner.pkl").write_bytes(b"marker")  # unchanged in staging: not copied again
    with open(staging / "trial_a" / "result.json", "a") as f:
        f.write('{"step": 2}\n')
    (staging / "trial_b").mkdir()
    (staging / "trial_b" / "progress.csv").write_text("step\n1\n")
    _sync_folder(storage, wait=True, copied=copied)
    assert (stored / "tuner.pkl").read_bytes() == b"marker"
    assert (stored / "trial_a" / "result.json").read_text() == '{"step": 1}\n{"step": 2}\n'
    assert (stored / "trial_b" / "progress.csv").read_text() == "step\n1\n"
    assert not (stored / "experiment_state-S1.json").exists()


def test_remote_storage_is_left_alone(tmp_path: Path) -> None:
    repair_experiment_state("s3://bucket/tune/sweep-1")  # an object store holds whole files only
    repair_experiment_state(str(tmp_path / "not-there"))


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


def test_a_step_claimed_before_a_kill_but_never_logged_is_logged_on_replay(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    store = QueueStore(settings.queue_url)
    spec = _spec("replayed")
    store.submit(spec)
    first = store.claim("w1", 30)
    assert first is not None
    tracker = SweepTracker(settings, store, first, spec)
    tracker.start_trial("t0", {"seed": 0})
    for step in (1, 2, 3):  # what ProgressCallback does: claim the step, then log it
        assert store.trial_result(first.sweep_id, "t0", step, {"loss": 1.0 / step}, to_log=True)
        tracker.log_trial_metrics("t0", {"loss": 1.0 / step}, step)
    assert store.trial_result(
        first.sweep_id, "t0", 4, {"loss": 0.25}, to_log=True
    )  # killed here, before step 4 reached MLflow

    store.requeue(first, "killed")
    second = store.claim("w2", 30)
    assert second is not None
    again = SweepTracker(settings, store, second, spec)
    again.start_trial("t0", {"seed": 0})
    for step in (3, 4):  # the trial resumes from its checkpoint at step 2 and reports 3 and 4 again
        assert not store.trial_result(second.sweep_id, "t0", step, {"loss": 1.0 / step}, to_log=True)
        again.log_replayed_metrics("t0", {"loss": 1.0 / step}, step)
    assert store.trial_result(second.sweep_id, "t0", 5, {"loss": 0.2}, to_log=True)
    again.log_trial_metrics("t0", {"loss": 0.2}, 5)

    [trial] = store.trials(second.sweep_id)
    assert trial.mlflow_run_id is not None
    history = again.client.get_metric_history(trial.mlflow_run_id, "loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5]
