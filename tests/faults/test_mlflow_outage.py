"""The project's MLflow server (PostgreSQL backend, S3 artifacts, basic auth) stopped for 30 s in the
middle of a sweep: training goes on, the metrics reach MLflow once it is back, none of them twice.

What makes it so (workers.tracking): a write that finds the server unreachable is kept, in order, and
delivered when a health probe says the server answers again; metric writes carry the timestamp of the
result, so a write repeated after an answer got lost is the same metric, which MLflow stores once.
The sweep ends only once the backlog is delivered.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from service.queue import QueueStore
from service.settings import Settings
from tests.e2e.conftest import Stack, wait_until
from tests.production.cluster import MlflowServer, RayCluster, mlflow_server, moto_s3, pg_databases

from .conftest import LONG, assert_tracked_once, private_ray

pytestmark = pytest.mark.stack

OUTAGE = 60.0 if LONG else 30.0
ITERATIONS = 90 if LONG else 45
SPEC = f"""
name: mlflow-outage
task: tversky.xor
metric: {{name: loss, mode: min}}
params: {{features: 8, steps: {ITERATIONS * 300}, report_every: 300}}
space:
  seed: {{grid: [0, 1]}}
max_concurrent_trials: 2
"""


@pytest.fixture(scope="module", autouse=True)
def mlflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    home = tmp_path_factory.mktemp("mlflow-server")
    with (
        pg_databases("mlflow", "auth") as dbs,
        moto_s3(home) as s3,
        mlflow_server(home, dbs["mlflow"], dbs["auth"], s3) as server,
        pytest.MonkeyPatch.context() as mp,
    ):
        for k, v in server.client_env.items():  # the workers' (and this test's) tracking server
            mp.setenv(k, v)
        yield server


@pytest.fixture(scope="module")
def ray() -> Iterator[RayCluster]:
    with private_ray(2) as cluster:
        yield cluster


def test_a_30s_outage_loses_no_metric_and_doubles_none(workers: Stack, mlflow: MlflowServer, ray: RayCluster) -> None:
    stack = workers
    stack.env["RAY_ADDRESS"] = ray.address
    store = QueueStore(Settings(home=stack.home).queue_url)
    sweep_id = stack.submit(SPEC)["id"]
    worker = stack.start_worker("through-outage")

    def progress() -> int:
        return sum(t.iteration for t in store.trials(sweep_id))

    wait_until(lambda: any(t.iteration >= 3 for t in store.trials(sweep_id)), 240, "a trial to report 3 times")
    t0, before = time.monotonic(), progress()
    mlflow.stop()
    # Training goes on: the trials keep reporting to the queue while MLflow is away.
    wait_until(lambda: progress() >= before + 4, OUTAGE - 5, "progress while MLflow is down", interval=1.0)
    time.sleep(max(0.0, OUTAGE - (time.monotonic() - t0)))
    during = progress()
    assert worker.poll() is None and store.get(sweep_id).state == "running"
    mlflow.restart()
    print(f"MLflow down {time.monotonic() - t0:.0f}s; iterations {before} -> {during} of {2 * ITERATIONS} meanwhile")

    s = stack.wait_state(sweep_id, ("succeeded", "failed", "cancelled"), timeout=300)
    assert s["state"] == "succeeded", s
    assert s["attempts"] == 1
    trials = store.trials(sweep_id)
    assert [(t.state, t.iteration, t.starts) for t in trials] == [("terminated", ITERATIONS, 1)] * 2
    assert_tracked_once(MlflowClient(mlflow.url), "mlflow-outage", {t.trial_id: ITERATIONS for t in trials}, "loss")
    log = Path(stack.home / "worker-through-outage.log").read_text()
    assert "keeping writes until it answers" in log and "delivered" in log, "the outage never reached the tracker"
