"""PostgreSQL, the queue database, restarted under running workers with 0 and 20 s of downtime (also 60 and
120 s with LAYERLAB_FAULTS_LONG=1; 20 s is already 2.5 leases).

The decision this test holds the service to: a lease says "this worker was heard from within
`lease_seconds`". While the database itself is down nobody can be heard from, so that time does not
count against anyone. A worker waits out the outage (its queue writes retry; Tune's controller waits
in the progress callback), and after the server restarts every lease gets a full `lease_seconds` to be
renewed before another worker may reclaim it (service.queue.QueueStore.reclaim_expired, measured by
pg_postmaster_start_time()). Without that, the idle worker's first claim after a 20 or 60 s outage
(leases here: 8 s) would requeue the running sweep and run it a second time beside the first.
The API answers 503 with a message that says to retry while the database is down, and recovers by
itself once it is back (pool pre-ping), as do the workers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from service.queue import QueueStore
from tests.e2e.conftest import Stack, wait_until
from tests.production.cluster import RayCluster

from .conftest import LONG, PrivatePostgres, actions, assert_tracked_once, claim_events, private_postgres, private_ray

pytestmark = pytest.mark.stack

DOWNTIMES = (0, 20, 60, 120) if LONG else (0, 20)
ITERATIONS = 60 if LONG else 20
SPEC = """
name: pg-restart-{tag}
task: tversky.xor
metric: {{name: loss, mode: min}}
params: {{features: 8, steps: {steps}, report_every: 100}}
space:
  seed: {{grid: [0, 1]}}
max_concurrent_trials: 2
"""
UNAVAILABLE = "the queue database is unavailable; retry in a few seconds"


@pytest.fixture(scope="module", autouse=True)
def postgres() -> Iterator[PrivatePostgres]:
    with private_postgres() as pg, pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAYERLAB_DATABASE_URL", pg.url)  # the API's, the CLI's and the workers'
        yield pg


@pytest.fixture(scope="module")
def ray() -> Iterator[RayCluster]:
    with private_ray(2) as cluster:  # both workers drive one Ray cluster: less to start on 2 cores
        yield cluster


def _answer(stack: Stack, method: str, path: str, body: str | None = None) -> httpx.Response:
    headers = {**stack.headers, "content-type": "application/yaml"}
    return httpx.request(method, f"{stack.api_url}{path}", headers=headers, content=body, timeout=10)


def _check_unavailable(stack: Stack, sweep_id: int) -> None:
    submit = SPEC.format(tag="during-outage", steps=300)
    calls = (("GET", "/healthz", None), ("GET", f"/sweeps/{sweep_id}", None), ("POST", "/sweeps", submit))
    for method, path, body in calls:
        r = _answer(stack, method, path, body)
        assert r.status_code == 503, (method, path, r.status_code, r.text)
        assert r.json() == {"detail": UNAVAILABLE}, r.text
        assert r.headers.get("retry-after") == "5"


def test_restarts_lose_nothing_and_run_nothing_twice(
    workers: Stack, postgres: PrivatePostgres, ray: RayCluster
) -> None:
    stack = workers
    stack.env["RAY_ADDRESS"] = ray.address
    store = QueueStore(postgres.url, run_migrations=False)
    procs = [stack.start_worker("pg-a"), stack.start_worker("pg-b")]
    done: list[int] = []
    for downtime in DOWNTIMES:
        sweep_id = stack.submit(SPEC.format(tag=downtime, steps=ITERATIONS * 100))["id"]
        wait_until(lambda i=sweep_id: any(t.iteration >= 3 for t in store.trials(i)), 180, "a trial to report")
        owner = store.get(sweep_id).worker_id
        t0 = time.monotonic()
        postgres.stop()
        if downtime:
            _check_unavailable(stack, sweep_id)
            time.sleep(max(0.0, downtime - (time.monotonic() - t0)))
        postgres.start()
        down = time.monotonic() - t0
        wait_until(lambda i=sweep_id: _answer(stack, "GET", f"/sweeps/{i}").status_code == 200, 30, "the API")
        print(f"downtime {downtime}s: down {down:.1f}s, API back {time.monotonic() - t0 - down:.1f}s later")
        s = stack.wait_state(sweep_id, ("succeeded", "failed", "cancelled"), timeout=300)
        assert s["state"] == "succeeded", s
        # Run once: one claim, by the worker that held it before the outage, and no trial started again.
        assert actions(store, sweep_id) == ["submit", "claim", "succeeded"], actions(store, sweep_id)
        assert s["attempts"] == 1 and store.get(sweep_id).worker_id == owner
        trials = store.trials(sweep_id)
        assert [(t.state, t.iteration, t.starts) for t in trials] == [("terminated", ITERATIONS, 1)] * 2, trials
        iterations = {t.trial_id: ITERATIONS for t in trials}
        assert_tracked_once(stack.mlflow(), f"pg-restart-{downtime}", iterations, "loss")
        done.append(sweep_id)

    # Both workers came back by themselves: two sweeps at once go to the two of them.
    pair = [stack.submit(SPEC.format(tag=f"after-{n}", steps=300))["id"] for n in (1, 2)]
    for sweep_id in pair:
        assert stack.wait_state(sweep_id, ("succeeded", "failed", "cancelled"), timeout=180)["state"] == "succeeded"
    assert {store.get(i).worker_id for i in pair} == {"pg-a", "pg-b"}
    assert all(p.poll() is None for p in procs), "a worker exited"
    # No sweep lost, none queued from the refused submissions, each claimed once.
    assert [s.id for s in store.list_sweeps()] == sorted(done + pair, reverse=True)
    assert all(s.state == "succeeded" for s in store.list_sweeps())
    assert sorted(e.sweep_id for e in claim_events(store)) == sorted(done + pair)
