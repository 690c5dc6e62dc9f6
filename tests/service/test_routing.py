"""Sweeps go where they can run (service.routing): the claim's SQL rule against its Python twin on SQLite
and PostgreSQL, a worker that leaves a sweep it cannot hold queued, what `show` and the API say the sweep
waits for, and `submit`'s warning when no live worker can run it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from typer.testing import CliRunner

from service import cli, db
from service.app import create_app
from service.models import QueueWorker, Sweep, SweepState, utcnow
from service.queue import QueueStore
from service.routing import Need, can_run, fits_sql
from service.settings import Settings
from service.spec import SweepSpec

CPU_NODE = {"cpus": 4.0, "gpus": 0.0}
GPU_NODE = {"cpus": 8.0, "gpus": 1.0}
# (cpus, gpus, workers) as a spec's `resources` says them; gpus > 0 or workers > 1 runs Ray Train workers.
RESOURCES = [
    (1, 0, 1), (4, 0, 1), (0.5, 0, 1), (1, 1, 1), (2, 0.5, 1), (1, 2, 1), (2, 0, 3), (1, 2, 2),
    (0.1, 0, 3), (3, 4, 4), (5, 0, 1), (1, 8, 8),
]  # fmt: skip
OFFERS = [
    [],
    [CPU_NODE],
    [{"cpus": 2.0, "gpus": 0.0}, CPU_NODE],
    [GPU_NODE],
    [{"cpus": 16.0, "gpus": 4.0}],
    [{"cpus": 3.0, "gpus": 1.0}, {"cpus": 3.0, "gpus": 1.0}],
    [{"cpus": 0.3, "gpus": 0.0}],
    [{"cpus": 64.0, "gpus": 8.0}, CPU_NODE],
    [{"cpus": 2.0, "gpus": 2.0}, {"cpus": 2.0, "gpus": 2.0}, {"cpus": 1.0, "gpus": 4.0}],
]


def spec(name: str, cpus: float = 1, gpus: float = 0, workers: int = 1, priority: int = 50) -> SweepSpec:
    return SweepSpec.model_validate(
        {
            "name": name,
            "task": "tversky.xor",
            "metric": {"name": "accuracy", "mode": "max"},
            "resources": {"cpus": cpus, "gpus": gpus, "workers": workers},
            "priority": priority,
        }
    )


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> QueueStore:
    return QueueStore(request.getfixturevalue(f"{request.param}_url"))


def test_the_claims_sql_rule_is_the_python_rule(store: QueueStore) -> None:
    ids = {store.submit(spec(f"r{i}", *r)).id: Need.of(spec("n", *r)) for i, r in enumerate(RESOURCES)}
    with store.session() as s:
        for offer in OFFERS:
            rule = fits_sql(offer, Sweep.need_cpus, Sweep.need_gpus, Sweep.need_workers, store._floor)
            in_sql = set(s.scalars(select(Sweep.id).where(rule)))
            in_python = {i for i, need in ids.items() if can_run(offer, need)}
            assert in_sql == in_python, (offer, sorted(in_sql), sorted(in_python))
    # The rule's corners, by hand: bundles spread over nodes but never split; 0.3 CPUs hold three 0.1s.
    assert can_run([CPU_NODE, {"cpus": 2.0, "gpus": 0.0}], Need(2, 0, 3))
    assert not can_run([{"cpus": 3.0, "gpus": 0.0}, {"cpus": 3.0, "gpus": 0.0}], Need(2, 0, 3))
    assert can_run([{"cpus": 0.3, "gpus": 0.0}], Need(0.1, 0, 3))
    assert Need.of(spec("t", 1, 2, 2)) == Need(1, 1, 2)  # the GPUs split over the Train workers
    assert not can_run([{"cpus": 16.0, "gpus": 4.0}], Need(2, 1, 5))  # CPUs for 8, GPUs for 4


def test_a_worker_claims_only_what_its_cluster_can_hold(store: QueueStore) -> None:
    gpu = store.submit(spec("gpu", gpus=1, priority=90))
    cpu = store.submit(spec("cpu", cpus=2, priority=10))
    got = store.claim("cpu-worker", 30.0, [CPU_NODE])
    assert got is not None and got.sweep_id == cpu.id  # past the higher-priority sweep it cannot run
    assert store.claim("cpu-worker-2", 30.0, [CPU_NODE]) is None
    assert store.get(gpu.id).state == SweepState.queued
    got = store.claim("gpu-worker", 30.0, [CPU_NODE, GPU_NODE])
    assert got is not None and got.sweep_id == gpu.id
    rows = {w.worker_id: w for w in store.live_workers()}
    assert rows["gpu-worker"].nodes == [CPU_NODE, GPU_NODE] and rows["gpu-worker"].sweep_id == gpu.id
    assert rows["cpu-worker-2"].sweep_id is None and set(rows) == {"cpu-worker", "cpu-worker-2", "gpu-worker"}


def test_what_a_queued_sweep_waits_for(postgres_url: str) -> None:
    store = QueueStore(postgres_url)
    gpu = store.submit(spec("gpu", gpus=1))
    assert store.waiting(store.get(gpu.id)).message == (
        "waiting for a worker whose cluster has a node with >= 1 GPU; no worker seen in the last 5 minutes"
    )
    assert store.claim("cpu-worker", 30.0, [CPU_NODE]) is None
    waiting = store.waiting(store.get(gpu.id))
    assert waiting.message == (
        "waiting for a worker whose cluster has a node with >= 1 GPU; "
        "workers seen in the last 5 minutes: 1, none with GPUs"
    )
    assert (waiting.workers_seen, waiting.workers_able) == (1, 0)
    train = store.submit(spec("train", cpus=4, gpus=4, workers=2))
    assert store.waiting(store.get(train.id)).message == (
        "waiting for a worker whose cluster has room for 2 Ray Train workers of 4 CPUs + 2 GPUs each "
        "(each on one node); workers seen in the last 5 minutes: 1, none with GPUs"
    )
    # A GPU worker busy with another sweep: the GPU sweep waits its turn, behind the one queued before it.
    store.submit(spec("busy", gpus=1, priority=60))
    assert store.claim("gpu-worker", 30.0, [GPU_NODE]) is not None
    store.submit(spec("later", gpus=1))
    assert store.waiting(store.get(gpu.id)).message == (
        "waiting its turn: 1 of the 2 workers seen in the last 5 minutes can run it (1 busy now); "
        "0 queued sweeps ahead of it"
    )
    assert store.waiting(store.get(train.id)).message.endswith(
        "workers seen in the last 5 minutes: 2, none with room for it (largest node: 8 CPUs, 1 GPU)"
    )
    # Heard from six minutes ago: no longer live. A worker that stops leaves at once.
    with store.session() as s, s.begin():
        s.execute(
            update(QueueWorker).where(QueueWorker.id == "gpu-worker").values(seen_at=utcnow() - timedelta(minutes=6))
        )
    store.forget_worker("cpu-worker")
    assert store.waiting(store.get(gpu.id)).workers_seen == 0

    # The API (on PostgreSQL its read is service.reads' own statement) says the same.
    assert store.claim("cpu-worker", 30.0, [CPU_NODE]) is None
    app = create_app(Settings(home=Path("/nonexistent-unused"), database_url=postgres_url))
    _, token = app.state.tokens.create("alice")
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as client:
        body = client.get(f"/sweeps/{gpu.id}").json()
        listed = {s["id"]: s for s in client.get("/sweeps").json()["sweeps"]}
    expected = {
        "message": "waiting for a worker whose cluster has a node with >= 1 GPU; "
        "workers seen in the last 5 minutes: 1, none with GPUs",
        "workers_seen": 1,
        "workers_able": 0,
        "owner_running": 1,  # its owner's sweep the GPU worker took above (fair share counts it)
    }
    assert body["waiting"] == expected and listed[gpu.id]["waiting"] == expected
    assert listed[store.list_sweeps("running")[0].id]["waiting"] is None


@pytest.fixture
def cli_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[QueueStore]:
    """The CLI's HTTP calls go to an in-process app (as tests/service/test_cli_views.py does)."""
    app = create_app(Settings(home=tmp_path, database_url=None))
    _, token = app.state.tokens.create("alice")
    cli_settings = Settings(home=tmp_path, database_url=None, api_url="http://testserver", api_token=token)
    monkeypatch.setattr(cli, "get_settings", lambda: cli_settings)
    with TestClient(app) as client:

        def request(method: str, url: str, timeout: Any = None, **kwargs: Any) -> Any:
            return client.request(method, url, **kwargs)

        monkeypatch.setattr(httpx, "request", request)
        yield app.state.store
    db.dispose_all()


