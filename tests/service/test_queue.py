"""The queue store on SQLite and on a real PostgreSQL: order, exclusive claims, leases, fencing, cancel."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from service.errors import InvalidTransition, LeaseLost, SweepNotFound
from service.models import Event, SweepState, TrialState
from service.queue import Claim, QueueStore
from service.routing import SeenWorker
from service.spec import SweepSpec

MakeSpec = Callable[..., SweepSpec]


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest) -> str:
    # Resolved lazily so that the SQLite tests never touch PostgreSQL (and vice versa).
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def store(url: str) -> QueueStore:
    return QueueStore(url)


def claim(store: QueueStore, worker: str, lease_seconds: float = 30.0) -> Claim:
    got = store.claim(worker, lease_seconds)
    assert got is not None, f"{worker} found the queue empty"
    return got


def test_backend(store: QueueStore, url: str) -> None:
    assert store.is_postgres == url.startswith("postgresql")
    store.ping()


def test_submit_stores_the_spec(store: QueueStore, make_spec: MakeSpec) -> None:
    spec = make_spec("stored", priority=70)
    sweep = store.submit(spec, "name: stored\n")
    got = store.get(sweep.id)
    assert (got.name, got.task, got.state, got.priority) == ("stored", "tversky.xor", "queued", 70)
    assert (got.trials_total, got.metric_name, got.metric_mode) == (24, "accuracy", "max")
    assert (got.attempts, got.max_attempts, got.cancel_requested) == (0, 5, False)
    assert got.spec == spec.model_dump(mode="json") and got.spec_yaml == "name: stored\n"
    assert [e.action for e in store.events(sweep.id)] == ["submit"]
    assert [s.id for s in store.list_sweeps()] == [sweep.id]
    assert store.list_sweeps(state="running") == []


def test_get_of_a_missing_sweep(store: QueueStore) -> None:
    with pytest.raises(SweepNotFound, match=r"^sweep 404 does not exist; `layerlab list` shows the sweeps$"):
        store.get(404)


def test_claim_of_an_empty_queue(store: QueueStore) -> None:
    assert store.claim("w1", 30) is None


def test_higher_priority_first_then_fifo(store: QueueStore, make_spec: MakeSpec) -> None:
    order = [("low", 10), ("mid-a", 50), ("high", 90), ("mid-b", 50), ("mid-c", 50), ("top", 100), ("zero", 0)]
    ids = {name: store.submit(make_spec(name, priority)).id for name, priority in order}
    claimed = []
    while (got := store.claim("w1", 30)) is not None:
        claimed.append(got.sweep_id)
    assert claimed == [ids[n] for n in ("top", "high", "mid-a", "mid-b", "mid-c", "low", "zero")]


def test_fair_share_one_users_twenty_sweeps_do_not_hold_back_anothers_one(
    store: QueueStore, make_spec: MakeSpec
) -> None:
    """Among equal priorities the owner with the fewest running sweeps goes first: bob's one sweep, submitted after
    alice's twenty, starts second, not twenty-first; priority still comes first."""
    alice = [store.submit(make_spec(f"alice-{i}"), owner="alice").id for i in range(20)]
    bob = store.submit(make_spec("bob-0"), owner="bob").id
    urgent = store.submit(make_spec("alice-urgent", priority=90), owner="alice").id
    queued = {s.id: s for s in store.list_sweeps("queued", limit=100, offset=0)}
    assert store.waiting(queued[bob], []).owner_running == 0
    order = [claim(store, f"w{i}", 30).sweep_id for i in range(4)]
    assert order == [urgent, bob, alice[0], alice[1]]  # alice 1 running, bob 0: bob before alice's oldest
    # What `waiting` says of a queued sweep follows the same order: alice's next has none ahead of it.
    queued = {s.id: s for s in store.list_sweeps("queued", limit=100, offset=0)}
    able = [SeenWorker("w9", [{"cpus": 64, "gpus": 0}], None)]
    said = store.waiting(queued[alice[2]], able)
    assert said.owner_running == 3 and said.message.endswith("; 0 queued sweeps ahead of it"), said.message
    assert store.waiting(queued[alice[3]], able).message.endswith("; 1 queued sweep ahead of it")


