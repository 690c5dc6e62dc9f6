"""API response bodies."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.models import Sweep, Trial
from service.routing import Waiting
from service.states import SweepState


class TrialCounts(BaseModel):
    total: int
    pending: int
    running: int
    finished: int
    errored: int
    cancelled: int = 0
    """Stopped unfinished by a cancel (`resume` runs them on), or by a stop rule of a sweep that succeeded
    (with the trials it never started: they never run)."""
    lost: int = 0
    """Started after Tune's last saved state under a searcher that does not make them again (a kill of the
    worker): closed, and replaced by other trials of the searcher. Not counted in `total`."""


class MlflowLinks(BaseModel):
    experiment_id: str | None
    parent_run_id: str | None
    experiment_url: str | None
    parent_run_url: str | None


class RegisteredModel(BaseModel):
    name: str | None
    version: str | None
    alias: str | None
    uri: str | None


class SweepPublic(BaseModel):
    id: int
    name: str
    task: str
    owner: str | None
    state: str
    reason: str | None
    priority: int
    attempts: int
    max_attempts: int
    cancel_requested: bool
    worker_id: str | None
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    metric: dict[str, str]
    trials: TrialCounts
    best_metric: float | None
    best_config: dict[str, Any] | None
    best_trial_id: str | None
    mlflow: MlflowLinks
    model: RegisteredModel
    waiting: Waiting | None = None
    """A queued sweep: what it waits for (a worker whose cluster can hold its trials, or its turn)."""
    code: dict[str, str] | None = None
    """The code its latest attempt ran: `layerlab.version`, and from a git checkout `layerlab.git_commit`
    and `layerlab.git_modified`; null until a worker starts it."""
    rerun_of: int | None = None
    """The sweep this one repeats (POST /sweeps/{id}/rerun)."""
    code_sha256: str | None = None
    """The researcher's code the sweep brings (spec `code`; GET /sweeps/{id}/code), by its archive's sha256;
    null for a built-in task."""
    importances: dict[str, float] | None = None
    """What mattered: searched parameter -> its share of the variance of the final metric over the finished
    trials (fANOVA, a fixed forest seed), largest first; null until the sweep's summary, or with < 3 trials."""
    task_name: str | None = None
    """A sweep that brings code: its Task's own name, known once a worker imported the code (`task` is the
    module:attribute the spec names); null for a built-in task."""

    @classmethod
    def build(
        cls, sweep: Sweep | SimpleNamespace, counts: dict[str, int], ui_url: str, waiting: Waiting | None = None
    ) -> SweepPublic:
        """`sweep`: the ORM row, or service.reads' row (the same columns as attributes, without the spec)."""
        ui = ui_url.rstrip("/")
        exp, run = sweep.mlflow_experiment_id, sweep.mlflow_parent_run_id
        uri = None
        if sweep.model_name and sweep.model_version:
            uri = f"models:/{sweep.model_name}@{sweep.model_alias}" if sweep.model_alias else None
            uri = uri or f"models:/{sweep.model_name}/{sweep.model_version}"
        seen = sum(n for state, n in counts.items() if state != "lost")
        # A sweep that succeeded before all its trials started (a stop rule) never runs the rest: not pending.
        never = max(sweep.trials_total, seen) - seen if sweep.state == SweepState.succeeded else 0
        return cls(
            id=sweep.id,
            name=sweep.name,
            task=sweep.task,
            owner=sweep.owner,
            state=sweep.state,
            reason=sweep.reason,
            priority=sweep.priority,
            attempts=sweep.attempts,
            max_attempts=sweep.max_attempts,
            cancel_requested=sweep.cancel_requested,
            worker_id=sweep.worker_id,
            submitted_at=utc(sweep.submitted_at),
            started_at=utc(sweep.started_at) if sweep.started_at else None,
            finished_at=utc(sweep.finished_at) if sweep.finished_at else None,
            metric={"name": sweep.metric_name, "mode": sweep.metric_mode},
            trials=TrialCounts(
                total=max(sweep.trials_total, seen),
                pending=max(sweep.trials_total, seen) - seen - never + counts.get("pending", 0),
                running=counts.get("running", 0),
                finished=counts.get("terminated", 0),
                errored=counts.get("error", 0),
                cancelled=counts.get("cancelled", 0) + never,
                lost=counts.get("lost", 0),
            ),
            best_metric=sweep.best_metric,
            best_config=sweep.best_config,
            best_trial_id=sweep.best_trial_id,
            mlflow=MlflowLinks(
                experiment_id=exp,
                parent_run_id=run,
                # MLflow 3.17's UI opens an experiment on its GenAI overview unless the link (or the browser's
                # saved choice) says otherwise; it does not read the experiment's mlflow.experimentKind tag.
                experiment_url=f"{ui}/#/experiments/{exp}/runs?workflowType=machine_learning" if exp else None,
                parent_run_url=f"{ui}/#/experiments/{exp}/runs/{run}" if exp and run else None,
            ),
            model=RegisteredModel(name=sweep.model_name, version=sweep.model_version, alias=sweep.model_alias, uri=uri),
            waiting=waiting,
            code=sweep.code,
            rerun_of=sweep.rerun_of,
            code_sha256=sweep.code_sha256,
            importances=sweep.importances,
            task_name=sweep.task_name,
        )


