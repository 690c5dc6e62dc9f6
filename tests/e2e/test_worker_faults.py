"""A worker killed mid-sweep, and a sweep cancelled mid-run."""

from __future__ import annotations

import signal
import time
from collections import Counter

import httpx
import pytest

from service.queue import QueueStore
from service.settings import Settings
from tests.faults.conftest import assert_tracked_once

from .conftest import Stack, wait_until

pytestmark = pytest.mark.stack

EIGHT_TRIALS = """
name: crash-xor
task: tversky.xor
metric: {name: loss, mode: min}
params: {features: 8, steps: 1500, report_every: 100}
space:
  intersection: {grid: [product, mean]}
  seed: {grid: [0, 1, 2, 3]}
max_concurrent_trials: 2
register: {model: crash-xor}
"""


def _store(stack: Stack) -> QueueStore:
    return QueueStore(Settings(home=stack.home).queue_url)


def test_killed_worker_sweep_finishes_without_rerunning_finished_trials(workers: Stack) -> None:
    stack, store = workers, _store(workers)
    sweep_id = stack.submit(EIGHT_TRIALS)["id"]
    first = stack.start_worker("doomed")

    def some_finished() -> list[str]:
        done = [t.trial_id for t in store.trials(sweep_id) if t.state == "terminated"]
        running = [t for t in store.trials(sweep_id) if t.state == "running" and t.iteration >= 2]
        return done if len(done) >= 2 and running else []

    wait_until(some_finished, 240, "two finished trials and one mid-way")
    stack.kill_worker(first)  # kill -9 of the worker and the local Ray it started
    finished_before = {t.trial_id: t.starts for t in store.trials(sweep_id) if t.state == "terminated"}
    interrupted = {t.trial_id: t.iteration for t in store.trials(sweep_id) if t.state == "running"}
    assert finished_before and interrupted
    assert stack.sweep(sweep_id)["state"] == "running"  # the lease has not expired yet

    stack.start_worker("rescuer")
    s = stack.wait_state(sweep_id, ("succeeded", "failed", "cancelled"), timeout=300)
    assert s["state"] == "succeeded", s
    assert s["attempts"] == 2
    assert s["trials"]["finished"] == 8 and s["trials"]["total"] == 8

    trials = {t.trial_id: t for t in store.trials(sweep_id)}
    assert len(trials) == 8
    for trial_id, starts in finished_before.items():
        assert trials[trial_id].starts == starts == 1, f"finished trial {trial_id} was started again"
    for trial in trials.values():
        assert trial.state == "terminated" and trial.iteration == 15, (trial.trial_id, trial.iteration)
    # interrupted trials resumed from their checkpoint: they were started once more, not from scratch
    for trial_id in interrupted:
        assert trials[trial_id].starts == 2

    client = stack.mlflow()
    exp = client.get_experiment_by_name("crash-xor")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert sum(r.data.tags.get("layerlab.role") == "parent" for r in runs) == 1
    assert Counter(r.data.tags["layerlab.trial_id"] for r in children) == Counter(dict.fromkeys(trials, 1))
    for child in children:
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "loss")]
        assert sorted(steps) == list(range(1, 16)), (child.data.tags["layerlab.trial_id"], sorted(steps))
    assert s["model"]["version"] == "1"


CANCEL = """
name: cancel-xor
task: tversky.xor
metric: {name: accuracy}
params: {features: 8, report_every: 100}
space:
  steps: {grid: [200, 5000000]}
max_concurrent_trials: 2
"""


def test_cancel_stops_running_trials_and_keeps_finished_ones(workers: Stack) -> None:
    stack, store = workers, _store(workers)
    sweep_id = stack.submit(CANCEL)["id"]
    stack.start_worker("w-cancel")

    def long_trial_running() -> bool:
        trials = store.trials(sweep_id)
        short_done = any(t.config.get("steps") == 200 and t.state == "terminated" for t in trials)
        return short_done and any(t.config.get("steps") == 5000000 and t.iteration >= 1 for t in trials)

    wait_until(long_trial_running, 180, "the short trial to finish and the long one to report")
    r = httpx.post(f"{stack.api_url}/sweeps/{sweep_id}/cancel", headers=stack.headers)
    assert r.status_code == 200 and r.json()["cancel_requested"] is True
    t0 = time.monotonic()
    s = stack.wait_state(sweep_id, ("succeeded", "failed", "cancelled"), timeout=30)
    assert s["state"] == "cancelled", s
    assert time.monotonic() - t0 < 30

    client = stack.mlflow()
    exp = client.get_experiment_by_name("cancel-xor")
    runs = client.search_runs([exp.experiment_id])
    by_steps = {r.data.params.get("steps"): r for r in runs if r.data.tags.get("mlflow.parentRunId")}
    assert by_steps["200"].info.status == "FINISHED"  # the finished trial is kept as it was
    assert by_steps["5000000"].info.status == "KILLED"
    parent = next(r for r in runs if r.data.tags.get("layerlab.role") == "parent")
    assert parent.info.status == "KILLED"
    r = httpx.post(f"{stack.api_url}/sweeps/{sweep_id}/cancel", headers=stack.headers)
    assert r.status_code == 409
    assert r.json()["detail"] == f"sweep {sweep_id} is cancelled; cannot cancel it"


GRACEFUL = """
name: graceful-xor
task: tversky.xor
metric: {name: accuracy}
params: {features: 8, steps: 3000, report_every: 100}
space:
  seed: {grid: [0, 1]}
max_concurrent_trials: 1
"""


def test_sigterm_and_ctrl_c_give_the_sweep_back_and_the_next_worker_finishes_it(workers: Stack) -> None:
    """SIGTERM (`docker stop`, a rolling deploy) and SIGINT (Ctrl-C; Tune's own handler takes it while fit()
    runs) each hand the sweep back with its trials resumable; nothing is run or logged twice."""
    stack, store = workers, _store(workers)
    sweep_id = stack.submit(GRACEFUL)["id"]
    for attempt, signum in enumerate((signal.SIGTERM, signal.SIGINT), start=1):
        worker = stack.start_worker(f"leaving-{signum.name}")
        done = sum(t.iteration for t in store.trials(sweep_id))
        wait_until(lambda d=done: sum(t.iteration for t in store.trials(sweep_id)) >= d + 2, 180, "two more reports")
        worker.send_signal(signum)  # the worker alone, not its process group
        assert worker.wait(timeout=60) == 0, signum.name
        s = stack.sweep(sweep_id)
        assert s["state"] == "queued" and s["attempts"] == attempt and s["reason"] is None, (signum.name, s)
        assert [e.action for e in store.events(sweep_id)][-1] == "requeue"

    stack.start_worker("next")
    s = stack.wait_state(sweep_id, ("succeeded", "failed", "cancelled"), timeout=240)
    assert s["state"] == "succeeded" and s["attempts"] == 3, s
    trials = store.trials(sweep_id)
    assert all(t.iteration == 30 and t.logged_iteration == 30 for t in trials)
    assert_tracked_once(stack.mlflow(), "graceful-xor", {t.trial_id: 30 for t in trials}, "accuracy")
