"""The sweep's shipper: everything of a trial that MLflow shows, sent from the queue database, where it is
written first.

The callback writes each reported step of a trial into the metric outbox (service.trial_ledger `trial_result`,
in the transaction that records the trial's progress; the first value of a step wins). The shipper, one thread
per sweep, makes MLflow follow the database:
- a child run for each trial row (found by tag first: a kill can come between creating a run and storing its id),
- the outbox rows not yet shipped, in order, each metric with the timestamp stored with it, and the files that
  came with it; then the rows are marked shipped,
- each child run's status from its trial row's state (RUNNING while it runs; FINISHED, FAILED or KILLED once it
  ended and its rows are all shipped), remembered in `trials.mlflow_status`.
Every step is safe to repeat: a kill between a send and its mark sends the row again, the identical metric
(key, value, timestamp, step), which MLflow's SQL store keeps once (tests/workers/test_mlflow_contract.py); files
overwrite their own paths. While MLflow does not answer, rows wait in the database and training goes on; a row
MLflow refuses (4xx) is a failure the sweep ends with (`failure`).
"""

from __future__ import annotations

import base64
import json
import logging
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.store.artifact.artifact_repo import ArtifactRepository
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.tracking import MlflowClient

from service.models import OutboxRow, Trial, TrialState
from service.queue import QueueStore
from workers.mlflow_store import SWEEP_TAG, TRIAL_TAG, short, unreachable

log = logging.getLogger(__name__)

RETRY_SECONDS = 5.0
"""Pause between attempts to reach MLflow while rows wait."""
IDLE_SECONDS = 1.0
"""How often the thread looks at the database unasked (the callback wakes it at once on every write)."""
BATCH_ROWS = 500
MAX_METRICS_PER_CALL = 1000  # MLflow's limit for one log_batch
MAX_TAGS_PER_CALL = 100  # likewise
RUN_STATUS = {
    TrialState.pending: "RUNNING",
    TrialState.running: "RUNNING",
    TrialState.terminated: "FINISHED",
    TrialState.error: "FAILED",
    TrialState.lost: "FAILED",
    TrialState.cancelled: "KILLED",
}


def param_value(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v)
    return text[:6000]


