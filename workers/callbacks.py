"""The Tune callback that records a sweep's trials in the queue (its ledger and metric outbox), and the live
context it reads. It never talks to MLflow: the sweep's shipper (workers.shipper) sends what the queue holds.

Tune pickles the RunConfig's callbacks into the experiment folder and `Tuner.restore` brings back those
objects, not new ones. So the callback holds only the sweep id and looks up the live context (this
attempt's claim, store, tracker, ledger, stop requests) in `LIVE`, which the worker fills before fit() and
clears after.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ray import tune
from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY

from service.models import TrialState
from service.queue import Claim, QueueStore
from service.spec import SweepSpec
from workers.durability import Fence, Ledger, checkpoint_uri, finished_result, train_checkpoint_uri
from workers.pbt import step_extras
from workers.result_keys import ARTIFACTS_KEY, EXPLOIT_KEY, ITERATION_KEY, NODE_KEY, REPLAYED_KEY

if TYPE_CHECKING:
    from workers.stop import StopRequests
    from workers.tracking import SweepTracker

log = logging.getLogger(__name__)


@dataclass
class LiveSweep:
    claim: Claim
    store: QueueStore
    tracker: SweepTracker
    spec: SweepSpec
    ledger: Ledger
    stop: StopRequests
    fence: Fence | None = None
    storage: str = ""
    """The sweep's Tune storage setting (a path or a URI), where Ray Train trials keep their checkpoints."""
    best: float | None = None
    iterations: dict[str, int] = field(default_factory=dict)
    """Trial id -> the iteration of its latest result (the one a checkpoint comes with)."""


LIVE: dict[int, LiveSweep] = {}


def numeric(result: dict[str, Any], keys: Any) -> dict[str, float]:
    out = {}
    for k in keys:
        v = result.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out[k] = float(v)
    return out


class FitInterrupted(Exception):
    """Raised by the callback on Tune's thread to end fit() early (cancel, shutdown, a lost lease)."""


