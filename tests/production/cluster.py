"""Real production parts on loopback, started and stopped by the tests: a two-node Ray cluster, an S3
server (moto), PostgreSQL databases and the project's MLflow server.

Each part stops exactly the processes it started. Ray's `ray start` daemonises, so its processes are
found by the temp dir each node was given (every Ray process names its session dir on its command
line); `ray stop` is never used, since it stops every Ray process of the user on the machine.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from tests.support import free_port, wait_until

BIN = Path(sys.executable).parent
PG_SERVER = os.environ.get("LAYERLAB_TEST_PG_SERVER", "postgresql://postgres@127.0.0.1:5432")
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}


def pids_matching(needle: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline:
            pids.append(int(proc.name))
    return pids


def kill_matching(needle: str, grace: float = 5.0, settle: float = 10.0) -> None:
    """SIGTERM every matching process, wait up to `grace` s, then SIGKILL whatever is left, again and
    again until /proc lists none (up to `settle` s): a killed process lingers a moment before the kernel
    ends it, and a raylet can start a worker between a listing and its own kill (seen once in CI)."""
    for pid in pids_matching(needle):
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids_matching(needle) and time.monotonic() < deadline:
        time.sleep(0.2)
    deadline = time.monotonic() + settle
    while (pids := pids_matching(needle)) and time.monotonic() < deadline:
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        time.sleep(0.05)


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


@dataclass
class RayNode:
    temp_dir: str
    head: bool

    def kill(self) -> None:
        """kill -9 every process of this node: what a machine crash does to it. Returns once none is left."""
        kill_matching(self.temp_dir, grace=0.0)

    def alive(self) -> bool:
        return bool(pids_matching(self.temp_dir))


@dataclass
class RayCluster:
    port: int
    env: dict[str, str]
    nodes: list[RayNode] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def add_node(self, cpus: int = 1) -> RayNode:
        head = not self.nodes
        temp_dir = tempfile.mkdtemp(prefix="rh" if head else "rw", dir="/tmp")  # short: socket paths
        cmd = [
            str(BIN / "ray"), "start", "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}",
            "--object-store-memory=120000000", f"--temp-dir={temp_dir}", "--disable-usage-stats",
        ]  # fmt: skip
        cmd += ["--head", f"--port={self.port}", "--include-dashboard=false"] if head else [f"--address={self.address}"]
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        node = RayNode(temp_dir=temp_dir, head=head)
        self.nodes.append(node)
        return node

    def wait_for_nodes(self, n: int, timeout: float = 60) -> None:
        def registered() -> bool:
            out = subprocess.run(
                [str(BIN / "ray"), "status", f"--address={self.address}"],
                env=self.env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            return out.stdout.count("node_") >= n

        wait_until(registered, timeout, f"{n} Ray nodes to register", interval=1.0)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            kill_matching(node.temp_dir)
            subprocess.run(["rm", "-rf", node.temp_dir], check=False)


@contextmanager
def ray_cluster(nodes: int, env: dict[str, str]) -> Iterator[RayCluster]:
    cluster = RayCluster(port=free_port(), env={**env, **RAY_ENV})
    try:
        for _ in range(nodes):
            cluster.add_node()
        cluster.wait_for_nodes(nodes)
        yield cluster
    finally:
        cluster.stop()


@dataclass
class S3:
    endpoint: str
    bucket: str
    proc: subprocess.Popen[bytes]

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": "layerlab-test",
            "AWS_SECRET_ACCESS_KEY": "layerlab-test-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "MLFLOW_S3_ENDPOINT_URL": self.endpoint,  # MLflow's boto3 client
            "AWS_ENDPOINT_URL_S3": self.endpoint,  # pyarrow (Ray Tune storage) and boto3
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id="layerlab-test",
            aws_secret_access_key="layerlab-test-secret", region_name="us-east-1",
        )  # fmt: skip

    def keys(self, prefix: str) -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]


@contextmanager
def moto_s3(log_dir: Path, bucket: str = "layerlab") -> Iterator[S3]:
    port = free_port()
    log = open(log_dir / "moto.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT
    )
    s3 = S3(endpoint=f"http://127.0.0.1:{port}", bucket=bucket, proc=proc)
    try:
        wait_until(lambda: _answers(s3.endpoint), 30, "moto's S3 server")
        s3.client().create_bucket(Bucket=bucket)
        yield s3
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
        return True
    except httpx.HTTPError:
        return False


@contextmanager
def pg_databases(*purposes: str) -> Iterator[dict[str, str]]:
    """Fresh, uniquely named databases (purpose -> SQLAlchemy URL), dropped with their connections after."""
    names = {p: f"layerlab_{p}_{uuid.uuid4().hex[:12]}" for p in purposes}
    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=5) as admin:
        for name in names.values():
            admin.execute(f'CREATE DATABASE "{name}"')
    base = PG_SERVER.replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield {p: f"{base}/{n}" for p, n in names.items()}
    finally:
        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=5) as admin:
            for name in names.values():
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def production_env(
    home: Path, queue_url: str, api_port: int, s3: S3, mlflow: MlflowServer, ray: RayCluster
) -> dict[str, str]:
    """The environment of the production stack's API and workers on loopback: PostgreSQL queue, MLflow server,
    Tune's storage on S3, the Ray cluster, short leases (no token yet: the caller makes one)."""
    env = {
        **os.environ, **s3.env, **mlflow.client_env,
        "LAYERLAB_HOME": str(home),
        "LAYERLAB_DATABASE_URL": queue_url,
        "LAYERLAB_API_URL": f"http://127.0.0.1:{api_port}",
        "LAYERLAB_MLFLOW_UI_URL": mlflow.url,
        "LAYERLAB_TUNE_STORAGE": f"s3://{s3.bucket}/tune",
        "LAYERLAB_HEARTBEAT_SECONDS": "1",
        "LAYERLAB_LEASE_SECONDS": "8",
        "LAYERLAB_POLL_SECONDS": "0.5",
        "RAY_ADDRESS": ray.address,
    }  # fmt: skip
    for k in ("LAYERLAB_MLFLOW_ADMIN_PASSWORD", "LAYERLAB_MLFLOW_ADMIN_PASSWORD_FILE", "LAYERLAB_API_TOKEN"):
        env.pop(k, None)
    return env


