"""The production stack on loopback, once per test module: PostgreSQL (queue, MLflow backend, MLflow
auth store), moto S3, the project's MLflow server with basic auth, a two-node Ray cluster, the API on
PostgreSQL with token auth, and workers that connect to the cluster (RAY_ADDRESS) with Tune storage on S3."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from mlflow.tracking import MlflowClient

from tests.e2e.conftest import LAYERLAB, free_port, wait_until

from .cluster import S3, MlflowServer, RayCluster, mlflow_server, moto_s3, pg_databases, ray_cluster


@dataclass
class Production:
    home: Path
    api_url: str
    env: dict[str, str]
    queue_url: str
    s3: S3
    mlflow: MlflowServer
    ray: RayCluster
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.env['LAYERLAB_API_TOKEN']}"}

    def mlflow_client(self) -> MlflowClient:
        os.environ["MLFLOW_TRACKING_USERNAME"] = self.mlflow.username
        os.environ["MLFLOW_TRACKING_PASSWORD"] = self.mlflow.password
        return MlflowClient(tracking_uri=self.mlflow.url)

    def start_worker(self, name: str, **env: str) -> subprocess.Popen[bytes]:
        # Each worker has a home of its own: nothing of a sweep may depend on a worker's local disk.
        home = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.home))
        log = open(self.home / f"worker-{name}.log", "ab")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(
            [LAYERLAB, "worker", "--worker-id", name],
            env={**self.env, "LAYERLAB_HOME": str(home), **env},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.workers.append(proc)
        return proc

    def kill_worker(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def submit(self, spec_yaml: str) -> dict[str, Any]:
        headers = {"content-type": "application/yaml", **self.headers}
        r = httpx.post(f"{self.api_url}/sweeps", content=spec_yaml, headers=headers, timeout=30)
        assert r.status_code == 201, r.text
        return dict(r.json())

    def sweep(self, sweep_id: int) -> dict[str, Any]:
        r = httpx.get(f"{self.api_url}/sweeps/{sweep_id}", headers=self.headers, timeout=30)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def wait_state(self, sweep_id: int, states: tuple[str, ...], timeout: float) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            s = self.sweep(sweep_id)
            return s if s["state"] in states else None

        try:
            return wait_until(done, timeout, f"sweep {sweep_id} to reach {states}", interval=1.0)
        except AssertionError:
            for log in sorted(self.home.glob("*.log")):
                print(f"--- {log.name} (tail)\n" + log.read_text(errors="replace")[-3000:])
            raise


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
        env = {
            **os.environ,
            **s3.env,
            **mlflow.client_env,
            "LAYERLAB_HOME": str(home),
            "LAYERLAB_DATABASE_URL": dbs["queue"],
            "LAYERLAB_API_URL": f"http://127.0.0.1:{port}",
            "LAYERLAB_MLFLOW_UI_URL": mlflow.url,
            "LAYERLAB_TUNE_STORAGE": f"s3://{s3.bucket}/tune",
            "LAYERLAB_HEARTBEAT_SECONDS": "1",
            "LAYERLAB_LEASE_SECONDS": "8",
            "LAYERLAB_POLL_SECONDS": "0.5",
            "RAY_ADDRESS": ray.address,
        }
        for k in ("LAYERLAB_MLFLOW_ADMIN_PASSWORD", "LAYERLAB_MLFLOW_ADMIN_PASSWORD_FILE", "LAYERLAB_API_TOKEN"):
            env.pop(k, None)
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
        prod = Production(home=home, api_url=api_url, env=env, queue_url=dbs["queue"], s3=s3, mlflow=mlflow, ray=ray)
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
