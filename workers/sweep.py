"""SweepSpec -> ray.tune.Tuner, and the driver-side hooks that report trial progress.

Tune pickles the RunConfig (callbacks and stopper included) into the experiment folder and
`Tuner.restore` brings back those objects, not new ones. So the callback and stopper hold only the
sweep id and look up the live context (this attempt's claim, store, tracker, cancel flag) in
`LIVE`, which the worker fills before fit() and clears after.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import logging
import math
import os
import pickle
import shutil
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.fs
from ray import tune
from ray.tune.experiment import Trial as TuneTrial
from ray.tune.search import BasicVariantGenerator
from ray.tune.search.variant_generator import parse_spec_vars

from service.models import TrialState
from service.queue import Claim, QueueStore
from service.spec import Domain, SweepSpec
from workers.tracking import SweepTracker
from workers.trainable import ARTIFACTS_KEY, NODE_KEY, run_trial, run_trial_distributed

log = logging.getLogger(__name__)


@dataclass
class LiveSweep:
    claim: Claim
    store: QueueStore
    tracker: SweepTracker
    spec: SweepSpec
    cancel: threading.Event = field(default_factory=threading.Event)
    lease_lost: threading.Event = field(default_factory=threading.Event)
    best: float | None = None
    ended: list[tuple[str, TrialState, str]] = field(default_factory=list)  # see ProgressCallback._ended


LIVE: dict[int, LiveSweep] = {}


def to_domain(d: Domain) -> Any:
    if d.grid is not None:
        return tune.grid_search(list(d.grid))
    if d.choice is not None:
        return tune.choice(list(d.choice))
    if d.uniform is not None:
        return tune.uniform(*d.uniform)
    if d.loguniform is not None:
        return tune.loguniform(*d.loguniform)
    assert d.randint is not None
    return tune.randint(*d.randint)


def param_space(spec: SweepSpec) -> dict[str, Any]:
    return {**spec.params, **{k: to_domain(d) for k, d in spec.space.items()}}


def make_trainable(spec: SweepSpec, storage_path: str) -> Any:
    res = spec.resources
    if spec.uses_train:
        fn = tune.with_parameters(
            run_trial_distributed,
            task_name=spec.task,
            workers=res.workers,
            cpus=res.cpus,
            gpus=res.gpus,
            storage_path=storage_path,
        )
        # The trial itself only drives the TorchTrainer; its workers hold the resources.
        return tune.with_resources(fn, {"CPU": 0.01})
    fn = tune.with_parameters(run_trial, task_name=spec.task, cpus=res.cpus)
    return tune.with_resources(fn, {"CPU": res.cpus, "GPU": res.gpus})


def make_tune_config(spec: SweepSpec) -> tune.TuneConfig:
    search_alg: Any = None
    if spec.search.algorithm == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        search_alg = OptunaSearch(seed=spec.search.seed)
    elif spec.search.algorithm == "random" and spec.search.seed is not None:
        from ray.tune.search import BasicVariantGenerator

        search_alg = BasicVariantGenerator(random_state=spec.search.seed)
    scheduler = None
    if spec.scheduler.type == "asha":
        from ray.tune.schedulers import ASHAScheduler

        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            max_t=spec.scheduler.max_t,
            grace_period=spec.scheduler.grace_period,
            reduction_factor=spec.scheduler.reduction_factor,
        )
    return tune.TuneConfig(
        metric=spec.metric.name,
        mode=spec.metric.mode,
        search_alg=search_alg,
        scheduler=scheduler,
        num_samples=spec.search.num_samples,
        max_concurrent_trials=spec.max_concurrent_trials,
        time_budget_s=spec.time_budget_s,
        # Keep trial processes between trials: a fresh one pays ~3 s of torch imports each time.
        reuse_actors=True,
    )


STATE_SAVE_PERIOD_S = 5.0
"""Longest time between two saves of Tune's experiment state while trials only make progress."""
FOLDER_SYNC_PERIOD_S = 30.0
"""Longest time between two copies of the rest of the experiment folder (the trials' result.json and
progress.csv) to the storage path. fit() ends with one."""
STATE_BACKUP = ".complete"
"""Suffix of the previous version of a Tune state file, which repair_experiment_state falls back on
(folders saved before state files were uploaded atomically kept one; Tune's loaders never match it)."""


