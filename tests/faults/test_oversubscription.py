"""Six times more sweeps than the cluster runs at once (thirty with LAYERLAB_FAULTS_LONG=1): a Ray
cluster with one CPU (one trial at a time), two workers, and sweeps that each ask for two concurrent
one-CPU trials. Everything waits its turn, in the queue or in Ray; nothing fails for lack of resources;
sweeps are claimed in priority order (oldest first within a priority) and never more of them run than
there are workers."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from service.queue import QueueStore
from service.settings import Settings
from tests.e2e.conftest import Stack
from tests.production.cluster import RayCluster

from .conftest import LONG, claim_events, private_ray

pytestmark = pytest.mark.stack

CLUSTER_CPUS, WORKERS = 1, 2
SWEEPS = 30 if LONG else 6  # each of two trials: 12 (60) trials for a cluster that runs one at a time
SPEC = """
name: crowd-{n:02d}
task: tversky.xor
metric: {{name: loss, mode: min}}
params: {{features: 8, steps: 200, report_every: 100}}
space:
  seed: {{grid: [0, 1]}}
resources: {{cpus: 1}}
max_concurrent_trials: 2
priority: {priority}
"""


@pytest.fixture(scope="module")
def ray() -> Iterator[RayCluster]:
    with private_ray(CLUSTER_CPUS) as cluster:
        yield cluster


def test_six_times_the_cluster_all_queue_and_finish_in_priority_order(workers: Stack, ray: RayCluster) -> None:
    stack = workers
    stack.env["RAY_ADDRESS"] = ray.address
    store = QueueStore(Settings(home=stack.home).queue_url)
    rng = random.Random(SWEEPS)
    priorities = [rng.choice([10, 30, 50, 70, 90]) for _ in range(SWEEPS)]  # ties: first come, first served
    ids = [stack.submit(SPEC.format(n=n, priority=p))["id"] for n, p in enumerate(priorities)]
    assert [s.state for s in store.list_sweeps()] == ["queued"] * SWEEPS
    for w in range(WORKERS):
        stack.start_worker(f"crowd-{w}")

    for sweep_id in ids:
        s = stack.wait_state(sweep_id, ("succeeded", "failed", "cancelled"), timeout=600)
        assert s["state"] == "succeeded", s
        assert (s["attempts"], s["trials"]["finished"], s["trials"]["total"]) == (1, 2, 2), s

    expected = [i for _, _, i in sorted(zip((-p for p in priorities), range(SWEEPS), ids, strict=True))]
    assert [e.sweep_id for e in claim_events(store)] == expected
    sweeps = sorted(store.list_sweeps(limit=SWEEPS), key=lambda s: s.started_at or s.submitted_at)
    assert [s.id for s in sweeps] == expected
    # Never more sweeps running than workers: count overlaps at every start.
    for s in sweeps:
        running = [o for o in sweeps if o.started_at <= s.started_at < o.finished_at]  # type: ignore[operator]
        assert len(running) <= WORKERS, [o.id for o in running]
    assert len({s.worker_id for s in sweeps}) == WORKERS, "one worker did all the work"
