"""The MLflow bridge: one experiment per sweep name, a parent run per sweep, a child run per trial.

Run ids are stored in the queue store, and every run carries `layerlab.*` tags, so a resumed sweep
finds and reuses its runs (first in the store, then by tag in MLflow for a run created just before
a crash) instead of creating duplicates. Ray's MLflowLoggerCallback has neither nesting nor restore.

Training never waits for MLflow: a write during the sweep that finds the server unreachable is kept,
in order, and delivered once it answers again (`flush`); the sweep ends only after the backlog is in.
With a tracking server, the per-trial writes go through a writer thread (`_submit`): each is a round
trip, about five per trial, that Tune's loop would otherwise wait out (benchmarks/mlflow_per_trial.py).
A save of Tune's state first waits for the writes it must not get ahead of (`settle`).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunStatus
from mlflow.store.artifact.artifact_repo import ArtifactRepository
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.tracking import MlflowClient

from service.queue import Claim, QueueStore
from service.settings import Settings
from service.spec import SweepSpec
from workers.mlflow_store import fast_sqlite_commits, first_use_lock, short, unreachable
from workers.write_queue import WriteQueue

log = logging.getLogger(__name__)

PARENT_TAG, SWEEP_TAG, TRIAL_TAG = "layerlab.role", "layerlab.sweep_id", "layerlab.trial_id"
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
MLFLOW_OUTAGE_SECONDS = 900.0
"""How long a sweep waits for an unreachable MLflow server where it cannot go on without it: its
parent run at the start, the backlog of writes at the end."""
RETRY_SECONDS = 5.0
"""Pause between attempts to reach MLflow while writes are kept back."""


def _param_value(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v)
    return text[:6000]


class SweepTracker:
    def __init__(self, settings: Settings, store: QueueStore, claim: Claim, spec: SweepSpec) -> None:
        self.settings, self.store, self.claim, self.spec = settings, store, claim, spec
        self.sweep_id = claim.sweep_id
        self._children: dict[str, str] = {}
        self._earlier: dict[str, str] | None = None  # see _earlier_runs
        self._backlog: list[tuple[str, Callable[[], object]]] = []  # (what, write), oldest first
        self._retry_at = 0.0
        self._logged_steps: dict[str, set[int]] = {}  # trial id -> the steps MLflow holds (replays)
        # The sweep metric's history of each trial whose child run this attempt created, as logged: the
        # summary's curves then need no MLflow query per trial (200 of them at the end of a 200-trial sweep).
        self._curves: dict[str, dict[int, float]] = {}
        self._steps: dict[str, dict[int, float]] = {}  # and the task's own step at each (summary_plots.STEP_KEY)
        # Run id -> its artifact repository: MLflow's log_artifacts reads the whole run back each time
        # to find where its artifacts go (a run is logged to once or twice: its cache never hits).
        self._repos: dict[str, ArtifactRepository] = {}
        # The writer thread: a tracking server only. A local store's writes are Python work that a thread
        # would only interleave with Tune's loop under the GIL.
        self._writes: WriteQueue | None = None
        if settings.tracking_uri.startswith(("http://", "https://")):
            # MLflow prints a "View run" line for every run it ends on a server: 200 per 200-trial sweep.
            os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
            self._writes = WriteQueue(f"mlflow-writer-{claim.sweep_id}")
        fast_sqlite_commits(settings.tracking_uri)
        with first_use_lock(settings.tracking_uri):  # MlflowClient opens its store (creating it) at once
            self.client = MlflowClient(tracking_uri=settings.tracking_uri)
            self.experiment_id = self._waiting("find the experiment", self._experiment)
        self.parent_run_id = self._waiting("start the parent run", self._parent_run)

    # --- the writer thread ---------------------------------------------------------------------

    def _submit(self, job: Callable[[], None], before_saves: bool) -> None:
        """Run a per-trial write: on the writer thread if there is one, else now. `before_saves`: a
        state save must wait for it (metrics, files, ends: a restore does not replay what a saved
        checkpoint covers). A trial's start need not be waited for: a restore starts the trial again."""
        if self._writes is None:
            job()
        else:
            self._writes.submit(job, before_saves)

    def settle(self, everything: bool = False) -> None:
        """Wait until the writes a state save must not get ahead of are done (every write, with
        `everything`: before the driver's own MLflow calls); raise a write's failure here."""
        if self._writes is not None:
            self._writes.settle(everything)

    def close(self) -> None:
        """Stop the writer thread once its writes are done (a failure stays unraised)."""
        if self._writes is not None:
            self._writes.close()
            self._writes = None

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

    def _write(self, what: str, write: Callable[[], object]) -> None:
        """A write during the sweep: now, or after the ones kept back, or kept back itself."""
        if self._backlog and not self._deliver_backlog():
            self._backlog.append((what, write))
            return
        try:
            write()
        except Exception as exc:
            if not unreachable(exc):
                raise
            log.warning("MLflow unreachable (%s); keeping writes until it answers, from: %s", short(exc), what)
            self._backlog.append((what, write))
            self._retry_at = time.monotonic() + RETRY_SECONDS

    def flush(self, wait_seconds: float = 0.0) -> bool:
        """Wait for the writer thread, then deliver the writes kept back (see _deliver_backlog)."""
        self.settle(everything=True)
        return self._deliver_backlog(wait_seconds)

    def _deliver_backlog(self, wait_seconds: float = 0.0) -> bool:
        """Deliver the writes kept back, oldest first; True once none is left. Tries the server at most
        every RETRY_SECONDS (a cheap health probe first), for up to `wait_seconds`."""
        deadline = time.monotonic() + wait_seconds
        kept = len(self._backlog)
        while self._backlog:
            if time.monotonic() < self._retry_at or not self._answers():
                self._retry_at = max(self._retry_at, time.monotonic() + RETRY_SECONDS)
                if self._retry_at > deadline:
                    return False
                time.sleep(max(0.0, self._retry_at - time.monotonic()))
                continue
            what, write = self._backlog[0]
            try:
                write()  # each write is safe to repeat: see the callers
            except Exception as exc:
                if not unreachable(exc):
                    raise
                self._retry_at = time.monotonic() + RETRY_SECONDS
                continue
            self._backlog.pop(0)
        if kept:
            log.info("MLflow answers again: delivered %d writes kept back", kept)
        return True

    def _answers(self) -> bool:
        uri = self.settings.tracking_uri
        if not uri.startswith(("http://", "https://")):
            return True  # a local store: nothing to probe
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

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

    def start_trial(self, trial_id: str, config: dict[str, Any]) -> None:
        # Safe to repeat: child_run finds a run it created (by tag) before using a new one.
        self._submit(lambda: self._write(f"start trial {trial_id}", lambda: self.child_run(trial_id, config)), False)

    def child_run(self, trial_id: str, config: dict[str, Any]) -> str:
        if trial_id in self._children:
            return self._children[trial_id]
        run_id = self._earlier_runs().get(trial_id)
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
            self._repos[run_id] = get_artifact_repository(run.info.artifact_uri, self.settings.tracking_uri)
            self.client.log_batch(run_id, params=[Param(k, _param_value(v)) for k, v in config.items()])
            self._curves.setdefault(trial_id, {})
        else:
            self.client.update_run(run_id, status="RUNNING")
        run_id = self.store.set_trial_run(self.sweep_id, trial_id, run_id)
        self._children[trial_id] = run_id
        return run_id

    def _earlier_runs(self) -> dict[str, str]:
        """Trial id -> child run id of the runs made before this attempt (stored in the queue, or found
        by tag: a kill can come between creating the run and storing its id). Looked up once per
        attempt, not per trial: a search per trial costs the square of the trial count."""
        if self._earlier is None:
            found: dict[str, str] = {}
            token = None
            while True:
                page = self.client.search_runs(
                    [self.experiment_id], f"tags.`{SWEEP_TAG}` = '{self.sweep_id}'", max_results=1000, page_token=token
                )
                for run in page:
                    trial = run.data.tags.get(TRIAL_TAG)
                    if trial:
                        found.setdefault(trial, run.info.run_id)
                token = page.token
                if not token:
                    break
            found.update({t.trial_id: t.mlflow_run_id for t in self.store.trials(self.sweep_id) if t.mlflow_run_id})
            self._earlier = found
        return self._earlier

    def log_trial_metrics(self, trial_id: str, metrics: dict[str, float], step: int) -> None:
        # The timestamp is taken now: a repeated write is then the same metric, which MLflow stores once.
        batch = _metric_batch(metrics, step)
        self._submit(lambda: self._log_metrics(trial_id, metrics, step, batch), True)

    def _log_metrics(self, trial_id: str, metrics: dict[str, float], step: int, batch: list[Metric]) -> None:
        self._write(f"trial {trial_id} step {step}", lambda: self._log_now(trial_id, metrics, step, batch))

    def _log_now(self, trial_id: str, metrics: dict[str, float], step: int, batch: list[Metric]) -> None:
        run_id = self._children.get(trial_id) or self.child_run(trial_id, {})
        self.client.log_batch(run_id, metrics=batch)
        if (held := self._logged_steps.get(trial_id)) is not None:
            held.add(step)  # a trial retried within this attempt replays it: then it is there
        value = metrics.get(self.spec.metric.name)
        if value is not None and trial_id in self._curves:
            self._curves[trial_id][step] = value
            task_step = metrics.get("step")  # summary_plots.STEP_KEY (not imported here: it loads matplotlib)
            if task_step is not None:
                self._steps.setdefault(trial_id, {})[step] = task_step

    def log_replayed_metrics(self, trial_id: str, metrics: dict[str, float], step: int) -> None:
        """A result for a step that an earlier attempt claimed (`trials.logged_iteration`) before it
        was killed: log it if MLflow never got it (the kill came between the claim and the write).
        Trials replay the steps after their last checkpoint, so such a step comes round again. The check is
        a write like any other: while MLflow does not answer it is kept back, in order, so the ledger's record
        of the checkpoint after this step (after_writes) waits for it."""
        batch = _metric_batch(metrics, step)

        def fill() -> None:
            self._log_if_missing(trial_id, metrics, step, batch)

        self._submit(lambda: self._write(f"trial {trial_id} replayed step {step}", fill), True)

    def _log_if_missing(self, trial_id: str, metrics: dict[str, float], step: int, batch: list[Metric]) -> None:
        # Whether this very step is there, not whether a later one is: an attempt that resumed past a step
        # whose write a kill lost logs the steps after it, and a later replay of the step must still fill it.
        held = self._logged_steps.get(trial_id)
        if held is None:
            held = self._logged_steps[trial_id] = self._steps_in_mlflow(trial_id)
        if step not in held:
            log.info("trial %s: step %d never reached MLflow before a crash; logging it now", trial_id, step)
            self._log_now(trial_id, metrics, step, batch)

    def _steps_in_mlflow(self, trial_id: str) -> set[int]:
        """The steps MLflow holds for the trial (any metric); raises when MLflow does not answer."""
        # The trial's run from an earlier attempt when this one has not looked it up yet (its start may come
        # after its first replayed result reaches here): without it the step would be skipped.
        run_id = self._children.get(trial_id) or self._earlier_runs().get(trial_id)
        if run_id is None:
            return set()  # no run yet: MLflow holds none of its steps
        keys = self.client.get_run(run_id).data.metrics
        return {m.step for key in keys for m in self.client.get_metric_history(run_id, key)}

    def log_trial_files(self, trial_id: str, files: dict[str, bytes]) -> None:
        """Files a task logged with `session.log_artifact`, on the trial's child run (re-logging after
        a resume overwrites the same paths: no duplicates)."""

        def write() -> None:
            _log_files(self._repo(self._children.get(trial_id) or self.child_run(trial_id, {})), files)

        self._submit(lambda: self._write(f"trial {trial_id} files", write), True)

    def after_writes(self, what: str, then: Callable[[], None]) -> None:
        """Call `then` once every write submitted before it is done, in order (kept back with them while
        the server does not answer). The ledger's record of a checkpoint goes this way: recorded before
        the metrics of the step it covers were in MLflow, a kill -9 between the two would make the next
        attempt resume from it and never report that step again."""
        self._submit(lambda: self._write(what, then), True)

    def end_trial(self, trial_id: str, status: str, then: Callable[[], None] | None = None) -> None:
        """End the trial's child run, then call `then` (the ledger's record of the end), in that order
        even when the write is kept back for an unreachable server."""

        def write() -> None:
            run_id = self._children.get(trial_id) or self._earlier_runs().get(trial_id)
            if run_id:
                self.client.set_terminated(run_id, status=status)
            if then is not None:
                then()

        self._submit(lambda: self._write(f"end trial {trial_id}", write), True)

    def end_open_trials(self, status: str) -> None:
        """End the child runs of trials that had not ended when the sweep did (cancel, failure)."""
        self.settle(everything=True)
        for trial in self.store.trials(self.sweep_id):
            if trial.mlflow_run_id and trial.state in ("running", "pending"):
                run = self.client.get_run(trial.mlflow_run_id)
                if run.info.status == "RUNNING":
                    self.client.set_terminated(trial.mlflow_run_id, status=status)

    # --- end of sweep ------------------------------------------------------------------------

    def log_summary(self) -> None:
        """Trials table and plots on the parent run."""
        self.settle(everything=True)
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
        _log_files(self._repo(self.parent_run_id), files, folder)

    def _repo(self, run_id: str) -> ArtifactRepository:
        if run_id not in self._repos:
            uri = self.client.get_run(run_id).info.artifact_uri
            self._repos[run_id] = get_artifact_repository(uri, self.settings.tracking_uri)
        return self._repos[run_id]

    def _plots(self, trials: list[Any], folder: Path) -> list[Path]:
        from workers.summary_plots import STEP_KEY, draw_summary

        metric = self.spec.metric.name

        def logged_here(t: Any) -> bool:  # else an earlier attempt's run: read back from MLflow
            return t.trial_id in self._curves and t.mlflow_run_id == self._children.get(t.trial_id)

        def curve_of(t: Any) -> dict[int, float]:
            if logged_here(t):
                return self._curves[t.trial_id]
            return {m.step: m.value for m in self.client.get_metric_history(t.mlflow_run_id, metric)}

        def steps_of(t: Any) -> dict[int, float]:
            if logged_here(t):
                return self._steps.get(t.trial_id, {})
            return {m.step: m.value for m in self.client.get_metric_history(t.mlflow_run_id, STEP_KEY)}

        return draw_summary(trials, curve_of, self.spec, folder, steps_of)

    def end_parent(self, status: str, best: dict[str, Any] | None = None) -> None:
        self.close()
        if best:
            self.client.log_batch(
                self.parent_run_id,
                metrics=[Metric(f"best/{self.spec.metric.name}", float(best["value"]), _now_ms(), 0)],
                tags=[],
            )
            self.client.set_tag(self.parent_run_id, "layerlab.best_trial_id", best["trial_id"])
            self.client.set_tag(self.parent_run_id, "layerlab.best_config", json.dumps(best["config"])[:5000])
        self.client.set_terminated(self.parent_run_id, status=status)


def _log_files(repo: ArtifactRepository, files: dict[str, bytes], folder: str | None = None) -> None:
    # Path(...).name: a task-chosen name never climbs out of the folder; "", "." and ".." name no file.
    named = {Path(name).name: data for name, data in files.items()}
    for bad in named.keys() & {"", ".", ".."}:
        log.warning("a task logged a file named %r, which names no file: left out", bad)
        del named[bad]
    if not named:
        return
    with tempfile.TemporaryDirectory() as d:
        for name, data in named.items():
            (Path(d) / name).write_bytes(data)
        repo.log_artifacts(d, artifact_path=folder)  # type: ignore[no-untyped-call]


def _metric_batch(metrics: dict[str, float], step: int) -> list[Metric]:
    return [Metric(k, v, _now_ms(), step) for k, v in metrics.items()]


def _now_ms() -> int:
    return int(time.time() * 1000)


__all__ = ["SweepTracker", "RunStatus"]
