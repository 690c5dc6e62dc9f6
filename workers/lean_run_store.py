"""The worker's MLflow store on SQLite (the embedded stack): MLflow's own SqlAlchemyStore, less the
reads and statements that the per-trial writes do not need.

A subclass of MLflow's (untyped) store, written against MLflow 3.17 (requirements.lock pins it):
tests/workers/test_lean_run_store.py holds it to the stock store's rows and refusals, so an MLflow
upgrade that changes them fails there.
"""

from __future__ import annotations

import uuid
from typing import Any

from mlflow.entities import LifecycleStage, Run, RunInfo, RunInputs, RunStatus, RunTag, SourceType, ViewType
from mlflow.environment_variables import MLFLOW_ENABLE_WORKSPACES
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INTERNAL_ERROR
from mlflow.store.db.utils import _get_managed_session_maker
from mlflow.store.tracking.dbmodels.models import SqlRun, SqlTag
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
from sqlalchemy import event
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


class LeanRunStore(SqlAlchemyStore):
    """MLflow's SQL store, less the reads that the worker's per-trial writes do not need: a third of
    their cost in benchmarks/service_overhead.py (`mlflow_per_trial.py` measures it). The rows written
    are MLflow's own, through its own code (tests/workers/test_lean_run_store.py compares them with
    the stock store's). MLflow 3.17's SqlAlchemyStore:
    - `create_run` read the experiment again in a second session, with its tags and the trace
      retention settings, and the new run's dataset inputs (it has none);
    - `log_batch` read the run in a session of its own before each part did, and opened a session
      for each empty part (a batch of params still ran the metrics path);
    - `update_run_info` (set_terminated) loaded the run's tags, params and metrics to return its info.
    """

    def create_run(self, experiment_id: str, user_id: str, start_time: int, tags: list[Any], run_name: str) -> Run:
        tags = list(tags or [])
        run_name_tag = _get_run_name_from_tags(tags)
        if run_name and run_name_tag and run_name != run_name_tag:
            return super().create_run(experiment_id, user_id, start_time, tags, run_name)  # its error
        with self.ManagedSessionMaker(read_only=False) as session:
            experiment = self._get_experiment(session, experiment_id, ViewType.ALL)
            self._check_experiment_is_active(experiment)
            run_id = uuid.uuid4().hex
            run_name = run_name or run_name_tag or _generate_random_name()
            if not run_name_tag:
                tags.append(RunTag(key=MLFLOW_RUN_NAME, value=run_name))
            run = SqlRun(
                name=run_name,
                artifact_uri=append_to_uri_path(experiment.artifact_location, run_id, self.ARTIFACTS_FOLDER_NAME),
                run_uuid=run_id,
                experiment_id=experiment_id,
                source_type=SourceType.to_string(SourceType.UNKNOWN),
                source_name="",
                entry_point_name="",
                user_id=user_id,
                status=RunStatus.to_string(RunStatus.RUNNING),
                start_time=start_time,
                end_time=None,
                deleted_time=None,
                source_version="",
                lifecycle_stage=LifecycleStage.ACTIVE,
            )
            run.tags = [SqlTag(key=tag.key, value=tag.value) for tag in tags]
            session.add(run)
            entity = run.to_mlflow_entity()
            return Run(entity.info, entity.data, RunInputs(dataset_inputs=[]))

    def log_batch(self, run_id: str, metrics: list[Any], params: list[Any], tags: list[Any]) -> None:
        if not (metrics or params or tags) or any(m.model_id for m in metrics):
            return super().log_batch(run_id, metrics, params, tags)  # its checks; a logged model's metrics
        _validate_run_id(run_id)
        metrics, params, tags = _validate_batch_log_data(metrics, params, tags)
        _validate_batch_log_limits(metrics, params, tags)
        _validate_param_keys_unique(params)
        try:  # each part reads the run and checks that it is active
            self._log_params(run_id, params)
            if metrics:
                self._log_metrics(run_id, metrics)
            self._set_tags(run_id, tags)
        except MlflowException:
            raise
        except Exception as exc:
            raise MlflowException(str(exc), INTERNAL_ERROR) from exc

    def update_run_info(self, run_id: str, run_status: Any, end_time: int | None, run_name: str | None) -> RunInfo:
        if run_name:
            return super().update_run_info(run_id, run_status, end_time, run_name)  # the name tag too
        with self.ManagedSessionMaker(read_only=False) as session:
            run = self._get_run(run_uuid=run_id, session=session)
            self._check_run_is_active(run)
            if run_status is not None:
                run.status = RunStatus.to_string(run_status)
            if end_time is not None:
                run.end_time = end_time
            session.add(run)
            return RunInfo(
                run_id=run.run_uuid,
                run_name=run.name,
                experiment_id=str(run.experiment_id),
                user_id=run.user_id,
                status=run.status,
                start_time=run.start_time,
                end_time=run.end_time,
                lifecycle_stage=run.lifecycle_stage,
                artifact_uri=run.artifact_uri,
            )
