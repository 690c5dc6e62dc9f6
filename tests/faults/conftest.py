"""Fault tests: the embedded stack of tests/e2e (API, workers, SQLite queue, MLflow) joined by parts of
tests/production (a Ray cluster of its own, moto S3, the MLflow server) or a private PostgreSQL, with
one part broken on purpose. A module sets the stack's environment in an autouse module fixture, which
runs before the module's `stack`; worker-only settings (RAY_ADDRESS) go into `stack.env`.
`LAYERLAB_FAULTS_LONG=1` runs the long versions."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mlflow.tracking import MlflowClient
from sqlalchemy import select

from service.models import Event
from service.queue import QueueStore
from tests.e2e.conftest import free_port, stack, workers  # noqa: F401 - stack fixtures for every module
from tests.production.cluster import RAY_ENV, RayCluster

LONG = os.environ.get("LAYERLAB_FAULTS_LONG") == "1"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
# A killed Ray node is declared dead after period x threshold; Ray's defaults take about 15-30 s.
FAST_NODE_DEATH = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


# --- a private PostgreSQL server ---------------------------------------------------------------


@dataclass
class PrivatePostgres:
    """A PostgreSQL cluster of our own (initdb in a temp dir) that a test may stop and start at will;
    the machine's shared server on 5432 serves other tests and is never touched."""

    data: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _pg_ctl(self, *args: str) -> None:
        cmd = ["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(self.data / "db"), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{' '.join(cmd)}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1"
        self._pg_ctl("-o", opts, "-l", str(self.data / "postgres.log"), "-w", "start")

    def stop(self) -> None:
        # fast: what `docker stop` or a failover does to the server: sessions are cut, nothing is lost
        self._pg_ctl("-m", "fast", "-w", "stop")

    def running(self) -> bool:
        return (self.data / "db" / "postmaster.pid").exists()


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    # Not under pytest's tmp_path: the postgres user must be able to reach it.
    data = Path(tempfile.mkdtemp(prefix="pgfault-", dir="/tmp"))
    shutil.chown(data, "postgres", "postgres")
    pg = PrivatePostgres(data=data, port=free_port())
    init = [str(PG_BIN / "initdb"), "-D", str(data / "db"), "-U", "postgres", "-A", "trust", "--no-sync"]
    done = subprocess.run(["runuser", "-u", "postgres", "--", *init], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    pg.start()
    try:
        yield pg
    finally:
        from service import db

        db.dispose_all()
        if pg.running():
            pg.stop()
        shutil.rmtree(data, ignore_errors=True)


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
