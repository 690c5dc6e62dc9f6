"""Fault tests: the embedded stack of tests/e2e (API, workers, SQLite queue, MLflow) joined by parts of
tests/production (a Ray cluster of its own, moto S3, the MLflow server) or a private PostgreSQL, with
one part broken on purpose. A module sets the stack's environment in an autouse module fixture, which
runs before the module's `stack`; worker-only settings (RAY_ADDRESS) go into `stack.env`.
`LAYERLAB_FAULTS_LONG=1` runs the long versions."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from mlflow.tracking import MlflowClient
from sqlalchemy import select

from service.models import Event
from service.queue import QueueStore
from tests.e2e.conftest import stack, workers  # noqa: F401 - stack fixtures for every module
from tests.production.cluster import RAY_ENV, RayCluster
from tests.support import PrivatePostgres, free_port, private_postgres  # noqa: F401 - for the fault modules

LONG = os.environ.get("LAYERLAB_FAULTS_LONG") == "1"
# A killed Ray node is declared dead after period x threshold; Ray's defaults take about 15-30 s.
FAST_NODE_DEATH = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


# --- a Ray cluster of our own --------------------------------------------------------------------


@contextmanager
def private_ray(*cpus: int, env: dict[str, str] | None = None) -> Iterator[RayCluster]:
    """Nodes with these CPU counts (the first is the head), node death noticed within seconds."""
    cluster = RayCluster(port=free_port(), env={**os.environ, **(env or {}), **RAY_ENV, **FAST_NODE_DEATH})
    try:
        for n in cpus:
            cluster.add_node(cpus=n)
        cluster.wait_for_nodes(len(cpus))
        yield cluster
    finally:
        cluster.stop()


# --- what every fault test checks -----------------------------------------------------------------


def actions(store: QueueStore, sweep_id: int) -> list[str]:
    return [e.action for e in store.events(sweep_id)]


def claim_events(store: QueueStore) -> list[Event]:
    with store.session() as s:
        return list(s.scalars(select(Event).where(Event.action == "claim").order_by(Event.id)))


def assert_tracked_once(client: MlflowClient, experiment: str, iterations: dict[str, int], metric: str) -> None:
    """One parent run, exactly one child run per trial, and each trial's metric history holds every
    iteration 1..N exactly once: nothing lost, nothing counted twice."""
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r}"
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("layerlab.role") == "parent"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(parents) == 1, [r.info.run_id for r in parents]
    per_trial = Counter(r.data.tags["layerlab.trial_id"] for r in children)
    assert per_trial == Counter(dict.fromkeys(iterations, 1)), per_trial
    for child in children:
        trial_id = child.data.tags["layerlab.trial_id"]
        steps = sorted(m.step for m in client.get_metric_history(child.info.run_id, metric))
        expected = list(range(1, iterations[trial_id] + 1))
        assert steps == expected, f"trial {trial_id}: {metric} logged at steps {steps}, expected 1..{expected[-1]}"
        assert child.info.status == "FINISHED", (trial_id, child.info.status)
    assert parents[0].info.status == "FINISHED", parents[0].info.status
