"""`layerlab mlflow-server`: the production MLflow tracking server.

PostgreSQL backend store, artifacts proxied to S3 (`--serve-artifacts --artifacts-destination s3://...`;
the server alone holds the S3 credentials, clients talk HTTP), and MLflow's basic-auth app. The admin
password comes from a secret file or the environment and is never written to disk by us: it reaches
MLflow through MLFLOW_AUTH_ADMIN_PASSWORD, which MLflow reads when it creates the admin user on first
start. Startup refuses a missing, short or well-known password.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from service.settings import Settings

# MLflow's old built-in default, and other passwords people leave in place.
KNOWN_DEFAULTS = frozenset({"password1234", "password", "admin", "changeme", "mlflow", "minioadmin"})
MIN_PASSWORD_LENGTH = 12


class ServerConfigError(ValueError):
    """The server's configuration is unsafe or incomplete; the message says how to fix it."""


def admin_password(settings: Settings) -> str:
    if settings.mlflow_admin_password_file is not None:
        path = settings.mlflow_admin_password_file
        try:
            password = path.read_text().strip()
        except OSError as exc:
            raise ServerConfigError(
                f"cannot read LAYERLAB_MLFLOW_ADMIN_PASSWORD_FILE={path}: {exc.strerror}; mount the secret there"
            ) from None
    else:
        password = (settings.mlflow_admin_password or "").strip()
    if not password:
        raise ServerConfigError(
            "no MLflow admin password: put one in a secret file and set LAYERLAB_MLFLOW_ADMIN_PASSWORD_FILE to its "
            "path (or set LAYERLAB_MLFLOW_ADMIN_PASSWORD); e.g. `openssl rand -base64 24 > infra/secrets/"
            "mlflow_admin_password`"
        )
    if password.lower() in KNOWN_DEFAULTS:
        raise ServerConfigError(
            "the MLflow admin password is a well-known default; choose a random one (e.g. `openssl rand -base64 24`)"
        )
    if len(password) < MIN_PASSWORD_LENGTH:
        raise ServerConfigError(
            f"the MLflow admin password has {len(password)} characters; use at least {MIN_PASSWORD_LENGTH}"
        )
    return password


def flask_secret_key(settings: Settings) -> str:
    """MLflow's auth app signs CSRF tokens with it. Replicas behind one URL must share it (a secret file);
    a single server may use one generated on first start and kept (0600) under `home`."""
    if os.environ.get("MLFLOW_FLASK_SERVER_SECRET_KEY"):
        return os.environ["MLFLOW_FLASK_SERVER_SECRET_KEY"]
    if settings.mlflow_secret_key_file is not None:
        try:
            key = settings.mlflow_secret_key_file.read_text().strip()
        except OSError as exc:
            raise ServerConfigError(
                f"cannot read LAYERLAB_MLFLOW_SECRET_KEY_FILE={settings.mlflow_secret_key_file}: {exc.strerror}"
            ) from None
        if len(key) < 16:
            raise ServerConfigError("the MLflow secret key file holds under 16 characters; use `openssl rand -hex 32`")
        return key
    path = settings.home_abs / "mlflow-server" / "secret_key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_hex(32))
    return path.read_text().strip()


def auth_config_text(settings: Settings) -> str:
    auth_db = settings.mlflow_auth_db_uri or f"sqlite:///{settings.home_abs / 'mlflow-auth.db'}"
    return (
        "[mlflow]\n"
        # Everyone signed in may read every experiment (a team's shared view); writing needs a grant or admin.
        "default_permission = READ\n"
        f"database_uri = {auth_db}\n"
        f"admin_username = {settings.mlflow_admin_username}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        # Checking a password is a PBKDF2 hash (~0.1-0.3 s of CPU); a worker logs metrics many times a
        # second. Cache a verified (user, password) for 30 s: a revoked password stops working within 30 s.
        "auth_cache_ttl_seconds = 30\n"
    )


def server_command(settings: Settings, host: str, port: int, workers: int) -> tuple[list[str], dict[str, str]]:
    """The `mlflow server` command line and the environment it needs; raises ServerConfigError."""
    password = admin_password(settings)
    backend = settings.mlflow_backend_store_uri or f"sqlite:///{settings.home_abs / 'mlflow.db'}"
    artifacts = settings.mlflow_artifacts_destination or str(settings.artifact_root)
    if artifacts.startswith("s3://") and not (os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_PROFILE")):
        raise ServerConfigError(
            f"artifacts go to {artifacts} but no S3 credentials are set: set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (and MLFLOW_S3_ENDPOINT_URL for MinIO or another S3-compatible store)"
        )
    conf_dir = settings.home_abs / "mlflow-server"
    conf_dir.mkdir(parents=True, exist_ok=True)
    conf = conf_dir / "basic_auth.ini"
    conf.write_text(auth_config_text(settings))
    conf.chmod(0o600)
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--app-name", "basic-auth",
        "--backend-store-uri", backend,
        "--serve-artifacts", "--artifacts-destination", artifacts,
        "--host", host, "--port", str(port), "--workers", str(workers),
    ]  # fmt: skip
    if settings.mlflow_allowed_hosts:
        cmd += ["--allowed-hosts", settings.mlflow_allowed_hosts]
    env = {
        **os.environ,
        "MLFLOW_AUTH_CONFIG_PATH": str(conf),
        "MLFLOW_AUTH_ADMIN_PASSWORD": password,
        "MLFLOW_FLASK_SERVER_SECRET_KEY": flask_secret_key(settings),
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    env.pop("LAYERLAB_MLFLOW_ADMIN_PASSWORD", None)  # the server process needs it once, under MLflow's name
    return cmd, env


def exec_server(settings: Settings, host: str, port: int, workers: int) -> None:
    cmd, env = server_command(settings, host, port, workers)
    Path(settings.home_abs).mkdir(parents=True, exist_ok=True)
    # exec: the container's PID 1 signal goes straight to MLflow.
    os.execve(cmd[0], cmd, env)
