"""A real embedded stack per test module: the API in a subprocess, worker subprocesses with local Ray,
SQLite queue and MLflow (SQLite + artifact folder) under a temporary LAYERLAB_HOME."""

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

# Re-imported so that the stack modules' `from tests.e2e.conftest import ...` keep working; new code imports
# them from tests.support.
from tests.support import LAYERLAB, free_port, wait_until


@dataclass
class Stack:
    home: Path
    api_url: str
    env: dict[str, str]
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.env['LAYERLAB_API_TOKEN']}"}

    @property
    def tracking_uri(self) -> str:
        return f"sqlite:///{self.home / 'mlflow.db'}"

    def mlflow(self) -> MlflowClient:
        return MlflowClient(tracking_uri=self.tracking_uri)

    def start_worker(self, name: str) -> subprocess.Popen[bytes]:
        return self._spawn_worker(name, self.env)

    def _spawn_worker(self, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.home / f"worker-{name}.log", "ab")  # noqa: SIM115 - closed with the process
        # Own session: kill -9 of the group takes the worker and the local Ray it started, as when
        # a worker's machine or container dies.
        proc = subprocess.Popen(
            [LAYERLAB, "worker", "--worker-id", name],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers.append(proc)
        return proc

    def kill_worker(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def submit(self, spec_yaml: str) -> dict[str, Any]:
        # 60 s: validating a task's first spec imports its module (torch, gymnasium) in the API process,
        # which takes seconds on a loaded 2-core machine.
        headers = {"content-type": "application/yaml", **self.headers}
        r = httpx.post(f"{self.api_url}/sweeps", content=spec_yaml, headers=headers, timeout=60)
        assert r.status_code == 201, r.text
        return r.json()

    def sweep(self, sweep_id: int) -> dict[str, Any]:
        r = httpx.get(f"{self.api_url}/sweeps/{sweep_id}", headers=self.headers, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def wait_state(self, sweep_id: int, states: tuple[str, ...], timeout: float) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            s = self.sweep(sweep_id)
            return s if s["state"] in states else None

        try:
            return wait_until(done, timeout, f"sweep {sweep_id} to reach {states}", interval=1.0)
        except AssertionError:
            for log in self.home.glob("worker-*.log"):
                print(f"--- {log.name} (tail)\n" + log.read_text(errors="replace")[-4000:])
            raise


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("layerlab-home")
    port = free_port()
    # Ray's session folders hold Unix sockets (107-char path limit): keep them short.
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    env = {
        **os.environ,
        "LAYERLAB_HOME": str(home),
        "LAYERLAB_API_URL": f"http://127.0.0.1:{port}",
        "LAYERLAB_HEARTBEAT_SECONDS": "1",
        "LAYERLAB_LEASE_SECONDS": "8",
        "LAYERLAB_POLL_SECONDS": "0.5",
        "LAYERLAB_RAY_NUM_CPUS": "2",
        "LAYERLAB_WEBHOOK_ALLOW_PRIVATE": "true",  # the tests' receivers listen on loopback
        "LAYERLAB_WEBHOOK_POLL_SECONDS": "0.5",
        "RAY_TMPDIR": ray_tmp,
    }
    env.pop("RAY_ADDRESS", None)
    # The operator's way in: a token from the CLI, against this stack's queue database.
    created = subprocess.run(
        [LAYERLAB, "token", "create", "--user", "e2e", "--admin"], env=env, capture_output=True, text=True, check=True
    )
    env["LAYERLAB_API_TOKEN"] = created.stdout.strip()
    api_log = open(home / "api.log", "ab")  # noqa: SIM115
    api = subprocess.Popen([LAYERLAB, "serve", "--port", str(port)], env=env, stdout=api_log, stderr=subprocess.STDOUT)
    s = Stack(home=home, api_url=f"http://127.0.0.1:{port}", env=env)

    def healthy() -> bool:
        try:
            return httpx.get(f"{s.api_url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, 60, "the API to answer /healthz")
    try:
        yield s
    finally:
        for proc in s.workers:
            s.kill_worker(proc)
        api.terminate()
        api.wait(timeout=30)
        api_log.close()


@pytest.fixture
def workers(stack: Stack) -> Iterator[Stack]:
    """The stack, with every worker a test starts killed at the end of that test."""
    yield stack
    for proc in stack.workers:
        stack.kill_worker(proc)
    stack.workers.clear()
