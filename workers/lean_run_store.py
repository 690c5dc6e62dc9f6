"""The worker's MLflow store on SQLite (the embedded stack): MLflow's own SqlAlchemyStore, with the
per-trial writes as SQLAlchemy Core statements on MLflow's tables.

A subclass of MLflow's (untyped) store, written against MLflow 3.17 (requirements.lock pins it):
tests/workers/test_lean_run_store.py holds it to the stock store's rows and refusals, so an MLflow
upgrade that changes them fails there.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mlflow.entities import LifecycleStage, Run, RunData, RunInfo, RunInputs, RunStatus, RunTag, SourceType
from mlflow.environment_variables import MLFLOW_ENABLE_WORKSPACES
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import BAD_REQUEST, INTERNAL_ERROR, TEMPORARILY_UNAVAILABLE
from mlflow.store.db.utils import _get_managed_session_maker
from mlflow.store.tracking.dbmodels.models import SqlExperiment, SqlLatestMetric, SqlMetric, SqlParam, SqlRun, SqlTag
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME, _get_run_name_from_tags
from mlflow.utils.name_utils import _generate_random_name
from mlflow.utils.uri import append_to_uri_path
from mlflow.utils.validation import (
    _validate_batch_log_data,
    _validate_batch_log_limits,
    _validate_param_keys_unique,
    _validate_run_id,
)
from sqlalchemy import Connection, bindparam, event, insert, select, update
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import sessionmaker


def lean_sqlite_runs(tracking_uri: str) -> None:
    """The worker's MLflow client on a SQLite store (the embedded stack) uses `LeanRunStore`. Call
    before the first client for that URI: MLflow keeps one store per URI for the process."""
    if not tracking_uri.startswith("sqlite:///") or MLFLOW_ENABLE_WORKSPACES.get():
        return
    from mlflow.tracking._tracking_service import utils

    utils._register("sqlite", _lean_store)


def _lean_store(store_uri: str, artifact_uri: str | None = None) -> Any:
    from mlflow.tracking._tracking_service.utils import _get_sqlalchemy_store

    store = _get_sqlalchemy_store(store_uri, artifact_uri)
    # Not a workspace-aware store or some other subclass, nor one with a read replica.
    if type(store) is SqlAlchemyStore and store.read_engine is None:
        store.__class__ = LeanRunStore
        # MLflow sets three PRAGMAs at the start of every session, 12 statements per trial; they are
        # settings of the connection, set here once per connection instead.
        if not event.contains(store.engine, "connect", _mlflow_pragmas):  # one engine per URI
            event.listen(store.engine, "connect", _mlflow_pragmas)
        store.engine.dispose()  # connections made before the listener are not reused
        store.ManagedSessionMaker = _get_managed_session_maker(sessionmaker(bind=store.engine), "sqlite-lean")
    return store


def _mlflow_pragmas(dbapi_conn: Any, _record: Any) -> None:
    for pragma in ("foreign_keys = ON", "busy_timeout = 20000", "case_sensitive_like = true"):
        dbapi_conn.execute(f"PRAGMA {pragma}")


class _Unusual(Exception):
    """A write the Core path leaves to MLflow's own code, whose answer (a row, or its error) it gives."""