def test_submit_warns_when_no_live_worker_can_run_the_sweep(cli_api: QueueStore, tmp_path: Path) -> None:
    assert cli_api.claim("cpu-worker", 30.0, [CPU_NODE]) is None  # a live CPU-only worker
    gpu_file, cpu_file = tmp_path / "gpu.yaml", tmp_path / "cpu.yaml"
    gpu_file.write_text(yaml.safe_dump(spec("gpu-sweep", gpus=1).model_dump(mode="json")))
    cpu_file.write_text(yaml.safe_dump(spec("cpu-sweep", cpus=2).model_dump(mode="json")))

    result = CliRunner().invoke(cli.app, ["submit", str(gpu_file)])
    assert result.exit_code == 0, result.output
    sweep_id = int(result.stdout.split()[2])
    assert result.stderr == (
        f"warning: no live worker can run sweep {sweep_id} now; it stays queued until one can. It is waiting "
        "for a worker whose cluster has a node with >= 1 GPU; workers seen in the last 5 minutes: 1, none with "
        "GPUs\n"
    )
    assert cli_api.get(sweep_id).state == SweepState.queued  # warned, not refused
    shown = CliRunner().invoke(cli.app, ["show", str(sweep_id)])
    assert "waiting      waiting for a worker whose cluster has a node with >= 1 GPU;" in shown.stdout, shown.output

    result = CliRunner().invoke(cli.app, ["submit", str(cpu_file)])
    assert result.exit_code == 0 and result.stderr == "", result.output


def test_the_migration_reads_the_needs_of_sweeps_queued_before_it(sqlite_url: str) -> None:
    from alembic import command
    from alembic.config import Config

    store = QueueStore(sqlite_url)
    train = store.submit(spec("train", cpus=2, gpus=4, workers=2))
    cfg = Config()
    cfg.set_main_option("script_location", str(db.MIGRATIONS))
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0004")  # the columns are gone
    db.migrate(store.engine)
    row = store.get(train.id)
    assert Need(row.need_cpus, row.need_gpus, row.need_workers) == Need(2, 2, 2)  # not the columns' defaults
