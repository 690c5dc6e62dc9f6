"""The container tier: the project image built for real (scripts/build-image.sh) and the production stack
started from it with the compose file itself (infra/docker-compose.yml, podman-compose), once per run.

What the tier changes, and why (in a generated override file, never in the compose file):
- PostgreSQL and MinIO: when their images cannot be pulled (no registry answers), local stand-ins are
  built on the project's base image: Debian's PostgreSQL 15 with an entrypoint doing what the official
  image's does for the stack (images/postgres-entrypoint.sh), and the moto S3 server for MinIO (MinIO
  ships no package); minio-init then only creates the bucket (moto takes any credentials).
- Ports: the API and MLflow are published on free loopback ports, not 8000 and 5000.
- Secrets: fresh ones in a temporary folder, not infra/secrets.
- ray-worker: one CPU worker (the compose file's ray-worker is the GPU node, 0 replicas by default).
podman before 4.6 ignores `depends_on: condition: service_healthy` and runs healthchecks only from
systemd timers, so the tier starts the services in the compose file's dependency order itself and runs
each service's own healthcheck (`podman healthcheck run`) until it passes.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from service.local_ray import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "infra" / "docker-compose.yml"
IMAGES = Path(__file__).resolve().parent / "images"
CONTAINERS_CONF = ROOT / "infra" / "podman" / "containers.conf"
IMAGE = os.environ.get("LAYERLAB_TEST_IMAGE", "localhost/layerlab:latest")
PODMAN_COMPOSE = shutil.which("podman-compose", path=str(Path(sys.executable).parent)) or shutil.which("podman-compose")
SECRETS = (
    "postgres_password",
    "minio_root_password",
    "s3_secret_key",
    "mlflow_admin_password",
    "mlflow_secret_key",
    "ray_auth_token",
)


def _env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(CONTAINERS_CONF))}


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["podman", *args], env=_env(), capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} -> {out.returncode}: {out.stderr[-2000:]}")
    return out


def _cannot_run_containers() -> str | None:
    """Why no container can run here (the tier is skipped with it), or None."""
    if os.environ.get("LAYERLAB_CONTAINER_TIER") == "0":
        # On by default: from nothing (base image, project image, stand-ins) it took 534 s here, idle.
        return "the container tier is turned off by LAYERLAB_CONTAINER_TIER=0"
    if shutil.which("podman") is None:
        return "no container engine: install podman and runc (apt-get install podman runc debootstrap iptables)"
    if PODMAN_COMPOSE is None:
        return "podman-compose is not installed (pip install podman-compose; requirements.lock pins it)"
    # A root of the host's own /bin/true and its libraries: proves the runtime and cgroups without an image.
    # (Not the host's / itself: on some hosts runc cannot set up cgroups inside it while real images run.)
    with tempfile.TemporaryDirectory() as rootfs:
        _minimal_rootfs(Path(rootfs), "/bin/true")
        probe = podman("run", "--rm", "--rootfs", rootfs, "/bin/true", timeout=60, check=False)
    if probe.returncode != 0:
        return f"podman cannot run a container here: {probe.stderr.strip().splitlines()[-1:]}"
    return None


def _minimal_rootfs(root: Path, program: str) -> None:
    """`program` and the shared libraries `ldd` names for it, at their own paths under `root`."""
    libraries = re.findall(r"(/\S+\.so[.\d]*)", subprocess.run(["ldd", program], capture_output=True, text=True).stdout)
    for path in (program, *libraries):
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    for mount_point in ("proc", "sys", "dev", "etc"):
        (root / mount_point).mkdir(exist_ok=True)


@pytest.fixture(scope="session")
def image() -> str:
    """The project image, built once per run (unchanged inputs reuse every layer)."""
    reason = _cannot_run_containers()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    _build(IMAGE)
    print(f"image {IMAGE} ready in {time.monotonic() - started:.0f} s")
    return IMAGE


def _build(tag: str, *args: str) -> str:
    """An image built the way the project image is (same engine, base and pip local wheels)."""
    env = {**_env(), "IMAGE": tag}
    cmd = [str(ROOT / "scripts" / "build-image.sh"), *args]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return tag


def _stand_in(name: str, *build_args: str) -> str:
    args = ["--file", str(IMAGES / f"{name}.Containerfile"), "--context", str(IMAGES)]
    for arg in build_args:
        args += ["--build-arg", arg]
    return _build(f"localhost/layerlab-test-{name}:latest", *args)


def _locked(package: str) -> str:
    match = re.search(rf"^{package}==(\S+)$", (ROOT / "requirements.lock").read_text(), re.M)
    assert match, f"{package} is not pinned in requirements.lock"
    return match.group(1)


# The compose file's own images for PostgreSQL and MinIO (its defaults), when they can be had.
POSTGRES_IMAGE = "docker.io/library/postgres:17-bookworm"
MINIO_IMAGES = ("quay.io/minio/minio:RELEASE.2025-09-07T16-13-09Z", "quay.io/minio/mc:RELEASE.2025-08-13T08-35-41Z")

POSTGRES_STAND_IN = """\
  postgres:
    image: {image}
