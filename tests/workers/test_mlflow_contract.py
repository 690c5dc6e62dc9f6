"""The contract the metric outbox rests on: MLflow's SQL store keeps an identical metric (key, value, timestamp,
step) once, however often it is sent. The shipper (workers.shipper) resends a row after a kill between its send
and its mark; an MLflow release that stored the copy would double a step in every such history, so this fails
loudly on it. Checked through the public client, on the embedded stack's store (SQLite) and on a tracking server
whose backend is PostgreSQL (production)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from tests.production.cluster import pg_databases
from tests.support import free_port, wait_until


def resent_history(client: MlflowClient, artifacts: Path) -> dict[str, list[tuple[int, int, float]]]:
    experiment = client.create_experiment("contract", artifact_location=artifacts.as_uri())
    run_id = client.create_run(experiment).info.run_id
    stamp = int(time.time() * 1000)
    batch = [Metric("loss", 0.5, stamp, 1), Metric("acc", 0.25, stamp, 1), Metric("loss", 0.25, stamp + 7, 2)]
    for _ in range(3):  # the first send, then two resends after kills
        client.log_batch(run_id, metrics=batch)
    client.log_batch(run_id, metrics=[Metric("loss", 0.5, stamp + 1, 1)])  # not identical: a new point
    return {
        key: sorted((m.step, m.timestamp - stamp, m.value) for m in client.get_metric_history(run_id, key))
        for key in ("loss", "acc")
    }


EXPECTED = {"loss": [(1, 0, 0.5), (1, 1, 0.5), (2, 7, 0.25)], "acc": [(1, 0, 0.25)]}


def test_sqlite_keeps_an_identical_metric_once(tmp_path: Path) -> None:
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert resent_history(client, tmp_path / "artifacts") == EXPECTED


@pytest.fixture
def server_on_postgres(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    with pg_databases("contract") as dbs:
        command = [
            sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
            "--backend-store-uri", dbs["contract"], "--default-artifact-root", (tmp_path / "served").as_uri(),
            "--workers", "1",
        ]  # fmt: skip
        env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def answers() -> bool:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200  # noqa: S310
            except OSError:
                return False

        try:
            wait_until(answers, 180, "the MLflow server on PostgreSQL")
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


@pytest.mark.stack
def test_a_server_on_postgresql_keeps_an_identical_metric_once(server_on_postgres: str, tmp_path: Path) -> None:
    client = MlflowClient(tracking_uri=server_on_postgres)
    assert resent_history(client, tmp_path / "artifacts") == EXPECTED
