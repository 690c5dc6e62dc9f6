"""Queue tables. Column values of `state` are the lowercase SweepState / TrialState values."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    func,
    select,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, aliased, mapped_column

# The states live in service/states.py (no SQLAlchemy: the CLI reads them); re-exported for the store's callers.
from service.states import TERMINAL as TERMINAL
from service.states import TRANSITIONS as TRANSITIONS
from service.states import TRIAL_ENDED as TRIAL_ENDED
from service.states import SweepEvent as SweepEvent
from service.states import SweepState as SweepState
from service.states import TrialState as TrialState
from service.states import next_state as next_state


def utcnow() -> datetime:
    """Naive UTC: SQLite keeps no time zone, and every comparison in SQL is then like with like."""
    return datetime.now(UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class Sweep(Base):
    __tablename__ = "sweeps"
    # The claim query's order (state filter, then priority DESC, age, id): read from the index instead of
    # sorting the queue on every claim (2.7 ms at 2000 queued sweeps, 0.07 ms with it).
    __table_args__ = (Index("ix_sweeps_claim_order", "state", text("priority DESC"), "submitted_at", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100), index=True)
    task: Mapped[str] = mapped_column(String(100))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    spec_yaml: Mapped[str] = mapped_column(Text)
    priority: Mapped[int] = mapped_column(Integer, default=50)
    state: Mapped[str] = mapped_column(String(16), default=SweepState.queued.value, index=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=5)
    worker_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    submitted_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    trials_total: Mapped[int] = mapped_column(Integer, default=0)
    metric_name: Mapped[str] = mapped_column(String(100))
    metric_mode: Mapped[str] = mapped_column(String(3))
    best_metric: Mapped[float | None] = mapped_column(Float, nullable=True)
    best_config: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    best_trial_id: Mapped[str | None] = mapped_column(String(100), nullable=True)
    mlflow_experiment_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    mlflow_parent_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    mlflow_closed: Mapped[bool] = mapped_column(Boolean, default=False)
    """Whether the sweep's MLflow runs were ended to match its end. A sweep the queue gave up on with no
    worker alive ends with its runs open; the next worker that polls the queue closes them."""
    model_name: Mapped[str | None] = mapped_column(String(100), nullable=True)
    model_version: Mapped[str | None] = mapped_column(String(32), nullable=True)
    model_alias: Mapped[str | None] = mapped_column(String(64), nullable=True)
    owner: Mapped[str | None] = mapped_column(String(100), nullable=True, index=True)
    """The user whose API token submitted the sweep; only they (or an admin) may cancel it."""
    need_cpus: Mapped[float] = mapped_column(Float, default=1.0)
    """What one trial asks of a Ray cluster (service.routing.Need): `need_workers` bundles of `need_cpus`
    CPUs and `need_gpus` GPUs. A worker claims the sweep only if its cluster's nodes can hold them."""
    need_gpus: Mapped[float] = mapped_column(Float, default=0.0)
    need_workers: Mapped[int] = mapped_column(Integer, default=1)
    code: Mapped[dict[str, str] | None] = mapped_column(JSON, nullable=True)
    """The code the sweep's latest attempt ran (service.provenance.code_tags: layerlab version, git commit and
    whether it was modified), written by its worker at the start of each attempt."""
    rerun_of: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """The sweep this one repeats (`layerlab rerun`): same spec, a new owner and attempts."""
    code_sha256: Mapped[str | None] = mapped_column(ForeignKey("code_archives.sha256"), nullable=True)
    """The researcher's code the sweep brings (spec `code`): a row of code_archives, None for built-in tasks."""
    importances: Mapped[dict[str, float] | None] = mapped_column(JSON, nullable=True)
    extensions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """How many times `extend` added trials; the latest extension's trials run as the Tune experiment
    `sweep-<id>-x<extensions>` (workers.sweep.experiment_name), each earlier one's results read with it."""
    extension_samples: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """Trials the latest extension adds (its Tune experiment's num_samples)."""
    task_name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    """A sweep that brings code: its Task's own name (`mine.lowrank`), written by the worker once it imported the
    code (the API never imports it; `task` holds the module:attribute). None for a built-in task."""
    """Searched parameter -> its share of the final metric's variance over the finished trials, largest first
    (service.importance), written by the worker with the sweep's summary; None until then, or with too few."""


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("sweep_id", "trial_id", name="uq_trials_sweep_trial"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    trial_id: Mapped[str] = mapped_column(String(100))
    state: Mapped[str] = mapped_column(String(16), default=TrialState.pending.value)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    iteration: Mapped[int] = mapped_column(Integer, default=0)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    starts: Mapped[int] = mapped_column(Integer, default=0)
    logged_iteration: Mapped[int] = mapped_column(Integer, default=0)
    """The highest step of the trial in the metric outbox: its checkpoints up to this iteration are usable."""
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    mlflow_status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    """The status the shipper last gave the child run (None: not set since the trial last started)."""
    node_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """The Ray node that ran the trial's latest start (operators: where to look for its logs)."""
    checkpoint_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    """The trial's latest checkpoint at the storage path: a restarted trial resumes from it."""
    checkpoint_iteration: Mapped[int] = mapped_column(Integer, default=0)
    """The iteration that checkpoint was reported with."""
    final_result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """A finished trial's last result (the task's own keys): a restore reports it instead of training again."""
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    """Why the trial ended other than by finishing (error, cancel, lost), in one line."""
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class CodeArchive(Base):
    """A researcher's code as a sweep brought it (service.code_archive): a gzipped tar, stored once per content."""

    __tablename__ = "code_archives"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    files: Mapped[int] = mapped_column(Integer)
    uploaded_by: Mapped[str | None] = mapped_column(String(100), nullable=True)
    uploaded_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class OutboxRow(Base):
    """One reported step of a trial: written in the transaction that records the trial's progress (the first
    value of a step wins), sent to MLflow by the sweep's shipper (workers.shipper), then marked shipped."""

    __tablename__ = "metric_outbox"
    __table_args__ = (
        UniqueConstraint("sweep_id", "trial_id", "step", name="uq_outbox_sweep_trial_step"),
        Index("ix_outbox_unshipped", "sweep_id", "shipped", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    trial_id: Mapped[str] = mapped_column(String(100))
    step: Mapped[int] = mapped_column(Integer)
    timestamp_ms: Mapped[int] = mapped_column(BigInteger)
    """The time the step carries in MLflow, fixed here: a resend is then the identical metric."""
    metrics: Mapped[dict[str, float]] = mapped_column(JSON)
    files: Mapped[dict[str, str] | None] = mapped_column(JSON, nullable=True)
    """Files the task logged with this step: name -> base64."""
    tags: Mapped[dict[str, str] | None] = mapped_column(JSON, nullable=True)
    """Tags the step sets on the trial's run (a PBT exploit: workers.pbt)."""
    shipped: Mapped[bool] = mapped_column(Boolean, default=False)


class QueueWorker(Base):
    """A worker as it last told the queue: what its Ray cluster offers (service.routing) and when it was
    last heard from (every claim poll, every lease heartbeat). Rows of workers gone a day are pruned."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    nodes: Mapped[list[dict[str, float]]] = mapped_column(JSON)
    """Each alive node of its Ray cluster: {"cpus": total CPUs, "gpus": total GPUs}."""
    seen_at: Mapped[datetime] = mapped_column(DateTime, index=True)
    sweep_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """The sweep it runs now (None while it polls)."""


class Event(Base):
    """One row per state transition: the sweep's history, for operators."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    action: Mapped[str] = mapped_column(String(32))
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)


class ApiToken(Base):
    """An API token. Only its SHA-256 is stored: a leaked database does not leak working tokens."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user: Mapped[str] = mapped_column(String(100), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    """The token's first characters, to tell tokens apart in `layerlab token list`."""
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class Webhook(Base):
    """A URL a user registered to hear of their sweeps' ends (service.webhooks). The secret signs each event
    (HMAC-SHA256); it is shown once, at registration, and never logged."""

    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(100), index=True)
    url: Mapped[str] = mapped_column(String(2000))
    secret: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    removed_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class WebhookDelivery(Base):
    """One event for one webhook: a sweep of its owner ended (at `ended_at`: a resumed sweep that ends again is
    a new event). The payload is fixed when the row is made, so every attempt sends the same bytes."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("webhook_id", "sweep_id", "ended_at", name="uq_delivery_webhook_sweep_end"),
        Index("ix_deliveries_due", "state", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"), index=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    ended_at: Mapped[datetime] = mapped_column(DateTime)
    event_id: Mapped[str] = mapped_column(String(36), unique=True)
    """Sent as X-Layerlab-Delivery: the same on every attempt, for receivers to drop a repeat."""
    payload: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    """pending (due at next_attempt_at), delivered, or failed (its attempts used up)."""
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    claimed_until: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    """A deliverer sending it now holds it until then (an API process that died mid-send frees it by time)."""
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class WebhookAttempt(Base):
    """One try at sending a delivery: the receiver's HTTP status, or why no answer came."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    seconds: Mapped[float] = mapped_column(Float, default=0.0)


def owner_running(sweep: Any) -> Any:
    """SQL: how many sweeps of `sweep`'s owner (a Sweep entity or alias) are running; sweeps without an owner
    count as one owner. The claim order's fair share (service/queue.py QueueStore.claim)."""
    other = aliased(Sweep)
    return (
        select(func.count())
        .select_from(other)
        .where(other.state == SweepState.running, other.owner.is_not_distinct_from(sweep.owner))
        .scalar_subquery()
    )
