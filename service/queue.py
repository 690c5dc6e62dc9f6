"""The queue store: every SQL statement that moves a sweep between states lives here.

States: queued -> running -> succeeded | failed | cancelled. A claim is a lease (worker id, attempt,
expiry) that the worker renews by heartbeat. Every write a worker makes about its sweep is fenced
on (worker id, attempt): a worker presumed dead that wakes up cannot finish a sweep that was since
given to another worker. Expired leases are reclaimed at every claim.

`QueueStore` is the one object callers use. It holds the sweep rows and their leases here, and takes
the trial rows from service.trial_ledger.TrialLedger and the workers' rows and routing view from
service.worker_rows.WorkerRows (engine, sessions and the outage wait: service.store_base).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from sqlalchemy import Table, func, select, update
from sqlalchemy.orm import Session

from service.code_store import CodeArchives
from service.errors import InvalidTransition, LeaseLost, SweepNotFound
from service.models import (
    TERMINAL,
    Event,
    Sweep,
    SweepEvent,
    SweepState,
    TrialState,
    next_state,
    owner_running,
    utcnow,
)
from service.routing import Need, Node, fits_sql
from service.spec import SweepSpec, spec_to_yaml
from service.store_base import waits_out_outages
from service.trial_ledger import TrialLedger
from service.webhook_store import WebhookRows
from service.worker_rows import WorkerRows

__all__ = ["DEFAULT_MAX_ATTEMPTS", "Claim", "QueueStore", "waits_out_outages"]

log = logging.getLogger(__name__)
DEFAULT_MAX_ATTEMPTS = 5


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
    code_sha256: str | None = None
    """The archive of the researcher's code the sweep brings (service.code_store), if any."""
    extensions: int = 0
    """How many times `extend` added trials (0: the sweep as submitted); see Sweep.extensions."""
    extension_samples: int | None = None


def _reopen(sweep: Sweep, event: SweepEvent, attempts: int | None) -> tuple[str, int]:
    """Queue an ended sweep again by `event` (resume, extend) with `attempts` fresh claims (the spec's
    max_attempts, else the default): its end, cancel request and closed runs cleared. The attempt counter
    keeps counting (max_attempts grows instead), so a worker of an earlier attempt stays fenced out. Returns
    the state it left and the attempts it was given."""
    was = sweep.state
    sweep.state = next_state(sweep.id, was, event).value
    fresh = attempts or SweepSpec.model_validate(sweep.spec).max_attempts or DEFAULT_MAX_ATTEMPTS
    sweep.reason, sweep.finished_at = None, None
    sweep.cancel_requested, sweep.mlflow_closed = False, False
    sweep.max_attempts = sweep.attempts + fresh
    return was, fresh


