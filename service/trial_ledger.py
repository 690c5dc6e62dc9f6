"""The trial ledger: one row per Tune trial of a sweep (state, config, latest result, newest
checkpoint, MLflow run id and status, its highest step), and the metric outbox: one row per reported step.

The rows are the sweep's ledger, read after a worker crash: the next attempt learns from them
(workers.durability.read_ledger) which trials finished and with what result, and which checkpoint and
committed iteration each unfinished one resumes from; `set_trial_run` keeps a trial on one MLflow run
across attempts. The outbox rows are what the sweep's shipper (workers.shipper) sends to MLflow.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import Connection, Integer, Table, bindparam, case, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from service.models import TRIAL_ENDED, OutboxRow, Trial, TrialState, utcnow
from service.store_base import StoreBase, waits_out_outages

TRIALS = cast(Table, Trial.__table__)
OUTBOX = cast(Table, OutboxRow.__table__)
NEW_TRIAL = {
    "state": TrialState.pending.value,
    "config": {},
    "iteration": 0,
    "starts": 0,
    "logged_iteration": 0,
    "checkpoint_iteration": 0,
}


def _trial_key(sweep_id: int, trial_id: str) -> tuple[Any, Any]:
    return TRIALS.c.sweep_id == sweep_id, TRIALS.c.trial_id == trial_id


class TrialLedger(StoreBase):
    """The trial rows' reads and writes; part of service.queue.QueueStore."""

    # --- reads -------------------------------------------------------------------------------

    @waits_out_outages
    def trials(self, sweep_id: int) -> list[Trial]:
        with self.session() as s:
            return list(s.scalars(select(Trial).where(Trial.sweep_id == sweep_id).order_by(Trial.id)))

    @waits_out_outages
    def trial(self, sweep_id: int, trial_id: str) -> Trial:
        with self.session() as s:
            return s.scalars(select(Trial).where(*_trial_key(sweep_id, trial_id))).one()

    def trial_counts(self, sweep_id: int) -> dict[str, int]:
        return self.trial_counts_of([sweep_id])[sweep_id]

    def trial_counts_of(self, sweep_ids: Sequence[int]) -> dict[int, dict[str, int]]:
        """Trials by state of each sweep, in one statement (GET /sweeps lists up to 1,000)."""
        counts: dict[int, dict[str, int]] = {sweep_id: {} for sweep_id in sweep_ids}
        q = select(Trial.sweep_id, Trial.state, func.count()).where(Trial.sweep_id.in_(list(counts)))
        with self.session() as s:
            for sweep_id, state, n in s.execute(q.group_by(Trial.sweep_id, Trial.state)):
                counts[sweep_id][state] = n
        return counts

    # --- writes ------------------------------------------------------------------------------

    # A trial's writes are single Core UPDATEs (one statement, no ORM load and flush): the worker makes
    # four per trial inside Tune's loop, 6.2 ms of CPU per trial as ORM read-modify-writes on SQLite.
    # Only one worker drives a sweep's trials, so the insert of a missing row has no rival.

    def _close_trials(self, conn: Connection, sweep_id: int, state: TrialState, reason: str) -> None:
        """Every unfinished trial row of the sweep to `state` (the sweep ended). Caller commits."""
        unfinished = TRIALS.c.state.not_in([st.value for st in TRIAL_ENDED])
        conn.execute(
            update(TRIALS)
            .where(TRIALS.c.sweep_id == sweep_id, unfinished)
            .values(state=state.value, reason=reason, updated_at=utcnow())
        )

    def _update_trial(self, conn: Connection, sweep_id: int, trial_id: str, **values: Any) -> None:
        """UPDATE the trial's row, first creating it if the sweep has none by that id yet."""
        stmt = update(TRIALS).where(*_trial_key(sweep_id, trial_id)).values(**values)
        if conn.execute(stmt).rowcount == 0:
            conn.execute(insert(TRIALS).values(sweep_id=sweep_id, trial_id=trial_id, **NEW_TRIAL, updated_at=utcnow()))
            conn.execute(stmt)

    @waits_out_outages
    def trial_started(
        self, sweep_id: int, trial_id: str, config: dict[str, Any] | None, node_id: str | None = None
    ) -> None:
        """A (re)start of the trial; `config` None keeps the one recorded (a PBT trial's is set by its results)."""
        node = {"node_id": node_id} if node_id else {}
        given = {"config": config} if config is not None else {}
        with self.engine.begin() as conn:
            self._update_trial(
                conn, sweep_id, trial_id, state=TrialState.running.value, starts=TRIALS.c.starts + 1,
                reason=None, mlflow_status=None, updated_at=utcnow(), **given, **node,
            )  # fmt: skip

    @waits_out_outages
    def trial_result(
        self,
        sweep_id: int,
        trial_id: str,
        iteration: int,
        metrics: dict[str, float],
        node_id: str | None = None,
        files: dict[str, str] | None = None,
        tags: dict[str, str] | None = None,
        config: dict[str, Any] | None = None,
    ) -> bool:
        """Record a reported step: the trial's progress (its latest result, unless an older iteration comes late)
        and the step's outbox row (metrics, files as name -> base64, run tags, the timestamp MLflow will show), in one
        transaction. The first value of a step wins: a step reported again (a trial resumed from an older
        checkpoint) adds nothing. `config`: the config the step trained with, kept as the trial's with its latest
        result (PBT changes a trial's config as it goes). Returns whether the row is new."""
        newer = bindparam("iteration", iteration, type_=Integer) >= TRIALS.c.iteration  # SET sees the old row
        new_metrics = bindparam("metrics", metrics, type_=TRIALS.c.metrics.type)
        also: dict[str, Any] = {"node_id": node_id} if node_id else {}
        if config is not None:
            new_config = bindparam("config", config, type_=TRIALS.c.config.type)
            also["config"] = case((newer, new_config), else_=TRIALS.c.config)
        row = {
            "sweep_id": sweep_id, "trial_id": trial_id, "step": iteration, "timestamp_ms": int(time.time() * 1000),
            "metrics": metrics, "files": files, "tags": tags, "shipped": False,
        }  # fmt: skip
        dialect = postgresql if self.is_postgres else sqlite
        with self.engine.begin() as conn:
            self._update_trial(
                conn, sweep_id, trial_id,
                iteration=case((newer, iteration), else_=TRIALS.c.iteration),
                metrics=case((newer, new_metrics), else_=TRIALS.c.metrics),
                updated_at=utcnow(), **also,
            )  # fmt: skip
            # RETURNING, not rowcount: psycopg reports no row count for an INSERT that returns rows.
            new_id = conn.scalar(dialect.insert(OUTBOX).values(**row).on_conflict_do_nothing().returning(OUTBOX.c.id))
            added = new_id is not None
            if added:  # the highest step in the outbox: checkpoints up to it are usable (workers.checkpoints)
                highest = case((TRIALS.c.logged_iteration < iteration, iteration), else_=TRIALS.c.logged_iteration)
                conn.execute(update(TRIALS).where(*_trial_key(sweep_id, trial_id)).values(logged_iteration=highest))
            return added

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

    @waits_out_outages
    def close_trials(self, sweep_id: int, state: TrialState, reason: str) -> None:
        """Every unfinished trial row of an ended sweep to `state`."""
        with self.engine.begin() as conn:
            self._close_trials(conn, sweep_id, state, reason)

    @waits_out_outages
    def set_trial_mlflow_status(self, sweep_id: int, trial_id: str, status: str, state: str) -> None:
        """The status the shipper gave the trial's run, recorded only if the trial is still in `state`."""
        with self.engine.begin() as conn:
            still = update(TRIALS).where(*_trial_key(sweep_id, trial_id), TRIALS.c.state == state)
            conn.execute(still.values(mlflow_status=status))

    # --- the metric outbox -------------------------------------------------------------------

    @waits_out_outages
    def unshipped(self, sweep_id: int, limit: int) -> list[OutboxRow]:
        """The sweep's oldest rows not yet shipped, in the order they were written."""
        q = select(OutboxRow).where(OutboxRow.sweep_id == sweep_id, OutboxRow.shipped.is_(False))
        with self.session() as s:
            return list(s.scalars(q.order_by(OutboxRow.id).limit(limit)))

    @waits_out_outages
    def mark_shipped(self, row_ids: Sequence[int]) -> None:
        if row_ids:
            with self.engine.begin() as conn:
                conn.execute(update(OUTBOX).where(OUTBOX.c.id.in_(list(row_ids))).values(shipped=True))

    @waits_out_outages
    def outbox_history(self, sweep_id: int) -> dict[str, dict[int, dict[str, float]]]:
        """Trial id -> step -> metrics: every step the sweep's trials reported, once each (its first value)."""
        q = select(OUTBOX.c.trial_id, OUTBOX.c.step, OUTBOX.c.metrics).where(OUTBOX.c.sweep_id == sweep_id)
        history: dict[str, dict[int, dict[str, float]]] = {}
        with self.engine.connect() as conn:
            for trial_id, step, metrics in conn.execute(q):
                history.setdefault(trial_id, {})[step] = metrics
        return history