class ProgressCallback(tune.Callback):
    """Driver-side: trial progress, each step's metrics and files, checkpoints and ends to the queue, in one
    transaction each; then a nudge to the shipper."""

    def __init__(self, sweep_id: int, metric_keys: list[str]) -> None:
        self.sweep_id = sweep_id
        self.metric_keys = metric_keys

    @property
    def live(self) -> LiveSweep | None:
        return LIVE.get(self.sweep_id)

    def _finished_before(self, live: LiveSweep, trial_id: str) -> bool:
        record = live.ledger.get(trial_id)
        return record is not None and record.final_result is not None

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        live = self.live
        if live is None:
            return
        if live.tracker.shipper.failure is not None:  # MLflow refused a write: the sweep fails with it
            raise live.tracker.shipper.failure
        if live.stop.any():
            # Out of fit() the way a crash leaves it (Tune ends the trials' actors and re-raises), which is
            # what the ledger is for: the stored state keeps the running trials resumable, and a restore
            # from it is exactly a restore after kill -9. (Tune's SIGINT handler, which saves once more
            # first, is off in workers: TUNE_DISABLE_SIGINT_HANDLER, so that Ctrl-C reaches the worker.)
            live.stop.interrupted = True
            raise FitInterrupted(f"sweep {self.sweep_id}: stop requested")

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        live = self.live
        if live is None or self._finished_before(live, trial.trial_id):
            return
        # Under PBT a trial's config is the one its results trained with: a restart may bring one that never trains
        # (an exploit at the last report hands over a finished checkpoint), so only a first start sets it here.
        pbt = live.spec.scheduler.type == "pbt" and trial.trial_id in live.iterations
        live.store.trial_started(self.sweep_id, trial.trial_id, None if pbt else dict(trial.config))
        live.tracker.shipper.notify()

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        # The files leave the result here (Tune lets callbacks change it in place): else Tune keeps
        # them as the trial's last result, in every save of the experiment state and in result.json.
        files = result.pop(ARTIFACTS_KEY, None)
        exploit = result.pop(EXPLOIT_KEY, None)
        live = self.live
        if live is None or result.get(REPLAYED_KEY):
            return
        step = int(result.get(ITERATION_KEY) or result.get("training_iteration", 0))
        live.iterations[trial.trial_id] = step
        metrics = numeric(result, self.metric_keys)
        tags = config = None
        if live.spec.scheduler.type == "pbt":  # the config the step trained with, and an exploit it started from
            config = dict(result.get("config") or trial.config)
            extra, tags = step_extras(live.spec, step, config, exploit)
            metrics.update(extra)
        node = result.get(NODE_KEY)
        # The step's row in the outbox, with the trial's progress: a step reported again by a trial resumed from
        # an older checkpoint finds its row there and adds nothing.
        live.store.trial_result(
            self.sweep_id, trial.trial_id, step, metrics, node_id=node if isinstance(node, str) else None,
            files=files if isinstance(files, dict) and files else None, tags=tags or None, config=config,
        )  # fmt: skip
        live.tracker.shipper.notify()
        # A Ray Train trial's checkpoint reaches Tune only as a path in its result (TuneReportCallback): the ledger
        # records it as it does a Tune checkpoint, so a later attempt resumes the TorchTrainer from it.
        train_checkpoint = result.get(CHECKPOINT_PATH_KEY)
        if isinstance(train_checkpoint, str):
            self._record_checkpoint(live, trial.trial_id, step, train_checkpoint_uri(train_checkpoint, live.storage))
        value = metrics.get(live.spec.metric.name)
        if value is not None and _better(value, live.best, live.spec.metric.mode or "max"):
            live.best = value
            live.store.set_fields(
                live.claim, best_metric=value, best_config=config or dict(trial.config), best_trial_id=trial.trial_id
            )

    def on_checkpoint(self, iteration: int, trials: list[Any], trial: Any, checkpoint: Any, **info: Any) -> None:
        live = self.live
        if live is None or self._finished_before(live, trial.trial_id):
            return
        # Tune calls on_trial_result first: the step's row is committed, so the checkpoint is usable at once.
        self._record_checkpoint(
            live, trial.trial_id, live.iterations.get(trial.trial_id, 0), checkpoint_uri(checkpoint)
        )

    def _record_checkpoint(self, live: LiveSweep, trial_id: str, step: int, uri: str) -> None:
        live.store.trial_checkpoint(self.sweep_id, trial_id, uri, step)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._ended(trial, TrialState.terminated)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        live = self.live
        if live is not None and live.fence is not None and (newer := live.fence.superseded()) is not None:
            # The trial stopped at the fence (workers.durability): a newer attempt owns the sweep and this
            # worker's lease is gone, though its heartbeat may not know yet. The trial is the new owner's.
            log.warning("sweep %s: attempt %s owns it now; trial %s left to it", self.sweep_id, newer, trial.trial_id)
            live.stop.lease_lost.set()
            return
        self._ended(trial, TrialState.error)

    def _ended(self, trial: Any, state: TrialState) -> None:
        live = self.live
        if live is None or self._finished_before(live, trial.trial_id):
            return
        end_trial(live, trial.trial_id, state, trial.last_result or {})


def end_trial(live: LiveSweep, trial_id: str, state: TrialState, last_result: dict[str, Any]) -> None:
    """The trial's end in the ledger (a finished trial is never run again); the shipper ends its child run once
    its rows are all in MLflow."""
    final = finished_result(last_result) if state == TrialState.terminated else None
    reason = None if state == TrialState.terminated else "the trial failed (its retries used up); see the worker log"
    live.store.trial_ended(live.claim.sweep_id, trial_id, state, final_result=final, reason=reason)
    live.tracker.shipper.notify()


def _better(value: float, best: float | None, mode: str) -> bool:
    return best is None or (value > best if mode == "max" else value < best)
