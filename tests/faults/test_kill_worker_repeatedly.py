"""kill -9 of the worker (the Tune driver) at random points of one sweep, five times in a row, a new
worker each time: the sweep finishes, no trial is lost or counted twice.

The workers drive a Ray cluster of their own (as in production: RAY_ADDRESS), which outlives them:
a dead driver's trials are ended by Ray, and its experiment state, checkpoints and queue rows are
all the next worker has. (tests/e2e/test_worker_faults.py kills a worker together with its local Ray.)
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator

import pytest

from service.queue import QueueStore
from service.settings import Settings
from tests.e2e.conftest import Stack, wait_until
from tests.production.cluster import RayCluster

from .conftest import LONG, actions, assert_tracked_once, private_ray

pytestmark = pytest.mark.stack

KILLS = 5
TRIALS, ITERATIONS = (8, 60) if LONG else (4, 24)
SPEC = f"""
name: kill-5x
task: tversky.xor
metric: {{name: loss, mode: min}}
params: {{features: 8, steps: {ITERATIONS * 100}, report_every: 100}}
space:
  seed: {{grid: {list(range(TRIALS))}}}
max_concurrent_trials: 2
"""


@pytest.fixture(scope="module", autouse=True)
def ray() -> Iterator[RayCluster]:
    with pytest.MonkeyPatch.context() as mp, private_ray(2) as cluster:
        mp.setenv("LAYERLAB_MAX_ATTEMPTS", str(KILLS + 1))  # five dead workers' claims and the last one
        yield cluster


def test_five_kills_in_a_row_and_the_sweep_still_finishes(workers: Stack, ray: RayCluster) -> None:
    stack = workers
    stack.env["RAY_ADDRESS"] = ray.address
    store = QueueStore(Settings(home=stack.home).queue_url)
    seed = int(os.environ.get("LAYERLAB_FAULTS_SEED", time.time_ns() % 10_000))
    rng = random.Random(seed)
    # Random kill points: a share of the sweep's iterations done (sorted, so each kill comes later
    # than the one before), then a random sub-second delay. A point already passed when the next
    # worker claims the sweep kills it while it restores: Ray starting, Tune reading its state.
    points = sorted(rng.uniform(0.0, 0.7) for _ in range(KILLS))
    print(f"LAYERLAB_FAULTS_SEED={seed}; kill points (share of iterations done): {[round(p, 2) for p in points]}")
    sweep_id = stack.submit(SPEC)["id"]
    total = TRIALS * ITERATIONS

    def done_iterations() -> int:
        return sum(t.iteration for t in store.trials(sweep_id))

    finished_starts: dict[str, int] = {}  # trial id -> how often it had started when first seen finished
    t0 = time.monotonic()
    for k, point in enumerate(points):
        name = f"victim-{k + 1}"
        worker = stack.start_worker(name)
        wait_until(lambda n=name: store.get(sweep_id).worker_id == n, 180, f"{name} to claim the sweep")
        print(f"{time.monotonic() - t0:.1f}s {name} claimed")
        wait_until(lambda p=point: done_iterations() >= p * total, 300, f"{point:.0%} of the iterations", interval=0.2)
        time.sleep(rng.uniform(0.0, 1.0))
        stack.kill_worker(worker)
        sweep = store.get(sweep_id)
        assert sweep.state == "running", f"the sweep ended ({sweep.state}) before kill {k + 1}: nothing left to test"
        assert sweep.attempts == k + 1, (sweep.attempts, actions(store, sweep_id))
        print(f"{time.monotonic() - t0:.1f}s kill {k + 1} at {done_iterations()}/{total} iterations")
        for t in store.trials(sweep_id):
            if t.state == "terminated":
                finished_starts.setdefault(t.trial_id, t.starts)

    stack.start_worker("survivor")
    s = stack.wait_state(sweep_id, ("succeeded", "failed", "cancelled"), timeout=400)
    assert s["state"] == "succeeded", s
    assert s["attempts"] == KILLS + 1
    assert actions(store, sweep_id) == ["submit", "claim"] + ["requeue", "claim"] * KILLS + ["succeeded"]
    assert s["trials"]["total"] == TRIALS and s["trials"]["finished"] == TRIALS, s["trials"]

    trials = store.trials(sweep_id)
    assert sorted(t.config["seed"] for t in trials) == list(range(TRIALS)), "a trial row is missing or doubled"
    for t in trials:
        assert (t.state, t.iteration) == ("terminated", ITERATIONS), (t.trial_id, t.state, t.iteration)
        assert t.logged_iteration == ITERATIONS, (t.trial_id, t.logged_iteration)
    starts = {t.trial_id: t.starts for t in trials}
    for trial_id, before in finished_starts.items():
        assert starts[trial_id] == before, f"finished trial {trial_id} was started again after a kill"
    assert_tracked_once(stack.mlflow(), "kill-5x", {t.trial_id: ITERATIONS for t in trials}, "loss")
    # Each attempt that got as far as its parent run recorded its code and versions (a kill during a restore
    # can come before that): the first attempt, which reported, and the survivor at least.
    parent = stack.mlflow().get_run(str(store.get(sweep_id).mlflow_parent_run_id))
    recorded = {a.path for a in stack.mlflow().list_artifacts(parent.info.run_id, "provenance")}
    attempts = {f"provenance/attempt-{n}.json" for n in range(1, KILLS + 2)}
    assert {"provenance/attempt-1.json", f"provenance/attempt-{KILLS + 1}.json"} <= recorded <= attempts, recorded
    # A recovery that went right is no error: no worker logged one (Tune's and Ray's lines included).
    errors = [line for log in stack.home.glob("worker-*.log") for line in log.read_text().splitlines()]
    errors = [line for line in errors if " ERROR " in line or "\tERROR " in line]
    assert errors == [], errors[:5]
