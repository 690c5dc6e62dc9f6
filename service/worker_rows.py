"""Workers' heartbeat rows and the routing view built on them (service.routing).

A worker's row records the nodes of its Ray cluster, when it was last heard from (claim poll or lease
heartbeat) and the sweep it holds. The claim routes a sweep only to a worker whose nodes can hold its
trials; the API reads the rows to say what a queued sweep waits for.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import Integer, delete, func, select, update
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from service.models import QueueWorker, Sweep, SweepState, utcnow
from service.routing import LIVE_SECONDS, Need, Node, SeenWorker, Waiting, waiting
from service.store_base import StoreBase


class WorkerRows(StoreBase):
    """The worker rows' reads and writes; part of service.queue.QueueStore."""

    def __init__(self, url: str, *, run_migrations: bool = True, outage_seconds: float = 0.0) -> None:
        super().__init__(url, run_migrations=run_migrations, outage_seconds=outage_seconds)
        self._pruned_for: set[str] = set()

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

    def _heard(self, s: Session, worker_id: str, sweep_id: int) -> None:
        """A lease heartbeat: the worker's row (if it has one) is seen now, holding `sweep_id`."""
        workers = update(QueueWorker).where(QueueWorker.id == worker_id)
        s.execute(workers.values(seen_at=utcnow(), sweep_id=sweep_id))

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
        the caller has it already."""
        return self.waiting_all([sweep], seen)[sweep.id]

    def waiting_all(self, sweeps: Sequence[Any], seen: list[SeenWorker] | None = None) -> dict[int, Waiting]:
        """`waiting` of each of `sweeps` (queued ones), by id, in three statements however many there are (GET
        /sweeps over a long queue made three a sweep): the running sweeps by owner, the queued sweeps' places in
        the claim order (QueueStore.claim: priority, then the owner's running sweeps, then submission), the
        live workers. Sweeps without an owner count as one owner, as in the claim."""
        if not sweeps:
            return {}
        with self.session() as s:
            by_owner = select(Sweep.owner, func.count()).where(Sweep.state == SweepState.running)
            running: dict[str | None, int] = {owner: int(n) for owner, n in s.execute(by_owner.group_by(Sweep.owner))}
            queued = select(Sweep.priority, Sweep.owner, Sweep.submitted_at, Sweep.id)
            rows = s.execute(queued.where(Sweep.state == SweepState.queued)).all()

        def place(priority: int, owner: str | None, submitted_at: Any, sweep_id: int) -> tuple[Any, ...]:
            return (-priority, running.get(owner, 0), submitted_at, sweep_id)

        order = sorted(place(*row) for row in rows)
        seen = self.live_workers() if seen is None else seen
        found = {}
        for sweep in sweeps:
            ahead = bisect_left(order, place(sweep.priority, sweep.owner, sweep.submitted_at, sweep.id))
            need = Need(cpus=sweep.need_cpus, gpus=sweep.need_gpus, workers=sweep.need_workers)
            owner_running = running.get(sweep.owner, 0)
            found[sweep.id] = waiting(need, seen, ahead).model_copy(update={"owner_running": owner_running})
        return found

    def running_leases(self) -> list[tuple[int, str | None]]:
        """(sweep id, lease holder) of every running sweep."""
        q = select(Sweep.id, Sweep.worker_id).where(Sweep.state == SweepState.running)
        with self.session() as s:
            return [(sweep_id, worker_id) for sweep_id, worker_id in s.execute(q)]
