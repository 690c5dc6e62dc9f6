"""The worker: claim a sweep, run it as a Ray Tune experiment, record the outcome.

One sweep at a time per worker process. A heartbeat thread renews the lease and notices cancel
requests. A worker that dies (kill -9) stops renewing; its lease expires, the sweep goes back to
the queue, and the next worker resumes it with `Tuner.restore` from the same storage path, its ledger
(workers.durability) deciding what is trained again. Every way an attempt ends closes what it opened:
the MLflow runs and the trial rows match the sweep's end (`_close`), and runs the queue gave up on with
no worker alive are closed by the next worker that polls (`close_abandoned`).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.data_paths import data_path_errors
from service.errors import LeaseLost, SpecError, failure_reason
from service.models import TrialState
from service.queue import Claim, QueueStore
from service.settings import RAY_ENV_DEFAULTS, WORKER_ENV_DEFAULTS, Settings
from service.spec import SweepSpec, parse_spec
from workers.mlflow_store import unreachable
from workers.offer import ClusterOffer
from workers.stop import StopRequests
from workers.supervisor import local_worker_id, take_over_dead_local_leases

log = logging.getLogger(__name__)

# Defaults for Ray and Tune in a worker; an operator's environment wins.
DB_OUTAGE_SECONDS = 900.0
"""How long the worker's queue writes wait out an unreachable database (a restart, a failover) before
the sweep fails. Meanwhile Tune's controller waits in the progress callback; the lease survives a
restart of the database (service.queue.QueueStore.reclaim_expired)."""


class DataPathError(ValueError):
    """A task param names a file or folder outside this worker's LAYERLAB_DATA_ROOTS: the sweep fails
    before anything runs."""


GIVE_BACK_PAUSE_SECONDS = 10.0
"""After giving a sweep back because MLflow did not answer, this long before the next claim."""

_RAY_CODE: list[Path | None] = [None]
"""The working_dir of this process's Ray job: the code of the sweep it runs, None for built-in tasks."""


def ray_cluster_lost(timeout: float = 15.0) -> bool:
    """Whether this process's Ray connection is broken: its cluster's head gone, or started again (a new cluster
    id). Asked after a sweep raised, so that a lost cluster gives the sweep back instead of failing it. The GCS
    query runs in a thread: against a dead head it would wait out Ray's reconnect timeout (a minute)."""
    import ray

    if not ray.is_initialized():
        return False
    answered = threading.Event()
    broken: list[BaseException] = []

    def ask() -> None:
        try:
            ray.nodes()  # type: ignore[no-untyped-call]
        except Exception as exc:  # noqa: BLE001 - any error of the GCS client is a broken connection
            broken.append(exc)
        answered.set()

    threading.Thread(target=ask, name="ray-probe", daemon=True).start()
    if not answered.wait(timeout):
        return True
    return bool(broken)


def ensure_ray(settings: Settings, code: Path | None = None) -> None:
    """Connect to Ray as a job whose runtime_env ships `code` (a sweep's own code) to every trial process,
    or none; a connection made for other code is closed and made again (a new Ray job)."""
    for k, v in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(k, v)
    import ray

    if ray.is_initialized() and _RAY_CODE[0] == code:
        return
    ray.shutdown()  # a job made for other code; nothing when not connected
    _RAY_CODE[0] = code
    job: dict[str, Any] = {"log_to_driver": False, "runtime_env": {"working_dir": str(code)} if code else None}
    if settings.ray_address:
        ray.init(address=settings.ray_address, **job)
    else:
        # "local": a Ray of its own even where `ray start` left a cluster on this host (without it, ray.init
        # joins the latest one: a CI run's test worker joined another test's head and failed on num_cpus).
        ray.init(address="local", num_cpus=settings.ray_num_cpus, include_dashboard=False, **job)


