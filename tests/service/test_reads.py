"""GET /sweeps/{id}'s read (service/reads.py) against the ORM it replaced, on SQLite and a real PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from service.errors import SweepNotFound
from service.models import TrialState
from service.queue import QueueStore
from service.reads import SHOWN, SweepReader
from service.spec import SweepSpec

MakeSpec = Callable[..., SweepSpec]


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> QueueStore:
    return QueueStore(request.getfixturevalue(f"{request.param}_url"))


def as_orm_shows(store: QueueStore, sweep_id: int) -> tuple[dict[str, Any], dict[str, int]]:
    sweep = store.get(sweep_id)
    return {c.name: getattr(sweep, c.name) for c in SHOWN}, store.trial_counts(sweep_id)


def read(reader: SweepReader, sweep_id: int) -> tuple[dict[str, Any], dict[str, int]]:
    async def go() -> tuple[Any, dict[str, int]]:
        try:
            return await reader.get_with_counts(sweep_id)
        finally:
            await reader.close()

    sweep, counts = asyncio.run(go())
    return vars(sweep), counts


def test_same_row_and_counts_as_the_orm(store: QueueStore, make_spec: MakeSpec) -> None:
    reader = SweepReader(store)
    bare = store.submit(make_spec("bare"))
    assert read(reader, bare.id) == as_orm_shows(store, bare.id)
    assert read(reader, bare.id)[1] == {}

    busy = store.submit(make_spec("busy", priority=90))  # claimed before "bare"
    claim = store.claim("w1", 30.0)
    assert claim is not None and claim.sweep_id == busy.id
    for i in range(5):
        store.trial_started(busy.id, f"t{i}", {"seed": i})
    for i in range(2):
        store.trial_ended(busy.id, f"t{i}", TrialState.terminated)
    shown, counts = read(reader, busy.id)
    assert (shown, counts) == as_orm_shows(store, busy.id)
    assert counts == {"running": 3, "terminated": 2} and shown["state"] == "running" and shown["worker_id"] == "w1"
    assert "spec" not in shown and "spec_yaml" not in shown

    with pytest.raises(SweepNotFound, match=r"^sweep 999 does not exist"):
        read(reader, 999)


def test_state_follows_the_queue_and_is_none_for_no_sweep(store: QueueStore, make_spec: MakeSpec) -> None:
    """The long poll's check: on SQLite through a connection of its own, which must see each commit."""
    reader = SweepReader(store)
    sweep_id = store.submit(make_spec("watched")).id

    async def states() -> list[str | None]:
        try:
            seen = [await reader.state(sweep_id)]
            claim = store.claim("w1", 30.0)
            assert claim is not None
            seen.append(await reader.state(sweep_id))
            store.finish(claim)
            return [*seen, await reader.state(sweep_id), await reader.state(sweep_id + 1000)]
        finally:
            await reader.close()

    assert asyncio.run(states()) == ["queued", "running", "succeeded", None]


def test_a_connection_broken_while_idle_is_replaced(postgres_url: str, make_spec: MakeSpec) -> None:
    store = QueueStore(postgres_url)
    sweep = store.submit(make_spec("kept"))
    reader = SweepReader(store)

    async def go() -> list[str]:
        try:
            first, _ = await reader.get_with_counts(sweep.id)
            # What a PostgreSQL restart does to the pool's idle connection: the server ends its backend.
            with store.engine.connect() as admin:
                killed = admin.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE '%anon_1%'"
                    )
                ).all()
            assert killed == [(True,)], killed
            second, _ = await reader.get_with_counts(sweep.id)  # no error: retried on a new connection
            return [first.name, second.name]
        finally:
            await reader.close()

    assert asyncio.run(go()) == ["kept", "kept"]


def test_unreachable_database_raises_operational_error(make_spec: MakeSpec) -> None:
    store = QueueStore("postgresql://postgres@127.0.0.1:1/nowhere", run_migrations=False)
    with pytest.raises(psycopg.OperationalError):  # the app answers it with 503 (tests/faults)
        read(SweepReader(store), 1)


def test_concurrent_reads_share_a_bounded_pool(postgres_url: str, make_spec: MakeSpec) -> None:
    store = QueueStore(postgres_url)
    sweep = store.submit(make_spec("shared"))
    reader = SweepReader(store)

    async def go() -> tuple[set[str], int]:
        try:
            got = await asyncio.gather(*(reader.get_with_counts(sweep.id) for _ in range(100)))
            return {s.name for s, _ in got}, reader._pool().opened
        finally:
            await reader.close()

    names, opened = asyncio.run(go())
    assert names == {"shared"} and 1 <= opened <= 8