"""
# moto takes any credentials, so minio-init only makes the bucket (with boto3, from the project image).
MAKE_BUCKET = (
    "import boto3, os; boto3.client('s3', endpoint_url=os.environ['MINIO_URL'], aws_access_key_id='layerlab',"
    " aws_secret_access_key='any', region_name='us-east-1').create_bucket(Bucket=os.environ['S3_BUCKET'])"
)
MINIO_STAND_IN = """\
  minio:
    image: {moto}
    command: !reset []
    healthcheck:
      test: !override ["CMD", "python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:9000/moto-api/')"]
  minio-init:
    image: {image}
    entrypoint: !override {make_bucket}
"""
OVERRIDE = """\
# Generated by tests/containers/conftest.py for one test run.
services:
{stand_ins}  mlflow:
    ports: !override ["127.0.0.1:{mlflow_port}:5000"]
  api:
    ports: !override ["127.0.0.1:{api_port}:8000"]
  ray-worker:
    deploy: !override {{replicas: 1}}
secrets:
{secrets}
"""


def _pulled(image: str) -> bool:
    if podman("image", "exists", image, check=False).returncode == 0:
        return True
    return podman("pull", "-q", image, check=False, timeout=600).returncode == 0


def _stand_ins(image: str) -> str:
    """Override entries for the compose file's third-party images that cannot be pulled here."""
    entries = ""
    if not _pulled(POSTGRES_IMAGE):
        entries += POSTGRES_STAND_IN.format(image=_stand_in("postgres"))
    if not all(_pulled(i) for i in MINIO_IMAGES):
        entries += MINIO_STAND_IN.format(
            moto=_stand_in("moto", f"MOTO_VERSION={_locked('moto')}"),
            image=image,
            make_bucket=json.dumps(["python3", "-c", MAKE_BUCKET]),
        )
    return entries