@dataclass
class MlflowServer:
    url: str
    username: str
    password: str
    env: dict[str, str]
    start: Callable[[], subprocess.Popen[bytes]]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def client_env(self) -> dict[str, str]:
        return {
            "LAYERLAB_MLFLOW_TRACKING_URI": self.url,
            "MLFLOW_TRACKING_USERNAME": self.username,
            "MLFLOW_TRACKING_PASSWORD": self.password,
        }

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)

    def restart(self) -> None:
        self.stop()
        self.proc = self.start()
        self.wait_healthy()

    def wait_healthy(self, timeout: float = 120) -> None:
        def healthy() -> bool:
            assert self.proc is not None and self.proc.poll() is None, "the MLflow server exited; see mlflow.log"
            try:
                return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, timeout, "the MLflow server's /health")


@contextmanager
def mlflow_server(home: Path, backend: str, auth_db: str, s3: S3) -> Iterator[MlflowServer]:
    """`layerlab mlflow-server`: PostgreSQL backend and auth store, artifacts proxied to S3, basic auth
    with a random admin password read from a secret file."""
    port = free_port()
    secret = home / "mlflow_admin_password"
    password = secrets.token_urlsafe(18)
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    env = {
        **os.environ,
        **s3.env,
        "LAYERLAB_HOME": str(home),
        "LAYERLAB_MLFLOW_BACKEND_STORE_URI": backend,
        "LAYERLAB_MLFLOW_AUTH_DB_URI": auth_db,
        "LAYERLAB_MLFLOW_ARTIFACTS_DESTINATION": f"s3://{s3.bucket}/mlartifacts",
        "LAYERLAB_MLFLOW_ADMIN_PASSWORD_FILE": str(secret),
        "TMPDIR": str(home),
    }
    log_path = home / "mlflow.log"

    def start() -> subprocess.Popen[bytes]:
        log = open(log_path, "ab")  # noqa: SIM115 - the child owns it
        return subprocess.Popen(
            [str(BIN / "layerlab"), "mlflow-server", "--port", str(port), "--workers", "1"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    server = MlflowServer(url=f"http://127.0.0.1:{port}", username="admin", password=password, env=env, start=start)
    server.proc = start()
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()