def test_the_listed_places_in_the_queue_are_the_claim_order(store: QueueStore, make_spec: MakeSpec) -> None:
    """GET /sweeps says each queued sweep's place in one pass over the queue (waiting_all): it agrees with `waiting`
    of each sweep alone, the places are 0..n-1, and the sweep with none ahead of it is the one the next claim
    takes, after every claim (owners' running counts change the order as it goes)."""
    owners = ["alice", "bob", None, "alice", "carol", "alice", None, "bob", "alice", "carol"]
    priorities = [50, 50, 50, 90, 50, 10, 90, 50, 50, 50]
    for i, (owner, priority) in enumerate(zip(owners, priorities, strict=True)):
        store.submit(make_spec(f"s{i}", priority=priority), owner=owner)
    able = [SeenWorker("w9", [{"cpus": 64, "gpus": 0}], None)]
    for k in range(len(owners)):
        queued = store.list_sweeps("queued", limit=100, offset=0)
        listed = store.waiting_all(queued, able)
        assert {i: w.message for i, w in listed.items()} == {s.id: store.waiting(s, able).message for s in queued}
        ahead = {s.id: int(listed[s.id].message.rsplit("; ", 1)[1].split()[0]) for s in queued}
        assert sorted(ahead.values()) == list(range(len(queued)))
        assert claim(store, f"w{k}", 30).sweep_id == min(ahead, key=ahead.__getitem__)
    assert store.waiting_all([], able) == {}


def test_a_per_user_limit_holds_an_owners_next_sweep_while_others_run(store: QueueStore, make_spec: MakeSpec) -> None:
    first = [store.submit(make_spec(f"alice-{i}"), owner="alice").id for i in range(3)]
    bob = store.submit(make_spec("bob-0"), owner="bob").id
    got = [claim(store, f"w{i}", 30).sweep_id for i in range(2)]
    assert got == [first[0], bob]
    assert store.claim("w9", 30, max_running_per_user=1) is None  # alice has 1 running, bob's queue is empty
    assert store.claim("w9", 30, max_running_per_user=2).sweep_id == first[1]  # type: ignore[union-attr]


def test_claim_takes_a_lease(store: QueueStore, make_spec: MakeSpec) -> None:
    sweep = store.submit(make_spec("leased"))
    got = claim(store, "w1", 30)
    assert (got.sweep_id, got.worker_id, got.attempt) == (sweep.id, "w1", 1)
    assert got.spec["name"] == "leased" and got.spec_yaml
    row = store.get(sweep.id)
    assert (row.state, row.worker_id, row.attempts) == ("running", "w1", 1)
    assert row.lease_expires_at is not None and row.started_at is not None
    assert store.claim("w2", 30) is None  # a live lease is not reclaimed


def test_concurrent_claimers_never_claim_a_sweep_twice(url: str, make_spec: MakeSpec) -> None:
    stores = [QueueStore(url) for _ in range(4)]  # one per worker, as separate processes would have
    ids = [stores[0].submit(make_spec(f"sweep-{i}", priority=i % 5)).id for i in range(50)]
    claimed: dict[str, list[int]] = {f"w{i}": [] for i in range(4)}
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def work(worker: str, store: QueueStore) -> None:
        try:
            start.wait()
            while (got := store.claim(worker, 30)) is not None:
                assert got.worker_id == worker and got.attempt == 1
                claimed[worker].append(got.sweep_id)
        except BaseException as exc:  # noqa: BLE001 - surfaced in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w, s)) for w, s in zip(claimed, stores, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    counts = Counter(i for got in claimed.values() for i in got)
    assert sorted(counts) == sorted(ids), f"claimed {len(counts)} of {len(ids)}"
    assert set(counts.values()) == {1}, {i: n for i, n in counts.items() if n > 1}
    with stores[0].session() as s:
        claims = s.scalars(select(Event).where(Event.action == "claim")).all()
    assert len(claims) == 50
    assert {row.state for row in stores[0].list_sweeps(limit=100)} == {"running"}


def test_an_expired_lease_is_requeued_and_the_stale_worker_is_fenced(store: QueueStore, make_spec: MakeSpec) -> None:
    sweep = store.submit(make_spec("expires"))
    stale = claim(store, "w1", lease_seconds=0.2)
    time.sleep(0.3)
    fresh = claim(store, "w2")
    assert (fresh.sweep_id, fresh.worker_id, fresh.attempt) == (sweep.id, "w2", 2)
    row = store.get(sweep.id)
    assert (row.state, row.worker_id, row.attempts) == ("running", "w2", 2)
    assert [e.action for e in store.events(sweep.id)] == ["submit", "claim", "requeue", "claim"]

    message = rf"^worker w1 lost the lease on sweep {sweep.id} \(attempt 1\); another worker owns it now$"
    for write in (
        lambda: store.heartbeat(stale, 30),
        lambda: store.finish(stale),
        lambda: store.fail(stale, "boom"),
        lambda: store.cancelled(stale),
        lambda: store.requeue(stale, "shutdown"),
        lambda: store.set_fields(stale, best_metric=1.0),
    ):
        with pytest.raises(LeaseLost, match=message):
            write()
    row = store.get(sweep.id)
    assert (row.state, row.worker_id, row.best_metric) == ("running", "w2", None)

    assert store.heartbeat(fresh, 30) is False
    store.finish(fresh)
    row = store.get(sweep.id)
    assert (row.state, row.reason, row.lease_expires_at) == ("succeeded", None, None)
    assert row.finished_at is not None
    with pytest.raises(LeaseLost):
        store.heartbeat(fresh, 30)  # a finished sweep has no lease to renew


