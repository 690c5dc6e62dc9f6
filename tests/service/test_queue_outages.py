"""The queue across a PostgreSQL outage (service/queue.py), against a private PostgreSQL server that the tests
stop and start: a lease that expired while the server was down is not reclaimed, worker calls wait out an outage
for up to outage_seconds, and API calls do not wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy.exc import OperationalError

from service.queue import QueueStore
from service.spec import SweepSpec, parse_spec
from tests.support import PrivatePostgres, private_postgres


@pytest.fixture(scope="module")
def pg() -> Iterator[PrivatePostgres]:
    with private_postgres() as server:
        # The schema, made here: a test may open its store with run_migrations=False and still run first or alone
        # (pytest-xdist's `load` hands this module's tests to two processes, each with a server of its own).
        QueueStore(server.url).engine.dispose()
        yield server


def _spec(name: str) -> SweepSpec:
    return parse_spec({"name": name, "task": "tversky.xor", "metric": {"name": "loss"}})


def actions(store: QueueStore, sweep_id: int) -> list[str]:
    return [e.action for e in store.events(sweep_id)]


def test_a_lease_that_expired_while_postgres_was_down_is_not_reclaimed(pg: PrivatePostgres) -> None:
    store = QueueStore(pg.url)
    sweep = store.submit(_spec("outlives-a-restart"))
    held = store.claim("w1", lease_seconds=1.0)
    assert held is not None and held.sweep_id == sweep.id
    pg.stop()
    time.sleep(1.5)  # longer than the lease: by the clock alone, w1 is gone
    pg.start()
    assert store.claim("w2", lease_seconds=1.0) is None  # the server is younger than a lease
    assert store.heartbeat(held, lease_seconds=1.0) is False  # w1 is back and still owns it
    time.sleep(1.5)  # now w1 really stays silent for longer than its lease, the server for longer too
    taken = store.claim("w2", lease_seconds=1.0)
    assert taken is not None and (taken.sweep_id, taken.attempt) == (sweep.id, 2)
    assert actions(store, sweep.id) == ["submit", "claim", "requeue", "claim"]


def test_worker_calls_wait_out_an_outage_and_api_calls_do_not(pg: PrivatePostgres) -> None:
    api_side = QueueStore(pg.url)
    worker_side = QueueStore(pg.url, run_migrations=False, outage_seconds=60)
    sweep = api_side.submit(_spec("waits"))
    pg.stop()
    with pytest.raises(OperationalError):
        api_side.get(sweep.id)
    back = threading.Timer(2.0, pg.start)
    back.start()
    t0 = time.monotonic()
    assert worker_side.get(sweep.id).name == "waits"
    waited = time.monotonic() - t0
    back.join()
    assert 2.0 <= waited < 15, waited
    assert api_side.get(sweep.id).name == "waits"  # the pool reconnects by itself


def test_a_worker_call_gives_up_after_outage_seconds(pg: PrivatePostgres) -> None:
    store = QueueStore(pg.url, run_migrations=False, outage_seconds=2)
    sweep = store.submit(_spec("gives-up"))
    pg.stop()
    try:
        t0 = time.monotonic()
        with pytest.raises(OperationalError):
            store.get(sweep.id)
        assert 2.0 <= time.monotonic() - t0 < 5
    finally:
        pg.start()
