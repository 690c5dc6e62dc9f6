"""The queue store: every SQL statement that moves a sweep between states lives here.

States: queued -> running -> succeeded | failed | cancelled. A claim is a lease (worker id, attempt,
expiry) that the worker renews by heartbeat. Every write a worker makes about its sweep is fenced
on (worker id, attempt): a worker presumed dead that wakes up cannot finish a sweep that was since
given to another worker. Expired leases are reclaimed at every claim.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, cast

from sqlalchemy import (
    Connection,
    Engine,
    Integer,
    Table,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

from service.db import get_engine, migrate, session_factory
from service.errors import InvalidTransition, LeaseLost, SweepNotFound
from service.models import (
    TERMINAL,
    TRIAL_ENDED,
    Event,
    QueueWorker,
    Sweep,
    SweepState,
    Trial,
    TrialState,
    utcnow,
)
from service.routing import LIVE_SECONDS, Need, Node, SeenWorker, Waiting, fits_sql, waiting
from service.spec import SweepSpec, spec_to_yaml

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])
TRIALS = cast(Table, Trial.__table__)
NEW_TRIAL = {
    "state": TrialState.pending.value,
    "config": {},
    "iteration": 0,
    "starts": 0,
    "logged_iteration": 0,
    "checkpoint_iteration": 0,
}
DEFAULT_MAX_ATTEMPTS = 5


def _trial_key(sweep_id: int, trial_id: str) -> tuple[Any, Any]:
    return TRIALS.c.sweep_id == sweep_id, TRIALS.c.trial_id == trial_id


@dataclass(frozen=True)
class Claim:
    """What a worker holds while it runs a sweep."""

    sweep_id: int
    worker_id: str
    attempt: int
    spec: dict[str, Any]
    spec_yaml: str
    mlflow_experiment_id: str | None
    mlflow_parent_run_id: str | None


def waits_out_outages(method: F) -> F:
    """A worker's call waits out a database it cannot reach (up to the store's `outage_seconds`), then
    carries on, reconnecting through the pool's pre-ping. Each call is one transaction, so a failed
    attempt left nothing behind and runs again whole. (Unless the server died between committing and
    answering: a retried `trial_started` then counts one start twice, a retried `finish` finds the sweep
    ended and raises LeaseLost.)"""

    @functools.wraps(method)
    def wrapper(store: QueueStore, *args: Any, **kwargs: Any) -> Any:
        started, attempts = time.monotonic(), 0
        while True:
            try:
                result = method(store, *args, **kwargs)
            except DBAPIError as exc:
                waited = time.monotonic() - started
                unreachable = isinstance(exc, OperationalError) or exc.connection_invalidated
                if not unreachable or waited >= store.outage_seconds:
                    raise
                if attempts % 30 == 0:  # once, then about every 30 s
                    log.warning("queue database unreachable (%s); %s waits (%.0fs)", exc.orig, method.__name__, waited)
                attempts += 1
                time.sleep(1.0)
                continue
            if attempts:
                log.info("queue database back after %.0fs; %s done", time.monotonic() - started, method.__name__)
            return result

    return cast(F, wrapper)


class QueueStore:
    def __init__(self, url: str, *, run_migrations: bool = True, outage_seconds: float = 0.0) -> None:
        """`outage_seconds`: how long worker-side calls wait out an unreachable database (the API's
        store keeps 0: it answers 503 at once and lets the client retry)."""
        self.outage_seconds = outage_seconds
        self.engine: Engine = get_engine(url)
        if run_migrations:
            migrate(self.engine)
        self._sessions = session_factory(self.engine)
        self.is_postgres = self.engine.dialect.name == "postgresql"
        self._pruned_for: set[str] = set()

    def session(self) -> Session:
        return self._sessions()

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    # --- submit / read / cancel (API side) ---------------------------------------------------

    def submit(
        self, spec: SweepSpec, spec_yaml: str | None = None, max_attempts: int | None = None, owner: str | None = None
    ) -> Sweep:
        """`max_attempts`: the service's default, used when the spec names none."""
        assert spec.metric.mode is not None, "parse_spec fills the metric mode"
        max_attempts = spec.max_attempts or max_attempts or DEFAULT_MAX_ATTEMPTS
        with self.session() as s, s.begin():
            sweep = Sweep(
                name=spec.name,
                task=spec.task,
                spec=spec.model_dump(mode="json"),
                spec_yaml=spec_yaml or spec_to_yaml(spec),
                priority=spec.priority,
                state=SweepState.queued.value,
                max_attempts=max_attempts,
                trials_total=spec.trials_total,
                metric_name=spec.metric.name,
                metric_mode=spec.metric.mode,
                submitted_at=utcnow(),
                owner=owner,
                **Need.of(spec).columns,
            )
            s.add(sweep)
            s.flush()
            s.add(Event(sweep_id=sweep.id, action="submit", detail=f"priority {spec.priority}"))
        log.info("submit sweep %s (%s)", sweep.id, spec.name, extra={"action": "submit", "job_id": sweep.id})
        return sweep

    @waits_out_outages
    def get(self, sweep_id: int) -> Sweep:
        with self.session() as s:
            sweep = s.get(Sweep, sweep_id)
            if sweep is None:
                raise SweepNotFound(sweep_id)
            return sweep

    def list_sweeps(self, state: str | None = None, limit: int = 100, offset: int = 0) -> list[Sweep]:
        q = select(Sweep).order_by(Sweep.id.desc()).limit(limit).offset(offset)
        if state:
            q = q.where(Sweep.state == state)
        with self.session() as s:
            return list(s.scalars(q))

    @waits_out_outages
    def trials(self, sweep_id: int) -> list[Trial]:
        with self.session() as s:
            return list(s.scalars(select(Trial).where(Trial.sweep_id == sweep_id).order_by(Trial.id)))

    def trial_counts(self, sweep_id: int) -> dict[str, int]:
        q = select(Trial.state, func.count()).where(Trial.sweep_id == sweep_id).group_by(Trial.state)
        with self.session() as s:
            return {state: n for state, n in s.execute(q)}

    def events(self, sweep_id: int) -> list[Event]:
        with self.session() as s:
            return list(s.scalars(select(Event).where(Event.sweep_id == sweep_id).order_by(Event.id)))

    def cancel(self, sweep_id: int) -> Sweep:
        """A queued sweep is cancelled at once; a running one is flagged and its worker stops it."""
        with self.session() as s, s.begin():
            sweep = self._locked(s, sweep_id)
            if sweep.state in TERMINAL:
                raise InvalidTransition(sweep_id, sweep.state, "cancel")
            if sweep.state == SweepState.queued:
                sweep.state, sweep.finished_at = SweepState.cancelled.value, utcnow()
                sweep.reason = "cancelled before it started"
                s.add(Event(sweep_id=sweep_id, action="cancel", detail="while queued"))
            else:
                sweep.cancel_requested = True
                s.add(Event(sweep_id=sweep_id, action="cancel_request", detail=f"worker {sweep.worker_id}"))
        log.info("cancel sweep %s", sweep_id, extra={"action": "cancel", "job_id": sweep_id})
        return sweep

    def resume(self, sweep_id: int, attempts: int | None = None) -> Sweep:
        """Put a failed or cancelled sweep back in the queue with `attempts` fresh claims (the spec's
        max_attempts, else the default). It keeps its Tune state, trial rows and MLflow runs: the next
        worker restores the experiment and runs what is unfinished. The attempt counter keeps counting
        (max_attempts grows instead): a worker of an earlier attempt stays fenced out."""
        with self.session() as s, s.begin():
            sweep = self._locked(s, sweep_id)
            if sweep.state not in (SweepState.failed, SweepState.cancelled):
                raise InvalidTransition(sweep_id, sweep.state, "resume", "only a failed or cancelled sweep resumes")
            fresh = attempts or SweepSpec.model_validate(sweep.spec).max_attempts or DEFAULT_MAX_ATTEMPTS
            was = sweep.state
            sweep.state, sweep.reason, sweep.finished_at = SweepState.queued.value, None, None
            sweep.cancel_requested, sweep.mlflow_closed = False, False
            sweep.max_attempts = sweep.attempts + fresh
            s.add(Event(sweep_id=sweep_id, action="resume", detail=f"was {was}; {fresh} more attempts"))
        log.info("resume sweep %s", sweep_id, extra={"action": "resume", "job_id": sweep_id})
        return sweep

    def unclosed(self) -> list[Sweep]:
        """Ended sweeps whose MLflow runs are still open: the queue gave up on them with no worker alive."""
        q = select(Sweep).where(
            Sweep.state.in_([st.value for st in TERMINAL]),
            Sweep.mlflow_closed.is_(False),
            Sweep.mlflow_parent_run_id.is_not(None),
        )
        with self.session() as s:
            return list(s.scalars(q.order_by(Sweep.id).limit(20)))

    @waits_out_outages
    def mark_closed(self, sweep_id: int, trial_state: TrialState, reason: str) -> bool:
        """After its runs were ended: every unfinished trial row to `trial_state`, the sweep marked closed.
        False if the sweep is no longer an ended, unclosed sweep (resumed meanwhile, or closed by another)."""
        with self.engine.begin() as conn:
            sweeps = cast(Table, Sweep.__table__)
            done = conn.execute(
                update(sweeps)
                .where(
                    sweeps.c.id == sweep_id,
                    sweeps.c.state.in_([st.value for st in TERMINAL]),
                    sweeps.c.mlflow_closed.is_(False),
                )
                .values(mlflow_closed=True)
            )
            if done.rowcount != 1:
                return False
            self._close_trials(conn, sweep_id, trial_state, reason)
            return True

    def _close_trials(self, conn: Connection, sweep_id: int, state: TrialState, reason: str) -> None:
        unfinished = TRIALS.c.state.not_in([st.value for st in TRIAL_ENDED])
        conn.execute(
            update(TRIALS)
            .where(TRIALS.c.sweep_id == sweep_id, unfinished)
            .values(state=state.value, reason=reason, updated_at=utcnow())
        )

    def _locked(self, s: Session, sweep_id: int) -> Sweep:
        q = select(Sweep).where(Sweep.id == sweep_id)
        if self.is_postgres:
            q = q.with_for_update()
        sweep = s.scalars(q).first()
        if sweep is None:
            raise SweepNotFound(sweep_id)
        return sweep

    # --- claim / heartbeat / finish (worker side) -------------------------------------------

    def reclaim_expired(self, s: Session, lease_seconds: float = 0.0) -> int:
        """Return sweeps whose worker stopped heartbeating to the queue (or end them). Caller commits.

        A lease measures a worker's silence, but while the database itself is down no worker can
        renew: after PostgreSQL restarts, every lease gets `lease_seconds` to be renewed before it
        counts as expired. Otherwise the first claim after a long outage would requeue every running
        sweep and a second worker would run each one beside its first. (Workers cut off from a
        database that stays up lose their leases as usual: the others cannot tell them from dead ones.)
        """
        now = utcnow()
        if self.is_postgres and lease_seconds > 0:
            up_for = s.scalar(select(func.now() - func.pg_postmaster_start_time()))
            if up_for is not None and up_for < timedelta(seconds=lease_seconds):
                return 0
        q = select(Sweep).where(Sweep.state == SweepState.running, Sweep.lease_expires_at < now)
        if self.is_postgres:
            q = q.with_for_update(skip_locked=True)
        n = 0
        for sweep in s.scalars(q):
            n += 1
            lost = f"worker {sweep.worker_id} stopped renewing its lease (attempt {sweep.attempts})"
            if sweep.cancel_requested:
                sweep.state, sweep.reason = SweepState.cancelled.value, f"cancelled; {lost}"
                sweep.finished_at = now
                action = "cancel"
            elif sweep.attempts >= sweep.max_attempts:
                sweep.state = SweepState.failed.value
                sweep.reason = f"{lost}; gave up after {sweep.attempts} of max_attempts={sweep.max_attempts}"
                sweep.finished_at = now
                action = "fail"
            else:
                sweep.state, action = SweepState.queued.value, "requeue"
            sweep.worker_id, sweep.lease_expires_at = None, None
            s.add(Event(sweep_id=sweep.id, action=action, detail=lost))
            log.warning("%s sweep %s: %s", action, sweep.id, lost, extra={"action": action, "job_id": sweep.id})
        return n

    def claim(self, worker_id: str, lease_seconds: float, offer: Sequence[Node] | None = None) -> Claim | None:
        """Take the queued sweep with the highest priority, oldest first; None if there is none.

        `offer`: the nodes of the worker's Ray cluster (service.routing). Given, only a sweep whose trials
        they can hold is taken, and the worker's heartbeat row records them; None takes any sweep."""
        with self.session() as s, s.begin():
            self.reclaim_expired(s, lease_seconds)
            s.flush()
            q = (
                select(Sweep)
                .where(Sweep.state == SweepState.queued)
                .order_by(Sweep.priority.desc(), Sweep.submitted_at, Sweep.id)
                .limit(1)
            )
            if offer is not None:
                q = q.where(fits_sql(offer, Sweep.need_cpus, Sweep.need_gpus, Sweep.need_workers, self._floor))
            if self.is_postgres:
                q = q.with_for_update(skip_locked=True)
            sweep = s.scalars(q).first()
            if offer is not None:
                self._seen(s, worker_id, offer, sweep.id if sweep is not None else None)
            if sweep is None:
                return None
            now = utcnow()
            sweep.state, sweep.worker_id = SweepState.running.value, worker_id
            sweep.attempts += 1
            sweep.lease_expires_at = now + timedelta(seconds=lease_seconds)
            sweep.started_at = sweep.started_at or now
            s.add(Event(sweep_id=sweep.id, action="claim", detail=f"worker {worker_id}, attempt {sweep.attempts}"))
            claim = Claim(
                sweep.id,
                worker_id,
                sweep.attempts,
                sweep.spec,
                sweep.spec_yaml,
                sweep.mlflow_experiment_id,
                sweep.mlflow_parent_run_id,
            )
        log.info("claim sweep %s", claim.sweep_id, extra={"action": "claim", "job_id": claim.sweep_id})
        return claim

    # --- workers' heartbeat rows and routing (service.routing) --------------------------------

    def _floor(self, x: Any) -> Any:
        """floor() of a non-negative float in SQL: SQLite has no floor() without its math extension."""
        return func.floor(x) if self.is_postgres else sql_cast(x, Integer)

    def _seen(self, s: Session, worker_id: str, offer: Sequence[Node], sweep_id: int | None) -> None:
        """Upsert the worker's row; at a worker's first poll, prune rows of workers gone a day."""
        values = {"nodes": [dict(n) for n in offer], "seen_at": utcnow(), "sweep_id": sweep_id}
        dialect = postgresql if self.is_postgres else sqlite
        stmt = dialect.insert(QueueWorker).values(id=worker_id, **values)
        s.execute(stmt.on_conflict_do_update(index_elements=[QueueWorker.id], set_=values))
        if worker_id not in self._pruned_for:
            self._pruned_for.add(worker_id)
            s.execute(delete(QueueWorker).where(QueueWorker.seen_at < utcnow() - timedelta(days=1)))

    def forget_worker(self, worker_id: str) -> None:
        """A worker that stops (not one that dies) leaves the live count at once."""
        with self.session() as s, s.begin():
            s.execute(delete(QueueWorker).where(QueueWorker.id == worker_id))

    def live_workers(self, within: float = LIVE_SECONDS) -> list[SeenWorker]:
        q = select(QueueWorker).where(QueueWorker.seen_at >= utcnow() - timedelta(seconds=within))
        with self.session() as s:
            return [SeenWorker(w.id, list(w.nodes or []), w.sweep_id) for w in s.scalars(q.order_by(QueueWorker.id))]

    def waiting(self, sweep: Any, seen: list[SeenWorker] | None = None) -> Waiting:
        """What a queued sweep (the ORM row or service.reads' row) waits for; `seen`: live_workers(), when
        the caller asks for several sweeps."""
        ahead = select(func.count()).where(
            Sweep.state == SweepState.queued,
            or_(
                Sweep.priority > sweep.priority,
                and_(Sweep.priority == sweep.priority, Sweep.submitted_at < sweep.submitted_at),
                and_(Sweep.priority == sweep.priority, Sweep.submitted_at == sweep.submitted_at, Sweep.id < sweep.id),
            ),
        )
        with self.session() as s:
            n_ahead = int(s.scalar(ahead) or 0)
        need = Need(cpus=sweep.need_cpus, gpus=sweep.need_gpus, workers=sweep.need_workers)
        return waiting(need, self.live_workers() if seen is None else seen, n_ahead)

    def running_leases(self) -> list[tuple[int, str | None]]:
        """(sweep id, lease holder) of every running sweep."""
        q = select(Sweep.id, Sweep.worker_id).where(Sweep.state == SweepState.running)
        with self.session() as s:
            return [(sweep_id, worker_id) for sweep_id, worker_id in s.execute(q)]

    def expire_lease(self, sweep_id: int, worker_id: str, why: str) -> bool:
        """End a lease now (its holder is known to be dead): the next claim reclaims the sweep."""
        with self.session() as s, s.begin():
            stmt = (
                update(Sweep)
                .where(Sweep.id == sweep_id, Sweep.worker_id == worker_id, Sweep.state == SweepState.running)
                .values(lease_expires_at=utcnow() - timedelta(seconds=1))
            )
            if s.execute(stmt).rowcount != 1:  # type: ignore[attr-defined]
                return False
            s.add(Event(sweep_id=sweep_id, action="lease_expired", detail=why))
        log.warning("sweep %s: %s", sweep_id, why, extra={"action": "lease_expired", "job_id": sweep_id})
        return True

    def _fenced(self, claim: Claim) -> Any:
        return update(Sweep).where(
            Sweep.id == claim.sweep_id,
            Sweep.worker_id == claim.worker_id,
            Sweep.attempts == claim.attempt,
            Sweep.state == SweepState.running,
        )

    @waits_out_outages
    def heartbeat(self, claim: Claim, lease_seconds: float) -> bool:
        """Renew the lease. Returns whether a cancel was requested; raises LeaseLost if not ours."""
        with self.session() as s, s.begin():
            res = s.execute(self._fenced(claim).values(lease_expires_at=utcnow() + timedelta(seconds=lease_seconds)))
            if res.rowcount != 1:  # type: ignore[attr-defined]
                raise LeaseLost(claim.sweep_id, claim.worker_id, claim.attempt)
            workers = update(QueueWorker).where(QueueWorker.id == claim.worker_id)
            s.execute(workers.values(seen_at=utcnow(), sweep_id=claim.sweep_id))
            return bool(s.scalar(select(Sweep.cancel_requested).where(Sweep.id == claim.sweep_id)))

    @waits_out_outages
    def _end(self, claim: Claim, state: SweepState, reason: str | None, trials: TrialState, closed: bool) -> None:
        """End the sweep; unfinished trial rows become `trials`. `closed`: the caller ended its MLflow runs
        (else the closer of abandoned sweeps does, workers.durability.close_abandoned)."""
        with self.session() as s, s.begin():
            stmt = self._fenced(claim).values(
                state=state.value, reason=reason, finished_at=utcnow(), lease_expires_at=None, mlflow_closed=closed
            )
            if s.execute(stmt).rowcount != 1:  # type: ignore[attr-defined]
                raise LeaseLost(claim.sweep_id, claim.worker_id, claim.attempt)
            self._close_trials(s.connection(), claim.sweep_id, trials, reason or state.value)
            s.add(Event(sweep_id=claim.sweep_id, action=state.value, detail=reason))
        log.info("%s sweep %s", state.value, claim.sweep_id, extra={"action": state.value, "job_id": claim.sweep_id})

    def finish(self, claim: Claim) -> None:
        self._end(claim, SweepState.succeeded, None, TrialState.lost, closed=True)

    def fail(self, claim: Claim, reason: str, closed: bool = True) -> None:
        self._end(claim, SweepState.failed, reason, TrialState.error, closed)

    def cancelled(self, claim: Claim, reason: str = "cancelled by request", closed: bool = True) -> None:
        self._end(claim, SweepState.cancelled, reason, TrialState.cancelled, closed)

    @waits_out_outages
    def requeue(self, claim: Claim, reason: str) -> None:
        """Give the sweep back (worker shutting down): it keeps its place in the queue."""
        with self.session() as s, s.begin():
            stmt = self._fenced(claim).values(state=SweepState.queued.value, worker_id=None, lease_expires_at=None)
            if s.execute(stmt).rowcount != 1:  # type: ignore[attr-defined]
                raise LeaseLost(claim.sweep_id, claim.worker_id, claim.attempt)
            s.add(Event(sweep_id=claim.sweep_id, action="requeue", detail=reason))

    @waits_out_outages
    def set_fields(self, claim: Claim, **values: Any) -> None:
        """Record worker-owned facts (MLflow ids, best trial, model version), fenced like the rest."""
        with self.session() as s, s.begin():
            if s.execute(self._fenced(claim).values(**values)).rowcount != 1:  # type: ignore[attr-defined]
                raise LeaseLost(claim.sweep_id, claim.worker_id, claim.attempt)

    # --- trials ------------------------------------------------------------------------------

    # A trial's writes are single Core UPDATEs (one statement, no ORM load and flush): the worker makes
    # four per trial inside Tune's loop, 6.2 ms of CPU per trial as ORM read-modify-writes on SQLite.
    # Only one worker drives a sweep's trials, so the insert of a missing row has no rival.

    def _update_trial(self, conn: Connection, sweep_id: int, trial_id: str, **values: Any) -> None:
        """UPDATE the trial's row, first creating it if the sweep has none by that id yet."""
        stmt = update(TRIALS).where(*_trial_key(sweep_id, trial_id)).values(**values)
        if conn.execute(stmt).rowcount == 0:
            conn.execute(insert(TRIALS).values(sweep_id=sweep_id, trial_id=trial_id, **NEW_TRIAL, updated_at=utcnow()))
            conn.execute(stmt)

    @waits_out_outages
    def trial_started(self, sweep_id: int, trial_id: str, config: dict[str, Any], node_id: str | None = None) -> None:
        node = {"node_id": node_id} if node_id else {}
        with self.engine.begin() as conn:
            self._update_trial(
                conn, sweep_id, trial_id, state=TrialState.running.value, config=config, starts=TRIALS.c.starts + 1,
                reason=None, updated_at=utcnow(), **node,
            )  # fmt: skip

    @waits_out_outages
    def trial_result(
        self,
        sweep_id: int,
        trial_id: str,
        iteration: int,
        metrics: dict[str, Any],
        node_id: str | None = None,
        *,
        to_log: bool = False,
    ) -> bool:
        """Record a result (the trial's latest unless an older iteration comes late). With `to_log`, also
        move the logged high-water mark forward in the same transaction and return False if `iteration`
        was logged already."""
        newer = bindparam("iteration", iteration, type_=Integer) >= TRIALS.c.iteration  # SET sees the old row
        new_metrics = bindparam("metrics", metrics, type_=TRIALS.c.metrics.type)
        node = {"node_id": node_id} if node_id else {}
        with self.engine.begin() as conn:
            self._update_trial(
                conn, sweep_id, trial_id,
                iteration=case((newer, iteration), else_=TRIALS.c.iteration),
                metrics=case((newer, new_metrics), else_=TRIALS.c.metrics),
                updated_at=utcnow(), **node,
            )  # fmt: skip
            if not to_log:
                return False
            # The row is locked by the UPDATE above (and SQLite's BEGIN IMMEDIATE): no race.
            unlogged = update(TRIALS).where(*_trial_key(sweep_id, trial_id), TRIALS.c.logged_iteration < iteration)
            moved = conn.execute(unlogged.values(logged_iteration=iteration))
            return bool(moved.rowcount == 1)

    @waits_out_outages
    def trial_ended(
        self,
        sweep_id: int,
        trial_id: str,
        state: TrialState,
        final_result: dict[str, Any] | None = None,
        reason: str | None = None,
    ) -> None:
        with self.engine.begin() as conn:
            self._update_trial(
                conn, sweep_id, trial_id, state=state.value, final_result=final_result, reason=reason,
                updated_at=utcnow(),
            )  # fmt: skip

    @waits_out_outages
    def trial_checkpoint(self, sweep_id: int, trial_id: str, path: str, iteration: int) -> None:
        """The trial's newest checkpoint (kept if an older iteration's comes late)."""
        newer = bindparam("it", iteration, type_=Integer) >= TRIALS.c.checkpoint_iteration
        with self.engine.begin() as conn:
            self._update_trial(
                conn, sweep_id, trial_id,
                checkpoint_path=case((newer, path), else_=TRIALS.c.checkpoint_path),
                checkpoint_iteration=case((newer, iteration), else_=TRIALS.c.checkpoint_iteration),
            )  # fmt: skip

    @waits_out_outages
    def set_trial_run(self, sweep_id: int, trial_id: str, run_id: str) -> str:
        """Store the trial's MLflow run id once; returns the id that won (an earlier one if stored)."""
        with self.engine.begin() as conn:
            self._update_trial(conn, sweep_id, trial_id, mlflow_run_id=func.coalesce(TRIALS.c.mlflow_run_id, run_id))
            return str(conn.scalar(select(TRIALS.c.mlflow_run_id).where(*_trial_key(sweep_id, trial_id))))
