"""The production stack on loopback, once per test module: PostgreSQL (queue, MLflow backend, MLflow
auth store), moto S3, the project's MLflow server with basic auth, a two-node Ray cluster, the API on
PostgreSQL with token auth, and workers that connect to the cluster (RAY_ADDRESS) with Tune storage on S3."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from mlflow.tracking import MlflowClient

from tests.e2e.conftest import LAYERLAB, Stack, free_port, wait_until

from .cluster import S3, MlflowServer, RayCluster, mlflow_server, moto_s3, pg_databases, production_env, ray_cluster


@dataclass(kw_only=True)
class Production(Stack):
    """The e2e `Stack` (API calls, worker processes, waits), on the production parts."""

    queue_url: str
    s3: S3
    mlflow_server: MlflowServer
    ray: RayCluster

    def mlflow_client(self) -> MlflowClient:
        os.environ["MLFLOW_TRACKING_USERNAME"] = self.mlflow_server.username
        os.environ["MLFLOW_TRACKING_PASSWORD"] = self.mlflow_server.password
        return MlflowClient(tracking_uri=self.mlflow_server.url)

    def start_worker(self, name: str) -> subprocess.Popen[bytes]:
        # Each worker has a home of its own: nothing of a sweep may depend on a worker's local disk.
        home = tempfile.mkdtemp(prefix=f"{name}-", dir=self.home)
        return self._spawn_worker(name, {**self.env, "LAYERLAB_HOME": home})


@pytest.fixture(scope="module")
def production(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Production]:
    home = tmp_path_factory.mktemp("production")
    with (
        pg_databases("queue", "mlflow", "auth") as dbs,
        moto_s3(home) as s3,
        mlflow_server(home, dbs["mlflow"], dbs["auth"], s3) as mlflow,
        ray_cluster(2, {**os.environ, **s3.env}) as ray,
    ):
        port = free_port()
        env = production_env(home, dbs["queue"], port, s3, mlflow, ray)
        created = subprocess.run(
            [LAYERLAB, "token", "create", "--user", "ops", "--admin"], env=env, capture_output=True, text=True
        )
        assert created.returncode == 0, created.stderr
        env["LAYERLAB_API_TOKEN"] = created.stdout.strip()
        api_log = open(home / "api.log", "ab")  # noqa: SIM115
        api = subprocess.Popen(
            [LAYERLAB, "serve", "--port", str(port)], env=env, stdout=api_log, stderr=subprocess.STDOUT
        )
        api_url = f"http://127.0.0.1:{port}"
        prod = Production(
            home=home, api_url=api_url, env=env, queue_url=dbs["queue"], s3=s3, mlflow_server=mlflow, ray=ray
        )
        try:
            wait_until(lambda: _healthy(prod.api_url), 60, "the API's /healthz")
            yield prod
        finally:
            for proc in prod.workers:
                prod.kill_worker(proc)
            api.terminate()
            api.wait(timeout=30)
            api_log.close()
            from service import db

            db.dispose_all()  # before the databases are dropped


@pytest.fixture
def prod(production: Production) -> Iterator[Production]:
    """The production stack, with every worker a test starts killed at the end of that test."""
    yield production
    for proc in production.workers:
        production.kill_worker(proc)
    production.workers.clear()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
