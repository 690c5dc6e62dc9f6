"""What makes a sweep survive a kill -9 of its worker: the queue's trial rows are the sweep's ledger.

Tune saves its experiment state by its own rules (`TUNE_GLOBAL_CHECKPOINT_S`, every file written whole:
workers.storage), so a restore may start from a state a few seconds behind the trials. The ledger is
never behind: the driver records each trial's steps (in the metric outbox, from which the shipper feeds
MLflow: workers.shipper), checkpoints and end as they happen, each in one transaction. After a restore:
- a trial the ledger holds as finished is not trained again: its trainable reports the stored final
  result and returns (workers.trainable), and nothing about it is logged again (workers.callbacks);
- an interrupted trial resumes from the newer of Tune's checkpoint and the ledger's;
- results a trial reports again after resuming from an older checkpoint find their step in the outbox and add
  nothing (the first value of a step wins), so MLflow gets each step once;
- a trial that Tune's restored state does not know and its searcher does not make again (it started
  after the last save under Optuna or unseeded random sampling) is closed as lost once the experiment has
  run to its end, in the queue and in MLflow, with a reason (`reconcile`).
A trial process of an earlier attempt that outlives its worker (on a Ray cluster of its own, Ray ends a
dead driver's actors only once it notices) writes no checkpoint once a newer attempt owns the sweep
(`Fence`).
Checkpoints are never deleted while the sweep runs (a restored state may name any of them; Tune fails a
trial whose named checkpoint is gone): once it succeeds, each trial keeps its last one (`prune_checkpoints`).

This module is imported inside trial processes too (the ledger travels to the trainable): keep its top
level free of the service and of MLflow.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workers.result_keys import TUNE_KEYS
from workers.storage import is_uri

if TYPE_CHECKING:
    from service.queue import QueueStore
    from service.settings import Settings

log = logging.getLogger(__name__)

Resume = tuple[str | None, int]
"""A trial's newest checkpoint folder in the ledger (a URI; None if it recorded none) and the iteration the ledger
has committed (the trial's highest step in the metric outbox): the checkpoints of earlier attempts up to that
iteration are usable (workers.checkpoints)."""


@dataclass(frozen=True)
class TrialRecord:
    """What the ledger tells a trial's trainable."""

    final_result: dict[str, Any] | None
    """Set once the trial finished: the trainable reports it and returns."""
    resume: Resume | None
    """Where and how far it may resume from (workers.checkpoints)."""


Ledger = dict[str, TrialRecord]
"""Trial id -> record, as the queue held it when this attempt of the sweep started."""


FENCE_FILE = "layerlab-attempt.json"
"""In the sweep's Tune folder: the attempt that owns the sweep now."""


class SupersededAttempt(RuntimeError):
    """Raised in a trial process whose attempt of the sweep is no longer the newest one."""


@dataclass(frozen=True)
class Fence:
    """Which attempt of its sweep a trial process belongs to, and where the sweep's newest attempt is written.

    A worker killed with kill -9 leaves its trial actors behind on a Ray cluster it does not own (`layerlab up`,
    a real cluster) until Ray notices that their owner is gone: 88 s after the kill in tests/faults under a
    load of 20, while the next attempt's restored trials were already writing checkpoints into the same trial
    folders. Each claim writes its attempt number here before it starts Tune (`claim`); a trial process reads
    it before each checkpoint (`check`) and stops, writing nothing, once a newer attempt owns the sweep. The
    attempt counter only grows (a resumed sweep keeps counting), so a newer number always means a newer owner.
    What is left is a window of milliseconds between a check and the write it allows, opened while the next
    attempt is still starting (tens of seconds before its trials write anything)."""

    uri: str
    """The fence file: a local path, or a URI on Tune's storage (s3://...)."""
    attempt: int

    @staticmethod
    def for_sweep(storage: str, sweep_id: int, attempt: int) -> Fence:
        """`storage`: Tune's storage as workers.storage.tune_storage gives it (absolute path or URI)."""
        return Fence(f"{storage.rstrip('/')}/sweep-{sweep_id}/{FENCE_FILE}", attempt)

    def claim(self) -> None:
        """Write this attempt as the sweep's owner, whole (a reader sees the old number or the new one)."""
        write_whole(self.uri, json.dumps({"attempt": self.attempt}).encode())

    def owner(self) -> int | None:
        """The attempt written last, or None if it cannot be read (then nothing is held back: the fence only
        ever stops a process that is sure to be superseded)."""
        try:
            return int(json.loads(read_whole(self.uri))["attempt"])
        except Exception as exc:  # noqa: BLE001 - any unreadable fence counts as no fence
            log.debug("fence %s unreadable: %s", self.uri, exc)
            return None

    def superseded(self) -> int | None:
        """The newer attempt that owns the sweep now, if one does."""
        owner = self.owner()
        return owner if owner is not None and owner > self.attempt else None

    def check(self) -> None:
        """Raise SupersededAttempt if a newer attempt owns the sweep."""
        if (newer := self.superseded()) is not None:
            raise SupersededAttempt(
                f"attempt {newer} of this sweep started after this trial's attempt {self.attempt} (its worker "
                f"is gone or lost its lease): this trial process stops without writing its checkpoint"
            )


@dataclass(frozen=True)
class ReportCounts:
    """Per trial of a PBT sweep, the last iteration it reported, in a small file on Tune's storage.

    PBT restarts a trial from another trial's checkpoint, whose iteration is the other's: after a worker kill the
    population is no longer in step (one trial resumed at 6, another at 4), and the next exploit may hand a
    trial a checkpoint ahead of its last step or behind it. The trial goes on counting its own reports
    (workers.trainable.TuneSession), so each of its steps reaches the outbox once: nothing skipped, nothing
    reported twice. The count is written before each report, so it is never behind the outbox."""

    folder: str

    @staticmethod
    def for_sweep(storage: str, sweep_id: int) -> ReportCounts:
        return ReportCounts(f"{storage.rstrip('/')}/sweep-{sweep_id}/layerlab-reports")

    def write(self, trial_id: str, iteration: int) -> None:
        write_whole(f"{self.folder}/{trial_id}.json", json.dumps({"iteration": iteration}).encode())

    def read(self, trial_id: str) -> int | None:
        """The trial's last count, or None if it wrote none (or it cannot be read)."""
        try:
            return int(json.loads(read_whole(f"{self.folder}/{trial_id}.json"))["iteration"])
        except Exception as exc:  # noqa: BLE001 - no count: the caller falls back to the checkpoint's iteration
            log.debug("no report count of trial %s in %s: %s", trial_id, self.folder, exc)
            return None


def write_whole(uri: str, data: bytes) -> None:
    """Write a small file whole, a local path or a URI on Tune's storage: a reader sees the old bytes or the new."""
    if is_uri(uri):
        import pyarrow.fs as pafs

        fs, path = pafs.FileSystem.from_uri(uri)
        if fs.type_name == "local":  # file://; an object store has no folders to make
            fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(path) as out:  # an object store never shows half an object
            out.write(data)
        return
    os.makedirs(os.path.dirname(uri), exist_ok=True)
    partial = f"{uri}.{uuid.uuid4().hex[:8]}.partial"
    with open(partial, "wb") as out:
        out.write(data)
    os.replace(partial, uri)


def read_whole(uri: str) -> bytes:
    if is_uri(uri):
        import pyarrow.fs as pafs

        fs, path = pafs.FileSystem.from_uri(uri)
        with fs.open_input_stream(path) as f:
            return bytes(f.read())
    with open(uri, "rb") as f:
        return f.read()


def read_ledger(store: QueueStore, sweep_id: int) -> Ledger:
    from service.models import TrialState

    ledger: Ledger = {}
    for t in store.trials(sweep_id):
        finished = t.final_result if t.state == TrialState.terminated else None
        resume = (t.checkpoint_path, t.logged_iteration) if t.checkpoint_path or t.logged_iteration else None
        if finished is not None or resume is not None:
            ledger[t.trial_id] = TrialRecord(finished, resume)
    return ledger


def finished_result(result: dict[str, Any]) -> dict[str, Any]:
    """A finished trial's last result as the ledger keeps it: the task's own keys, JSON values only."""
    out = {}
    for k, v in result.items():
        if k in TUNE_KEYS or k.startswith("layerlab_"):
            continue
        try:
            json.dumps(v, allow_nan=True)
        except (TypeError, ValueError):
            continue
        out[k] = v
    return out


def checkpoint_uri(checkpoint: Any) -> str:
    """A Tune checkpoint as one string that `ray.tune.Checkpoint(uri)` opens again: a local path, or
    scheme://path on an object store."""
    fs_type = checkpoint.filesystem.type_name
    if fs_type == "local" or fs_type.startswith("py::"):
        return str(checkpoint.path)
    return f"{fs_type}://{checkpoint.path}"


def train_checkpoint_uri(path: str, storage: str) -> str:
    """A Ray Train checkpoint's path, as TuneReportCallback hands it on (the path within its filesystem, without
    the scheme of an object store), as a URI that `ray.tune.Checkpoint(uri)` opens again."""
    if is_uri(path) or not is_uri(storage):
        return path
    return f"{storage.split('://', 1)[0]}://{path}"


def prune_checkpoints(store: QueueStore, sweep_id: int) -> int:
    """After a sweep succeeded: of each trial's checkpoint folders, only the one the ledger names stays (it holds
    the checkpoint workers.checkpoints chooses; local storage only: an object store's lifecycle rules are the
    operator's). Returns how many folders were deleted."""
    deleted = 0
    for t in store.trials(sweep_id):
        if not t.checkpoint_path or is_uri(t.checkpoint_path):
            continue
        last = Path(t.checkpoint_path)
        for folder in last.parent.glob("checkpoint_*"):
            if folder != last and folder.is_dir():
                shutil.rmtree(folder, ignore_errors=True)
                deleted += 1
    return deleted


def close_abandoned(settings: Settings, store: QueueStore) -> None:
    """Close the sweeps that the queue gave up on while no worker of theirs was alive (their last worker died on its
    last attempt): their unfinished trials to `error` (`cancelled` for a cancelled sweep), what is left in their
    outbox shipped, their child runs ended as their trial rows say, their parent run ended."""
    from service.models import SweepState, TrialState
    from service.spec import SweepSpec

    for sweep in store.unclosed():
        from mlflow.tracking import MlflowClient  # only when there is a sweep to close: it takes a second

        from workers.mlflow_store import unreachable
        from workers.shipper import MetricShipper
        from workers.tracking import task_tags

        status = "KILLED" if sweep.state == SweepState.cancelled else "FAILED"
        state = TrialState.cancelled if sweep.state == SweepState.cancelled else TrialState.error
        reason = sweep.reason or sweep.state
        store.close_trials(sweep.id, state, reason)
        client = MlflowClient(tracking_uri=settings.tracking_uri)
        tags = task_tags(SweepSpec.model_validate(sweep.spec).task, sweep.task_name)
        assert sweep.mlflow_experiment_id is not None and sweep.mlflow_parent_run_id is not None  # store.unclosed
        shipper = MetricShipper(
            store, client, sweep.id, sweep.mlflow_experiment_id, sweep.mlflow_parent_run_id, tags, settings.tracking_uri
        )
        try:
            if not shipper.drain(wait_seconds=0):
                log.warning("sweep %s: MLflow does not answer; its runs are closed at a later poll", sweep.id)
                continue
        except Exception as exc:
            if unreachable(exc):
                continue
            # A row MLflow refuses stays refused: the runs are closed without it (the worker log names it).
            log.error("sweep %s: MLflow refused a write of its outbox (%s); closing its runs without it", sweep.id, exc)
        try:
            client.set_terminated(sweep.mlflow_parent_run_id, status=status)
        except Exception as exc:  # MLflow away: the next poll tries again
            log.warning("sweep %s: cannot close its MLflow runs yet: %s", sweep.id, exc)
            continue
        if store.mark_closed(sweep.id, state, reason):
            log.info("sweep %s (%s): closed its MLflow runs", sweep.id, sweep.state, extra={"action": "close"})