@dataclass
class ComposeStack:
    project: str
    folder: Path
    api_url: str
    mlflow_url: str
    mlflow_password: str = field(repr=False)
    env: dict[str, str] = field(repr=False)

    def compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        cmd = [
            str(PODMAN_COMPOSE),
            "-p",
            self.project,
            "-f",
            str(COMPOSE_FILE),
            "-f",
            str(self.folder / "override.yml"),
        ]
        out = subprocess.run([*cmd, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, f"podman-compose {' '.join(args)} -> {out.returncode}:\n{out.stderr[-3000:]}"
        return out

    def container(self, service: str) -> str:
        names = podman(
            "ps",
            "-a",
            "--filter",
            f"label=com.docker.compose.project={self.project}",
            "--filter",
            f"label=com.docker.compose.service={service}",
            "--format",
            "{{.Names}}",
        ).stdout.split()
        assert names, f"no container for service {service} in project {self.project}"
        return names[0]

    def logs(self, service: str, lines: int = 60) -> str:
        out = podman("logs", "--tail", str(lines), self.container(service), check=False)
        return f"--- {service} (last {lines} lines)\n{out.stdout}{out.stderr}"

    def wait_healthy(self, service: str, timeout: float) -> None:
        """Run the service's own healthcheck until it passes (podman 4.3 runs none by itself here)."""
        name = self.container(service)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if podman("healthcheck", "run", name, check=False, timeout=60).returncode == 0:
                return
            state = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
            if state == "exited":
                raise AssertionError(f"{service} exited before it was healthy\n{self.logs(service)}")
            time.sleep(2)
        raise AssertionError(f"{service} not healthy after {timeout:.0f} s\n{self.logs(service)}")

    def wait_completed(self, service: str, timeout: float) -> None:
        name = self.container(service)
        out = podman("wait", name, timeout=timeout, check=False)
        code = out.stdout.strip()
        assert code == "0", f"{service} ended with {code!r} {out.stderr}\n{self.logs(service)}"

    def exec(self, service: str, *cmd: str, timeout: float = 120) -> str:
        # `podman exec` skips the entrypoint, so secrets reach the command through with-secrets.sh.
        out = podman("exec", self.container(service), "with-secrets.sh", *cmd, timeout=timeout)
        return out.stdout


@pytest.fixture(scope="module")  # down as soon as its tests end: up, it holds ~3 GB and a share of a core
def compose_stack(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeStack]:
    folder = tmp_path_factory.mktemp("compose")
    (folder / "secrets").mkdir(mode=0o700)
    for name in SECRETS:
        path = folder / "secrets" / name
        path.write_text(secrets.token_hex(32))
        path.chmod(0o644)  # the containers read them as their own non-root users
    api_port, mlflow_port = free_port(), free_port()
    secret_lines = "\n".join(f"  {n}:\n    file: {folder / 'secrets' / n}" for n in SECRETS)
    (folder / "override.yml").write_text(
        OVERRIDE.format(
            stand_ins=_stand_ins(image),
            api_port=api_port,
            mlflow_port=mlflow_port,
            secrets=secret_lines,
        )
    )
    env = {
        **_env(),
        "IMAGE": image,
        "MLFLOW_PUBLIC_HOST": f"127.0.0.1:{mlflow_port}",
        "MLFLOW_PUBLIC_URL": f"http://127.0.0.1:{mlflow_port}",
        "QUEUE_WORKERS": "1",
    }
    stack = ComposeStack(
        project=f"llct{uuid.uuid4().hex[:8]}",
        folder=folder,
        api_url=f"http://127.0.0.1:{api_port}",
        mlflow_url=f"http://127.0.0.1:{mlflow_port}",
        mlflow_password=(folder / "secrets" / "mlflow_admin_password").read_text(),
        env=env,
    )
    try:
        # The compose file's dependency order, each step waiting on the condition it declares.
        stack.compose("up", "-d", "--no-deps", "postgres", "minio")
        stack.wait_healthy("postgres", 120)
        stack.wait_healthy("minio", 120)
        stack.compose("up", "-d", "--no-deps", "minio-init", "migrate", "ray-head")
        stack.wait_completed("minio-init", 120)
        stack.wait_completed("migrate", 180)
        stack.compose("up", "-d", "--no-deps", "mlflow")
        stack.wait_healthy("ray-head", 180)
        stack.wait_healthy("mlflow", 240)
        stack.compose("up", "-d", "--no-deps", "api", "worker", "ray-worker")
        stack.wait_healthy("api", 180)
        yield stack
    finally:
        services = json.loads(
            podman(
                "ps",
                "-a",
                "--filter",
                f"label=com.docker.compose.project={stack.project}",
                "--format",
                "json",
                check=False,
            ).stdout
            or "[]"
        )
        for service in sorted({c.get("Labels", {}).get("com.docker.compose.service", "") for c in services} - {""}):
            print(stack.logs(service, 30))
        subprocess.run(
            [
                str(PODMAN_COMPOSE),
                "-p",
                stack.project,
                "-f",
                str(COMPOSE_FILE),
                "-f",
                str(folder / "override.yml"),
                "down",
                "-v",
                "-t",
                "10",
            ],
            env=env,
            capture_output=True,
            timeout=300,
        )
