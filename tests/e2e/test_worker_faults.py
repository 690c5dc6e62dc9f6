"""A worker killed mid-sweep and mid-PBT, and a sweep cancelled mid-run."""

from __future__ import annotations

import re
import signal
import time
from collections import Counter

import httpx
import pytest
from mlflow.tracking import MlflowClient

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


# --- a worker killed mid-PBT: the next worker resumes the population, each exploit is recorded on its child
# run, every reported value is in MLflow once, and the parent has the population's schedule

PBT_REPORTS = 12
PBT = """
name: {name}
task: tversky.xor
metric: {{name: loss, mode: min}}
params: {{features: 8, steps: {steps}, report_every: 100}}
space:
  lr: {{loguniform: [0.003, 0.3]}}
  seed: {{randint: [0, 1000]}}
search: {{algorithm: random, num_samples: 4, seed: 3}}
scheduler:
  type: pbt
  perturbation_interval: 3
  quantile_fraction: 0.25
  hyperparam_mutations:
    lr: {{loguniform: [0.001, 0.5]}}
max_concurrent_trials: 2
"""
EXPLOIT_TAG = re.compile(r"layerlab\.pbt\.exploit\.step(\d{6})")


def exploits(client: MlflowClient, experiment: str, reports: dict[str, int]) -> dict[str, dict[int, str]]:
    """Trial id -> step -> the exploit tag's text, over the experiment's child runs; each tag checked against the
    run's `pbt/exploited_from_*` metrics at the same step. `reports`: trial id -> its report count."""
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    out: dict[str, dict[int, str]] = {}
    for run in client.search_runs([exp.experiment_id], max_results=100):
        if not run.data.tags.get("mlflow.parentRunId"):
            continue
        trial = run.data.tags["layerlab.trial_id"]
        tagged = {int(m[1]): v for k, v in run.data.tags.items() if (m := EXPLOIT_TAG.fullmatch(k))}
        sources = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "pbt/exploited_from_step")}
        assert sorted(tagged) == sorted(sources), (trial, tagged, sources)
        # each step also logs the lr it trained with
        lrs = [m.step for m in client.get_metric_history(run.info.run_id, "pbt/lr")]
        assert sorted(lrs) == list(range(1, reports[trial] + 1)), (trial, lrs)
        out[trial] = tagged
    return out


def test_a_worker_killed_mid_pbt_leaves_a_population_the_next_worker_finishes(workers: Stack) -> None:
    store = QueueStore(Settings(home=workers.home).queue_url)
    sweep_id = workers.submit(PBT.format(name="e2e-pbt-kill", steps=PBT_REPORTS * 100))["id"]
    doomed = workers.start_worker("w-pbt-doomed")

    def past_first_exploit() -> bool:  # the first round of exploits done, no trial finished
        trials = store.trials(sweep_id)
        return any(t.iteration >= 4 for t in trials) and not any(t.state == "terminated" for t in trials)

    wait_until(past_first_exploit, 240, "the population past its first exploit", interval=0.2)
    workers.kill_worker(doomed)
    print("killed at iterations", sorted(t.iteration for t in store.trials(sweep_id)))
    workers.start_worker("w-pbt-rescuer")
    s = workers.wait_state(sweep_id, ("succeeded", "failed", "cancelled"), timeout=400)
    assert s["state"] == "succeeded" and s["attempts"] == 2 and s["trials"]["finished"] == 4, s
    # A trial counts its own reports: one that took weights further on (or further back) than its own step after
    # the kill ends in fewer (or more) than 12, each logged once, none skipped.
    reports = {t.trial_id: t.iteration for t in store.trials(sweep_id)}
    print("report counts", reports)
    assert all(t.logged_iteration == reports[t.trial_id] > 0 for t in store.trials(sweep_id)), reports
    client = workers.mlflow()
    assert_tracked_once(client, "e2e-pbt-kill", reports, "loss")
    found = exploits(client, "e2e-pbt-kill", reports)
    # Rounds at every 3rd report (from each attempt's start: the kill resets Tune's PBT): each round the worst of
    # the 4 (quantile 0.25) takes the best's weights. The first round's exploit, at least, is on its child run.
    assert any(found.values()), found
    for trial, steps in found.items():
        for text in steps.values():
            source = re.match(r"weights and config of trial (\S+) at its step (\d+); perturbed: lr ", text)
            assert source and source[1] in reports and source[1] != trial, text
    # each trial's recorded config is the one its last step trained with, and the best config the best trial's
    rows = store.trials(sweep_id)
    for t in rows:
        history = client.get_metric_history(str(t.mlflow_run_id), "pbt/lr")
        assert max(history, key=lambda m: m.step).value == t.config["lr"], (t.trial_id, t.config)
    sweep = store.get(sweep_id)
    assert sweep.best_config == next(t.config for t in rows if t.trial_id == sweep.best_trial_id)
    plots = {a.path for a in client.list_artifacts(s["mlflow"]["parent_run_id"], "plots")}
    assert "plots/pbt_schedule.png" in plots, plots