def utc(at: datetime) -> datetime:
    """The queue keeps naive UTC (service.models.utcnow); the API says so: RFC 3339 date-times carry an offset."""
    return at if at.tzinfo else at.replace(tzinfo=UTC)


class SweepList(BaseModel):
    sweeps: list[SweepPublic]


class SpecErrorBody(BaseModel):
    message: str
    errors: list[str]
    """Each `field.path: what is wrong, got <value>`; `<document>` when the body as a whole is unreadable."""


class SpecErrorResponse(BaseModel):
    """The 422 body of POST /sweeps: FastAPI puts an HTTPException's detail under `detail`."""

    detail: SpecErrorBody


class ErrorResponse(BaseModel):
    """Every other error body: one line saying what is wrong and how to fix it."""

    detail: str


def error_doc(description: str) -> dict[str, Any]:
    """An OpenAPI `responses` entry for an error answered as {"detail": "..."}."""
    return {"model": ErrorResponse, "description": description}


AUTH_AND_DATABASE: dict[int | str, dict[str, Any]] = {
    401: error_doc("missing, unknown or revoked API token"),
    503: error_doc("the queue database is down"),
}
"""What every route that needs a token may answer besides its own errors."""


class TrialPublic(BaseModel):
    trial_id: str
    state: str
    """A service.models.TrialState value: pending, running, terminated (finished), error, ..."""
    config: dict[str, Any]
    iteration: int
    """The latest reported training iteration."""
    metrics: dict[str, Any] | None
    """The task's metrics at that iteration (the latest values, not the best)."""
    starts: int
    """How many times the trial was started: more than 1 after a failure or a worker's restart."""
    node_id: str | None
    mlflow_run_id: str | None
    reason: str | None = None
    """Why the trial ended other than by finishing (error, cancelled, lost)."""
    updated_at: datetime

    @classmethod
    def build(cls, trial: Trial) -> TrialPublic:
        return cls(
            trial_id=trial.trial_id,
            state=trial.state,
            config=trial.config or {},
            iteration=trial.iteration,
            metrics=trial.metrics,
            starts=trial.starts,
            node_id=trial.node_id,
            mlflow_run_id=trial.mlflow_run_id,
            reason=trial.reason,
            updated_at=utc(trial.updated_at),
        )


class TrialList(BaseModel):
    """GET /sweeps/{id}/trials: every trial so far, in the order they started."""

    sweep_id: int
    metric: dict[str, str]
    space: list[str]
    """The searched config keys of the spec (its `space`), in the spec's order."""
    trials: list[TrialPublic]


# --- webhooks (service/webhooks.py) ---------------------------------------------------------------


class WebhookIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2000, description="http(s) URL that receives a POST per sweep end.")
    secret: str | None = Field(
        default=None,
        min_length=16,
        max_length=200,
        description="Signs each event (HMAC-SHA256); a random one is made when left out. Shown once.",
    )


class WebhookCreated(BaseModel):
    id: int
    url: str
    secret: str
    """The signing secret: shown here only; keep it with the receiver (service.webhooks.verify)."""
    created_at: datetime


class AttemptPublic(BaseModel):
    at: datetime
    status_code: int | None
    error: str | None
    seconds: float


class DeliveryPublic(BaseModel):
    event_id: str
    sweep_id: int
    state: str
    """pending (next try at next_attempt_at), delivered, or failed (its tries used up, or the webhook removed)."""
    attempts: int
    next_attempt_at: datetime
    delivered_at: datetime | None
    tries: list[AttemptPublic]


class WebhookPublic(BaseModel):
    id: int
    owner: str
    url: str
    created_at: datetime
    deliveries: list[DeliveryPublic]
    """The newest 20, newest first."""


class WebhookList(BaseModel):
    webhooks: list[WebhookPublic]
