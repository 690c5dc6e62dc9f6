"""`layerlab mlflow-server` refuses unsafe configurations before it starts anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.mlflow_server import ServerConfigError, admin_password, server_command
from service.settings import Settings

LAYERLAB = str(Path(sys.executable).with_name("layerlab"))


def settings(tmp_path: Path, **values: object) -> Settings:
    return Settings(home=tmp_path, **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("password", "message"),
    [
        (None, "no MLflow admin password"),
        ("   ", "no MLflow admin password"),
        ("password1234", "well-known default"),
        ("changeme", "well-known default"),
        ("short-pw", "has 8 characters; use at least 12"),
    ],
)
def test_unsafe_passwords_are_refused(tmp_path: Path, password: str | None, message: str) -> None:
    with pytest.raises(ServerConfigError, match=message):
        admin_password(settings(tmp_path, mlflow_admin_password=password))


def test_the_password_file_wins_and_reaches_mlflow_by_environment_only(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("a-long-random-secret-value\n")
    s = settings(tmp_path, mlflow_admin_password="ignored-env-password", mlflow_admin_password_file=secret)
    cmd, env = server_command(s, "127.0.0.1", 5999, 1)
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"] == "a-long-random-secret-value"
    assert "--app-name" in cmd and cmd[cmd.index("--app-name") + 1] == "basic-auth"
    conf = Path(env["MLFLOW_AUTH_CONFIG_PATH"])
    assert "a-long-random-secret-value" not in conf.read_text() and "admin_password" not in conf.read_text()
    assert conf.stat().st_mode & 0o077 == 0
    key = Path(tmp_path / "mlflow-server" / "secret_key")
    assert env["MLFLOW_FLASK_SERVER_SECRET_KEY"] == key.read_text() and key.stat().st_mode & 0o077 == 0
    assert server_command(s, "127.0.0.1", 5999, 1)[1]["MLFLOW_FLASK_SERVER_SECRET_KEY"] == key.read_text()


def test_missing_secret_file_and_s3_without_credentials_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ServerConfigError, match=r"cannot read LAYERLAB_MLFLOW_ADMIN_PASSWORD_FILE=.*nope"):
        admin_password(settings(tmp_path, mlflow_admin_password_file=tmp_path / "nope"))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    s = settings(tmp_path, mlflow_admin_password="a-long-random-secret", mlflow_artifacts_destination="s3://b/x")
    with pytest.raises(ServerConfigError, match="no S3 credentials are set"):
        server_command(s, "127.0.0.1", 5999, 1)


def test_cli_exits_2_with_the_reason(tmp_path: Path) -> None:
    env = {**os.environ, "LAYERLAB_HOME": str(tmp_path), "LAYERLAB_MLFLOW_ADMIN_PASSWORD": "password1234"}
    env.pop("LAYERLAB_MLFLOW_ADMIN_PASSWORD_FILE", None)
    out = subprocess.run([LAYERLAB, "mlflow-server"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "well-known default" in out.stderr