def keep_experiment_state_restorable() -> None:
    """Make Tune's experiment state survive a kill -9 of the worker, at a cost that stays small.

    A step saves the state when a restore from the previous save could be wrong, not merely behind:
    - a trial has paused or failed since, or started, unless the searcher makes it again from its
      saved state under the same id and config (`_regenerates_trials`: a grid, a seeded random search):
      else a restore would make it again under a new id, next to the queue row and MLflow run this one
      already has;
    - a trial whose saved state names a checkpoint has made another since: Tune keeps `num_to_keep`
      checkpoints and deletes older ones, so the saved one must never be more than one behind;
    - Tune asks for it (the end of fit, or a trial checkpointing `num_to_keep` times between saves);
    - STATE_SAVE_PERIOD_S has passed.
    A save that is merely behind costs repeated work after a kill, never a wrong count: a trial that
    ended since the last save runs again from its saved checkpoint under its own id, and its results
    since are replayed; none is logged twice (ProgressCallback), and the queue and MLflow learn of an
    end only once a save holds it (ProgressCallback.state_saved), so a trial they call finished is never
    run again. So a trial's end and its first checkpoint ride on the next save instead of making their
    own: for a grid, a save per STATE_SAVE_PERIOD_S (and per checkpoint of a trial the state names a
    checkpoint of), not three per trial; the queue and MLflow hear of ends up to that period late.

    What a save costs (RELIABILITY.md): Tune (2.60) writes its state to a staging folder, then copies
    the whole folder to the storage path, every trial's result files included: at a save per trial,
    the square of the trial count. Here a save writes the state files only, each to a temp
    file renamed into place at the storage path, so a reader (the next `Tuner.restore`) sees the old
    file or the new one, never half of one; the rest of the folder follows every FOLDER_SYNC_PERIOD_S
    in Tune's background copy, with the state files left out of it. (Tune's own in-place writes and
    copies could leave a state file cut short by a kill, after which Tune silently started the whole
    experiment again under new trial ids, found by tests/faults; `repair_experiment_state` still
    mends such a folder.) The experiment state goes first: a kill before the searcher's file follows
    can at worst make one trial twice, never lose one. Each trial's part of the state is
    encoded once per change (re-encoding all of them at every save was most of its cost), and the
    files a trial reports ride in its result only until the callback logs them: they are dropped from
    the result Tune keeps with each checkpoint too (about 40 KB per trial of every save).
    """
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.utils.serialization import TuneFunctionEncoder

    if getattr(TuneController.save_to_dir, "atomic", False):
        return
    on_checkpoint = TuneTrial.on_checkpoint

    def checkpoint(self: Any, force: bool = False, wait: bool = False) -> None:
        manager, saving = self._checkpoint_manager, _saving(self)
        live = {(t.trial_id, t.status) for t in self._trials if t.status not in _NOT_LIVE}
        changed = live - saving.get("live", set())
        if "regenerates" not in saving:  # the searcher is set up (or restored) before the first step
            saving["regenerates"] = _regenerates_trials(self._search_alg)
        if saving["regenerates"]:
            # A restore from the last save makes the trials started since again, under the same ids and
            # configs, so the queue rows and MLflow runs they already have are theirs again.
            changed = {(i, status) for i, status in changed if status != TuneTrial.RUNNING}
        checkpointed_again = [t for t, n in manager._trial_num_checkpoints_since_last_sync.items() if n]
        now = time.monotonic()
        must = (
            force
            or manager._should_force_sync_up
            or bool(changed)
            or any(t.trial_id in saving.get("checkpointed", ()) for t in checkpointed_again)
        )
        if must or now - saving.get("at", 0.0) >= STATE_SAVE_PERIOD_S:
            # The searcher's state (a pickle of every grid point, ~10 ms) changes when it makes a trial;
            # saved then, and on Tune's request or the period. (What it learns from a trial's end only
            # steers later suggestions: it rides along with the next save of the searcher.)
            saving["save_searcher"] = force or not must or len(self._trials) != saving.get("searched")
            self.save_to_dir()
            progress = [c for c in self._callbacks._callbacks if isinstance(c, ProgressCallback)]
            for callback in progress:
                callback.before_state_upload()
            _upload_state_files(self._storage, saving["state_files"], saving.setdefault("uploaded", {}))
            manager._trial_num_checkpoints_since_last_sync.clear()
            manager._should_force_sync_up = False
            checkpointed = {t.trial_id for t in self._trials if t.checkpoint is not None}
            saving.update(live=live, checkpointed=checkpointed, at=now, searched=len(self._trials))
            for callback in progress:
                callback.state_saved()
        if force or now - saving.get("folder_at", -math.inf) >= FOLDER_SYNC_PERIOD_S:
            _sync_folder(self._storage, wait=force or wait, copied=saving.setdefault("copied", {}))
            saving["folder_at"] = now

    def save_to_dir(self: Any) -> None:
        # Ray 2.60's TuneController.save_to_dir, but the state goes to a temp file that is then renamed.
        # The same JSON as Tune's json.dumps(runner_state), but each trial's part is encoded once per
        # change, not at every save: Tune re-makes a trial's (state, metadata) pair only when the trial
        # changed.
        encoded: dict[str, tuple[Any, bytes]] = _saving(self).setdefault("encoded", {})
        parts = []
        for trial_id, pair in self._get_trial_checkpoints().items():
            hit = encoded.get(trial_id)
            if hit is None or hit[0] is not pair:
                hit = encoded[trial_id] = (pair, json.dumps(list(pair)).encode())
            parts.append(hit[1])
        rest = json.dumps(
            {"runner_data": self.__getstate__(), "stats": {"start_time": self._start_time}}, cls=TuneFunctionEncoder
        )
        data = b"".join((b'{"trial_data": [', b", ".join(parts), b"], ", rest[1:].encode()))
        saving = _saving(self)
        save_searcher = saving.pop("save_searcher", True)  # see checkpoint
        staging = Path(self._storage.experiment_driver_staging_path)
        staging.mkdir(parents=True, exist_ok=True)
        final = staging / self.experiment_state_file_name
        partial = final.with_name(final.name + ".partial")
        partial.write_bytes(data)
        os.replace(partial, final)
        if save_searcher:
            self._search_alg.save_to_dir(str(staging), session_str=self._session_str)
        self._callbacks.save_to_dir(str(staging), session_str=self._session_str)
        # This attempt's files (an earlier attempt's are never rewritten), the experiment state first.
        mine = [f for f in _state_files(staging) if self._session_str in f.name and f != final]
        saving["state_files"] = [final, *mine]

    def on_checkpoint_without_files(self: Any, checkpoint_result: Any) -> None:
        checkpoint_result.metrics.pop(ARTIFACTS_KEY, None)
        on_checkpoint(self, checkpoint_result)

    save_to_dir.atomic = True  # type: ignore[attr-defined]
    TuneController.save_to_dir = save_to_dir  # type: ignore[method-assign]
    TuneController.checkpoint = checkpoint  # type: ignore[method-assign]
    TuneTrial.on_checkpoint = on_checkpoint_without_files  # type: ignore[method-assign]


