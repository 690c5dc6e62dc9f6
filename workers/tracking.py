"""The MLflow bridge: one experiment per sweep name, a parent run per sweep, a child run per trial.

Run ids are stored in the queue store, and every run carries `layerlab.*` tags, so a resumed sweep
finds and reuses its runs (first in the store, then by tag in MLflow for a run created just before
a crash) instead of creating duplicates. Ray's MLflowLoggerCallback has neither nesting nor restore.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunStatus
from mlflow.tracking import MlflowClient

from service.queue import Claim, QueueStore
from service.settings import Settings
from service.spec import SweepSpec

log = logging.getLogger(__name__)

PARENT_TAG, SWEEP_TAG, TRIAL_TAG = "layerlab.role", "layerlab.sweep_id", "layerlab.trial_id"


def _param_value(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v)
    return text[:6000]


class SweepTracker:
    def __init__(self, settings: Settings, store: QueueStore, claim: Claim, spec: SweepSpec) -> None:
        self.client = MlflowClient(tracking_uri=settings.tracking_uri)
        self.settings, self.store, self.claim, self.spec = settings, store, claim, spec
        self.sweep_id = claim.sweep_id
        self.experiment_id = self._experiment()
        self.parent_run_id = self._parent_run()
        self._children: dict[str, str] = {}

    # --- experiment and parent run -----------------------------------------------------------

    def _experiment(self) -> str:
        if self.claim.mlflow_experiment_id:
            return self.claim.mlflow_experiment_id
        exp = self.client.get_experiment_by_name(self.spec.name)
        if exp is not None:
            return str(exp.experiment_id)
        location = None
        if not self.settings.tracking_uri.startswith(("http://", "https://", "databricks")):
            # File store next to a SQLite backend; a tracking server chooses (and proxies) its own.
            location = (self.settings.artifact_root / self.spec.name).as_uri()
        try:
            return str(self.client.create_experiment(self.spec.name, artifact_location=location))
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
                tags={PARENT_TAG: "parent", SWEEP_TAG: str(self.sweep_id), "layerlab.task": self.spec.task},
            )
            run_id = run.info.run_id
            self.client.log_batch(run_id, params=[Param(k, _param_value(v)) for k, v in self._sweep_params().items()])
            with tempfile.TemporaryDirectory() as d:
                (Path(d) / "spec.yaml").write_text(self.claim.spec_yaml)
                self.client.log_artifact(run_id, str(Path(d) / "spec.yaml"))
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.store.set_fields(self.claim, mlflow_experiment_id=self.experiment_id, mlflow_parent_run_id=run_id)
        return run_id

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

    # --- child runs --------------------------------------------------------------------------

    def child_run(self, trial_id: str, config: dict[str, Any]) -> str:
        if trial_id in self._children:
            return self._children[trial_id]
        stored = next((t.mlflow_run_id for t in self.store.trials(self.sweep_id) if t.trial_id == trial_id), None)
        run_id = stored or self._find_run(f"tags.`{TRIAL_TAG}` = '{trial_id}'")
        if run_id is None:
            run = self.client.create_run(
                self.experiment_id,
                run_name=f"trial-{trial_id}",
                tags={
                    "mlflow.parentRunId": self.parent_run_id,
                    SWEEP_TAG: str(self.sweep_id),
                    TRIAL_TAG: trial_id,
                    "layerlab.task": self.spec.task,
                },
            )
            run_id = run.info.run_id
            self.client.log_batch(run_id, params=[Param(k, _param_value(v)) for k, v in config.items()])
        else:
            self.client.update_run(run_id, status="RUNNING")
        run_id = self.store.set_trial_run(self.sweep_id, trial_id, run_id)
        self._children[trial_id] = run_id
        return run_id

    def log_trial_metrics(self, trial_id: str, metrics: dict[str, float], step: int) -> None:
        run_id = self._children.get(trial_id) or self.child_run(trial_id, {})
        ts = _now_ms()
        self.client.log_batch(run_id, metrics=[Metric(k, v, ts, step) for k, v in metrics.items()])

    def log_trial_files(self, trial_id: str, files: dict[str, bytes]) -> None:
        """Files a task logged with `session.log_artifact`, on the trial's child run (re-logging after
        a resume overwrites the same paths: no duplicates)."""
        _log_files(self.client, self._children.get(trial_id) or self.child_run(trial_id, {}), files)

    def end_trial(self, trial_id: str, status: str) -> None:
        run_id = self._children.get(trial_id)
        if run_id:
            self.client.set_terminated(run_id, status=status)

    def end_open_trials(self, status: str) -> None:
        """Close child runs of trials that were still running when the sweep stopped (cancel)."""
        for trial in self.store.trials(self.sweep_id):
            if trial.mlflow_run_id and trial.state in ("running", "pending"):
                run = self.client.get_run(trial.mlflow_run_id)
                if run.info.status == "RUNNING":
                    self.client.set_terminated(trial.mlflow_run_id, status=status)

    # --- end of sweep ------------------------------------------------------------------------

    def log_summary(self) -> None:
        """Trials table and plots on the parent run."""
        trials = self.store.trials(self.sweep_id)
        metric = self.spec.metric.name
        with tempfile.TemporaryDirectory() as d:
            rows = io.StringIO()
            keys = sorted({k for t in trials for k in t.config})
            writer = csv.writer(rows)
            writer.writerow(["trial_id", "state", "iteration", metric, *keys, "mlflow_run_id"])
            for t in trials:
                value = (t.metrics or {}).get(metric)
                writer.writerow(
                    [t.trial_id, t.state, t.iteration, value, *[t.config.get(k) for k in keys], t.mlflow_run_id]
                )
            (Path(d) / "trials.csv").write_text(rows.getvalue())
            self.client.log_artifact(self.parent_run_id, str(Path(d) / "trials.csv"))
            for path in self._plots(trials, Path(d)):
                self.client.log_artifact(self.parent_run_id, str(path), artifact_path="plots")

    def log_files(self, files: dict[str, bytes], folder: str) -> None:
        """Write named files (a task's sweep-level summary) as artifacts of the parent run."""
        _log_files(self.client, self.parent_run_id, files, folder)

    def _plots(self, trials: list[Any], folder: Path) -> list[Path]:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        metric, out = self.spec.metric.name, []
        stem = metric.replace("/", "_")  # slash-grouped metric names (test/accuracy) are not file names
        fig, ax = plt.subplots(figsize=(8, 5))
        for t in trials:
            if not t.mlflow_run_id:
                continue
            hist = self.client.get_metric_history(t.mlflow_run_id, metric)
            if hist:
                hist = sorted(hist, key=lambda m: m.step)
                ax.plot([m.step for m in hist], [m.value for m in hist], alpha=0.6, lw=1)
        ax.set(xlabel="iteration", ylabel=metric, title=f"{self.spec.name}: {metric} per trial")
        fig.tight_layout()
        out.append(folder / f"{stem}_curves.png")
        fig.savefig(out[-1], dpi=100)
        plt.close(fig)

        finals = [(t.trial_id, float(t.metrics[metric])) for t in trials if (t.metrics or {}).get(metric) is not None]
        if finals:
            fig, ax = plt.subplots(figsize=(max(6, len(finals) * 0.3), 4))
            ax.bar(range(len(finals)), [v for _, v in finals])
            ax.set(xlabel="trial", ylabel=f"final {metric}", title=f"{self.spec.name}: final {metric}")
            fig.tight_layout()
            out.append(folder / f"{stem}_final.png")
            fig.savefig(out[-1], dpi=100)
            plt.close(fig)
        return out

    def end_parent(self, status: str, best: dict[str, Any] | None = None) -> None:
        if best:
            self.client.log_batch(
                self.parent_run_id,
                metrics=[Metric(f"best/{self.spec.metric.name}", float(best["value"]), _now_ms(), 0)],
                tags=[],
            )
            self.client.set_tag(self.parent_run_id, "layerlab.best_trial_id", best["trial_id"])
            self.client.set_tag(self.parent_run_id, "layerlab.best_config", json.dumps(best["config"])[:5000])
        self.client.set_terminated(self.parent_run_id, status=status)


def _log_files(client: MlflowClient, run_id: str, files: dict[str, bytes], folder: str | None = None) -> None:
    if not files:
        return
    with tempfile.TemporaryDirectory() as d:
        for name, data in files.items():
            # Path(...).name: a task-chosen name never climbs out of the folder.
            (Path(d) / Path(name).name).write_bytes(data)
        client.log_artifacts(run_id, d, artifact_path=folder)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


__all__ = ["SweepTracker", "RunStatus"]
