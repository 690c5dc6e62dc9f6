"""Service settings, read from LAYERLAB_* environment variables (and RAY_ADDRESS)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# The worker's runtime environment: set in every worker process (workers/worker.py) and in the embedded Ray head,
# whose trial processes inherit the head's environment, not the driver's (service/embedded_stack.py ray_env).
RAY_ENV_DEFAULTS = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    # Tune's default per-trial loggers, less TensorBoard's: the sweep's metrics are in MLflow, and the
    # TensorBoard files cost the driver ~5% of its loop (benchmarks/service_overhead.py). The JSON and
    # CSV loggers are named in the RunConfig (Tune's ResultGrid reads their files).
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    "TUNE_MAX_PENDING_TRIALS_PG": "8",
    # How often Tune saves its experiment state (its default "auto" waits 10 s or more). A save a few
    # seconds behind costs only repeated work after a kill: the ledger holds every end and checkpoint.
    "TUNE_GLOBAL_CHECKPOINT_S": "5",
    # Ctrl-C reaches the worker's own handler (a stop request, acted on by the callback) instead of Tune's.
    "TUNE_DISABLE_SIGINT_HANDLER": "1",
}
WORKER_ENV_DEFAULTS = {
    # MLflow's HTTP client retries a refused request for about 4 minutes by default, while a Tune callback
    # that waits on it holds up every trial; the tracker keeps such writes back and delivers them later.
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LAYERLAB_", extra="ignore")

    home: Path = Field(default=Path(".layerlab"), description="Folder for the embedded stack's files.")
    database_url: str | None = Field(default=None, description="Queue store; SQLite under `home` when unset.")
    mlflow_tracking_uri: str | None = Field(default=None, description="MLflow; SQLite under `home` when unset.")
    mlflow_ui_url: str = Field(default="http://127.0.0.1:5000", description="Base URL for links to runs.")
    api_url: str = Field(default="http://127.0.0.1:8000", description="Where the CLI finds the API.")
    lease_seconds: float = Field(default=30.0, gt=0, description="A claim expires this long after a heartbeat.")
    heartbeat_seconds: float = Field(default=5.0, gt=0)
    take_over_dead_leases: bool = Field(
        default=True,
        description="A worker expires at once the lease of a worker that died on its own host (pid gone, same "
        "boot), instead of waiting lease_seconds (workers/supervisor.py).",
    )
    poll_seconds: float = Field(default=2.0, gt=0, description="Idle worker's wait between claims.")
    max_attempts: int = Field(
        default=5, ge=1, description="Claims of one sweep before it fails, for a spec that names no max_attempts."
    )
    max_running_per_user: int | None = Field(
        default=None,
        ge=1,
        description="Running sweeps one owner may have at once; their next sweep waits while others' run "
        '(README "Fair share"). Unlimited when unset.',
    )
    max_body_bytes: int = Field(default=256 * 1024, gt=0)
    allow_code: bool = Field(
        default=True,
        description="Sweeps may bring the researcher's own code (spec `code`), run with the workers' privileges; "
        "false refuses such sweeps at the API (LAYERLAB_ALLOW_CODE=0).",
    )
    ray_num_cpus: int | None = Field(default=None, description="CPUs of a local Ray; all when unset.")
    data_roots: str = Field(
        default="~/.cache/layerlab",
        description="Folders (separated by ':') that task params naming a file or folder (data_dir, data_files, "
        "cache_dir) must lie in, on the API's machine and on every worker's (service/data_paths.py).",
    )
    api_max_wait_seconds: float = Field(
        default=60.0,
        ge=0,
        le=60,
        description="Longest long poll GET /sweeps/{id}?wait= holds (shorter waits are cut to this).",
    )
    api_workers: int = Field(default=1, ge=1, le=64, description="Processes of `layerlab serve` (uvicorn workers).")
    token_cache_seconds: float = Field(
        default=5.0,
        ge=0,
        le=300,
        description="How long an API process trusts a token it has checked before asking the database again: "
        "a revoked token stops working within this time (0: check every request).",
    )
    api_token: str | None = Field(
        default=None, description="The CLI's API token; `<home>/api-token` (written by `layerlab up`) when unset."
    )
    webhook_allow_private: bool = Field(
        default=False,
        description="Webhooks may target loopback, private and link-local addresses (service/webhooks.py). Off: "
        "a webhook must not make the API a proxy into its own network. `layerlab up` (one machine) turns it on.",
    )
    webhook_poll_seconds: float = Field(
        default=2.0, gt=0, le=60, description="How often `layerlab serve` looks for sweep ends and due deliveries."
    )
    webhook_backoff_seconds: float = Field(
        default=2.0, gt=0, le=600, description="First wait after a failed delivery; it doubles each try (max 15 min)."
    )
    # `layerlab mlflow-server` (the production tracking server): PostgreSQL stores, S3 artifacts, basic auth.
    mlflow_backend_store_uri: str | None = Field(default=None, description="SQLite under `home` when unset.")
    mlflow_auth_db_uri: str | None = Field(default=None, description="Users of basic auth; SQLite under `home`.")
    mlflow_artifacts_destination: str | None = Field(
        default=None, description="e.g. s3://bucket/mlartifacts; `home`/mlartifacts when unset."
    )
    mlflow_admin_username: str = Field(default="admin")
    mlflow_admin_password: str | None = Field(default=None, description="Prefer the _FILE form (a secret).")
    mlflow_admin_password_file: Path | None = Field(default=None, description="A file holding the admin password.")
    mlflow_secret_key_file: Path | None = Field(
        default=None,
        description="Flask secret (CSRF) of the MLflow server; the same for every replica. Generated under `home`.",
    )
    mlflow_allowed_hosts: str | None = Field(
        default=None, description="Host headers the MLflow server accepts beyond localhost (e.g. mlflow,mlflow:5000)."
    )

    @property
    def home_abs(self) -> Path:
        return self.home.expanduser().resolve()

    @property
    def queue_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home_abs / 'queue.db'}"

    @property
    def tracking_uri(self) -> str:
        return self.mlflow_tracking_uri or f"sqlite:///{self.home_abs / 'mlflow.db'}"

    @property
    def artifact_root(self) -> Path:
        return self.home_abs / "mlartifacts"

    @property
    def tune_storage(self) -> str:
        return os.environ.get("LAYERLAB_TUNE_STORAGE") or str(self.home_abs / "tune")

    @property
    def token_file(self) -> Path:
        return self.home_abs / "api-token"

    def resolved_api_token(self) -> str | None:
        if self.api_token:
            return self.api_token
        if self.token_file.is_file():
            return self.token_file.read_text().strip() or None
        return None

    @property
    def ray_address(self) -> str | None:
        return os.environ.get("RAY_ADDRESS") or None


@lru_cache
def get_settings() -> Settings:
    return Settings()