def _regenerates_trials(search_alg: Any) -> bool:
    """Whether a restore from an older save of this searcher (its file and the experiment state are
    saved together) makes the trials it made since again, with the same ids and configs. Tune's
    BasicVariantGenerator (grid and random search) names a trial by its saved prefix and counter; its
    configs repeat when nothing is sampled, or when it samples from its own seeded generator, which is
    saved with it. Optuna and unseeded random sampling give other configs: every start is saved."""
    if not isinstance(search_alg, BasicVariantGenerator):
        return False
    iterators = search_alg._iterators
    if any(it.lazy_eval for it in iterators):  # Tune does not save such a searcher at all
        return False
    # Tune's own split of a spec into resolved values, sampled domains and grids.
    sampled = any(parse_spec_vars(it.unresolved_spec)[1] for it in iterators)
    return search_alg._random_state._rng is not None or not sampled


def _upload_state_files(storage: Any, files: list[Path], uploaded: dict[str, tuple[int, int]]) -> None:
    """This session's state files, each put beside its place at the storage path and renamed into it:
    atomic on a local or shared filesystem; an object store (S3) never shows half an object anyway. A
    file unchanged since its last upload (`uploaded`: name -> inode and mtime; Tune and save_to_dir
    replace their files, never rewrite them) is not sent again. Copies, never hard links: a restore
    that stages into a folder holding links to the stored files truncates them while it copies (found
    by tests/faults: empty state files, the sweep started over)."""
    fs, folder = storage.storage_filesystem, storage.experiment_fs_path
    local = isinstance(fs, pyarrow.fs.LocalFileSystem)
    if local:
        Path(folder).mkdir(parents=True, exist_ok=True)
    else:
        fs.create_dir(folder, recursive=True)
    for path in files:
        stat = path.stat()
        if uploaded.get(path.name) == (stat.st_ino, stat.st_mtime_ns):
            continue
        target = f"{folder}/{path.name}"
        if local:
            shutil.copyfile(path, target + ".partial")
            os.replace(target + ".partial", target)
        else:
            with fs.open_output_stream(target + ".partial") as out:
                out.write(path.read_bytes())
            fs.move(target + ".partial", target)
        uploaded[path.name] = (stat.st_ino, stat.st_mtime_ns)


