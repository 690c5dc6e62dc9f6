"""The worker's MLflow store on SQLite (`LeanRunStore`) writes what MLflow's own store writes, refuses
what it refuses, and does it in fewer statements. The oracle is MLflow's stock SqlAlchemyStore, given
the same calls on a database of its own; both are read back through the stock store."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.exceptions import MlflowException
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from sqlalchemy import event

from service.queue import QueueStore
from service.settings import Settings
from service.spec import parse_spec
from workers.lean_run_store import LeanRunStore, _lean_store
from workers.tracking import SweepTracker


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SqlAlchemyStore, SqlAlchemyStore]]:
    folder = tmp_path_factory.mktemp("stores")
    stock = SqlAlchemyStore(f"sqlite:///{folder}/stock.db", (folder / "stock-art").as_uri())
    lean = _lean_store(f"sqlite:///{folder}/lean.db", (folder / "lean-art").as_uri())
    assert type(lean) is LeanRunStore
    yield stock, lean


def _experiment(store: SqlAlchemyStore, name: str) -> str:
    found = store.get_experiment_by_name(name)
    return str(found.experiment_id) if found else str(store.create_experiment(name))


def _trial(store: SqlAlchemyStore, exp: str, params: list[Param], steps: list[list[Metric]], tags: list[RunTag]) -> str:
    """The worker's calls for one trial: the run with its tags, its params, a metrics batch per step,
    extra tags, the end."""
    run = store.create_run(exp, "someone", 1_000, [RunTag("layerlab.trial_id", "t1"), *tags], "trial-t1")
    run_id = run.info.run_id
    assert run.info.status == "RUNNING" and run.info.run_name == "trial-t1" and run.info.end_time is None
    assert run.info.artifact_uri.endswith(f"/{run_id}/artifacts")
    store.log_batch(run_id, metrics=[], params=params, tags=[])
    for batch in steps:
        store.log_batch(run_id, metrics=batch, params=[], tags=[])
    # A worker that restarts logs a checkpoint's steps again: the same rows, then those and new ones.
    store.log_batch(run_id, metrics=[], params=params, tags=[])
    store.log_batch(run_id, metrics=steps[0], params=[], tags=[])
    store.log_batch(run_id, metrics=[*steps[0], Metric("late", 1.0, 1_000, 0)], params=[], tags=[])
    store.log_batch(run_id, metrics=[], params=[], tags=[RunTag("extra", "yes")])
    info = store.update_run_info(run_id, RunStatus.FINISHED, 2_000, None)
    assert (info.run_id, info.status, info.end_time) == (run_id, "FINISHED", 2_000)
    return run_id


def _seen(stock: SqlAlchemyStore, run_id: str) -> dict[str, Any]:
    """Everything MLflow shows of a run, with its id taken out."""
    run = stock.get_run(run_id)
    info = run.info
    # Sorted by repr: a NaN ("nan") and a number can share a step and a timestamp.
    histories = {
        k: sorted(((m.step, m.timestamp, _num(m.value)) for m in stock.get_metric_history(run_id, k)), key=repr)
        for k in run.data.metrics
    }
    return {
        "info": (info.run_name, info.status, info.start_time, info.end_time, info.lifecycle_stage, info.user_id),
        "artifact_uri": info.artifact_uri.replace(run_id, "<run>").split("-art/")[-1],
        "params": run.data.params,
        "tags": {k: v for k, v in run.data.tags.items()},
        "latest": {k: _num(v) for k, v in run.data.metrics.items()},
        "histories": histories,
    }


def _num(v: float) -> float | str:
    return "nan" if math.isnan(v) else v


def _read_back(store: SqlAlchemyStore) -> SqlAlchemyStore:
    """A stock store on the same database: reads go through MLflow's own code."""
    return SqlAlchemyStore(store.db_uri, store.artifact_root_uri)


