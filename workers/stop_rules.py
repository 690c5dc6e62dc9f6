"""The spec's `stop` rules as a Tune Stopper (the public `ray.tune.Stopper` interface).

A trial whose metric reaches `stop.target` is stopped as finished (Tune ends it through `stop_trial`, so the
callback records its end), and once that end is in the queue `stop_all` ends the experiment: Tune stops every
other trial and fit() returns. (Not sooner: a trial that is saving a checkpoint when it reaches the target has
its stop deferred until the save resolves, and `stop_all` ends such a trial without calling the callbacks.)
`stop.max_minutes` counts from the attempt's start (StopRequests.started). Either way the reason goes into the
attempt's StopRequests.rule, which the worker reads after fit(): the trials that did not finish are recorded as
cancelled (Tune's stop_all ends them without a callback), and the sweep ends with the rule as its reason
(workers/worker.py).

The stopper holds only the sweep's id and its rules (Tune pickles it into the experiment's state); the
attempt's live state is looked up in workers.callbacks.LIVE, as the callback does.
"""

from __future__ import annotations

import math
import time
from typing import Any

from ray import tune

from service.spec import SweepSpec
from service.states import TrialState
from workers.callbacks import LIVE, LiveSweep


class RuleStopper(tune.Stopper):
    def __init__(self, sweep_id: int, spec: SweepSpec) -> None:
        assert spec.stop is not None
        self.sweep_id = sweep_id
        self.metric = spec.metric.name
        self.mode = spec.metric.mode or "max"
        self.target = spec.stop.target
        self.max_minutes = spec.stop.max_minutes

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        value = result.get(self.metric)
        if self.target is None or not isinstance(value, int | float) or not math.isfinite(value):
            return False
        reached = value >= self.target if self.mode == "max" else value <= self.target
        if reached:
            live = LIVE.get(self.sweep_id)
            if live is not None and live.stop.rule is None:
                live.stop.reached = trial_id
            self._ended_by(
                f"stopped early: trial {trial_id} reached {self.metric} = {value:.6g} (target {self.target:g})"
            )
        return reached

    def stop_all(self) -> bool:
        live = LIVE.get(self.sweep_id)
        if live is None:
            return False
        if self.max_minutes is not None and time.monotonic() - live.stop.started > self.max_minutes * 60:
            self._ended_by(f"stopped early: its {self.max_minutes:g} minutes (stop.max_minutes) were up")
        if live.stop.rule is None:
            return False
        return live.stop.reached is None or self._recorded(live, live.stop.reached)

    def _recorded(self, live: LiveSweep, trial_id: str) -> bool:
        """Whether the callback has recorded the trial's end (asked only between the target and the end)."""
        return live.store.trial(self.sweep_id, trial_id).state != TrialState.running

    def _ended_by(self, reason: str) -> None:
        live = LIVE.get(self.sweep_id)
        if live is not None and live.stop.rule is None:  # the first rule that fired is the reason
            live.stop.rule = reason