def _sync_folder(storage: Any, wait: bool, copied: dict[str, tuple[int, int]]) -> None:
    """Copy the experiment folder, less the state files, to the storage path: on a local or shared
    filesystem the files changed since the last copy (`copied`: relative path -> mtime and size);
    elsewhere Tune's background copy of the whole folder."""
    staging, target = storage.experiment_driver_staging_path, storage.experiment_fs_path
    try:
        if isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem):
            _copy_changed_files(Path(staging), Path(target), copied)
            return
        syncer = storage.syncer
        if wait:
            syncer.wait()
        syncer.sync_up(staging, target, exclude=FOLDER_SYNC_EXCLUDE)
        if wait:
            syncer.wait()
    except Exception:  # as Tune does: a failed copy of result files must not end the sweep
        log.exception("copying the experiment folder to %s failed", target)


def _copy_changed_files(staging: Path, target: Path, copied: dict[str, tuple[int, int]]) -> None:
    """Tune's copy with exclusions goes through fsspec, a Python call per file operation, and copies
    every file each time: at the end of a 200-trial sweep ~1000 files, 7% of the worker's time in
    benchmarks/service_overhead.py (Tune's own copy, without exclusions, is native). This one copies
    only what changed since the last call."""
    for folder, _dirs, names in os.walk(staging):
        rel_folder = os.path.relpath(folder, staging)
        for name in names:
            rel = name if rel_folder == "." else f"{rel_folder}/{name}"
            if any(fnmatch.fnmatch(rel, pattern) for pattern in FOLDER_SYNC_EXCLUDE):
                continue
            source = os.path.join(folder, name)
            try:
                stat = os.stat(source)
            except FileNotFoundError:  # replaced or removed while we looked
                continue
            if copied.get(rel) == (stat.st_mtime_ns, stat.st_size):
                continue
            dest = target / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, dest)
            copied[rel] = (stat.st_mtime_ns, stat.st_size)


_NOT_LIVE = (TuneTrial.PENDING, TuneTrial.TERMINATED)
"""Trial states whose change needs no save of its own (see keep_experiment_state_restorable)."""

_SAVING: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _saving(controller: Any) -> dict[str, Any]:
    """What keep_experiment_state_restorable remembers per TuneController: kept outside the controller,
    whose __dict__ Tune writes into every save."""
    return _SAVING.setdefault(controller, {})


def repair_experiment_state(experiment_path: str) -> None:
    """Before a restore from local storage: a state file (the experiment state, the searcher's, the
    callbacks') that a kill cut short while it was being copied there is replaced by its previous
    version, or removed if that is cut short too, so that Tune restores from whole files. Without
    this, one empty searcher file makes Tune start the whole experiment again under new trial ids
    (seen in tests/faults). The copy is not atomic across files, so the repaired file can be one
    save older than its neighbours: at worst a trial that had just started is created again. (An
    object store such as S3 never holds half a file.)"""
    folder = Path(experiment_path)
    if "://" in experiment_path or not folder.is_dir():
        return
    for state in _state_files(folder):
        if _is_whole(state):
            continue
        backup = state.with_name(state.name + STATE_BACKUP)
        if _is_whole(backup):
            log.warning("%s was cut short by a kill; restoring its previous version", state.name)
            os.replace(backup, state)
        else:
            log.warning("%s was cut short by a kill and has no complete version; removing it", state.name)
            state.unlink()


STATE_FILES = ("experiment_state-*.json", "basic-variant-state-*.json", "search_gen_state-*.json", "*-state*.pkl")
"""Tune's experiment state, the searchers' and the callbacks' (Ray 2.60's CKPT_FILE_TMPL names)."""
FOLDER_SYNC_EXCLUDE = [pattern + "*" for pattern in STATE_FILES]
"""What Tune's folder copy leaves to _upload_state_files: the state files, and their temp files."""


def _state_files(folder: Path) -> list[Path]:
    # One listing, not a glob per pattern: the folder holds a sub-folder per trial.
    with os.scandir(folder) as entries:
        names = [e.name for e in entries if e.is_file()]
    return [folder / n for n in sorted(names) if any(fnmatch.fnmatchcase(n, p) for p in STATE_FILES)]


def _is_whole(path: Path) -> bool:
    """The experiment state is JSON; the other state files are pickles (whatever their suffix)."""
    try:
        data = path.read_bytes()
        if path.name.startswith("experiment_state"):
            json.loads(data)
        else:
            pickle.loads(data)  # noqa: S301 - Tune's own files in the sweep's folder; Tune unpickles them next
        return True
    except Exception:  # noqa: BLE001 - any failure to read back means the file is not whole
        return False