def warm_up(settings: Settings) -> None:
    """Load what a sweep needs before any is claimed, for a spare worker (workers.supervisor.Standby):
    Ray, Tune, the tasks (torch), MLflow's store, and a connection to Ray."""
    import mlflow

    import workers.sweep
    import workers.tracking  # noqa: F401 - imported for its cost
    from jobs.registry import get_task, task_names

    for name in task_names():
        try:
            get_task(name)
        except Exception as exc:  # a task this machine cannot import fails its sweeps, not the spare
            log.warning("task %s does not import here: %s", name, exc)
    ensure_ray(settings)
    try:
        mlflow.MlflowClient(settings.tracking_uri).search_experiments(max_results=1)
    except Exception as exc:  # MLflow away: the sweep's own calls wait for it
        log.info("MLflow at %s did not answer the warm-up: %s", settings.tracking_uri, exc)


class Worker:
    def __init__(self, settings: Settings, worker_id: str | None = None) -> None:
        for k, v in WORKER_ENV_DEFAULTS.items():
            os.environ.setdefault(k, v)
        self.settings = settings
        self.store = QueueStore(settings.queue_url, outage_seconds=DB_OUTAGE_SECONDS)
        self.worker_id = worker_id or local_worker_id()
        self.shutdown = threading.Event()
        self._stop: StopRequests | None = None  # the running attempt's stop requests, if any
        self._handles_signals = False
        self.offer = ClusterOffer(settings)

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: stop the running sweep and give it back to the queue, then exit."""
        self._handles_signals = True

        def _graceful(signum: int, _frame: Any) -> None:
            log.warning("signal %s: stopping after giving the sweep back to the queue", signum)
            self.shutdown.set()
            if self._stop is not None:
                self._stop.shutdown.set()

        signal.signal(signal.SIGTERM, _graceful)
        signal.signal(signal.SIGINT, _graceful)

    def run(self, once: bool = False, exit_when_idle: bool = False) -> None:
        log.info("worker %s polling %s", self.worker_id, self.settings.queue_url)
        try:
            self._poll(once, exit_when_idle)
        finally:
            try:
                self.store.forget_worker(self.worker_id)  # a worker that stops is no longer live
            except Exception as exc:
                log.warning("could not remove worker %s from the queue's workers: %s", self.worker_id, exc)

    def _poll(self, once: bool, exit_when_idle: bool) -> None:
        while not self.shutdown.is_set():
            try:
                if self.settings.take_over_dead_leases:
                    take_over_dead_local_leases(self.store)
                # Only sweeps this worker's Ray cluster can hold (service.routing); the claim is its heartbeat.
                offer = self.offer.nodes(ensure_ray)
                claim = self.store.claim(
                    self.worker_id, self.settings.lease_seconds, offer, self.settings.max_running_per_user
                )
            except Exception as exc:  # database down: keep polling, reconnect by itself
                log.warning("claim failed (%s); retrying in %.0fs", exc, self.settings.poll_seconds)
                self.shutdown.wait(self.settings.poll_seconds)
                continue
            if claim is None:
                self._close_abandoned()  # not before run_claim: nothing may delay a new lease's heartbeat
                if exit_when_idle:
                    return
                self.shutdown.wait(self.settings.poll_seconds)
                continue
            self.run_claim(claim)
            self._close_abandoned()
            if once:
                return

    def _close_abandoned(self) -> None:
        from workers.durability import close_abandoned

        try:
            close_abandoned(self.settings, self.store)
        except Exception as exc:  # never in the way of claiming
            log.warning("closing the runs of abandoned sweeps failed: %s", exc)

    # --- one sweep ---------------------------------------------------------------------------

    def run_claim(self, claim: Claim) -> None:
        # The lease is renewed from the moment of the claim: nothing slow may come first. (Importing
        # Ray and Tune takes seconds, 7 s on a loaded 2-core machine, longer than a short lease: a
        # second worker then took the sweep while the first was still importing and both ran it.)
        stop = self._stop = StopRequests()
        if self.shutdown.is_set():
            stop.shutdown.set()
        stop_beat = threading.Event()
        live_holder: dict[str, Any] = {}
        beat = threading.Thread(target=self._heartbeat, args=(claim, stop_beat, stop), daemon=True)
        beat.start()
        with sweep_log(self.settings, claim.sweep_id):
            try:
                self._execute(claim, stop, live_holder)
            except LeaseLost as exc:
                log.warning("%s", exc)
            except Exception as exc:
                if stop.lease_lost.is_set():
                    log.warning("sweep %s ended after the lease was lost: %s", claim.sweep_id, exc)
                elif ray_cluster_lost():
                    # Ray's core worker holds the old cluster's id: this process cannot join the new one
                    why = f"lost its Ray cluster ({failure_reason(exc)})"
                    self._give_back(claim, live_holder.get("live"), why, stop_worker=True)
                elif unreachable(exc):  # MLflow down or restarting (5xx) at a write outside the shipper
                    why = f"found MLflow unreachable ({failure_reason(exc)})"
                    self._give_back(claim, live_holder.get("live"), why, stop_worker=False)
                    self.shutdown.wait(GIVE_BACK_PAUSE_SECONDS)  # not straight back into the same outage
                else:
                    reason = failure_reason(exc)
                    log.error("sweep %s failed: %s\n%s", claim.sweep_id, reason, traceback.format_exc())
                    self._close(claim, live_holder.get("live"), "FAILED", reason)
            finally:
                stop_beat.set()
                self._stop = None
                live = live_holder.get("live")
                if live is not None:
                    from workers.callbacks import LIVE

                    LIVE.pop(claim.sweep_id, None)
                    live.tracker.close()  # its shipper's thread

    def _give_back(self, claim: Claim, live: Any, why: str, stop_worker: bool) -> None:
        """A fault of the infrastructure, not of the sweep (its Ray cluster gone or started again, MLflow not
        answering a write): the sweep goes back to the queue and the next claim resumes it from the ledger, as
        after a kill; every step of its end is safe to run again (a model registered from its parent run is
        reused). `stop_worker`: this process cannot go on (whatever supervises it, the keeper, systemd,
        Kubernetes, starts a fresh one)."""
        reason = f"worker {self.worker_id} {why}; the sweep resumes on the next claim"
        log.warning("sweep %s: %s", claim.sweep_id, reason)
        if stop_worker:
            self.shutdown.set()
        try:
            if live is not None:
                live.tracker.shipper.drain(wait_seconds=10)  # what is left waits in the outbox for the next attempt
            if self._stop is not None:
                self._stop.ending.set()
            self.store.requeue(claim, reason)
        except LeaseLost as lost:
            log.warning("%s", lost)

    def _close(self, claim: Claim, live: Any, status: str, reason: str) -> None:
        """End a sweep that did not succeed: its unfinished trial rows to error / cancelled, MLflow brought up to
        them (what is left shipped, child runs and parent run ended with `status`, FAILED / KILLED), then the
        sweep in the queue: whoever sees it ended finds its runs ended. If MLflow does not answer, the sweep ends
        unclosed and the queue's closer of abandoned sweeps finishes the job (workers.durability)."""
        trial_state = TrialState.cancelled if status == "KILLED" else TrialState.error
        closed = False
        if live is not None:
            try:
                self.store.close_trials(claim.sweep_id, trial_state, reason)
                if live.tracker.shipper.drain(wait_seconds=60):
                    live.tracker.log_summary()
                    live.tracker.end_parent(status)
                    closed = True
            except Exception as exc:  # MLflow away or refusing: the queue's closer tries again later
                log.warning("sweep %s: could not close its MLflow runs: %s", claim.sweep_id, exc)
        try:
            if self._stop is not None:
                self._stop.ending.set()
            if status == "KILLED":
                self.store.cancelled(claim, reason, closed=closed)
            else:
                self.store.fail(claim, reason, closed=closed)
        except Exception as exc:
            log.warning("sweep %s: recording its end failed: %s", claim.sweep_id, exc)

    def _heartbeat(self, claim: Claim, stop_beat: threading.Event, stop: StopRequests) -> None:
        while not stop_beat.wait(self.settings.heartbeat_seconds):
            try:
                cancel = self.store.heartbeat(claim, self.settings.lease_seconds)
            except LeaseLost as exc:
                if stop.ending.is_set():  # the worker ended the sweep itself meanwhile
                    return
                log.error("%s", exc)
                stop.lease_lost.set()
                return
            except Exception as exc:  # transient database trouble: try again next beat
                log.warning("heartbeat for sweep %s failed: %s", claim.sweep_id, exc)
                continue
            if cancel and not stop.cancel.is_set():
                log.info("sweep %s: cancel requested", claim.sweep_id, extra={"action": "cancel"})
                stop.cancel.set()

    def _execute(self, claim: Claim, stop: StopRequests, holder: dict[str, Any]) -> None:
        from jobs.brought_code import imported_from, load_task
        from jobs.registry import get_task

        spec = SweepSpec.model_validate(claim.spec)
        if claim.code_sha256 is None:
            self._run(claim, spec, get_task(spec.task), None, stop, holder)
            return
        code = self.store.unpacked(claim.code_sha256, self.settings.home_abs / "code")  # the researcher's code
        with imported_from(code):
            task = load_task(code, spec.task)
            try:  # the API could not check params against the code's Config: check them here, before Ray
                parse_spec(claim.spec, data_roots=self.settings.data_roots, code_task=task)
            except SpecError as exc:
                raise ValueError(f"the params do not fit {spec.task}'s config: {'; '.join(exc.errors)}") from None
            self.store.set_fields(claim, task_name=task.name)  # list and show name it by its own name
            self._run(claim, spec, task, code, stop, holder)

    def _run(
        self, claim: Claim, spec: SweepSpec, task: Any, code: Path | None, stop: StopRequests, holder: dict[str, Any]
    ) -> None:
        from ray import tune

        from workers.callbacks import LIVE, LiveSweep
        from workers.durability import Fence, ReportCounts, read_ledger
        from workers.storage import tune_storage
        from workers.sweep import experiment_name, make_run_config, make_trainable, make_tune_config, param_space
        from workers.tracking import MLFLOW_OUTAGE_SECONDS, SweepTracker

        # Checked at submit against the API's LAYERLAB_DATA_ROOTS; this machine's may differ.
        outside = data_path_errors(task.config, spec.params, spec.space, self.settings.data_roots)
        if outside:
            raise DataPathError("; ".join(outside))
        ensure_ray(self.settings, code)
        if self._handles_signals:
            # ray.init installs its own SIGTERM handler (it aborts the driver); ours must win.
            self.install_signal_handlers()
        tracker = SweepTracker(self.settings, self.store, claim, spec, task_name=task.name)
        ledger = read_ledger(self.store, claim.sweep_id)
        storage, fs = tune_storage(self.settings.tune_storage)
        path = f"{storage.rstrip('/')}/{experiment_name(claim.sweep_id, claim.extensions)}"
        # Before any trial of this attempt runs: trial processes of earlier attempts stop writing from now on.
        fence = Fence.for_sweep(storage, claim.sweep_id, claim.attempt)
        try:
            fence.claim()
        except OSError as exc:  # Tune's own writes to this storage will tell; the fence is a second guard
            log.warning("sweep %s: cannot write its fence %s (%s); running unfenced", claim.sweep_id, fence.uri, exc)
        live = LiveSweep(
            claim=claim, store=self.store, tracker=tracker, spec=spec, ledger=ledger, stop=stop, fence=fence,
            storage=self.settings.tune_storage,
        )  # fmt: skip
        live.best = self.store.get(claim.sweep_id).best_metric
        LIVE[claim.sweep_id] = live
        holder["live"] = live
        tracker.shipper.start()  # first, what an earlier attempt left unshipped

        reports = ReportCounts.for_sweep(storage, claim.sweep_id) if spec.scheduler.type == "pbt" else None
        trainable = make_trainable(spec, self.settings.tune_storage, ledger, fence, reports)
        if tune.Tuner.can_restore(path, storage_filesystem=fs):
            log.info("sweep %s: resuming %s", claim.sweep_id, path, extra={"action": "restore"})
            tuner = tune.Tuner.restore(
                path, trainable=trainable, param_space=param_space(spec), resume_errored=True, storage_filesystem=fs
            )
        else:
            if fs is not None:
                Path(storage).mkdir(parents=True, exist_ok=True)
            extension = None
            if claim.extensions:  # `extend`: the new trials, their searcher told of every earlier one
                from service.importance import finished_history

                history = finished_history(self.store.trials(claim.sweep_id), spec)
                extension = (claim.extensions, claim.extension_samples or 1, history)
            tuner = tune.Tuner(
                trainable,
                param_space=param_space(spec),
                tune_config=make_tune_config(spec, extension),
                run_config=make_run_config(claim.sweep_id, spec, logged_keys(task), storage, fs, claim.extensions),
            )
        try:
            results = tuner.fit()
        except Exception:
            if not stop.interrupted:
                raise
            log.info("sweep %s: fit() stopped on request", claim.sweep_id)

        if stop.lease_lost.is_set():
            log.warning("sweep %s: lease lost; leaving the outcome to its new owner", claim.sweep_id)
            return
        if stop.cancel.is_set():
            self._close(claim, live, "KILLED", "cancelled by request; finished trials are kept")
            return
        if stop.shutdown.is_set():
            self.shutdown.set()
            tracker.shipper.drain(wait_seconds=10)  # what is left waits in the outbox for the next attempt
            stop.ending.set()
            self.store.requeue(claim, f"worker {self.worker_id} shut down; the sweep resumes on the next claim")
            return
        if stop.rule is not None:  # Tune ended the unfinished trials without a callback: they did not finish
            log.info("sweep %s: %s", claim.sweep_id, stop.rule)
            self.store.close_trials(claim.sweep_id, TrialState.cancelled, f"not finished: the sweep {stop.rule}")
        reconcile(live, results)
        if not tracker.shipper.drain(wait_seconds=MLFLOW_OUTAGE_SECONDS):  # a sweep ends when nothing is unshipped
            uri = self.settings.tracking_uri
            raise RuntimeError(f"MLflow at {uri} stayed unreachable; this sweep's metrics wait in the queue's outbox")
        kept = [results[i] for i in range(len(results))]  # a ResultGrid: indexed, not typed as iterable
        for earlier in range(claim.extensions):  # an extended sweep's summary and best are over all its trials
            folder = f"{storage.rstrip('/')}/{experiment_name(claim.sweep_id, earlier)}"
            if tune.Tuner.can_restore(folder, storage_filesystem=fs):
                grid = tune.Tuner.restore(folder, trainable=trainable, storage_filesystem=fs).get_results()
                kept += [grid[i] for i in range(len(grid))]
        if stop.rule is not None:  # summary, claims and the best from the trials that finished, not those cut short
            finished = {t.trial_id for t in self.store.trials(claim.sweep_id) if t.state == TrialState.terminated}
            kept = [r for r in kept if trial_id_of(r) in finished]
        self._finish(claim, spec, task, tracker, kept, stop.rule)

    def _finish(
        self, claim: Claim, spec: SweepSpec, task: Any, tracker: Any, results: list[Any], reason: str | None = None
    ) -> None:
        """The sweep's success: best trial, registered model, summary and claims over the trials that finished."""
        from jobs.brought_code import brought_code_line
        from workers.durability import prune_checkpoints
        from workers.registration import load_best_model, register_model

        ok = [r for r in results if r.error is None and finite((r.metrics or {}).get(spec.metric.name))]
        if not ok:
            first = brought_code_line(str(next((r.error for r in results if r.error is not None), None)))
            raise RuntimeError(f"no trial reported {spec.metric.name!r}; first trial error: {first}")
        best = best_result(ok, spec.metric.name, spec.metric.mode or "max")
        value = float(best.metrics[spec.metric.name])
        trial_id = str(best.metrics.get("trial_id"))
        config = best.config
        if spec.scheduler.type == "pbt":  # Tune's may hold a perturbation made at the last report, never trained with
            config = self.store.trial(claim.sweep_id, trial_id).config or config
        self.store.set_fields(claim, best_metric=value, best_config=config, best_trial_id=trial_id)
        if spec.register is not None:
            version = register_model(
                self.settings.tracking_uri,
                task=task,
                task_ref=spec.task,
                model=load_best_model(task, config, *self._best_checkpoint(claim, trial_id, best)),
                config=config,
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
        if spec.claims:
            from service.claims import claims_files

            sweep = {"id": claim.sweep_id, "parent_run_id": tracker.parent_run_id, "trials_total": len(results)}
            tracker.log_files(claims_files(spec, task.metrics, sweep, results, task.baselines), "summary")
        tracker.end_parent("FINISHED", {"value": value, "trial_id": trial_id, "config": config})
        if self._stop is not None:
            self._stop.ending.set()
        self.store.finish(claim, reason)
        pruned = prune_checkpoints(self.store, claim.sweep_id)
        log.info("sweep %s: kept each trial's last checkpoint, deleted %d older ones", claim.sweep_id, pruned)

    def _best_checkpoint(self, claim: Claim, trial_id: str, best: Any) -> tuple[Path, int | None]:
        """A local folder holding the best trial's checkpoint, and the iteration the ledger committed for it
        (workers.checkpoints chooses the file): the ledger's folder (Tune's restored view of a trial that
        finished before a crash may name an older one), else Tune's, else Ray Train's."""
        from ray import tune

        row = next((t for t in self.store.trials(claim.sweep_id) if t.trial_id == trial_id), None)
        committed = row.logged_iteration if row is not None else None
        if row is not None and row.checkpoint_path:
            checkpoint = tune.Checkpoint(row.checkpoint_path)
        elif best.checkpoint is not None:
            checkpoint = best.checkpoint
        elif best.metrics.get("checkpoint_path"):  # a Ray Train trial: its checkpoint lives in Train's storage
            checkpoint = tune.Checkpoint(best.metrics["checkpoint_path"])
        else:
            raise RuntimeError(f"the best trial {trial_id} reported no checkpoint; cannot register a model")
        return Path(checkpoint.to_directory()), committed


def logged_keys(task: Any) -> list[str]:
    """The result keys logged as metrics: the task's metrics and its own step count, the summary curves'
    x axis (workers.summary_plots.STEP_KEY; a task that reports none has none logged)."""
    from workers.summary_plots import STEP_KEY

    return [*task.metrics, *([] if STEP_KEY in task.metrics else [STEP_KEY])]


def reconcile(live: Any, results: Any) -> None:
    """After fit() ran to its end, every trial row must have ended. One still open either finished in Tune's
    restored state before the ledger heard of its end (it is in `results`: ended from there), or is a trial
    Tune's restored state does not know and its searcher did not make again: lost."""
    from workers.callbacks import end_trial

    by_id = {str(r.metrics.get("trial_id")): r for r in results if r.metrics}
    for t in live.store.trials(live.claim.sweep_id):
        if t.state not in (TrialState.running, TrialState.pending):
            continue
        result = by_id.get(t.trial_id)
        if result is not None:
            end_trial(live, t.trial_id, TrialState.error if result.error is not None else TrialState.terminated,
                      result.metrics)  # fmt: skip
            continue
        log.warning("sweep %s: trial %s %s", live.claim.sweep_id, t.trial_id, LOST_REASON)
        live.store.trial_ended(live.claim.sweep_id, t.trial_id, TrialState.lost, reason=LOST_REASON)


def finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def trial_id_of(result: Any) -> str:
    return str((result.metrics or {}).get("trial_id"))


def best_result(results: list[Any], metric: str, mode: str) -> Any:
    """The result whose last value of `metric` is best (ResultGrid.get_best_result(scope="last") over a list);
    `results` all hold a finite value of it."""
    pick = max if mode == "max" else min
    return pick(results, key=lambda r: float(r.metrics[metric]))


LOST_REASON = "lost: it started after Tune's last saved state, and its searcher suggested another trial in its place"


@contextmanager
def sweep_log(settings: Settings, sweep_id: int) -> Iterator[None]:
    """The worker's log lines while it runs a sweep also go to `<home>/logs/sweeps/sweep-ID.log`
    (`layerlab logs ID`)."""
    folder = settings.home_abs / "logs" / "sweeps"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler | None = logging.FileHandler(folder / f"sweep-{sweep_id}.log")
    except OSError as exc:
        log.warning("cannot write the sweep's log under %s: %s", folder, exc)
        handler = None
    if handler is not None:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)
    try:
        yield
    finally:
        if handler is not None:
            logging.getLogger().removeHandler(handler)
            handler.close()


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