class LeanRunStore(SqlAlchemyStore):
    """MLflow's SQL store, with the worker's per-trial writes as SQLAlchemy Core statements on MLflow's
    own tables: a child run with its tags, its params, a batch of metrics per report, its end. Through
    MLflow's ORM those cost ~4 sessions and a few hundred ORM objects per trial, most of the worker's
    MLflow time in benchmarks/service_overhead.py (benchmarks/mlflow_bulk_write.py measures both).

    The rows are MLflow 3.17's (requirements.lock pins it): tests/workers/test_lean_run_store.py
    writes the same trials (hypothesis: params, NaN and infinite metrics, repeated steps) through this
    store and the stock one and reads both back through the stock one, and checks that this one
    refuses what the stock one refuses. A write out of the worker's pattern — an unknown or inactive
    run or experiment, a param logged again, a metric row that is there already, a logged model's
    metrics, the run-name tag — is handed to MLflow's own code (`_Unusual`), in a transaction of its
    own once this one is rolled back, so it answers or fails as MLflow does.
    """

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """One Core transaction, its failures raised as MLflow's session maker raises them."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except (MlflowException, _Unusual):
            raise
        except OperationalError as exc:  # the file is locked past busy_timeout, the disk is full...
            raise MlflowException(str(exc), TEMPORARILY_UNAVAILABLE) from exc
        except SQLAlchemyError as exc:
            raise MlflowException(str(exc), BAD_REQUEST) from exc
        except Exception as exc:
            raise MlflowException(str(exc), INTERNAL_ERROR) from exc

    def create_run(self, experiment_id: str, user_id: str, start_time: int, tags: list[Any], run_name: str) -> Run:
        tags = list(tags or [])
        run_name_tag = _get_run_name_from_tags(tags)
        try:
            if run_name and run_name_tag and run_name != run_name_tag:
                raise _Unusual  # MLflow's error
            experiment = int(experiment_id)  # ValueError: an id that is no number, MLflow's error
            with self._transaction() as conn:
                experiments = SqlExperiment.__table__
                found = conn.execute(
                    select(experiments.c.lifecycle_stage, experiments.c.artifact_location).where(
                        experiments.c.experiment_id == experiment
                    )
                ).first()
                if found is None or found.lifecycle_stage != LifecycleStage.ACTIVE:
                    raise _Unusual  # MLflow's "not found" or "must be active"
                run_id = uuid.uuid4().hex
                run_name = run_name or run_name_tag or _generate_random_name()
                if not run_name_tag:
                    tags.append(RunTag(key=MLFLOW_RUN_NAME, value=run_name))
                info = RunInfo(
                    run_id=run_id,
                    run_name=run_name,
                    experiment_id=str(experiment_id),
                    user_id=user_id,
                    status=RunStatus.to_string(RunStatus.RUNNING),
                    start_time=start_time,
                    end_time=None,
                    lifecycle_stage=LifecycleStage.ACTIVE,
                    artifact_uri=append_to_uri_path(found.artifact_location, run_id, self.ARTIFACTS_FOLDER_NAME),
                )
                conn.execute(
                    insert(SqlRun.__table__),
                    {
                        "run_uuid": run_id,
                        "name": run_name,
                        "experiment_id": experiment,
                        "user_id": user_id,
                        "status": info.status,
                        "start_time": start_time,
                        "end_time": None,
                        "deleted_time": None,
                        "lifecycle_stage": info.lifecycle_stage,
                        "artifact_uri": info.artifact_uri,
                        "source_type": SourceType.to_string(SourceType.UNKNOWN),
                        "source_name": "",
                        "entry_point_name": "",
                        "source_version": "",
                    },
                )
                if tags:
                    conn.execute(
                        insert(SqlTag.__table__), [{"run_uuid": run_id, "key": t.key, "value": t.value} for t in tags]
                    )
        except (_Unusual, ValueError):
            return super().create_run(experiment_id, user_id, start_time, tags, run_name)
        return Run(info, RunData(tags=tags), RunInputs(dataset_inputs=[]))

    def log_batch(self, run_id: str, metrics: list[Any], params: list[Any], tags: list[Any]) -> None:
        if not (metrics or params) or any(m.model_id for m in metrics):
            return super().log_batch(run_id, metrics, params, tags)  # tags alone; a logged model's metrics
        _validate_run_id(run_id)
        metrics, params, tags = _validate_batch_log_data(metrics, params, tags)
        _validate_batch_log_limits(metrics, params, tags)
        _validate_param_keys_unique(params)
        try:
            with self._transaction() as conn:
                runs = SqlRun.__table__
                stage = conn.execute(select(runs.c.lifecycle_stage).where(runs.c.run_uuid == run_id)).scalar()
                if stage != LifecycleStage.ACTIVE:
                    raise _Unusual  # MLflow's "not found" or "must be active"
                if params:
                    _insert_params(conn, run_id, params)
                if metrics:
                    self._insert_metrics(conn, run_id, metrics)
        except _Unusual:
            return super().log_batch(run_id, metrics, params, tags)
        self._set_tags(run_id, tags)  # MLflow's own: none in the worker's batches

    def _insert_metrics(self, conn: Connection, run_id: str, metrics: list[Any]) -> None:
        """The metric rows (one per distinct row, as MLflow stores them) and the run's latest value of
        each key: a logged metric replaces the latest if its (step, timestamp, value) is greater."""
        rows: dict[tuple[Any, ...], dict[str, Any]] = {}
        for m in metrics:
            is_nan, value = self.sanitize_metric_value(m.value)
            row = {"run_uuid": run_id, "key": m.key, "value": value, "timestamp": m.timestamp, "step": m.step,
                   "is_nan": is_nan}  # fmt: skip
            rows.setdefault((m.key, m.timestamp, m.step, value, is_nan), row)
        try:
            conn.execute(insert(SqlMetric.__table__), list(rows.values()))
        except IntegrityError:  # a row that is there already: MLflow's path logs the rest
            raise _Unusual from None
        latest_table = SqlLatestMetric.__table__
        found = conn.execute(
            select(latest_table).where(
                latest_table.c.run_uuid == run_id, latest_table.c.key.in_(list({r["key"] for r in rows.values()}))
            )
        ).mappings()
        stored = {row["key"]: dict(row) for row in found}
        latest: dict[str, dict[str, Any]] = {}
        for row in rows.values():
            current = latest.get(row["key"]) or stored.get(row["key"])
            if current is None or _newer(row, current):
                latest[row["key"]] = row
        new = [row for key, row in latest.items() if key not in stored]
        changed = [{f"b_{k}": v for k, v in row.items()} for key, row in latest.items() if key in stored]
        if new:
            conn.execute(insert(latest_table), new)
        if changed:  # executemany: bound names may not be the columns'
            columns = latest_table.c
            conn.execute(
                update(latest_table)
                .where(columns.run_uuid == bindparam("b_run_uuid"), columns.key == bindparam("b_key"))
                .values({c: bindparam(f"b_{c}") for c in ("value", "timestamp", "step", "is_nan")}),
                changed,
            )

    def update_run_info(self, run_id: str, run_status: Any, end_time: int | None, run_name: str | None) -> RunInfo:
        if run_name:
            return super().update_run_info(run_id, run_status, end_time, run_name)  # the name tag too
        runs = SqlRun.__table__
        try:
            with self._transaction() as conn:
                run = conn.execute(select(runs).where(runs.c.run_uuid == run_id)).mappings().first()
                if run is None or run["lifecycle_stage"] != LifecycleStage.ACTIVE:
                    raise _Unusual  # MLflow's "not found" or "must be active"
                values: dict[str, Any] = {}
                if run_status is not None:
                    values["status"] = RunStatus.to_string(run_status)
                if end_time is not None:
                    values["end_time"] = end_time
                if values:
                    conn.execute(update(runs).where(runs.c.run_uuid == run_id).values(**values))
        except _Unusual:
            return super().update_run_info(run_id, run_status, end_time, run_name)
        ended = {**run, **values}
        return RunInfo(
            run_id=ended["run_uuid"],
            run_name=ended["name"],
            experiment_id=str(ended["experiment_id"]),
            user_id=ended["user_id"],
            status=ended["status"],
            start_time=ended["start_time"],
            end_time=ended["end_time"],
            lifecycle_stage=ended["lifecycle_stage"],
            artifact_uri=ended["artifact_uri"],
        )


def _insert_params(conn: Connection, run_id: str, params: list[Any]) -> None:
    params_table = SqlParam.__table__
    keys = [p.key for p in params]
    if conn.execute(
        select(params_table.c.key).where(params_table.c.run_uuid == run_id, params_table.c.key.in_(keys))
    ).first():
        raise _Unusual  # logged before: MLflow's check that the value is the same
    conn.execute(insert(params_table), [{"run_uuid": run_id, "key": p.key, "value": p.value} for p in params])


def _newer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """MLflow's order of a run's latest metric: by step, then timestamp, then the stored value."""
    return (a["step"], a["timestamp"], a["value"]) > (b["step"], b["timestamp"], b["value"])
