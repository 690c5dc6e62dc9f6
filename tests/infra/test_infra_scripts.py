"""The scripts under infra/scripts, run for real with the shells the image has (dash as /bin/sh, bash)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.infra.deploy_files import INFRA, K8S, ROOT, SCRIPTS, load_compose

WITH_SECRETS = SCRIPTS / "with-secrets.sh"
SHELLS = [s for s in ("dash", "bash") if shutil.which(s)]
BIN = str(Path(sys.executable).parent)


def run(args: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(args, env={**base, **env}, capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.sh")))
@pytest.mark.parametrize("shell", SHELLS)
def test_scripts_parse(shell: str, script: str) -> None:
    result = run([shell, "-n", str(SCRIPTS / script)], {})
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("shell", SHELLS)
def test_with_secrets_exports_each_file_and_execs_the_command(shell: str, tmp_path: Path) -> None:
    files = {}
    for name, value in (
        ("PGPASSWORD", "pg pass"),
        ("AWS_SECRET_ACCESS_KEY", "s3/key+="),
        ("MLFLOW_TRACKING_PASSWORD", "ml"),
    ):
        path = tmp_path / name.lower()
        path.write_text(value + "\n")  # as `echo value > file` writes it
        files[f"{name}_FILE"] = str(path)
    admin = tmp_path / "admin"
    admin.write_text("stays a file")
    show = 'printf "%s|%s|%s|%s|%s" "$PGPASSWORD" "$AWS_SECRET_ACCESS_KEY" "$MLFLOW_TRACKING_PASSWORD" '
    show += '"${PGPASSWORD_FILE-unset}" "$LAYERLAB_MLFLOW_ADMIN_PASSWORD_FILE"'
    env = {**files, "LAYERLAB_MLFLOW_ADMIN_PASSWORD_FILE": str(admin)}
    result = run([shell, str(WITH_SECRETS), "sh", "-c", show], env)
    assert result.returncode == 0, result.stderr
    # values without the trailing newline; the _FILE variable gone; files it does not manage left alone
    assert result.stdout == f"pg pass|s3/key+=|ml|unset|{admin}"


def test_with_secrets_runs_the_command_in_its_own_place(tmp_path: Path) -> None:
    # exec, not a child: tini's SIGTERM reaches the worker itself, which gives its sweep back.
    proc = subprocess.Popen(["sh", str(WITH_SECRETS), "sleep", "30"], env={"PATH": os.environ["PATH"]})
    try:
        deadline = time.monotonic() + 10
        cmdline = b""
        while time.monotonic() < deadline:
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            if cmdline.startswith(b"sleep"):
                break
            time.sleep(0.05)
        assert cmdline.split(b"\0")[:2] == [b"sleep", b"30"], cmdline
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("shell", SHELLS)
def test_with_secrets_refuses_what_it_cannot_resolve(shell: str, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("x")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    cases = [
        ({"PGPASSWORD": "a", "PGPASSWORD_FILE": str(secret)}, 64, "both PGPASSWORD and PGPASSWORD_FILE are set"),
        (
            {"AWS_SECRET_ACCESS_KEY_FILE": str(tmp_path / "nope")},
            66,
            f"AWS_SECRET_ACCESS_KEY_FILE={tmp_path}/nope is not",
        ),
        ({"MLFLOW_TRACKING_PASSWORD_FILE": str(empty)}, 66, f"MLFLOW_TRACKING_PASSWORD_FILE={empty} is empty"),
    ]
    for env, code, message in cases:
        result = run([shell, str(WITH_SECRETS), "true"], env)
        assert (result.returncode, message in result.stderr) == (code, True), (env, result.stderr)
    result = run([shell, str(WITH_SECRETS)], {})
    assert result.returncode == 64 and "usage: with-secrets.sh COMMAND" in result.stderr


def test_make_secrets_writes_every_secret_the_stack_mounts(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    first = run(["sh", str(SCRIPTS / "make-secrets.sh"), str(folder)], {})
    assert first.returncode == 0, first.stderr
    written = {p.name: p for p in folder.iterdir()}
    compose_secrets = {Path(spec["file"]).name for spec in load_compose()["secrets"].values()}
    template = yaml.safe_load((K8S / "secret.example.yaml").read_text())
    assert set(written) == compose_secrets == set(template["stringData"])
    values = {name: path.read_text() for name, path in written.items()}
    for name, value in values.items():
        assert len(value) == 64 and int(value, 16) >= 0, (name, value)  # 32 random bytes, hex, no newline
        assert stat.S_IMODE(written[name].stat().st_mode) == 0o644, name
    assert len(set(values.values())) == len(values), "every secret is drawn on its own"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    second = run(["sh", str(SCRIPTS / "make-secrets.sh"), str(folder)], {})
    assert second.stdout.count("kept") == len(values)
    assert {name: path.read_text() for name, path in written.items()} == values


def test_mlflow_server_script_names_the_missing_setting() -> None:
    result = run(["sh", str(SCRIPTS / "mlflow-server.sh")], {"LAYERLAB_MLFLOW_BACKEND_STORE_URI": "sqlite:///x.db"})
    assert result.returncode == 64
    assert "mlflow-server.sh: set LAYERLAB_MLFLOW_AUTH_DB_URI" in result.stderr


def test_mlflow_server_script_runs_the_real_command_which_refuses_a_weak_password(tmp_path: Path) -> None:
    # The script execs `layerlab mlflow-server --host 0.0.0.0 --port 5000` with the environment the
    # deployment gives it; the command stops before starting MLflow when the admin password is weak.
    password = tmp_path / "mlflow_admin_password"
    password.write_text("password1234\n")
    env = {
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "LAYERLAB_HOME": str(tmp_path / "home"),
        "LAYERLAB_MLFLOW_BACKEND_STORE_URI": f"sqlite:///{tmp_path}/mlflow.db",
        "LAYERLAB_MLFLOW_AUTH_DB_URI": f"sqlite:///{tmp_path}/auth.db",
        "LAYERLAB_MLFLOW_ARTIFACTS_DESTINATION": str(tmp_path / "artifacts"),
        "LAYERLAB_MLFLOW_ADMIN_PASSWORD_FILE": str(password),
    }
    result = run(["sh", str(SCRIPTS / "mlflow-server.sh")], env, cwd=ROOT)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "admin password" in result.stderr, result.stderr


def test_worker_and_minio_init_scripts_name_what_is_missing() -> None:
    result = run(["sh", str(SCRIPTS / "layerlab-worker.sh")], {})
    assert result.returncode == 64 and "set RAY_ADDRESS to the Ray head's GCS address" in result.stderr
    result = run(["sh", str(SCRIPTS / "minio-init.sh")], {"MINIO_URL": "http://minio:9000"})
    assert result.returncode == 64 and "minio-init.sh: set MINIO_ROOT_USER" in result.stderr


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git checkout")
def test_secret_files_are_never_committed() -> None:
    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0

    for secret in load_compose()["secrets"].values():
        assert ignored(str((INFRA / secret["file"]).resolve().relative_to(ROOT))), secret
    assert ignored("infra/.env")
    assert not ignored("infra/secrets/README.md") and not ignored("infra/secrets/.gitignore")
