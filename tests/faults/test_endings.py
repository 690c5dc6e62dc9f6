"""Every way a sweep ends closes what it opened, and `resume` continues a failed one.

A sweep whose workers die on each of its `max_attempts: 3` claims is given up by the queue while no
worker of it is alive: the next worker that polls closes its MLflow parent run and child runs (FAILED)
and moves every trial row to a terminal state. `layerlab resume` (the API's POST /sweeps/{id}/resume)
then puts it back with fresh attempts, and it finishes from its Tune state and runs: finished trials
are kept, nothing is trained or logged twice.
"""

from __future__ import annotations

import httpx
import pytest

from service.queue import QueueStore
from service.settings import Settings
from tests.e2e.conftest import Stack, wait_until

from .conftest import actions, assert_tracked_once

pytestmark = pytest.mark.stack

TRIALS, ITERATIONS = 4, 12
SPEC = f"""
name: gives-up
task: tversky.xor
metric: {{name: loss, mode: min}}
params: {{features: 8, steps: {ITERATIONS * 100}, report_every: 100}}
space:
  seed: {{grid: {list(range(TRIALS))}}}
max_concurrent_trials: 2
max_attempts: 3
"""


def test_a_sweep_given_up_after_three_crashes_has_every_run_closed_and_resume_finishes_it(workers: Stack) -> None:
    stack = workers
    store = QueueStore(Settings(home=stack.home).queue_url)
    sweep_id = stack.submit(SPEC)["id"]

    def done() -> int:
        return sum(t.iteration for t in store.trials(sweep_id))

    for attempt in (1, 2, 3):
        victim = stack.start_worker(f"victim-{attempt}")
        wait_until(lambda n=attempt: store.get(sweep_id).attempts == n, 180, f"claim {attempt}")
        before = done()
        wait_until(lambda b=before: done() >= b + 2, 240, "two more reports")
        stack.kill_worker(victim)

    # No worker of the sweep is alive; the next one to poll finds the lease expired on the last attempt.
    stack.start_worker("bystander")
    s = stack.wait_state(sweep_id, ("failed",), timeout=120)
    assert "gave up after 3 of max_attempts=3" in s["reason"], s["reason"]
    client = stack.mlflow()
    exp = client.get_experiment_by_name("gives-up")

    def closed() -> bool:
        return all(r.info.status != "RUNNING" for r in client.search_runs([exp.experiment_id], max_results=100))

    wait_until(closed, 60, "every MLflow run of the given-up sweep to be ended")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parent = next(r for r in runs if r.data.tags.get("layerlab.role") == "parent")
    assert parent.info.status == "FAILED"
    trials = store.trials(sweep_id)
    assert trials and all(t.state in ("terminated", "error") for t in trials), [(t.trial_id, t.state) for t in trials]
    finished_before = {t.trial_id: t.starts for t in trials if t.state == "terminated"}

    r = httpx.post(f"{stack.api_url}/sweeps/{sweep_id}/resume", headers=stack.headers, timeout=30)
    assert r.status_code == 200, r.text
    assert (r.json()["state"], r.json()["max_attempts"]) == ("queued", 6)
    s = stack.wait_state(sweep_id, ("succeeded", "failed", "cancelled"), timeout=400)
    assert s["state"] == "succeeded", s
    assert actions(store, sweep_id)[-3:] == ["resume", "claim", "succeeded"]
    trials = store.trials(sweep_id)
    assert sorted(t.config["seed"] for t in trials) == list(range(TRIALS))
    for t in trials:
        assert (t.state, t.iteration, t.logged_iteration) == ("terminated", ITERATIONS, ITERATIONS), t.trial_id
        if t.trial_id in finished_before:
            assert t.starts == finished_before[t.trial_id], f"finished trial {t.trial_id} was trained again"
    assert_tracked_once(client, "gives-up", {t.trial_id: ITERATIONS for t in trials}, "loss")

    r = httpx.post(f"{stack.api_url}/sweeps/{sweep_id}/resume", headers=stack.headers, timeout=30)
    assert r.status_code == 409
    assert r.json()["detail"] == (
        f"sweep {sweep_id} is succeeded; cannot resume it (only a failed or cancelled sweep resumes)"
    )