keys = st.from_regex(r"[a-j][a-j_]{0,5}(/[a-j_]{1,6})?", fullmatch=True)  # names MLflow accepts
values = st.floats(allow_nan=True, allow_infinity=True, width=64)
# Steps and timestamps from a small range: batches that tie, go back in steps, or repeat a row.
# A few metric names, so that batches share them.
reports = st.tuples(
    st.integers(0, 2), st.integers(0, 2), st.dictionaries(st.sampled_from(["acc", "loss", "a/b"]), values, min_size=1)
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    params=st.dictionaries(keys, st.text(max_size=40), max_size=6),
    steps=st.lists(reports, min_size=1, max_size=4),
    tags=st.dictionaries(keys.map(lambda k: "t." + k), st.text(max_size=30), max_size=3),
)
def test_a_trial_written_by_the_lean_store_reads_back_as_the_stock_stores(
    stores: tuple[SqlAlchemyStore, SqlAlchemyStore],
    params: dict[str, str],
    steps: list[tuple[int, int, dict[str, float]]],
    tags: dict[str, str],
) -> None:
    seen = []
    for store in stores:
        exp = _experiment(store, "lean-vs-stock")
        batches = [[Metric(k, v, 1_500 + t, step) for k, v in values.items()] for step, t, values in steps]
        run_id = _trial(store, exp, [Param(k, v) for k, v in params.items()], batches,
                        [RunTag(k, v) for k, v in tags.items()])  # fmt: skip
        seen.append(_seen(_read_back(store), run_id))
    assert seen[0] == seen[1]


def _refusal(call: Callable[[], object]) -> str:
    with pytest.raises(MlflowException) as caught:
        call()
    return str(caught.value.error_code)


def _refusals(store: SqlAlchemyStore) -> list[str]:
    codes = []
    exp = _experiment(store, "refusals")
    run_id = store.create_run(exp, "u", 1, [], "r").info.run_id
    store.log_batch(run_id, [], [Param("lr", "0.1")], [])
    codes.append(_refusal(lambda: store.log_batch(run_id, [], [Param("lr", "0.2")], [])))  # params are final
    codes.append(_refusal(lambda: store.create_run(exp, "u", 1, [RunTag("mlflow.runName", "a")], "b")))
    store.delete_run(run_id)
    codes.append(_refusal(lambda: store.log_batch(run_id, [Metric("m", 1.0, 1, 0)], [], [])))
    codes.append(_refusal(lambda: store.log_batch(run_id, [], [Param("x", "1")], [])))
    codes.append(_refusal(lambda: store.update_run_info(run_id, RunStatus.FINISHED, 5, None)))
    codes.append(_refusal(lambda: store.log_batch("no-such-run", [Metric("m", 1.0, 1, 0)], [], [])))
    gone = _experiment(store, "deleted-experiment")
    store.delete_experiment(gone)
    codes.append(_refusal(lambda: store.create_run(gone, "u", 1, [], "r")))
    return codes


def test_the_lean_store_refuses_what_the_stock_store_refuses(stores: tuple[SqlAlchemyStore, SqlAlchemyStore]) -> None:
    stock, lean = stores
    assert _refusals(lean) == _refusals(stock)


def test_the_sweep_tracker_uses_the_lean_store_and_it_takes_fewer_statements(tmp_path: Path) -> None:
    spec = parse_spec({"name": "lean", "task": "tversky.xor", "metric": {"name": "accuracy"}})
    settings = Settings(home=tmp_path)
    store = QueueStore(settings.queue_url)
    store.submit(spec)
    claim = store.claim("test", lease_seconds=600)
    assert claim is not None
    tracker = SweepTracker(settings, store, claim, spec)
    lean = tracker.client._tracking_client.store
    assert type(lean) is LeanRunStore

    def statements(mlflow_store: SqlAlchemyStore) -> int:
        count = [0]

        def counted(*_: Any) -> None:
            count[0] += 1

        event.listen(mlflow_store.engine, "before_cursor_execute", counted)
        try:
            exp = _experiment(mlflow_store, "count")
            _trial(mlflow_store, exp, [Param("seed", "1"), Param("steps", "10")], [[Metric("accuracy", 1.0, 5, 1)]], [])
        finally:
            event.remove(mlflow_store.engine, "before_cursor_execute", counted)
        return count[0]

    stock = SqlAlchemyStore(f"sqlite:///{tmp_path}/stock.db", (tmp_path / "stock-art").as_uri())
    statements(stock), statements(lean)  # the first run of each store warms its caches
    assert statements(lean) <= 0.6 * statements(stock)