def test_the_last_attempt_expiring_fails_the_sweep(store: QueueStore, make_spec: MakeSpec) -> None:
    sweep = store.submit(make_spec("gives-up"), max_attempts=1)
    stale = claim(store, "w1", lease_seconds=0.2)
    time.sleep(0.3)
    assert store.claim("w2", 30) is None
    row = store.get(sweep.id)
    assert (row.state, row.attempts, row.worker_id) == ("failed", 1, None)
    assert row.reason == ("worker w1 stopped renewing its lease (attempt 1); gave up after 1 of max_attempts=1"), (
        row.reason
    )
    assert row.finished_at is not None
    with pytest.raises(LeaseLost):
        store.finish(stale)


def test_attempts_run_out_after_max_attempts_expiries(store: QueueStore, make_spec: MakeSpec) -> None:
    sweep = store.submit(make_spec("flaky"), max_attempts=2)
    assert claim(store, "w1", 0.2).attempt == 1
    time.sleep(0.3)
    assert claim(store, "w2", 0.2).attempt == 2
    time.sleep(0.3)
    assert store.claim("w3", 30) is None
    row = store.get(sweep.id)
    assert row.state == "failed" and "max_attempts=2" in (row.reason or ""), row.reason


def test_fail_records_the_reason(store: QueueStore, make_spec: MakeSpec) -> None:
    sweep = store.submit(make_spec("fails"))
    got = claim(store, "w1")
    store.fail(got, "3 of 24 trials errored")
    row = store.get(sweep.id)
    assert (row.state, row.reason) == ("failed", "3 of 24 trials errored")
    assert store.claim("w2", 30) is None  # a failed sweep is not retried


def test_requeue_keeps_the_place_in_the_queue(store: QueueStore, make_spec: MakeSpec) -> None:
    first = store.submit(make_spec("first"))
    store.submit(make_spec("second"))
    got = claim(store, "w1")
    store.requeue(got, "worker shutting down")
    again = claim(store, "w2")
    assert (again.sweep_id, again.attempt) == (first.id, 2)


def test_cancel_of_a_queued_sweep_is_immediate(store: QueueStore, make_spec: MakeSpec) -> None:
    sweep = store.submit(make_spec("unwanted"))
    cancelled = store.cancel(sweep.id)
    assert (cancelled.state, cancelled.reason) == ("cancelled", "cancelled before it started")
    row = store.get(sweep.id)
    assert row.state == "cancelled" and row.finished_at is not None
    assert store.claim("w1", 30) is None


def test_cancel_of_a_running_sweep_is_requested_of_its_worker(store: QueueStore, make_spec: MakeSpec) -> None:
    sweep = store.submit(make_spec("running"))
    got = claim(store, "w1")
    assert store.heartbeat(got, 30) is False
    flagged = store.cancel(sweep.id)
    assert (flagged.state, flagged.cancel_requested) == ("running", True)
    assert store.heartbeat(got, 30) is True
    store.cancelled(got)
    row = store.get(sweep.id)
    assert (row.state, row.reason) == ("cancelled", "cancelled by request")
    assert [e.action for e in store.events(sweep.id)][-2:] == ["cancel_request", "cancelled"]


def test_a_cancelled_sweep_whose_worker_died_is_cancelled_not_requeued(store: QueueStore, make_spec: MakeSpec) -> None:
    sweep = store.submit(make_spec("orphan"))
    claim(store, "w1", lease_seconds=0.2)
    store.cancel(sweep.id)
    time.sleep(0.3)
    assert store.claim("w2", 30) is None
    row = store.get(sweep.id)
    assert row.state == "cancelled" and (row.reason or "").startswith("cancelled; worker w1 stopped renewing")


