"""The worker: claim a sweep, run it as a Ray Tune experiment, record the outcome.

One sweep at a time per worker process. A heartbeat thread renews the lease and notices cancel
requests. A worker that dies (kill -9) stops renewing; its lease expires, the sweep goes back to
the queue, and the next worker resumes it with `Tuner.restore` from the same storage path.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import traceback
import uuid
from pathlib import Path
from typing import Any

from service.data_paths import data_path_errors
from service.errors import LeaseLost
from service.queue import Claim, QueueStore
from service.settings import Settings
from service.spec import SweepSpec

log = logging.getLogger(__name__)

# Defaults for Ray and Tune in a worker; an operator's environment wins.
RAY_ENV_DEFAULTS = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    # Tune's default per-trial loggers, less TensorBoard's: the sweep's metrics are in MLflow, and the
    # TensorBoard files cost the driver ~5% of its loop (benchmarks/service_overhead.py). The JSON and
    # CSV loggers are named in the RunConfig (Tune's ResultGrid reads their files).
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "60",
    "TUNE_MAX_PENDING_TRIALS_PG": "8",
}
DB_OUTAGE_SECONDS = 900.0
"""How long the worker's queue writes wait out an unreachable database (a restart, a failover) before
the sweep fails. Meanwhile Tune's controller waits in the progress callback; the lease survives a
restart of the database (service.queue.QueueStore.reclaim_expired)."""


class DataPathError(ValueError):
    """A task param names a file or folder outside this worker's LAYERLAB_DATA_ROOTS: the sweep fails
    before anything runs."""


def ensure_ray(settings: Settings) -> None:
    for k, v in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(k, v)
    import ray

    if ray.is_initialized():
        return
    if settings.ray_address:
        ray.init(address=settings.ray_address, log_to_driver=False)
    else:
        ray.init(num_cpus=settings.ray_num_cpus, include_dashboard=False, log_to_driver=False)


def interrupt_tune() -> None:
    """Interrupt a running Tuner.fit() the way Ctrl-C does: Tune saves its state with the running
    trials still running, so that Tuner.restore resumes them. (A Stopper would instead mark them
    finished.) Tune listens for SIGUSR1 while fit() runs; without its handler the signal would kill us.
    """
    handler = signal.getsignal(signal.SIGUSR1)
    if callable(handler):
        os.kill(os.getpid(), signal.SIGUSR1)


class Worker:
    def __init__(self, settings: Settings, worker_id: str | None = None) -> None:
        self.settings = settings
        self.store = QueueStore(settings.queue_url, outage_seconds=DB_OUTAGE_SECONDS)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.shutdown = threading.Event()
        self._handles_signals = False

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: stop the running sweep and give it back to the queue, then exit."""
        self._handles_signals = True

        def _graceful(signum: int, _frame: Any) -> None:
            log.warning("signal %s: stopping after giving the sweep back to the queue", signum)
            self.shutdown.set()
            interrupt_tune()

        signal.signal(signal.SIGTERM, _graceful)
        signal.signal(signal.SIGINT, _graceful)

    def run(self, once: bool = False, exit_when_idle: bool = False) -> None:
        log.info("worker %s polling %s", self.worker_id, self.settings.queue_url)
        while not self.shutdown.is_set():
            try:
                claim = self.store.claim(self.worker_id, self.settings.lease_seconds)
            except Exception as exc:  # database down: keep polling, reconnect by itself
                log.warning("claim failed (%s); retrying in %.0fs", exc, self.settings.poll_seconds)
                self.shutdown.wait(self.settings.poll_seconds)
                continue
            if claim is None:
                if exit_when_idle:
                    return
                self.shutdown.wait(self.settings.poll_seconds)
                continue
            self.run_claim(claim)
            if once:
                return

    # --- one sweep ---------------------------------------------------------------------------

    def run_claim(self, claim: Claim) -> None:
        # The lease is renewed from the moment of the claim: nothing slow may come first. (Importing
        # Ray and Tune takes seconds, 7 s on a loaded 2-core machine, longer than a short lease: a
        # second worker then took the sweep while the first was still importing and both ran it.)
        stop_beat = threading.Event()
        live_holder: dict[str, Any] = {}
        beat = threading.Thread(target=self._heartbeat, args=(claim, stop_beat, live_holder), daemon=True)
        beat.start()
        try:
            self._execute(claim, live_holder)
        except LeaseLost as exc:
            log.warning("%s", exc)
        except Exception as exc:
            live = live_holder.get("live")
            if live is not None and live.lease_lost.is_set():
                log.warning("sweep %s ended after the lease was lost: %s", claim.sweep_id, exc)
            else:
                reason = f"{type(exc).__name__}: {exc}"
                log.error("sweep %s failed: %s\n%s", claim.sweep_id, reason, traceback.format_exc())
                self._safe(lambda: live.tracker.end_parent("FAILED") if live else None)
                self._safe(lambda: self.store.fail(claim, reason[:4000]))
        finally:
            stop_beat.set()
            live = live_holder.get("live")
            if live is not None:
                from workers.sweep import LIVE  # imported by then: _execute registered the sweep there

                LIVE.pop(claim.sweep_id, None)
                self._safe(live.tracker.close)  # its writer thread, if any

    def _safe(self, fn: Any) -> None:
        try:
            fn()
        except Exception as exc:
            log.warning("while recording a failure: %s", exc)

    def _heartbeat(self, claim: Claim, stop: threading.Event, holder: dict[str, Any]) -> None:
        while not stop.wait(self.settings.heartbeat_seconds):
            live = holder.get("live")
            try:
                cancel = self.store.heartbeat(claim, self.settings.lease_seconds)
            except LeaseLost as exc:
                log.error("%s", exc)
                if live is not None:
                    live.lease_lost.set()
                    interrupt_tune()
                return
            except Exception as exc:  # transient database trouble: try again next beat
                log.warning("heartbeat for sweep %s failed: %s", claim.sweep_id, exc)
                continue
            if live is not None:
                if cancel and not live.cancel.is_set():
                    log.info("sweep %s: cancel requested", claim.sweep_id, extra={"action": "cancel"})
                    live.cancel.set()

    def _execute(self, claim: Claim, holder: dict[str, Any]) -> None:
        from ray import tune
        from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

        from jobs.registry import get_task
        from workers.sweep import (
            LIVE,
            CancelStopper,
            LiveSweep,
            ProgressCallback,
            keep_experiment_state_restorable,
            make_trainable,
            make_tune_config,
            param_space,
            repair_experiment_state,
        )
        from workers.tracking import MLFLOW_OUTAGE_SECONDS, SweepTracker

        spec = SweepSpec.model_validate(claim.spec)
        task = get_task(spec.task)
        # Checked at submit against the API's LAYERLAB_DATA_ROOTS; this machine's may differ.
        outside = data_path_errors(task.config, spec.params, spec.space, self.settings.data_roots)
        if outside:
            raise DataPathError("; ".join(outside))
        ensure_ray(self.settings)
        if self._handles_signals:
            # ray.init installs its own SIGTERM handler (it aborts the driver); ours must win.
            self.install_signal_handlers()
        tracker = SweepTracker(self.settings, self.store, claim, spec)
        live = LiveSweep(claim=claim, store=self.store, tracker=tracker, spec=spec)
        live.best = self.store.get(claim.sweep_id).best_metric
        LIVE[claim.sweep_id] = live
        holder["live"] = live

        storage = self.settings.tune_storage
        name = f"sweep-{claim.sweep_id}"
        path = storage.rstrip("/") + "/" + name
        trainable = make_trainable(spec, storage)
        keep_experiment_state_restorable()
        repair_experiment_state(path)
        if tune.Tuner.can_restore(path):
            log.info("sweep %s: resuming %s", claim.sweep_id, path, extra={"action": "restore"})
            tuner = tune.Tuner.restore(path, trainable=trainable, param_space=param_space(spec), resume_errored=True)
        else:
            Path(storage).mkdir(parents=True, exist_ok=True) if "://" not in storage else None
            tuner = tune.Tuner(
                trainable,
                param_space=param_space(spec),
                tune_config=make_tune_config(spec),
                run_config=tune.RunConfig(
                    name=name,
                    storage_path=storage,
                    stop=CancelStopper(claim.sweep_id),
                    callbacks=[
                        ProgressCallback(claim.sweep_id, list(task.metrics)),
                        JsonLoggerCallback(),  # type: ignore[no-untyped-call]
                        CSVLoggerCallback(),  # type: ignore[no-untyped-call]
                    ],
                    failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                    checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
                    verbose=0,
                ),
            )
        results = tuner.fit()

        if live.lease_lost.is_set():
            log.warning("sweep %s: lease lost; leaving the outcome to its new owner", claim.sweep_id)
            return
        if self.shutdown.is_set() and not live.cancel.is_set():
            tracker.flush(wait_seconds=10)  # writes still kept back now are lost (logged_iteration moved on)
            self.store.requeue(claim, f"worker {self.worker_id} shut down; the sweep resumes on the next claim")
            return
        if not tracker.flush(wait_seconds=MLFLOW_OUTAGE_SECONDS):
            uri = self.settings.tracking_uri
            raise RuntimeError(f"MLflow at {uri} stayed unreachable; metrics of this sweep are missing there")
        if live.cancel.is_set():
            tracker.end_open_trials("KILLED")
            tracker.log_summary()
            tracker.end_parent("KILLED")
            self.store.cancelled(claim, "cancelled by request; finished trials are kept")
            return
        self._finish(claim, spec, task, tracker, results)

    def _finish(self, claim: Claim, spec: SweepSpec, task: Any, tracker: Any, results: Any) -> None:
        from workers.registration import load_best_model, register_model

        ok = [r for r in results if r.error is None and r.metrics and spec.metric.name in r.metrics]
        if not ok:
            first = next((r.error for r in results if r.error is not None), None)
            raise RuntimeError(f"no trial reported {spec.metric.name!r}; first trial error: {first}")
        best = results.get_best_result(spec.metric.name, spec.metric.mode, scope="last", filter_nan_and_inf=True)
        value = float(best.metrics[spec.metric.name])
        trial_id = str(best.metrics.get("trial_id"))
        summary = {"value": value, "trial_id": trial_id, "config": best.config}
        self.store.set_fields(claim, best_metric=value, best_config=best.config, best_trial_id=trial_id)
        if spec.register is not None:
            model = None
            if best.checkpoint is not None:
                with best.checkpoint.as_directory() as d:
                    model = load_best_model(task, best.config, d)
            elif best.metrics.get("checkpoint_path"):  # a Ray Train trial: its checkpoint lives in Train's storage
                import ray.train

                with ray.train.Checkpoint(path=best.metrics["checkpoint_path"]).as_directory() as d:
                    model = load_best_model(task, best.config, d)
            if model is None:
                raise RuntimeError(f"the best trial {trial_id} reported no checkpoint; cannot register a model")
            version = register_model(
                self.settings.tracking_uri,
                task=task,
                model=model,
                config=best.config,
                name=spec.register.model,
                alias=spec.register.alias,
                parent_run_id=tracker.parent_run_id,
                sweep_id=claim.sweep_id,
                metric_name=spec.metric.name,
                metric_value=value,
            )
            self.store.set_fields(
                claim, model_name=spec.register.model, model_version=version, model_alias=spec.register.alias
            )
        tracker.log_summary()
        summarize = getattr(task, "summarize", None)
        if summarize is not None:
            tracker.log_files(summarize(table_rows(results)), folder="summary")
        tracker.end_parent("FINISHED", summary)
        self.store.finish(claim)


def table_rows(results: Any) -> list[dict[str, Any]]:
    """Rows a task reported under `table` in its last result, each merged with its trial's config.

    The convention lets a task that trains many models per trial (tversky.xor_grid) hand per-model
    outcomes to its sweep-level `summarize`. Read from Tune's results, so it survives a restore.
    """
    rows: list[dict[str, Any]] = []
    for result in results:
        table = (result.metrics or {}).get("table")
        if isinstance(table, list):
            rows.extend({**result.config, **row} for row in table if isinstance(row, dict))
    return rows