class CancelStopper(tune.Stopper):
    """Stops the whole experiment once the sweep is cancelled (trials end; nothing to resume).

    A lost lease or a worker shutting down interrupts fit() instead (workers.worker.interrupt_tune),
    which leaves the running trials resumable.
    """

    def __init__(self, sweep_id: int) -> None:
        self.sweep_id = sweep_id

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return self.stop_all()

    def stop_all(self) -> bool:
        live = LIVE.get(self.sweep_id)
        return live is not None and live.cancel.is_set()


def _numeric(result: dict[str, Any], keys: Any) -> dict[str, float]:
    out = {}
    for k in keys:
        v = result.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out[k] = float(v)
    return out


class ProgressCallback(tune.Callback):
    """Driver-side: trial progress to the queue store, metrics to the trial's MLflow child run."""

    def __init__(self, sweep_id: int, metric_keys: list[str]) -> None:
        self.sweep_id = sweep_id
        self.metric_keys = metric_keys

    @property
    def live(self) -> LiveSweep | None:
        return LIVE.get(self.sweep_id)

    def on_trial_start(self, iteration: int, trials: list[TuneTrial], trial: TuneTrial, **info: Any) -> None:
        live = self.live
        if live is None:
            return
        live.store.trial_started(self.sweep_id, trial.trial_id, dict(trial.config))
        live.tracker.start_trial(trial.trial_id, dict(trial.config))

    def on_trial_result(
        self, iteration: int, trials: list[TuneTrial], trial: TuneTrial, result: dict[str, Any], **info: Any
    ) -> None:
        # The files leave the result here (Tune lets callbacks change it in place): else Tune keeps
        # them as the trial's last result, in every save of the experiment state and in result.json.
        files = result.pop(ARTIFACTS_KEY, None)
        live = self.live
        if live is None:
            return
        step = int(result.get("training_iteration", 0))
        if isinstance(files, dict) and files:
            live.tracker.log_trial_files(trial.trial_id, {k: base64.b64decode(v) for k, v in files.items()})
        metrics = _numeric(result, self.metric_keys)
        node = result.get(NODE_KEY)
        # The high-water mark makes logging idempotent: a trial restored from an older checkpoint
        # reports iterations that were already logged before the crash; those are skipped.
        first_time = live.store.trial_result(
            self.sweep_id, trial.trial_id, step, metrics, node_id=node if isinstance(node, str) else None,
            to_log=bool(metrics),
        )  # fmt: skip
        if first_time:
            live.tracker.log_trial_metrics(trial.trial_id, metrics, step)
        elif metrics:
            live.tracker.log_replayed_metrics(trial.trial_id, metrics, step)
        value = metrics.get(live.spec.metric.name)
        if value is not None and _better(value, live.best, live.spec.metric.mode or "max"):
            live.best = value
            live.store.set_fields(
                live.claim, best_metric=value, best_config=dict(trial.config), best_trial_id=trial.trial_id
            )

    def on_trial_complete(self, iteration: int, trials: list[TuneTrial], trial: TuneTrial, **info: Any) -> None:
        self._ended(trial, TrialState.terminated, "FINISHED")

    def on_trial_error(self, iteration: int, trials: list[TuneTrial], trial: TuneTrial, **info: Any) -> None:
        self._ended(trial, TrialState.error, "FAILED")

    def _ended(self, trial: TuneTrial, state: TrialState, status: str) -> None:
        # Told to the queue and MLflow once a save of Tune's state holds the end (state_saved), which
        # may be a step or a few later (keep_experiment_state_restorable): a kill before it restores the
        # trial as running, and a trial the service has called finished must stay finished.
        live = self.live
        if live is not None:
            live.ended.append((trial.trial_id, state, status))

    def before_state_upload(self) -> None:
        """The stored state must not get ahead of MLflow: a restore does not replay the results a saved
        checkpoint covers, so their writes must be in (or kept back for an unreachable server) first."""
        live = self.live
        if live is not None:
            live.tracker.settle()

    def state_saved(self) -> None:
        """The stored experiment state now holds every trial end so far: record them."""
        live = self.live
        if live is None or not live.ended:
            return
        while live.ended:
            trial_id, state, status = live.ended[0]
            live.store.trial_ended(self.sweep_id, trial_id, state)
            live.tracker.end_trial(trial_id, status)
            live.ended.pop(0)
        live.tracker.settle()  # the queue calls them finished: MLflow must too before a kill can come


def _better(value: float, best: float | None, mode: str) -> bool:
    return best is None or (value > best if mode == "max" else value < best)
