"""The durability guarantee as one property: kill -9 the Tune driver (the worker) at many random points of one sweep,
and after every kill, what MLflow shows of each trial is what the queue's metric outbox holds, no step is missing
or doubled, and no finished trial has run again; at the end MLflow shows exactly the outbox, every step once.

Twenty kills in one test, at points drawn from a seeded generator (LAYERLAB_FAULTS_SEED to replay one): a share
of the sweep's iterations done, then a random delay of up to 3 s. A point already passed when the next worker
claims the sweep kills it while it restores (Ray connecting, Tune reading its state, the shipper's first pass).
Workers take their default ids, so the next one takes over a dead one's lease at once (workers.supervisor), and
drive a Ray cluster of their own that outlives them, as in production.
"""

from __future__ import annotations

import os
import random
import subprocess
import time
from collections.abc import Iterator

import pytest
from mlflow.tracking import MlflowClient

from service.queue import QueueStore
from service.settings import Settings
from tests.e2e.conftest import Stack
from tests.production.cluster import RayCluster
from tests.support import LAYERLAB, wait_until

from .conftest import actions, private_ray

pytestmark = pytest.mark.stack

KILLS = 20
TRIALS, ITERATIONS = 4, 40
SEED = int(os.environ.get("LAYERLAB_FAULTS_SEED", "20261204"))
SPEC = f"""
name: kill-property
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
        mp.setenv("LAYERLAB_MAX_ATTEMPTS", str(KILLS + 1))
        yield cluster


def start_worker(stack: Stack, name: str) -> subprocess.Popen[bytes]:
    """A worker with its default id (host, boot, pid): its successor takes over its lease once it is dead."""
    log = open(stack.home / f"worker-{name}.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [LAYERLAB, "worker"], env=stack.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    stack.workers.append(proc)
    return proc


def assert_mlflow_follows_the_outbox(store: QueueStore, client: MlflowClient, sweep_id: int, final: bool) -> None:
    """Per trial: the outbox holds steps 1..n, each once; MLflow holds each step at most once, with the outbox's
    values, every shipped row among them (a row sent but not yet marked may be there too); at the end, exactly
    the outbox."""
    outbox = store.outbox_history(sweep_id)
    unshipped = {(row.trial_id, row.step) for row in store.unshipped(sweep_id, 1_000_000)}
    for t in store.trials(sweep_id):
        rows = outbox.get(t.trial_id, {})
        assert sorted(rows) == list(range(1, len(rows) + 1)), f"trial {t.trial_id}: outbox steps {sorted(rows)}"
        assert t.logged_iteration == len(rows), (t.trial_id, t.logged_iteration, len(rows))
        if t.mlflow_run_id is None:
            assert all((t.trial_id, step) in unshipped for step in rows), f"trial {t.trial_id}: shipped, no run"
            continue
        for key in {k for metrics in rows.values() for k in metrics}:
            points = client.get_metric_history(t.mlflow_run_id, key)
            steps = [m.step for m in points]
            assert len(steps) == len(set(steps)), f"trial {t.trial_id}: {key} doubled at {sorted(steps)}"
            shown = {m.step: m.value for m in points}
            held = {step: metrics[key] for step, metrics in rows.items() if key in metrics}
            assert all(held.get(step) == value for step, value in shown.items()), (t.trial_id, key, shown, held)
            shipped = {step for step in held if (t.trial_id, step) not in unshipped}
            assert shipped <= set(shown), f"trial {t.trial_id}: shipped {sorted(shipped - set(shown))} not in MLflow"
            if final:
                assert shown == held, f"trial {t.trial_id}: {key} in MLflow differs from the outbox"
    if final:
        assert unshipped == set()


def test_after_every_kill_mlflow_follows_the_outbox_and_at_the_end_equals_it(workers: Stack, ray: RayCluster) -> None:
    stack = workers
    stack.env["RAY_ADDRESS"] = ray.address
    store = QueueStore(Settings(home=stack.home).queue_url)
    client = stack.mlflow()
    rng = random.Random(SEED)
    points = sorted(rng.uniform(0.0, 0.8) for _ in range(KILLS))
    print(f"LAYERLAB_FAULTS_SEED={SEED}; kill points (share of iterations done): {[round(p, 2) for p in points]}")
    sweep_id = stack.submit(SPEC)["id"]
    total = TRIALS * ITERATIONS

    def done_iterations() -> int:
        return sum(t.iteration for t in store.trials(sweep_id))

    finished_starts: dict[str, int] = {}  # trial id -> its starts when first seen finished
    t0 = time.monotonic()
    for k, point in enumerate(points):
        worker = start_worker(stack, f"victim-{k + 1}")
        wait_until(lambda n=k + 1: store.get(sweep_id).attempts == n, 180, f"claim {k + 1}", interval=0.2)
        wait_until(lambda p=point: done_iterations() >= p * total, 300, f"{point:.0%} of the iterations", interval=0.2)
        time.sleep(rng.uniform(0.0, 3.0))
        stack.kill_worker(worker)
        sweep = store.get(sweep_id)
        assert sweep.state == "running", f"the sweep ended ({sweep.state}) before kill {k + 1}: nothing left to test"
        print(f"{time.monotonic() - t0:.1f}s kill {k + 1} at {done_iterations()}/{total} iterations")
        assert_mlflow_follows_the_outbox(store, client, sweep_id, final=False)
        for t in store.trials(sweep_id):
            if t.state == "terminated":
                assert t.starts == finished_starts.setdefault(t.trial_id, t.starts), f"{t.trial_id} ran again"

    start_worker(stack, "survivor")
    s = stack.wait_state(sweep_id, ("succeeded", "failed", "cancelled"), timeout=400)
    assert s["state"] == "succeeded", s
    assert actions(store, sweep_id)[-2:] == ["claim", "succeeded"] and s["attempts"] == KILLS + 1
    trials = store.trials(sweep_id)
    assert sorted(t.config["seed"] for t in trials) == list(range(TRIALS)), "a trial row is missing or doubled"
    assert all((t.state, t.iteration, t.logged_iteration) == ("terminated", ITERATIONS, ITERATIONS) for t in trials)
    for trial_id, before in finished_starts.items():
        assert next(t.starts for t in trials if t.trial_id == trial_id) == before, f"{trial_id} ran again"
    assert_mlflow_follows_the_outbox(store, client, sweep_id, final=True)
    runs = client.search_runs([client.get_experiment_by_name("kill-property").experiment_id], max_results=100)
    assert sorted(r.data.tags.get("layerlab.trial_id", "parent") for r in runs) == sorted(
        ["parent", *(t.trial_id for t in trials)]
    ), "a child run is missing or doubled"
    assert all(r.info.status == "FINISHED" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
