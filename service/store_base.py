"""What every part of the queue store shares: the engine, its sessions, and the outage wait.

service.queue.QueueStore is built from service.trial_ledger.TrialLedger and
service.worker_rows.WorkerRows on top of this base, so every store method sees the same engine.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

from service.db import get_engine, migrate, session_factory

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


def waits_out_outages(method: F) -> F:
    """A worker's call waits out a database it cannot reach (up to the store's `outage_seconds`), then
    carries on, reconnecting through the pool's pre-ping. Each call is one transaction, so a failed
    attempt left nothing behind and runs again whole. (Unless the server died between committing and
    answering: a retried `trial_started` then counts one start twice, a retried `finish` finds the sweep
    ended and raises LeaseLost.)"""

    @functools.wraps(method)
    def wrapper(store: StoreBase, *args: Any, **kwargs: Any) -> Any:
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


class StoreBase:
    def __init__(self, url: str, *, run_migrations: bool = True, outage_seconds: float = 0.0) -> None:
        """`outage_seconds`: how long worker-side calls wait out an unreachable database (the API's
        store keeps 0: it answers 503 at once and lets the client retry)."""
        self.outage_seconds = outage_seconds
        self.engine: Engine = get_engine(url)
        if run_migrations:
            migrate(self.engine)
        self._sessions = session_factory(self.engine)
        self.is_postgres = self.engine.dialect.name == "postgresql"

    def session(self) -> Session:
        return self._sessions()

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