class QueueStore(TrialLedger, WorkerRows, CodeArchives, WebhookRows):
    """Sweeps and their leases; trial rows (TrialLedger), worker rows (WorkerRows), brought code
    (CodeArchives) and webhooks (WebhookRows) by inheritance."""

    # --- submit / read / cancel (API side) ---------------------------------------------------

    def submit(
        self,
        spec: SweepSpec,
        spec_yaml: str | None = None,
        max_attempts: int | None = None,
        owner: str | None = None,
        rerun_of: int | None = None,
        code_sha256: str | None = None,
    ) -> Sweep:
        """`max_attempts`: the service's default, used when the spec names none. `code_sha256`: the stored
        archive (put_code) of a spec that brings `code`."""
        assert (spec.code is None) == (code_sha256 is None), "a spec with code comes with its stored archive"
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
                rerun_of=rerun_of,
                code_sha256=code_sha256,
                **Need.of(spec).columns,
            )
            s.add(sweep)
            s.flush()
            again = f"; rerun of sweep {rerun_of}" if rerun_of is not None else ""
            s.add(Event(sweep_id=sweep.id, action="submit", detail=f"priority {spec.priority}{again}"))
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

    def events(self, sweep_id: int) -> list[Event]:
        with self.session() as s:
            return list(s.scalars(select(Event).where(Event.sweep_id == sweep_id).order_by(Event.id)))

    def cancel(self, sweep_id: int) -> Sweep:
        """A queued sweep is cancelled at once; a running one is flagged and its worker stops it."""
        with self.session() as s, s.begin():
            sweep = self._locked(s, sweep_id)
            if sweep.state == SweepState.running:  # a request: its worker makes the move (SweepEvent.stop)
                sweep.cancel_requested = True
                s.add(Event(sweep_id=sweep_id, action="cancel_request", detail=f"worker {sweep.worker_id}"))
            else:
                sweep.state = next_state(sweep_id, sweep.state, SweepEvent.cancel).value
                sweep.finished_at, sweep.reason = utcnow(), "cancelled before it started"
                s.add(Event(sweep_id=sweep_id, action="cancel", detail="while queued"))
        log.info("cancel sweep %s", sweep_id, extra={"action": "cancel", "job_id": sweep_id})
        return sweep

    def resume(self, sweep_id: int, attempts: int | None = None) -> Sweep:
        """Put a failed or cancelled sweep back in the queue with `attempts` fresh claims (the spec's
        max_attempts, else the default). It keeps its Tune state, trial rows and MLflow runs: the next
        worker restores the experiment and runs what is unfinished. The attempt counter keeps counting
        (max_attempts grows instead): a worker of an earlier attempt stays fenced out."""
        with self.session() as s, s.begin():
            sweep = self._locked(s, sweep_id)
            was, fresh = _reopen(sweep, SweepEvent.resume, attempts)
            s.add(Event(sweep_id=sweep_id, action="resume", detail=f"was {was}; {fresh} more attempts"))
        log.info("resume sweep %s", sweep_id, extra={"action": "resume", "job_id": sweep_id})
        return sweep

    def extend(self, sweep_id: int, samples: int, attempts: int | None = None) -> Sweep:
        """Queue `samples` more trials of a succeeded or failed sweep of random or optuna search, with fresh
        attempts. Its trials, runs and summary stay; the next worker runs the new trials as one more Tune
        experiment under the same parent run (its searcher told every earlier trial's result) and rebuilds the
        summary over all of them. InvalidTransition (409) for a grid sweep or one not ended that way."""
        with self.session() as s, s.begin():
            sweep = self._locked(s, sweep_id)
            spec = SweepSpec.model_validate(sweep.spec)
            if spec.search.algorithm == "grid":
                raise InvalidTransition(
                    sweep_id, sweep.state, "extend",
                    "a grid sweep has nothing new to draw: every grid point ran; `rerun` repeats it, or search "
                    "with random or optuna",
                )  # fmt: skip
            was, _ = _reopen(sweep, SweepEvent.extend, attempts)
            sweep.extensions += 1
            sweep.extension_samples = samples
            sweep.trials_total += samples
            s.add(Event(sweep_id=sweep_id, action="extend", detail=f"was {was}; {samples} more trials"))
        log.info("extend sweep %s by %s trials", sweep_id, samples, extra={"action": "extend", "job_id": sweep_id})
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
                sweep.state = next_state(sweep.id, sweep.state, SweepEvent.stop).value
                sweep.reason, sweep.finished_at = f"cancelled; {lost}", now
                action = "cancel"
            elif sweep.attempts >= sweep.max_attempts:
                sweep.state = next_state(sweep.id, sweep.state, SweepEvent.fail).value
                sweep.reason = f"{lost}; gave up after {sweep.attempts} of max_attempts={sweep.max_attempts}"
                sweep.finished_at = now
                action = "fail"
            else:
                sweep.state, action = next_state(sweep.id, sweep.state, SweepEvent.requeue).value, "requeue"
            sweep.worker_id, sweep.lease_expires_at = None, None
            s.add(Event(sweep_id=sweep.id, action=action, detail=lost))
            log.warning("%s sweep %s: %s", action, sweep.id, lost, extra={"action": action, "job_id": sweep.id})
        return n

    def claim(
        self,
        worker_id: str,
        lease_seconds: float,
        offer: Sequence[Node] | None = None,
        max_running_per_user: int | None = None,
    ) -> Claim | None:
        """Take the next queued sweep, None if there is none. The order (README "Fair share"): the highest
        priority; among equals, the sweep of the owner with the fewest running sweeps; among those, the oldest.

        `offer`: the nodes of the worker's Ray cluster (service.routing). Given, only a sweep whose trials
        they can hold is taken, and the worker's heartbeat row records them; None takes any sweep.
        `max_running_per_user`: an owner with this many running sweeps gets no more until one ends."""
        with self.session() as s, s.begin():
            self.reclaim_expired(s, lease_seconds)
            s.flush()
            running = owner_running(Sweep)
            q = (
                select(Sweep)
                .where(Sweep.state == SweepState.queued)
                .order_by(Sweep.priority.desc(), running, Sweep.submitted_at, Sweep.id)
                .limit(1)
            )
            if max_running_per_user is not None:
                q = q.where(running < max_running_per_user)
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
            sweep.state = next_state(sweep.id, sweep.state, SweepEvent.claim).value
            sweep.worker_id = worker_id
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
                sweep.code_sha256,
                sweep.extensions,
                sweep.extension_samples,
            )
        log.info("claim sweep %s", claim.sweep_id, extra={"action": "claim", "job_id": claim.sweep_id})
        return claim

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
            self._heard(s, claim.worker_id, claim.sweep_id)
            return bool(s.scalar(select(Sweep.cancel_requested).where(Sweep.id == claim.sweep_id)))

    @waits_out_outages
    def _end(self, claim: Claim, event: SweepEvent, reason: str | None, trials: TrialState, closed: bool) -> None:
        """End the sweep by `event` (from running: the fence requires it); unfinished trial rows become
        `trials`. `closed`: the caller ended its MLflow runs (else the closer of abandoned sweeps does,
        workers.durability.close_abandoned)."""
        state = next_state(claim.sweep_id, SweepState.running, event)
        with self.session() as s, s.begin():
            stmt = self._fenced(claim).values(
                state=state.value, reason=reason, finished_at=utcnow(), lease_expires_at=None, mlflow_closed=closed
            )
            if s.execute(stmt).rowcount != 1:  # type: ignore[attr-defined]
                raise LeaseLost(claim.sweep_id, claim.worker_id, claim.attempt)
            self._close_trials(s.connection(), claim.sweep_id, trials, reason or state.value)
            s.add(Event(sweep_id=claim.sweep_id, action=state.value, detail=reason))
        log.info("%s sweep %s", state.value, claim.sweep_id, extra={"action": state.value, "job_id": claim.sweep_id})

    def finish(self, claim: Claim, reason: str | None = None) -> None:
        """The sweep succeeded; `reason` says why it ended before all its trials did (a stop rule)."""
        self._end(claim, SweepEvent.finish, reason, TrialState.lost, closed=True)

    def fail(self, claim: Claim, reason: str, closed: bool = True) -> None:
        self._end(claim, SweepEvent.fail, reason, TrialState.error, closed)

    def cancelled(self, claim: Claim, reason: str = "cancelled by request", closed: bool = True) -> None:
        self._end(claim, SweepEvent.stop, reason, TrialState.cancelled, closed)

    @waits_out_outages
    def requeue(self, claim: Claim, reason: str) -> None:
        """Give the sweep back (worker shutting down): it keeps its place in the queue."""
        with self.session() as s, s.begin():
            to = next_state(claim.sweep_id, SweepState.running, SweepEvent.requeue)  # the fence requires running
            stmt = self._fenced(claim).values(state=to.value, worker_id=None, lease_expires_at=None)
            if s.execute(stmt).rowcount != 1:  # type: ignore[attr-defined]
                raise LeaseLost(claim.sweep_id, claim.worker_id, claim.attempt)
            s.add(Event(sweep_id=claim.sweep_id, action="requeue", detail=reason))

    @waits_out_outages
    def set_fields(self, claim: Claim, **values: Any) -> None:
        """Record worker-owned facts (MLflow ids, best trial, model version), fenced like the rest."""
        with self.session() as s, s.begin():
            if s.execute(self._fenced(claim).values(**values)).rowcount != 1:  # type: ignore[attr-defined]
                raise LeaseLost(claim.sweep_id, claim.worker_id, claim.attempt)