@pytest.mark.parametrize("end", ["finish", "fail", "cancel"])
def test_cancel_of_a_finished_sweep_is_refused(store: QueueStore, make_spec: MakeSpec, end: str) -> None:
    sweep = store.submit(make_spec("done"))
    if end == "cancel":
        store.cancel(sweep.id)
        state = "cancelled"
    else:
        got = claim(store, "w1")
        store.finish(got) if end == "finish" else store.fail(got, "boom")
        state = "succeeded" if end == "finish" else "failed"
    with pytest.raises(InvalidTransition, match=rf"^sweep {sweep.id} is {state}; cannot cancel it$"):
        store.cancel(sweep.id)
    assert store.get(sweep.id).state == state


def test_cancel_of_a_missing_sweep(store: QueueStore) -> None:
    with pytest.raises(SweepNotFound):
        store.cancel(12345)


def test_list_filters_by_state_newest_first(store: QueueStore, make_spec: MakeSpec) -> None:
    a, b, c = (store.submit(make_spec(n)).id for n in ("a", "b", "c"))
    store.cancel(b)
    assert [s.id for s in store.list_sweeps()] == [c, b, a]
    assert [s.id for s in store.list_sweeps(state=SweepState.queued)] == [c, a]
    assert [s.id for s in store.list_sweeps(state="cancelled")] == [b]
    assert [s.id for s in store.list_sweeps(limit=1, offset=1)] == [b]


def test_a_trials_row_follows_its_starts_results_and_end(store: QueueStore, make_spec: MakeSpec) -> None:
    sweep_id = store.submit(make_spec("trials")).id

    def t0() -> tuple[Any, ...]:
        (row,) = (t for t in store.trials(sweep_id) if t.trial_id == "t0")
        return row.state, row.config, row.starts, row.node_id, row.iteration, row.metrics, row.logged_iteration

    # A result before any start (a restored trial reporting first) makes the row.
    assert store.trial_result(sweep_id, "t0", 2, {"loss": 0.5}, node_id="n1")
    assert t0() == ("pending", {}, 0, "n1", 2, {"loss": 0.5}, 2)
    store.trial_started(sweep_id, "t0", {"seed": 3}, node_id="n2")
    store.trial_started(sweep_id, "t0", {"seed": 3})  # started again (restored): the node stays known
    assert t0() == ("running", {"seed": 3}, 2, "n2", 2, {"loss": 0.5}, 2)
    # The first value of a step wins: a step reported again adds no outbox row; a late, older result does not
    # replace the latest, but its step, never reported before, gets its row.
    assert not store.trial_result(sweep_id, "t0", 2, {"loss": 0.55})
    assert store.trial_result(sweep_id, "t0", 1, {"loss": 0.9})
    assert t0() == ("running", {"seed": 3}, 2, "n2", 2, {"loss": 0.55}, 2)  # the row: the latest report
    assert store.trial_result(sweep_id, "t0", 3, {"loss": 0.4}, files={"a.txt": "eA=="})
    assert t0() == ("running", {"seed": 3}, 2, "n2", 3, {"loss": 0.4}, 3)
    assert store.outbox_history(sweep_id) == {"t0": {1: {"loss": 0.9}, 2: {"loss": 0.5}, 3: {"loss": 0.4}}}
    rows = store.unshipped(sweep_id, 10)
    assert [(r.step, r.files) for r in rows] == [(2, None), (1, None), (3, {"a.txt": "eA=="})]  # in written order
    store.mark_shipped([rows[0].id])
    assert [r.step for r in store.unshipped(sweep_id, 10)] == [1, 3]
    # The first MLflow run id stays; a second claimant gets the first back.
    assert store.set_trial_run(sweep_id, "t1", "run-a") == "run-a"
    assert store.set_trial_run(sweep_id, "t1", "run-b") == "run-a"
    store.trial_ended(sweep_id, "t0", TrialState.terminated)
    assert [(t.trial_id, t.state, t.mlflow_run_id) for t in store.trials(sweep_id)] == [
        ("t0", "terminated", None),
        ("t1", "pending", "run-a"),
    ]


def test_the_migrations_make_the_tables_the_models_describe(store: QueueStore) -> None:
    """Alembic's own comparison of the migrated database with service.models: a column added to a model
    without its migration (or the reverse) fails here, on SQLite and on PostgreSQL."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from service.models import Base

    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    # Types as each dialect reflects them differ from the declared ones without a schema change: compared by name.
    assert [d for d in diff if d[0] in ("add_table", "remove_table", "add_column", "remove_column")] == []
