"""GET /sweeps/{id}/trials: a fresh app and queue database for every test, exact `detail` assertions."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service import db
from service.app import create_app
from service.models import TrialState
from service.queue import QueueStore
from service.settings import Settings

CONFIG = {"features": 16, "steps": 1000, "lr": 0.1, "report_every": 100}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(home=tmp_path, database_url=None)
    app = create_app(settings)
    _, token = app.state.tokens.create("alice")
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as client:
        yield client
    db.dispose_all()


def store_of(client: TestClient) -> QueueStore:
    store: QueueStore = client.app.state.store  # type: ignore[attr-defined]
    return store


def submit(client: TestClient, demo_dict: dict[str, Any]) -> int:
    resp = client.post("/sweeps", json=demo_dict)
    assert resp.status_code == 201, resp.text
    sweep_id: int = resp.json()["id"]
    return sweep_id


def test_a_queued_sweep_has_no_trial_rows_yet(client: TestClient, demo_dict: dict[str, Any]) -> None:
    sweep_id = submit(client, demo_dict)
    resp = client.get(f"/sweeps/{sweep_id}/trials")
    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "sweep_id": sweep_id,
        "metric": {"name": "accuracy", "mode": "max"},
        "space": ["intersection", "difference", "seed"],  # the spec's order
        "trials": [],
    }


def test_one_row_per_trial_in_start_order(client: TestClient, demo_dict: dict[str, Any]) -> None:
    sweep_id = submit(client, demo_dict)
    store = store_of(client)
    a = {**CONFIG, "intersection": "min", "difference": "ignorematch", "seed": 0}
    b = {**CONFIG, "intersection": "max", "difference": "substractmatch", "seed": 1}
    store.trial_started(sweep_id, "t_a", a, node_id="node1")
    store.trial_started(sweep_id, "t_b", b)
    store.trial_result(sweep_id, "t_a", 3, {"accuracy": 0.75, "loss": 0.5})
    store.trial_result(sweep_id, "t_a", 2, {"accuracy": 0.5, "loss": 0.9})  # late and older: not the latest
    store.trial_ended(sweep_id, "t_a", TrialState.terminated)
    store.trial_started(sweep_id, "t_b", b)  # restarted after a failure
    store.set_trial_run(sweep_id, "t_b", "run_b")

    resp = client.get(f"/sweeps/{sweep_id}/trials")
    assert resp.status_code == 200, resp.text
    rows = resp.json()["trials"]
    for row in rows:
        assert datetime.fromisoformat(row.pop("updated_at")).utcoffset() is not None  # RFC 3339, with offset
    assert rows == [
        {
            "trial_id": "t_a",
            "state": "terminated",
            "config": a,
            "iteration": 3,
            "metrics": {"accuracy": 0.75, "loss": 0.5},
            "starts": 1,
            "node_id": "node1",
            "mlflow_run_id": None,
            "reason": None,
        },
        {
            "trial_id": "t_b",
            "state": "running",
            "config": b,
            "iteration": 0,
            "metrics": None,
            "starts": 2,
            "node_id": None,
            "mlflow_run_id": "run_b",
            "reason": None,
        },
    ]


def test_the_trials_of_another_users_sweep_are_readable(client: TestClient, demo_dict: dict[str, Any]) -> None:
    # Reading is open to every token (as GET /sweeps/{id} is); only cancelling checks the owner.
    sweep_id = submit(client, demo_dict)
    _, bob = client.app.state.tokens.create("bob")  # type: ignore[attr-defined]
    resp = client.get(f"/sweeps/{sweep_id}/trials", headers={"Authorization": f"Bearer {bob}"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["sweep_id"] == sweep_id


def test_unknown_sweep_is_404(client: TestClient) -> None:
    resp = client.get("/sweeps/99/trials")
    assert resp.status_code == 404
    assert resp.json() == {"detail": "sweep 99 does not exist; `layerlab list` shows the sweeps"}


def test_missing_token_is_401(client: TestClient) -> None:
    resp = client.get("/sweeps/1/trials", headers={"Authorization": ""})
    assert resp.status_code == 401
    assert resp.json() == {
        "detail": "missing API token: send the header 'Authorization: Bearer <token>' (the CLI reads "
        "LAYERLAB_API_TOKEN); an operator creates tokens with `layerlab token create --user NAME`"
    }


def test_unknown_token_is_401(client: TestClient) -> None:
    resp = client.get("/sweeps/1/trials", headers={"Authorization": "Bearer not-a-token"})
    assert resp.status_code == 401
    assert resp.json() == {"detail": "the API token is unknown or revoked: ask an operator for a new one"}


@pytest.mark.parametrize("sweep_id", ["0", str(2**31), "abc"])
def test_an_id_that_cannot_be_a_sweep_is_422(client: TestClient, sweep_id: str) -> None:
    resp = client.get(f"/sweeps/{sweep_id}/trials")
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"] == ["path", "sweep_id"]
