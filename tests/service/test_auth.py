"""API tokens, ownership and /metrics: a fresh app and queue database per test, tokens made by the
CLI where the operator would use it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from service import db
from service.app import create_app
from service.models import Sweep, TrialState
from service.queue import QueueStore
from service.settings import Settings
from service.tokens import TokenStore

LAYERLAB = str(Path(sys.executable).with_name("layerlab"))


@pytest.fixture
def app_and_tokens(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    app = create_app(Settings(home=tmp_path, database_url=None))
    tokens = {
        "alice": app.state.tokens.create("alice")[1],
        "bob": app.state.tokens.create("bob")[1],
        "root": app.state.tokens.create("root", admin=True)[1],
    }
    with TestClient(app) as client:
        yield client, tokens
    db.dispose_all()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def submit_as(client: TestClient, token: str, spec: dict[str, Any]) -> dict[str, Any]:
    resp = client.post("/sweeps", json=spec, headers=auth(token))
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/sweeps"),
        ("post", "/sweeps"),
        ("get", "/sweeps/1"),
        ("post", "/sweeps/1/cancel"),
        ("post", "/sweeps/1/rerun"),
        ("get", "/metrics"),
    ],
)
def test_every_endpoint_but_healthz_needs_a_token(
    app_and_tokens: tuple[TestClient, dict[str, str]], method: str, path: str
) -> None:
    client, _ = app_and_tokens
    resp = client.request(method, path)
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"] == "Bearer"
    assert "layerlab token create --user NAME" in resp.json()["detail"]
    bad = client.request(method, path, headers=auth("ll_not-a-real-token"))
    assert bad.status_code == 401
    assert bad.json() == {"detail": "the API token is unknown or revoked: ask an operator for a new one"}
    assert client.get("/healthz").status_code == 200


def test_a_sweep_belongs_to_its_submitter_and_only_they_or_an_admin_cancel_it(
    app_and_tokens: tuple[TestClient, dict[str, str]], demo_dict: dict[str, Any]
) -> None:
    client, tokens = app_and_tokens
    first = submit_as(client, tokens["alice"], demo_dict)
    assert first["owner"] == "alice"
    resp = client.post(f"/sweeps/{first['id']}/cancel", headers=auth(tokens["bob"]))
    assert resp.status_code == 403
    assert resp.json() == {"detail": f"sweep {first['id']} belongs to alice; only its owner or an admin can cancel it"}
    assert client.get(f"/sweeps/{first['id']}", headers=auth(tokens["bob"])).json()["state"] == "queued"
    ok = client.post(f"/sweeps/{first['id']}/cancel", headers=auth(tokens["alice"]))
    assert ok.status_code == 200 and ok.json()["state"] == "cancelled"

    second = submit_as(client, tokens["alice"], demo_dict)
    assert client.post(f"/sweeps/{second['id']}/cancel", headers=auth(tokens["root"])).json()["state"] == "cancelled"


def test_only_the_owner_or_an_admin_resumes_a_failed_or_cancelled_sweep(
    app_and_tokens: tuple[TestClient, dict[str, str]], demo_dict: dict[str, Any]
) -> None:
    client, tokens = app_and_tokens
    store: QueueStore = client.app.state.store  # type: ignore[attr-defined]
    sweep = submit_as(client, tokens["alice"], {**demo_dict, "max_attempts": 2})
    resp = client.post(f"/sweeps/{sweep['id']}/resume", headers=auth(tokens["alice"]))
    assert resp.status_code == 409
    assert resp.json() == {
        "detail": f"sweep {sweep['id']} is queued; cannot resume it (only a failed or cancelled sweep resumes)"
    }
    claim = store.claim("w1", lease_seconds=30)
    assert claim is not None and claim.sweep_id == sweep["id"]
    store.trial_started(claim.sweep_id, "t1", {})
    store.fail(claim, "boom")
    assert [t.state for t in store.trials(claim.sweep_id)] == ["error"]  # every ending closes the trial rows
    resp = client.post(f"/sweeps/{sweep['id']}/resume", headers=auth(tokens["bob"]))
    assert resp.status_code == 403
    assert resp.json() == {"detail": f"sweep {sweep['id']} belongs to alice; only its owner or an admin can resume it"}
    ok = client.post(f"/sweeps/{sweep['id']}/resume", headers=auth(tokens["root"]))
    assert ok.status_code == 200, ok.text
    body = ok.json()
    assert (body["state"], body["attempts"], body["max_attempts"], body["reason"]) == ("queued", 1, 3, None)
    again = store.claim("w2", lease_seconds=30)
    assert again is not None and again.attempt == 2  # the attempt counter goes on: w1 stays fenced out
    assert [e.action for e in store.events(sweep["id"])][-3:] == ["failed", "resume", "claim"]


def test_revoked_tokens_stop_working_and_only_hashes_are_stored(
    app_and_tokens: tuple[TestClient, dict[str, str]],
) -> None:
    client, tokens = app_and_tokens
    store: QueueStore = client.app.state.store  # type: ignore[attr-defined]
    with store.engine.connect() as conn:
        stored = {row.user: row.token_hash for row in conn.execute(text("SELECT user, token_hash FROM api_tokens"))}
    assert stored["alice"] == hashlib.sha256(tokens["alice"].encode()).hexdigest()
    dump = "".join(store.engine.raw_connection().driver_connection.iterdump())  # type: ignore[union-attr]
    assert not any(t in dump for t in tokens.values())

    bob = next(t for t in client.app.state.tokens.list() if t.user == "bob")  # type: ignore[attr-defined]
    assert client.get("/sweeps", headers=auth(tokens["bob"])).status_code == 200
    client.app.state.tokens.revoke(bob.id)  # type: ignore[attr-defined]
    assert client.get("/sweeps", headers=auth(tokens["bob"])).status_code == 401


def test_a_token_revoked_elsewhere_stops_working_within_the_cache_time(tmp_path: Path) -> None:
    # The API process keeps checked tokens for token_cache_seconds; a revoke made by another process
    # (the operator's CLI: another TokenStore on the same database) reaches it when that time is up.
    settings = Settings(home=tmp_path, database_url=None, token_cache_seconds=0.5)
    app = create_app(settings)
    token = app.state.tokens.create("carol")[1]
    with TestClient(app) as client:
        assert client.get("/sweeps", headers=auth(token)).status_code == 200
        operator = TokenStore(QueueStore(settings.queue_url))
        operator.revoke(next(t.id for t in operator.list() if t.user == "carol"))
        assert client.get("/sweeps", headers=auth(token)).status_code == 200  # still cached
        time.sleep(0.6)
        assert client.get("/sweeps", headers=auth(token)).status_code == 401
    db.dispose_all()


def test_concurrent_requests_with_an_uncached_token_make_one_check(tmp_path: Path) -> None:
    # When a busy client's cache entry runs out, its requests in flight wait for one database check
    # instead of each making one in the thread pool (service/api/deps.py).
    import asyncio

    import httpx

    app = create_app(Settings(home=tmp_path, database_url=None, token_cache_seconds=60))
    tokens: TokenStore = app.state.tokens
    token = tokens.create("dave")[1]
    checks = []

    def slow_authenticate(token: str) -> Any:
        checks.append(token)
        time.sleep(0.2)  # every request below arrives while this check is under way
        return TokenStore.authenticate(tokens, token)

    tokens.authenticate = slow_authenticate  # type: ignore[method-assign]

    async def burst() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api", headers=auth(token)) as client:
            answers = await asyncio.gather(*(client.get("/sweeps") for _ in range(20)))
            return [a.status_code for a in answers]

    assert asyncio.run(burst()) == [200] * 20
    assert checks == [token]
    assert asyncio.run(burst()) == [200] * 20 and checks == [token]  # then from the cache
    db.dispose_all()


def test_openapi_declares_bearer_auth(app_and_tokens: tuple[TestClient, dict[str, str]]) -> None:
    client, _ = app_and_tokens
    schema = client.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert schema["paths"]["/sweeps"]["post"]["security"] == [{"HTTPBearer": []}]
    assert "security" not in schema["paths"]["/healthz"]["get"]


def test_metrics_count_sweeps_claims_and_trials(
    app_and_tokens: tuple[TestClient, dict[str, str]], demo_dict: dict[str, Any]
) -> None:
    client, tokens = app_and_tokens
    store: QueueStore = client.app.state.store  # type: ignore[attr-defined]
    for _ in range(3):
        submit_as(client, tokens["alice"], demo_dict)
    claim = store.claim("w1", lease_seconds=30)
    assert claim is not None
    store.trial_started(claim.sweep_id, "t1", {})
    store.trial_started(claim.sweep_id, "t2", {})
    store.trial_ended(claim.sweep_id, "t1", TrialState.terminated)
    store.finish(claim)

    resp = client.get("/metrics", headers=auth(tokens["alice"]))
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    }
    assert samples[("layerlab_sweeps", (("state", "queued"),))] == 2
    assert samples[("layerlab_sweeps", (("state", "succeeded"),))] == 1
    assert samples[("layerlab_sweep_claims_total", ())] == 1
    assert samples[("layerlab_trials", (("state", "terminated"),))] == 1
    # t2 never ended: the sweep's end closes it (every ending leaves every trial row in a terminal state)
    assert samples[("layerlab_trials", (("state", "lost"),))] == 1
    assert samples[("layerlab_sweep_duration_seconds_count", (("state", "succeeded"),))] == 1
    assert samples[("layerlab_sweep_duration_seconds_bucket", (("le", "60.0"), ("state", "succeeded")))] == 1


def test_token_cli_create_list_revoke(tmp_path: Path) -> None:
    env = {**os.environ, "LAYERLAB_HOME": str(tmp_path)}
    env.pop("LAYERLAB_DATABASE_URL", None)

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([LAYERLAB, *args], env=env, capture_output=True, text=True)
        assert (proc.returncode == 0) == ok, proc.stderr
        return proc

    created = run("token", "create", "--user", "carol")
    token = created.stdout.strip()
    assert token.startswith("ll_") and len(token) > 40
    assert "shown only now" in created.stderr
    listing = run("token", "list").stdout
    assert "carol" in listing and token not in listing
    assert "revoked token 1 of carol" in run("token", "revoke", "1").stdout
    assert "no API token with id 9" in run("token", "revoke", "9", ok=False).stderr
    bad = run("token", "create", "--user", "../etc", ok=False)
    assert "user name '../etc' is not allowed" in bad.stderr
    db.dispose_all()


def test_a_rerun_repeats_the_spec_as_submitted_for_its_caller_and_names_the_code_each_ran(
    app_and_tokens: tuple[TestClient, dict[str, str]], demo_yaml: str
) -> None:
    client, tokens = app_and_tokens
    store: QueueStore = client.app.state.store  # type: ignore[attr-defined]
    text = demo_yaml + "# alice's comment stays with the spec\n"
    yaml_type = {"content-type": "application/yaml"}
    first = client.post("/sweeps", content=text.encode(), headers={**auth(tokens["alice"]), **yaml_type})
    assert first.status_code == 201, first.text
    original = first.json()
    assert (original["code"], original["rerun_of"]) == (None, None)
    claim = store.claim("w1", lease_seconds=30)
    assert claim is not None
    code = {"layerlab.version": "0.1.0", "layerlab.git_commit": "a" * 40, "layerlab.git_modified": "false"}
    store.set_fields(claim, code=code)  # what the worker records at the start of an attempt (SweepTracker)
    assert client.get(f"/sweeps/{original['id']}", headers=auth(tokens["bob"])).json()["code"] == code

    # Anyone who may read a sweep may run it again; the new sweep is theirs, queued, with fresh attempts.
    resp = client.post(f"/sweeps/{original['id']}/rerun", headers=auth(tokens["bob"]))
    assert resp.status_code == 201, resp.text
    again = resp.json()
    assert again["id"] != original["id"] and again["rerun_of"] == original["id"]
    assert (again["owner"], again["state"], again["attempts"], again["code"]) == ("bob", "queued", 0, None)
    assert {k: again[k] for k in ("name", "task", "metric", "trials", "priority")} == {
        k: original[k] for k in ("name", "task", "metric", "trials", "priority")
    }
    rows = {s.id: s for s in (store.get(original["id"]), store.get(again["id"]))}
    assert rows[again["id"]].spec == rows[original["id"]].spec
    assert rows[again["id"]].spec_yaml == text  # the YAML as submitted, comments included
    assert store.events(again["id"])[0].detail == f"priority 50; rerun of sweep {original['id']}"

    # A spec that no longer passes (here: a param its task no longer has) is refused, and nothing is queued.
    with store.session() as s, s.begin():
        row = s.get(Sweep, original["id"])
        assert row is not None
        row.spec = {**row.spec, "params": {**row.spec["params"], "retired_param": 1}}
    before = len(store.list_sweeps())
    stale = client.post(f"/sweeps/{original['id']}/rerun", headers=auth(tokens["bob"]))
    assert stale.status_code == 409, stale.text
    assert "no longer passes" in stale.json()["detail"] and "retired_param" in stale.json()["detail"]
    assert len(store.list_sweeps()) == before

    missing = client.post("/sweeps/999/rerun", headers=auth(tokens["bob"]))
    assert missing.status_code == 404, missing.text
    assert client.post(f"/sweeps/{original['id']}/rerun").status_code == 401
