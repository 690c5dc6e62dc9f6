"""Population-based training through the service, with a worker killed mid-PBT: the next worker resumes the
population, each exploit is recorded on its child run, every reported value is in MLflow once, and the parent has
the population's schedule."""

from __future__ import annotations

import re

import pytest
from mlflow.tracking import MlflowClient

from service.queue import QueueStore
from service.settings import Settings
from tests.faults.conftest import assert_tracked_once

from .conftest import Stack, wait_until

pytestmark = pytest.mark.stack

REPORTS = 12
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
    sweep_id = workers.submit(PBT.format(name="e2e-pbt-kill", steps=REPORTS * 100))["id"]
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
