"""How the worker talks to an MLflow store, whatever it writes: SQLite commits that do not wait for
the disk, one creator of a new SQLite store at a time, and which failures mean "the server is away, try
again later". (HTTP calls fail fast through MLflow's documented MLFLOW_HTTP_REQUEST_* variables, set
once for the worker process: workers.worker.WORKER_ENV_DEFAULTS.)
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import requests
from mlflow.exceptions import MlflowException
from sqlalchemy import event
from sqlalchemy.pool import Pool

log = logging.getLogger(__name__)

PARENT_TAG, SWEEP_TAG, TRIAL_TAG = "layerlab.role", "layerlab.sweep_id", "layerlab.trial_id"
"""Tags on every run the service makes: a resumed sweep finds its runs by them."""


def fast_sqlite_commits(tracking_uri: str) -> None:
    """An MLflow store in SQLite (the embedded stack) commits in WAL mode without a sync per commit, as
    the queue does (service/db.py): in its default mode each of the ~6 commits per trial waited for
    the disk, 8% of the Tune loop's time in benchmarks/service_overhead.py. A killed worker loses
    nothing committed; a power cut can lose the last commits."""
    if not tracking_uri.startswith("sqlite:///") or tracking_uri in _FAST_SQLITE:
        return
    _FAST_SQLITE.add(tracking_uri)
    path = os.path.realpath(tracking_uri.removeprefix("sqlite:///"))

    @event.listens_for(Pool, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        if type(dbapi_conn).__module__ != "sqlite3":
            return
        rows = dbapi_conn.execute("PRAGMA database_list").fetchall()
        if any(row[1] == "main" and row[2] and os.path.realpath(row[2]) == path for row in rows):
            try:  # WAL stays set in the file; switching waits for no one (another process may hold it)
                dbapi_conn.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError as exc:
                log.info("MLflow's SQLite store stays in its journal mode for now: %s", exc)
            dbapi_conn.execute("PRAGMA synchronous=NORMAL")


_FAST_SQLITE: set[str] = set()


@contextmanager
def first_use_lock(tracking_uri: str) -> Iterator[None]:
    """Two workers that open a new SQLite MLflow store at the same time both create its tables, and
    the loser leaves the store half-migrated for good: every later sweep failed (found by tests/faults,
    two workers started together). The first use of the store holds a file lock beside it."""
    if not tracking_uri.startswith("sqlite:///"):
        yield
        return
    with open(tracking_uri.removeprefix("sqlite:///") + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def unreachable(exc: Exception) -> bool:
    """The tracking server did not answer, or answered 5xx (down, restarting, overloaded): worth trying
    again later. An answer that refuses the write (4xx) is not, and fails as before."""
    if isinstance(exc, MlflowException):
        status: int = exc.get_http_status_code()  # type: ignore[no-untyped-call]
        return status >= 500
    return isinstance(exc, requests.exceptions.RequestException | OSError)


def short(exc: Exception) -> str:
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