class MetricShipper:
    def __init__(
        self,
        store: QueueStore,
        client: MlflowClient,
        sweep_id: int,
        experiment_id: str,
        parent_run_id: str,
        run_tags: dict[str, str],
        tracking_uri: str,
    ) -> None:
        """`run_tags`: what every child run carries besides its own (the task, the code's identity)."""
        self.store, self.client, self.sweep_id = store, client, sweep_id
        self.experiment_id, self.parent_run_id, self.run_tags = experiment_id, parent_run_id, run_tags
        self.tracking_uri = tracking_uri
        self.failure: BaseException | None = None
        """A write MLflow refused: the sweep fails with it (`drain` raises it)."""
        self._earlier: dict[str, str] | None = None  # trial id -> run id found by tag (_run_of)
        self._repos: dict[str, ArtifactRepository] = {}
        self._waiting_since: float | None = None  # when MLflow stopped answering, while rows wait
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the thread ----------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"shipper-{self.sweep_id}", daemon=True)
        self._thread.start()

    def notify(self) -> None:
        """Something new is in the database: ship it now."""
        self._wake.set()

    def stop(self) -> None:
        """Stop the thread after its current pass (what is left stays in the database)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(IDLE_SECONDS)
            self._wake.clear()
            if self._stop.is_set() or self.failure is not None:
                return
            if self._pass() is None:
                self._stop.wait(RETRY_SECONDS)

    def drain(self, wait_seconds: float) -> bool:
        """Stop the thread, then ship until nothing is left; False if MLflow did not answer for `wait_seconds`.
        Raises the failure of a write MLflow refused."""
        self.stop()
        deadline = time.monotonic() + wait_seconds
        while True:
            writes = self._pass()
            if self.failure is not None:
                raise self.failure
            if writes == 0:  # a pass found MLflow showing everything
                return True
            if writes is None:
                if time.monotonic() > deadline:
                    return False
                time.sleep(RETRY_SECONDS)

    def _pass(self) -> int | None:
        """One pass (its number of writes); None when MLflow does not answer (the rows wait)."""
        try:
            writes = self.ship_once()
        except Exception as exc:
            if not unreachable(exc):
                log.error("sweep %s: MLflow refused a write: %s", self.sweep_id, short(exc))
                self.failure = exc
                return 0
            if self._waiting_since is None:
                self._waiting_since = time.monotonic()
                log.warning("MLflow unreachable (%s); keeping writes until it answers", short(exc))
            return None
        if self._waiting_since is not None:
            waited = time.monotonic() - self._waiting_since
            self._waiting_since = None
            log.info("MLflow answers again after %.0f s: delivered the rows kept back (%d this pass)", waited, writes)
        return writes

    # --- one pass ------------------------------------------------------------------------------

    def ship_once(self) -> int:
        """Bring MLflow up to the database once: runs, unshipped rows, run statuses. Returns how many writes it
        made (0: MLflow already shows everything)."""
        trials = {t.trial_id: t for t in self.store.trials(self.sweep_id)}
        rows = self.store.unshipped(self.sweep_id, BATCH_ROWS)
        waiting: dict[str, list[OutboxRow]] = defaultdict(list)
        for row in rows:
            waiting[row.trial_id].append(row)
        writes = 0
        for trial_id, trial in trials.items():
            run_id = self._run_of(trial)  # a new trial's run is there while it runs, before its first result
            if trial_id in waiting:
                writes += self._send(run_id, waiting.pop(trial_id))
        for trial_id, trial_rows in waiting.items():  # rows of a trial whose row this pass did not read yet
            writes += self._send(self._run_of(self.store.trial(self.sweep_id, trial_id)), trial_rows)
        if len(rows) == BATCH_ROWS:
            return writes + self.ship_once()
        for trial in trials.values():
            writes += self._set_status(trial)
        return writes

    def _send(self, run_id: str, rows: list[OutboxRow]) -> int:
        metrics = [Metric(k, float(v), row.timestamp_ms, row.step) for row in rows for k, v in row.metrics.items()]
        for i in range(0, len(metrics), MAX_METRICS_PER_CALL):
            self.client.log_batch(run_id, metrics=metrics[i : i + MAX_METRICS_PER_CALL])
        tags = [RunTag(k, v) for row in rows for k, v in (row.tags or {}).items()]
        for i in range(0, len(tags), MAX_TAGS_PER_CALL):  # a tag set again to the same value: a resend stays exact
            self.client.log_batch(run_id, tags=tags[i : i + MAX_TAGS_PER_CALL])
        for row in rows:
            if row.files:
                self.log_files(run_id, {k: base64.b64decode(v) for k, v in row.files.items()})
        self.store.mark_shipped([row.id for row in rows])
        return len(rows)

    def _set_status(self, trial: Trial) -> int:
        wanted = RUN_STATUS[TrialState(trial.state)]
        if trial.mlflow_status == wanted or trial.mlflow_run_id is None:
            return 0
        if wanted == "RUNNING":
            self.client.update_run(trial.mlflow_run_id, status="RUNNING")
        else:
            self.client.set_terminated(trial.mlflow_run_id, status=wanted)
        # Only if the trial is still in the state read above: a start in between asks for RUNNING again.
        self.store.set_trial_mlflow_status(self.sweep_id, trial.trial_id, wanted, trial.state)
        return 1

    # --- child runs ----------------------------------------------------------------------------

    def _run_of(self, trial: Trial) -> str:
        """The trial's child run: stored, found by tag, or created now (with the trial's config as params)."""
        if trial.mlflow_run_id is not None:
            return trial.mlflow_run_id
        run_id = self._earlier_runs().get(trial.trial_id)
        if run_id is None:
            run = self.client.create_run(
                self.experiment_id,
                run_name=f"trial-{trial.trial_id}",
                tags={
                    "mlflow.parentRunId": self.parent_run_id,
                    SWEEP_TAG: str(self.sweep_id),
                    TRIAL_TAG: trial.trial_id,
                    **self.run_tags,
                },
            )
            run_id = run.info.run_id
            self._repos[run_id] = get_artifact_repository(run.info.artifact_uri, self.tracking_uri)
            params = [Param(k, param_value(v)) for k, v in (trial.config or {}).items()]
            self.client.log_batch(run_id, params=params)
        run_id = self.store.set_trial_run(self.sweep_id, trial.trial_id, run_id)
        trial.mlflow_run_id = run_id
        return run_id

    def _earlier_runs(self) -> dict[str, str]:
        """Trial id -> child run id of the runs this sweep made in MLflow (a kill can come between creating the
        run and storing its id). Looked up once, not per trial: a search per trial costs the square of the
        trial count."""
        if self._earlier is None:
            found: dict[str, str] = {}
            token = None
            while True:
                page = self.client.search_runs(
                    [self.experiment_id], f"tags.`{SWEEP_TAG}` = '{self.sweep_id}'", max_results=1000, page_token=token
                )
                for run in page:
                    if trial := run.data.tags.get(TRIAL_TAG):
                        found.setdefault(trial, run.info.run_id)
                token = page.token
                if not token:
                    break
            self._earlier = found
        return self._earlier

    def log_files(self, run_id: str, files: dict[str, bytes], folder: str | None = None) -> None:
        """Write named files into a run's artifacts (a task's files, the sweep's summary). Path(...).name: a
        task-chosen name never climbs out of the folder; "", "." and ".." name no file."""
        if run_id not in self._repos:  # MLflow's own log_artifacts reads the whole run back on every call
            uri = self.client.get_run(run_id).info.artifact_uri
            self._repos[run_id] = get_artifact_repository(uri, self.tracking_uri)
        named = {Path(name).name: data for name, data in files.items()}
        for bad in named.keys() & {"", ".", ".."}:
            log.warning("a task logged a file named %r, which names no file: left out", bad)
            del named[bad]
        if not named:
            return
        with tempfile.TemporaryDirectory() as d:
            for name, data in named.items():
                (Path(d) / name).write_bytes(data)
            self._repos[run_id].log_artifacts(d, artifact_path=folder)  # type: ignore[no-untyped-call]
