"""The MLflow bridge: one experiment per sweep name, a parent run per sweep, a child run per trial.

Run ids are stored in the queue store, and every run carries `layerlab.*` tags, so a resumed sweep
finds and reuses its runs (first in the store, then by tag in MLflow for a run created just before
a crash) instead of creating duplicates. Ray's MLflowLoggerCallback has neither nesting nor restore.

The per-trial writes (child runs, metrics, files, run statuses) go through the metric outbox in the queue
database and the sweep's shipper (workers.shipper): training never waits for MLflow. What is written here
directly is what the sweep cannot go on without (its experiment and parent run, waited for while the
server is away) and what it writes once at its end (the summary).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from service.importance import param_importances
from service.provenance import code_identity, provenance, provenance_tags
from service.queue import Claim, QueueStore
from service.settings import Settings
from service.spec import SweepSpec
from workers.mlflow_store import (
    PARENT_TAG,
    SWEEP_TAG,
    TRIAL_TAG,
    fast_sqlite_commits,
    first_use_lock,
    short,
    unreachable,
)
from workers.shipper import RETRY_SECONDS, MetricShipper, param_value

log = logging.getLogger(__name__)

EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
MLFLOW_OUTAGE_SECONDS = 900.0
"""How long a sweep waits for an unreachable MLflow server where it cannot go on without it: its
parent run at the start, the rows not yet shipped at the end."""


def task_tags(task_ref: str, task_name: str | None) -> dict[str, str]:
    """The runs' task tags: `layerlab.task` is the task's own name; a Task brought as code (`task_ref` its
    module:attribute, `task_name` its name) has the module:attribute beside it as `layerlab.task_ref`."""
    if task_name is None or task_name == task_ref:
        return {"layerlab.task": task_ref}
    return {"layerlab.task": task_name, "layerlab.task_ref": task_ref}


class SweepTracker:
    def __init__(
        self, settings: Settings, store: QueueStore, claim: Claim, spec: SweepSpec, task_name: str | None = None
    ) -> None:
        self.settings, self.store, self.claim, self.spec = settings, store, claim, spec
        self.task_tags = task_tags(spec.task, task_name)
        self.sweep_id = claim.sweep_id
        self.provenance = {**provenance(), "attempt": claim.attempt, "worker_id": claim.worker_id}
        if claim.code_sha256 is not None:  # the researcher's code: its hash on every run, the archive on the parent
            self.provenance["layerlab.code_sha256"] = claim.code_sha256
        code = code_identity(self.provenance)  # on the sweep's row (`layerlab show`) and on every child run
        if settings.tracking_uri.startswith(("http://", "https://")):
            # MLflow prints a "View run" line for every run it ends on a server: 200 per 200-trial sweep.
            os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        fast_sqlite_commits(settings.tracking_uri)
        with first_use_lock(settings.tracking_uri):  # MlflowClient opens its store (creating it) at once
            self.client = MlflowClient(tracking_uri=settings.tracking_uri)
            self.experiment_id = self._waiting("find the experiment", self._experiment)
        self.parent_run_id = self._waiting("start the parent run", self._parent_run)
        store.set_fields(claim, code=code)
        run_tags = {**self.task_tags, **code}
        self.shipper = MetricShipper(
            store, self.client, self.sweep_id, self.experiment_id, self.parent_run_id, run_tags, settings.tracking_uri
        )

    def close(self) -> None:
        """Stop the shipper's thread (what it has not shipped stays in the database)."""
        self.shipper.stop()

    # --- when the server is down ---------------------------------------------------------------

    def _waiting(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run a write the sweep cannot go on without, waiting out an unreachable server."""
        deadline = time.monotonic() + MLFLOW_OUTAGE_SECONDS
        while True:
            try:
                return fn()
            except Exception as exc:
                if not unreachable(exc) or time.monotonic() > deadline:
                    raise
                log.warning("MLflow unreachable (%s); waiting to %s", short(exc), what)
            time.sleep(RETRY_SECONDS)

    # --- experiment and parent run -----------------------------------------------------------

    def _experiment(self) -> str:
        if self.claim.mlflow_experiment_id:
            return self.claim.mlflow_experiment_id
        exp = self.client.get_experiment_by_name(self.spec.name)
        if exp is not None:
            if EXPERIMENT_KIND_TAG not in exp.tags:  # made by hand, or before the service tagged its own
                self.client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            return str(exp.experiment_id)
        location = None
        if not self.settings.tracking_uri.startswith(("http://", "https://", "databricks")):
            # File store next to a SQLite backend; a tracking server chooses (and proxies) its own.
            location = (self.settings.artifact_root / self.spec.name).as_uri()
        try:
            # MLflow 3's UI opens an experiment on the page its kind names; untagged, it guesses GenAI
            # ("Overview": traces, latency) and the sweep's runs are a click away.
            tags = {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
            return str(self.client.create_experiment(self.spec.name, artifact_location=location, tags=tags))
        except Exception:  # another worker created it between our lookup and create
            exp = self.client.get_experiment_by_name(self.spec.name)
            if exp is None:
                raise
            return str(exp.experiment_id)

    def _find_run(self, extra_filter: str) -> str | None:
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{SWEEP_TAG}` = '{self.sweep_id}' and {extra_filter}",
            max_results=1,
        )
        return runs[0].info.run_id if runs else None

    def _parent_run(self) -> str:
        run_id = self.claim.mlflow_parent_run_id or self._find_run(f"tags.`{PARENT_TAG}` = 'parent'")
        if run_id is None:
            run = self.client.create_run(
                self.experiment_id,
                run_name=f"sweep-{self.sweep_id}",
                tags={PARENT_TAG: "parent", SWEEP_TAG: str(self.sweep_id), **self.task_tags},
            )
            run_id = run.info.run_id
            self.client.log_batch(run_id, params=[Param(k, param_value(v)) for k, v in self._sweep_params().items()])
            with tempfile.TemporaryDirectory() as d:
                (Path(d) / "spec.yaml").write_text(self.claim.spec_yaml)
                self.client.log_artifact(run_id, str(Path(d) / "spec.yaml"))
                if self.claim.code_sha256 is not None:
                    archive = Path(d) / f"{self.claim.code_sha256}.tar.gz"
                    archive.write_bytes(self.store.code(self.claim.code_sha256))
                    self.client.log_artifact(run_id, str(archive), "code")
        else:
            self.client.update_run(run_id, status="RUNNING")
        self._record_provenance(run_id)
        self.store.set_fields(self.claim, mlflow_experiment_id=self.experiment_id, mlflow_parent_run_id=run_id)
        return run_id

    def _record_provenance(self, run_id: str) -> None:
        """This attempt's code, versions and cluster: as tags (the latest attempt's; an attempt may run on
        another worker with other code) and as `provenance/attempt-N.json` (every attempt's)."""
        self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in provenance_tags(self.provenance).items()])
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / f"attempt-{self.claim.attempt}.json"
            path.write_text(json.dumps(self.provenance, indent=2, sort_keys=True))
            self.client.log_artifact(run_id, str(path), "provenance")

    def _sweep_params(self) -> dict[str, Any]:
        s = self.spec
        out: dict[str, Any] = {
            "task": s.task,
            "metric": f"{s.metric.name} ({s.metric.mode})",
            "search": s.search.algorithm,
            "num_samples": s.search.num_samples,
            "scheduler": s.scheduler.type,
            "trials_total": s.trials_total,
        }
        out.update({f"params.{k}": v for k, v in s.params.items()})
        out.update({f"space.{k}": d.model_dump(exclude_none=True) for k, d in s.space.items()})
        return out

    # --- end of sweep ------------------------------------------------------------------------

    def log_summary(self) -> None:
        """Trials table and plots on the parent run."""
        trials = self.store.trials(self.sweep_id)
        metric = self.spec.metric.name
        rows = io.StringIO()
        keys = sorted({k for t in trials for k in t.config})
        writer = csv.writer(rows)
        writer.writerow(["trial_id", "state", "iteration", metric, *keys, "mlflow_run_id"])
        for t in trials:
            config = [t.config.get(k) for k in keys]
            writer.writerow([t.trial_id, t.state, t.iteration, (t.metrics or {}).get(metric), *config, t.mlflow_run_id])
        self.log_files({"trials.csv": rows.getvalue().encode()})
        importances = self._importances(trials)
        if importances is not None:
            self.log_files({"importances.json": json.dumps(importances, indent=2).encode()}, folder="summary")
        from workers.importance_plots import draw_importance

        with tempfile.TemporaryDirectory() as d:
            paths = self._plots(trials, Path(d)) + draw_importance(trials, self.spec, Path(d), importances)
            self.log_files({path.name: path.read_bytes() for path in paths}, folder="plots")

    def _importances(self, trials: list[Any]) -> dict[str, float] | None:
        """What mattered (service.importance) over the finished trials, kept on the sweep's row for `show`."""
        from service.importance import finished_history

        finished = finished_history(trials, self.spec)
        importances = param_importances(self.spec.space, finished, self.spec.metric.mode or "max")
        self.store.set_fields(self.claim, importances=importances)
        return importances

    def log_files(self, files: dict[str, bytes], folder: str | None = None) -> None:
        """Write named files (the sweep's summary) as artifacts of the parent run."""
        self.shipper.log_files(self.parent_run_id, files, folder)

    def _plots(self, trials: list[Any], folder: Path) -> list[Path]:
        from workers.summary_plots import STEP_KEY, draw_summary

        # Each trial's history as the outbox holds it: the steps MLflow shows, with no query per trial.
        history = self.store.outbox_history(self.sweep_id)
        metric = self.spec.metric.name

        def column(t: Any, key: str) -> dict[int, float]:
            return {step: m[key] for step, m in history.get(t.trial_id, {}).items() if key in m}

        from workers.pbt import draw_schedule

        paths = draw_summary(trials, lambda t: column(t, metric), self.spec, folder, lambda t: column(t, STEP_KEY))
        return paths + draw_schedule(history, self.spec, folder)

    def end_parent(self, status: str, best: dict[str, Any] | None = None) -> None:
        if best:
            self.client.log_batch(
                self.parent_run_id,
                metrics=[Metric(f"best/{self.spec.metric.name}", float(best["value"]), int(time.time() * 1000), 0)],
                tags=[],
            )
            self.client.set_tag(self.parent_run_id, "layerlab.best_trial_id", best["trial_id"])
            self.client.set_tag(self.parent_run_id, "layerlab.best_config", json.dumps(best["config"])[:5000])
        self.client.set_terminated(self.parent_run_id, status=status)


__all__ = ["PARENT_TAG", "SWEEP_TAG", "TRIAL_TAG", "SweepTracker", "unreachable"]
